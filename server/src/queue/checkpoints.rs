//! Job checkpoints: the running attempt uploads its `$APP_CHECKPOINT_DIR` (fenced like every
//! other upload of an attempt), the server keeps the newest one per job, and the next attempt
//! of the job downloads it to start from.
//!
//! Files are `<data_dir>/checkpoints/<job>/<sha256>.tar.zst`, immutable once placed; the
//! `checkpoints` row says which one is current. A new upload is received outside any lock, then
//! placed, recorded (still fenced, in a write unit) and the job's other files removed, one job's
//! placement at a time (across replicas too: `db::postgres::lock_checkpoints`), so a stale
//! attempt's late upload can neither replace nor remove the current one.

use super::{Change, Queue, WorkerAttempt};
use crate::db::{self, now_ms};
use crate::error::{ApiError, ApiResult};
use crate::storage::{self, disk_error, ReceiveError};
use futures_util::Stream;
use shared::api::{CheckpointInfo, JobId};
use std::io;
use std::path::PathBuf;

fn no_checkpoint(job: JobId) -> ApiError {
    ApiError::NotFound(format!("job {job} has no checkpoint"))
}

impl Queue {
    pub(super) fn checkpoint_dir(&self, job: JobId) -> PathBuf {
        self.config.data_dir.join("checkpoints").join(job.to_string())
    }

    fn checkpoint_path(&self, job: JobId, sha256: &str) -> PathBuf {
        self.checkpoint_dir(job).join(format!("{sha256}.tar.zst"))
    }

    /// Stores a checkpoint of a running attempt as its job's newest.
    pub async fn store_checkpoint<S, B, E>(
        &self,
        at: WorkerAttempt,
        declared: Option<u64>,
        body: S,
    ) -> ApiResult<CheckpointInfo>
    where
        S: Stream<Item = Result<B, E>> + Unpin,
        B: AsRef<[u8]>,
        E: std::fmt::Display,
    {
        let WorkerAttempt { job, attempt, worker } = at;
        super::fence::holder(self.reader().acquire().await?.conn(), job, attempt, worker, "checkpoint upload").await?;
        let limit = self.config.max_upload_bytes;
        let too_large =
            || ApiError::PayloadTooLarge(format!("the checkpoint is larger than the upload limit of {limit} bytes"));
        if declared.is_some_and(|length| length > limit) {
            return Err(too_large());
        }
        let _room = storage::ensure_room(&self.layout.incoming(), declared, || format!("a checkpoint of job {job}"))?;
        let received = storage::receive(&self.layout.incoming(), body, limit).await.map_err(|error| match error {
            ReceiveError::TooLarge(_) => too_large(),
            ReceiveError::Body(reason) => ApiError::BadRequest(format!("the checkpoint upload broke off: {reason}")),
            ReceiveError::Disk(error) => disk_error(error, format!("storing a checkpoint of job {job}")),
        })?;
        let info = CheckpointInfo {
            job_id: job,
            attempt,
            size: received.size,
            sha256: received.sha256.clone(),
            uploaded_at: now_ms(),
        };
        let _one_at_a_time = self.checkpoint_lock.lock().await;
        let placed = async {
            // Replicas on one database: one of them at a time, too.
            let across_replicas = match self.db().postgres_pool() {
                Some(pool) => Some(db::postgres::lock_checkpoints(pool, job).await?),
                None => None,
            };
            let placed = self.place_checkpoint(at, &received.temp, &info).await;
            self.prune_checkpoints(job).await;
            if let Some(held) = across_replicas {
                // Let go now (a transaction dropped unfinished rolls back only when its
                // connection is next used).
                let _ = held.rollback().await;
            }
            placed
        }
        .await;
        let _ = tokio::fs::remove_file(&received.temp).await;
        placed?;
        tracing::debug!(%job, attempt, bytes = info.size, "checkpoint stored");
        Ok(info)
    }

    async fn place_checkpoint(
        &self,
        at: WorkerAttempt,
        temp: &std::path::Path,
        info: &CheckpointInfo,
    ) -> ApiResult<()> {
        let dir = self.checkpoint_dir(at.job);
        let stored = async {
            tokio::fs::create_dir_all(&dir).await?;
            tokio::fs::rename(temp, self.checkpoint_path(at.job, &info.sha256)).await
        };
        stored.await.map_err(|error| disk_error(error, format!("storing a checkpoint of job {}", at.job)))?;
        let info = info.clone();
        self.write(move |tx| {
            Box::pin(async move {
                // The attempt may have ended while the bytes streamed in.
                super::fence::holder(tx.conn().await?, at.job, at.attempt, at.worker, "checkpoint upload").await?;
                db::checkpoints::replace(tx.conn().await?, &info).await?;
                tx.note(Change::Page);
                Ok(())
            })
        })
        .await
    }

    /// Removes the files of `job` that are not its current checkpoint.
    async fn prune_checkpoints(&self, job: JobId) {
        let current = match db::checkpoints::get(self.reader(), job).await {
            Ok(current) => current.map(|info| format!("{}.tar.zst", info.sha256)),
            Err(error) => {
                tracing::warn!(%job, %error, "reading a job's checkpoint; its older files stay for now");
                return;
            }
        };
        let Ok(mut entries) = tokio::fs::read_dir(self.checkpoint_dir(job)).await else { return };
        while let Ok(Some(entry)) = entries.next_entry().await {
            if current.as_deref() != entry.file_name().to_str() {
                let _ = tokio::fs::remove_file(entry.path()).await;
            }
        }
        if current.is_none() {
            let _ = tokio::fs::remove_dir(self.checkpoint_dir(job)).await;
        }
    }

    /// The job's checkpoint, if it has one.
    pub async fn checkpoint_info(&self, job: JobId) -> ApiResult<CheckpointInfo> {
        let reader = self.reader();
        db::jobs::state(reader.acquire().await?.conn(), job).await?.ok_or_else(|| super::no_job(job))?;
        db::checkpoints::get(reader, job).await?.ok_or_else(|| no_checkpoint(job))
    }

    /// The job's checkpoint for the attempt that resumes from it, fenced like its uploads.
    pub async fn checkpoint_for_attempt(&self, at: WorkerAttempt) -> ApiResult<(CheckpointInfo, tokio::fs::File, u64)> {
        super::fence::holder(
            self.reader().acquire().await?.conn(),
            at.job,
            at.attempt,
            at.worker,
            "checkpoint download",
        )
        .await?;
        self.open_checkpoint(at.job).await
    }

    /// The job's checkpoint, opened, with its length.
    pub async fn open_checkpoint(&self, job: JobId) -> ApiResult<(CheckpointInfo, tokio::fs::File, u64)> {
        // A newer upload may replace the file between the read and the open: read again once.
        for _ in 0..2 {
            let info = self.checkpoint_info(job).await?;
            let path = self.checkpoint_path(job, &info.sha256);
            match tokio::fs::File::open(&path).await {
                Ok(file) => {
                    let length = file.metadata().await.map_err(anyhow::Error::from)?.len();
                    return Ok((info, file, length));
                }
                Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
                Err(error) => {
                    return Err(ApiError::Internal(
                        anyhow::Error::new(error).context(format!("opening {}", path.display())),
                    ))
                }
            }
        }
        Err(ApiError::NotFound(format!("the checkpoint of job {job} is gone from the server's disk")))
    }
}
