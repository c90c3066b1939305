//! What users do to jobs: cancel (one, many), retry, reprioritise. Each is one write unit that
//! reads the job's state, checks that the caller may change it (`owners`), asks `shared::job`
//! what the action does, and applies it guarded.

use super::{Change, Queue, Tx};
use crate::auth::Caller;
use crate::db::{self, jobs::JobState, now_ms};
use crate::error::{ApiError, ApiResult};
use shared::api::{BulkCancelResponse, CancelResponse, JobAttempt, JobId, PreemptResponse};
use shared::job::{self, CancelEffect};

/// Jobs one bulk request may name at most.
pub const MAX_BULK: usize = 1_000;

pub fn no_job(id: JobId) -> ApiError {
    ApiError::NotFound(format!("no job {id}"))
}

pub(super) async fn state_of(tx: &mut Tx, id: JobId) -> ApiResult<JobState> {
    db::jobs::state(tx.conn().await?, id).await?.ok_or_else(|| no_job(id))
}

/// The job's state, once `caller` proved it may change the job (see `owners`).
async fn state_for(tx: &mut Tx, caller: &Caller, id: JobId) -> ApiResult<JobState> {
    let current = state_of(tx, id).await?;
    super::owners::job(tx, caller, id, current.sweep_id).await?;
    Ok(current)
}

fn raced(id: JobId) -> ApiError {
    ApiError::Conflict(format!("job {id} changed while this request ran; try again"))
}

impl Queue {
    /// Cancels a queued job at once, or flags a running one for its worker to kill.
    pub async fn cancel_job(&self, caller: &Caller, id: JobId) -> ApiResult<CancelResponse> {
        let caller = caller.clone();
        self.write(move |tx| {
            Box::pin(async move {
                let current = state_for(tx, &caller, id).await?;
                let mut response = CancelResponse::default();
                match job::cancel(current.status) {
                    CancelEffect::Now => {
                        db::jobs::cancel_queued(tx.conn().await?, id, now_ms())
                            .await?
                            .then_some(())
                            .ok_or_else(|| raced(id))?;
                        response.cancelled = 1;
                    }
                    CancelEffect::Requested => {
                        let attempt = JobAttempt { job_id: id, attempt: current.attempt };
                        db::jobs::request_cancel(tx.conn().await?, attempt)
                            .await?
                            .then_some(())
                            .ok_or_else(|| raced(id))?;
                        response.cancel_requested = 1;
                    }
                    CancelEffect::Refused => {
                        return Err(ApiError::Conflict(format!(
                            "job {id} is {}; only queued or running jobs can be cancelled",
                            current.status
                        )))
                    }
                }
                tx.note(Change::Job(id));
                Ok(response)
            })
        })
        .await
    }

    /// Preempts a running job by hand (its owner or an admin; as Slurm's `scontrol requeue`):
    /// its worker stops it at its next heartbeat, SIGTERM then SIGKILL after the preemption
    /// grace, and it goes back to the queue to resume from its checkpoint, no retry spent.
    pub async fn preempt_job(&self, caller: &Caller, id: JobId) -> ApiResult<PreemptResponse> {
        let caller = caller.clone();
        self.write(move |tx| {
            Box::pin(async move {
                let current = state_for(tx, &caller, id).await?;
                if current.status != shared::job::JobStatus::Running {
                    return Err(ApiError::Conflict(format!(
                        "job {id} is {}; only a running job can be preempted",
                        current.status
                    )));
                }
                if current.cancel_requested {
                    return Err(ApiError::Conflict(format!("job {id} is being cancelled; it is not preempted")));
                }
                let reason = format!("preempted by {}", caller.name);
                let attempt = JobAttempt { job_id: id, attempt: current.attempt };
                if !db::preemptions::order(tx.conn().await?, id, current.attempt, &reason, now_ms()).await? {
                    return Err(ApiError::Conflict(format!(
                        "job {id} attempt {} was preempted already; its worker is stopping it",
                        current.attempt
                    )));
                }
                tx.note(Change::Job(id));
                Ok(PreemptResponse { attempt, reason })
            })
        })
        .await
        .inspect(|_| self.meters.preempted(1, false))
    }

    /// Cancels every listed job that is queued or running; the others are named in `skipped`.
    pub async fn cancel_jobs(&self, caller: &Caller, ids: Vec<JobId>) -> ApiResult<BulkCancelResponse> {
        if ids.len() > MAX_BULK {
            return Err(ApiError::BadRequest(format!(
                "{} ids in one cancel; at most {MAX_BULK} (cancel a whole sweep with POST /api/sweeps/{{sweep}}/cancel)",
                ids.len()
            )));
        }
        let caller = caller.clone();
        self.write(move |tx| {
            Box::pin(async move {
                super::owners::jobs(tx, &caller, &ids).await?;
                let (cancelled, requested) = db::jobs::cancel_many(tx.conn().await?, &ids, now_ms()).await?;
                for id in cancelled.iter().chain(&requested) {
                    tx.note(Change::Job(*id));
                }
                let done: std::collections::HashSet<JobId> = cancelled.iter().chain(&requested).copied().collect();
                let mut skipped: Vec<JobId> = ids.iter().copied().filter(|id| !done.contains(id)).collect();
                skipped.sort_unstable();
                skipped.dedup();
                Ok(BulkCancelResponse {
                    cancelled: cancelled.len() as u64,
                    cancel_requested: requested.len() as u64,
                    skipped,
                })
            })
        })
        .await
    }

    /// Puts a failed or cancelled job back in the queue.
    pub async fn retry_job(&self, caller: &Caller, id: JobId) -> ApiResult<()> {
        let caller = caller.clone();
        self.write(move |tx| {
            Box::pin(async move {
                let current = state_for(tx, &caller, id).await?;
                if !job::can_retry(current.status) {
                    return Err(ApiError::Conflict(format!(
                        "job {id} is {}; only failed or cancelled jobs can be retried",
                        current.status
                    )));
                }
                db::jobs::retry(tx.conn().await?, id, current.status).await?.then_some(()).ok_or_else(|| raced(id))?;
                tx.note(Change::Job(id));
                tx.note(Change::Claimable);
                Ok(())
            })
        })
        .await
    }

    /// Changes the priority of a job that is not finished.
    pub async fn set_priority(&self, caller: &Caller, id: JobId, priority: i64) -> ApiResult<()> {
        let caller = caller.clone();
        self.write(move |tx| {
            Box::pin(async move {
                let current = state_for(tx, &caller, id).await?;
                if !job::can_change_priority(current.status) {
                    return Err(ApiError::Conflict(format!(
                        "job {id} is {}; its priority no longer matters",
                        current.status
                    )));
                }
                db::jobs::set_priority(tx.conn().await?, id, current.status, priority)
                    .await?
                    .then_some(())
                    .ok_or_else(|| raced(id))?;
                tx.note(Change::Page);
                Ok(())
            })
        })
        .await
    }
}
