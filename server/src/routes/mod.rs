//! The HTTP API: one module per resource, each exposing `router()`.

mod analysis;
mod checkpoints;
mod code;
mod events;
mod health;
mod jobs;
mod logs;
mod maintenance;
mod metrics;
mod overview;
mod page;
mod prometheus;
mod results;
mod session;
mod session_worker;
mod summary;
mod sweeps;
mod telemetry;
mod uploads;
mod users;
mod workers;

use crate::state::AppState;
use axum::extract::DefaultBodyLimit;
use axum::extract::Request;
use axum::middleware;
use axum::Router;
use tower_http::trace::TraceLayer;

pub fn router(state: AppState) -> Router {
    let body_limit = state.config.max_body_bytes;
    let (metrics_guarded, metrics_public) = prometheus::routers(state.config.metrics_public);
    Router::new()
        .merge(page::router())
        .merge(analysis::router())
        .merge(checkpoints::router())
        .merge(code::router())
        .merge(health::router())
        .merge(events::router())
        .merge(overview::router())
        .merge(sweeps::router())
        .merge(jobs::router())
        .merge(workers::router())
        .merge(logs::router())
        .merge(maintenance::router())
        .merge(metrics::router())
        .merge(results::router())
        .merge(session::router())
        .merge(summary::router())
        .merge(telemetry::router())
        .merge(users::router())
        .merge(metrics_guarded)
        .fallback(|| async {
            crate::error::ApiError::NotFound("no such endpoint; see the API list in README.md".into())
        })
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(std::sync::Arc::new(state.config.tokens.clone()), crate::auth::authorize))
        .merge(metrics_public)
        .layer(middleware::from_fn_with_state(state.clone(), prometheus::time_request))
        // Spans name the path only: a query string may carry what should not be logged (a
        // token sent there by mistake is refused, and must not end up in the log either).
        .layer(TraceLayer::new_for_http().make_span_with(|request: &Request| {
            tracing::debug_span!("request", method = %request.method(), path = %request.uri().path())
        }))
        .with_state(state)
}
