//! The typed client of the `app` HTTP API.
//!
//! The worker, the CLI and the server's own integration tests all talk to the server through
//! this one client, so the API is exercised the way it is used. Errors separate what is worth
//! retrying (the server is unreachable or failed: [`ClientError::is_retryable`]) from what
//! the server refused (4xx, with its message).

use reqwest::{Method, RequestBuilder, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
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
    base: String,
    http: reqwest::Client,
    /// A registered worker's session and server instance, sent with every worker request.
    session: Option<Arc<Session>>,
    /// Sessions of the workers registered through this client (and its clones), by worker:
    /// used for worker requests when no session was set with [`Client::with_session`]. A tool
    /// that speaks for several workers through one client (a load test) relies on it; the
    /// worker daemon sets its session explicitly, per registration.
    registered: Arc<Mutex<HashMap<WorkerId, Arc<Session>>>>,
}

/// `SESSION_HEADER` and `INSTANCE_HEADER` of one registration.
#[derive(Debug)]
struct Session {
    session: reqwest::header::HeaderValue,
    instance: reqwest::header::HeaderValue,
}

impl Client {
    /// A client of the server at `base_url` (e.g. `http://127.0.0.1:8000`), without a token.
    pub fn new(base_url: &str) -> ClientResult<Client> {
        Client::with_options(base_url, &ClientOptions::default())
    }

    /// A client that sends `options.token` as a bearer token on every request and, for
    /// `https://` servers, also trusts the certificates in `options.ca_pem`.
    pub fn with_options(base_url: &str, options: &ClientOptions) -> ClientResult<Client> {
        let base = base_url.trim_end_matches('/').to_string();
        let rejected = |message: String| ClientError::Rejected { status: 0, message };
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(rejected(format!("server URL `{base_url}` must start with http:// or https://")));
        }
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
            .map_err(|error| ClientError::Unreachable { url: base.clone(), reason: error.to_string() })?;
        Ok(Client { base, http, session: None, registered: Arc::default() })
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// This client speaking as the registered worker `response` describes: every request
    /// carries its session and the server instance it registered with. Clones made before
    /// keep their own (an attempt started under an old registration stays under it).
    pub fn with_session(&self, response: &RegisterResponse) -> ClientResult<Client> {
        Ok(Client { session: Some(Arc::new(self.session_of(response)?)), ..self.clone() })
    }

    fn session_of(&self, response: &RegisterResponse) -> ClientResult<Session> {
        let header = |value: &str| {
            let mut header = reqwest::header::HeaderValue::from_str(value).map_err(|_| ClientError::Decode {
                url: self.base.clone(),
                reason: "the server sent a session that cannot go in a header".into(),
            })?;
            header.set_sensitive(true);
            Ok::<_, ClientError>(header)
        };
        Ok(Session { session: header(&response.session)?, instance: header(&response.instance)? })
    }

    fn request(&self, method: Method, path: &str) -> (String, RequestBuilder) {
        let url = format!("{}{}", self.base, path);
        let builder = self.http.request(method, &url).timeout(REQUEST_TIMEOUT);
        (url, builder)
    }

    /// A request of `worker`'s, carrying its session.
    fn worker_request(&self, worker: WorkerId, method: Method, path: &str) -> (String, RequestBuilder) {
        let (url, builder) = self.request(method, path);
        let remembered = || self.registered.lock().ok()?.get(&worker).cloned();
        match self.session.clone().or_else(remembered) {
            Some(session) => (
                url,
                builder
                    .header(SESSION_HEADER, session.session.clone())
                    .header(INSTANCE_HEADER, session.instance.clone()),
            ),
            None => (url, builder),
        }
    }

    async fn worker_post<B: Serialize, T: DeserializeOwned>(
        &self,
        worker: WorkerId,
        path: &str,
        body: &B,
    ) -> ClientResult<T> {
        let (url, builder) = self.worker_request(worker, Method::POST, path);
        Self::send(url, builder.json(body)).await
    }

