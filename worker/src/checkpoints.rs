//! A job's checkpoints on the worker. Every attempt gets an empty `$APP_CHECKPOINT_DIR`, filled
//! first with the job's newest stored checkpoint when an earlier attempt uploaded one
//! ([`restore`]). While the job runs, the directory is uploaded in the background whenever it
//! changed (every `checkpoint_interval`, and once more when the attempt ends), so an attempt
//! lost with its box costs the work since the last upload, not the whole run.
//!
//! An upload is a consistent copy or none: the directory is packed, scanned again, and sent
//! only if nothing changed meanwhile (a job in the middle of writing is tried again shortly).
//! A directory over `checkpoint_max_bytes` is not uploaded, with a warning in the job's log;
//! the job keeps running.

use crate::shipper::append_local;
use client::Client;
use shared::api::{JobAttempt, WorkerId};
use std::hash::{Hash, Hasher};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::oneshot;

/// How soon a directory that changed while it was packed is tried again.
const BUSY_RETRY: Duration = Duration::from_secs(5);

/// The uploading side of one attempt's checkpoint directory.
pub struct CheckpointSync {
    pub client: Client,
    pub worker_id: WorkerId,
    pub attempt: JobAttempt,
    /// `$APP_CHECKPOINT_DIR`.
    pub dir: PathBuf,
    /// Where an upload is packed before it is sent.
    pub archive: PathBuf,
    /// The job's log, for the warnings the job's owner should see.
    pub log: PathBuf,
    pub max_bytes: u64,
    /// What the directory looked like when it was last uploaded.
    uploaded: Option<u64>,
    warned_over_cap: bool,
    /// The server no longer holds the attempt for this worker: nothing more is sent.
    lost: bool,
    /// The file identity the directory is read with (a `run_as` user's: see `run_as`).
    reader: Option<(u32, u32)>,
}

/// What one pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synced {
    /// Empty, or as last uploaded.
    Unchanged,
    Uploaded {
        bytes: u64,
    },
    OverCap,
    /// It changed while it was packed.
    Busy,
    Failed,
}

/// The directory's state: one number over every entry's path, size, time and mode, its total
/// size, and its entries.
struct Scan {
    fingerprint: u64,
    bytes: u64,
    entries: Vec<PathBuf>,
}

fn scan(dir: &Path) -> std::io::Result<Scan> {
    let entries = archive::list_tree(dir)?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let mut bytes = 0;
    for entry in &entries {
        let Ok(metadata) = std::fs::symlink_metadata(dir.join(entry)) else { continue };
        (entry, metadata.len(), metadata.mtime(), metadata.mtime_nsec(), metadata.mode()).hash(&mut hasher);
        bytes += metadata.len();
    }
    Ok(Scan { fingerprint: hasher.finish(), bytes, entries })
}

impl CheckpointSync {
    pub fn new(
        client: Client,
        worker_id: WorkerId,
        attempt: JobAttempt,
        dir: PathBuf,
        archive: PathBuf,
        log: PathBuf,
        (max_bytes, reader): (u64, Option<(u32, u32)>),
    ) -> CheckpointSync {
        CheckpointSync {
            client,
            worker_id,
            attempt,
            dir,
            archive,
            log,
            max_bytes,
            uploaded: None,
            warned_over_cap: false,
            lost: false,
            reader,
        }
    }

