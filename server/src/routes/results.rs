//! Versioned results: workers stream an attempt's output files (fenced), then seal them as the
//! immutable version `results/<sweep>/<index>/v<attempt>/`; anyone lists versions and
//! downloads the files their manifests list. File handling is in `storage`; this module
//! decides who may do what and records it.

use super::session_worker::SessionWorker;
use crate::db;
use crate::error::{ApiError, ApiJson, ApiPath, ApiQuery, ApiResult};
use crate::state::AppState;
use crate::storage;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use shared::api::{FileUploadQuery, JobId, ManifestEntry, ResultUpload, ResultVersion};
use std::io;

pub fn router() -> Router<AppState> {
    Router::new()
        // Uploads stream to disk and are limited by `max_upload_bytes` as they arrive, not by
        // the small body limit every other route has.
        .route("/api/jobs/{id}/attempts/{attempt}/files/{*path}", put(upload).layer(DefaultBodyLimit::disable()))
        .route("/api/jobs/{id}/attempts/{attempt}/result", post(seal))
        .route("/api/jobs/{id}/results", get(list))
        .route("/api/jobs/{id}/results/{attempt}/files/{*path}", get(download))
}

/// Streams one output file of an attempt (a refused one is drained first: `uploads`).
async fn upload(
    State(state): State<AppState>,
    session: Result<SessionWorker, ApiError>,
    key: Result<ApiPath<(JobId, u32, String)>, ApiError>,
    query: Result<ApiQuery<FileUploadQuery>, ApiError>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<ManifestEntry>> {
    let mut stream = body.into_data_stream();
    let stored = match (session, key, query) {
        (Ok(session), Ok(ApiPath(key)), Ok(ApiQuery(query))) => match session.check(query.worker_id) {
            Ok(worker) => {
                let declared = super::uploads::declared_length(&headers);
                state.queue.store_file(key, worker, declared, &mut stream).await.map(Json)
            }
            Err(error) => Err(error),
        },
        (Err(error), _, _) | (_, Err(error), _) | (_, _, Err(error)) => Err(error),
    };
    if stored.is_err() {
        super::uploads::drain_refused(&state, &mut stream).await;
    }
    stored
}

async fn seal(
    State(state): State<AppState>,
    session: SessionWorker,
    ApiPath((id, attempt)): ApiPath<(JobId, u32)>,
    ApiJson(upload): ApiJson<ResultUpload>,
) -> ApiResult<Json<ResultVersion>> {
    session.check(upload.worker_id)?;
    Ok(Json(state.queue.seal(id, attempt, upload).await?))
}

async fn list(State(state): State<AppState>, ApiPath(id): ApiPath<JobId>) -> ApiResult<Json<Vec<ResultVersion>>> {
    let reader = state.queue.reader();
    db::jobs::state(reader.acquire().await?.conn(), id).await?.ok_or_else(|| crate::queue::no_job(id))?;
    Ok(Json(db::results::list(reader, id).await?))
}

async fn download(
    State(state): State<AppState>,
    ApiPath((id, attempt, path)): ApiPath<(JobId, u32, String)>,
) -> ApiResult<Response> {
    storage::check_relative_path(&path).map_err(ApiError::BadRequest)?;
    let version = db::results::get(state.queue.reader(), id, attempt)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("job {id} has no result v{attempt}")))?;
    // Only what the manifest lists is served, whatever else lies in the directory.
    if !version.files.iter().any(|entry| entry.path == path) {
        return Err(ApiError::NotFound(format!("result v{attempt} of job {id} has no file `{path}`")));
    }
    let location = state.queue.layout().absolute(&format!("{}/{path}", version.path));
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
