//! `job_metrics` (append-only points), `job_metric_summaries` (last/min/max per metric of a
//! job's latest attempt) and the metrics columns of `job_attempts`.

use super::backend::{on_conn, on_exec, on_pool, Conn, DbRow, Exec, PoolRef};
use super::sql;
use shared::api::{JobId, MetricPoint, MetricSeries, MetricSummary, SweepId};
use shared::job::JobStatus;
use shared::sweep::{Goal, Metric};
use std::collections::{BTreeMap, HashMap};

/// Points per INSERT: 4 bound values each stays well under SQLite's variable limit.
const POINTS_PER_STATEMENT: usize = 4_000;

/// Metrics of each job, by job id.
pub type Summaries = HashMap<JobId, BTreeMap<String, MetricSummary>>;

/// The metrics-file offset stored up to, and how many points the attempt has.
pub async fn progress(conn: impl Into<Conn<'_>>, job: JobId, attempt: u32) -> sql::Result<(u64, u64)> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let row =
            sql::query("SELECT metrics_offset, metrics_points FROM job_attempts WHERE job_id = $1 AND attempt = $2")
                .bind(job.get())
                .bind(i64::from(attempt))
                .fetch_optional(&mut *conn)
                .await?;
        let Some(row) = row else { return Ok((0, 0)) };
        Ok((row.get_as::<i64>("metrics_offset")? as u64, row.get_as::<i64>("metrics_points")? as u64))
    })
}

pub async fn set_progress(
    conn: impl Into<Conn<'_>>,
    job: JobId,
    attempt: u32,
    offset: u64,
    points: u64,
) -> sql::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sql::query(
            "INSERT INTO job_attempts (job_id, attempt, metrics_offset, metrics_points) VALUES ($1, $2, $3, $4)
         ON CONFLICT (job_id, attempt) DO UPDATE SET metrics_offset = excluded.metrics_offset,
             metrics_points = excluded.metrics_points",
        )
        .bind(job.get())
        .bind(i64::from(attempt))
        .bind(offset.min(i64::MAX as u64) as i64)
        .bind(points as i64)
        .execute(&mut *conn)
        .await?;
        Ok(())
    })
}

/// Appends points numbered from `first_seq`, a few thousand per statement.
pub async fn append(
    conn: impl Into<Conn<'_>>,
    job: JobId,
    attempt: u32,
    first_seq: u64,
    points: &[MetricPoint],
) -> sql::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        for (batch, chunk) in points.chunks(POINTS_PER_STATEMENT).enumerate() {
            let mut query =
                sql::Builder::new("INSERT INTO job_metrics (job_id, attempt, seq, step, name, value) SELECT ");
            query.push_bind(job.get()).push(", ").push_bind(attempt);
            query.push(", column1, column2, column3, column4 FROM (VALUES ");
            for (position, point) in chunk.iter().enumerate() {
                let seq = first_seq + (batch * POINTS_PER_STATEMENT + position) as u64;
                query.push(if position == 0 { "(" } else { ", (" }).push_bind(seq as i64).push(", ");
                query.push_bind(point.step).push(", ").push_bind(point.name.as_str()).push(", ");
                query.push_bind(point.value).push(")");
            }
            query.push(") AS v");
            query.build().execute(&mut *conn).await?;
        }
        Ok(())
    })
}

