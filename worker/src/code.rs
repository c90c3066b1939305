//! Code snapshots on a worker. Each snapshot is downloaded once, into
//! `<work_dir>/code-cache/<digest>.tar.zst`, and unpacked once, its digest checked on the bytes
//! unpacked, into the tree `<digest>.tree/`: an archive damaged on disk (or one that arrived
//! damaged) is removed, downloaded again and unpacked again, and no tree exists that is not its
//! snapshot. Every attempt then gets a private, writable view of the tree in its `work/`
//! (`code_copy`: an overlay, or a copy), so a job writes only into its own view, never into the
//! cache. The cache keeps at most `code_cache_bytes` of trees; those used longest ago go first
//! (the time of last use is the tree's modification time), never one an attempt is using.

use client::Client;
use shared::api::WorkerId;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Downloads that failed because the server was unreachable are retried this long, then the
/// attempt fails saying why.
const DOWNLOAD_PATIENCE: Duration = Duration::from_secs(120);

pub struct CodeCache {
    dir: PathBuf,
    max_bytes: u64,
    /// One download and unpack of a digest at a time; attempts wanting the same one wait.
    downloads: tokio::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Trees attempts are using (overlays stand on them), with how many: never evicted.
    in_use: std::sync::Mutex<HashMap<String, usize>>,
    copier: Arc<crate::code_copy::Copier>,
}

/// How a snapshot came to be laid out for an attempt (for the log and the benchmark).
#[derive(Debug)]
pub struct Unpacked {
    /// Downloaded for this attempt (not found in the cache, or found damaged).
    pub downloaded: bool,
    /// The cached copy failed its digest check and was replaced.
    pub replaced_damaged: bool,
    pub tar_bytes: u64,
    /// The attempt's view of the tree, to take down with its slot ([`CodeCache::release`]).
    pub laid_out: Option<LaidOutCode>,
}

/// An attempt's view of a cached tree: the tree stays in the cache while it exists.
#[derive(Debug)]
pub struct LaidOutCode {
    digest: String,
    view: crate::code_copy::LaidOut,
}

impl LaidOutCode {
    pub fn is_overlay(&self) -> bool {
        self.view.is_overlay()
    }
}

