//! Sweeps: submitting, listing, cancelling, retrying and removing them, and what their runs
//! produced (summaries, leaderboards, analysis). Also the server's health and overview.

use super::*;

impl Client {
    pub async fn health(&self) -> ClientResult<Health> {
        self.get("/api/health").await
    }

    /// Submits a sweep file (or, with `query.dry_run`, only validates and counts it).
    pub async fn submit(&self, yaml: &str, query: &SubmitQuery) -> ClientResult<SubmitResponse> {
        self.send(Method::POST, "/api/sweeps", None, |builder| {
            builder.query(query).header(reqwest::header::CONTENT_TYPE, "application/yaml").body(yaml.to_string())
        })
        .await
    }

    pub async fn sweeps(&self) -> ClientResult<Vec<SweepInfo>> {
        self.get("/api/sweeps").await
    }

    /// The sweeps `query` asks for (one owner's).
    pub async fn sweeps_where(&self, query: &SweepQuery) -> ClientResult<Vec<SweepInfo>> {
        self.send(Method::GET, "/api/sweeps", None, |builder| builder.query(query)).await
    }

    /// The user this client's token names.
    pub async fn whoami(&self) -> ClientResult<Whoami> {
        self.get("/api/whoami").await
    }

    /// GPU-hours per user over the last 24 hours and 7 days.
    pub async fn usage(&self) -> ClientResult<Usage> {
        self.get("/api/usage").await
    }

    /// A sweep by id or name.
    pub async fn sweep(&self, key: &str) -> ClientResult<SweepDetail> {
        self.get(&format!("/api/sweeps/{}", encode(key))).await
    }

    pub async fn cancel_sweep(&self, key: &str) -> ClientResult<CancelResponse> {
        self.post(&format!("/api/sweeps/{}/cancel", encode(key)), &()).await
    }

    /// Moves a sweep to the priority class `class` (none: the default).
    pub async fn set_sweep_class(&self, key: &str, class: Option<&str>) -> ClientResult<SetClassResponse> {
        let request = SetClassRequest { priority_class: class.map(str::to_string) };
        self.post(&format!("/api/sweeps/{}/class", encode(key)), &request).await
    }

    /// Resumes a sweep its failing runs paused.
    pub async fn resume_sweep(&self, key: &str) -> ClientResult<ResumeResponse> {
        self.post(&format!("/api/sweeps/{}/resume", encode(key)), &()).await
    }

    pub async fn overview(&self) -> ClientResult<Overview> {
        self.get("/api/overview").await
    }

    /// A sweep's leaderboard: parameters and metrics of each run, best first.
    pub async fn summary(&self, sweep: &str, top: Option<u32>) -> ClientResult<SweepSummary> {
        let path = format!("/api/sweeps/{}/summary", encode(sweep));
        self.send(Method::GET, &path, None, |builder| builder.query(&SummaryQuery { top, format: None })).await
    }

    /// The same leaderboard as CSV text.
    pub async fn summary_csv(&self, sweep: &str, top: Option<u32>) -> ClientResult<String> {
        let query = SummaryQuery { top, format: Some("csv".into()) };
        let path = format!("/api/sweeps/{}/summary", encode(sweep));
        let (url, response) =
            self.exchange(Method::GET, &path, None, Replay::ByMethod, |builder| builder.query(&query)).await?;
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

    /// A sweep's leaderboard with the direction each of its metrics improves in.
    pub async fn leaderboard(&self, sweep: &str, top: Option<u32>) -> ClientResult<Leaderboard> {
        let path = format!("/api/sweeps/{}/summary", encode(sweep));
        self.send(Method::GET, &path, None, |builder| builder.query(&SummaryQuery { top, format: None })).await
    }

    /// A sweep analysed by `query.metric` (default: its own): parameter importance, the best
    /// result over time and when the sweep will finish.
    pub async fn sweep_analysis(&self, sweep: &str, query: &AnalysisQuery) -> ClientResult<SweepAnalysis> {
        let path = format!("/api/sweeps/{}/analysis", encode(sweep));
        self.send(Method::GET, &path, None, |builder| builder.query(query)).await
    }

    /// Queues every failed job of a sweep (by id or name) again.
    pub async fn retry_sweep(&self, key: &str) -> ClientResult<RetryResponse> {
        self.post(&format!("/api/sweeps/{}/retry", encode(key)), &()).await
    }

    /// Removes a sweep none of whose jobs is queued or running, with its jobs' records and
    /// result files (409 while jobs are queued or running).
    pub async fn delete_sweep(&self, key: &str) -> ClientResult<SweepRemoved> {
        self.send(Method::DELETE, &format!("/api/sweeps/{}", encode(key)), None, |builder| builder).await
    }
}