/// Folds one batch's summaries into the job's: a batch of a newer attempt first drops the
/// summaries of older ones, so they always describe one attempt.
pub async fn merge_summaries(
    conn: impl Into<Conn<'_>>,
    job: JobId,
    attempt: u32,
    batch: &BTreeMap<String, MetricSummary>,
) -> sql::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sql::query("DELETE FROM job_metric_summaries WHERE job_id = $1 AND attempt < $2")
            .bind(job.get())
            .bind(i64::from(attempt))
            .execute(&mut *conn)
            .await?;
        if batch.is_empty() {
            return Ok(());
        }
        let mut query = sql::Builder::new(
            "INSERT INTO job_metric_summaries
             (job_id, attempt, name, last_value, min_value, max_value, last_step, point_count) SELECT ",
        );
        query.push_bind(job.get()).push(", ").push_bind(attempt);
        query.push(", column1, column2, column3, column4, column5, column6 FROM (VALUES ");
        for (position, (name, summary)) in batch.iter().enumerate() {
            query.push(if position == 0 { "(" } else { ", (" }).push_bind(name.as_str()).push(", ");
            query.push_bind(summary.last).push(", ").push_bind(summary.min).push(", ");
            query.push_bind(summary.max).push(", ").push_bind(summary.step).push(", ");
            query.push_bind(summary.count as i64).push(")");
        }
        // `WHERE true` tells SQLite's parser the ON CONFLICT belongs to the INSERT, not a join.
        query.push(engine.pick(
            ") AS v WHERE true ON CONFLICT (job_id, name) DO UPDATE SET
             last_value = excluded.last_value, last_step = excluded.last_step,
             min_value = min(min_value, excluded.min_value), max_value = max(max_value, excluded.max_value),
             point_count = point_count + excluded.point_count",
            ") AS v WHERE true ON CONFLICT (job_id, name) DO UPDATE SET
             last_value = excluded.last_value, last_step = excluded.last_step,
             min_value = least(job_metric_summaries.min_value, excluded.min_value),
             max_value = greatest(job_metric_summaries.max_value, excluded.max_value),
             point_count = job_metric_summaries.point_count + excluded.point_count",
        ));
        query.build().execute(&mut *conn).await?;
        Ok(())
    })
}

fn summary_of(row: &impl DbRow) -> sql::Result<(JobId, String, MetricSummary)> {
    let summary = MetricSummary {
        last: row.get_as("last_value")?,
        min: row.get_as("min_value")?,
        max: row.get_as("max_value")?,
        step: row.get_as("last_step")?,
        count: row.get_as::<i64>("point_count")? as u64,
    };
    Ok((JobId::new(row.get_as("job_id")?), row.get_as("name")?, summary))
}

fn collect<R: DbRow>(rows: &[R]) -> sql::Result<Summaries> {
    let mut summaries = Summaries::new();
    for row in rows {
        let (job, name, summary) = summary_of(row)?;
        summaries.entry(job).or_default().insert(name, summary);
    }
    Ok(summaries)
}

const SUMMARY_COLUMNS: &str = "s.job_id, s.name, s.last_value, s.min_value, s.max_value, s.last_step, s.point_count";

/// Summaries of the latest attempt of each of `jobs`, in one query.
pub async fn summaries(pool: impl Into<PoolRef<'_>>, jobs: &[JobId]) -> anyhow::Result<Summaries> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        if jobs.is_empty() {
            return Ok(Summaries::new());
        }
        let rows = sql::query(&format!(
            "SELECT {SUMMARY_COLUMNS} FROM job_metric_summaries s JOIN jobs j ON j.id = s.job_id AND j.attempt = s.attempt
         WHERE s.job_id IN (SELECT {})",
            engine.json_ids(1)
        ))
        .bind(serde_json::to_string(jobs)?)
        .fetch_all(pool)
        .await?;
        Ok(collect(&rows)?)
    })
}

/// Summaries of one attempt, as they stand (for a result version).
pub async fn summaries_of_attempt(
    db: impl Into<Exec<'_>>,
    job: JobId,
    attempt: u32,
) -> sql::Result<BTreeMap<String, MetricSummary>> {
    let db = db.into();
    on_exec!(db, |db, engine| {
        let rows = sql::query(&format!(
            "SELECT {SUMMARY_COLUMNS} FROM job_metric_summaries s WHERE job_id = $1 AND attempt = $2"
        ))
        .bind(job.get())
        .bind(i64::from(attempt))
        .fetch_all(db)
        .await?;
        Ok(collect(&rows)?.remove(&job).unwrap_or_default())
    })
}

