//! The end of an attempt: its worker reports how it ended, fenced by `(job, attempt, worker)`;
//! `shared::job::finish` decides the job's new state and one guarded UPDATE applies it.

use super::jobs::state_of;
use super::{Change, Queue, Tx};
use crate::db::{self, now_ms};
use crate::error::{ApiError, ApiResult};
use shared::api::{JobAttempt, JobId, WorkerId};
use shared::job::{self, JobStatus, Outcome};

/// Applies `outcome` to the attempt if `worker` still holds it; returns the job's new status.
pub(super) async fn apply_outcome(
    tx: &mut Tx,
    search: &super::search::Controller,
    attempt: JobAttempt,
    worker: WorkerId,
    outcome: &Outcome,
) -> ApiResult<JobStatus> {
    let current = state_of(tx, attempt.job_id).await?;
    apply_to(tx, search, current, attempt, worker, outcome).await
}

/// [`apply_outcome`] on the state `current` just read in this write unit.
pub(super) async fn apply_to(
    tx: &mut Tx,
    search: &super::search::Controller,
    current: crate::db::jobs::JobState,
    attempt: JobAttempt,
    worker: WorkerId,
    outcome: &Outcome,
) -> ApiResult<JobStatus> {
    let id = attempt.job_id;
    let holds =
        current.status == JobStatus::Running && current.attempt == attempt.attempt && current.worker_id == Some(worker);
    if !holds {
        return Err(ApiError::Conflict(format!(
            "stale report for job {id} attempt {}: the job is {} at attempt {}",
            attempt.attempt, current.status, current.attempt
        )));
    }
    let decision = job::finish(outcome, current.retries_left, current.cancel_requested);
    if !db::jobs::finish(tx.conn(), &current, worker, &decision, now_ms()).await? {
        return Err(ApiError::Conflict(format!("job {id} changed while its report was applied; report again")));
    }
    tx.note(Change::Job(id));
    if decision.status == JobStatus::Queued {
        tx.note(Change::Claimable);
    }
    tracing::debug!(job = %id, attempt = attempt.attempt, status = %decision.status, "attempt finished");
    if decision.status == JobStatus::Succeeded {
        search.after_success(tx, id, attempt.attempt, current.sweep_id).await?;
    }
    Ok(decision.status)
}

impl Queue {
    /// A worker's report of how an attempt ended.
    pub async fn report(&self, id: JobId, worker: WorkerId, attempt: u32, outcome: Outcome) -> ApiResult<JobStatus> {
        let attempt = JobAttempt { job_id: id, attempt };
        let search = self.search.clone();
        self.write(move |tx| Box::pin(async move { apply_outcome(tx, &search, attempt, worker, &outcome).await }))
            .await
            .inspect(|status| self.meters.reported(*status))
    }
}
