//! `gpu_telemetry`: NVML readings carried by heartbeats, kept for a retention window.

use shared::api::{GpuSample, WorkerId};
use sqlx::{QueryBuilder, Row, Sqlite, SqliteConnection, SqlitePool};

/// Samples per INSERT (9 bound values each).
const SAMPLES_PER_STATEMENT: usize = 2_000;

/// Stores `samples` of `worker` as read at `at`.
pub async fn insert(conn: &mut SqliteConnection, worker: WorkerId, at: i64, samples: &[GpuSample]) -> sqlx::Result<()> {
    for chunk in samples.chunks(SAMPLES_PER_STATEMENT) {
        let mut query: QueryBuilder<Sqlite> = QueryBuilder::new(
            "INSERT INTO gpu_telemetry (worker_id, at, gpu_index, uuid, name, memory_total, memory_used,
                                        utilization, temperature, power_watts) ",
        );
        query.push_values(chunk, |mut row, sample| {
            row.push_bind(worker.get())
                .push_bind(at)
                .push_bind(sample.index)
                .push_bind(sample.uuid.as_str())
                .push_bind(sample.name.as_str())
                .push_bind(sample.memory_total.min(i64::MAX as u64) as i64)
                .push_bind(sample.memory_used.min(i64::MAX as u64) as i64)
                .push_bind(sample.utilization)
                .push_bind(sample.temperature)
                // JSON cannot carry NaN, but a reading could still be infinite after a division.
                .push_bind(sample.power_watts.filter(|watts| watts.is_finite()));
        });
        query.build().execute(&mut *conn).await?;
    }
    Ok(())
}

/// Samples of `worker` taken at or after `since`, oldest first.
pub async fn list(pool: &SqlitePool, worker: WorkerId, since: i64) -> sqlx::Result<Vec<GpuSample>> {
    let rows = sqlx::query("SELECT * FROM gpu_telemetry WHERE worker_id = ? AND at >= ? ORDER BY at, gpu_index")
        .bind(worker.get())
        .bind(since)
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|row| {
            Ok(GpuSample {
                index: row.try_get("gpu_index")?,
                uuid: row.try_get("uuid")?,
                name: row.try_get("name")?,
                memory_total: row.try_get::<i64, _>("memory_total")? as u64,
                memory_used: row.try_get::<i64, _>("memory_used")? as u64,
                utilization: row.try_get("utilization")?,
                temperature: row.try_get("temperature")?,
                power_watts: row.try_get("power_watts")?,
                at: row.try_get("at")?,
            })
        })
        .collect()
}

/// Deletes up to `limit` samples older than `before`, oldest first; returns how many.
pub async fn prune(conn: &mut SqliteConnection, before: i64, limit: u32) -> sqlx::Result<u64> {
    let done = sqlx::query(
        "DELETE FROM gpu_telemetry WHERE rowid IN (SELECT rowid FROM gpu_telemetry WHERE at < ? ORDER BY at LIMIT ?)",
    )
    .bind(before)
    .bind(limit)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}