    async fn send<T: DeserializeOwned>(url: String, builder: RequestBuilder) -> ClientResult<T> {
        let response = builder
            .send()
            .await
            .map_err(|error| ClientError::Unreachable { url: url.clone(), reason: describe(&error) })?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|error| ClientError::Unreachable { url: url.clone(), reason: describe(&error) })?;
        if status.is_success() {
            return serde_json::from_slice(&bytes)
                .map_err(|error| ClientError::Decode { url, reason: error.to_string() });
        }
        let message = serde_json::from_slice::<ErrorBody>(&bytes)
            .map(|body| body.error)
            .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).trim().to_string());
        if status.is_server_error() {
            Err(ClientError::Server { url, status: status.as_u16(), message })
        } else {
            Err(ClientError::Rejected { status: status.as_u16(), message: rejection_message(status, message) })
        }
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> ClientResult<T> {
        let (url, builder) = self.request(Method::GET, path);
        Self::send(url, builder).await
    }

    async fn post<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> ClientResult<T> {
        let (url, builder) = self.request(Method::POST, path);
        Self::send(url, builder.json(body)).await
    }

    pub async fn health(&self) -> ClientResult<Health> {
        self.get("/api/health").await
    }

    /// Submits a sweep file (or, with `query.dry_run`, only validates and counts it).
    pub async fn submit(&self, yaml: &str, query: &SubmitQuery) -> ClientResult<SubmitResponse> {
        let (url, builder) = self.request(Method::POST, "/api/sweeps");
        let builder =
            builder.query(query).header(reqwest::header::CONTENT_TYPE, "application/yaml").body(yaml.to_string());
        Self::send(url, builder).await
    }

    pub async fn sweeps(&self) -> ClientResult<Vec<SweepInfo>> {
        self.get("/api/sweeps").await
    }

    /// A sweep by id or name.
    pub async fn sweep(&self, key: &str) -> ClientResult<SweepDetail> {
        self.get(&format!("/api/sweeps/{}", encode(key))).await
    }

    pub async fn cancel_sweep(&self, key: &str) -> ClientResult<CancelResponse> {
        self.post(&format!("/api/sweeps/{}/cancel", encode(key)), &()).await
    }

    pub async fn jobs(&self, query: &JobQuery) -> ClientResult<JobPage> {
        let (url, builder) = self.request(Method::GET, "/api/jobs");
        Self::send(url, builder.query(query)).await
    }

    pub async fn job(&self, id: JobId) -> ClientResult<Job> {
        self.get(&format!("/api/jobs/{id}")).await
    }

    pub async fn job_events(&self, id: JobId) -> ClientResult<Vec<JobEvent>> {
        self.get(&format!("/api/jobs/{id}/events")).await
    }

    pub async fn job_attempts(&self, id: JobId) -> ClientResult<Vec<AttemptInfo>> {
        self.get(&format!("/api/jobs/{id}/attempts")).await
    }

    pub async fn cancel_jobs(&self, ids: &[JobId]) -> ClientResult<BulkCancelResponse> {
        self.post("/api/jobs/cancel", &BulkCancelRequest { ids: ids.to_vec() }).await
    }

    pub async fn overview(&self) -> ClientResult<Overview> {
        self.get("/api/overview").await
    }

    pub async fn cancel_job(&self, id: JobId) -> ClientResult<CancelResponse> {
        self.post(&format!("/api/jobs/{id}/cancel"), &()).await
    }

    pub async fn retry_job(&self, id: JobId) -> ClientResult<Job> {
        self.post(&format!("/api/jobs/{id}/retry"), &()).await
    }

    pub async fn set_priority(&self, id: JobId, priority: i64) -> ClientResult<Job> {
        self.post(&format!("/api/jobs/{id}/priority"), &PriorityRequest { priority }).await
    }

    /// Registers a worker. Its session is remembered by this client (see `registered`).
    pub async fn register(&self, request: &RegisterRequest) -> ClientResult<RegisterResponse> {
        let response: RegisterResponse = self.post("/api/workers", request).await?;
        self.remember_session(&response)?;
        Ok(response)
    }

    /// Speaks for the worker of `response` from now on (when no session was set explicitly):
    /// for a registration made through another client, e.g. before a server restart.
    pub fn remember_session(&self, response: &RegisterResponse) -> ClientResult<()> {
        let session = self.session_of(response)?;
        if let Ok(mut registered) = self.registered.lock() {
            registered.insert(response.worker_id, Arc::new(session));
        }
        Ok(())
    }

    pub async fn workers(&self) -> ClientResult<Vec<WorkerInfo>> {
        self.get("/api/workers").await
    }

    /// Asks for work; the server answers at once when something fits, otherwise waits up to
    /// `request.wait_ms` for a job to arrive.
    pub async fn claim(&self, worker: WorkerId, request: &ClaimRequest) -> ClientResult<ClaimResponse> {
        let (url, builder) = self.worker_request(worker, Method::POST, &format!("/api/workers/{worker}/claim"));
        let builder = builder.timeout(REQUEST_TIMEOUT + Duration::from_millis(request.wait_ms)).json(request);
        Self::send(url, builder).await
    }

    pub async fn heartbeat(&self, worker: WorkerId, request: &HeartbeatRequest) -> ClientResult<HeartbeatResponse> {
        self.worker_post(worker, &format!("/api/workers/{worker}/heartbeat"), request).await
    }

    /// Ends an attempt in one request (log tail, metrics, result, outcome) and, when the
    /// request asks, claims the next jobs. A 409 means the attempt is stale: nothing was applied.
    pub async fn finish(&self, worker: WorkerId, request: &FinishRequest) -> ClientResult<FinishResponse> {
        let wait = request.claim.as_ref().map_or(0, |claim| claim.wait_ms);
        let (url, builder) = self.worker_request(worker, Method::POST, &format!("/api/workers/{worker}/finish"));
        let builder = builder.timeout(REQUEST_TIMEOUT + Duration::from_millis(wait)).json(request);
        Self::send(url, builder).await
    }

    /// Tells the server this worker takes no more jobs: its parked claim returns at once.
    pub async fn drain(&self, worker: WorkerId) -> ClientResult<serde_json::Value> {
        self.worker_post(worker, &format!("/api/workers/{worker}/drain"), &serde_json::json!({})).await
    }

    /// Reports how an attempt ended. A 409 means the attempt is stale (the lease was lost and
    /// the job requeued): the report changed nothing and should be dropped.
    pub async fn report(&self, job: JobId, request: &ReportRequest) -> ClientResult<ReportResponse> {
        self.worker_post(request.worker_id, &format!("/api/jobs/{job}/report"), request).await
    }
}

