//! `GET /api/whoami`: the user a request's token names; `GET /api/usage`: GPU time per user over
//! the last 24 hours and 7 days (also in `/metrics`, `prometheus`).

use crate::auth::Caller;
use crate::db::{self, now_ms};
use crate::error::ApiResult;
use crate::state::AppState;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use shared::api::{Usage, UserUsage, Whoami};

pub fn router() -> Router<AppState> {
    Router::new().route("/api/whoami", get(whoami)).route("/api/usage", get(usage))
}

async fn whoami(State(state): State<AppState>, caller: Caller) -> Json<Whoami> {
    Json(Whoami { name: caller.name, admin: caller.admin, auth_required: !state.config.tokens.is_empty() })
}

async fn usage(State(state): State<AppState>) -> ApiResult<Json<Usage>> {
    Ok(Json(usage_now(&state).await?))
}

/// Every user a token names (with nothing, when they held no GPU), and every other owner whose
/// jobs held GPUs in the last 7 days, by name.
pub async fn usage_now(state: &AppState) -> ApiResult<Usage> {
    let at = now_ms();
    let held = db::usage::gpu_seconds_by_owner(state.queue.reader(), at, (24, 7 * 24)).await?;
    let mut users: Vec<UserUsage> = state
        .config
        .tokens
        .user_names()
        .into_iter()
        .filter(|name| !held.iter().any(|(owner, _, _)| owner == name))
        .map(|user| UserUsage { user, ..UserUsage::default() })
        .collect();
    users.extend(held.into_iter().map(|(user, day, week)| UserUsage {
        user,
        gpu_hours_24h: day / 3600.0,
        gpu_hours_7d: week / 3600.0,
    }));
    users.sort_by(|a, b| a.user.cmp(&b.user));
    Ok(Usage { at, users })
}
