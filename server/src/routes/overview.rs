//! `GET /api/overview`: the whole queue at a glance (the web page's header).

use crate::db;
use crate::error::ApiResult;
use crate::state::AppState;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use shared::api::{Overview, WorkerState};

pub fn router() -> Router<AppState> {
    Router::new().route("/api/overview", get(overview))
}

async fn overview(State(state): State<AppState>) -> ApiResult<Json<Overview>> {
    let counts = db::sweeps::counts(state.queue.reader(), None).await?;
    let sweeps = db::sweeps::count(state.queue.reader()).await?;
    let mut overview = Overview { counts, sweeps, ..Overview::default() };
    for worker in state.queue.workers().await? {
        match worker.state {
            WorkerState::Healthy => overview.workers.healthy += 1,
            WorkerState::Stale => overview.workers.stale += 1,
            WorkerState::Lost => overview.workers.lost += 1,
            WorkerState::Left => overview.workers.left += 1,
        }
    }
    Ok(Json(overview))
}
