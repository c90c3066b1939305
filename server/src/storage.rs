//! Result files on disk, under `<data_dir>/results/`.
//!
//! An upload streams into a temporary file in `.staging/.incoming/`, hashed as it arrives, and
//! is renamed into its attempt's staging directory `.staging/<job>-<attempt>/` only once
//! complete: a broken upload never leaves half a file where a seal could pick it up. Sealing
//! renames the whole staging directory to `<sweep>/<index>/v<attempt>/` in one step, so a
//! result version appears complete or not at all. Everything here is blocking-free for the
//! runtime (tokio::fs, or `spawn_blocking` for directory walks).

use futures_util::{Stream, StreamExt};
use sha2::{Digest, Sha256};
use shared::api::{JobId, ManifestEntry};
use shared::names::sweep_dir_name;
use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::AsyncWriteExt;

/// The folder of every result version where the server keeps its own record of it
/// (`.app/manifest.json`, `.app/result.json`); uploads may not use it, and a job's own
/// `manifest.json` or `result.json` never collides with the server's.
pub const RESERVED_DIR: &str = ".app";

const MAX_SEGMENT_BYTES: usize = 255;
const MAX_PATH_BYTES: usize = 4096;

/// Checks that `path` is a plain relative file path (`a/b.pt`) that cannot leave the directory
/// it is joined to: no `..`, no absolute path, no empty or `.` segments, no backslash, no NUL.
pub fn check_relative_path(path: &str) -> Result<(), String> {
    let refuse = |why: &str| Err(format!("file path `{}` is not allowed: {why}", path.escape_debug()));
    if path.is_empty() {
        return refuse("it is empty");
    }
    if path.len() > MAX_PATH_BYTES {
        return refuse("it is longer than 4096 bytes");
    }
    if path.contains('\0') {
        return refuse("it contains a NUL byte");
    }
    if path.contains('\\') {
        return refuse("use `/` between directories, not `\\`");
    }
    if path.starts_with('/') {
        return refuse("it must be relative");
    }
    for segment in path.split('/') {
        match segment {
            "" => return refuse("it has an empty segment (`//` or a trailing `/`)"),
            "." | ".." => return refuse("`.` and `..` segments are not allowed"),
            _ if segment.len() > MAX_SEGMENT_BYTES => return refuse("a segment is longer than 255 bytes"),
            _ => {}
        }
    }
    Ok(())
}

/// Where results live under the data directory.
#[derive(Debug, Clone)]
pub struct Layout {
    data_dir: PathBuf,
}

impl Layout {
    pub fn new(data_dir: &Path) -> Layout {
        Layout { data_dir: data_dir.to_path_buf() }
    }

    fn staging_root(&self) -> PathBuf {
        self.data_dir.join("results").join(".staging")
    }

    /// Temporary files of uploads in progress.
    pub fn incoming(&self) -> PathBuf {
        self.staging_root().join(".incoming")
    }

    /// Where an attempt's uploaded files wait to be sealed.
    pub fn staging(&self, job: JobId, attempt: u32) -> PathBuf {
        self.staging_root().join(format!("{job}-{attempt}"))
    }

    /// A sweep's results directory, relative to the data dir: `results/<sweep>`, one level
    /// whatever the name (`myproj/sweep` is `results/myproj+sweep`, see `sweep_dir_name`), so
    /// no sweep's directory is inside another's.
    pub fn sweep_path(sweep: &str) -> String {
        format!("results/{}", sweep_dir_name(sweep))
    }

    /// A result version's directory, relative to the data dir (as stored and shown).
    pub fn version_path(sweep: &str, index: u64, attempt: u32) -> String {
        format!("{}/{index}/v{attempt}", Layout::sweep_path(sweep))
    }

    /// Where version directories the database has no record of are set aside (see
    /// `queue::results::set_aside_unrecorded`).
    pub fn unrecorded_root(&self) -> PathBuf {
        self.data_dir.join("results").join(".unrecorded")
    }

