//! Versioned results: workers stream an attempt's output files (fenced), then seal them as the
//! immutable version `results/<sweep>/<index>/v<attempt>/`; anyone lists versions and
//! downloads the files their manifests list. File handling is in `storage`; this module
//! decides who may do what and records it.

use super::fence;
use crate::db::{self, now_ms};
use crate::error::{ApiError, ApiJson, ApiPath, ApiQuery, ApiResult};
use crate::state::AppState;
use crate::storage::{self, Layout, PlaceError, ReceiveError, SealError};
use axum::body::{Body, BodyDataStream};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use futures_util::StreamExt;
use shared::api::{FileUploadQuery, JobId, ManifestEntry, ResultUpload, ResultVersion, WorkerId};
use std::collections::{BTreeSet, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

pub fn router() -> Router<AppState> {
    Router::new()
        // Uploads stream to disk and are limited by `max_upload_bytes` as they arrive, not by
        // the small body limit every other route has.
        .route("/api/jobs/{id}/attempts/{attempt}/files/{*path}", put(upload).layer(DefaultBodyLimit::disable()))
        .route("/api/jobs/{id}/attempts/{attempt}/result", post(seal))
        .route("/api/jobs/{id}/results", get(list))
        .route("/api/jobs/{id}/results/{attempt}/files/{*path}", get(download))
}

/// A path a result file may have: relative and plain, and not one of the files the server
/// writes into every version itself.
fn check_upload_path(path: &str) -> ApiResult<()> {
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

/// A full disk is the operator's to fix and worth saying; other disk errors are internal.
fn disk_error(error: io::Error, what: String) -> ApiError {
    if storage::is_disk_full(&error) {
        ApiError::InsufficientStorage(format!("the server's disk is full ({what}): {error}; free space and retry"))
    } else {
        ApiError::Internal(anyhow::Error::new(error).context(what))
    }
}

/// A refused upload is answered only after the rest of its body is read and dropped: a server
/// that answers mid-upload and closes the connection makes the client see a broken connection
/// instead of the 409 or 413, and retry the same refused upload for ever.
async fn upload(
    State(state): State<AppState>,
    key: Result<ApiPath<(JobId, u32, String)>, ApiError>,
    query: Result<ApiQuery<FileUploadQuery>, ApiError>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<ManifestEntry>> {
    let mut stream = body.into_data_stream();
    let stored = match (key, query) {
        (Ok(ApiPath(key)), Ok(ApiQuery(query))) => store(&state, key, query.worker_id, &headers, &mut stream).await,
        (Err(error), _) | (_, Err(error)) => Err(error),
    };
    if stored.is_err() {
        let limit = state.config.max_upload_bytes;
        let mut shutting_down = state.shutting_down.clone();
        tokio::select! {
            _ = drain(&mut stream, limit) => {}
            _ = shutting_down.wait_for(|stop| *stop) => {}
        }
    }
    stored
}

/// Reads and drops what is left of a body, up to `limit` bytes.
async fn drain(stream: &mut BodyDataStream, limit: u64) {
    let mut drained = 0u64;
    while let Some(Ok(chunk)) = stream.next().await {
        drained += chunk.len() as u64;
        if drained > limit {
            return;
        }
    }
}

/// Streams one file of an attempt into its staging directory.
async fn store(
    state: &AppState,
    (id, attempt, path): (JobId, u32, String),
    worker: WorkerId,
    headers: &HeaderMap,
    stream: &mut BodyDataStream,
) -> ApiResult<Json<ManifestEntry>> {
    check_upload_path(&path)?;
    fence::holder(&mut *state.db.reader.acquire().await?, id, attempt, worker, "file upload").await?;
    if db::results::exists(&state.db.reader, id, attempt).await? {
        return Err(already_stored(id, attempt));
    }
    // Per file, and per attempt counting what is staged already (uploads of one attempt come
    // one after another from its worker).
    let (per_file, per_attempt) = (state.config.max_upload_bytes, state.config.max_attempt_upload_bytes);
    let staged = db::results::staged_bytes(&state.db.reader, id, attempt, &path).await?;
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
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit) {
        return Err(too_large());
    }
    let layout = Layout::new(&state.config.data_dir);
    // No database connection is held while the body streams in.
    let received = storage::receive(&layout.incoming(), stream, limit).await.map_err(|error| match error {
        ReceiveError::TooLarge(_) => too_large(),
        ReceiveError::Body(reason) => ApiError::BadRequest(format!("upload of `{path}` broke off: {reason}")),
        ReceiveError::Disk(error) => disk_error(error, format!("storing `{path}` of job {id} attempt {attempt}")),
    })?;
    let entry = ManifestEntry { path: path.clone(), size: received.size, sha256: received.sha256.clone() };
    let placed = place(state, &layout, id, attempt, worker, &received, &entry).await;
    if placed.is_err() {
        let _ = tokio::fs::remove_file(&received.temp).await;
    }
    placed?;
    tracing::debug!(job = %id, attempt, path = %entry.path, size = entry.size, "result file uploaded");
    Ok(Json(entry))
}

/// Moves a received file into its attempt's staging and records its hash.
async fn place(
    state: &AppState,
    layout: &Layout,
    id: JobId,
    attempt: u32,
    worker: WorkerId,
    received: &storage::Received,
    entry: &ManifestEntry,
) -> ApiResult<()> {
    // The attempt may have ended while the bytes streamed in.
    fence::holder(&mut *state.db.reader.acquire().await?, id, attempt, worker, "file upload").await?;
    db::results::unstage(&mut *state.db.writer.acquire().await?, id, attempt, &entry.path).await?;
    storage::place(received, &layout.staging(id, attempt), &entry.path).await.map_err(|error| match error {
        PlaceError::Clash(why) => ApiError::Conflict(format!("cannot store job {id} attempt {attempt} file: {why}")),
        PlaceError::Disk(error) => disk_error(error, format!("placing `{}` of job {id} attempt {attempt}", entry.path)),
    })?;
    db::results::stage(&mut *state.db.writer.acquire().await?, id, attempt, entry).await?;
    Ok(())
}

/// Checks the manifest against what was uploaded: every path plain and listed once, every
/// file uploaded with the size and hash the manifest says.
async fn check_manifest(state: &AppState, id: JobId, attempt: u32, manifest: &mut [ManifestEntry]) -> ApiResult<()> {
    let staged = db::results::staged(&state.db.reader, id, attempt).await?;
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

async fn seal(
    State(state): State<AppState>,
    ApiPath((id, attempt)): ApiPath<(JobId, u32)>,
    ApiJson(mut upload): ApiJson<ResultUpload>,
) -> ApiResult<Json<ResultVersion>> {
    fence::holder(&mut *state.db.reader.acquire().await?, id, attempt, upload.worker_id, "result seal").await?;
    if db::results::exists(&state.db.reader, id, attempt).await? {
        return Err(already_stored(id, attempt));
    }
    let job = db::jobs::get(&state.db.reader, id).await?.ok_or_else(|| ApiError::NotFound(format!("no job {id}")))?;
    let relative = Layout::version_path(&job.sweep, job.index, attempt);
    // Sweep names are checked at submission; this keeps a bad row from ever leaving results/.
    storage::check_relative_path(&relative).map_err(|why| anyhow::anyhow!("result path of job {id}: {why}"))?;
    check_manifest(&state, id, attempt, &mut upload.manifest).await?;
    let version = ResultVersion {
        job_id: id,
        attempt,
        path: relative,
        files: upload.manifest,
        record: upload.record,
        params: job.params,
        metrics: db::metrics::summaries_of_attempt(&state.db.reader, id, attempt).await?,
        stored_at: now_ms(),
    };
    let layout = Layout::new(&state.config.data_dir);
    let staging = layout.staging(id, attempt);
    let target = layout.absolute(&version.path);
    let what = format!("sealing result v{attempt} of job {id}");
    let Some(_sealing) = SealLock::take(&target) else {
        return Err(ApiError::Conflict(format!("result v{attempt} of job {id} is being sealed by another request")));
    };
    // Looked at again under the lock: a seal that ended meanwhile has recorded it.
    if db::results::exists(&state.db.reader, id, attempt).await? {
        return Err(already_stored(id, attempt));
    }
    remove_unrecorded(&target).await.map_err(|error| disk_error(error, what.clone()))?;
    seal_on_disk(&staging, &target, &version).await.map_err(|error| match error {
        SealError::Mismatch(why) => ApiError::BadRequest(format!("{what}: {why}")),
        SealError::AlreadyStored => already_stored(id, attempt),
        SealError::Disk(error) => disk_error(error, what.clone()),
    })?;
    // Record it, still fenced: should the attempt have ended meanwhile, or the record fail,
    // the directory goes back to staging so that nothing unrecorded stays under results/.
    let recorded = record(&state, &version, upload.worker_id).await;
    if recorded.is_err() {
        if let Err(error) = tokio::fs::rename(&target, &staging).await {
            tracing::error!(%error, job = %id, attempt, "could not move an unrecorded result back to staging");
        }
    }
    recorded?;
    tracing::info!(job = %id, attempt, path = %version.path, files = version.files.len(), "result sealed");
    Ok(Json(version))
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

/// Removes a version directory that has no record: what a server killed between the rename
/// and the record leaves behind. Left in place, it would make every later seal of the attempt
/// a 409 "already stored", and the job would succeed with no result.
async fn remove_unrecorded(target: &Path) -> io::Result<()> {
    match tokio::fs::remove_dir_all(target).await {
        Ok(()) => {
            tracing::warn!(path = %target.display(), "removed a result version left unrecorded by a crash");
            Ok(())
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    }
}

async fn seal_on_disk(
    staging: &std::path::Path,
    target: &std::path::Path,
    version: &ResultVersion,
) -> Result<(), SealError> {
    let manifest_json = serde_json::to_vec_pretty(&version.files).map_err(io::Error::other)?;
    let result_json = serde_json::to_vec_pretty(version).map_err(io::Error::other)?;
    // An attempt with nothing to upload has no staging directory yet.
    tokio::fs::create_dir_all(staging).await?;
    let (staging, target, manifest) = (staging.to_path_buf(), target.to_path_buf(), version.files.clone());
    tokio::task::spawn_blocking(move || storage::seal(&staging, &target, &manifest, &manifest_json, &result_json))
        .await
        .map_err(io::Error::other)?
}

async fn record(state: &AppState, version: &ResultVersion, worker: WorkerId) -> ApiResult<()> {
    let (id, attempt) = (version.job_id, version.attempt);
    let mut tx = state.db.writer.begin().await?;
    fence::holder(&mut tx, id, attempt, worker, "result seal").await?;
    if !db::results::insert(&mut tx, version).await? {
        return Err(already_stored(id, attempt));
    }
    db::results::unstage_attempt(&mut tx, id, attempt).await?;
    tx.commit().await?;
    Ok(())
}

async fn list(State(state): State<AppState>, ApiPath(id): ApiPath<JobId>) -> ApiResult<Json<Vec<ResultVersion>>> {
    db::jobs::state(&mut *state.db.reader.acquire().await?, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no job {id}")))?;
    Ok(Json(db::results::list(&state.db.reader, id).await?))
}

async fn download(
    State(state): State<AppState>,
    ApiPath((id, attempt, path)): ApiPath<(JobId, u32, String)>,
) -> ApiResult<Response> {
    storage::check_relative_path(&path).map_err(ApiError::BadRequest)?;
    let version = db::results::get(&state.db.reader, id, attempt)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("job {id} has no result v{attempt}")))?;
    // Only what the manifest lists is served, whatever else lies in the directory.
    if !version.files.iter().any(|entry| entry.path == path) {
        return Err(ApiError::NotFound(format!("result v{attempt} of job {id} has no file `{path}`")));
    }
    let location = Layout::new(&state.config.data_dir).absolute(&format!("{}/{path}", version.path));
    let file = tokio::fs::File::open(&location).await.map_err(|error| match error.kind() {
        io::ErrorKind::NotFound => {
            ApiError::NotFound(format!("file `{path}` of job {id} v{attempt} is gone from disk"))
        }
        _ => ApiError::Internal(anyhow::Error::new(error).context(format!("opening {}", location.display()))),
    })?;
    let length = file.metadata().await.map_err(anyhow::Error::from)?.len();
    let body = Body::from_stream(tokio_util::io::ReaderStream::with_capacity(file, 256 << 10));
    let headers =
        [(header::CONTENT_TYPE, "application/octet-stream".to_string()), (header::CONTENT_LENGTH, length.to_string())];
    Ok((headers, body).into_response())
}
