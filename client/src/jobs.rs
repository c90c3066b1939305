//! Jobs: listing, cancelling, retrying and reprioritising them, and their attempts' logs,
//! metrics, result files and GPU use.

use super::*;

impl Client {
    pub async fn jobs(&self, query: &JobQuery) -> ClientResult<JobPage> {
        self.send(Method::GET, "/api/jobs", None, |builder| builder.query(query)).await
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

    pub async fn cancel_job(&self, id: JobId) -> ClientResult<CancelResponse> {
        self.post(&format!("/api/jobs/{id}/cancel"), &()).await
    }

    /// Preempts a running job: it stops, goes back to the queue and resumes from its checkpoint.
    pub async fn preempt_job(&self, id: JobId) -> ClientResult<PreemptResponse> {
        self.post(&format!("/api/jobs/{id}/preempt"), &()).await
    }

    pub async fn retry_job(&self, id: JobId) -> ClientResult<Job> {
        self.post(&format!("/api/jobs/{id}/retry"), &()).await
    }

    pub async fn set_priority(&self, id: JobId, priority: i64) -> ClientResult<Job> {
        self.post(&format!("/api/jobs/{id}/priority"), &PriorityRequest { priority }).await
    }

    /// Appends log bytes of an attempt at `append.offset` (a retried append is recognised).
    pub async fn append_log(&self, job: JobId, append: &LogAppend, bytes: Vec<u8>) -> ClientResult<LogAck> {
        let path = format!("/api/jobs/{job}/log");
        // A copy per try: only a failover sends it twice.
        self.send(Method::POST, &path, Some(append.worker_id), |builder| {
            builder.query(append).header(reqwest::header::CONTENT_TYPE, "application/octet-stream").body(bytes.clone())
        })
        .await
    }

    /// Reads an attempt's log from an offset, waiting up to `query.wait_ms` for new bytes.
    pub async fn log(&self, job: JobId, query: &LogQuery) -> ClientResult<LogChunk> {
        let timeout = self.timeout + Duration::from_millis(query.wait_ms);
        let path = format!("/api/jobs/{job}/log");
        self.send(Method::GET, &path, None, |builder| builder.timeout(timeout).query(query)).await
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
        self.upload(Method::PUT, &route, Some(worker_id), file, |builder| builder.query(&FileUploadQuery { worker_id }))
            .await
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
        let route = format!("/api/jobs/{job}/results/{attempt}/files/{}", encode_path(path));
        let (url, response) = self.open_download(&route, None, |builder| builder).await?;
        save(url, response, destination).await
    }

    /// The readings of the GPUs an attempt of a job held (default: its latest), while it held them.
    pub async fn job_gpu(&self, job: JobId, query: &JobGpuQuery) -> ClientResult<JobGpuUsage> {
        self.send(Method::GET, &format!("/api/jobs/{job}/gpu"), None, |builder| builder.query(query)).await
    }

    /// Queues the listed failed or cancelled jobs again (at most 1,000 ids); the others are
    /// named in `skipped`.
    pub async fn retry_jobs(&self, ids: &[JobId]) -> ClientResult<RetryResponse> {
        self.post("/api/jobs/retry", &BulkRetryRequest { ids: ids.to_vec() }).await
    }
}
