//! `sweep_search` (where each adaptive or early-stopping sweep's controller stands) and
//! `early_stops` (runs stopped early), plus the reads the controller decides on: the finished
//! and running trials of a sweep and the metric histories of its runs.
//!
//! Reads that may cover every job of a sweep come back as one row holding a JSON array (as
//! `jobs::queued_candidates` does): every row costs a round trip to sqlx's SQLite thread. A
//! metric value that is not a finite number comes back as `null`, so neither NaN nor an
//! infinity can reach the JSON reader (which refuses them) or the model.

use super::backend::{on_conn, on_pool, Conn, DbRow, PoolRef};
use super::sql;
use shared::api::{JobId, SearchMethod, SearchState, StoppedEarly, SweepId};
use std::collections::HashMap;

/// A metric value as SQL, `NULL` unless finite.
macro_rules! finite {
    ($column:literal) => {
        concat!(
            "CASE WHEN ",
            $column,
            " BETWEEN -1.7976931348623157e308 AND 1.7976931348623157e308 THEN ",
            $column,
            " END"
        )
    };
}

/// What the controller is set up with at submission.
pub struct NewSearch {
    pub method: SearchMethod,
    pub seed: u64,
    pub run_cap: Option<u64>,
    pub early_stop: bool,
}

fn method_text(method: SearchMethod) -> &'static str {
    match method {
        SearchMethod::Bayes => "bayes",
        SearchMethod::Random => "random",
        SearchMethod::Fixed => "fixed",
    }
}

fn parse_method(text: &str) -> SearchMethod {
    match text {
        "bayes" => SearchMethod::Bayes,
        "random" => SearchMethod::Random,
        _ => SearchMethod::Fixed,
    }
}

pub async fn insert(conn: impl Into<Conn<'_>>, sweep_id: SweepId, search: &NewSearch) -> sql::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sql::query(
        "INSERT INTO sweep_search (sweep_id, method, seed, run_cap, open, early_stop) VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(sweep_id.get())
    .bind(method_text(search.method))
    // SQLite integers are signed: the seed keeps its 64 bits.
    .bind(search.seed as i64)
    .bind(search.run_cap.map(|cap| cap.min(i64::MAX as u64) as i64))
    .bind(i64::from(search.method != SearchMethod::Fixed))
    .bind(i64::from(search.early_stop))
    .execute(&mut *conn)
    .await?;
        Ok(())
    })
}

/// A sweep whose controller still makes runs.
#[derive(Debug, Clone)]
pub struct OpenSearch {
    pub sweep_id: SweepId,
    pub run_cap: Option<u64>,
    pub proposed: u64,
    pub fallback: bool,
    /// Jobs of the sweep waiting in the queue.
    pub queued: u64,
}

/// Every sweep whose controller still makes runs, with its queued jobs (from `sweep_counts`).
pub async fn open_searches(conn: impl Into<Conn<'_>>) -> sql::Result<Vec<OpenSearch>> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let rows = sql::query(&format!(
            "SELECT q.sweep_id, q.run_cap, q.proposed, q.fallback, coalesce(c.jobs, 0) AS queued
             FROM sweep_search q
             LEFT JOIN {} c ON c.sweep_id = q.sweep_id AND c.status = 'queued'
             WHERE q.open = 1 AND q.sweep_id NOT IN (SELECT id FROM sweeps WHERE paused_at IS NOT NULL)
             ORDER BY q.sweep_id",
            super::sweeps::counted(engine)
        ))
        .fetch_all(&mut *conn)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(OpenSearch {
                    sweep_id: SweepId::new(row.get_as("sweep_id")?),
                    run_cap: row.get_as::<Option<i64>>("run_cap")?.map(|cap| cap as u64),
                    proposed: row.get_as::<i64>("proposed")? as u64,
                    fallback: row.flag_at("fallback")?,
                    queued: row.get_as::<i64>("queued")?.max(0) as u64,
                })
            })
            .collect()
    })
}

