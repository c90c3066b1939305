//! The typed client of the `app` HTTP API.
//!
//! The worker, the CLI and the server's own integration tests all talk to the server through
//! this one client, so the API is exercised the way it is used. Errors separate what is worth
//! retrying (the server is unreachable or failed: [`ClientError::is_retryable`]) from what
//! the server refused (4xx, with its message). One client may be given several servers,
//! replicas of one queue, and fails over between them (`servers`).
//!
//! This file is the transport (requests, failover, answers and their errors); the endpoints are
//! methods in one module per resource, as the server's `routes/` are: `sweeps`, `jobs`,
//! `workers`, `code`.

mod code;
mod jobs;
mod servers;
mod sweeps;
mod workers;

use reqwest::{Method, RequestBuilder, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use servers::{try_next, Replay, Servers, TryFailure};
use shared::api::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No answer: connection refused, reset, timed out.
    #[error("cannot reach the server at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    /// The server answered 5xx.
    #[error("server error ({status}) at {url}: {message}")]
    Server { url: String, status: u16, message: String },
    /// The server refused the request (4xx); `message` says why.
    #[error("{message}")]
    Rejected { status: u16, message: String },
    /// The server answered something this client does not understand.
    #[error("unexpected answer from {url}: {reason}")]
    Decode { url: String, reason: String },
}

impl ClientError {
    /// Worth trying again later: the server is down, restarting or overloaded.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ClientError::Unreachable { .. } | ClientError::Server { .. })
    }

    /// The HTTP status, when the server answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Server { status, .. } | ClientError::Rejected { status, .. } => Some(*status),
            _ => None,
        }
    }
}

pub type ClientResult<T> = Result<T, ClientError>;

/// Time allowed for an ordinary request; a claim adds its long-poll wait.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// The shortest time a registered worker allows a request (see [`worker_timeout`]).
const WORKER_TIMEOUT_MIN: Duration = Duration::from_secs(5);

/// Time a registered worker allows a heartbeat, a claim (beyond its long-poll wait) and a
/// finish, for a lease of `lease_ms`: a quarter of the lease (at least [`WORKER_TIMEOUT_MIN`],
/// at most [`REQUEST_TIMEOUT`]). A server that hangs (stopped, swapping, its database stalled)
/// must not hold a heartbeat for longer than the leases it renews: at 60 s against a 30 s
/// lease, another replica took the worker's jobs back and ran them a second time while the
/// worker waited; nor a finish or claim for a minute, which stalled a worker for 60 s while
/// the other replica was fine. Timed out, a finish goes on to the next URL at once (it is
/// fenced: a copy the hung server applies later changes nothing), other requests start there
/// next time. What it costs: a finish or claim the hung server did apply hands out jobs this
/// worker never hears of; they go back to the queue once its heartbeats do not hold them.
pub fn worker_timeout(lease_ms: u64) -> Duration {
    Duration::from_millis(lease_ms / 4).clamp(WORKER_TIMEOUT_MIN, REQUEST_TIMEOUT)
}
/// The slowest link a finish's body is given time for (bytes per second).
const SLOWEST_LINK_BYTES_PER_SECOND: u64 = 128 << 10;
/// Time allowed for one file upload or download.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(3600);

/// How to reach a server beyond its URL.
#[derive(Clone, Default)]
pub struct ClientOptions {
    /// Bearer token (the user's for the CLI, the worker's for a worker).
    pub token: Option<String>,
    /// PEM certificates of a private CA to trust, besides the usual roots.
    pub ca_pem: Option<Vec<u8>>,
}

