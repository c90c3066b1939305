//! `GET /api/health`: for load balancers, compose healthchecks and the CLI's first contact.

use crate::state::AppState;
use axum::routing::get;
use axum::{Json, Router};
use shared::api::Health;

pub fn router() -> Router<AppState> {
    Router::new().route("/api/health", get(health))
}

async fn health() -> Json<Health> {
    Json(Health { status: "ok".into(), version: env!("CARGO_PKG_VERSION").into(), protocol: shared::PROTOCOL_VERSION })
}
