//! `/api/workers`: register, claim (long-poll), heartbeat (which also stores GPU telemetry),
//! list.

use super::session_worker::SessionWorker;
use crate::error::{ApiJson, ApiPath, ApiResult};
use crate::state::AppState;
use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use shared::api::{
    ClaimRequest, ClaimResponse, FinishRequest, FinishResponse, HeartbeatRequest, HeartbeatResponse, RegisterRequest,
    RegisterResponse, WorkerId, WorkerInfo,
};
use std::time::Duration;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/workers", post(register).get(list))
        .route("/api/workers/{id}/claim", post(claim))
        .route("/api/workers/{id}/heartbeat", post(heartbeat))
        .route("/api/workers/{id}/drain", post(drain))
        .route("/api/workers/{id}/leave", post(leave))
        .route("/api/workers/{id}/finish", post(finish))
}

async fn register(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<RegisterRequest>,
) -> ApiResult<Json<RegisterResponse>> {
    Ok(Json(state.queue.register(request).await?))
}

async fn list(State(state): State<AppState>) -> ApiResult<Json<Vec<WorkerInfo>>> {
    Ok(Json(state.queue.workers().await?))
}

async fn heartbeat(
    State(state): State<AppState>,
    session: SessionWorker,
    ApiPath(id): ApiPath<WorkerId>,
    ApiJson(request): ApiJson<HeartbeatRequest>,
) -> ApiResult<Json<HeartbeatResponse>> {
    Ok(Json(state.queue.heartbeat(session.check(id)?, request).await?))
}

/// The worker stops taking jobs: its parked claim returns at once, empty.
async fn drain(
    State(state): State<AppState>,
    session: SessionWorker,
    ApiPath(id): ApiPath<WorkerId>,
) -> ApiResult<Json<serde_json::Value>> {
    state.queue.drain(session.check(id)?);
    Ok(Json(serde_json::json!({ "draining": true })))
}

/// The worker stopped cleanly: `left` until it registers again.
async fn leave(
    State(state): State<AppState>,
    session: SessionWorker,
    ApiPath(id): ApiPath<WorkerId>,
) -> ApiResult<Json<serde_json::Value>> {
    state.queue.leave(session.check(id)?).await?;
    Ok(Json(serde_json::json!({ "left": true })))
}

/// Hands out the jobs that fit the worker's capacity, waiting up to `wait_ms` for one.
async fn claim(
    State(state): State<AppState>,
    session: SessionWorker,
    ApiPath(id): ApiPath<WorkerId>,
    ApiJson(request): ApiJson<ClaimRequest>,
) -> ApiResult<Json<ClaimResponse>> {
    let id = session.check(id)?;
    let jobs = state.queue.claim(id, request.capacity, Duration::from_millis(request.wait_ms)).await?;
    Ok(Json(ClaimResponse { jobs }))
}

/// The end of an attempt in one request (log tail, metrics, result, outcome), and optionally
/// the claim of the worker's next jobs.
async fn finish(
    State(state): State<AppState>,
    session: SessionWorker,
    ApiPath(id): ApiPath<WorkerId>,
    ApiJson(request): ApiJson<FinishRequest>,
) -> ApiResult<Json<FinishResponse>> {
    Ok(Json(state.queue.finish(session.check(id)?, request).await?))
}
