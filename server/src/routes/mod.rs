//! The HTTP API: one module per resource, each exposing `router()`.

mod fence;
mod health;
mod jobs;
mod logs;
mod metrics;
mod results;
mod summary;
mod sweeps;
mod telemetry;
mod workers;

use crate::state::AppState;
use axum::extract::DefaultBodyLimit;
use axum::Router;
use tower_http::trace::TraceLayer;

pub fn router(state: AppState) -> Router {
    let body_limit = state.config.max_body_bytes;
    Router::new()
        .merge(health::router())
        .merge(sweeps::router())
        .merge(jobs::router())
        .merge(workers::router())
        .merge(logs::router())
        .merge(metrics::router())
        .merge(results::router())
        .merge(summary::router())
        .merge(telemetry::router())
        .fallback(|| async {
            crate::error::ApiError::NotFound("no such endpoint; see the API list in README.md".into())
        })
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}
