//! `/api/jobs/{id}/log`: workers append an attempt's log bytes (fenced, idempotent by
//! offset, capped per attempt); readers page through it or follow it with a long poll.

use super::session_worker::SessionWorker;
use crate::error::{ApiPath, ApiQuery, ApiResult};
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use shared::api::{JobId, LogAck, LogAppend, LogChunk, LogQuery};

pub fn router() -> Router<AppState> {
    Router::new().route("/api/jobs/{id}/log", get(read).post(append))
}

async fn append(
    State(state): State<AppState>,
    session: SessionWorker,
    ApiPath(id): ApiPath<JobId>,
    ApiQuery(query): ApiQuery<LogAppend>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<LogAck>> {
    let worker = session.check(query.worker_id)?;
    let length = state.queue.append_log(id, query.attempt, worker, query.offset, body?).await?;
    Ok(Json(LogAck { length }))
}

async fn read(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<JobId>,
    ApiQuery(query): ApiQuery<LogQuery>,
) -> ApiResult<Json<LogChunk>> {
    Ok(Json(state.queue.read_log(id, &query).await?))
}
