//! What a fair-share claim reads (issue 29, item 2; decision 0077): the users with claimable
//! jobs, what each one's running jobs hold, and a user's decayed GPU time. The decisions are
//! `shared::fair_share`'s; a user's own queue is `db::claims::queued_candidates` for an owner.

use super::backend::{on_conn, on_pool, Conn, PoolRef};
use super::claims::CLAIMABLE;
use super::sql;
use shared::fair_share::Held;

/// The users with claimable jobs, by name: one step of the owners' queue index per user (a
/// loose scan), however many jobs each has queued.
pub async fn waiting_owners(conn: impl Into<Conn<'_>>) -> sql::Result<Vec<String>> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let hint = engine.pick(" INDEXED BY jobs_queue_by_owner", "");
        let sql = format!(
            "WITH RECURSIVE waiting(owner) AS (
                 SELECT (SELECT owner FROM jobs{hint} WHERE {CLAIMABLE} ORDER BY owner LIMIT 1)
                 UNION ALL
                 SELECT (SELECT owner FROM jobs{hint} WHERE {CLAIMABLE} AND owner > waiting.owner ORDER BY owner LIMIT 1)
                 FROM waiting WHERE waiting.owner IS NOT NULL
             )
             SELECT owner FROM waiting WHERE owner IS NOT NULL"
        );
        let rows: Vec<(String,)> = sql::query_as(&sql).fetch_all(&mut *conn).await?;
        Ok(rows.into_iter().map(|(owner,)| owner).collect())
    })
}

/// What one user's running jobs hold, and the GPU-seconds they have run so far (a job without
/// GPUs counting as one GPU), at `now` (Unix ms), each job counting at least
/// `shared::fair_share::START_CHARGE_SECS` (as it did in the batch that started it).
#[derive(Debug, Clone, PartialEq)]
pub struct Holding {
    pub owner: String,
    pub held: Held,
    pub running_secs: f64,
}

/// [`Holding`] of every user with running jobs, by name.
pub async fn holdings(conn: impl Into<Conn<'_>>, now: i64) -> sql::Result<Vec<Holding>> {
    let least = (shared::fair_share::START_CHARGE_SECS * 1000.0) as i64;
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let (hint, gpus, larger) = engine.pick(
            (" INDEXED BY jobs_running_by_lease", "json_array_length(coalesce(gpu_ids, '[]'))", "max"),
            ("", "json_array_length(coalesce(gpu_ids, '[]')::json)", "greatest"),
        );
        let sql = format!(
            "SELECT owner, count(*), sum({gpus}),
                    CAST(sum({larger}({gpus}, 1) * {larger}($1 - coalesce(started_at, $1), $2)) AS DOUBLE PRECISION) / 1000.0
             FROM jobs{hint} WHERE status = 'running' GROUP BY owner ORDER BY owner"
        );
        let rows: Vec<(String, i64, i64, f64)> =
            sql::query_as(&sql).bind(now).bind(least).fetch_all(&mut *conn).await?;
        Ok(rows
            .into_iter()
            .map(|(owner, running, gpus, running_secs)| Holding {
                owner,
                held: Held {
                    gpus: gpus.clamp(0, u32::MAX as i64) as u32,
                    running: running.clamp(0, u32::MAX as i64) as u32,
                },
                running_secs,
            })
            .collect())
    })
}

const HOUR_MS: i64 = 3_600_000;

/// Each user's recorded GPU time and CPU jobs' slot time (`user_gpu_usage`) as it counts at
/// `now` (Unix ms): halved
/// every `half_life_secs`. Read summed over spans of a sixteenth of the half-life (an hour at
/// least), each aged from its middle (within 3% of hour by hour: 30 users' 70 days are 840
/// rows, not 50,000); spans older than 10 half-lives (under a thousandth) are not read.
pub async fn decayed_usage(
    pool: impl Into<PoolRef<'_>>,
    now: i64,
    half_life_secs: f64,
) -> sql::Result<Vec<(String, f64)>> {
    let pool = pool.into();
    let half_life_ms = (half_life_secs * 1000.0).clamp(1.0, (i64::MAX / 64) as f64) as i64;
    let span = (half_life_ms / 16 / HOUR_MS).max(1) * HOUR_MS;
    let rows: Vec<(String, i64, f64)> = on_pool!(pool, |pool, engine| {
        sql::query_as(
            "SELECT owner, span_at, CAST(sum(held) AS DOUBLE PRECISION) FROM (
                 SELECT owner, hour_at - hour_at % $1 AS span_at, gpu_seconds + slot_seconds AS held
                 FROM user_gpu_usage WHERE hour_at >= $2
             ) AS recent GROUP BY owner, span_at",
        )
        .bind(span)
        .bind(now.saturating_sub(half_life_ms.saturating_mul(10)))
        .fetch_all(pool)
        .await
    })?;
    let mut by_owner: std::collections::BTreeMap<String, f64> = std::collections::BTreeMap::new();
    for (owner, span_at, seconds) in rows {
        let age = (now - span_at - span / 2) as f64 / 1000.0;
        *by_owner.entry(owner).or_default() += shared::fair_share::decay(seconds, age, half_life_secs);
    }
    Ok(by_owner.into_iter().collect())
}

/// The advisory lock that orders claims under quotas on PostgreSQL.
const QUOTA_LOCK: i64 = 0x6170_705f_7175_6f74; // "app_quot"

/// On PostgreSQL, waits for the other replicas' claims under quotas to commit and holds them
/// off until this transaction ends, so that what a user holds, read next, stays true until
/// the claim is written; SQLite's single writer already does.
pub async fn lock_quotas(conn: impl Into<Conn<'_>>) -> sql::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        if engine == super::backend::Engine::Postgres {
            sql::query("SELECT pg_advisory_xact_lock($1)").bind(QUOTA_LOCK).execute(&mut *conn).await?;
        }
        Ok(())
    })
}

/// The owner of a job (its sweep's, kept on the job: migrations/0013).
pub async fn owner_of(pool: impl Into<PoolRef<'_>>, job: shared::api::JobId) -> sql::Result<Option<String>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        sql::query_scalar("SELECT owner FROM jobs WHERE id = $1").bind(job.get()).fetch_optional(pool).await
    })
}
