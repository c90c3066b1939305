//! `jobs`: the guarded state changes of the job lifecycle and the reads they decide on (the
//! API's and the page's read of jobs is `job_pages`).
//!
//! Every state change is one UPDATE guarded by the state it expects (`WHERE id = ? AND
//! status = ? AND attempt = ?`); callers check `rows_affected` (or the returned rows) to learn
//! whether it applied. The `jobs_record_transition` trigger writes the history.

use super::backend::{on_conn, on_pool, Conn, DbRow, PoolRef};
use super::sql;
use shared::api::{JobAttempt, JobId, SweepId, WorkerId};
use shared::job::{Finish, JobStatus, LeaseExpiry};
use shared::sweep::Resources;

pub(super) fn status_of(row: &impl DbRow) -> anyhow::Result<JobStatus> {
    let text: String = row.get_as("status")?;
    text.parse().map_err(anyhow::Error::msg)
}

pub fn resources_of(row: &impl DbRow) -> sql::Result<Resources> {
    Ok(Resources {
        gpus: row.opt_u32_at("gpus")?,
        gpu_memory: row.get_as::<Option<i64>>("gpu_memory")?.map(|bytes| bytes as u64),
        exclusive: row.opt_flag_at("exclusive")?,
        trainer: row.flag_at("needs_trainer")?,
    })
}

/// The `gpu_ids` column (a JSON array, NULL before the first claim).
pub fn gpu_ids_of(row: &impl DbRow) -> anyhow::Result<Vec<u32>> {
    let text: Option<String> = row.get_as("gpu_ids")?;
    Ok(text.as_deref().map(serde_json::from_str).transpose()?.unwrap_or_default())
}

/// What a result version records of its job: the sweep's name, the index and the params.
#[derive(Debug, Clone)]
pub struct ResultSource {
    pub sweep: String,
    pub index: u64,
    pub params: serde_json::Value,
    /// Whether `attempt` had metric summaries when this was read: a finish that sends no
    /// metrics of its own then needs no second read for the version's summaries.
    pub has_metrics: bool,
}

/// A job's state with what its result version of `attempt` records, in one read (the finish
/// of an attempt needs both).
pub async fn state_for_result(
    conn: impl Into<Conn<'_>>,
    id: JobId,
    attempt: u32,
) -> anyhow::Result<Option<(JobState, ResultSource)>> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let columns = STATE_COLUMNS.split(", ").map(|column| format!("j.{column}")).collect::<Vec<_>>().join(", ");
        let row = sql::query(&format!(
            "SELECT {columns}, s.name AS sweep_name, j.idx, j.params,
                EXISTS (SELECT 1 FROM job_metric_summaries m WHERE m.job_id = j.id AND m.attempt = $2) AS has_metrics
         FROM jobs j JOIN sweeps s ON s.id = j.sweep_id WHERE j.id = $1"
        ))
        .bind(id.get())
        .bind(i64::from(attempt))
        .fetch_optional(&mut *conn)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let params: String = row.get_as("params")?;
        let source = ResultSource {
            sweep: row.get_as("sweep_name")?,
            index: row.get_as::<i64>("idx")? as u64,
            params: serde_json::from_str(&params)?,
            has_metrics: row.get_as("has_metrics")?,
        };
        Ok(Some((state_from_row(&row)?, source)))
    })
}

/// The fields a state change decides on.
#[derive(Debug, Clone)]
pub struct JobState {
    pub id: JobId,
    pub sweep_id: SweepId,
    pub status: JobStatus,
    pub attempt: u32,
    pub worker_id: Option<WorkerId>,
    pub retries_left: u32,
    pub crash_count: u32,
    pub cancel_requested: bool,
}

#[cfg(test)]
impl JobState {
    /// Attempt `attempt` of job `id` (sweep `sweep`) running on worker 1, no retries, no cancel.
    pub fn running_on_worker_1(id: i64, sweep: i64, attempt: u32) -> JobState {
        JobState {
            id: JobId::new(id),
            sweep_id: SweepId::new(sweep),
            status: JobStatus::Running,
            attempt,
            worker_id: Some(WorkerId::new(1)),
            retries_left: 0,
            crash_count: 0,
            cancel_requested: false,
        }
    }
}