    /// Removes the result versions set aside in `.unrecorded/` before `before` (unix ms, the
    /// prefix of their names); how many went.
    pub async fn remove_unrecorded_before(&self, before: i64) -> io::Result<usize> {
        let root = self.unrecorded_root();
        tokio::task::spawn_blocking(move || {
            let entries = match std::fs::read_dir(&root) {
                Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(0),
                entries => entries?,
            };
            let mut removed = 0;
            for entry in entries.flatten() {
                let name = entry.file_name();
                let set_aside: Option<i64> = name.to_str().and_then(|name| name.split('-').next()?.parse().ok());
                if set_aside.is_some_and(|at| at < before) {
                    std::fs::remove_dir_all(entry.path())?;
                    removed += 1;
                }
            }
            Ok(removed)
        })
        .await
        .map_err(io::Error::other)?
    }

    /// A path relative to the data dir (`version_path`, or a file under it), made absolute.
    pub fn absolute(&self, relative: &str) -> PathBuf {
        relative.split('/').fold(self.data_dir.clone(), |path, segment| path.join(segment))
    }

    /// Creates the staging area and empties `.incoming`: at start-up no upload is in flight,
    /// so anything there is left over from a crash. A directory replicas share (`shared`) may
    /// hold the other replicas' uploads in flight: the parts no one holds locked go (a killed
    /// replica's; see [`is_abandoned`] for those written on other hosts and unlocked files).
    pub async fn prepare(&self, shared: bool) -> io::Result<()> {
        let incoming = self.incoming();
        if !shared {
            match tokio::fs::remove_dir_all(&incoming).await {
                Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
                _ => {}
            }
            return tokio::fs::create_dir_all(&incoming).await;
        }
        tokio::fs::create_dir_all(&incoming).await?;
        self.remove_abandoned_parts().await.map(|_| ())
    }

    /// Removes the upload files in `.incoming` of servers that are gone (the reaper's leader
    /// does so in its upkeep on a shared directory, so a killed replica's parts do not wait for
    /// a restart); how many went.
    pub async fn remove_abandoned_parts(&self) -> io::Result<usize> {
        let now = std::time::SystemTime::now();
        let mut entries = match tokio::fs::read_dir(self.incoming()).await {
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(0),
            entries => entries?,
        };
        let mut removed = 0;
        while let Some(entry) = entries.next_entry().await? {
            let path = entry.path();
            let abandoned = tokio::task::spawn_blocking(move || is_abandoned(&path, now)).await.unwrap_or(false);
            if abandoned && tokio::fs::remove_file(entry.path()).await.is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// The attempts that have a staging directory.
    pub async fn staged_attempts(&self) -> io::Result<Vec<(JobId, u32)>> {
        let mut found = Vec::new();
        let mut entries = match tokio::fs::read_dir(self.staging_root()).await {
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(found),
            entries => entries?,
        };
        while let Some(entry) = entries.next_entry().await? {
            let name = entry.file_name();
            let parsed = name
                .to_str()
                .and_then(|name| name.split_once('-'))
                .and_then(|(job, attempt)| Some((job.parse().ok()?, attempt.parse().ok()?)));
            found.extend(parsed);
        }
        Ok(found)
    }
}

/// Why an upload was not stored.
#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    #[error("the upload is larger than the limit of {0} bytes")]
    TooLarge(u64),
    #[error("the upload broke off: {0}")]
    Body(String),
    #[error(transparent)]
    Disk(#[from] io::Error),
}

/// A received file, not yet in place.
#[derive(Debug, Clone)]
pub struct Received {
    pub temp: PathBuf,
    pub size: u64,
    pub sha256: String,
    /// An exclusive `flock` on the file while it streams in and until the last copy of this is
    /// dropped, after it was placed or removed: a server starting beside others on a shared
    /// directory removes the parts no one holds (their server died: the kernel dropped its
    /// locks) and leaves those in flight. `None` where the file system has no locks.
    _in_flight: std::sync::Arc<Option<nix::fcntl::Flock<std::fs::File>>>,
}

/// A part no one holds, written on another host, is removed only once it was left untouched
/// this long: a lock taken there may be invisible here (NFS without its lock manager, FUSE
/// file systems that keep locks local), and an upload in flight writes at least every MiB.
const FOREIGN_PART_AGE: std::time::Duration = std::time::Duration::from_secs(600);
/// Upload files that could not be locked, or are not parts, are removed after this long.
const UNLOCKED_AGE: std::time::Duration = std::time::Duration::from_secs(3600);

/// This host's name as upload file names carry it (after `@`): letters, digits, `.` and `-`.
fn this_host() -> &'static str {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        let name = nix::unistd::gethostname().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' }).collect()
    })
}

