//! The end of an attempt: its worker reports how it ended, fenced by `(job, attempt, worker)`;
//! `shared::job::finish` decides the job's new state and one guarded UPDATE applies it.

use super::jobs::state_of;
use super::{Change, Queue, Tx};
use crate::db::{self, now_ms};
use crate::error::{ApiError, ApiResult};
use shared::api::{JobAttempt, JobId, WorkerId};
use shared::job::{self, Finish, JobStatus, Outcome};

/// Applies `outcome` to the attempt if `worker` still holds it; returns the job's new status.
pub(super) async fn apply_outcome(
    tx: &mut Tx,
    lane: (&super::search::Controller, &super::LogStore, &super::shares::Shares),
    attempt: JobAttempt,
    worker: WorkerId,
    outcome: &Outcome,
) -> ApiResult<JobStatus> {
    let current = state_of(tx, attempt.job_id).await?;
    apply_to(tx, lane, current, attempt, worker, outcome).await
}

/// [`apply_outcome`] on the state `current` just read in this write unit.
pub(super) async fn apply_to(
    tx: &mut Tx,
    (search, logs, shares): (&super::search::Controller, &super::LogStore, &super::shares::Shares),
    current: crate::db::jobs::JobState,
    attempt: JobAttempt,
    worker: WorkerId,
    outcome: &Outcome,
) -> ApiResult<JobStatus> {
    let mut decision = decide(&current, attempt, worker, outcome)?;
    let now = now_ms();
    let requeued = on_preempted(tx, attempt, outcome, &mut decision, now).await?;
    let applied = db::jobs::finish(tx.conn().await?, &current, worker, &decision, now, false).await?;
    settle(tx, attempt, &decision, applied)?;
    if let Some(owner) = requeued {
        shares.submitted(&owner);
    }
    after_settled(tx, (search, logs), &current, attempt, &decision).await?;
    Ok(decision.status)
}

/// What follows a settled decision in the same unit: a success may have reached its sweep's
/// `metric.target` (see `search::Controller::after_success`); a failure may pause its sweep
/// (`fail_fast`).
pub(super) async fn after_settled(
    tx: &mut Tx,
    (search, logs): (&super::search::Controller, &super::LogStore),
    current: &crate::db::jobs::JobState,
    attempt: JobAttempt,
    decision: &Finish,
) -> ApiResult<()> {
    match decision.status {
        JobStatus::Succeeded => search.after_success(tx, attempt.job_id, attempt.attempt, current.sweep_id).await?,
        JobStatus::Failed => super::fail_fast::after_failure(tx, current.sweep_id, Some(logs)).await?,
        _ => {}
    }
    Ok(())
}

/// What `outcome` does to the job, if `worker` still holds the attempt in `current`.
pub(super) fn decide(
    current: &crate::db::jobs::JobState,
    attempt: JobAttempt,
    worker: WorkerId,
    outcome: &Outcome,
) -> ApiResult<Finish> {
    let holds =
        current.status == JobStatus::Running && current.attempt == attempt.attempt && current.worker_id == Some(worker);
    if !holds {
        return Err(ApiError::Conflict(format!(
            "stale report for job {} attempt {}: the job is {} at attempt {}",
            attempt.job_id, attempt.attempt, current.status, current.attempt
        )));
    }
    Ok(job::finish(outcome, current.retries_left, current.cancel_requested))
}

/// A preempted attempt's end, before it is applied: a requeue takes the reason its order gave
/// ("preempted by lead"), and the GPU time it held is charged to its owner whatever the end (it
/// stores no record that would; a cancel may have won). Returns the owner of a job requeued:
/// they wait again, which the fair share must know before the next claim (the same unit's, in
/// a finish+claim), or it would hand the freed GPUs back to them.
pub(super) async fn on_preempted(
    tx: &mut Tx,
    attempt: JobAttempt,
    outcome: &Outcome,
    decision: &mut Finish,
    now: i64,
) -> ApiResult<Option<String>> {
    if *outcome != Outcome::Preempted {
        return Ok(None);
    }
    let mut requeued = None;
    if decision.status == JobStatus::Queued {
        if let Some((reason, owner)) =
            db::preemptions::reason_of(tx.conn().await?, attempt.job_id, attempt.attempt).await?
        {
            decision.reason = reason.or(decision.reason.take());
            requeued = Some(owner);
        }
    }
    db::usage::add_held(tx.conn().await?, attempt.job_id, now).await?;
    Ok(requeued)
}

/// Notes a decision its guarded UPDATE `applied`, or refuses the unit when it did not.
pub(super) fn settle(tx: &mut Tx, attempt: JobAttempt, decision: &Finish, applied: bool) -> ApiResult<()> {
    let id = attempt.job_id;
    if !applied {
        return Err(ApiError::Conflict(format!("job {id} changed while its report was applied; report again")));
    }
    tx.note(Change::Job(id));
    if decision.status == JobStatus::Queued {
        tx.note(Change::Claimable);
    }
    tracing::debug!(job = %id, attempt = attempt.attempt, status = %decision.status, "attempt finished");
    Ok(())
}

impl Queue {
    /// A worker's report of how an attempt ended.
    pub async fn report(&self, id: JobId, worker: WorkerId, attempt: u32, outcome: Outcome) -> ApiResult<JobStatus> {
        let attempt = JobAttempt { job_id: id, attempt };
        let preempted = outcome == Outcome::Preempted;
        let (search, logs, shares) = (self.search.clone(), self.logs.clone(), self.shares.clone());
        self.write(move |tx| {
            Box::pin(async move { apply_outcome(tx, (&search, &logs, &shares), attempt, worker, &outcome).await })
        })
        .await
        .inspect(|status| {
            self.meters.reported(*status);
            self.quota_room();
            if preempted {
                self.shares.usage_changed();
            }
        })
    }

    /// A running job ended: under quotas its owner may have room again, which no queued job
    /// announces, so every claim waiting (here and on the other replicas) looks again.
    pub(super) fn quota_room(&self) {
        if self.shares.has_quotas() {
            self.events.emit(&[Change::Claimable]);
        }
    }
}
