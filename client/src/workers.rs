//! Workers: registering, claiming, heartbeats, finishing and leaving, as the worker daemon
//! calls them, and the workers' list and telemetry.

use super::*;

impl Client {
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
        let timeout = self.lease_timeout + Duration::from_millis(request.wait_ms);
        let path = format!("/api/workers/{worker}/claim");
        self.send(Method::POST, &path, Some(worker), |builder| builder.timeout(timeout).json(request)).await
    }

    pub async fn heartbeat(&self, worker: WorkerId, request: &HeartbeatRequest) -> ClientResult<HeartbeatResponse> {
        let path = format!("/api/workers/{worker}/heartbeat");
        let timeout = self.lease_timeout;
        self.send(Method::POST, &path, Some(worker), |builder| builder.timeout(timeout).json(request)).await
    }

    /// Ends an attempt in one request (log tail, metrics, result, outcome) and, when the
    /// request asks, claims the next jobs. A 409 means the attempt is stale: nothing was applied.
    /// Fenced by its attempt, it goes on to the next server when one does not answer.
    pub async fn finish(&self, worker: WorkerId, request: &FinishRequest) -> ClientResult<FinishResponse> {
        let wait = request.claim.as_ref().map_or(0, |claim| claim.wait_ms);
        // And the time its body takes to send on a slow link (a megabyte of inline outputs and
        // log at 128 KiB/s is 8 s more).
        let bytes = serde_json::to_vec(request).map_or(0, |body| body.len() as u64);
        let sending = Duration::from_millis(bytes * 1000 / SLOWEST_LINK_BYTES_PER_SECOND);
        let timeout = self.lease_timeout + Duration::from_millis(wait) + sending;
        let path = format!("/api/workers/{worker}/finish");
        self.send_replaying(Method::POST, &path, Some(worker), Replay::Fenced, |builder| {
            builder.timeout(timeout).json(request)
        })
        .await
    }

    /// Tells the server this worker takes no more jobs: its parked claim returns at once.
    pub async fn drain(&self, worker: WorkerId) -> ClientResult<serde_json::Value> {
        self.worker_post(worker, &format!("/api/workers/{worker}/drain"), &serde_json::json!({})).await
    }

    /// Tells the server this worker stopped cleanly: it shows as `left`, not `lost`.
    pub async fn leave(&self, worker: WorkerId) -> ClientResult<serde_json::Value> {
        self.worker_post(worker, &format!("/api/workers/{worker}/leave"), &serde_json::json!({})).await
    }

    /// Reports how an attempt ended. A 409 means the attempt is stale (the lease was lost and
    /// the job requeued): the report changed nothing and should be dropped.
    pub async fn report(&self, job: JobId, request: &ReportRequest) -> ClientResult<ReportResponse> {
        self.worker_post(request.worker_id, &format!("/api/jobs/{job}/report"), request).await
    }

    /// Recent GPU telemetry of a worker (by name), oldest first.
    pub async fn telemetry(&self, worker: &str) -> ClientResult<Vec<GpuSample>> {
        self.get(&format!("/api/workers/{}/telemetry", encode(worker))).await
    }
}
