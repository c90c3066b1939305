//! Background upkeep. The reaper requeues running jobs whose worker stopped heartbeating
//! (lease expired) and fails them with `worker_lost` once they were lost `max_crashes` times;
//! now and then it also prunes old GPU telemetry and removes the staged uploads of attempts
//! that ended unsealed. The checkpointer keeps the SQLite write-ahead log short.

use crate::db::{self, now_ms};
use crate::state::AppState;
use crate::storage::Layout;
use shared::api::JobAttempt;
use shared::job::{self, JobStatus};
use std::collections::HashSet;
use std::time::Duration;

/// Runs until the server shuts down.
pub async fn run(state: AppState) {
    let mut shutting_down = state.shutting_down.clone();
    let mut tick = tokio::time::interval(state.config.reaper_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let upkeep_every = upkeep_interval(&state);
    let mut last_upkeep: Option<tokio::time::Instant> = None;
    // Wall-clock time of the last pass: a gap far longer than the interval means this process
    // was paused (SIGSTOP, a suspended VM), and no worker could heartbeat meanwhile.
    let mut last_pass = now_ms();
    let paused_after = (state.config.reaper_interval * 2).max(state.config.heartbeat) + Duration::from_secs(1);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutting_down.wait_for(|stop| *stop) => return,
        }
        let now = now_ms();
        let gap = Duration::from_millis(now.saturating_sub(last_pass).max(0) as u64);
        last_pass = now;
        if gap > paused_after {
            // As after a restart: workers get a lease to reach us before their jobs count as lost.
            let until = now + state.config.lease.as_millis() as i64;
            match state.db.writer.acquire().await {
                Ok(mut writer) => match db::jobs::extend_running_leases(&mut writer, until).await {
                    Ok(jobs) => tracing::warn!(?gap, jobs, "the server was paused; running jobs keep their leases"),
                    Err(error) => tracing::error!(error = ?error, "extending leases after a pause"),
                },
                Err(error) => tracing::error!(error = ?error, "extending leases after a pause"),
            }
            continue;
        }
        if let Err(error) = requeue_expired_leases(&state).await {
            tracing::error!(error = ?error, "reaping expired leases");
        }
        if last_upkeep.is_none_or(|last| last.elapsed() >= upkeep_every) {
            last_upkeep = Some(tokio::time::Instant::now());
            if let Err(error) = prune_telemetry(&state).await {
                tracing::error!(error = ?error, "pruning GPU telemetry");
            }
            if let Err(error) = remove_abandoned_staging(&state).await {
                tracing::error!(error = ?error, "removing staged uploads of ended attempts");
            }
        }
    }
}

/// Pruning a tenth of the retention window at a time keeps the table within 110% of the
/// window without a DELETE per heartbeat; a minute at most so a long retention still prunes.
fn upkeep_interval(state: &AppState) -> Duration {
    (state.config.telemetry_retention / 10).clamp(state.config.reaper_interval, Duration::from_secs(60))
}

/// Samples deleted per statement: the writer is shared, so a large backlog (after a long
/// downtime, or a shorter retention) goes in short steps that other writes slip between.
const PRUNE_BATCH: u32 = 5_000;

/// Deletes GPU telemetry older than the retention window; returns how many samples.
pub async fn prune_telemetry(state: &AppState) -> anyhow::Result<u64> {
    let before = now_ms() - state.config.telemetry_retention.as_millis() as i64;
    let mut pruned = 0;
    loop {
        let deleted = db::telemetry::prune(&mut *state.db.writer.acquire().await?, before, PRUNE_BATCH).await?;
        pruned += deleted;
        if deleted < u64::from(PRUNE_BATCH) {
            return Ok(pruned);
        }
    }
}

/// Removes staging directories (and their upload records) of attempts no longer running:
/// their worker lost them or reported without sealing, so no seal can come any more.
pub async fn remove_abandoned_staging(state: &AppState) -> anyhow::Result<usize> {
    let layout = Layout::new(&state.config.data_dir);
    let staged: Vec<JobAttempt> =
        layout.staged_attempts().await?.into_iter().map(|(job_id, attempt)| JobAttempt { job_id, attempt }).collect();
    let running: HashSet<JobAttempt> = db::results::running(&state.db.reader, &staged).await?.into_iter().collect();
    let mut removed = 0;
    for attempt in staged.into_iter().filter(|attempt| !running.contains(attempt)) {
        match tokio::fs::remove_dir_all(layout.staging(attempt.job_id, attempt.attempt)).await {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error.into()),
            _ => {}
        }
        db::results::unstage_attempt(&mut *state.db.writer.acquire().await?, attempt.job_id, attempt.attempt).await?;
        tracing::info!(
            job = %attempt.job_id,
            attempt = attempt.attempt,
            "removed the unsealed uploads of an ended attempt"
        );
        removed += 1;
    }
    Ok(removed)
}

/// A WAL longer than this (in pages of 4 KiB) is restarted from its beginning.
const RESTART_WAL_PAGES: i64 = 16_384;

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
            // The passive pass has just copied nearly all of it: restarting costs the writer
            // only the last few pages.
            Ok(pages) if pages > RESTART_WAL_PAGES => {
                // This long means readers kept even the restarts from finishing; say so.
                if pages > 250_000 {
                    tracing::warn!(pages, "the write-ahead log keeps growing");
                }
                if let Err(error) = state.db.restart_wal().await {
                    tracing::warn!(%error, pages, "restarting the write-ahead log failed");
                }
            }
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
    let mut ended = Vec::new();
    for expired in db::jobs::expired(&mut tx, now).await? {
        let decision = job::lease_expired(expired.crash_count, state.config.max_crashes, expired.cancel_requested);
        let attempt = JobAttempt { job_id: expired.id, attempt: expired.attempt };
        if db::jobs::expire(&mut tx, attempt, &decision, now).await? {
            ended.push(expired.id);
            tracing::warn!(job = %expired.id, attempt = expired.attempt, to = %decision.status, reason = decision.reason, "lease expired");
            requeued += usize::from(decision.status == JobStatus::Queued);
        }
    }
    tx.commit().await?;
    if !ended.is_empty() {
        state.changed();
    }
    for id in ended {
        state.job_signals.wake(id);
    }
    if requeued > 0 {
        state.work_available.notify_waiters();
    }
    Ok(requeued)
}
