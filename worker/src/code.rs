//! Code snapshots on a worker. Each snapshot is downloaded once, into
//! `<work_dir>/code-cache/<digest>.tar.zst`, and unpacked fresh into every attempt's `work/`,
//! its digest checked on the bytes unpacked: a cached copy damaged on disk (or one that arrived
//! damaged) is removed, downloaded again and unpacked again, and a job never starts on files
//! that are not its snapshot. The job writes only into its own copy, never into the cache. The
//! cache keeps at most `code_cache_bytes`; the snapshots used longest ago go first (the time of
//! last use is the file's modification time).

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
    /// One download of a digest at a time; attempts wanting the same one wait for it.
    downloads: tokio::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// How a snapshot came to be unpacked (for the log and the benchmark).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unpacked {
    /// Downloaded for this attempt (not found in the cache, or found damaged).
    pub downloaded: bool,
    /// The cached copy failed its digest check and was replaced.
    pub replaced_damaged: bool,
    pub tar_bytes: u64,
}

impl CodeCache {
    pub fn new(work_dir: &Path, max_bytes: u64) -> CodeCache {
        CodeCache { dir: work_dir.join("code-cache"), max_bytes, downloads: Default::default() }
    }

    fn path(&self, digest: &str) -> PathBuf {
        self.dir.join(format!("{digest}.tar.zst"))
    }

    /// Fills `destination` (empty) with snapshot `digest`.
    pub async fn unpack_into(
        &self,
        client: &Client,
        worker: WorkerId,
        digest: &str,
        destination: &Path,
    ) -> Result<Unpacked, String> {
        if !archive::is_digest(digest) {
            return Err(format!("`{digest}` is not a code snapshot digest"));
        }
        let mut downloaded = self.ensure_cached(client, worker, digest, false).await?;
        let mut replaced_damaged = false;
        loop {
            match unpack(self.path(digest), digest.to_string(), destination.to_path_buf()).await {
                Ok(tar_bytes) => {
                    return Ok(Unpacked { downloaded, replaced_damaged, tar_bytes });
                }
                Err(error) => {
                    // Nothing of a snapshot that failed its check may stay to be run.
                    let emptied = destination.to_path_buf();
                    let _ = tokio::task::spawn_blocking(move || crate::slots::empty(&emptied)).await;
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
        let lock = self.downloads.lock().await.entry(digest.to_string()).or_default().clone();
        let _one_download = lock.lock().await;
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
                    self.evict(digest).await;
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

    /// Removes the snapshots used longest ago until the cache fits its cap (`keep` stays).
    async fn evict(&self, keep: &str) {
        let (dir, max_bytes, keep) = (self.dir.clone(), self.max_bytes, format!("{keep}.tar.zst"));
        let _ = tokio::task::spawn_blocking(move || {
            let mut cached: Vec<(SystemTime, u64, PathBuf)> = std::fs::read_dir(&dir)?
                .filter_map(Result::ok)
                .filter(|entry| entry.file_name().to_string_lossy().ends_with(".tar.zst"))
                .filter_map(|entry| {
                    let metadata = entry.metadata().ok()?;
                    Some((metadata.modified().ok()?, metadata.len(), entry.path()))
                })
                .collect();
            let mut total: u64 = cached.iter().map(|(_, size, _)| size).sum();
            cached.sort();
            for (_, size, path) in cached {
                if total <= max_bytes {
                    break;
                }
                if path.file_name().is_some_and(|name| name.to_string_lossy() == keep) {
                    continue;
                }
                // An attempt still unpacking it keeps reading its open file.
                if std::fs::remove_file(&path).is_ok() {
                    tracing::info!(path = %path.display(), "code snapshot evicted from the cache");
                    total -= size;
                }
            }
            Ok::<_, std::io::Error>(())
        })
        .await;
    }
}

/// Unpacks the cached archive into `destination`, checking its digest; the tar stream's size.
async fn unpack(archive_path: PathBuf, digest: String, destination: PathBuf) -> Result<u64, String> {
    tokio::task::spawn_blocking(move || {
        let file = std::fs::File::open(&archive_path).map_err(|error| error.to_string())?;
        let reader = std::io::BufReader::with_capacity(1 << 20, file);
        let verified = archive::unpack_verified(reader, Some(&digest), &destination, u64::MAX)
            .map_err(|error| error.to_string())?;
        // The time of last use, for the eviction order.
        if let Ok(file) = std::fs::File::options().write(true).open(&archive_path) {
            let _ = file.set_modified(SystemTime::now());
        }
        Ok(verified.tar_bytes)
    })
    .await
    .map_err(|error| error.to_string())?
}
