//! `jobs`: reads for the API and the guarded state changes of the job lifecycle.
//!
//! Every state change is one UPDATE guarded by the state it expects (`WHERE id = ? AND
//! status = ? AND attempt = ?`); callers check `rows_affected` (or the returned rows) to learn
//! whether it applied. The `jobs_record_transition` trigger writes the history.

use super::backend::{on_conn, on_pool, Conn, DbRow, PoolRef};
use super::sql;
use shared::api::{Job, JobAttempt, JobId, JobPage, JobSort, SortOrder, SweepId, WorkerId};
use shared::job::{Finish, JobStatus, LeaseExpiry};
use shared::sweep::Resources;

const JOB_SELECT: &str = "SELECT j.*, s.name AS sweep_name, w.name AS worker_name, a.notes AS notes,
         es.rung AS stop_rung, es.cutoff AS stop_cutoff, es.reason AS stop_reason, es.stopped_at
     FROM jobs j JOIN sweeps s ON s.id = j.sweep_id LEFT JOIN workers w ON w.id = j.worker_id
     LEFT JOIN job_attempts a ON a.job_id = j.id AND a.attempt = j.attempt
     LEFT JOIN early_stops es ON es.job_id = j.id AND es.attempt = j.attempt";

fn status_of(row: &impl DbRow) -> anyhow::Result<JobStatus> {
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

fn job_from_row(row: &impl DbRow) -> anyhow::Result<Job> {
    let params: String = row.get_as("params")?;
    Ok(Job {
        id: JobId::new(row.get_as("id")?),
        sweep_id: SweepId::new(row.get_as("sweep_id")?),
        sweep: row.get_as("sweep_name")?,
        index: row.get_as::<i64>("idx")? as u64,
        params: serde_json::from_str(&params)?,
        command: row.get_as("command")?,
        status: status_of(row)?,
        priority: row.get_as("priority")?,
        attempt: row.u32_at("attempt")?,
        crash_count: row.u32_at("crash_count")?,
        retries_left: row.u32_at("retries_left")?,
        resources: resources_of(row)?,
        timeout_secs: row.get_as::<Option<i64>>("timeout_secs")?.map(|secs| secs as u64),
        worker_id: row.get_as::<Option<i64>>("worker_id")?.map(WorkerId::new),
        worker: row.get_as("worker_name")?,
        lease_expires_at: row.get_as("lease_expires_at")?,
        cancel_requested: row.flag_at("cancel_requested")?,
        exit_code: row.get_as::<Option<i64>>("exit_code")?.map(|code| code as i32),
        reason: row.get_as("reason")?,
        created_at: row.get_as("created_at")?,
        started_at: row.get_as("started_at")?,
        finished_at: row.get_as("finished_at")?,
        gpus: gpu_ids_of(row)?,
        notes: row
            .get_as::<Option<String>>("notes")?
            .as_deref()
            .map(serde_json::from_str)
            .transpose()?
            .unwrap_or_default(),
        // Filled by `get` and `list` from `job_metric_summaries` and `results`.
        metrics: Default::default(),
        stopped_early: super::search::stopped_early_of(row)?,
        gpu_usage: None,
        // Filled by the routes, which know the workers (see `queue::waiting`).
        waiting: None,
    })
}

/// A job with the metric summaries of its latest attempt.
pub async fn get(pool: impl Into<PoolRef<'_>>, id: JobId) -> anyhow::Result<Option<Job>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let row = sql::query(&format!("{JOB_SELECT} WHERE j.id = $1")).bind(id.get()).fetch_optional(pool).await?;
        let Some(mut job) = row.as_ref().map(job_from_row).transpose()? else { return Ok(None) };
        job.metrics = super::metrics::summaries(pool, &[id]).await?.remove(&id).unwrap_or_default();
        job.gpu_usage = super::gpu::usage_of(pool, &[id]).await?.remove(&id);
        Ok(Some(job))
    })
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

/// Resolved filters of a job listing.
#[derive(Debug, Default)]
pub struct JobFilter {
    pub status: Option<JobStatus>,
    pub sweep_id: Option<SweepId>,
    pub worker_id: Option<WorkerId>,
}

fn push_filter<'a>(query: &mut sql::Builder<'a>, filter: &'a JobFilter) {
    query.push(" WHERE 1 = 1");
    if let Some(status) = filter.status {
        query.push(" AND j.status = ").push_bind(status.as_str());
    }
    if let Some(sweep_id) = filter.sweep_id {
        query.push(" AND j.sweep_id = ").push_bind(sweep_id.get());
    }
    if let Some(worker_id) = filter.worker_id {
        query.push(" AND j.worker_id = ").push_bind(worker_id.get());
    }
}

/// The ORDER BY of a listing; the id last, so pages never overlap or skip.
fn order_by(sort: JobSort, order: SortOrder, now: i64) -> String {
    let direction = match order {
        SortOrder::Asc => "ASC",
        SortOrder::Desc => "DESC",
    };
    let column = match sort {
        JobSort::Id => return format!("j.id {direction}"),
        JobSort::Priority => "j.priority".to_string(),
        JobSort::Status => "j.status".to_string(),
        JobSort::Sweep => "s.name".to_string(),
        JobSort::Worker => "w.name".to_string(),
        JobSort::StartedAt => "j.started_at".to_string(),
        // `now` is a number this function formats itself, never user text.
        JobSort::Duration => format!("coalesce(j.finished_at, {now}) - j.started_at"),
    };
    // Jobs without a value (never started, no worker) go last either way.
    format!("({column}) IS NULL, {column} {direction}, j.id {direction}")
}