/// One run of a sweep as the model sees it.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct TrialRow {
    pub status: String,
    pub params: serde_json::Value,
    /// The sweep metric's min and max over the run's latest attempt (`None`: none reported).
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// Whether the latest attempt was stopped early.
    pub stopped: bool,
}

/// The columns and rows of [`trials`] after `SELECT j.status, j.params, `: both backends'.
macro_rules! trial_columns {
    () => {
        concat!(
            finite!("s.min_value"),
            " AS min, ",
            finite!("s.max_value"),
            " AS max, e.job_id IS NOT NULL AS stopped
               FROM jobs j
               LEFT JOIN job_metric_summaries s ON s.job_id = j.id AND s.attempt = j.attempt AND s.name = $1
               LEFT JOIN early_stops e ON e.job_id = j.id AND e.attempt = j.attempt
               WHERE j.sweep_id = $2"
        )
    };
}

/// Every run of the sweep in index order, with its best values of `metric`.
pub async fn trials(conn: impl Into<Conn<'_>>, sweep_id: SweepId, metric: &str) -> anyhow::Result<Vec<TrialRow>> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let packed: Option<String> = sql::query_scalar(engine.pick(
            concat!(
                // A REAL in SQLite's JSON has 15 digits; printed with 17 and read as a JSON
                // number literal (kept as written), the model sees the value the run reported.
                "SELECT json_group_array(json_object('status', status, 'params', json(params),
                                             'min', CASE WHEN min IS NOT NULL THEN json(printf('%!.17g', min)) END,
                                             'max', CASE WHEN max IS NOT NULL THEN json(printf('%!.17g', max)) END,
                                             'stopped', json(CASE WHEN stopped THEN 'true' ELSE 'false' END)))
         FROM (SELECT j.status, j.params, ",
                trial_columns!(),
                " ORDER BY j.idx)"
            ),
            concat!(
                "SELECT json_agg(json_build_object('status', status, 'params', params::json, 'min', min, 'max', max,
                                                'stopped', stopped) ORDER BY idx)::text
         FROM (SELECT j.idx, j.status, j.params, ",
                trial_columns!(),
                ") AS t"
            ),
        ))
        .bind(metric)
        .bind(sweep_id.get())
        .fetch_one(&mut *conn)
        .await?;
        Ok(serde_json::from_str(packed.as_deref().unwrap_or("[]"))?)
    })
}

/// Moves the controller from `before` runs made to `after`, guarded by `before` (a second
/// controller pass on a stale read changes nothing); returns whether it applied.
pub async fn advance(
    conn: impl Into<Conn<'_>>,
    sweep_id: SweepId,
    before: u64,
    after: u64,
    fallback: bool,
) -> sql::Result<bool> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let done = sql::query(
            "UPDATE sweep_search SET proposed = $1, fallback = $2,
                open = CASE WHEN run_cap IS NOT NULL AND $3 >= run_cap THEN 0 ELSE open END
         WHERE sweep_id = $4 AND proposed = $5 AND open = 1",
        )
        .bind(after as i64)
        .bind(i64::from(fallback))
        .bind(after as i64)
        .bind(sweep_id.get())
        .bind(before as i64)
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected() == 1)
    })
}

/// Adds a sentence to the sweep's search notes (the last 100 are kept).
pub async fn add_note(conn: impl Into<Conn<'_>>, sweep_id: SweepId, note: &str) -> sql::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sql::query(engine.pick(
            "UPDATE sweep_search SET notes = (
             SELECT json_group_array(value) FROM (
                 SELECT value FROM (SELECT key, value FROM json_each(json_insert(notes, '$[#]', $1))
                                    ORDER BY key DESC LIMIT 100) ORDER BY key))
         WHERE sweep_id = $2",
            "UPDATE sweep_search SET notes = (
             SELECT jsonb_agg(value ORDER BY ord)::text FROM (
                 SELECT value, ord FROM jsonb_array_elements(coalesce(notes, '[]')::jsonb || jsonb_build_array($1::text))
                                    WITH ORDINALITY AS e(value, ord)
                 ORDER BY ord DESC LIMIT 100) AS kept)
         WHERE sweep_id = $2",
        ))
        .bind(note)
        .bind(sweep_id.get())
        .execute(&mut *conn)
        .await?;
        Ok(())
    })
}