static UPLOADS: AtomicU64 = AtomicU64::new(0);

/// This process's part of upload file names: its PID, its start time and a random number.
fn process_token() -> &'static str {
    static TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TOKEN.get_or_init(|| {
        let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        format!("{}-{:x}-{:016x}", std::process::id(), started.as_millis(), random_u64())
    })
}

/// A number unlikely to repeat across processes and calls (std's randomly keyed hasher, over
/// the clock): for names, never for secrets.
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher
        .write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    hasher.finish()
}

/// Whether the upload file at `path` was left by a server that is gone. A part (`.part`,
/// locked by its server while in flight) that no one holds is, if this host wrote it (the lock
/// is then this kernel's, which drops it when its holder dies), or else once it is
/// [`FOREIGN_PART_AGE`] old; anything else once it is [`UNLOCKED_AGE`] old. The lock taken to
/// look is dropped before the caller removes the file (names are never reused).
fn is_abandoned(path: &Path, now: std::time::SystemTime) -> bool {
    use nix::errno::Errno;
    use nix::fcntl::{Flock, FlockArg};
    let older_than = |file: &std::fs::File, age: std::time::Duration| {
        file.metadata().and_then(|meta| meta.modified()).is_ok_and(|at| at + age < now)
    };
    if path.extension().is_none_or(|extension| extension != "part") {
        return std::fs::File::open(path).is_ok_and(|file| older_than(&file, UNLOCKED_AGE));
    }
    // Open for writing: NFS grants an exclusive lock only on a file open for writing.
    let Ok(file) = std::fs::OpenOptions::new().read(true).write(true).open(path) else { return false };
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Err((_, Errno::EWOULDBLOCK)) => false,
        Ok(unheld) => {
            let written_here = path
                .file_stem()
                .and_then(|stem| stem.to_str())
                .and_then(|stem| stem.rsplit_once('@'))
                .is_some_and(|(_, host)| host == this_host());
            written_here || older_than(&unheld, FOREIGN_PART_AGE)
        }
        Err((file, _)) => older_than(&file, UNLOCKED_AGE),
    }
}

/// Streams `body` into a new file in `incoming`, hashing it on the way; at most `limit` bytes.
/// On any failure the partial file is removed.
pub async fn receive<S, B, E>(incoming: &Path, body: S, limit: u64) -> Result<Received, ReceiveError>
where
    S: Stream<Item = Result<B, E>>,
    B: AsRef<[u8]>,
    E: std::fmt::Display,
{
    tokio::fs::create_dir_all(incoming).await?;
    // Unique across the replicas sharing the directory too (in containers they are all PID 1),
    // and made new: a name taken is an error, never another upload's file truncated.
    let name = format!("{}-{}@{}", process_token(), UPLOADS.fetch_add(1, Ordering::Relaxed), this_host());
    // Locked before it is a part, so no server finds a part of this host unlocked while it is
    // in flight; where it cannot be locked it stays `.new`, and only its age counts.
    let new = incoming.join(format!("{name}.new"));
    let file = tokio::fs::OpenOptions::new().write(true).create_new(true).open(&new).await?;
    let lock = match file.try_clone().await {
        Ok(second) => nix::fcntl::Flock::lock(second.into_std().await, nix::fcntl::FlockArg::LockExclusiveNonblock),
        Err(error) => {
            let _ = tokio::fs::remove_file(&new).await;
            return Err(error.into());
        }
    };
    let (temp, in_flight) = match lock {
        Ok(lock) => {
            let temp = incoming.join(format!("{name}.part"));
            if let Err(error) = tokio::fs::rename(&new, &temp).await {
                let _ = tokio::fs::remove_file(&new).await;
                return Err(error.into());
            }
            (temp, Some(lock))
        }
        Err(_) => (new, None),
    };
    let in_flight = std::sync::Arc::new(in_flight);
    let outcome = write_hashed(body, file, limit).await;
    if outcome.is_err() {
        let _ = tokio::fs::remove_file(&temp).await;
    }
    let (size, sha256) = outcome?;
    Ok(Received { temp, size, sha256, _in_flight: in_flight })
}

