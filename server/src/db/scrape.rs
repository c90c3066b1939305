//! What a Prometheus scrape reads (`routes/prometheus.rs`): each a lookup, never a count over
//! the jobs table, so scraping every few seconds costs the queue nothing it would notice.

use super::backend::{on_pool, DbRow, PoolRef};
use super::sql;
use shared::api::GpuSample;

/// Jobs of one sweep in one status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepDepth {
    pub sweep: String,
    pub status: String,
    pub jobs: i64,
}

/// Jobs by sweep and status, from the counts the triggers keep (migrations/0004).
pub async fn queue_depth(pool: impl Into<PoolRef<'_>>) -> sql::Result<Vec<SweepDepth>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let rows = sql::query(&format!(
            "SELECT s.name AS sweep, c.status, c.jobs FROM {} c JOIN sweeps s ON s.id = c.sweep_id
             ORDER BY s.name, c.status",
            super::sweeps::counted(engine)
        ))
        .fetch_all(pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(SweepDepth { sweep: row.get_as("sweep")?, status: row.get_as("status")?, jobs: row.get_as("jobs")? })
            })
            .collect()
    })
}

/// When each worker was last heard from (unix ms), and when it left, if it did.
pub async fn workers_last_seen(pool: impl Into<PoolRef<'_>>) -> sql::Result<Vec<(i64, Option<i64>)>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| sql::query_as("SELECT last_seen_at, left_at FROM workers").fetch_all(pool).await)
}

/// Each worker's latest GPU readings (the GPUs of its last heartbeat with telemetry), by
/// worker name, when they were taken at or after `since`: a silent worker's GPUs drop out
/// rather than report their last values for ever.
pub async fn latest_gpus(pool: impl Into<PoolRef<'_>>, since: i64) -> sql::Result<Vec<(String, GpuSample)>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        // The subquery is one step down the (worker_id, at) index per worker.
        let rows = sql::query(
            "SELECT w.name AS worker, t.* FROM workers w
         JOIN gpu_telemetry t ON t.worker_id = w.id
              AND t.at = (SELECT max(at) FROM gpu_telemetry WHERE worker_id = w.id)
         WHERE t.at >= $1
         ORDER BY w.name, t.gpu_index",
        )
        .bind(since)
        .fetch_all(pool)
        .await?;
        rows.iter()
            .map(|row| {
                let sample = super::telemetry::sample_of(row)?;
                Ok((row.get_as("worker")?, sample))
            })
            .collect()
    })
}
