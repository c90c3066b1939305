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
    /// The server cannot do this now (its database is read-only or failing); says why, and the
    /// request can be retried.
    #[error("{0}")]
    Unavailable(String),
    #[error("server is shutting down")]
    ShuttingDown,
    #[error(transparent)]
    Database(crate::db::sql::Error),
    #[error(transparent)]
    Internal(anyhow::Error),
}

pub type ApiResult<T> = Result<T, ApiError>;

/// SQLite's primary result codes that say the disk, not the request, is the problem.
const SQLITE_READONLY: i32 = 8;
const SQLITE_IOERR: i32 = 10;
const SQLITE_FULL: i32 = 13;
const SQLITE_CANTOPEN: i32 = 14;

impl From<sqlx::Error> for ApiError {
    /// A full disk is a 507 and an unwritable or failing database a 503, each saying so; other
    /// database errors are internal (500, logged, not shown).
    fn from(error: sqlx::Error) -> ApiError {
        let mapped = match &error {
            sqlx::Error::Database(database) => match database.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                Some(postgres) => postgres_failure(postgres.code(), &error),
                None => disk_failure(database.code().and_then(|code| code.parse::<i32>().ok()), &error),
            },
            sqlx::Error::PoolTimedOut => Some(ApiError::Unavailable(
                "the database is busy (no connection to it came free in time); retry".into(),
            )),
            sqlx::Error::Io(_) | sqlx::Error::PoolClosed | sqlx::Error::Tls(_) => {
                Some(ApiError::Unavailable(format!("the connection to the database failed: {error}; retry")))
            }
            _ => None,
        };
        mapped.unwrap_or(ApiError::Database(crate::db::sql::Error::Postgres(error)))
    }
}

impl From<crate::db::sql::Error> for ApiError {
    /// Each driver's errors read as [`From<sqlx::Error>`] and [`From<rusqlite::Error>`] say.
    fn from(error: crate::db::sql::Error) -> ApiError {
        use crate::db::sql::Error;
        match error {
            Error::Postgres(error) => ApiError::from(error),
            Error::Sqlite(error) => ApiError::from(error),
            Error::PoolTimedOut => {
                ApiError::Unavailable("the database is busy (no connection to it came free in time); retry".into())
            }
            Error::PoolClosed => ApiError::ShuttingDown,
            error => ApiError::Database(error),
        }
    }
}

/// The error for a PostgreSQL SQLSTATE that says the database server, not the request, is the
/// problem: its disk full, its resources out, it shutting down, read-only (a standby), the
/// connection gone, or the transaction given up in a conflict with another one (a replica's).
fn postgres_failure(sqlstate: &str, error: &dyn std::fmt::Display) -> Option<ApiError> {
    match sqlstate {
        "53100" => Some(ApiError::InsufficientStorage(format!(
            "the database server's disk is full: {error}; free space there and retry"
        ))),
        "40001" | "40P01" => Some(ApiError::Unavailable(format!(
            "the database gave the write up in a conflict with another one ({error}); retry"
        ))),
        "25006" => Some(ApiError::Unavailable(format!(
            "the database is read-only (a standby, or default_transaction_read_only is on): {error}"
        ))),
        code if code.starts_with("53") || code.starts_with("57P") || code.starts_with("08") => {
            Some(ApiError::Unavailable(format!("the database cannot serve this now: {error}; retry")))
        }
        _ => None,
    }
}

impl From<rusqlite::Error> for ApiError {
    /// A full disk is a 507 and an unwritable or failing database a 503, each saying so; other
    /// database errors are internal (500, logged, not shown).
    fn from(error: rusqlite::Error) -> ApiError {
        let code = match &error {
            rusqlite::Error::SqliteFailure(failure, _) => Some(failure.extended_code),
            _ => None,
        };
        disk_failure(code, &error).unwrap_or(ApiError::Database(crate::db::sql::Error::Sqlite(error)))
    }
}

/// The error for SQLite's result `code` when it says the disk, not the request, is the problem.
fn disk_failure(code: Option<i32>, error: &dyn std::fmt::Display) -> Option<ApiError> {
    // Extended codes keep the primary code in their low byte (SQLITE_IOERR_WRITE = 778).
    match code.map(|code| code & 0xff) {
        Some(SQLITE_FULL) => Some(ApiError::InsufficientStorage(format!(
            "the server's disk is full (the queue database could not grow): {error}; free space and retry"
        ))),
        Some(SQLITE_READONLY) => Some(ApiError::Unavailable(format!(
            "the queue database is read-only (check the data directory's permissions and mount): {error}"
        ))),
        Some(SQLITE_IOERR | SQLITE_CANTOPEN) => Some(ApiError::Unavailable(format!(
            "the queue database cannot be written (I/O error on the data directory): {error}; retry"
        ))),
        _ => None,
    }
}

impl From<anyhow::Error> for ApiError {
    /// A database error carried in an `anyhow` keeps its meaning (a full disk stays a 507).
    fn from(error: anyhow::Error) -> ApiError {
        let error = match error.downcast::<crate::db::sql::Error>() {
            Ok(database) => return ApiError::from(database),
            Err(error) => error,
        };
        let error = match error.downcast::<sqlx::Error>() {
            Ok(database) => return ApiError::from(database),
            Err(error) => error,
        };
        match error.downcast::<rusqlite::Error>() {
            Ok(database) => ApiError::from(database),
            Err(error) => ApiError::Internal(error),
        }
    }
}

impl ApiError {
    /// The same outcome for another request that shared a failed transaction with this one:
    /// disk problems keep their message, anything else says the write was not committed.
    pub fn retry_copy(&self) -> ApiError {
        match self {
            ApiError::InsufficientStorage(message) => ApiError::InsufficientStorage(message.clone()),
            ApiError::Unavailable(message) => ApiError::Unavailable(message.clone()),
            ApiError::ShuttingDown => ApiError::ShuttingDown,
            _ => ApiError::Unavailable("the write was not committed (see the server log); retry".into()),
        }
    }

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
            ApiError::ShuttingDown | ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Database(_) | ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        // A full disk is the operator's to fix, so its message is worth showing.
        let shown =
            matches!(self, ApiError::ShuttingDown | ApiError::InsufficientStorage(_) | ApiError::Unavailable(_));
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
