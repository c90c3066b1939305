//! Bearer tokens with two roles. A user token submits, cancels, reads and downloads; a worker
//! token registers, claims, heartbeats, reports and uploads. Neither can do the other's work.
//!
//! Tokens are kept only as SHA-256 digests and compared in constant time, digest against
//! digest, so neither timing nor a log line reveals one. The web page cannot set headers on
//! an EventSource or a download link, so it trades its token once for an HttpOnly,
//! SameSite=Strict cookie holding it (`POST /api/session`); the cookie counts as the header.
//! A token in the query string is refused outright: URLs end up in logs and histories.
//!
//! A user token names its user (`users`: `NAME:TOKEN`, `admin:NAME:TOKEN`, or a bare `TOKEN`
//! for the user `default`); the middleware hands the [`Caller`] to the handlers, and the queue
//! service decides with it who may change a sweep.

use crate::error::ApiError;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::Arc;
use subtle::ConstantTimeEq;

mod users;
pub use users::Caller;

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

/// What a configured token stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    User(Caller),
    Worker,
}

impl Holder {
    fn role(&self) -> Role {
        match self {
            Holder::User(_) => Role::User,
            Holder::Worker => Role::Worker,
        }
    }
}

/// One configured token: its digest, whom it stands for, and where it was given (a file's
/// line, a variable), for start-up errors.
#[derive(Clone)]
struct Known {
    digest: [u8; 32],
    holder: Holder,
    source: String,
}

