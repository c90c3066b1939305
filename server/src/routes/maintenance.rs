//! Queue maintenance: retry many jobs at once (listed, or a sweep's failed ones) and remove a
//! finished sweep with its jobs, their records and their result files.
//!
//! A removal is one transaction, guarded in SQL by the sweep having no queued or running job;
//! result files leave the disk only after it committed, so a failed removal loses nothing and
//! a crash between the two leaves files without records, never records without files.

use crate::db;
use crate::error::{ApiError, ApiJson, ApiPath, ApiResult};
use crate::state::AppState;
use crate::storage::Layout;
use axum::extract::State;
use axum::routing::{delete, post};
use axum::{Json, Router};
use shared::api::{BulkRetryRequest, JobId, RetryResponse, SweepDetail, SweepRemoved};
use shared::job::{self, JobStatus};
use std::collections::HashSet;
use std::path::PathBuf;

/// The most ids one bulk retry takes (as for bulk cancels).
const MAX_IDS: usize = 1_000;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/jobs/retry", post(retry_jobs))
        .route("/api/sweeps/{sweep}/retry", post(retry_sweep))
        .route("/api/sweeps/{sweep}", delete(remove_sweep))
}

async fn find_sweep(state: &AppState, key: &str) -> ApiResult<SweepDetail> {
    db::sweeps::find(&state.db.reader, key).await?.ok_or_else(|| ApiError::NotFound(format!("no sweep `{key}`")))
}

/// The statuses a retry by hand starts from, as `shared::job` decides.
fn retryable() -> Vec<JobStatus> {
    JobStatus::ALL.into_iter().filter(|status| job::can_retry(*status)).collect()
}

/// Queues the listed failed or cancelled jobs again, in one statement; the other ids are named
/// in `skipped` and left as they were.
async fn retry_jobs(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<BulkRetryRequest>,
) -> ApiResult<Json<RetryResponse>> {
    if request.ids.len() > MAX_IDS {
        return Err(ApiError::BadRequest(format!(
            "{} ids in one retry; at most {MAX_IDS} (retry a sweep's failed jobs with POST /api/sweeps/{{sweep}}/retry)",
            request.ids.len()
        )));
    }
    let mut tx = state.db.writer.begin().await?;
    let retried = db::maintenance::retry_jobs(&mut tx, &request.ids, &retryable()).await?;
    tx.commit().await?;
    if !retried.is_empty() {
        state.work_available.notify_waiters();
    }
    let done: HashSet<JobId> = retried.iter().copied().collect();
    let mut skipped: Vec<JobId> = request.ids.iter().copied().filter(|id| !done.contains(id)).collect();
    skipped.sort_unstable();
    skipped.dedup();
    Ok(Json(RetryResponse { retried, skipped }))
}

/// Queues every failed job of the sweep again (cancelled ones stay: cancelling was a choice).
async fn retry_sweep(State(state): State<AppState>, ApiPath(key): ApiPath<String>) -> ApiResult<Json<RetryResponse>> {
    let sweep = find_sweep(&state, &key).await?;
    let mut tx = state.db.writer.begin().await?;
    let retried = db::maintenance::retry_sweep(&mut tx, sweep.info.id, &[JobStatus::Failed]).await?;
    tx.commit().await?;
    if !retried.is_empty() {
        state.work_available.notify_waiters();
        tracing::info!(sweep = %sweep.info.name, jobs = retried.len(), "failed jobs retried");
    }
    Ok(Json(RetryResponse { retried, skipped: Vec::new() }))
}

/// Removes a sweep none of whose jobs is queued or running, then its files.
async fn remove_sweep(State(state): State<AppState>, ApiPath(key): ApiPath<String>) -> ApiResult<Json<SweepRemoved>> {
    let sweep = find_sweep(&state, &key).await?.info;
    let busy = || {
        ApiError::Conflict(format!(
            "sweep `{}` still has queued or running jobs; cancel it first (app cancel {}) and wait for them to stop",
            sweep.name, sweep.name
        ))
    };
    let mut tx = state.db.writer.begin().await?;
    // The count only words the refusal early; the guard that counts is in the deletes.
    if db::maintenance::unfinished_jobs(&mut tx, sweep.id).await? > 0 {
        return Err(busy());
    }
    let Some(removal) = db::maintenance::delete_sweep(&mut tx, sweep.id).await? else {
        tx.rollback().await?;
        // Gone meanwhile (another removal), or a job was queued again.
        return Err(match db::sweeps::find(&state.db.reader, &sweep.id.to_string()).await? {
            Some(_) => busy(),
            None => ApiError::NotFound(format!("no sweep `{key}`")),
        });
    };
    tx.commit().await?;
    if let Ok(mut names) = state.sweep_names.write() {
        names.remove(&sweep.id);
    }
    tracing::info!(sweep = %sweep.name, jobs = removal.job_ids.len(), "sweep removed");
    let layout = Layout::new(&state.config.data_dir);
    // Out of the way first (one rename), so a new sweep given the same name meanwhile never
    // shares a directory with files on their way out. Names never start with `.`.
    let directory = layout.absolute(&format!("results/{}", sweep.name));
    let doomed = layout.absolute(&format!("results/.removed-{}-{}", sweep.id, sweep.name));
    let directory = match tokio::fs::rename(&directory, &doomed).await {
        Ok(()) => doomed,
        Err(_) => directory,
    };
    // Staged uploads of its attempts, if any, go with the reaper's next sweep of staging.
    remove_directory(directory).await;
    Ok(Json(SweepRemoved {
        id: sweep.id,
        name: sweep.name,
        jobs: removal.job_ids.len() as u64,
        result_versions: removal.versions.len() as u64,
    }))
}

/// Removes a directory that no record points to any more. A failure is logged, not answered:
/// the database no longer knows it, so the removal itself stands.
async fn remove_directory(directory: PathBuf) {
    let removed = tokio::task::spawn_blocking(move || match std::fs::remove_dir_all(&directory) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            tracing::warn!(%error, directory = %directory.display(), "removing the files of a removed sweep");
        }
        _ => {}
    })
    .await;
    if let Err(error) = removed {
        tracing::warn!(%error, "removing the files of a removed sweep");
    }
}
