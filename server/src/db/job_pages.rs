//! The read model of jobs for the API and the page: one job with its sweep, worker, notes and
//! early stop, pages of them filtered and sorted, and queue positions.

use super::backend::{on_pool, DbRow, PoolRef};
use super::jobs::{gpu_ids_of, resources_of, status_of};
use super::sql;
use shared::api::{Job, JobId, JobPage, JobSort, SortOrder, SweepId, WorkerId};
use shared::job::JobStatus;

const JOB_SELECT: &str = "SELECT j.*, s.name AS sweep_name, s.owner AS sweep_owner, w.name AS worker_name,
         a.notes AS notes, es.rung AS stop_rung, es.cutoff AS stop_cutoff, es.reason AS stop_reason, es.stopped_at
     FROM jobs j JOIN sweeps s ON s.id = j.sweep_id LEFT JOIN workers w ON w.id = j.worker_id
     LEFT JOIN job_attempts a ON a.job_id = j.id AND a.attempt = j.attempt
     LEFT JOIN early_stops es ON es.job_id = j.id AND es.attempt = j.attempt";

fn job_from_row(row: &impl DbRow) -> anyhow::Result<Job> {
    let params: String = row.get_as("params")?;
    Ok(Job {
        id: JobId::new(row.get_as("id")?),
        sweep_id: SweepId::new(row.get_as("sweep_id")?),
        sweep: row.get_as("sweep_name")?,
        owner: row.get_as("sweep_owner")?,
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

/// Resolved filters of a job listing.
#[derive(Debug, Default)]
pub struct JobFilter {
    pub status: Option<JobStatus>,
    pub sweep_id: Option<SweepId>,
    pub worker_id: Option<WorkerId>,
    /// Only the jobs of this user's sweeps.
    pub owner: Option<String>,
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
    if let Some(owner) = &filter.owner {
        query.push(" AND j.sweep_id IN (SELECT id FROM sweeps WHERE owner = ").push_bind(owner.as_str()).push(")");
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

/// How many claimable jobs are dispatched before the queued job `id` of `priority` (those
/// before it in `claims::DISPATCH_ORDER`: priority first, then age; a paused sweep's held jobs
/// are not in line). A range of the queue's index, not a scan of the table.
pub async fn queue_position(pool: impl Into<PoolRef<'_>>, id: JobId, priority: i64) -> sql::Result<u64> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let hint = engine.pick(" INDEXED BY jobs_queue", "");
        let sql = format!(
            "SELECT count(*) FROM jobs{hint} WHERE {} AND (priority > $1 OR (priority = $1 AND id < $2))",
            super::claims::CLAIMABLE
        );
        let ahead: i64 = sql::query_scalar(&sql).bind(priority).bind(id.get()).fetch_one(pool).await?;
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
                 FROM jobs{hint} WHERE {claimable}) AS q
             WHERE id IN (SELECT {ids})",
            order = super::claims::DISPATCH_ORDER,
            claimable = super::claims::CLAIMABLE,
            ids = engine.json_ids(1),
        );
        let rows: Vec<(i64, i64)> = sql::query_as(&sql).bind(serde_json::to_string(ids)?).fetch_all(pool).await?;
        Ok(rows.into_iter().map(|(id, position)| (JobId::new(id), position as u64)).collect())
    })
}
