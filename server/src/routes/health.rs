//! `GET /api/health`: for load balancers, compose healthchecks and the CLI's first contact: the
//! process serves (a liveness probe). `GET /api/ready`: the same, once the database answers a
//! query too (a readiness probe: a replica whose PostgreSQL is down or unreachable is taken out
//! of a load balancer's rotation, not restarted).

use crate::state::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use shared::api::Health;
use std::time::Duration;

/// How long `/api/ready` waits for the database's answer.
const READY_WAIT: Duration = Duration::from_secs(2);

pub fn router() -> Router<AppState> {
    Router::new().route("/api/health", get(health)).route("/api/ready", get(ready))
}

fn answer(status: impl Into<String>) -> Health {
    Health { status: status.into(), version: env!("CARGO_PKG_VERSION").into(), protocol: shared::PROTOCOL_VERSION }
}

async fn health() -> Json<Health> {
    Json(answer("ok"))
}

async fn ready(State(state): State<AppState>) -> (StatusCode, Json<Health>) {
    match tokio::time::timeout(READY_WAIT, state.queue.reader().ping()).await {
        Ok(Ok(())) => (StatusCode::OK, Json(answer("ok"))),
        Ok(Err(error)) => {
            // Public: the cause (hosts, users, certificates) goes to the log, not to the caller.
            tracing::warn!(%error, "readiness: the database does not answer");
            (StatusCode::SERVICE_UNAVAILABLE, Json(answer("the database does not answer (see the server log)")))
        }
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(answer(format!("the database did not answer within {} s", READY_WAIT.as_secs()))),
        ),
    }
}