impl ClientOptions {
    /// Options from where people keep them: a token given directly (APP_TOKEN) or in a file
    /// (its first line that is neither blank nor a `#` comment), and a CA certificate file.
    pub fn load(
        token: Option<String>,
        token_file: Option<&std::path::Path>,
        ca_file: Option<&std::path::Path>,
    ) -> Result<ClientOptions, String> {
        let mut options = ClientOptions { token: token.filter(|token| !token.trim().is_empty()), ca_pem: None };
        if let Some(path) = token_file {
            let text = std::fs::read_to_string(path)
                .map_err(|error| format!("reading the token file {}: {error}", path.display()))?;
            let line = text.lines().map(str::trim).find(|line| !line.is_empty() && !line.starts_with('#'));
            options.token =
                Some(line.ok_or_else(|| format!("the token file {} has no token in it", path.display()))?.into());
        }
        if let Some(path) = ca_file {
            let pem = std::fs::read(path)
                .map_err(|error| format!("reading the CA certificate {}: {error}", path.display()))?;
            options.ca_pem = Some(pem);
        }
        Ok(options)
    }
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("token", &self.token.as_ref().map(|_| "(hidden)"))
            .field("ca_pem", &self.ca_pem.as_ref().map(Vec::len))
            .finish()
    }
}

#[derive(Debug, Clone)]
pub struct Client {
    /// The servers, and the one requests start at; shared by clones, so every part of a
    /// worker sticks to the server that answered last.
    servers: Arc<Servers>,
    http: reqwest::Client,
    /// A registered worker's session and server instance, sent with every worker request.
    session: Option<Arc<Session>>,
    /// Sessions of the workers registered through this client (and its clones), by worker:
    /// used for worker requests when no session was set with [`Client::with_session`]. A tool
    /// that speaks for several workers through one client (a load test) relies on it; the
    /// worker daemon sets its session explicitly, per registration.
    registered: Arc<Mutex<HashMap<WorkerId, Arc<Session>>>>,
    /// Time allowed for one request (a long poll adds its wait).
    timeout: Duration,
    /// Time allowed for a heartbeat, a claim or a finish (beyond a long-poll wait):
    /// [`REQUEST_TIMEOUT`], or a registered worker's [`worker_timeout`].
    lease_timeout: Duration,
}

/// `SESSION_HEADER` and `INSTANCE_HEADER` of one registration.
#[derive(Debug)]
struct Session {
    session: reqwest::header::HeaderValue,
    instance: reqwest::header::HeaderValue,
}

impl Client {
    /// A client of the server at `base_url` (e.g. `http://127.0.0.1:8000`), without a token.
    /// Several URLs, comma-separated, are replicas of one queue (see [`Client::with_options`]).
    pub fn new(base_url: &str) -> ClientResult<Client> {
        Client::with_options(base_url, &ClientOptions::default())
    }

