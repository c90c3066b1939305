//! Lost attempts, in one place: a lease that ran out (the reaper's pass), and the attempts a
//! re-registering worker no longer holds (its box restarted). Both ask `shared::job` what a
//! lost attempt does (requeue, counting a crash, or `worker_lost`) and apply it guarded.
//! Also the lease extensions after a restart or a pause, when nobody could heartbeat.

use super::{Change, Queue, Tx};
use crate::db::{self, jobs::JobState, now_ms};
use crate::error::ApiResult;
use shared::api::JobAttempt;
use shared::job::{self, JobStatus};

/// What a pass over expired leases did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LeaseExpiry {
    pub requeued: usize,
    pub failed: usize,
}

/// Applies the loss of `lost` attempts in `tx`; returns how many went back to the queue and
/// how many failed for good.
pub(super) async fn lose(tx: &mut Tx, lost: &[JobState], max_crashes: u32, now: i64) -> ApiResult<LeaseExpiry> {
    let mut expiry = LeaseExpiry::default();
    for held in lost {
        let decision = job::lease_expired(held.crash_count, max_crashes, held.cancel_requested);
        let attempt = JobAttempt { job_id: held.id, attempt: held.attempt };
        if db::jobs::expire(tx.conn().await?, attempt, &decision, now).await? {
            tracing::warn!(job = %held.id, attempt = held.attempt, to = %decision.status, reason = decision.reason, "attempt lost");
            tx.note(Change::Job(held.id));
            if decision.status == JobStatus::Queued {
                expiry.requeued += 1;
                tx.note(Change::Claimable);
            } else {
                expiry.failed += 1;
                if decision.status == JobStatus::Failed {
                    super::fail_fast::after_failure(tx, held.sweep_id, None).await?;
                }
            }
        }
    }
    Ok(expiry)
}

impl Queue {
    /// Requeues (or fails) every running job whose lease ran out.
    pub async fn expire_leases(&self) -> ApiResult<LeaseExpiry> {
        let max_crashes = self.config.max_crashes;
        self.write(move |tx| {
            Box::pin(async move {
                let now = now_ms();
                let expired = db::jobs::expired(tx.conn().await?, now).await?;
                lose(tx, &expired, max_crashes, now).await
            })
        })
        .await
        .inspect(|expiry| self.meters.leases_expired(expiry))
    }

    /// Gives every running job a full lease from now: after a restart or a pause of this
    /// process, workers get a lease's time to reach it before their jobs count as lost.
    pub async fn extend_all_leases(&self) -> ApiResult<u64> {
        let until = now_ms() + self.config.lease.as_millis() as i64;
        self.write(move |tx| {
            Box::pin(async move { Ok(db::jobs::extend_running_leases(tx.conn().await?, until).await?) })
        })
        .await
    }
}