fn state_from_row(row: &impl DbRow) -> anyhow::Result<JobState> {
    Ok(JobState {
        id: JobId::new(row.get_as("id")?),
        sweep_id: SweepId::new(row.get_as("sweep_id")?),
        status: status_of(row)?,
        attempt: row.u32_at("attempt")?,
        worker_id: row.get_as::<Option<i64>>("worker_id")?.map(WorkerId::new),
        retries_left: row.u32_at("retries_left")?,
        crash_count: row.u32_at("crash_count")?,
        cancel_requested: row.flag_at("cancel_requested")?,
    })
}

const STATE_COLUMNS: &str = "id, sweep_id, status, attempt, worker_id, retries_left, crash_count, cancel_requested";

pub async fn state(conn: impl Into<Conn<'_>>, id: JobId) -> anyhow::Result<Option<JobState>> {
    read_state(conn.into(), id, false).await
}

/// [`state`], the row locked until the transaction ends on PostgreSQL (where replicas write
/// side by side; SQLite's single writer needs no lock): a unit that decides on it, such as a
/// batch of metrics checking its offset, is not raced by the same batch sent to another
/// replica, which waits and then reads what this one wrote.
pub async fn state_for_update(conn: impl Into<Conn<'_>>, id: JobId) -> anyhow::Result<Option<JobState>> {
    read_state(conn.into(), id, true).await
}

async fn read_state(mut conn: Conn<'_>, id: JobId, lock: bool) -> anyhow::Result<Option<JobState>> {
    on_conn!(conn, |conn, engine| {
        let lock = if lock { engine.pick("", " FOR NO KEY UPDATE") } else { "" };
        let row = sql::query(&format!("SELECT {STATE_COLUMNS} FROM jobs WHERE id = $1{lock}"))
            .bind(id.get())
            .fetch_optional(&mut *conn)
            .await?;
        row.as_ref().map(state_from_row).transpose()
    })
}

/// Running jobs whose lease ran out before `now`.
pub async fn expired(conn: impl Into<Conn<'_>>, now: i64) -> anyhow::Result<Vec<JobState>> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let hint = engine.pick(" INDEXED BY jobs_running_by_lease", "");
        let rows = sql::query(&format!(
            "SELECT {STATE_COLUMNS} FROM jobs{hint}
             WHERE status = 'running' AND lease_expires_at < $1"
        ))
        .bind(now)
        .fetch_all(&mut *conn)
        .await?;
        rows.iter().map(state_from_row).collect()
    })
}

/// When the first lease of a running job runs out, if any job runs.
pub async fn earliest_lease(pool: impl Into<PoolRef<'_>>) -> sql::Result<Option<i64>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        sql::query_scalar(engine.pick(
            "SELECT min(lease_expires_at) FROM jobs INDEXED BY jobs_running_by_lease WHERE status = 'running'",
            "SELECT min(lease_expires_at) FROM jobs WHERE status = 'running'",
        ))
        .fetch_one(pool)
        .await
    })
}

/// Running jobs the server believes `worker_id` holds.
pub async fn running_on(conn: impl Into<Conn<'_>>, worker_id: WorkerId) -> anyhow::Result<Vec<JobState>> {
    read_running_on(conn.into(), worker_id, None).await
}

/// [`running_on`], only the attempts started before `started_before`.
pub async fn running_on_since(
    conn: impl Into<Conn<'_>>,
    worker_id: WorkerId,
    started_before: i64,
) -> anyhow::Result<Vec<JobState>> {
    read_running_on(conn.into(), worker_id, Some(started_before)).await
}

async fn read_running_on(
    mut conn: Conn<'_>,
    worker_id: WorkerId,
    started_before: Option<i64>,
) -> anyhow::Result<Vec<JobState>> {
    on_conn!(conn, |conn, engine| {
        let hint = engine.pick(" INDEXED BY jobs_running_by_worker", "");
        let since = if started_before.is_some() { " AND started_at < $2" } else { "" };
        let sql = format!("SELECT {STATE_COLUMNS} FROM jobs{hint} WHERE status = 'running' AND worker_id = $1{since}");
        let mut query = sql::query(&sql).bind(worker_id.get());
        if let Some(before) = started_before {
            query = query.bind(before);
        }
        let rows = query.fetch_all(&mut *conn).await?;
        rows.iter().map(state_from_row).collect()
    })
}

/// The resources a queued job of the sweep asks for (every job of a sweep asks the same).
pub async fn queued_resources_of_sweep(
    pool: impl Into<PoolRef<'_>>,
    sweep_id: SweepId,
) -> sql::Result<Option<Resources>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let row = sql::query(
            "SELECT gpus, gpu_memory, exclusive, needs_trainer FROM jobs
         WHERE sweep_id = $1 AND status = 'queued' LIMIT 1",
        )
        .bind(sweep_id.get())
        .fetch_optional(pool)
        .await?;
        row.as_ref().map(resources_of).transpose()
    })
}