/// One page of jobs (with their metric summaries) in the asked order, and how many match.
pub async fn list(
    pool: impl Into<PoolRef<'_>>,
    filter: &JobFilter,
    (sort, order): (JobSort, SortOrder),
    limit: u32,
    offset: u64,
) -> anyhow::Result<JobPage> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let mut count = sql::Builder::new("SELECT count(*) FROM jobs j");
        push_filter(&mut count, filter);
        let total: i64 = count.build_scalar().fetch_one(pool).await?;
        // The sort runs over narrow rows (id and sort keys) in a subquery; only the page's rows
        // are read whole. Sorting 100,000 full rows would drag every params and command along.
        let order = order_by(sort, order, super::now_ms());
        let mut page = sql::Builder::new(JOB_SELECT);
        page.push(" WHERE j.id IN (SELECT j.id FROM jobs j JOIN sweeps s ON s.id = j.sweep_id")
            .push(" LEFT JOIN workers w ON w.id = j.worker_id");
        push_filter(&mut page, filter);
        page.push(" ORDER BY ")
            .push(&order)
            .push(" LIMIT ")
            .push_bind(limit as i64)
            .push(" OFFSET ")
            .push_bind(offset as i64)
            .push(") ORDER BY ")
            .push(&order);
        let rows = page.build().fetch_all(pool).await?;
        let mut jobs = rows.iter().map(job_from_row).collect::<anyhow::Result<Vec<_>>>()?;
        // One query for the whole page's metrics, not one per job.
        let ids: Vec<JobId> = jobs.iter().map(|job| job.id).collect();
        let mut metrics = super::metrics::summaries(pool, &ids).await?;
        let mut usage = super::gpu::usage_of(pool, &ids).await?;
        for job in &mut jobs {
            job.metrics = metrics.remove(&job.id).unwrap_or_default();
            job.gpu_usage = usage.remove(&job.id);
        }
        Ok(JobPage { total: total as u64, jobs })
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

/// How many queued jobs are dispatched before the queued job `id` of `priority` (those before
/// it in `claims::DISPATCH_ORDER`: priority first, then age). A range of the queue's index, not a scan of the table.
pub async fn queue_position(pool: impl Into<PoolRef<'_>>, id: JobId, priority: i64) -> sql::Result<u64> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let ahead: i64 = sql::query_scalar(engine.pick(
            "SELECT count(*) FROM jobs INDEXED BY jobs_queue
         WHERE status = 'queued' AND (priority > $1 OR (priority = $1 AND id < $2))",
            "SELECT count(*) FROM jobs WHERE status = 'queued' AND (priority > $1 OR (priority = $1 AND id < $2))",
        ))
        .bind(priority)
        .bind(id.get())
        .fetch_one(pool)
        .await?;
        Ok(ahead as u64)
    })
}

/// The queue positions of several queued jobs in one pass over the queue's index.
pub async fn queue_positions(pool: impl Into<PoolRef<'_>>, ids: &[JobId]) -> anyhow::Result<Vec<(JobId, u64)>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let hint = engine.pick(" INDEXED BY jobs_queue", "");
        let sql = format!(
            "SELECT id, position FROM (
                 SELECT id, row_number() OVER (ORDER BY {order}) - 1 AS position
                 FROM jobs{hint} WHERE status = 'queued') AS q
             WHERE id IN (SELECT {ids})",
            order = super::claims::DISPATCH_ORDER,
            ids = engine.json_ids(1),
        );
        let rows: Vec<(i64, i64)> = sql::query_as(&sql).bind(serde_json::to_string(ids)?).fetch_all(pool).await?;
        Ok(rows.into_iter().map(|(id, position)| (JobId::new(id), position as u64)).collect())
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

/// Extends the leases of the listed attempts that `worker_id` really holds; returns those
/// attempts with their cancel flag.
pub async fn extend_leases(
    conn: impl Into<Conn<'_>>,
    worker_id: WorkerId,
    attempts: &[JobAttempt],
    lease_until: i64,
) -> anyhow::Result<Vec<(JobAttempt, bool)>> {
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
         RETURNING id, attempt, cancel_requested",
            "UPDATE jobs SET lease_expires_at = $1
         WHERE status = 'running' AND worker_id = $2
           AND (id, attempt) IN (SELECT (value ->> 0)::bigint, (value ->> 1)::bigint
                                 FROM jsonb_array_elements($3::jsonb) AS e(value))
         RETURNING id, attempt, cancel_requested",
        ))
        .bind(lease_until)
        .bind(worker_id.get())
        .bind(pairs)
        .fetch_all(&mut *conn)
        .await?;
        rows.iter()
            .map(|row| {
                let attempt = JobAttempt { job_id: JobId::new(row.get_as("id")?), attempt: row.u32_at("attempt")? };
                Ok((attempt, row.flag_at("cancel_requested")?))
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