impl Client {
    /// Appends log bytes of an attempt at `append.offset` (a retried append is recognised).
    pub async fn append_log(&self, job: JobId, append: &LogAppend, bytes: Vec<u8>) -> ClientResult<LogAck> {
        let (url, builder) = self.worker_request(append.worker_id, Method::POST, &format!("/api/jobs/{job}/log"));
        let builder =
            builder.query(append).header(reqwest::header::CONTENT_TYPE, "application/octet-stream").body(bytes);
        Self::send(url, builder).await
    }

    /// Reads an attempt's log from an offset, waiting up to `query.wait_ms` for new bytes.
    pub async fn log(&self, job: JobId, query: &LogQuery) -> ClientResult<LogChunk> {
        let (url, builder) = self.request(Method::GET, &format!("/api/jobs/{job}/log"));
        let builder = builder.timeout(REQUEST_TIMEOUT + Duration::from_millis(query.wait_ms)).query(query);
        Self::send(url, builder).await
    }

    pub async fn send_metrics(&self, job: JobId, batch: &MetricsBatch) -> ClientResult<MetricsAck> {
        self.worker_post(batch.worker_id, &format!("/api/jobs/{job}/metrics"), batch).await
    }

    pub async fn metrics(&self, job: JobId) -> ClientResult<Vec<MetricSeries>> {
        self.get(&format!("/api/jobs/{job}/metrics")).await
    }

    /// Streams one output file of an attempt to the server, which hashes it as it arrives.
    pub async fn upload_file(
        &self,
        job: JobId,
        attempt: u32,
        path: &str,
        worker_id: WorkerId,
        file: tokio::fs::File,
    ) -> ClientResult<ManifestEntry> {
        let route = format!("/api/jobs/{job}/attempts/{attempt}/files/{}", encode_path(path));
        let (url, builder) = self.worker_request(worker_id, Method::PUT, &route);
        let builder = builder.timeout(UPLOAD_TIMEOUT).query(&FileUploadQuery { worker_id }).body(file);
        Self::send(url, builder).await
    }

    /// Seals the uploaded files of an attempt as its immutable result version.
    pub async fn seal_result(&self, job: JobId, attempt: u32, upload: &ResultUpload) -> ClientResult<ResultVersion> {
        self.worker_post(upload.worker_id, &format!("/api/jobs/{job}/attempts/{attempt}/result"), upload).await
    }

    /// Every stored result version of a job, oldest first.
    pub async fn results(&self, job: JobId) -> ClientResult<Vec<ResultVersion>> {
        self.get(&format!("/api/jobs/{job}/results")).await
    }

