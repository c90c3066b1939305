//! Queue maintenance: retry many jobs at once (listed, or a sweep's failed ones) and remove a
//! finished sweep with everything recorded about it (see `queue::maintenance`).

use crate::auth::Caller;
use crate::error::{ApiJson, ApiPath, ApiResult};
use crate::state::AppState;
use axum::extract::State;
use axum::routing::{delete, post};
use axum::{Json, Router};
use shared::api::{BulkRetryRequest, RetryResponse, SweepRemoved};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/jobs/retry", post(retry_jobs))
        .route("/api/sweeps/{sweep}/retry", post(retry_sweep))
        .route("/api/sweeps/{sweep}", delete(remove_sweep))
}

async fn retry_jobs(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(request): ApiJson<BulkRetryRequest>,
) -> ApiResult<Json<RetryResponse>> {
    Ok(Json(state.queue.retry_jobs(&caller, request.ids).await?))
}

async fn retry_sweep(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(key): ApiPath<String>,
) -> ApiResult<Json<RetryResponse>> {
    Ok(Json(state.queue.retry_sweep(&caller, &key).await?))
}

async fn remove_sweep(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(key): ApiPath<String>,
) -> ApiResult<Json<SweepRemoved>> {
    Ok(Json(state.queue.remove_sweep(&caller, &key).await?))
}
