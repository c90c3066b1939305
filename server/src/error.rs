//! One error type whose variants are the HTTP outcomes. Internal errors are logged in full
//! and answered with a generic message: details of a 5xx never leave the server.

use axum::extract::rejection::{BytesRejection, JsonRejection, PathRejection, QueryRejection, StringRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use shared::api::ErrorBody;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    /// No token, or one the server does not know: answered with `WWW-Authenticate: Bearer`.
    #[error("{0}")]
    Unauthorized(String),
    /// A known token whose role may not do this.
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// The disk ran out of space (or quota) while storing something; says what. The server
    /// keeps serving and the request can be retried once space is freed.
    #[error("{0}")]
    InsufficientStorage(String),
    #[error("server is shutting down")]
    ShuttingDown,
    #[error(transparent)]
    Sqlx(#[from] sqlx::Error),
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::InsufficientStorage(_) => StatusCode::INSUFFICIENT_STORAGE,
            ApiError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Sqlx(_) | ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        // A full disk is the operator's to fix, so its message is worth showing.
        let shown = matches!(self, ApiError::ShuttingDown | ApiError::InsufficientStorage(_));
        let message = if status.is_server_error() && !shown {
            tracing::error!(error = ?self, "request failed");
            "internal server error (see the server log)".to_string()
        } else {
            self.to_string()
        };
        let mut response = (status, Json(ErrorBody { error: message })).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(axum::http::header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// Turns a body or query rejection into our JSON error shape with the same status.
fn rejection(status: StatusCode, text: String) -> ApiError {
    match status {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge(format!("request body too large: {text}")),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::UnsupportedMediaType(text),
        status if status.is_server_error() => ApiError::Internal(anyhow::anyhow!("extracting the request: {text}")),
        _ => ApiError::BadRequest(text),
    }
}

impl From<JsonRejection> for ApiError {
    fn from(error: JsonRejection) -> Self {
        rejection(error.status(), error.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(error: QueryRejection) -> Self {
        rejection(error.status(), error.body_text())
    }
}

impl From<BytesRejection> for ApiError {
    fn from(error: BytesRejection) -> Self {
        rejection(error.status(), error.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(error: PathRejection) -> Self {
        rejection(error.status(), error.body_text())
    }
}

impl From<StringRejection> for ApiError {
    fn from(error: StringRejection) -> Self {
        rejection(error.status(), error.body_text())
    }
}

/// `Json` whose rejections answer in our error shape.
#[derive(axum::extract::FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct ApiJson<T>(pub T);

/// `Path` whose rejections (a bad id, a path that is not UTF-8) answer in our error shape.
#[derive(axum::extract::FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);

/// `Query` whose rejections answer in our error shape.
#[derive(axum::extract::FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);
