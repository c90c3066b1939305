//! GPU time per user, kept as hourly sums (migrations/0011): added when an attempt's record is
//! stored ([`add`], from `results::insert`), read as a few rows per user, never by a pass over
//! the results or the jobs.

use super::backend::{on_conn, on_pool, Conn, PoolRef};
use super::sql;
use shared::api::JobId;

const HOUR_MS: i64 = 3_600_000;

/// Adds `gpu_seconds` that an attempt of `job` held to its sweep owner's hour of `at` (Unix ms).
pub async fn add(conn: impl Into<Conn<'_>>, job: JobId, at: i64, gpu_seconds: f64) -> sql::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sql::query(
            "INSERT INTO user_gpu_usage (owner, hour_at, gpu_seconds)
             SELECT s.owner, $2, $3 FROM jobs j JOIN sweeps s ON s.id = j.sweep_id WHERE j.id = $1
             ON CONFLICT (hour_at, owner) DO UPDATE SET gpu_seconds = user_gpu_usage.gpu_seconds + excluded.gpu_seconds",
        )
        .bind(job.get())
        .bind(at - at.rem_euclid(HOUR_MS))
        .bind(gpu_seconds)
        .execute(&mut *conn)
        .await?;
        Ok(())
    })
}

/// Adds the GPU time `job`'s running attempt has held until `now` (its GPUs times its run time)
/// to its owner's hour of `now`: for an attempt that ends without a record saying it (a
/// preempted one). Nothing for an attempt without GPUs.
pub async fn add_held(conn: impl Into<Conn<'_>>, job: JobId, now: i64) -> sql::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let gpus = engine.pick("json_array_length(j.gpu_ids)", "json_array_length(j.gpu_ids::json)");
        let sql = format!(
            "INSERT INTO user_gpu_usage (owner, hour_at, gpu_seconds)
             SELECT j.owner, $2, CAST({gpus} * ($3 - j.started_at) AS DOUBLE PRECISION) / 1000.0 FROM jobs j
             WHERE j.id = $1 AND j.status = 'running' AND j.started_at IS NOT NULL AND j.gpu_ids IS NOT NULL
               AND {gpus} > 0
             ON CONFLICT (hour_at, owner) DO UPDATE SET gpu_seconds = user_gpu_usage.gpu_seconds + excluded.gpu_seconds"
        );
        sql::query(&sql).bind(job.get()).bind(now - now.rem_euclid(HOUR_MS)).bind(now).execute(&mut *conn).await?;
        Ok(())
    })
}

/// GPU-seconds per owner over the last `recent` and the last `longer` (the hour `now` is in
/// counting as one of them): `(owner, recent, longer)`, by owner, for owners with any in `longer`.
pub async fn gpu_seconds_by_owner(
    pool: impl Into<PoolRef<'_>>,
    now: i64,
    (recent_hours, longer_hours): (i64, i64),
) -> sql::Result<Vec<(String, f64, f64)>> {
    let pool = pool.into();
    let hour = now - now.rem_euclid(HOUR_MS);
    let (recent_from, longer_from) = (hour - (recent_hours - 1) * HOUR_MS, hour - (longer_hours - 1) * HOUR_MS);
    on_pool!(pool, |pool, engine| {
        sql::query_as(
            "SELECT owner, sum(CASE WHEN hour_at >= $1 THEN gpu_seconds ELSE 0.0 END), sum(gpu_seconds)
             FROM user_gpu_usage WHERE hour_at >= $2 GROUP BY owner ORDER BY owner",
        )
        .bind(recent_from)
        .bind(longer_from)
        .fetch_all(pool)
        .await
    })
}
