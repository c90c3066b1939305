//! Preemptions (issue 29, item 3; migration 0014): the order on a running attempt, which its
//! worker's heartbeats carry (`db::jobs::extend_leases`), the reason its requeue records, and
//! the log of every order (`preemptions`).

use super::backend::{on_conn, on_pool, Conn, DbRow, PoolRef};
use super::sql;
use shared::api::JobId;

/// Orders the preemption of `job`'s running `attempt`, saying `reason`, at `now`; false (and
/// nothing changed) when it is not running as that attempt, a cancel is pending, or it was
/// ordered already.
pub async fn order(conn: impl Into<Conn<'_>>, job: JobId, attempt: u32, reason: &str, now: i64) -> sql::Result<bool> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let ordered = sql::query(
            "UPDATE jobs SET preempt_attempt = $2, preempt_reason = $3
             WHERE id = $1 AND status = 'running' AND attempt = $2 AND cancel_requested = 0
               AND (preempt_attempt IS NULL OR preempt_attempt <> $2)",
        )
        .bind(job.get())
        .bind(i64::from(attempt))
        .bind(reason)
        .execute(&mut *conn)
        .await?
        .rows_affected()
            == 1;
        if ordered {
            sql::query("INSERT INTO preemptions (job_id, attempt, at, reason) VALUES ($1, $2, $3, $4)")
                .bind(job.get())
                .bind(i64::from(attempt))
                .bind(now)
                .bind(reason)
                .execute(&mut *conn)
                .await?;
        }
        Ok(ordered)
    })
}

/// Why `job`'s `attempt` was preempted (if an order said), and whose the job is.
pub async fn reason_of(
    conn: impl Into<Conn<'_>>,
    job: JobId,
    attempt: u32,
) -> sql::Result<Option<(Option<String>, String)>> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sql::query_as("SELECT CASE WHEN preempt_attempt = $2 THEN preempt_reason END, owner FROM jobs WHERE id = $1")
            .bind(job.get())
            .bind(i64::from(attempt))
            .fetch_optional(&mut *conn)
            .await
    })
}

/// A running job as the scheduler's passes read it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunningJob {
    pub id: JobId,
    pub attempt: u32,
    pub owner: String,
    pub worker: Option<i64>,
    /// The GPU indices it holds on its worker.
    pub gpu_ids: Vec<u32>,
    pub started_at: i64,
    /// Its sweep's `timeout`, in seconds.
    pub timeout_secs: Option<u64>,
    /// Its sweep's `preemptible` key, if the sweep said.
    pub preemptible: Option<bool>,
    /// It has stored a checkpoint (any attempt).
    pub checkpointed: bool,
    /// When its running attempt stored its last checkpoint (Unix ms), if it has.
    pub checkpointed_at: Option<i64>,
    /// When its running attempt last saved one, as its worker saw it, and the time between
    /// its last two saves.
    pub saved_at: Option<i64>,
    pub save_every: Option<i64>,
    /// Its sweep's priority class value.
    pub class: i64,
    /// Its running attempt was ordered to stop already.
    pub ordered: bool,
    /// When it was preempted since `since` (Unix ms).
    pub preempted_at: Vec<i64>,
}

/// Every running job, with its preemptions since `since` (Unix ms).
pub async fn running(pool: impl Into<PoolRef<'_>>, since: i64) -> anyhow::Result<Vec<RunningJob>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let hint = engine.pick(" INDEXED BY jobs_running_by_lease", "");
        let rows = sql::query(&format!(
            "SELECT j.id, j.attempt, j.owner, j.worker_id, j.gpu_ids, j.started_at, j.timeout_secs, s.preemptible,
                    s.class_value,
                    EXISTS (SELECT 1 FROM checkpoints c WHERE c.job_id = j.id) AS checkpointed,
                    (SELECT c.uploaded_at FROM checkpoints c WHERE c.job_id = j.id AND c.attempt = j.attempt)
                        AS checkpointed_at,
                    v.saved_at, v.every_ms,
                    j.preempt_attempt
             FROM jobs j{hint} JOIN sweeps s ON s.id = j.sweep_id
                 LEFT JOIN job_saves v ON v.job_id = j.id AND v.attempt = j.attempt
             WHERE j.status = 'running'"
        ))
        .fetch_all(pool)
        .await?;
        let recent: Vec<(i64, i64)> = sql::query_as(
            "SELECT p.job_id, p.at FROM preemptions p JOIN jobs j ON j.id = p.job_id
             WHERE j.status = 'running' AND p.at >= $1",
        )
        .bind(since)
        .fetch_all(pool)
        .await?;
        rows.iter()
            .map(|row| {
                let id: i64 = row.get_as("id")?;
                let attempt: i64 = row.get_as("attempt")?;
                let gpu_ids: Vec<u32> = match row.get_as::<Option<String>>("gpu_ids")? {
                    Some(text) => serde_json::from_str(&text)?,
                    None => Vec::new(),
                };
                Ok(RunningJob {
                    id: JobId::new(id),
                    attempt: attempt.clamp(0, i64::from(u32::MAX)) as u32,
                    owner: row.get_as("owner")?,
                    worker: row.get_as("worker_id")?,
                    gpu_ids,
                    started_at: row.get_as::<Option<i64>>("started_at")?.unwrap_or(0),
                    timeout_secs: row.get_as::<Option<i64>>("timeout_secs")?.map(|secs| secs.max(0) as u64),
                    preemptible: row.get_as::<Option<i64>>("preemptible")?.map(|flag| flag != 0),
                    checkpointed: row.get_as("checkpointed")?,
                    checkpointed_at: row.get_as("checkpointed_at")?,
                    saved_at: row.get_as("saved_at")?,
                    save_every: row.get_as("every_ms")?,
                    class: row.get_as("class_value")?,
                    ordered: row.get_as::<Option<i64>>("preempt_attempt")? == Some(attempt),
                    preempted_at: recent.iter().filter(|(job, _)| *job == id).map(|(_, at)| *at).collect(),
                })
            })
            .collect()
    })
}

/// The owner and name of `job`'s sweep.
pub async fn sweep_of(pool: impl Into<PoolRef<'_>>, job: JobId) -> sql::Result<Option<(String, String)>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        sql::query_as("SELECT s.owner, s.name FROM jobs j JOIN sweeps s ON s.id = j.sweep_id WHERE j.id = $1")
            .bind(job.get())
            .fetch_optional(pool)
            .await
    })
}

/// Preemptions ordered, by sweep (all time), for `app status` and `/metrics`.
pub async fn counts_by_sweep(pool: impl Into<PoolRef<'_>>) -> sql::Result<Vec<(shared::api::SweepId, u64)>> {
    let pool = pool.into();
    let rows: Vec<(i64, i64)> = on_pool!(pool, |pool, engine| {
        sql::query_as(
            "SELECT j.sweep_id, count(*) FROM preemptions p JOIN jobs j ON j.id = p.job_id GROUP BY j.sweep_id",
        )
        .fetch_all(pool)
        .await
    })?;
    Ok(rows.into_iter().map(|(sweep, count)| (shared::api::SweepId::new(sweep), count.max(0) as u64)).collect())
}