    /// A client that sends `options.token` as a bearer token on every request and, for
    /// `https://` servers, also trusts the certificates in `options.ca_pem`.
    ///
    /// `base_url` may list several servers, comma-separated (replicas of one queue): each
    /// request goes to the one that answered last, and on to the next in the order given when
    /// it cannot be reached or answers 5xx (see `servers` for which requests are sent twice).
    /// A worker's session is valid on every replica of its server instance (one database).
    pub fn with_options(base_url: &str, options: &ClientOptions) -> ClientResult<Client> {
        let rejected = |message: String| ClientError::Rejected { status: 0, message };
        let servers = Servers::parse(base_url).map_err(rejected)?;
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(50));
        if let Some(token) = &options.token {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {}", token.trim()))
                .map_err(|_| rejected("the token has characters that cannot go in an HTTP header".into()))?;
            // Kept out of reqwest's debug output.
            value.set_sensitive(true);
            let mut headers = reqwest::header::HeaderMap::new();
            headers.insert(reqwest::header::AUTHORIZATION, value);
            builder = builder.default_headers(headers);
        }
        if let Some(pem) = &options.ca_pem {
            let certificates = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|error| rejected(format!("the CA certificate file is not PEM: {error}")))?;
            if certificates.is_empty() {
                return Err(rejected("the CA certificate file has no certificate in it".into()));
            }
            for certificate in certificates {
                builder = builder.add_root_certificate(certificate);
            }
        }
        let http = builder
            .build()
            .map_err(|error| ClientError::Unreachable { url: servers.urls().join(", "), reason: error.to_string() })?;
        Ok(Client {
            servers: Arc::new(servers),
            http,
            session: None,
            registered: Arc::default(),
            timeout: REQUEST_TIMEOUT,
            lease_timeout: REQUEST_TIMEOUT,
        })
    }

    /// The server requests go to now: the one that answered last (the first, before any).
    pub fn base_url(&self) -> &str {
        self.servers.url(self.servers.current())
    }

    /// Every server this client may use, in the order given.
    pub fn urls(&self) -> &[String] {
        self.servers.urls()
    }

    /// This client speaking as the registered worker `response` describes: every request
    /// carries its session and the server instance it registered with, and a heartbeat, claim or
    /// finish is allowed [`worker_timeout`] of the registration's lease. Clones made before keep their own (an
    /// attempt started under an old registration stays under it).
    pub fn with_session(&self, response: &RegisterResponse) -> ClientResult<Client> {
        Ok(Client {
            session: Some(Arc::new(self.session_of(response)?)),
            lease_timeout: worker_timeout(response.lease_ms),
            ..self.clone()
        })
    }

    fn session_of(&self, response: &RegisterResponse) -> ClientResult<Session> {
        let header = |value: &str| {
            let mut header = reqwest::header::HeaderValue::from_str(value).map_err(|_| ClientError::Decode {
                url: self.base_url().to_string(),
                reason: "the server sent a session that cannot go in a header".into(),
            })?;
            header.set_sensitive(true);
            Ok::<_, ClientError>(header)
        };
        Ok(Session { session: header(&response.session)?, instance: header(&response.instance)? })
    }

    /// A request to `url`; a worker's carries its session.
    fn start(&self, method: Method, url: &str, worker: Option<WorkerId>) -> RequestBuilder {
        let builder = self.http.request(method, url).timeout(self.timeout);
        let Some(worker) = worker else { return builder };
        let remembered = || self.registered.lock().ok()?.get(&worker).cloned();
        match self.session.clone().or_else(remembered) {
            Some(session) => builder
                .header(SESSION_HEADER, session.session.clone())
                .header(INSTANCE_HEADER, session.instance.clone()),
            None => builder,
        }
    }

    /// Sends `method path` (shaped by `shape`: query, body, timeout) to the servers in turn
    /// until one answers with anything but 5xx, and returns that answer with its URL. With
    /// several servers, an error lists every one tried. A request whose body cannot be made
    /// twice (`Replay::Never`: a streamed file) is tried at the current server only; if it
    /// fails there, the caller's retry starts at the next.
    async fn exchange(
        &self,
        method: Method,
        path: &str,
        worker: Option<WorkerId>,
        replay: Replay,
        mut shape: impl FnMut(RequestBuilder) -> RequestBuilder,
    ) -> ClientResult<(String, reqwest::Response)> {
        let mut failures: Vec<(usize, ClientError)> = Vec::new();
        let started_at = self.servers.current();
        for index in self.servers.order() {
            let url = format!("{}{path}", self.servers.url(index));
            let (kind, error) = match shape(self.start(method.clone(), &url, worker)).send().await {
                Ok(response) if !response.status().is_server_error() => {
                    self.servers.answered(index);
                    if let Some((_, first)) = failures.first().filter(|_| index != started_at) {
                        // Requests now start here: said once per move (a 503 of one request
                        // that the next URL took moves nothing when this was already current).
                        tracing::warn!(to = %self.servers.url(index), error = %first, "went on to the next server URL");
                    }
                    return Ok((url, response));
                }
                Ok(response) => {
                    let status = response.status();
                    let text = response.text().await.unwrap_or_default();
                    (TryFailure::ServerError(status.as_u16()), failure(url, status, &text))
                }
                Err(error) => {
                    let kind = if error.is_connect() { TryFailure::NotSent } else { TryFailure::NoAnswer };
                    (kind, ClientError::Unreachable { url, reason: describe(&error) })
                }
            };
            if !try_next(kind, &method, replay) {
                self.servers.failed(index);
                if self.servers.current() != started_at {
                    tracing::warn!(%error, "not sent again now; the next request starts at the next server URL");
                }
                failures.push((index, error));
                break;
            }
            failures.push((index, error));
        }
        Err(self.all_failed(failures))
    }

    /// The error of a request that no server took: the failure as it was when one server was
    /// tried, or one naming each server tried and how it failed. When one answered 5xx, the
    /// error keeps that status (a full disk stays a full disk).
    fn all_failed(&self, mut failures: Vec<(usize, ClientError)>) -> ClientError {
        if failures.len() <= 1 {
            return failures.pop().map(|(_, error)| error).unwrap_or_else(|| ClientError::Unreachable {
                url: self.base_url().to_string(),
                reason: "no server to try".into(),
            });
        }
        let tried = failures.iter().map(|(index, _)| self.servers.url(*index)).collect::<Vec<_>>().join(", ");
        let each = failures
            .iter()
            .map(|(_, error)| match error {
                ClientError::Unreachable { url, reason } => format!("{url}: {reason}"),
                ClientError::Server { url, status, message } => format!("{url}: server error ({status}) {message}"),
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join("; ");
        match failures
            .into_iter()
            .rev()
            .map(|(_, error)| error)
            .find(|error| matches!(error, ClientError::Server { .. }))
        {
            Some(ClientError::Server { status, .. }) => {
                ClientError::Server { url: tried, status, message: format!("no server took the request ({each})") }
            }
            _ => ClientError::Unreachable { url: tried, reason: format!("none of them answered ({each})") },
        }
    }

    /// [`Client::exchange`], then the answer's JSON body as `T`, or the refusal it carries.
    async fn send<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        worker: Option<WorkerId>,
        shape: impl FnMut(RequestBuilder) -> RequestBuilder,
    ) -> ClientResult<T> {
        self.send_replaying(method, path, worker, Replay::ByMethod, shape).await
    }

    /// [`Client::send`] for a request that may go to another server as `replay` says.
    async fn send_replaying<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        worker: Option<WorkerId>,
        replay: Replay,
        shape: impl FnMut(RequestBuilder) -> RequestBuilder,
    ) -> ClientResult<T> {
        let (url, response) = self.exchange(method, path, worker, replay, shape).await?;
        decode(url, response).await
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> ClientResult<T> {
        self.send(Method::GET, path, None, |builder| builder).await
    }

    async fn post<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> ClientResult<T> {
        self.send(Method::POST, path, None, |builder| builder.json(body)).await
    }

    /// A POST of `worker`'s, carrying its session.
    async fn worker_post<B: Serialize, T: DeserializeOwned>(
        &self,
        worker: WorkerId,
        path: &str,
        body: &B,
    ) -> ClientResult<T> {
        self.send(Method::POST, path, Some(worker), |builder| builder.json(body)).await
    }

    /// Sends a GET for a file (streamed, long timeout); the response once the server said yes.
    async fn open_download(
        &self,
        route: &str,
        worker: Option<WorkerId>,
        shape: impl Fn(RequestBuilder) -> RequestBuilder,
    ) -> ClientResult<(String, reqwest::Response)> {
        let (url, response) = self
            .exchange(Method::GET, route, worker, Replay::ByMethod, |builder| shape(builder.timeout(UPLOAD_TIMEOUT)))
            .await?;
        if response.status().is_success() {
            return Ok((url, response));
        }
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        Err(failure(url, status, &text))
    }

    /// Streams `file` as the body of `method route` (with its length when known). A file
    /// streams once: no failover within this call (the caller's retry moves on).
    async fn upload<T: DeserializeOwned>(
        &self,
        method: Method,
        route: &str,
        worker: Option<WorkerId>,
        file: tokio::fs::File,
        shape: impl Fn(RequestBuilder) -> RequestBuilder,
    ) -> ClientResult<T> {
        let length = file.metadata().await.map(|metadata| metadata.len()).ok();
        let mut file = Some(file);
        let (url, response) = self
            .exchange(method, route, worker, Replay::Never, |builder| {
                let mut builder = shape(builder.timeout(UPLOAD_TIMEOUT));
                if let Some(length) = length {
                    builder = builder.header(reqwest::header::CONTENT_LENGTH, length);
                }
                match file.take() {
                    Some(file) => builder.body(file),
                    None => builder,
                }
            })
            .await?;
        decode(url, response).await
    }
}

