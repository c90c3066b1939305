//! `gpu_telemetry`: NVML readings carried by heartbeats, kept for a retention window.

use super::backend::{on_conn, on_pool, Conn, DbRow, PoolRef};
use super::sql;
use shared::api::{GpuSample, WorkerId};

/// Samples per INSERT (9 bound values each).
const SAMPLES_PER_STATEMENT: usize = 2_000;

/// Stores `samples` of `worker` as read at `at`.
pub async fn insert(conn: impl Into<Conn<'_>>, worker: WorkerId, at: i64, samples: &[GpuSample]) -> sql::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        for chunk in samples.chunks(SAMPLES_PER_STATEMENT) {
            let mut query = sql::Builder::new(
                "INSERT INTO gpu_telemetry (worker_id, at, gpu_index, uuid, name, memory_total, memory_used,
                                        utilization, temperature, power_watts) VALUES ",
            );
            for (position, sample) in chunk.iter().enumerate() {
                query.push(if position == 0 { "(" } else { ", (" });
                query.push_bind(worker.get()).push(", ").push_bind(at).push(", ");
                query.push_bind(sample.index).push(", ").push_bind(sample.uuid.as_str()).push(", ");
                query.push_bind(sample.name.as_str()).push(", ");
                query.push_bind(sample.memory_total.min(i64::MAX as u64) as i64).push(", ");
                query.push_bind(sample.memory_used.min(i64::MAX as u64) as i64).push(", ");
                query.push_bind(sample.utilization).push(", ").push_bind(sample.temperature).push(", ");
                // JSON cannot carry NaN, but a reading could still be infinite after a division.
                query.push_bind(sample.power_watts.filter(|watts| watts.is_finite())).push(")");
            }
            query.build().execute(&mut *conn).await?;
        }
        Ok(())
    })
}

/// Samples of `worker` taken at or after `since`, oldest first.
pub async fn list(pool: impl Into<PoolRef<'_>>, worker: WorkerId, since: i64) -> sql::Result<Vec<GpuSample>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let rows = sql::query("SELECT * FROM gpu_telemetry WHERE worker_id = $1 AND at >= $2 ORDER BY at, gpu_index")
            .bind(worker.get())
            .bind(since)
            .fetch_all(pool)
            .await?;
        rows.iter().map(sample_of).collect()
    })
}

/// Deletes up to `limit` samples older than `before`, oldest first; returns how many.
pub async fn prune(conn: impl Into<Conn<'_>>, before: i64, limit: u32) -> sql::Result<u64> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let done = sql::query(
        engine.pick(
            "DELETE FROM gpu_telemetry WHERE rowid IN (SELECT rowid FROM gpu_telemetry WHERE at < $1 ORDER BY at LIMIT $2)",
            "DELETE FROM gpu_telemetry WHERE ctid IN (SELECT ctid FROM gpu_telemetry WHERE at < $1 ORDER BY at LIMIT $2)",
        ),
    )
    .bind(before)
    .bind(i64::from(limit))
    .execute(&mut *conn)
    .await?;
        Ok(done.rows_affected())
    })
}

/// A `gpu_telemetry` row as a sample.
pub fn sample_of(row: &impl DbRow) -> sql::Result<GpuSample> {
    Ok(GpuSample {
        index: row.u32_at("gpu_index")?,
        uuid: row.get_as("uuid")?,
        name: row.get_as("name")?,
        memory_total: row.get_as::<i64>("memory_total")? as u64,
        memory_used: row.get_as::<i64>("memory_used")? as u64,
        utilization: row.opt_u32_at("utilization")?,
        temperature: row.opt_u32_at("temperature")?,
        power_watts: row.get_as("power_watts")?,
        at: row.get_as("at")?,
    })
}
