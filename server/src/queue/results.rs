//! Versioned results: workers stream an attempt's output files into staging (fenced), then
//! seal them as the immutable version `results/<sweep>/<index>/v<attempt>/`. File handling
//! is in `storage`; this module decides who may do what and records it.

use super::{Change, Queue, Tx};
use crate::db::{self, now_ms};
use crate::error::{ApiError, ApiResult};
use crate::storage::{self, disk_error, Layout, PlaceError, ReceiveError, SealError};
use futures_util::Stream;
use shared::api::{JobId, ManifestEntry, ResultUpload, ResultVersion, WorkerId};
use std::collections::{BTreeSet, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

/// A path a result file may have: relative and plain, and not one of the files the server
/// writes into every version itself.
pub fn check_upload_path(path: &str) -> ApiResult<()> {
    storage::check_relative_path(path).map_err(ApiError::BadRequest)?;
    if path.split('/').next() == Some(storage::RESERVED_DIR) {
        return Err(ApiError::BadRequest(format!(
            "`{path}` is inside `{}/`, where the server keeps its own record of a result version",
            storage::RESERVED_DIR
        )));
    }
    Ok(())
}

fn already_stored(job: JobId, attempt: u32) -> ApiError {
    ApiError::Conflict(format!("result v{attempt} of job {job} is already stored"))
}

impl Queue {
    /// Streams one file of an attempt into its staging directory. `declared` is the body's
    /// Content-Length when it came with one.
    pub async fn store_file<S, B, E>(
        &self,
        (id, attempt, path): (JobId, u32, String),
        worker: WorkerId,
        declared: Option<u64>,
        body: S,
    ) -> ApiResult<ManifestEntry>
    where
        S: Stream<Item = Result<B, E>> + Unpin,
        B: AsRef<[u8]>,
        E: std::fmt::Display,
    {
        check_upload_path(&path)?;
        super::fence::holder(self.reader().acquire().await?.conn(), id, attempt, worker, "file upload").await?;
        if db::results::exists(self.reader(), id, attempt).await? {
            return Err(already_stored(id, attempt));
        }
        // Per file, and per attempt counting what is staged already (uploads of one attempt come
        // one after another from its worker).
        let (per_file, per_attempt) = (self.config.max_upload_bytes, self.config.max_attempt_upload_bytes);
        let staged = db::results::staged_bytes(self.reader(), id, attempt, &path).await?;
        let room = per_attempt.saturating_sub(staged);
        let limit = per_file.min(room);
        let too_large = || {
            ApiError::PayloadTooLarge(if room < per_file {
                format!(
                    "file `{path}` would take job {id} attempt {attempt} past its upload limit of {per_attempt} bytes \
                     ({staged} bytes stored already)"
                )
            } else {
                format!("file `{path}` is larger than the upload limit of {per_file} bytes")
            })
        };
        if declared.is_some_and(|length| length > limit) {
            return Err(too_large());
        }
        let _room = storage::ensure_room(&self.layout.incoming(), declared, || {
            format!("`{path}` of job {id} attempt {attempt}")
        })?;
        // No database connection is held while the body streams in.
        let received = storage::receive(&self.layout.incoming(), body, limit).await.map_err(|error| match error {
            ReceiveError::TooLarge(_) => too_large(),
            ReceiveError::Body(reason) => ApiError::BadRequest(format!("upload of `{path}` broke off: {reason}")),
            ReceiveError::Disk(error) => disk_error(error, format!("storing `{path}` of job {id} attempt {attempt}")),
        })?;
        let entry = ManifestEntry { path: path.clone(), size: received.size, sha256: received.sha256.clone() };
        let placed = self.place_file(id, attempt, worker, &received, &entry).await;
        if placed.is_err() {
            let _ = tokio::fs::remove_file(&received.temp).await;
        }
        placed?;
        tracing::debug!(job = %id, attempt, path = %entry.path, size = entry.size, "result file uploaded");
        Ok(entry)
    }

    /// Moves a received file into its attempt's staging and records its hash, still fenced.
    async fn place_file(
        &self,
        id: JobId,
        attempt: u32,
        worker: WorkerId,
        received: &storage::Received,
        entry: &ManifestEntry,
    ) -> ApiResult<()> {
        let (staging, received, entry) = (self.layout.staging(id, attempt), received.clone(), entry.clone());
        self.write(move |tx| {
            Box::pin(async move {
                // The attempt may have ended while the bytes streamed in.
                super::fence::holder(tx.conn().await?, id, attempt, worker, "file upload").await?;
                db::results::unstage(tx.conn().await?, id, attempt, &entry.path).await?;
                storage::place(&received, &staging, &entry.path).await.map_err(|error| match error {
                    PlaceError::Clash(why) => {
                        ApiError::Conflict(format!("cannot store job {id} attempt {attempt} file: {why}"))
                    }
                    PlaceError::Disk(error) => {
                        disk_error(error, format!("placing `{}` of job {id} attempt {attempt}", entry.path))
                    }
                })?;
                db::results::stage(tx.conn().await?, id, attempt, &entry).await?;
                Ok(())
            })
        })
        .await
    }

    /// Seals an attempt's staged files as its immutable result version.
    pub async fn seal(&self, id: JobId, attempt: u32, mut upload: ResultUpload) -> ApiResult<ResultVersion> {
        let worker = upload.worker_id;
        super::fence::holder(self.reader().acquire().await?.conn(), id, attempt, worker, "result seal").await?;
        if db::results::exists(self.reader(), id, attempt).await? {
            return Err(already_stored(id, attempt));
        }
        let job =
            db::job_pages::get(self.reader(), id).await?.ok_or_else(|| ApiError::NotFound(format!("no job {id}")))?;
        let relative = Layout::version_path(&job.sweep, job.index, attempt);
        // Sweep names are checked at submission; this keeps a bad row from ever leaving results/.
        storage::check_relative_path(&relative).map_err(|why| anyhow::anyhow!("result path of job {id}: {why}"))?;
        check_manifest(self, id, attempt, &mut upload.manifest).await?;
        let version = ResultVersion {
            job_id: id,
            attempt,
            path: relative,
            files: upload.manifest,
            record: upload.record,
            params: job.params,
            metrics: db::metrics::summaries_of_attempt(self.reader(), id, attempt).await?,
            stored_at: now_ms(),
        };
        let staging = self.layout.staging(id, attempt);
        let target = self.layout.absolute(&version.path);
        let what = format!("sealing result v{attempt} of job {id}");
        if version.files.is_empty() {
            // A version without files is its record alone (see `finish::seal`).
            let recorded = version.clone();
            self.write(move |tx| Box::pin(async move { record(tx, &recorded, worker).await })).await?;
            if let Some(charge) = shared::fair_share::charge(&version.record) {
                self.usage_recorded(version.job_id, charge.seconds()).await;
            }
            return Ok(version);
        }
        let Some(_sealing) = SealLock::take(&target) else {
            return Err(ApiError::Conflict(format!(
                "result v{attempt} of job {id} is being sealed by another request"
            )));
        };
        // Looked at again under the lock: a seal that ended meanwhile has recorded it.
        if db::results::exists(self.reader(), id, attempt).await? {
            return Err(already_stored(id, attempt));
        }
        set_aside_unrecorded(&self.layout, &target).await.map_err(|error| disk_error(error, what.clone()))?;
        seal_on_disk(&staging, &target, &version).await.map_err(|error| match error {
            SealError::Mismatch(why) => ApiError::BadRequest(format!("{what}: {why}")),
            SealError::AlreadyStored => already_stored(id, attempt),
            SealError::Disk(error) => disk_error(error, what.clone()),
        })?;
        // Record it, still fenced: should the attempt have ended meanwhile, or the record fail,
        // the directory goes back to staging so that nothing unrecorded stays under results/.
        let recorded = {
            let version = version.clone();
            self.write(move |tx| Box::pin(async move { record(tx, &version, worker).await })).await
        };
        if recorded.is_err() {
            if let Err(error) = tokio::fs::rename(&target, &staging).await {
                tracing::error!(%error, job = %id, attempt, "could not move an unrecorded result back to staging");
            }
        }
        recorded?;
        if let Some(charge) = shared::fair_share::charge(&version.record) {
            self.usage_recorded(version.job_id, charge.seconds()).await;
        }
        tracing::info!(job = %id, attempt, path = %version.path, files = version.files.len(), "result sealed");
        Ok(version)
    }
}

impl Queue {
    /// A stored record's charge (GPU or slot time) counts in its owner's fair share from the
    /// next claim on.
    pub(super) async fn usage_recorded(&self, job: JobId, seconds: f64) {
        if !self.shares.tracks_usage() {
            return; // no fair share has read usage yet: its first read finds this stored
        }
        match db::shares::owner_of(self.reader(), job).await {
            Ok(Some(owner)) => self.shares.recorded(&owner, seconds),
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, %job, "reading a job's owner; its usage counts from the next read"),
        }
    }
}

