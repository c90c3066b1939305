//! `/api/session`: the web page's sign-in. The page cannot put a header on an EventSource or
//! a download link, so it sends its user token once here and gets it back as an HttpOnly,
//! SameSite=Strict cookie that the browser then sends with every request (see `auth`).

use crate::auth::{self, Role};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};

pub fn router() -> Router<AppState> {
    Router::new().route("/api/session", post(sign_in).delete(sign_out))
}

#[derive(serde::Serialize)]
struct Session {
    /// False when the server runs without tokens (loopback only): nothing to sign in to.
    auth_required: bool,
}

fn cookie(state: &AppState, value: &str, extra: &str) -> String {
    let secure = if state.config.tls.is_some() { "; Secure" } else { "" };
    format!("{}={value}; Path=/; HttpOnly; SameSite=Strict{secure}{extra}", auth::COOKIE)
}

async fn sign_in(State(state): State<AppState>, headers: HeaderMap) -> ApiResult<Response> {
    if state.config.tokens.is_empty() {
        return Ok(Json(Session { auth_required: false }).into_response());
    }
    let token = auth::presented(&headers)
        .ok_or_else(|| ApiError::Unauthorized("send the user token as `Authorization: Bearer <token>`".into()))?;
    match state.config.tokens.role_of(token) {
        Some(Role::User) => {}
        Some(Role::Worker) => return Err(ApiError::Forbidden("a worker token cannot sign in to the page".into())),
        None => return Err(ApiError::Unauthorized("the token is not valid for this server".into())),
    }
    let set = cookie(&state, token, "");
    Ok(([(header::SET_COOKIE, set)], Json(Session { auth_required: true })).into_response())
}

async fn sign_out(State(state): State<AppState>) -> Response {
    (StatusCode::NO_CONTENT, [(header::SET_COOKIE, cookie(&state, "", "; Max-Age=0"))]).into_response()
}
