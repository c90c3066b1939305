//! Background upkeep. The reaper requeues running jobs whose worker stopped heartbeating
//! (lease expired) and fails them with `worker_lost` once they were lost `max_crashes` times;
//! the checkpointer keeps the SQLite write-ahead log short.

use crate::db::{self, now_ms};
use crate::state::AppState;
use shared::api::JobAttempt;
use shared::job::{self, JobStatus};

/// Runs until the server shuts down.
pub async fn run(state: AppState) {
    let mut shutting_down = state.shutting_down.clone();
    let mut tick = tokio::time::interval(state.config.reaper_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutting_down.wait_for(|stop| *stop) => return,
        }
        if let Err(error) = requeue_expired_leases(&state).await {
            tracing::error!(error = ?error, "reaping expired leases");
        }
    }
}

/// Checkpoints the WAL every half second until the server shuts down.
pub async fn run_checkpointer(state: AppState) {
    let mut shutting_down = state.shutting_down.clone();
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutting_down.wait_for(|stop| *stop) => return,
        }
        match state.db.checkpoint().await {
            // A WAL this long means readers keep the checkpoint from finishing; say so.
            Ok(pages) if pages > 250_000 => tracing::warn!(pages, "the write-ahead log keeps growing"),
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "checkpoint failed"),
        }
    }
}

/// One pass; returns how many jobs went back to the queue.
pub async fn requeue_expired_leases(state: &AppState) -> anyhow::Result<usize> {
    let now = now_ms();
    let mut tx = state.db.writer.begin().await?;
    let mut requeued = 0;
    for expired in db::jobs::expired(&mut tx, now).await? {
        let decision = job::lease_expired(expired.crash_count, state.config.max_crashes, expired.cancel_requested);
        let attempt = JobAttempt { job_id: expired.id, attempt: expired.attempt };
        if db::jobs::expire(&mut tx, attempt, &decision, now).await? {
            tracing::warn!(job = expired.id, attempt = expired.attempt, to = %decision.status, reason = decision.reason, "lease expired");
            requeued += usize::from(decision.status == JobStatus::Queued);
        }
    }
    tx.commit().await?;
    if requeued > 0 {
        state.work_available.notify_waiters();
    }
    Ok(requeued)
}