/// Every point of an attempt, grouped by metric in the order each first appeared.
pub async fn series(pool: impl Into<PoolRef<'_>>, job: JobId, attempt: u32) -> sql::Result<Vec<MetricSeries>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let rows =
            sql::query("SELECT step, name, value FROM job_metrics WHERE job_id = $1 AND attempt = $2 ORDER BY seq")
                .bind(job.get())
                .bind(i64::from(attempt))
                .fetch_all(pool)
                .await?;
        let mut series: Vec<MetricSeries> = Vec::new();
        let mut position: HashMap<String, usize> = HashMap::new();
        for row in rows {
            let name: String = row.get_as("name")?;
            let at = *position.entry(name.clone()).or_insert_with(|| {
                series.push(MetricSeries { name, steps: Vec::new(), values: Vec::new() });
                series.len() - 1
            });
            series[at].steps.push(row.get_as("step")?);
            series[at].values.push(row.get_as("value")?);
        }
        Ok(series)
    })
}

/// One job of a sweep's leaderboard, before ranking.
pub struct SweepJob {
    pub id: JobId,
    pub index: u64,
    pub status: JobStatus,
    pub params: String,
}

/// Every job of a sweep in index order, with the summaries of their latest attempts.
pub async fn sweep_jobs(pool: impl Into<PoolRef<'_>>, sweep: SweepId) -> anyhow::Result<(Vec<SweepJob>, Summaries)> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let rows = sql::query("SELECT id, idx, status, params FROM jobs WHERE sweep_id = $1 ORDER BY idx")
            .bind(sweep.get())
            .fetch_all(pool)
            .await?;
        let jobs = rows.iter().map(sweep_job_of).collect::<anyhow::Result<Vec<_>>>()?;
        let rows = sql::query(&format!(
        "SELECT {SUMMARY_COLUMNS} FROM job_metric_summaries s JOIN jobs j ON j.id = s.job_id AND j.attempt = s.attempt
         WHERE j.sweep_id = $1"
    ))
        .bind(sweep.get())
        .fetch_all(pool)
        .await?;
        Ok((jobs, collect(&rows)?))
    })
}

fn sweep_job_of(row: &impl DbRow) -> anyhow::Result<SweepJob> {
    let status: String = row.get_as("status")?;
    Ok(SweepJob {
        id: JobId::new(row.get_as("id")?),
        index: row.get_as::<i64>("idx")? as u64,
        status: status.parse().map_err(anyhow::Error::msg)?,
        params: row.get_as("params")?,
    })
}

