//! Bearer tokens with two roles. A user token submits, cancels, reads and downloads; a worker
//! token registers, claims, heartbeats, reports and uploads. Neither can do the other's work.
//!
//! Tokens are kept only as SHA-256 digests and compared in constant time, digest against
//! digest, so neither timing nor a log line reveals one. The web page cannot set headers on
//! an EventSource or a download link, so it trades its token once for an HttpOnly,
//! SameSite=Strict cookie holding it (`POST /api/session`); the cookie counts as the header.
//! A token in the query string is refused outright: URLs end up in logs and histories.

use crate::error::ApiError;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The name of the page's session cookie.
pub const COOKIE: &str = "app_token";
/// Shorter tokens are refused at start-up: they can be guessed.
pub const MIN_TOKEN_LEN: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    User,
    Worker,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Worker => "worker",
        }
    }
}

/// Who may call an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The health check and the page's static files (the page asks for a token itself).
    Public,
    Only(Role),
}

/// The configured tokens, as digests. Empty: the server runs without authentication.
#[derive(Clone, Default)]
pub struct Tokens {
    tokens: Vec<([u8; 32], Role)>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} configured, values hidden)", self.tokens.len())
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Tokens {
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Whether any token of `role` is configured.
    pub fn has(&self, role: Role) -> bool {
        self.tokens.iter().any(|(_, known)| *known == role)
    }

    /// Adds a token for `role`; refuses short or blank ones, naming `source` (never the value).
    pub fn add(&mut self, role: Role, token: &str, source: &str) -> anyhow::Result<()> {
        let token = token.trim();
        anyhow::ensure!(
            token.len() >= MIN_TOKEN_LEN,
            "the {} token from {source} is {} characters; use at least {MIN_TOKEN_LEN} (e.g. `openssl rand -hex 32`)",
            role.name(),
            token.len()
        );
        anyhow::ensure!(
            token.chars().all(|c| c.is_ascii_graphic()),
            "the {} token from {source} has spaces or non-ASCII characters; it must fit in an HTTP header",
            role.name()
        );
        self.tokens.push((digest(token), role));
        Ok(())
    }

    /// Adds every token of a file: one per line; blank lines and `#` comments are skipped,
    /// so tokens can be rotated by listing the old and the new one for a while.
    pub fn add_file(&mut self, role: Role, path: &Path) -> anyhow::Result<()> {
        use anyhow::Context;
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the {} token file {}", role.name(), path.display()))?;
        let source = format!("{}", path.display());
        let mut added = 0;
        for line in text.lines().map(str::trim).filter(|line| !line.is_empty() && !line.starts_with('#')) {
            self.add(role, line, &source)?;
            added += 1;
        }
        anyhow::ensure!(added > 0, "the {} token file {source} has no token in it", role.name());
        Ok(())
    }

    /// The role of `presented`, comparing against every token in constant time.
    pub fn role_of(&self, presented: &str) -> Option<Role> {
        let presented = digest(presented);
        let mut found = None;
        for (known, role) in &self.tokens {
            if bool::from(known.ct_eq(&presented)) {
                found = Some(*role);
            }
        }
        found
    }
}

/// Which role an endpoint needs. Only the worker's own endpoints are listed; everything else
/// is a user's, so an endpoint added later is closed to worker tokens until listed here.
pub fn access_for(method: &Method, path: &str) -> Access {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let worker = Access::Only(Role::Worker);
    match (method.as_str(), segments.as_slice()) {
        ("GET" | "HEAD", [""] | ["assets", ..] | ["api", "health"] | ["api", "ready"]) => Access::Public,
        // The page's sign-in checks the token it is given itself.
        ("POST" | "DELETE", ["api", "session"]) => Access::Public,
        ("POST", ["api", "workers"]) => worker,
        ("POST", ["api", "workers", _, "claim" | "heartbeat" | "drain" | "leave" | "finish"]) => worker,
        ("POST", ["api", "jobs", _, "report" | "log" | "metrics"]) => worker,
        ("PUT", ["api", "jobs", _, "attempts", _, "files", ..]) => worker,
        ("POST", ["api", "jobs", _, "attempts", _, "result"]) => worker,
        ("PUT" | "GET", ["api", "jobs", _, "attempts", _, "checkpoint"]) => worker,
        ("GET", ["api", "workers", _, "code", _]) => worker,
        _ => Access::Only(Role::User),
    }
}

