//! `GET /api/workers/{name}/telemetry`: a worker's recent GPU readings (stored by heartbeats,
//! see `workers.rs`), for the workers page and `app status`.

use crate::db::{self, now_ms};
use crate::error::{ApiError, ApiPath, ApiResult};
use crate::state::AppState;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use shared::api::GpuSample;

pub fn router() -> Router<AppState> {
    // `{id}` because the other worker routes name this segment so (the router needs one name
    // per position); here it is the worker's name, which is what people know a box by.
    Router::new().route("/api/workers/{id}/telemetry", get(telemetry))
}

async fn telemetry(State(state): State<AppState>, ApiPath(name): ApiPath<String>) -> ApiResult<Json<Vec<GpuSample>>> {
    let worker = db::workers::id_by_name(state.queue.reader(), &name)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no worker `{name}`")))?;
    // The reaper prunes now and then; the window is applied here too so the answer is exact.
    let since = now_ms() - state.config.telemetry_retention.as_millis() as i64;
    Ok(Json(db::telemetry::list(state.queue.reader(), worker, since).await?))
}