    /// Uploads the directory if it changed since the last upload.
    pub async fn sync(&mut self) -> Synced {
        // Most jobs never write a checkpoint: one directory read, without a trip to a blocking
        // thread, says so.
        let empty = std::fs::read_dir(&self.dir).map(|mut entries| entries.next().is_none()).unwrap_or(true);
        if self.lost || empty {
            return Synced::Unchanged;
        }
        let (dir, reader) = (self.dir.clone(), self.reader);
        let scanned = move || crate::run_as::with_file_identity(reader, || scan(&dir));
        let Ok(Ok(before)) = tokio::task::spawn_blocking(scanned).await else { return Synced::Failed };
        if before.entries.is_empty() || self.uploaded == Some(before.fingerprint) {
            return Synced::Unchanged;
        }
        if before.bytes > self.max_bytes {
            if !self.warned_over_cap {
                self.warned_over_cap = true;
                let line = format!(
                    "[app] checkpoint not uploaded: $APP_CHECKPOINT_DIR holds {} bytes, over this worker's cap of {} \
                     bytes (checkpoint_max_size); the job keeps running\n",
                    before.bytes, self.max_bytes
                );
                append_local(&self.log, &line).await;
                tracing::warn!(job = %self.attempt.job_id, bytes = before.bytes, cap = self.max_bytes, "checkpoint over the cap; not uploaded");
            }
            return Synced::OverCap;
        }
        let (dir, archive, entries) = (self.dir.clone(), self.archive.clone(), before.entries);
        let packed = tokio::task::spawn_blocking(move || {
            // The archive is the worker's (in the slot's root); what goes in it is read as the
            // job's user.
            let file = std::fs::File::create(&archive)?;
            crate::run_as::with_file_identity(reader, || {
                archive::pack_to(&dir, &entries, file)?;
                scan(&dir)
            })
        })
        .await;
        let after = match packed {
            Ok(Ok(after)) => after,
            Ok(Err(error)) => {
                tracing::warn!(job = %self.attempt.job_id, %error, "packing a checkpoint failed");
                return Synced::Failed;
            }
            Err(_) => return Synced::Failed,
        };
        if after.fingerprint != before.fingerprint {
            return Synced::Busy;
        }
        let synced = self.upload().await;
        if let Synced::Uploaded { .. } = synced {
            self.uploaded = Some(before.fingerprint);
        }
        let _ = tokio::fs::remove_file(&self.archive).await;
        synced
    }

    async fn upload(&mut self) -> Synced {
        let Ok(file) = tokio::fs::File::open(&self.archive).await else { return Synced::Failed };
        let JobAttempt { job_id, attempt } = self.attempt;
        match self.client.upload_checkpoint(job_id, attempt, self.worker_id, file).await {
            Ok(info) => {
                tracing::debug!(job = %job_id, attempt, bytes = info.size, "checkpoint uploaded");
                Synced::Uploaded { bytes: info.size }
            }
            Err(error) => {
                if matches!(error.status(), Some(404 | 409)) {
                    self.lost = true;
                }
                tracing::warn!(job = %job_id, attempt, %error, "uploading a checkpoint failed");
                Synced::Failed
            }
        }
    }
}

/// Syncs every `interval` until told to stop; gives the syncer back for the attempt's last pass.
pub async fn sync_in_background(
    mut sync: CheckpointSync,
    interval: Duration,
    mut stop: oneshot::Receiver<()>,
) -> CheckpointSync {
    let mut wait = interval;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = &mut stop => return sync,
        }
        wait = if sync.sync().await == Synced::Busy { BUSY_RETRY.min(interval) } else { interval };
    }
}

/// Fills the empty `dir` with the job's newest checkpoint, downloaded through `scratch`: the
/// attempt that uploaded it and its size, or `None` when there is none.
pub async fn restore(
    client: &Client,
    worker_id: WorkerId,
    attempt: JobAttempt,
    dir: &Path,
    scratch: &Path,
) -> Result<Option<(u32, u64)>, String> {
    let mut delay = Duration::from_millis(250);
    let mut tries = 0;
    let (from, sha256) = loop {
        tries += 1;
        match client.download_checkpoint(attempt.job_id, attempt.attempt, worker_id, scratch).await {
            Ok(None) => return Ok(None),
            Ok(Some(found)) => break found,
            Err(error) if error.is_retryable() && tries < 6 => {
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            Err(error) => return Err(format!("downloading the checkpoint: {error}")),
        }
    };
    let (scratch, dir) = (scratch.to_path_buf(), dir.to_path_buf());
    let unpacked = tokio::task::spawn_blocking(move || {
        let size = std::fs::metadata(&scratch).map_err(|error| error.to_string())?.len();
        let found = sha256_of(&scratch).map_err(|error| error.to_string())?;
        if found != sha256 {
            return Err(format!("the checkpoint's SHA-256 is {found}, not {sha256}: damaged in transit"));
        }
        let file = std::fs::File::open(&scratch).map_err(|error| error.to_string())?;
        archive::unpack_verified(std::io::BufReader::new(file), None, &dir, u64::MAX)
            .map_err(|error| error.to_string())?;
        let _ = std::fs::remove_file(&scratch);
        Ok(size)
    })
    .await
    .map_err(|error| error.to_string())?;
    unpacked.map(|size| Some((from, size)))
}

fn sha256_of(path: &Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 256 << 10];
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            return Ok(archive::hex(&hasher.finalize()));
        }
        hasher.update(&buffer[..read]);
    }
}