/// Streams a download's body into `destination`; a broken transfer leaves no file behind
/// (half a file is worse than none: it would pass for the real one).
async fn save(url: String, mut response: reqwest::Response, destination: &std::path::Path) -> ClientResult<u64> {
    use tokio::io::AsyncWriteExt;
    let local = |error: std::io::Error| ClientError::Rejected {
        status: 0,
        message: format!("writing {}: {error}", destination.display()),
    };
    let mut file = tokio::fs::File::create(destination).await.map_err(local)?;
    let mut written = 0;
    let copied: ClientResult<()> = async {
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|error| ClientError::Unreachable { url: url.clone(), reason: describe(&error) })?
        {
            file.write_all(&chunk).await.map_err(local)?;
            written += chunk.len() as u64;
        }
        file.flush().await.map_err(local)
    }
    .await;
    if copied.is_err() {
        drop(file);
        let _ = tokio::fs::remove_file(destination).await;
    }
    copied.map(|()| written)
}

/// An answer's JSON body as `T`, or the refusal it carries.
async fn decode<T: DeserializeOwned>(url: String, response: reqwest::Response) -> ClientResult<T> {
    let status = response.status();
    let bytes = response
        .bytes()
        .await
        .map_err(|error| ClientError::Unreachable { url: url.clone(), reason: describe(&error) })?;
    if status.is_success() {
        return serde_json::from_slice(&bytes).map_err(|error| ClientError::Decode { url, reason: error.to_string() });
    }
    Err(failure(url, status, &String::from_utf8_lossy(&bytes)))
}

