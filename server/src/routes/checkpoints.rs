//! Checkpoints: the worker running an attempt uploads its checkpoint directory
//! (`PUT /api/jobs/{id}/attempts/{n}/checkpoint`, fenced) and the next attempt downloads the
//! newest one (`GET` on the same path, fenced to that attempt); anyone reads what a job has
//! (`GET /api/jobs/{id}/checkpoint`) and downloads it (`.../checkpoint/archive`).

use super::session_worker::SessionWorker;
use crate::error::{ApiError, ApiPath, ApiQuery, ApiResult};
use crate::queue::WorkerAttempt;
use crate::state::AppState;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::Response;
use axum::routing::{get, put};
use axum::{Json, Router};
use shared::api::{CheckpointInfo, CheckpointQuery, JobId, CHECKPOINT_ATTEMPT_HEADER, CHECKPOINT_SHA256_HEADER};

pub fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/api/jobs/{id}/attempts/{attempt}/checkpoint",
            put(upload).get(restore).layer(DefaultBodyLimit::disable()),
        )
        .route("/api/jobs/{id}/checkpoint", get(info))
        .route("/api/jobs/{id}/checkpoint/archive", get(download))
}

/// A refused upload is answered after its body was read (see `results::upload`).
async fn upload(
    State(state): State<AppState>,
    session: Result<SessionWorker, ApiError>,
    key: Result<ApiPath<(JobId, u32)>, ApiError>,
    query: Result<ApiQuery<CheckpointQuery>, ApiError>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<CheckpointInfo>> {
    let mut stream = body.into_data_stream();
    let stored = match (session, key, query) {
        (Ok(session), Ok(ApiPath((job, attempt))), Ok(ApiQuery(query))) => match session.check(query.worker_id) {
            Ok(worker) => {
                let declared = super::uploads::declared_length(&headers);
                let at = WorkerAttempt { job, attempt, worker };
                state.queue.store_checkpoint(at, declared, &mut stream).await
            }
            Err(error) => Err(error),
        },
        (Err(error), _, _) | (_, Err(error), _) | (_, _, Err(error)) => Err(error),
    };
    if stored.is_err() {
        super::uploads::drain_refused(&state, &mut stream).await;
    }
    Ok(Json(stored?))
}

async fn restore(
    State(state): State<AppState>,
    session: SessionWorker,
    ApiPath((job, attempt)): ApiPath<(JobId, u32)>,
    ApiQuery(query): ApiQuery<CheckpointQuery>,
) -> ApiResult<Response> {
    let worker = session.check(query.worker_id)?;
    let (info, file, length) = state.queue.checkpoint_for_attempt(WorkerAttempt { job, attempt, worker }).await?;
    Ok(with_info(super::code::stream_file(file, length, &format!("checkpoint-{job}.tar.zst")), &info))
}

async fn info(State(state): State<AppState>, ApiPath(job): ApiPath<JobId>) -> ApiResult<Json<CheckpointInfo>> {
    Ok(Json(state.queue.checkpoint_info(job).await?))
}

async fn download(State(state): State<AppState>, ApiPath(job): ApiPath<JobId>) -> ApiResult<Response> {
    let (info, file, length) = state.queue.open_checkpoint(job).await?;
    Ok(with_info(super::code::stream_file(file, length, &format!("checkpoint-{job}.tar.zst")), &info))
}

fn with_info(mut response: Response, info: &CheckpointInfo) -> Response {
    let headers = response.headers_mut();
    for (name, value) in
        [(CHECKPOINT_ATTEMPT_HEADER, info.attempt.to_string()), (CHECKPOINT_SHA256_HEADER, info.sha256.clone())]
    {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    }
    response
}
