//! Read-only queries of the sweep analysis and the job page's GPU view: a sweep's runs with one
//! metric, its pace, and the readings of an attempt's GPUs. Nothing here writes.

use super::backend::{on_pool, DbRow, PoolRef};
use super::sql;
use shared::api::{GpuSample, JobId, MetricSummary, SweepId, WorkerId};
use shared::job::JobStatus;

/// A run of a sweep that reported the metric, with the summary of its latest attempt.
pub struct MetricRun {
    pub job_id: JobId,
    pub status: JobStatus,
    pub params: serde_json::Value,
    pub finished_at: Option<i64>,
    pub values: MetricSummary,
}

/// Every job of `sweep` whose latest attempt reported `metric`, in index order.
pub async fn runs_with_metric(
    pool: impl Into<PoolRef<'_>>,
    sweep: SweepId,
    metric: &str,
) -> anyhow::Result<Vec<MetricRun>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let rows = sql::query(
            "SELECT j.id, j.status, j.params, j.finished_at,
                s.last_value, s.min_value, s.max_value, s.last_step, s.point_count
         FROM jobs j JOIN job_metric_summaries s ON s.job_id = j.id AND s.attempt = j.attempt AND s.name = $1
         WHERE j.sweep_id = $2 ORDER BY j.idx",
        )
        .bind(metric)
        .bind(sweep.get())
        .fetch_all(pool)
        .await?;
        rows.iter()
            .map(|row| {
                let status: String = row.get_as("status")?;
                let params: String = row.get_as("params")?;
                Ok(MetricRun {
                    job_id: JobId::new(row.get_as("id")?),
                    status: status.parse().map_err(anyhow::Error::msg)?,
                    params: serde_json::from_str(&params)?,
                    finished_at: row.get_as("finished_at")?,
                    values: MetricSummary {
                        last: row.get_as("last_value")?,
                        min: row.get_as("min_value")?,
                        max: row.get_as("max_value")?,
                        step: row.get_as("last_step")?,
                        count: row.get_as::<i64>("point_count")? as u64,
                    },
                })
            })
            .collect()
    })
}

/// The metric most runs of `sweep` reported (ties by name), if any.
pub async fn most_reported_metric(pool: impl Into<PoolRef<'_>>, sweep: SweepId) -> sql::Result<Option<String>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        sql::query_scalar(
            "SELECT s.name FROM job_metric_summaries s JOIN jobs j ON j.id = s.job_id AND j.attempt = s.attempt
         WHERE j.sweep_id = $1 GROUP BY s.name ORDER BY count(*) DESC, s.name LIMIT 1",
        )
        .bind(sweep.get())
        .fetch_optional(pool)
        .await
    })
}

/// How a sweep's runs go: how many ended on their own and their mean run time, and when each
/// running job started.
pub struct SweepPace {
    pub finished: u64,
    pub mean_run_ms: Option<f64>,
    pub running_since: Vec<i64>,
}

pub async fn pace(pool: impl Into<PoolRef<'_>>, sweep: SweepId) -> sql::Result<SweepPace> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let (finished, mean_run_ms): (i64, Option<f64>) = sql::query_as(
            "SELECT count(*), CAST(avg(finished_at - started_at) AS DOUBLE PRECISION) FROM jobs
         WHERE sweep_id = $1 AND status IN ('succeeded', 'failed')
           AND started_at IS NOT NULL AND finished_at IS NOT NULL",
        )
        .bind(sweep.get())
        .fetch_one(pool)
        .await?;
        let running_since: Vec<i64> = sql::query_scalar(
            "SELECT started_at FROM jobs WHERE sweep_id = $1 AND status = 'running' AND started_at IS NOT NULL",
        )
        .bind(sweep.get())
        .fetch_all(pool)
        .await?;
        Ok(SweepPace { finished: finished as u64, mean_run_ms, running_since })
    })
}

/// Readings of `worker`'s GPUs `gpus` taken from `from` to `to` (inclusive), oldest first.
pub async fn gpu_readings(
    pool: impl Into<PoolRef<'_>>,
    worker: WorkerId,
    gpus: &[u32],
    from: i64,
    to: i64,
) -> anyhow::Result<Vec<GpuSample>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let rows = sql::query(engine.pick(
            "SELECT * FROM gpu_telemetry
         WHERE worker_id = $1 AND at BETWEEN $2 AND $3 AND gpu_index IN (SELECT value FROM json_each($4))
         ORDER BY at, gpu_index",
            "SELECT * FROM gpu_telemetry
         WHERE worker_id = $1 AND at BETWEEN $2 AND $3
           AND gpu_index IN (SELECT value::bigint FROM jsonb_array_elements_text($4::jsonb) AS e(value))
         ORDER BY at, gpu_index",
        ))
        .bind(worker.get())
        .bind(from)
        .bind(to)
        .bind(serde_json::to_string(gpus)?)
        .fetch_all(pool)
        .await?;
        Ok(rows.iter().map(super::telemetry::sample_of).collect::<Result<_, _>>()?)
    })
}

/// Other jobs whose latest attempt ran on `worker` with one of `gpus` at some time between
/// `from` and `to`: they shared a GPU with the attempt being looked at.
pub async fn gpu_neighbours(
    pool: impl Into<PoolRef<'_>>,
    job: JobId,
    worker: WorkerId,
    gpus: &[u32],
    from: i64,
    to: i64,
) -> anyhow::Result<Vec<JobId>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let ids: Vec<i64> = sql::query_scalar(engine.pick(
            "SELECT j.id FROM jobs j
         WHERE j.worker_id = $1 AND j.id != $2 AND j.status != 'queued'
           AND j.started_at IS NOT NULL AND j.started_at <= $3 AND coalesce(j.finished_at, $4) >= $5
           AND EXISTS (SELECT 1 FROM json_each(j.gpu_ids) g WHERE g.value IN (SELECT value FROM json_each($6)))
         ORDER BY j.id",
            "SELECT j.id FROM jobs j
         WHERE j.worker_id = $1 AND j.id != $2 AND j.status != 'queued'
           AND j.started_at IS NOT NULL AND j.started_at <= $3 AND coalesce(j.finished_at, $4) >= $5
           AND EXISTS (SELECT 1 FROM jsonb_array_elements_text(j.gpu_ids::jsonb) AS g(value)
                       WHERE g.value IN (SELECT jsonb_array_elements_text($6::jsonb)))
         ORDER BY j.id",
        ))
        .bind(worker.get())
        .bind(job.get())
        .bind(to)
        .bind(to)
        .bind(from)
        .bind(serde_json::to_string(gpus)?)
        .fetch_all(pool)
        .await?;
        Ok(ids.into_iter().map(JobId::new).collect())
    })
}
