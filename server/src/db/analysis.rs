//! Read-only queries of the sweep analysis and the job page's GPU view: a sweep's runs with one
//! metric, its pace, and the readings of an attempt's GPUs. Nothing here writes.

use shared::api::{GpuSample, JobId, MetricSummary, SweepId, WorkerId};
use shared::job::JobStatus;
use sqlx::{Row, SqlitePool};

/// A run of a sweep that reported the metric, with the summary of its latest attempt.
pub struct MetricRun {
    pub job_id: JobId,
    pub status: JobStatus,
    pub params: serde_json::Value,
    pub finished_at: Option<i64>,
    pub values: MetricSummary,
}

/// Every job of `sweep` whose latest attempt reported `metric`, in index order.
pub async fn runs_with_metric(pool: &SqlitePool, sweep: SweepId, metric: &str) -> anyhow::Result<Vec<MetricRun>> {
    let rows = sqlx::query(
        "SELECT j.id, j.status, j.params, j.finished_at,
                s.last_value, s.min_value, s.max_value, s.last_step, s.point_count
         FROM jobs j JOIN job_metric_summaries s ON s.job_id = j.id AND s.attempt = j.attempt AND s.name = ?
         WHERE j.sweep_id = ? ORDER BY j.idx",
    )
    .bind(metric)
    .bind(sweep.get())
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| {
            let status: String = row.try_get("status")?;
            let params: String = row.try_get("params")?;
            Ok(MetricRun {
                job_id: JobId::new(row.try_get("id")?),
                status: status.parse().map_err(anyhow::Error::msg)?,
                params: serde_json::from_str(&params)?,
                finished_at: row.try_get("finished_at")?,
                values: MetricSummary {
                    last: row.try_get("last_value")?,
                    min: row.try_get("min_value")?,
                    max: row.try_get("max_value")?,
                    step: row.try_get("last_step")?,
                    count: row.try_get::<i64, _>("point_count")? as u64,
                },
            })
        })
        .collect()
}

/// The metric most runs of `sweep` reported (ties by name), if any.
pub async fn most_reported_metric(pool: &SqlitePool, sweep: SweepId) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar(
        "SELECT s.name FROM job_metric_summaries s JOIN jobs j ON j.id = s.job_id AND j.attempt = s.attempt
         WHERE j.sweep_id = ? GROUP BY s.name ORDER BY count(*) DESC, s.name LIMIT 1",
    )
    .bind(sweep.get())
    .fetch_optional(pool)
    .await
}

/// How a sweep's runs go: how many ended on their own and their mean run time, and when each
/// running job started.
pub struct SweepPace {
    pub finished: u64,
    pub mean_run_ms: Option<f64>,
    pub running_since: Vec<i64>,
}

pub async fn pace(pool: &SqlitePool, sweep: SweepId) -> sqlx::Result<SweepPace> {
    let (finished, mean_run_ms): (i64, Option<f64>) = sqlx::query_as(
        "SELECT count(*), avg(finished_at - started_at) FROM jobs
         WHERE sweep_id = ? AND status IN ('succeeded', 'failed')
           AND started_at IS NOT NULL AND finished_at IS NOT NULL",
    )
    .bind(sweep.get())
    .fetch_one(pool)
    .await?;
    let running_since: Vec<i64> = sqlx::query_scalar(
        "SELECT started_at FROM jobs WHERE sweep_id = ? AND status = 'running' AND started_at IS NOT NULL",
    )
    .bind(sweep.get())
    .fetch_all(pool)
    .await?;
    Ok(SweepPace { finished: finished as u64, mean_run_ms, running_since })
}

/// Readings of `worker`'s GPUs `gpus` taken from `from` to `to` (inclusive), oldest first.
pub async fn gpu_readings(
    pool: &SqlitePool,
    worker: WorkerId,
    gpus: &[u32],
    from: i64,
    to: i64,
) -> anyhow::Result<Vec<GpuSample>> {
    let rows = sqlx::query(
        "SELECT * FROM gpu_telemetry
         WHERE worker_id = ? AND at BETWEEN ? AND ? AND gpu_index IN (SELECT value FROM json_each(?))
         ORDER BY at, gpu_index",
    )
    .bind(worker.get())
    .bind(from)
    .bind(to)
    .bind(serde_json::to_string(gpus)?)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .iter()
        .map(|row| {
            Ok::<_, sqlx::Error>(GpuSample {
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
        .collect::<Result<_, _>>()?)
}

/// Other jobs whose latest attempt ran on `worker` with one of `gpus` at some time between
/// `from` and `to`: they shared a GPU with the attempt being looked at.
pub async fn gpu_neighbours(
    pool: &SqlitePool,
    job: JobId,
    worker: WorkerId,
    gpus: &[u32],
    from: i64,
    to: i64,
) -> anyhow::Result<Vec<JobId>> {
    let ids: Vec<i64> = sqlx::query_scalar(
        "SELECT j.id FROM jobs j
         WHERE j.worker_id = ? AND j.id != ? AND j.status != 'queued'
           AND j.started_at IS NOT NULL AND j.started_at <= ? AND coalesce(j.finished_at, ?) >= ?
           AND EXISTS (SELECT 1 FROM json_each(j.gpu_ids) g WHERE g.value IN (SELECT value FROM json_each(?)))
         ORDER BY j.id",
    )
    .bind(worker.get())
    .bind(job.get())
    .bind(to)
    .bind(to)
    .bind(from)
    .bind(serde_json::to_string(gpus)?)
    .fetch_all(pool)
    .await?;
    Ok(ids.into_iter().map(JobId::new).collect())
}
