//! `gpu_telemetry`: NVML readings carried by heartbeats, kept for a retention window.

use super::backend::{on_conn, on_pool, Conn, DbRow, PoolRef};
use shared::api::{GpuSample, WorkerId};
use sqlx::QueryBuilder;

/// Samples per INSERT (9 bound values each).
const SAMPLES_PER_STATEMENT: usize = 2_000;

/// Stores `samples` of `worker` as read at `at`.
pub async fn insert(conn: impl Into<Conn<'_>>, worker: WorkerId, at: i64, samples: &[GpuSample]) -> sqlx::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        for chunk in samples.chunks(SAMPLES_PER_STATEMENT) {
            let mut query: QueryBuilder<_> = QueryBuilder::new(
                "INSERT INTO gpu_telemetry (worker_id, at, gpu_index, uuid, name, memory_total, memory_used,
                                        utilization, temperature, power_watts) ",
            );
            query.push_values(chunk, |mut row, sample| {
                row.push_bind(worker.get())
                    .push_bind(at)
                    .push_bind(i64::from(sample.index))
                    .push_bind(sample.uuid.as_str())
                    .push_bind(sample.name.as_str())
                    .push_bind(sample.memory_total.min(i64::MAX as u64) as i64)
                    .push_bind(sample.memory_used.min(i64::MAX as u64) as i64)
                    .push_bind(sample.utilization.map(i64::from))
                    .push_bind(sample.temperature.map(i64::from))
                    // JSON cannot carry NaN, but a reading could still be infinite after a division.
                    .push_bind(sample.power_watts.filter(|watts| watts.is_finite()));
            });
            query.build().execute(&mut *conn).await?;
        }
        Ok(())
    })
}

/// Samples of `worker` taken at or after `since`, oldest first.
pub async fn list(pool: impl Into<PoolRef<'_>>, worker: WorkerId, since: i64) -> sqlx::Result<Vec<GpuSample>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let rows = sqlx::query("SELECT * FROM gpu_telemetry WHERE worker_id = $1 AND at >= $2 ORDER BY at, gpu_index")
            .bind(worker.get())
            .bind(since)
            .fetch_all(pool)
            .await?;
        rows.iter().map(sample_of).collect()
    })
}

/// Deletes up to `limit` samples older than `before`, oldest first; returns how many.
pub async fn prune(conn: impl Into<Conn<'_>>, before: i64, limit: u32) -> sqlx::Result<u64> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let done = sqlx::query(
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
pub fn sample_of(row: &impl DbRow) -> sqlx::Result<GpuSample> {
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