/// Jobs that hold the first `top` rows of a sweep's leaderboard (as `leaderboard::rank` orders
/// them: best score first among runs not cancelled, then cancelled runs with a value, then the
/// unscored by index), with their summaries: a superset that `rank` orders and cuts. Selected
/// in SQL, so the top of a 100,000-job sweep costs a sort of scores, not a read of every job.
pub async fn sweep_top_jobs(
    pool: impl Into<PoolRef<'_>>,
    sweep: SweepId,
    metric: Option<&Metric>,
    top: u32,
) -> anyhow::Result<(Vec<SweepJob>, Summaries)> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let mut ids: Vec<JobId> = Vec::new();
        if let Some(metric) = metric {
            let (score, direction) = match metric.goal {
                Goal::Minimize => ("s.min_value", "ASC"),
                Goal::Maximize => ("s.max_value", "DESC"),
            };
            ids = sql::query_scalar::<i64>(&format!(
                "SELECT j.id FROM job_metric_summaries s JOIN jobs j ON j.id = s.job_id AND j.attempt = s.attempt
             WHERE j.sweep_id = $1 AND s.name = $2 AND j.status <> 'cancelled'
             ORDER BY {score} {direction}, j.idx LIMIT $3"
            ))
            .bind(sweep.get())
            .bind(&metric.name)
            .bind(i64::from(top))
            .fetch_all(pool)
            .await?
            .into_iter()
            .map(JobId::new)
            .collect();
        }
        if (ids.len() as u32) < top {
            // Then what `rank` lists after the ranked runs: every cancelled run with a value
            // (stopped early or by hand; `rank` orders them), then the first runs without one
            // by index. A superset of the rest of the top, ranked and cut by the caller.
            if let Some(metric) = metric {
                let cancelled: Vec<JobId> = sql::query_scalar::<i64>(
                    "SELECT j.id FROM job_metric_summaries s JOIN jobs j ON j.id = s.job_id AND j.attempt = s.attempt
                 WHERE j.sweep_id = $1 AND s.name = $2 AND j.status = 'cancelled' LIMIT $3",
                )
                .bind(sweep.get())
                .bind(&metric.name)
                .bind(CANCELLED_SCORED)
                .fetch_all(pool)
                .await?
                .into_iter()
                .map(JobId::new)
                .collect();
                ids.extend(cancelled);
            }
            let unscored: Vec<JobId> = sql::query_scalar::<i64>(
                "SELECT j.id FROM jobs j WHERE j.sweep_id = $1
               AND NOT EXISTS (SELECT 1 FROM job_metric_summaries s
                               WHERE s.job_id = j.id AND s.attempt = j.attempt AND s.name = $2)
             ORDER BY j.idx LIMIT $3",
            )
            .bind(sweep.get())
            .bind(metric.map(|metric| metric.name.as_str()).unwrap_or(""))
            .bind(i64::from(top))
            .fetch_all(pool)
            .await?
            .into_iter()
            .map(JobId::new)
            .collect();
            ids.extend(unscored);
        }
        let rows = sql::query(&format!(
            "SELECT id, idx, status, params FROM jobs WHERE id IN (SELECT {})",
            engine.json_ids(1)
        ))
        .bind(serde_json::to_string(&ids)?)
        .fetch_all(pool)
        .await?;
        let jobs = rows.iter().map(sweep_job_of).collect::<anyhow::Result<Vec<_>>>()?;
        Ok((jobs, summaries(pool, &ids).await?))
    })
}

/// Cancelled runs with a value read for a top-k at most (they follow the ranked runs).
const CANCELLED_SCORED: i64 = 10_000;

/// Runs per status looked at by [`arrived_names`]: the most recently finished.
const ARRIVED_RUNS: u32 = 200;

/// The metric names the sweep's most recently finished runs (succeeded or failed, up to
/// [`ARRIVED_RUNS`] of each, index ranges of `jobs_by_sweep_status`) reported, sorted, with
/// `wanted` first if it is among them; at most 50. Bounded, so a sweep's page costs the same
/// with 100 or 100,000 finished runs.
pub async fn arrived_names(pool: impl Into<PoolRef<'_>>, sweep: SweepId, wanted: &str) -> sql::Result<Vec<String>> {
    let pool = pool.into();
    on_pool!(pool, |pool, _engine| {
        let recent = |status: &str| {
            format!(
                "SELECT id FROM (SELECT id FROM jobs WHERE sweep_id = $1 AND status = '{status}'
                                 ORDER BY finished_at DESC LIMIT $2) AS {status}_runs"
            )
        };
        let mut names: Vec<String> = sql::query_scalar(&format!(
            "SELECT name FROM (SELECT DISTINCT name FROM job_metric_summaries
                               WHERE job_id IN ({} UNION ALL {})) AS arrived
             ORDER BY name = $3 DESC, name LIMIT 50",
            recent("succeeded"),
            recent("failed")
        ))
        .bind(sweep.get())
        .bind(ARRIVED_RUNS)
        .bind(wanted)
        .fetch_all(pool)
        .await?;
        names.sort();
        Ok(names)
    })
}