/// Checks the manifest against what was uploaded: every path plain and listed once, every
/// file uploaded with the size and hash the manifest says.
async fn check_manifest(queue: &Queue, id: JobId, attempt: u32, manifest: &mut [ManifestEntry]) -> ApiResult<()> {
    let staged = db::results::staged(queue.reader(), id, attempt).await?;
    let mut seen = HashSet::new();
    for entry in manifest {
        check_upload_path(&entry.path)?;
        if !seen.insert(entry.path.clone()) {
            return Err(ApiError::BadRequest(format!("`{}` is listed twice in the manifest", entry.path)));
        }
        entry.sha256.make_ascii_lowercase();
        let Some(uploaded) = staged.get(&entry.path) else {
            return Err(ApiError::BadRequest(format!("`{}` is in the manifest but was not uploaded", entry.path)));
        };
        if (uploaded.size, uploaded.sha256.as_str()) != (entry.size, entry.sha256.as_str()) {
            return Err(ApiError::BadRequest(format!(
                "`{}` was uploaded with {} bytes and SHA-256 {} but the manifest says {} bytes and {}",
                entry.path, uploaded.size, uploaded.sha256, entry.size, entry.sha256
            )));
        }
    }
    Ok(())
}

/// The version directories being sealed by this process: one seal at a time per attempt, so
/// that a version directory found without its record is never one about to be recorded.
static SEALING: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