/// Percent-encodes each segment of a relative file path, keeping the `/` between them.
fn encode_path(path: &str) -> String {
    path.split('/').map(encode).collect::<Vec<_>>().join("/")
}

/// Percent-encodes a path segment (sweep names are plain, but ids typed by users may not be).
fn encode(segment: &str) -> String {
    let mut encoded = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.') {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// The error for a non-success answer whose body was read as text.
fn failure(url: String, status: StatusCode, text: &str) -> ClientError {
    let message =
        serde_json::from_str::<ErrorBody>(text).map(|body| body.error).unwrap_or_else(|_| text.trim().to_string());
    if status.is_server_error() {
        ClientError::Server { url, status: status.as_u16(), message }
    } else {
        ClientError::Rejected { status: status.as_u16(), message: rejection_message(status, message) }
    }
}

fn rejection_message(status: StatusCode, message: String) -> String {
    if message.is_empty() {
        format!("request refused ({status})")
    } else if status == StatusCode::UNAUTHORIZED {
        format!("{message} (set APP_TOKEN or --token-file)")
    } else {
        message
    }
}

/// reqwest's Display hides the cause ("error sending request"); the cause is what people need.
fn describe(error: &reqwest::Error) -> String {
    let mut text = if error.is_timeout() { "timed out".to_string() } else { String::new() };
    let mut source: Option<&dyn std::error::Error> = Some(error);
    let mut last = String::new();
    while let Some(cause) = source {
        last = cause.to_string();
        source = cause.source();
    }
    if text.is_empty() {
        text = last;
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_waits_a_quarter_of_its_lease_for_an_answer_within_bounds() {
        assert_eq!(worker_timeout(30_000), Duration::from_millis(7_500));
        assert_eq!(worker_timeout(3_000), WORKER_TIMEOUT_MIN);
        assert_eq!(worker_timeout(3_600_000), REQUEST_TIMEOUT);
        assert!(worker_timeout(30_000) < Duration::from_secs(15), "a heartbeat must time out well within the lease");
    }
}