/// Stops the controller making runs; returns whether it was still open.
pub async fn close(conn: impl Into<Conn<'_>>, sweep_id: SweepId) -> sql::Result<bool> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let done = sql::query("UPDATE sweep_search SET open = 0 WHERE sweep_id = $1 AND open = 1")
            .bind(sweep_id.get())
            .execute(&mut *conn)
            .await?;
        Ok(done.rows_affected() == 1)
    })
}

/// The sweep's source, if it has a controller; with whether it stops runs early.
pub async fn source_of(conn: impl Into<Conn<'_>>, sweep_id: SweepId) -> sql::Result<Option<(String, bool)>> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let row = sql::query(
        "SELECT s.source, q.early_stop FROM sweep_search q JOIN sweeps s ON s.id = q.sweep_id WHERE q.sweep_id = $1",
    )
    .bind(sweep_id.get())
    .fetch_optional(&mut *conn)
    .await?;
        row.map(|row| Ok((row.get_as("source")?, row.flag_at("early_stop")?))).transpose()
    })
}

/// A run's reports of one metric, in the order written: `(step, value)`, the value `None`
/// unless finite.
pub type Points = Vec<(Option<i64>, Option<f64>)>;

/// The points of `metric` of the latest attempt of every job of the sweep, by job, skipping
/// points past `max_step` (points without a step are always read).
pub async fn histories(
    pool: impl Into<PoolRef<'_>>,
    sweep_id: SweepId,
    metric: &str,
    max_step: Option<i64>,
) -> anyhow::Result<Vec<(JobId, Points)>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let packed: Option<String> = sql::query_scalar(engine.pick(
            concat!(
                "SELECT json_group_array(json_array(job_id, step, value)) FROM (
             SELECT m.job_id, m.step, ",
                finite!("m.value"),
                " AS value
             FROM jobs j
             JOIN job_metrics m ON m.job_id = j.id AND m.attempt = j.attempt
             WHERE j.sweep_id = $1 AND m.name = $2 AND (m.step IS NULL OR $3 IS NULL OR m.step <= $4)
             ORDER BY m.job_id, m.seq)"
            ),
            concat!(
                "SELECT json_agg(json_build_array(job_id, step, value) ORDER BY job_id, seq)::text FROM (
             SELECT m.job_id, m.seq, m.step, ",
                finite!("m.value"),
                " AS value
             FROM jobs j
             JOIN job_metrics m ON m.job_id = j.id AND m.attempt = j.attempt
             WHERE j.sweep_id = $1 AND m.name = $2 AND (m.step IS NULL OR $3::bigint IS NULL OR m.step <= $4)) AS t"
            ),
        ))
        .bind(sweep_id.get())
        .bind(metric)
        .bind(max_step)
        .bind(max_step)
        .fetch_one(pool)
        .await?;
        let points: Vec<(JobId, Option<i64>, Option<f64>)> = serde_json::from_str(packed.as_deref().unwrap_or("[]"))?;
        let mut histories: Vec<(JobId, Points)> = Vec::new();
        for (job, step, value) in points {
            match histories.last_mut() {
                Some((last, history)) if *last == job => history.push((step, value)),
                _ => histories.push((job, vec![(step, value)])),
            }
        }
        Ok(histories)
    })
}