impl CodeCache {
    /// The cache in `work_dir/code-cache`: what an earlier run of the worker left half done
    /// there (downloads, unpackings, evictions, and archives kept by builds before trees) goes.
    pub fn new(work_dir: &Path, max_bytes: u64, copier: Arc<crate::code_copy::Copier>) -> CodeCache {
        let dir = work_dir.join("code-cache");
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let leftover = name.ends_with(".part")
                    || name.ends_with(".tar.zst")
                    || name.contains(".unpacking-")
                    || name.contains(".evicting-");
                if leftover {
                    let _ = std::fs::remove_dir_all(entry.path()).or_else(|_| std::fs::remove_file(entry.path()));
                }
            }
        }
        CodeCache { dir, max_bytes, downloads: Default::default(), in_use: Default::default(), copier }
    }

    fn path(&self, digest: &str) -> PathBuf {
        self.dir.join(format!("{digest}.tar.zst"))
    }

    fn tree(&self, digest: &str) -> PathBuf {
        self.dir.join(format!("{digest}.tree"))
    }

    /// Gives `destination` (empty) a private, writable view of snapshot `digest`; `scratch` is
    /// a directory of the attempt's slot for the view's own files.
    pub async fn unpack_into(
        &self,
        client: &Client,
        worker: WorkerId,
        digest: &str,
        destination: &Path,
        scratch: &Path,
    ) -> Result<Unpacked, String> {
        if !archive::is_digest(digest) {
            return Err(format!("`{digest}` is not a code snapshot digest"));
        }
        // Held (never evicted) from inside the digest's lock on, until `release`.
        let (downloaded, replaced_damaged, tar_bytes) = self.ensure_tree(client, worker, digest).await?;
        let (copier, tree, at, scratch) =
            (self.copier.clone(), self.tree(digest), destination.to_path_buf(), scratch.to_path_buf());
        let laid = tokio::task::spawn_blocking(move || copier.lay_out(&tree, &at, &scratch))
            .await
            .map_err(|error| error.to_string())
            .and_then(|laid| laid.map_err(|error| error.to_string()));
        match laid {
            Ok(view) => {
                let laid_out = Some(LaidOutCode { digest: digest.to_string(), view });
                Ok(Unpacked { downloaded, replaced_damaged, tar_bytes, laid_out })
            }
            Err(error) => {
                self.release_tree(digest);
                let emptied = destination.to_path_buf();
                let _ = tokio::task::spawn_blocking(move || crate::slots::empty(&emptied)).await;
                Err(format!("laying out code snapshot {digest} for the attempt: {error}"))
            }
        }
    }

    /// Takes down an attempt's view (before its slot's directories are emptied).
    pub async fn release(&self, laid_out: LaidOutCode) {
        let LaidOutCode { digest, view } = laid_out;
        let _ = tokio::task::spawn_blocking(move || view.take_down()).await;
        self.release_tree(&digest);
    }

    fn hold(&self, digest: &str) {
        if let Ok(mut in_use) = self.in_use.lock() {
            *in_use.entry(digest.to_string()).or_insert(0) += 1;
        }
        // The time of last use, for the eviction order (the mark's, not the tree's: the tree's
        // own times are how a change to it is seen).
        if let Ok(file) = std::fs::File::options().write(true).open(made_mark(&self.tree(digest))) {
            let _ = file.set_modified(SystemTime::now());
        }
    }

    /// Removes a tree: renamed out of the way first, so a worker killed meanwhile leaves no
    /// half-removed tree that looks whole.
    async fn remove_tree(&self, digest: &str) -> std::io::Result<()> {
        let (tree, mark) = (self.tree(digest), made_mark(&self.tree(digest)));
        let trash = self.dir.join(format!("{digest}.evicting-{}", std::process::id()));
        let _ = tokio::fs::remove_file(&mark).await;
        tokio::fs::rename(&tree, &trash).await?;
        tokio::task::spawn_blocking(move || std::fs::remove_dir_all(trash)).await.map_err(std::io::Error::other)?
    }

    fn in_use(&self, digest: &str) -> bool {
        self.in_use.lock().is_ok_and(|in_use| in_use.contains_key(digest))
    }

    fn release_tree(&self, digest: &str) {
        if let Ok(mut in_use) = self.in_use.lock() {
            if let Some(count) = in_use.get_mut(digest) {
                *count -= 1;
                if *count == 0 {
                    in_use.remove(digest);
                }
            }
        }
    }

    /// Makes the tree of `digest` unless it is there intact, and holds it: downloaded when not
    /// cached, unpacked and checked, downloaded again once if the cached archive fails its
    /// check. A tree changed since it was made (a job of the worker's user can reach the cache)
    /// counts as damaged and is made again. Returns whether it downloaded, whether it replaced
    /// something damaged, and the tar stream's size (0 when the tree was there).
    async fn ensure_tree(&self, client: &Client, worker: WorkerId, digest: &str) -> Result<(bool, bool, u64), String> {
        let lock = self.downloads.lock().await.entry(digest.to_string()).or_default().clone();
        let _one_at_a_time = lock.lock().await;
        let tree = self.tree(digest);
        let checked = tree.clone();
        let intact = tokio::task::spawn_blocking(move || unchanged_since_made(&checked)).await.unwrap_or(None);
        let mut replaced_damaged = false;
        match intact {
            Some(true) => {
                self.hold(digest);
                return Ok((false, false, 0));
            }
            Some(false) => {
                tracing::warn!(%digest, "the cached code tree was changed since it was made; making it again");
                replaced_damaged = true;
                let _ = self.remove_tree(digest).await;
            }
            None => {}
        }
        let mut downloaded = self.ensure_cached(client, worker, digest, false).await?;
        loop {
            match unpack_tree(self.path(digest), digest.to_string(), tree.clone()).await {
                Ok(tar_bytes) => {
                    // The tree is what attempts use; the archive is not needed any more.
                    let _ = tokio::fs::remove_file(self.path(digest)).await;
                    self.hold(digest);
                    self.evict(digest).await;
                    return Ok((downloaded, replaced_damaged, tar_bytes));
                }
                Err(error) => {
                    if downloaded {
                        return Err(format!("code snapshot {digest} cannot be unpacked: {error}"));
                    }
                    tracing::warn!(%digest, %error, "the cached code snapshot failed its check; downloading it again");
                    replaced_damaged = true;
                    downloaded = self.ensure_cached(client, worker, digest, true).await?;
                }
            }
        }
    }

    /// Downloads the snapshot unless it is cached (or `replace`); true when it downloaded.
    async fn ensure_cached(
        &self,
        client: &Client,
        worker: WorkerId,
        digest: &str,
        replace: bool,
    ) -> Result<bool, String> {
        let path = self.path(digest);
        if replace {
            let _ = tokio::fs::remove_file(&path).await;
        } else if tokio::fs::metadata(&path).await.is_ok() {
            return Ok(false);
        }
        tokio::fs::create_dir_all(&self.dir)
            .await
            .map_err(|error| format!("creating {}: {error}", self.dir.display()))?;
        let part = self.dir.join(format!("{digest}.part"));
        let started = tokio::time::Instant::now();
        let mut delay = Duration::from_millis(250);
        loop {
            match client.download_code(worker, digest, &part).await {
                Ok(bytes) => {
                    tokio::fs::rename(&part, &path).await.map_err(|error| {
                        format!("storing code snapshot {digest} in {}: {error}", self.dir.display())
                    })?;
                    tracing::info!(%digest, bytes, "code snapshot downloaded");
                    return Ok(true);
                }
                Err(error) if error.is_retryable() && started.elapsed() < DOWNLOAD_PATIENCE => {
                    tracing::warn!(%digest, %error, "downloading a code snapshot failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(10));
                }
                Err(error) => return Err(format!("downloading code snapshot {digest}: {error}")),
            }
        }
    }

    /// Removes the trees used longest ago until the cache fits its cap (`keep`, and trees in
    /// use, stay). A tree's size is the sum of its files'.
    async fn evict(&self, keep: &str) {
        let dir = self.dir.clone();
        let listed = tokio::task::spawn_blocking(move || {
            let mut cached: Vec<(SystemTime, u64, String)> = std::fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .filter_map(Result::ok)
                .filter_map(|entry| {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let digest = name.strip_suffix(".tree")?.to_string();
                    let used = std::fs::metadata(made_mark(&entry.path())).and_then(|mark| mark.modified()).ok()?;
                    Some((used, tree_bytes(&entry.path()), digest))
                })
                .collect();
            cached.sort();
            cached
        })
        .await
        .unwrap_or_default();
        let mut total: u64 = listed.iter().map(|(_, size, _)| size).sum();
        for (_, size, digest) in listed {
            if total <= self.max_bytes {
                break;
            }
            // Asked now, not when the list was made: an attempt may have taken it meanwhile.
            if digest == keep || self.in_use(&digest) {
                continue;
            }
            let lock = self.downloads.lock().await.entry(digest.clone()).or_default().clone();
            let _no_one_takes_it = lock.lock().await;
            if self.in_use(&digest) {
                continue;
            }
            if self.remove_tree(&digest).await.is_ok() {
                tracing::info!(%digest, "code snapshot evicted from the cache");
                total -= size;
            }
        }
    }
}

