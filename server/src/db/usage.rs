//! GPU time per user, kept as hourly sums (migrations/0011), with the job slots' time of jobs
//! without GPUs beside it (0017: the fair share counts it, the GPU figures do not): added when
//! an attempt's record is stored ([`add`], from `results::insert`), read as a few rows per user,
//! never by a pass over the results or the jobs.

use super::backend::{on_conn, on_pool, Conn, PoolRef};
use super::sql;
use shared::api::{JobId, SweepId};
use shared::fair_share::Charge;

const HOUR_MS: i64 = 3_600_000;

/// Adds what an attempt of `job` held (its record's [`Charge`]) to its owner's hour of `at`
/// (Unix ms): GPU time, or a job slot's time for an attempt without GPUs.
pub async fn add(conn: impl Into<Conn<'_>>, job: JobId, at: i64, charge: Charge) -> sql::Result<()> {
    let (gpu_seconds, slot_seconds) = match charge {
        Charge::Gpu(seconds) => (seconds, 0.0),
        Charge::Slot(seconds) => (0.0, seconds),
    };
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sql::query(
            "INSERT INTO user_gpu_usage (owner, hour_at, gpu_seconds, slot_seconds)
             SELECT owner, $2, $3, $4 FROM jobs WHERE id = $1
             ON CONFLICT (hour_at, owner) DO UPDATE SET gpu_seconds = user_gpu_usage.gpu_seconds + excluded.gpu_seconds,
               slot_seconds = user_gpu_usage.slot_seconds + excluded.slot_seconds",
        )
        .bind(job.get())
        .bind(at - at.rem_euclid(HOUR_MS))
        .bind(gpu_seconds)
        .bind(slot_seconds)
        .execute(&mut *conn)
        .await?;
        Ok(())
    })
}

/// The owner of `sweep`, if it is still there.
pub async fn owner_of_sweep(conn: impl Into<Conn<'_>>, sweep: SweepId) -> sql::Result<Option<String>> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sql::query_scalar("SELECT owner FROM sweeps WHERE id = $1").bind(sweep.get()).fetch_optional(&mut *conn).await
    })
}

/// Adds job slots' time held by `owner`'s jobs to their hour `hour_at` (Unix ms, on the hour):
/// the finish+claim steps' records, summed in memory (`queue::shares`).
pub async fn add_slots(conn: impl Into<Conn<'_>>, owner: &str, hour_at: i64, slot_seconds: f64) -> sql::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sql::query(
            "INSERT INTO user_gpu_usage (owner, hour_at, gpu_seconds, slot_seconds) VALUES ($1, $2, 0.0, $3)
             ON CONFLICT (hour_at, owner) DO UPDATE SET slot_seconds = user_gpu_usage.slot_seconds + excluded.slot_seconds",
        )
        .bind(owner)
        .bind(hour_at - hour_at.rem_euclid(HOUR_MS))
        .bind(slot_seconds)
        .execute(&mut *conn)
        .await?;
        Ok(())
    })
}

/// Adds the time `job`'s running attempt has held until `now` to its owner's hour of `now`:
/// its GPUs times its run time, or its job slot's run time when it holds no GPU. For an
/// attempt that ends without a record saying it (a preempted one).
pub async fn add_held(conn: impl Into<Conn<'_>>, job: JobId, now: i64) -> sql::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let gpus =
            engine.pick("coalesce(json_array_length(j.gpu_ids), 0)", "coalesce(json_array_length(j.gpu_ids::json), 0)");
        let sql = format!(
            "INSERT INTO user_gpu_usage (owner, hour_at, gpu_seconds, slot_seconds)
             SELECT j.owner, $2, CAST({gpus} * ($3 - j.started_at) AS DOUBLE PRECISION) / 1000.0,
                    CASE WHEN {gpus} = 0 THEN CAST($3 - j.started_at AS DOUBLE PRECISION) / 1000.0 ELSE 0.0 END
             FROM jobs j
             WHERE j.id = $1 AND j.status = 'running' AND j.started_at IS NOT NULL AND j.started_at < $3
             ON CONFLICT (hour_at, owner) DO UPDATE SET gpu_seconds = user_gpu_usage.gpu_seconds + excluded.gpu_seconds,
               slot_seconds = user_gpu_usage.slot_seconds + excluded.slot_seconds"
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
             FROM user_gpu_usage WHERE hour_at >= $2 GROUP BY owner
             HAVING sum(gpu_seconds) > 0 ORDER BY owner",
        )
        .bind(recent_from)
        .bind(longer_from)
        .fetch_all(pool)
        .await
    })
}