/// The guarded finish of an attempt: `$1` status, `$2` retries left, `$3` exit code, `$4`
/// reason, `$5` terminal, `$6` now; the guard: `$7` id, `$8` attempt, `$9` worker, `$10`
/// retries left, `$11` cancel flag, and with `$12` no metric summaries of the attempt (for a
/// finish that stores a version made without them).
const FINISH_SQL: &str =
    "UPDATE jobs SET status = $1, retries_left = $2, exit_code = $3, reason = $4, lease_expires_at = NULL,
            finished_at = CASE WHEN $5 THEN $6 ELSE NULL END,
            worker_id = CASE WHEN $1 = 'queued' THEN NULL ELSE worker_id END,
            gpu_ids = CASE WHEN $1 = 'queued' THEN NULL ELSE gpu_ids END,
            started_at = CASE WHEN $1 = 'queued' THEN NULL ELSE started_at END
     WHERE id = $7 AND status = 'running' AND attempt = $8 AND worker_id = $9
       AND retries_left = $10 AND cancel_requested = $11
       AND NOT ($12 AND EXISTS (SELECT 1 FROM job_metric_summaries m WHERE m.job_id = $7 AND m.attempt = $8))";

/// Applies a reported outcome to the attempt `(id, attempt)` running on `worker_id`; whether it
/// applied. The decision was made on `seen` (its retries and cancel flag are part of the guard:
/// a cancel that lands between the read and this write makes it change nothing). With
/// `unless_metrics`, it applies only while the attempt has no metric summaries.
pub async fn finish(
    conn: impl Into<Conn<'_>>,
    seen: &JobState,
    worker_id: WorkerId,
    decision: &Finish,
    now: i64,
    unless_metrics: bool,
) -> sql::Result<bool> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let done = sql::query(FINISH_SQL)
            .bind(decision.status.as_str())
            .bind(decision.retries_left)
            .bind(decision.exit_code)
            .bind(decision.reason.as_deref())
            .bind(decision.status.is_terminal())
            .bind(now)
            .bind(seen.id.get())
            .bind(seen.attempt)
            .bind(worker_id.get())
            .bind(seen.retries_left)
            .bind(i64::from(seen.cancel_requested))
            .bind(unless_metrics)
            .execute(&mut *conn)
            .await?;
        Ok(done.rows_affected() == 1)
    })
}

/// Gives every running job a full lease from `until`: after a server restart, workers get a
/// lease's time to reconnect before the reaper counts their jobs as lost.
pub async fn extend_running_leases(conn: impl Into<Conn<'_>>, until: i64) -> sql::Result<u64> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let done = sql::query(engine.pick(
            "UPDATE jobs SET lease_expires_at = max(coalesce(lease_expires_at, 0), $1) WHERE status = 'running'",
            "UPDATE jobs SET lease_expires_at = greatest(coalesce(lease_expires_at, 0), $1) WHERE status = 'running'",
        ))
        .bind(until)
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected())
    })
}

/// Applies a lease expiry decision to the attempt `(id, attempt)` if it is still running.
pub async fn expire(
    conn: impl Into<Conn<'_>>,
    attempt: JobAttempt,
    decision: &LeaseExpiry,
    now: i64,
) -> sql::Result<bool> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let done = sql::query(
            "UPDATE jobs SET status = $1, crash_count = $2, reason = $3, lease_expires_at = NULL,
                finished_at = CASE WHEN $4 THEN $5 ELSE NULL END,
                worker_id = CASE WHEN $1 = 'queued' THEN NULL ELSE worker_id END,
                gpu_ids = CASE WHEN $1 = 'queued' THEN NULL ELSE gpu_ids END,
                started_at = CASE WHEN $1 = 'queued' THEN NULL ELSE started_at END
         WHERE id = $6 AND status = 'running' AND attempt = $7",
        )
        .bind(decision.status.as_str())
        .bind(i64::from(decision.crash_count))
        .bind(decision.reason)
        .bind(decision.status.is_terminal())
        .bind(now)
        .bind(attempt.job_id.get())
        .bind(i64::from(attempt.attempt))
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected() == 1)
    })
}