    /// Downloads one result file to `destination`, streaming.
    pub async fn download_file(
        &self,
        job: JobId,
        attempt: u32,
        path: &str,
        destination: &std::path::Path,
    ) -> ClientResult<u64> {
        use tokio::io::AsyncWriteExt;
        let route = format!("/api/jobs/{job}/results/{attempt}/files/{}", encode_path(path));
        let (url, builder) = self.request(Method::GET, &route);
        let mut response = builder
            .timeout(UPLOAD_TIMEOUT)
            .send()
            .await
            .map_err(|error| ClientError::Unreachable { url: url.clone(), reason: describe(&error) })?;
        if !response.status().is_success() {
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            return Err(failure(url, status, &text));
        }
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
            // Half a file is worse than none: it would pass for the real one.
            drop(file);
            let _ = tokio::fs::remove_file(destination).await;
        }
        copied.map(|()| written)
    }

    /// A sweep's leaderboard: parameters and metrics of each run, best first.
    pub async fn summary(&self, sweep: &str, top: Option<u32>) -> ClientResult<SweepSummary> {
        let (url, builder) = self.request(Method::GET, &format!("/api/sweeps/{}/summary", encode(sweep)));
        Self::send(url, builder.query(&SummaryQuery { top, format: None })).await
    }

    /// The same leaderboard as CSV text.
    pub async fn summary_csv(&self, sweep: &str, top: Option<u32>) -> ClientResult<String> {
        let (url, builder) = self.request(Method::GET, &format!("/api/sweeps/{}/summary", encode(sweep)));
        let query = SummaryQuery { top, format: Some("csv".into()) };
        let response = builder
            .query(&query)
            .send()
            .await
            .map_err(|error| ClientError::Unreachable { url: url.clone(), reason: describe(&error) })?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|error| ClientError::Unreachable { url: url.clone(), reason: describe(&error) })?;
        if status.is_success() {
            return Ok(text);
        }
        Err(failure(url, status, &text))
    }

    /// Recent GPU telemetry of a worker (by name), oldest first.
    pub async fn telemetry(&self, worker: &str) -> ClientResult<Vec<GpuSample>> {
        self.get(&format!("/api/workers/{}/telemetry", encode(worker))).await
    }

    /// A sweep's leaderboard with the direction each of its metrics improves in.
    pub async fn leaderboard(&self, sweep: &str, top: Option<u32>) -> ClientResult<Leaderboard> {
        let (url, builder) = self.request(Method::GET, &format!("/api/sweeps/{}/summary", encode(sweep)));
        Self::send(url, builder.query(&SummaryQuery { top, format: None })).await
    }

    /// A sweep analysed by `query.metric` (default: its own): parameter importance, the best
    /// result over time and when the sweep will finish.
    pub async fn sweep_analysis(&self, sweep: &str, query: &AnalysisQuery) -> ClientResult<SweepAnalysis> {
        let (url, builder) = self.request(Method::GET, &format!("/api/sweeps/{}/analysis", encode(sweep)));
        Self::send(url, builder.query(query)).await
    }

    /// The readings of the GPUs an attempt of a job held (default: its latest), while it held them.
    pub async fn job_gpu(&self, job: JobId, query: &JobGpuQuery) -> ClientResult<JobGpuUsage> {
        let (url, builder) = self.request(Method::GET, &format!("/api/jobs/{job}/gpu"));
        Self::send(url, builder.query(query)).await
    }
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

/// Queue maintenance: bulk retries and removing a finished sweep.
impl Client {
    /// Queues the listed failed or cancelled jobs again (at most 1,000 ids); the others are
    /// named in `skipped`.
    pub async fn retry_jobs(&self, ids: &[JobId]) -> ClientResult<RetryResponse> {
        self.post("/api/jobs/retry", &BulkRetryRequest { ids: ids.to_vec() }).await
    }

    /// Queues every failed job of a sweep (by id or name) again.
    pub async fn retry_sweep(&self, key: &str) -> ClientResult<RetryResponse> {
        self.post(&format!("/api/sweeps/{}/retry", encode(key)), &()).await
    }

    /// Removes a sweep none of whose jobs is queued or running, with its jobs' records and
    /// result files (409 while jobs are queued or running).
    pub async fn delete_sweep(&self, key: &str) -> ClientResult<SweepRemoved> {
        let (url, builder) = self.request(Method::DELETE, &format!("/api/sweeps/{}", encode(key)));
        Self::send(url, builder).await
    }
}

/// Code snapshots and checkpoints (see `shared::api::code`).
impl Client {
    /// The snapshot `digest`, if the server holds it (a 404 otherwise).
    pub async fn code_info(&self, digest: &str) -> ClientResult<CodeInfo> {
        self.get(&format!("/api/code/{}", encode(digest))).await
    }

