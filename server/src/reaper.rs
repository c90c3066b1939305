//! Background upkeep. The reaper requeues running jobs whose worker stopped heartbeating
//! (lease expired) and fails them with `worker_lost` once they were lost `max_crashes` times;
//! while jobs wait, it runs the scheduler's passes every second (`queue::preempter`, then
//! `queue::reservations`);
//! now and then it also prunes old GPU telemetry and removes the staged uploads of attempts
//! that ended unsealed. The checkpointer keeps the SQLite write-ahead log short.
//!
//! Both sleep while nothing happens: the reaper until the earliest lease can run out (at most a
//! lease, or the upkeep interval), the checkpointer until something was written. An idle head
//! node wakes a few times a minute, not several times a second.
//!
//! Replicas on one PostgreSQL database reap one at a time: the one holding the reaper's
//! advisory lock (`db::postgres::Leadership`); the others try to take it every reaper interval,
//! and one of them does within that interval of the leader's end.

use crate::db::{self, now_ms};
use crate::error::ApiResult;
use crate::queue::Queue;
use shared::api::JobAttempt;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Runs until the server shuts down.
pub async fn run(queue: Arc<Queue>, mut shutting_down: watch::Receiver<bool>) {
    let config = queue.config().clone();
    let upkeep_every = upkeep_interval(&config);
    let mut next_upkeep = tokio::time::Instant::now();
    let margin = config.heartbeat.max(Duration::from_secs(1));
    // Wall-clock time of the last pass: a gap far longer than the sleep means this process was
    // paused (SIGSTOP, a suspended VM), and no worker could heartbeat meanwhile.
    let mut last_pass = now_ms();
    let mut planned = Duration::ZERO;
    let mut next_reap = tokio::time::Instant::now();
    // Time the scheduler's passes took since the last reap.
    let mut passing = Duration::ZERO;
    // Replicas on one PostgreSQL database: one of them reaps, the others stand by.
    let mut leadership = queue.db().postgres_pool().map(|pool| db::postgres::Leadership::new(pool.clone()));
    loop {
        if let Some(leadership) = leadership.as_mut() {
            if !leadership.lead().await {
                last_pass = now_ms();
                planned = config.reaper_interval;
                // Leading again, it reaps at once.
                next_reap = tokio::time::Instant::now();
                tokio::select! {
                    _ = tokio::time::sleep(planned) => {}
                    _ = shutting_down.wait_for(|stop| *stop) => return,
                }
                continue;
            }
        }
        if tokio::time::Instant::now() >= next_reap {
            let now = now_ms();
            let gap = Duration::from_millis(now.saturating_sub(last_pass).max(0) as u64);
            last_pass = now;
            // The passes below may have kept the loop past its planned wake: not a pause.
            if gap > planned + passing + margin * 2 {
                // As after a restart: workers get a lease to reach us before their jobs count as lost.
                match queue.extend_all_leases().await {
                    Ok(jobs) => tracing::warn!(?gap, jobs, "the server was paused; running jobs keep their leases"),
                    Err(error) => tracing::error!(error = ?error, "extending leases after a pause"),
                }
            } else if let Err(error) = queue.expire_leases().await {
                tracing::error!(error = ?error, "reaping expired leases");
            }
            if tokio::time::Instant::now() >= next_upkeep {
                next_upkeep = tokio::time::Instant::now() + upkeep_every;
                if let Err(error) = prune_telemetry(&queue).await {
                    tracing::error!(error = ?error, "pruning GPU telemetry");
                }
                if let Err(error) = remove_abandoned_staging(&queue).await {
                    tracing::error!(error = ?error, "removing staged uploads of ended attempts");
                }
                if let Some(retention) = config.unrecorded_retention {
                    let before = now_ms() - retention.as_millis() as i64;
                    match queue.layout().remove_unrecorded_before(before).await {
                        Ok(0) => {}
                        Ok(versions) => tracing::info!(
                            versions,
                            ?retention,
                            "removed result versions set aside in results/.unrecorded/ longer than the retention"
                        ),
                        Err(error) => {
                            tracing::error!(error = ?error, "removing old result versions from results/.unrecorded/")
                        }
                    }
                }
                if leadership.is_some() {
                    // A shared directory: a killed replica's uploads in flight are left behind.
                    match queue.layout().remove_abandoned_parts().await {
                        Ok(0) => {}
                        Ok(parts) => tracing::info!(parts, "removed the uploads a server that is gone left unfinished"),
                        Err(error) => tracing::error!(error = ?error, "removing abandoned uploads"),
                    }
                }
            }
            planned = next_pass(&queue, upkeep_every).await;
            next_reap = tokio::time::Instant::now() + planned;
            passing = Duration::ZERO;
        }
        if queue.preemption_may_be_due() {
            let started = tokio::time::Instant::now();
            match queue.preempt_for_shares().await {
                Ok(jobs) if jobs.is_empty() => {}
                Ok(jobs) => tracing::info!(?jobs, "preempted for users below their share"),
                Err(error) => tracing::error!(error = ?error, "the preemption pass"),
            }
            if let Err(error) = queue.reserve_for_large_jobs().await {
                tracing::error!(error = ?error, "the reservation pass");
            }
            passing += started.elapsed();
        }
        // While jobs wait, the preemption pass runs every second; the leases keep their times.
        let wake = match queue.preemption_may_be_due() {
            true => next_reap.min(tokio::time::Instant::now() + PREEMPTION_EVERY),
            false => next_reap,
        };
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            // Users started to wait: the preemption pass runs now.
            _ = queue.preemption_wanted() => {}
            _ = shutting_down.wait_for(|stop| *stop) => return,
        }
    }
}