/// The file beside a tree that says it was made whole, and when: its contents are the time
/// (ns) the tree was made; its modification time is the tree's last use.
fn made_mark(tree: &Path) -> PathBuf {
    tree.with_extension("made")
}

/// Whether the tree at `tree` is as it was made: `None` when there is none (or no mark of it
/// made whole), `Some(false)` when an entry of it changed since (its status change time is
/// later than the tree's making: a write, a chmod, a link or removal in a directory).
fn unchanged_since_made(tree: &Path) -> Option<bool> {
    use std::os::unix::fs::MetadataExt;
    let made: i128 = std::fs::read_to_string(made_mark(tree)).ok()?.trim().parse().ok()?;
    std::fs::symlink_metadata(tree).ok()?;
    for entry in walkdir::WalkDir::new(tree).follow_links(false) {
        let Ok(entry) = entry else { return Some(false) };
        let Ok(metadata) = entry.metadata() else { return Some(false) };
        let changed = i128::from(metadata.ctime()) * 1_000_000_000 + i128::from(metadata.ctime_nsec());
        if changed > made {
            return Some(false);
        }
    }
    Some(true)
}

/// The bytes of the files under `dir`.
fn tree_bytes(dir: &Path) -> u64 {
    walkdir::WalkDir::new(dir)
        .follow_links(false)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|entry| entry.file_type().is_file())
        .filter_map(|entry| entry.metadata().ok().map(|metadata| metadata.len()))
        .sum()
}

/// Unpacks the cached archive into the tree `tree` (by way of a scratch directory renamed
/// into place once the digest checked out); the tar stream's size.
async fn unpack_tree(archive_path: PathBuf, digest: String, tree: PathBuf) -> Result<u64, String> {
    tokio::task::spawn_blocking(move || {
        let scratch = tree.with_extension(format!("unpacking-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir_all(&scratch).map_err(|error| error.to_string())?;
        let unpacked = std::fs::File::open(&archive_path).map_err(|error| error.to_string()).and_then(|file| {
            let reader = std::io::BufReader::with_capacity(1 << 20, file);
            archive::unpack_verified(reader, Some(&digest), &scratch, u64::MAX).map_err(|error| error.to_string())
        });
        match unpacked {
            Ok(verified) => {
                std::fs::rename(&scratch, &tree).map_err(|error| error.to_string())?;
                // Made whole now: every entry's status changed before this time (the rename
                // changed the tree's own before it is read).
                let made = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |since| since.as_nanos());
                std::fs::write(made_mark(&tree), made.to_string()).map_err(|error| error.to_string())?;
                Ok(verified.tar_bytes)
            }
            Err(error) => {
                // Nothing of a snapshot that failed its check may stay to be run.
                let _ = std::fs::remove_dir_all(&scratch);
                Err(error)
            }
        }
    })
    .await
    .map_err(|error| error.to_string())?
}