    /// Uploads a compressed snapshot, streamed; the server names it by its own digest.
    pub async fn upload_code(&self, file: tokio::fs::File) -> ClientResult<CodeInfo> {
        let (url, builder) = self.request(Method::POST, "/api/code");
        let length = file.metadata().await.map(|metadata| metadata.len()).ok();
        let mut builder = builder.timeout(UPLOAD_TIMEOUT).header(reqwest::header::CONTENT_TYPE, "application/zstd");
        if let Some(length) = length {
            builder = builder.header(reqwest::header::CONTENT_LENGTH, length);
        }
        Self::send(url, builder.body(file)).await
    }

    /// Where and how a sweep's jobs run: its code snapshot, workdir, variables and setup line.
    pub async fn sweep_workspace(&self, key: &str) -> ClientResult<Workspace> {
        self.get(&format!("/api/sweeps/{}/code", encode(key))).await
    }

    /// Downloads snapshot `digest` for `worker` to `destination` (streamed); its length.
    pub async fn download_code(
        &self,
        worker: WorkerId,
        digest: &str,
        destination: &std::path::Path,
    ) -> ClientResult<u64> {
        let route = format!("/api/workers/{worker}/code/{}", encode(digest));
        let (url, builder) = self.worker_request(worker, Method::GET, &route);
        let response = Self::open_download(url.clone(), builder).await?;
        save(url, response, destination).await
    }

    /// Uploads a checkpoint of a running attempt (a 409 means the attempt is stale).
    pub async fn upload_checkpoint(
        &self,
        job: JobId,
        attempt: u32,
        worker_id: WorkerId,
        file: tokio::fs::File,
    ) -> ClientResult<CheckpointInfo> {
        let route = format!("/api/jobs/{job}/attempts/{attempt}/checkpoint");
        let (url, builder) = self.worker_request(worker_id, Method::PUT, &route);
        let length = file.metadata().await.map(|metadata| metadata.len()).ok();
        let mut builder = builder.timeout(UPLOAD_TIMEOUT).query(&CheckpointQuery { worker_id });
        if let Some(length) = length {
            builder = builder.header(reqwest::header::CONTENT_LENGTH, length);
        }
        Self::send(url, builder.body(file)).await
    }

    /// Downloads the job's newest checkpoint for attempt `attempt` (running on `worker_id`) to
    /// `destination`: which attempt uploaded it and its SHA-256, or `None` when it has none.
    pub async fn download_checkpoint(
        &self,
        job: JobId,
        attempt: u32,
        worker_id: WorkerId,
        destination: &std::path::Path,
    ) -> ClientResult<Option<(u32, String)>> {
        let route = format!("/api/jobs/{job}/attempts/{attempt}/checkpoint");
        let (url, builder) = self.worker_request(worker_id, Method::GET, &route);
        let response = match Self::open_download(url.clone(), builder.query(&CheckpointQuery { worker_id })).await {
            Ok(response) => response,
            Err(error) if error.status() == Some(404) => return Ok(None),
            Err(error) => return Err(error),
        };
        let header = |name: &str| response.headers().get(name).and_then(|value| value.to_str().ok()).map(String::from);
        let from = header(CHECKPOINT_ATTEMPT_HEADER).and_then(|attempt| attempt.parse().ok());
        let sha256 = header(CHECKPOINT_SHA256_HEADER);
        let (Some(from), Some(sha256)) = (from, sha256) else {
            return Err(ClientError::Decode {
                url,
                reason: "a checkpoint without its attempt and SHA-256 headers".into(),
            });
        };
        save(url, response, destination).await?;
        Ok(Some((from, sha256)))
    }

    /// The job's newest checkpoint (a 404 when it has none).
    pub async fn checkpoint_info(&self, job: JobId) -> ClientResult<CheckpointInfo> {
        self.get(&format!("/api/jobs/{job}/checkpoint")).await
    }

    /// Sends a download request; the response once the server said yes.
    async fn open_download(url: String, builder: RequestBuilder) -> ClientResult<reqwest::Response> {
        let response = builder
            .timeout(UPLOAD_TIMEOUT)
            .send()
            .await
            .map_err(|error| ClientError::Unreachable { url: url.clone(), reason: describe(&error) })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        Err(failure(url, status, &text))
    }
}

/// Streams a download's body into `destination`; a broken transfer leaves no file behind.
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