/// The best finite value of `metric` an attempt reported (its least when `minimize`).
pub async fn best_of(
    conn: impl Into<Conn<'_>>,
    job: JobId,
    attempt: u32,
    metric: &str,
    minimize: bool,
) -> sql::Result<Option<f64>> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let row: Option<(Option<f64>, Option<f64>)> = sql::query_as(concat!(
            "SELECT ",
            finite!("min_value"),
            ", ",
            finite!("max_value"),
            " FROM job_metric_summaries WHERE job_id = $1 AND attempt = $2 AND name = $3"
        ))
        .bind(job.get())
        .bind(i64::from(attempt))
        .bind(metric)
        .fetch_optional(&mut *conn)
        .await?;
        Ok(row.and_then(|(min, max)| if minimize { min } else { max }))
    })
}

/// The points of `metric` of one attempt, in the order written.
pub async fn history_of(
    pool: impl Into<PoolRef<'_>>,
    job: JobId,
    attempt: u32,
    metric: &str,
) -> anyhow::Result<Points> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let packed: Option<String> = sql::query_scalar(engine.pick(
            concat!(
                "SELECT json_group_array(json_array(step, value)) FROM (
             SELECT step, ",
                finite!("value"),
                " AS value FROM job_metrics WHERE job_id = $1 AND attempt = $2 AND name = $3 ORDER BY seq)"
            ),
            concat!(
                "SELECT json_agg(json_build_array(step, value) ORDER BY seq)::text FROM (
             SELECT seq, step, ",
                finite!("value"),
                " AS value FROM job_metrics WHERE job_id = $1 AND attempt = $2 AND name = $3) AS t"
            ),
        ))
        .bind(job.get())
        .bind(i64::from(attempt))
        .bind(metric)
        .fetch_one(pool)
        .await?;
        Ok(serde_json::from_str(packed.as_deref().unwrap_or("[]"))?)
    })
}

/// Records that the running attempt was stopped early; returns false (and records nothing)
/// when it already was.
pub async fn record_stop(
    conn: impl Into<Conn<'_>>,
    job: JobId,
    attempt: u32,
    stop: &StoppedEarly,
) -> sql::Result<bool> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let done = sql::query(
        "INSERT INTO early_stops (job_id, attempt, rung, cutoff, reason, stopped_at) VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (job_id, attempt) DO NOTHING",
    )
    .bind(job.get())
    .bind(i64::from(attempt))
    .bind(stop.rung.min(i64::MAX as u64) as i64)
    .bind(stop.cutoff.filter(|cutoff| cutoff.is_finite()))
    .bind(&stop.reason)
    .bind(stop.at)
    .execute(&mut *conn)
    .await?;
        Ok(done.rows_affected() == 1)
    })
}

/// The early stop of a job row read with `stop_rung`, `stop_cutoff`, `stop_reason` and
/// `stopped_at` columns (see `jobs::JOB_SELECT`).
pub fn stopped_early_of(row: &impl DbRow) -> sql::Result<Option<StoppedEarly>> {
    let Some(rung) = row.get_as::<Option<i64>>("stop_rung")? else { return Ok(None) };
    Ok(Some(StoppedEarly {
        rung: rung.max(0) as u64,
        cutoff: row.get_as("stop_cutoff")?,
        reason: row.get_as::<Option<String>>("stop_reason")?.unwrap_or_default(),
        at: row.get_as::<Option<i64>>("stopped_at")?.unwrap_or_default(),
    }))
}

/// The runs of a sweep whose latest attempt was stopped early.
pub async fn stopped_in_sweep(
    pool: impl Into<PoolRef<'_>>,
    sweep_id: SweepId,
) -> sql::Result<HashMap<JobId, StoppedEarly>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let rows = sql::query(
            "SELECT e.job_id, e.rung AS stop_rung, e.cutoff AS stop_cutoff, e.reason AS stop_reason, e.stopped_at
         FROM jobs j
         JOIN early_stops e ON e.job_id = j.id AND e.attempt = j.attempt
         WHERE j.sweep_id = $1",
        )
        .bind(sweep_id.get())
        .fetch_all(pool)
        .await?;
        let mut stopped = HashMap::new();
        for row in &rows {
            if let Some(stop) = stopped_early_of(row)? {
                stopped.insert(JobId::new(row.get_as("job_id")?), stop);
            }
        }
        Ok(stopped)
    })
}