/// The configured tokens, as digests. Empty: the server runs without authentication, and
/// every request is the user `default` ([`Caller::open`]).
#[derive(Clone, Default)]
pub struct Tokens {
    tokens: Vec<Known>,
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
        self.tokens.iter().any(|known| known.holder.role() == role)
    }

    /// Adds a token for `role` (a user token is the user `default`'s); refuses short or blank
    /// ones, naming `source` (never the value).
    pub fn add(&mut self, role: Role, token: &str, source: &str) -> anyhow::Result<()> {
        let holder = match role {
            Role::User => Holder::User(Caller { name: shared::names::DEFAULT_USER.into(), admin: false }),
            Role::Worker => Holder::Worker,
        };
        self.insert(holder, token, source)
    }

    /// Adds the user tokens of `APP_USER_TOKEN`'s form: comma-separated `TOKEN`, `NAME:TOKEN`
    /// or `admin:NAME:TOKEN` entries (see `users`).
    pub fn add_users(&mut self, list: &str, source: &str) -> anyhow::Result<()> {
        let mut added = 0;
        for (position, entry) in users::list_entries(list) {
            let source = format!("{source} (entry {position})");
            self.add_user_entry(entry, &source)?;
            added += 1;
        }
        anyhow::ensure!(added > 0, "{source} has no token in it");
        Ok(())
    }

    fn add_user_entry(&mut self, entry: &str, source: &str) -> anyhow::Result<()> {
        let user = users::parse_entry(entry).map_err(|why| anyhow::anyhow!("the user token at {source} {why}"))?;
        self.insert(Holder::User(Caller { name: user.name, admin: user.admin }), user.token, source)
    }

    fn insert(&mut self, holder: Holder, token: &str, source: &str) -> anyhow::Result<()> {
        let role = holder.role();
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
        let digest = digest(token);
        // Start-up only: comparing digests here reveals nothing to a client.
        if let Some(known) = self.tokens.iter_mut().find(|known| known.digest == digest) {
            return match (&mut known.holder, holder) {
                (Holder::Worker, Holder::Worker) => Ok(()),
                (Holder::User(user), Holder::User(again)) if user.name == again.name => {
                    user.admin |= again.admin;
                    Ok(())
                }
                (Holder::User(user), Holder::User(again)) => Err(anyhow::anyhow!(
                    "the user token from {source} is also {}'s (from {}): one token names one user, so {} needs a token of its own",
                    user.name,
                    known.source,
                    again.name
                )),
                _ => Err(anyhow::anyhow!(
                    "the {} token from {source} is also a {} token (from {}): give each role its own token",
                    role.name(),
                    known.holder.role().name(),
                    known.source
                )),
            };
        }
        self.tokens.push(Known { digest, holder, source: source.to_string() });
        Ok(())
    }

    /// Adds every token of a file: one per line; blank lines and `#` comments are skipped,
    /// so tokens can be rotated by listing the old and the new one for a while. A user token
    /// file's lines may name their user (`NAME:TOKEN`, `admin:NAME:TOKEN`; see `users`).
    pub fn add_file(&mut self, role: Role, path: &Path) -> anyhow::Result<()> {
        use anyhow::Context;
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the {} token file {}", role.name(), path.display()))?;
        let mut added = 0;
        for (line, entry) in users::file_entries(&text) {
            let source = format!("{} line {line}", path.display());
            match role {
                Role::User => self.add_user_entry(entry, &source)?,
                Role::Worker => self.insert(Holder::Worker, entry, &source)?,
            }
            added += 1;
        }
        anyhow::ensure!(added > 0, "the {} token file {} has no token in it", role.name(), path.display());
        Ok(())
    }

    /// Makes the named users admins (the config's `admins` list); each must hold a user token.
    pub fn make_admins(&mut self, names: &[String]) -> anyhow::Result<()> {
        for name in names {
            shared::names::check_user_name(name).map_err(|why| anyhow::anyhow!("`admins` lists a bad name: {why}"))?;
            let mut found = false;
            for known in &mut self.tokens {
                if let Holder::User(user) = &mut known.holder {
                    if user.name == *name {
                        user.admin = true;
                        found = true;
                    }
                }
            }
            anyhow::ensure!(found, "`admins` lists `{name}`, but no user token names that user");
        }
        Ok(())
    }

    /// The names user tokens carry, each once, sorted; `default` alone without tokens.
    pub fn user_names(&self) -> Vec<String> {
        if self.is_empty() {
            return vec![shared::names::DEFAULT_USER.to_string()];
        }
        let mut names: Vec<String> = self
            .tokens
            .iter()
            .filter_map(|known| match &known.holder {
                Holder::User(user) => Some(user.name.clone()),
                Holder::Worker => None,
            })
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Whom `presented` stands for, comparing against every token in constant time.
    pub fn holder_of(&self, presented: &str) -> Option<Holder> {
        let presented = digest(presented);
        let mut found = None;
        for known in &self.tokens {
            if bool::from(known.digest.ct_eq(&presented)) {
                found = Some(&known.holder);
            }
        }
        found.cloned()
    }

    /// The role of `presented`, comparing against every token in constant time.
    pub fn role_of(&self, presented: &str) -> Option<Role> {
        self.holder_of(presented).map(|holder| holder.role())
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

/// Decides a request: `Ok` lets it through, with the user it comes from when it is a user's
/// (every request is [`Caller::open`]'s on a server without tokens).
pub fn check(
    tokens: &Tokens,
    method: &Method,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Result<Option<Caller>, ApiError> {
    if tokens.is_empty() {
        return Ok(Some(Caller::open()));
    }
    if token_in_query(query) {
        return Err(ApiError::Unauthorized(
            "tokens are not accepted in the URL (URLs end up in logs); send `Authorization: Bearer <token>`".into(),
        ));
    }
    let Access::Only(needed) = access_for(method, path) else { return Ok(None) };
    let Some(token) = presented(headers) else {
        return Err(ApiError::Unauthorized(format!(
            "this server requires a {} token: send `Authorization: Bearer <token>` (APP_TOKEN for the CLI and workers)",
            needed.name()
        )));
    };
    match tokens.holder_of(token) {
        None => Err(ApiError::Unauthorized("the token is not valid for this server".into())),
        Some(Holder::User(caller)) if needed == Role::User => Ok(Some(caller)),
        Some(Holder::Worker) if needed == Role::Worker => Ok(None),
        Some(holder) => Err(ApiError::Forbidden(format!(
            "a {} token cannot {method} {path}; that needs a {} token",
            holder.role().name(),
            needed.name()
        ))),
    }
}

/// The middleware: every request passes [`check`] before anything else reads it, and a user's
/// carries its [`Caller`] on (handlers take it as an extractor). An answer to a known client (a
/// valid token, or a server without tokens) is marked so, for the connection loop
/// (`serve::Authenticated`).
pub async fn authorize(State(tokens): State<Arc<Tokens>>, mut request: Request, next: Next) -> Response {
    let uri = request.uri();
    let tokens = &*tokens;
    let known = tokens.is_empty() || matches!(access_for(request.method(), uri.path()), Access::Only(_));
    match check(tokens, request.method(), uri.path(), uri.query(), request.headers()) {
        Ok(caller) => {
            if let Some(caller) = caller {
                request.extensions_mut().insert(caller);
            }
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

    fn status(result: Result<Option<Caller>, ApiError>) -> u16 {
        match result {
            Ok(_) => 200,
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

    /// A user token file in a fresh directory, and the tokens it gives (or the error).
    fn user_file(text: &str) -> (tempfile::TempDir, anyhow::Result<Tokens>) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("users");
        std::fs::write(&file, text).unwrap();
        let mut tokens = Tokens::default();
        let result = tokens.add_file(Role::User, &file).map(|()| tokens);
        (dir, result)
    }

    fn user(name: &str, admin: bool) -> Option<Holder> {
        Some(Holder::User(Caller { name: name.into(), admin }))
    }

    #[test]
    fn a_user_token_file_names_its_users_and_a_plain_line_stays_default() {
        let text = format!("# the lab\n{USER}\nuser-a:aaaaaaaaaaaaaaaaaaaa\n\nadmin:lead:llllllllllllllllllll\n");
        let (_dir, tokens) = user_file(&text);
        let tokens = tokens.unwrap();
        assert_eq!(tokens.holder_of(USER), user("default", false));
        assert_eq!(tokens.holder_of("aaaaaaaaaaaaaaaaaaaa"), user("user-a", false));
        assert_eq!(tokens.holder_of("llllllllllllllllllll"), user("lead", true));
        assert_eq!(tokens.user_names(), ["default", "lead", "user-a"]);
        // The same token twice for one user (a rotation's overlap) is fine; an admin line wins.
        let (_dir, again) = user_file("user-a:aaaaaaaaaaaaaaaaaaaa\nadmin:user-a:aaaaaaaaaaaaaaaaaaaa\n");
        assert_eq!(again.unwrap().holder_of("aaaaaaaaaaaaaaaaaaaa"), user("user-a", true));
        // Worker tokens keep their file form, and the open mode is the user `default`, an admin.
        assert_eq!(Tokens::default().user_names(), ["default"]);
        let none = HeaderMap::new();
        let open = check(&Tokens::default(), &Method::POST, "/api/sweeps", None, &none).unwrap();
        assert_eq!(open, Some(Caller { name: "default".into(), admin: true }));
        let named = check(&tokens, &Method::POST, "/api/sweeps", None, &bearer("aaaaaaaaaaaaaaaaaaaa")).unwrap();
        assert_eq!(named.unwrap().name, "user-a");
        assert_eq!(check(&tokens, &Method::GET, "/api/health", None, &none).unwrap(), None);
    }

    #[test]
    fn bad_user_token_files_are_refused_by_line_without_the_token() {
        let secret = "s3cret-value-0123456789";
        let cases = [
            (format!("# ok\nuser-a:aaaaaaaaaaaaaaaaaaaa\nuser-a:x:{secret}\n"), "line 3 is not `TOKEN`, `NAME:TOKEN`"),
            (format!("User.A:{secret}\n"), "line 1 has a bad name"),
            (format!("{}:{secret}\n", "n".repeat(33)), "line 1 has a bad name"),
            (format!("\n\nuser-a:\n{secret}\n"), "line 3 has no token"),
            (format!("admin:boss:{secret}\nuser-b:{secret}\n"), "line 2 is also boss's (from"),
            ("user-a:short\n".to_string(), "line 1 is 5 characters"),
            ("# nobody yet\n".to_string(), "has no token"),
        ];
        for (text, says) in cases {
            let (dir, result) = user_file(&text);
            let error = format!("{:#}", result.unwrap_err());
            assert!(error.contains(says), "{text:?}: {error}");
            assert!(error.contains(&dir.path().join("users").display().to_string()), "the file is named: {error}");
            assert!(!error.contains(secret) && !error.contains("User.A"), "the error shows the token: {error}");
        }
    }

    #[test]
    fn a_token_for_both_roles_is_refused_whichever_comes_first() {
        let (_dir, tokens) = user_file(&format!("user-a:{WORKER}\n"));
        let mut tokens = tokens.unwrap();
        let error = tokens.add(Role::Worker, WORKER, "APP_WORKER_TOKEN").unwrap_err().to_string();
        assert!(
            error.contains("is also a user token") && error.contains("line 1") && !error.contains(WORKER),
            "{error}"
        );
        let mut tokens = Tokens::default();
        tokens.add(Role::Worker, WORKER, "APP_WORKER_TOKEN").unwrap();
        let error = tokens.add_users(&format!("user-a:{USER},user-b:{WORKER}"), "APP_USER_TOKEN").unwrap_err();
        let error = error.to_string();
        assert!(error.contains("APP_USER_TOKEN (entry 2)") && error.contains("also a worker token"), "{error}");
        assert!(!error.contains(WORKER), "{error}");
    }

    #[test]
    fn admins_must_be_users_with_tokens() {
        let mut tokens = Tokens::default();
        tokens.add_users(&format!("user-a:{USER}"), "APP_USER_TOKEN").unwrap();
        assert!(tokens.make_admins(&["nobody".into()]).unwrap_err().to_string().contains("`nobody`"));
        assert!(tokens.make_admins(&["Not A Name".into()]).unwrap_err().to_string().contains("bad name"));
        tokens.make_admins(&["user-a".into()]).unwrap();
        assert_eq!(tokens.holder_of(USER), user("user-a", true));
    }
}