/// Copies `body` into `file` and syncs it; returns the size and the hex SHA-256.
async fn write_hashed<S, B, E>(body: S, file: tokio::fs::File, limit: u64) -> Result<(u64, String), ReceiveError>
where
    S: Stream<Item = Result<B, E>>,
    B: AsRef<[u8]>,
    E: std::fmt::Display,
{
    // Chunks off the wire are small; a large buffer makes few, large writes to the disk.
    let mut writer = tokio::io::BufWriter::with_capacity(1 << 20, file);
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    futures_util::pin_mut!(body);
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|error| ReceiveError::Body(error.to_string()))?;
        let bytes = chunk.as_ref();
        size += bytes.len() as u64;
        if size > limit {
            return Err(ReceiveError::TooLarge(limit));
        }
        hasher.update(bytes);
        writer.write_all(bytes).await?;
    }
    writer.flush().await?;
    // A sealed result is meant to outlive a power cut.
    writer.into_inner().sync_all().await?;
    Ok((size, hex::encode(hasher.finalize())))
}

/// Why a received file could not be put in place.
#[derive(Debug, thiserror::Error)]
pub enum PlaceError {
    #[error("{0}")]
    Clash(String),
    #[error(transparent)]
    Disk(#[from] io::Error),
}

/// Moves a received file to `relative` under `staging` (replacing an earlier upload of the
/// same path). A path that runs through an uploaded file, or onto a directory, is a clash.
pub async fn place(received: &Received, staging: &Path, relative: &str) -> Result<(), PlaceError> {
    let target = relative.split('/').fold(staging.to_path_buf(), |path, segment| path.join(segment));
    let mut ancestor = staging.to_path_buf();
    let segments: Vec<&str> = relative.split('/').collect();
    for (position, segment) in segments[..segments.len() - 1].iter().enumerate() {
        ancestor.push(segment);
        if tokio::fs::metadata(&ancestor).await.is_ok_and(|meta| !meta.is_dir()) {
            let file = segments[..=position].join("/");
            return Err(PlaceError::Clash(format!("`{relative}` runs through the uploaded file `{file}`")));
        }
    }
    if tokio::fs::metadata(&target).await.is_ok_and(|meta| meta.is_dir()) {
        return Err(PlaceError::Clash(format!("`{relative}` is already a directory of uploaded files")));
    }
    if let Some(parent) = target.parent() {
        tokio::fs::create_dir_all(parent).await?;
    }
    tokio::fs::rename(&received.temp, &target).await?;
    Ok(())
}

/// Why a seal did not happen.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("{0}")]
    Mismatch(String),
    #[error("already stored")]
    AlreadyStored,
    #[error(transparent)]
    Disk(#[from] io::Error),
}

/// Turns `staging` into the immutable version directory `version`: checks the files of the
/// manifest are there with their sizes, removes everything else, writes `.app/manifest.json`
/// and `.app/result.json`, then renames. Blocking; run it with `spawn_blocking`.
pub fn seal(
    staging: &Path,
    version: &Path,
    manifest: &[ManifestEntry],
    manifest_json: &[u8],
    result_json: &[u8],
) -> Result<(), SealError> {
    if version.exists() {
        return Err(SealError::AlreadyStored);
    }
    for entry in manifest {
        let path = entry.path.split('/').fold(staging.to_path_buf(), |path, segment| path.join(segment));
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_file() && meta.len() == entry.size => {}
            Ok(meta) if meta.is_file() => {
                return Err(SealError::Mismatch(format!(
                    "`{}` is {} bytes in the upload but {} in the manifest",
                    entry.path,
                    meta.len(),
                    entry.size
                )))
            }
            _ => return Err(SealError::Mismatch(format!("`{}` is in the manifest but was not uploaded", entry.path))),
        }
    }
    let keep: HashSet<&str> = manifest.iter().map(|entry| entry.path.as_str()).collect();
    remove_unlisted(staging, "", &keep)?;
    let record = staging.join(RESERVED_DIR);
    std::fs::create_dir_all(&record)?;
    std::fs::write(record.join("manifest.json"), manifest_json)?;
    std::fs::write(record.join("result.json"), result_json)?;
    if let Some(parent) = version.parent() {
        std::fs::create_dir_all(parent)?;
    }
    // rename() would silently replace an empty directory that appeared meanwhile; a version
    // is never replaced, so look once more right before.
    if version.exists() {
        return Err(SealError::AlreadyStored);
    }
    std::fs::rename(staging, version)?;
    Ok(())
}