/// A running attempt whose lease a heartbeat extended, and what its worker is to do with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseHeld {
    pub attempt: JobAttempt,
    /// A user cancelled it: kill it.
    pub cancel: bool,
    /// It was preempted: stop it within the preemption's grace (`db::preemptions`).
    pub preempt: bool,
}

/// Extends the leases of the listed attempts that `worker_id` really holds; returns those
/// attempts with their cancel and preemption flags.
pub async fn extend_leases(
    conn: impl Into<Conn<'_>>,
    worker_id: WorkerId,
    attempts: &[JobAttempt],
    lease_until: i64,
) -> anyhow::Result<Vec<LeaseHeld>> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        if attempts.is_empty() {
            return Ok(Vec::new());
        }
        let pairs =
            serde_json::to_string(&attempts.iter().map(|a| [a.job_id.get(), a.attempt as i64]).collect::<Vec<_>>())?;
        let rows = sql::query(engine.pick(
            "UPDATE jobs SET lease_expires_at = $1
         WHERE status = 'running' AND worker_id = $2
           AND (id, attempt) IN (SELECT value ->> 0, value ->> 1 FROM json_each($3))
         RETURNING id, attempt, cancel_requested, CAST(CASE WHEN preempt_attempt = attempt THEN 1 ELSE 0 END AS BIGINT) AS preempt",
            "UPDATE jobs SET lease_expires_at = $1
         WHERE status = 'running' AND worker_id = $2
           AND (id, attempt) IN (SELECT (value ->> 0)::bigint, (value ->> 1)::bigint
                                 FROM jsonb_array_elements($3::jsonb) AS e(value))
         RETURNING id, attempt, cancel_requested, CAST(CASE WHEN preempt_attempt = attempt THEN 1 ELSE 0 END AS BIGINT) AS preempt",
        ))
        .bind(lease_until)
        .bind(worker_id.get())
        .bind(pairs)
        .fetch_all(&mut *conn)
        .await?;
        rows.iter()
            .map(|row| {
                let attempt = JobAttempt { job_id: JobId::new(row.get_as("id")?), attempt: row.u32_at("attempt")? };
                Ok(LeaseHeld { attempt, cancel: row.flag_at("cancel_requested")?, preempt: row.flag_at("preempt")? })
            })
            .collect()
    })
}

/// `queued -> cancelled`.
pub async fn cancel_queued(conn: impl Into<Conn<'_>>, id: JobId, now: i64) -> sql::Result<bool> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let done = sql::query(
            "UPDATE jobs SET status = 'cancelled', reason = 'cancelled', finished_at = $1
         WHERE id = $2 AND status = 'queued'",
        )
        .bind(now)
        .bind(id.get())
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected() == 1)
    })
}

/// Flags a running attempt for its worker to kill.
pub async fn request_cancel(conn: impl Into<Conn<'_>>, attempt: JobAttempt) -> sql::Result<bool> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let done =
            sql::query("UPDATE jobs SET cancel_requested = 1 WHERE id = $1 AND status = 'running' AND attempt = $2")
                .bind(attempt.job_id.get())
                .bind(i64::from(attempt.attempt))
                .execute(&mut *conn)
                .await?;
        Ok(done.rows_affected() == 1)
    })
}

/// Cancels a whole sweep: queued jobs now, running ones flagged. Returns the ids of the jobs
/// cancelled now and how many running ones were flagged.
pub async fn cancel_sweep(conn: impl Into<Conn<'_>>, sweep_id: SweepId, now: i64) -> sql::Result<(Vec<JobId>, u64)> {
    let mut conn = conn.into();
    super::sweep_jobs::complete(&mut conn, sweep_id).await?;
    on_conn!(conn, |conn, engine| {
        let cancelled: Vec<i64> = sql::query_scalar(
            "UPDATE jobs SET status = 'cancelled', reason = 'cancelled', finished_at = $1
         WHERE sweep_id = $2 AND status = 'queued' RETURNING id",
        )
        .bind(now)
        .bind(sweep_id.get())
        .fetch_all(&mut *conn)
        .await?;
        let requested = sql::query(
            "UPDATE jobs SET cancel_requested = 1 WHERE sweep_id = $1 AND status = 'running' AND cancel_requested = 0",
        )
        .bind(sweep_id.get())
        .execute(&mut *conn)
        .await?
        .rows_affected();
        Ok((cancelled.into_iter().map(JobId::new).collect(), requested))
    })
}