struct SealLock(PathBuf);

impl SealLock {
    fn take(target: &Path) -> Option<SealLock> {
        let mut sealing = SEALING.lock().unwrap_or_else(PoisonError::into_inner);
        sealing.insert(target.to_path_buf()).then(|| SealLock(target.to_path_buf()))
    }
}

impl Drop for SealLock {
    fn drop(&mut self) {
        SEALING.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.0);
    }
}

/// Moves a version directory that has no record out of the way of the version about to be
/// sealed there, into `results/.unrecorded/`. Left in place, it would make every later seal of
/// the attempt a 409 "already stored", and the job would succeed with no result. It is what a
/// server killed between the rename and the record leaves behind (the same attempt's files,
/// sent again), but also what a database restored from an older backup does not know: another
/// run's results, which are kept there rather than deleted, for `unrecorded_retention` (the
/// reaper's upkeep removes them after it).
pub(super) async fn set_aside_unrecorded(layout: &Layout, target: &Path) -> io::Result<()> {
    if tokio::fs::symlink_metadata(target).await.is_err() {
        return Ok(());
    }
    let root = layout.unrecorded_root();
    tokio::fs::create_dir_all(&root).await?;
    let relative = target.strip_prefix(layout.absolute("results")).unwrap_or(target);
    let name = relative.to_string_lossy().replace(['/', '\\'], "_");
    let aside = root.join(format!("{}-{name}", now_ms()));
    match tokio::fs::rename(target, &aside).await {
        Ok(()) => {
            tracing::warn!(path = %target.display(), kept = %aside.display(), "set aside a result version the database has no record of");
            Ok(())
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    }
}

async fn seal_on_disk(staging: &Path, target: &Path, version: &ResultVersion) -> Result<(), SealError> {
    let manifest_json = serde_json::to_vec_pretty(&version.files).map_err(io::Error::other)?;
    let result_json = serde_json::to_vec_pretty(version).map_err(io::Error::other)?;
    // An attempt with nothing to upload has no staging directory yet.
    tokio::fs::create_dir_all(staging).await?;
    let (staging, target, manifest) = (staging.to_path_buf(), target.to_path_buf(), version.files.clone());
    tokio::task::spawn_blocking(move || storage::seal(&staging, &target, &manifest, &manifest_json, &result_json))
        .await
        .map_err(io::Error::other)?
}

async fn record(tx: &mut Tx, version: &ResultVersion, worker: WorkerId) -> ApiResult<()> {
    let (id, attempt) = (version.job_id, version.attempt);
    super::fence::holder(tx.conn().await?, id, attempt, worker, "result seal").await?;
    if !db::results::insert(tx.conn().await?, version).await? {
        return Err(already_stored(id, attempt));
    }
    db::results::unstage_attempt(tx.conn().await?, id, attempt).await?;
    tx.note(Change::Page);
    Ok(())
}