/// Removes files under `dir` whose path (relative to the staging root) is not in `keep`, and
/// directories left empty; returns whether `dir` is now empty.
fn remove_unlisted(dir: &Path, prefix: &str, keep: &HashSet<&str>) -> io::Result<bool> {
    let mut empty = true;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let relative = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
        let kind = entry.file_type()?;
        if kind.is_dir() {
            if remove_unlisted(&entry.path(), &relative, keep)? {
                std::fs::remove_dir(entry.path())?;
            } else {
                empty = false;
            }
        } else if kind.is_file() && keep.contains(relative.as_str()) {
            empty = false;
        } else {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(empty)
}

/// A disk error as the client should see it: a full disk (507) or a read-only one (503) is
/// the operator's to fix and worth saying; other disk errors are internal.
pub fn disk_error(error: io::Error, what: String) -> crate::error::ApiError {
    use crate::error::ApiError;
    if is_disk_full(&error) {
        ApiError::InsufficientStorage(format!("the server's disk is full ({what}): {error}; free space and retry"))
    } else if error.kind() == io::ErrorKind::ReadOnlyFilesystem || error.kind() == io::ErrorKind::PermissionDenied {
        ApiError::Unavailable(format!("the server cannot write its data directory ({what}): {error}"))
    } else {
        ApiError::Internal(anyhow::Error::new(error).context(what))
    }
}

/// Bytes of declared uploads being received now, reserved against the free space.
static RECEIVING: AtomicU64 = AtomicU64::new(0);

/// Space reserved for an upload while it is received; given back when dropped.
#[must_use = "the space is reserved only while this is held"]
pub struct Reservation(u64);

impl Drop for Reservation {
    fn drop(&mut self) {
        RECEIVING.fetch_sub(self.0, Ordering::SeqCst);
    }
}

/// Refuses (507) a body of `declared` bytes that cannot fit in the free space of the
/// filesystem holding `dir`, before a byte of it is written: streamed into the last free
/// space, it would leave none for every other job's small writes (results, logs, the queue's
/// own) for as long as its worker keeps retrying it. What concurrent uploads reserved counts
/// as used, and a headroom (1% of the filesystem, at most 64 MiB) stays free. Hold the
/// returned reservation while the body is received.
pub fn ensure_room(
    dir: &Path,
    declared: Option<u64>,
    what: impl FnOnce() -> String,
) -> Result<Reservation, crate::error::ApiError> {
    let Some(length) = declared else { return Ok(Reservation(0)) };
    let Ok(stat) = nix::sys::statvfs::statvfs(dir) else { return Ok(Reservation(0)) };
    let free = stat.blocks_available().saturating_mul(stat.fragment_size());
    let headroom = (stat.blocks().saturating_mul(stat.fragment_size()) / 100).min(64 << 20);
    let reserved = RECEIVING.fetch_add(length, Ordering::SeqCst);
    let reservation = Reservation(length);
    if length.saturating_add(reserved).saturating_add(headroom) <= free {
        return Ok(reservation);
    }
    drop(reservation);
    Err(crate::error::ApiError::InsufficientStorage(format!(
        "the server's disk is full: no space for {} ({length} bytes; {free} bytes free, {reserved} reserved by \
         uploads in progress); free space and retry",
        what()
    )))
}

/// Whether a disk error means the disk (or the quota) is full.
pub fn is_disk_full(error: &io::Error) -> bool {
    matches!(error.kind(), io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded | io::ErrorKind::FileTooLarge)
}

#[cfg(test)]
#[path = "storage_tests.rs"]
mod tests;