/// The token a request carries: the Authorization header, else the page's cookie.
pub fn presented(headers: &HeaderMap) -> Option<&str> {
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        let value = value.to_str().ok()?;
        let (scheme, token) = value.split_once(' ')?;
        return scheme.eq_ignore_ascii_case("bearer").then_some(token.trim());
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
}

/// Query parameters that look like a credential.
fn token_in_query(query: Option<&str>) -> bool {
    query.is_some_and(|query| {
        query.split('&').any(|pair| {
            let name = pair.split('=').next().unwrap_or("").to_ascii_lowercase();
            matches!(name.as_str(), "token" | "access_token" | "auth" | "authorization" | "api_key" | "key")
        })
    })
}

/// Decides a request: `Ok(())` lets it through.
pub fn check(
    tokens: &Tokens,
    method: &Method,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Result<(), ApiError> {
    if tokens.is_empty() {
        return Ok(());
    }
    if token_in_query(query) {
        return Err(ApiError::Unauthorized(
            "tokens are not accepted in the URL (URLs end up in logs); send `Authorization: Bearer <token>`".into(),
        ));
    }
    let Access::Only(needed) = access_for(method, path) else { return Ok(()) };
    let Some(token) = presented(headers) else {
        return Err(ApiError::Unauthorized(format!(
            "this server requires a {} token: send `Authorization: Bearer <token>` (APP_TOKEN for the CLI and workers)",
            needed.name()
        )));
    };
    match tokens.role_of(token) {
        None => Err(ApiError::Unauthorized("the token is not valid for this server".into())),
        Some(role) if role == needed => Ok(()),
        Some(role) => Err(ApiError::Forbidden(format!(
            "a {} token cannot {method} {path}; that needs a {} token",
            role.name(),
            needed.name()
        ))),
    }
}

/// The middleware: every request passes [`check`] before anything else reads it. An answer to
/// a known client (a valid token, or a server without tokens) is marked so, for the connection
/// loop (`serve::Authenticated`).
pub async fn authorize(State(tokens): State<Arc<Tokens>>, request: Request, next: Next) -> Response {
    let uri = request.uri();
    let tokens = &*tokens;
    let known = tokens.is_empty() || matches!(access_for(request.method(), uri.path()), Access::Only(_));
    match check(tokens, request.method(), uri.path(), uri.query(), request.headers()) {
        Ok(()) => {
            let mut response = next.run(request).await;
            if known {
                response.extensions_mut().insert(crate::serve::Authenticated);
            }
            response
        }
        Err(error) => error.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const USER: &str = "user-token-0123456789";
    const WORKER: &str = "worker-token-0123456789";

    fn tokens() -> Tokens {
        let mut tokens = Tokens::default();
        tokens.add(Role::User, USER, "test").unwrap();
        tokens.add(Role::Worker, WORKER, "test").unwrap();
        tokens
    }

    fn bearer(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {token}")).unwrap());
        headers
    }

    fn status(result: Result<(), ApiError>) -> u16 {
        match result {
            Ok(()) => 200,
            Err(error) => error.into_response().status().as_u16(),
        }
    }

    #[test]
    fn each_role_does_its_own_work_only() {
        let tokens = tokens();
        let post = Method::POST;
        let cases = [
            (&post, "/api/sweeps", USER, 200),
            (&post, "/api/sweeps", WORKER, 403),
            (&post, "/api/jobs/7/cancel", WORKER, 403),
            (&post, "/api/workers/3/claim", USER, 403),
            (&post, "/api/workers/3/claim", WORKER, 200),
            (&post, "/api/workers/3/leave", WORKER, 200),
            (&post, "/api/workers/3/leave", USER, 403),
            (&post, "/api/workers", WORKER, 200),
            (&post, "/api/jobs/7/report", WORKER, 200),
            (&post, "/api/jobs/7/log", WORKER, 200),
            (&Method::PUT, "/api/jobs/7/attempts/1/files/a/b.txt", WORKER, 200),
            (&Method::PUT, "/api/jobs/7/attempts/1/files/a/b.txt", USER, 403),
            (&Method::GET, "/api/jobs/7/log", USER, 200),
            (&Method::GET, "/api/jobs/7/log", WORKER, 403),
            (&Method::GET, "/api/jobs/7/results/1/files/x", USER, 200),
            (&post, "/api/sweeps", "not-a-known-token-at-all", 401),
        ];
        for (method, path, token, expected) in cases {
            assert_eq!(status(check(&tokens, method, path, None, &bearer(token))), expected, "{method} {path}");
        }
    }

    #[test]
    fn public_paths_need_nothing_and_the_rest_needs_a_token() {
        let tokens = tokens();
        let none = HeaderMap::new();
        for path in ["/", "/assets/app.js", "/assets/vendor/uPlot.min.css", "/api/health", "/api/ready"] {
            assert_eq!(status(check(&tokens, &Method::GET, path, None, &none)), 200, "{path}");
        }
        assert_eq!(status(check(&tokens, &Method::GET, "/api/jobs", None, &none)), 401);
        assert_eq!(status(check(&tokens, &Method::POST, "/api/health", None, &none)), 401);
        // Without tokens configured, everything passes.
        assert_eq!(status(check(&Tokens::default(), &Method::GET, "/api/jobs", None, &none)), 200);
    }

    #[test]
    fn a_token_in_the_query_string_is_refused_even_when_valid() {
        let tokens = tokens();
        let query = format!("status=queued&token={USER}");
        assert_eq!(status(check(&tokens, &Method::GET, "/api/jobs", Some(&query), &bearer(USER))), 401);
        assert_eq!(status(check(&tokens, &Method::GET, "/api/jobs", Some("access_token=x"), &HeaderMap::new())), 401);
        assert_eq!(status(check(&tokens, &Method::GET, "/api/jobs", Some("sort=id"), &bearer(USER))), 200);
    }

    #[test]
    fn the_page_cookie_counts_as_the_header() {
        let tokens = tokens();
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, HeaderValue::from_str(&format!("theme=dark; {COOKIE}={USER}")).unwrap());
        assert_eq!(status(check(&tokens, &Method::GET, "/api/events", None, &headers)), 200);
        let mut other = HeaderMap::new();
        other.insert(header::COOKIE, HeaderValue::from_static("app_token_old=x; theme=dark"));
        assert_eq!(status(check(&tokens, &Method::GET, "/api/events", None, &other)), 401);
    }

    #[test]
    fn short_tokens_and_empty_files_are_refused_and_debug_hides_values() {
        let mut tokens = Tokens::default();
        let short = tokens.add(Role::User, "abc", "APP_USER_TOKEN").unwrap_err().to_string();
        assert!(short.contains("APP_USER_TOKEN") && !short.contains("abc"), "{short}");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens");
        std::fs::write(&file, "# rotated monthly\n\n").unwrap();
        assert!(tokens.add_file(Role::Worker, &file).unwrap_err().to_string().contains("no token"));
        std::fs::write(&file, format!("# old and new\n{USER}\n{WORKER}\n")).unwrap();
        tokens.add_file(Role::Worker, &file).unwrap();
        assert_eq!((tokens.role_of(USER), tokens.role_of(WORKER)), (Some(Role::Worker), Some(Role::Worker)));
        assert!(!format!("{tokens:?}").contains(USER));
    }
}
