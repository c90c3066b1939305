//! Queue maintenance: retry many jobs at once (listed, or a sweep's failed ones) and remove a
//! finished sweep with its jobs, their records, their logs and their result files.
//!
//! A removal is one write unit, guarded in SQL by the sweep having no queued or running job;
//! files leave the disk only after it committed, so a failed removal loses nothing and a crash
//! between the two leaves files without records, never records without files.

use super::{Change, Queue};
use crate::auth::Caller;
use crate::db::{self, now_ms};
use crate::error::{ApiError, ApiResult};
use crate::storage::Layout;
use shared::api::{JobId, RetryResponse, SweepRemoved};
use shared::job::{self, JobStatus};
use shared::names::sweep_dir_name;
use std::collections::HashSet;
use std::path::PathBuf;

/// The statuses a retry by hand starts from, as `shared::job` decides.
fn retryable() -> Vec<JobStatus> {
    JobStatus::ALL.into_iter().filter(|status| job::can_retry(*status)).collect()
}

impl Queue {
    /// Queues the listed failed or cancelled jobs again, in one statement; the other ids are
    /// named in `skipped` and left as they were.
    pub async fn retry_jobs(&self, caller: &Caller, ids: Vec<JobId>) -> ApiResult<RetryResponse> {
        if ids.len() > super::jobs::MAX_BULK {
            return Err(ApiError::BadRequest(format!(
                "{} ids in one retry; at most {} (retry a sweep's failed jobs with POST /api/sweeps/{{sweep}}/retry)",
                ids.len(),
                super::jobs::MAX_BULK
            )));
        }
        let asked = ids.clone();
        let caller = caller.clone();
        let retried = self
            .write(move |tx| {
                Box::pin(async move {
                    super::owners::jobs(tx, &caller, &ids).await?;
                    let retried = db::maintenance::retry_jobs(tx.conn().await?, &ids, &retryable()).await?;
                    note_retried(tx, &retried);
                    Ok(retried)
                })
            })
            .await?;
        let done: HashSet<JobId> = retried.iter().copied().collect();
        let mut skipped: Vec<JobId> = asked.into_iter().filter(|id| !done.contains(id)).collect();
        skipped.sort_unstable();
        skipped.dedup();
        Ok(RetryResponse { retried, skipped })
    }

    /// Queues every failed job of the sweep again (cancelled ones stay: cancelling was a choice).
    pub async fn retry_sweep(&self, caller: &Caller, key: &str) -> ApiResult<RetryResponse> {
        let sweep = self.find_sweep(key).await?.info;
        super::owners::sweep(caller, &sweep)?;
        let id = sweep.id;
        let retried = self
            .write(move |tx| {
                Box::pin(async move {
                    let retried = db::maintenance::retry_sweep(tx.conn().await?, id, &[JobStatus::Failed]).await?;
                    note_retried(tx, &retried);
                    Ok(retried)
                })
            })
            .await?;
        if !retried.is_empty() {
            tracing::info!(sweep = %sweep.name, jobs = retried.len(), "failed jobs retried");
        }
        Ok(RetryResponse { retried, skipped: Vec::new() })
    }

    /// Removes a sweep none of whose jobs is queued or running, then its files.
    pub async fn remove_sweep(&self, caller: &Caller, key: &str) -> ApiResult<SweepRemoved> {
        let sweep = self.find_sweep(key).await?.info;
        super::owners::sweep(caller, &sweep)?;
        let (id, name, key) = (sweep.id, sweep.name.clone(), key.to_string());
        let busy = move || {
            ApiError::Conflict(format!(
                "sweep `{name}` still has queued or running jobs; cancel it first (app cancel {name}) and wait for them to stop"
            ))
        };
        let removal = self
            .write(move |tx| {
                Box::pin(async move {
                    // The count only words the refusal early; the guard that counts is in the deletes.
                    if db::maintenance::unfinished_jobs(tx.conn().await?, id).await? > 0 {
                        return Err(busy());
                    }
                    let Some(removal) = db::maintenance::delete_sweep(tx.conn().await?, id).await? else {
                        // Gone meanwhile (another removal), or a job was queued again: the
                        // unit fails, so the deletes made before the guard are undone.
                        let still_there = db::sweeps::name_of(tx.conn().await?, id).await.is_ok();
                        return Err(if still_there { busy() } else { ApiError::NotFound(format!("no sweep `{key}`")) });
                    };
                    tx.note(Change::Page);
                    Ok(removal)
                })
            })
            .await?;
        if let Ok(mut names) = self.sweep_names.write() {
            names.remove(&sweep.id);
        }
        tracing::info!(sweep = %sweep.name, jobs = removal.job_ids.len(), "sweep removed");
        // Out of the way first (one rename each, right after the commit), so a new sweep given
        // the same name, or the same sweep and job ids (SQLite reuses the highest ones), never
        // shares a directory with files on their way out; then removed. Names never start
        // with `.`, ids are numbers.
        let directory = self.layout.absolute(&Layout::sweep_path(&sweep.name));
        let doomed = self.layout.absolute(&format!("results/.removed-{}-{}", sweep.id, sweep_dir_name(&sweep.name)));
        let logs = self.logs.sweep_dir(sweep.id);
        let checkpoints: Vec<PathBuf> = removal.job_ids.iter().map(|job| self.checkpoint_dir(*job)).collect();
        let stamp = now_ms();
        let moved = tokio::task::spawn_blocking(move || {
            let aside = |path: PathBuf| {
                let name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
                let away = path.with_file_name(format!(".removed-{stamp}-{name}"));
                match std::fs::rename(&path, &away) {
                    Ok(()) => Some(away),
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
                    Err(_) => Some(path),
                }
            };
            let results = match std::fs::rename(&directory, &doomed) {
                Ok(()) => doomed,
                Err(_) => directory,
            };
            let mut doomed: Vec<PathBuf> = vec![results];
            doomed.extend(aside(logs));
            doomed.extend(checkpoints.into_iter().filter_map(aside));
            doomed
        })
        .await
        .unwrap_or_default();
        // Staged uploads of its attempts, if any, go with the reaper's next sweep of staging.
        for directory in moved {
            remove_directory(directory).await;
        }
        Ok(SweepRemoved {
            id: sweep.id,
            name: sweep.name,
            jobs: removal.job_ids.len() as u64,
            result_versions: removal.versions.len() as u64,
        })
    }
}

fn note_retried(tx: &mut super::Tx, retried: &[JobId]) {
    for id in retried {
        tx.note(Change::Job(*id));
    }
    if !retried.is_empty() {
        tx.note(Change::Claimable);
    }
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