/// Where the sweep's controller stands; `None` for a sweep without one.
pub async fn state(pool: impl Into<PoolRef<'_>>, sweep_id: SweepId) -> anyhow::Result<Option<SearchState>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let row = sql::query(
            "SELECT method, seed, run_cap, proposed, open, early_stop, notes,
                (SELECT count(*) FROM jobs j
                 JOIN early_stops e ON e.job_id = j.id AND e.attempt = j.attempt
                 WHERE j.sweep_id = q.sweep_id) AS stopped_early
         FROM sweep_search q WHERE sweep_id = $1",
        )
        .bind(sweep_id.get())
        .fetch_optional(pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let method: String = row.get_as("method")?;
        let notes: String = row.get_as("notes")?;
        Ok(Some(SearchState {
            method: parse_method(&method),
            seed: row.get_as::<i64>("seed")? as u64,
            run_cap: row.get_as::<Option<i64>>("run_cap")?.map(|cap| cap as u64),
            proposed: row.get_as::<i64>("proposed")? as u64,
            open: row.flag_at("open")?,
            early_stop: row.flag_at("early_stop")?,
            stopped_early: row.get_as::<i64>("stopped_early")? as u64,
            notes: serde_json::from_str(&notes)?,
        }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_run_s_parameters_and_metric_are_read_back_to_the_last_digit() {
        let directory = tempfile::tempdir().unwrap();
        let db = crate::db::Db::open(directory.path()).await.unwrap();
        // 17 significant digits each: a 15-digit read (SQLite's JSON of a REAL) changes the
        // metrics. The parameters are stored JSON, read back as written.
        let setup = "INSERT INTO sweeps (id, name, form, source, job_count, created_at)
                 VALUES (1, 's', 'wandb', '', 1, 0);
             INSERT INTO jobs (id, sweep_id, idx, params, command, priority, created_at, status)
                 VALUES (1, 1, 0, '{\"x\": 4.0917454777520743, \"lr\": 0.00025982485752028451}', 'true', 0, 0, 'succeeded'),
                        (2, 1, 1, '{\"x\": 1e-300, \"lr\": 1}', 'true', 0, 0, 'succeeded'),
                        (3, 1, 2, '{\"x\": 2, \"lr\": 1}', 'true', 0, 0, 'failed');
             INSERT INTO job_metric_summaries (job_id, name, attempt, last_value, min_value, max_value, point_count)
                 VALUES (1, 'loss', 0, 0.30000000000000004, 0.30000000000000004, 1234.5678901234567, 1),
                        (2, 'loss', 0, -2.5e-310, -1e300, 5e-324, 1);";
        db.sqlite_connection().unwrap().unwrap().execute_batch(setup).unwrap();
        let mut reader = db.reader.acquire().await.unwrap();
        let rows = trials(reader.conn(), SweepId::new(1), "loss").await.unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].params["x"].as_f64(), Some(4.091745477752074));
        assert_eq!(rows[0].params["lr"].as_f64(), Some(0.0002598248575202845));
        assert_eq!((rows[0].min, rows[0].max), (Some(0.1 + 0.2), Some(1234.5678901234567)));
        // Huge, subnormal and negative values too; a run with no metric has none.
        assert_eq!((rows[1].min, rows[1].max), (Some(-1e300), Some(5e-324)));
        assert_eq!(rows[1].params["x"].as_f64(), Some(1e-300));
        assert_eq!((rows[2].min, rows[2].max, rows[2].status.as_str()), (None, None, "failed"));
    }
}