/// Cancels the sweep's queued jobs with `reason` (its running ones go on); their ids.
pub async fn cancel_queued_of_sweep(
    conn: impl Into<Conn<'_>>,
    sweep_id: SweepId,
    reason: &str,
    now: i64,
) -> sql::Result<Vec<JobId>> {
    let mut conn = conn.into();
    super::sweep_jobs::complete(&mut conn, sweep_id).await?;
    on_conn!(conn, |conn, engine| {
        let cancelled: Vec<i64> = sql::query_scalar(
            "UPDATE jobs SET status = 'cancelled', reason = $1, finished_at = $2
         WHERE sweep_id = $3 AND status = 'queued' RETURNING id",
        )
        .bind(reason)
        .bind(now)
        .bind(sweep_id.get())
        .fetch_all(&mut *conn)
        .await?;
        Ok(cancelled.into_iter().map(JobId::new).collect())
    })
}

/// Cancels the listed jobs: queued ones now, running ones flagged for their worker. Returns
/// the ids of each kind; the others (finished, unknown) are untouched.
pub async fn cancel_many(
    conn: impl Into<Conn<'_>>,
    ids: &[JobId],
    now: i64,
) -> anyhow::Result<(Vec<JobId>, Vec<JobId>)> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let ids = serde_json::to_string(ids)?;
        let cancelled: Vec<i64> = sql::query_scalar(&format!(
            "UPDATE jobs SET status = 'cancelled', reason = 'cancelled', finished_at = $1
         WHERE status = 'queued' AND id IN (SELECT {}) RETURNING id",
            engine.json_ids(2)
        ))
        .bind(now)
        .bind(&ids)
        .fetch_all(&mut *conn)
        .await?;
        let requested: Vec<i64> = sql::query_scalar(&format!(
            "UPDATE jobs SET cancel_requested = 1
         WHERE status = 'running' AND id IN (SELECT {}) RETURNING id",
            engine.json_ids(1)
        ))
        .bind(&ids)
        .fetch_all(&mut *conn)
        .await?;
        let typed = |ids: Vec<i64>| -> Vec<JobId> { ids.into_iter().map(JobId::new).collect() };
        Ok((typed(cancelled), typed(requested)))
    })
}

/// `failed | cancelled -> queued`, by hand.
pub async fn retry(conn: impl Into<Conn<'_>>, id: JobId, from: JobStatus) -> sql::Result<bool> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let done = sql::query(
            "UPDATE jobs SET status = 'queued', reason = 'retried', exit_code = NULL, finished_at = NULL,
                lease_expires_at = NULL, cancel_requested = 0, crash_count = 0,
                worker_id = NULL, gpu_ids = NULL, started_at = NULL
         WHERE id = $1 AND status = $2",
        )
        .bind(id.get())
        .bind(from.as_str())
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected() == 1)
    })
}

pub async fn set_priority(conn: impl Into<Conn<'_>>, id: JobId, from: JobStatus, priority: i64) -> sql::Result<bool> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let done = sql::query("UPDATE jobs SET priority = $1 WHERE id = $2 AND status = $3")
            .bind(priority)
            .bind(id.get())
            .bind(from.as_str())
            .execute(&mut *conn)
            .await?;
        Ok(done.rows_affected() == 1)
    })
}

/// Adds a sentence to the notes of an attempt (once: the same note twice is kept once).
pub async fn add_note(conn: impl Into<Conn<'_>>, job: JobId, attempt: u32, note: &str) -> sql::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sql::query(engine.pick(
            "INSERT INTO job_attempts (job_id, attempt, notes) VALUES ($1, $2, json_array($3))
         ON CONFLICT (job_id, attempt) DO UPDATE SET notes = CASE
             WHEN EXISTS (SELECT 1 FROM json_each(coalesce(job_attempts.notes, '[]')) WHERE value = $3)
                 THEN job_attempts.notes
             ELSE json_insert(coalesce(job_attempts.notes, '[]'), '$[#]', $3) END",
            "INSERT INTO job_attempts (job_id, attempt, notes) VALUES ($1, $2, jsonb_build_array($3::text)::text)
         ON CONFLICT (job_id, attempt) DO UPDATE SET notes = CASE
             WHEN coalesce(job_attempts.notes, '[]')::jsonb ? $3 THEN job_attempts.notes
             ELSE (coalesce(job_attempts.notes, '[]')::jsonb || jsonb_build_array($3::text))::text END",
        ))
        .bind(job.get())
        .bind(i64::from(attempt))
        .bind(note)
        .execute(&mut *conn)
        .await?;
        Ok(())
    })
}
