//! Code snapshots and checkpoints (see `shared::api::code`).

use crate::{encode, save, Client, ClientError, ClientResult};
use reqwest::Method;
use shared::api::*;

impl Client {
    /// The snapshot `digest`, if the server holds it (a 404 otherwise).
    pub async fn code_info(&self, digest: &str) -> ClientResult<CodeInfo> {
        self.get(&format!("/api/code/{}", encode(digest))).await
    }

    /// Uploads a compressed snapshot, streamed; the server names it by its own digest.
    pub async fn upload_code(&self, file: tokio::fs::File) -> ClientResult<CodeInfo> {
        self.upload(Method::POST, "/api/code", None, file, |builder| {
            builder.header(reqwest::header::CONTENT_TYPE, "application/zstd")
        })
        .await
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
        let (url, response) = self.open_download(&route, Some(worker), |builder| builder).await?;
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
        self.upload(Method::PUT, &route, Some(worker_id), file, |builder| builder.query(&CheckpointQuery { worker_id }))
            .await
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
        let opened =
            self.open_download(&route, Some(worker_id), |builder| builder.query(&CheckpointQuery { worker_id })).await;
        let (url, response) = match opened {
            Ok(opened) => opened,
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
}
