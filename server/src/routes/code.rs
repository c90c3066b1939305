//! Code snapshots: the CLI asks whether the server has one (`GET /api/code/{digest}`) and
//! uploads it if not (`POST /api/code`, the compressed archive as the body, streamed); workers
//! download it (`GET /api/workers/{id}/code/{digest}`); anyone reads a sweep's workspace and
//! downloads its snapshot. Storage and checks are in `queue::code`.

use super::session_worker::SessionWorker;
use crate::db;
use crate::error::{ApiError, ApiPath, ApiResult};
use crate::state::AppState;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use shared::api::{CodeInfo, WorkerId, Workspace};

pub fn router() -> Router<AppState> {
    Router::new()
        // Streamed to disk and limited by `max_upload_bytes` as it arrives.
        .route("/api/code", post(upload).layer(DefaultBodyLimit::disable()))
        .route("/api/code/{digest}", get(info))
        .route("/api/code/{digest}/archive", get(download))
        .route("/api/workers/{id}/code/{digest}", get(worker_download))
        .route("/api/sweeps/{sweep}/code", get(workspace))
}

async fn info(State(state): State<AppState>, ApiPath(digest): ApiPath<String>) -> ApiResult<Json<CodeInfo>> {
    Ok(Json(state.queue.code_info(&digest).await?))
}

async fn upload(State(state): State<AppState>, headers: HeaderMap, body: Body) -> ApiResult<Json<CodeInfo>> {
    let declared = super::uploads::declared_length(&headers);
    let mut stream = body.into_data_stream();
    let stored = state.queue.store_code(declared, &mut stream).await;
    if stored.is_err() {
        super::uploads::drain_refused(&state, &mut stream).await;
    }
    Ok(Json(stored?))
}

async fn download(State(state): State<AppState>, ApiPath(digest): ApiPath<String>) -> ApiResult<Response> {
    archive_response(&state, &digest).await
}

async fn worker_download(
    State(state): State<AppState>,
    session: SessionWorker,
    ApiPath((worker, digest)): ApiPath<(WorkerId, String)>,
) -> ApiResult<Response> {
    session.check(worker)?;
    archive_response(&state, &digest).await
}

async fn archive_response(state: &AppState, digest: &str) -> ApiResult<Response> {
    let (file, length) = state.queue.open_code(digest).await?;
    Ok(stream_file(file, length, &format!("{digest}.tar.zst")))
}

/// A file as a download: streamed, with its length and a name to save it under.
pub(super) fn stream_file(file: tokio::fs::File, length: u64, name: &str) -> Response {
    let body = Body::from_stream(tokio_util::io::ReaderStream::with_capacity(file, 256 << 10));
    let headers = [
        (header::CONTENT_TYPE, "application/zstd".to_string()),
        (header::CONTENT_LENGTH, length.to_string()),
        (header::CONTENT_DISPOSITION, format!("attachment; filename=\"{name}\"")),
    ];
    (headers, body).into_response()
}

/// The code, directory, variables and setup line of a sweep's jobs.
async fn workspace(State(state): State<AppState>, ApiPath(key): ApiPath<String>) -> ApiResult<Json<Workspace>> {
    let sweep = state.queue.find_sweep(&key).await?;
    let mut conn = state.queue.reader().acquire().await.map_err(ApiError::from)?;
    Ok(Json(db::code::workspace_of(conn.conn(), sweep.info.id).await?))
}