/// How often the preemption pass runs while jobs wait.
const PREEMPTION_EVERY: Duration = Duration::from_secs(1);

/// How long to sleep: until just after the earliest running lease ends, and at most half a
/// lease (a job claimed meanwhile is then reaped at most half a lease late) or the upkeep
/// interval; at least the configured reaper interval, so a burst of expiries is batched.
async fn next_pass(queue: &Queue, upkeep_every: Duration) -> Duration {
    let config = queue.config();
    let earliest = db::jobs::earliest_lease(queue.reader()).await.ok().flatten();
    let until_expiry = earliest
        .map(|at| Duration::from_millis(at.saturating_sub(now_ms()).max(0) as u64) + Duration::from_millis(10))
        .unwrap_or(Duration::MAX);
    until_expiry.min(upkeep_every).min(config.lease / 2).max(config.reaper_interval)
}

/// Upkeep (pruning, staging cleanup) runs every tenth of the retention window: that keeps the
/// telemetry table within 110% of the window without a DELETE per heartbeat; a minute at most.
fn upkeep_interval(config: &crate::config::ServerConfig) -> Duration {
    (config.telemetry_retention / 10).clamp(config.reaper_interval, Duration::from_secs(60))
}

/// Samples deleted per statement: the writer is shared, so a large backlog (after a long
/// downtime, or a shorter retention) goes in short steps that other writes slip between.
const PRUNE_BATCH: u32 = 5_000;

/// Deletes GPU telemetry older than the retention window; returns how many samples.
pub async fn prune_telemetry(queue: &Queue) -> ApiResult<u64> {
    let before = now_ms() - queue.config().telemetry_retention.as_millis() as i64;
    let mut pruned = 0;
    loop {
        let deleted = queue
            .write(move |tx| {
                Box::pin(async move { Ok(db::telemetry::prune(tx.conn().await?, before, PRUNE_BATCH).await?) })
            })
            .await?;
        pruned += deleted;
        if deleted < u64::from(PRUNE_BATCH) {
            return Ok(pruned);
        }
    }
}

/// Removes staging directories (and their upload records) of attempts no longer running:
/// their worker lost them or reported without sealing, so no seal can come any more.
pub async fn remove_abandoned_staging(queue: &Queue) -> ApiResult<usize> {
    let layout = queue.layout();
    let staged: Vec<JobAttempt> = layout
        .staged_attempts()
        .await
        .map_err(anyhow::Error::from)?
        .into_iter()
        .map(|(job_id, attempt)| JobAttempt { job_id, attempt })
        .collect();
    let running: HashSet<JobAttempt> = db::results::running(queue.reader(), &staged).await?.into_iter().collect();
    let mut removed = 0;
    for attempt in staged.into_iter().filter(|attempt| !running.contains(attempt)) {
        match tokio::fs::remove_dir_all(layout.staging(attempt.job_id, attempt.attempt)).await {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(anyhow::Error::from(error).into()),
            _ => {}
        }
        queue
            .write(move |tx| {
                Box::pin(async move {
                    Ok(db::results::unstage_attempt(tx.conn().await?, attempt.job_id, attempt.attempt).await?)
                })
            })
            .await?;
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
/// Writes coming close together are checkpointed together.
const CHECKPOINT_DELAY: Duration = Duration::from_millis(500);
/// A WAL file larger than this is truncated once writes pause for [`QUIET`]: a burst of writes
/// leaves it at its peak size otherwise (150-194 MB after a load test).
const TRUNCATE_WAL_BYTES: u64 = 16 << 20;
const QUIET: Duration = Duration::from_secs(5);

/// Checkpoints the WAL after writes (at most every half second) until the server shuts down.
pub async fn run_checkpointer(queue: Arc<Queue>, mut shutting_down: watch::Receiver<bool>) {
    let written = queue.events().committed();
    loop {
        tokio::select! {
            _ = written.notified() => {}
            _ = shutting_down.wait_for(|stop| *stop) => return,
        }
        tokio::select! {
            _ = tokio::time::sleep(CHECKPOINT_DELAY) => {}
            _ = shutting_down.wait_for(|stop| *stop) => return,
        }
        match queue.db().checkpoint().await {
            // The passive pass has just copied nearly all of it: restarting costs the writer
            // only the last few pages.
            Ok(pages) if pages > RESTART_WAL_PAGES => {
                // This long means readers kept even the restarts from finishing; say so.
                if pages > 250_000 {
                    tracing::warn!(pages, "the write-ahead log keeps growing");
                }
                match queue.restart_wal().await {
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => tracing::warn!(%error, pages, "restarting the write-ahead log failed"),
                    Err(error) => tracing::warn!(%error, pages, "restarting the write-ahead log failed"),
                }
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "checkpoint failed"),
        }
        if queue.db().wal_bytes() > TRUNCATE_WAL_BYTES {
            tokio::select! {
                // Still busy: the next pass looks again.
                _ = written.notified() => { written.notify_one(); continue; }
                _ = tokio::time::sleep(QUIET) => {}
                _ = shutting_down.wait_for(|stop| *stop) => return,
            }
            let before = queue.db().wal_bytes();
            match queue.truncate_wal().await {
                Ok(Ok(())) => tracing::info!(bytes = before, "writes paused; truncated the write-ahead log"),
                Ok(Err(error)) => tracing::warn!(%error, "truncating the write-ahead log failed"),
                Err(error) => tracing::warn!(%error, "truncating the write-ahead log failed"),
            }
        }
    }
}
