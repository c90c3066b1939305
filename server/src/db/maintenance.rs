//! Bulk maintenance of the queue: retrying many jobs in one statement, and removing a finished
//! sweep with everything recorded about its jobs.
//!
//! Both are guarded by the statuses they expect, in SQL: a retry only touches jobs still in a
//! retryable status, and a sweep is removed only if none of its jobs is queued or running when
//! the statements run. Callers run them inside one transaction on the writer.

use super::backend::{on_conn, Conn};
use super::sql;
use shared::api::{JobId, SweepId};
use shared::job::JobStatus;

/// Statuses as a JSON array, bound once and read with `json_each` (the decision of which
/// statuses qualify stays with `shared::job`).
fn statuses(statuses: &[JobStatus]) -> String {
    let names: Vec<&str> = statuses.iter().map(|status| status.as_str()).collect();
    serde_json::Value::from(names).to_string()
}

const RETRY_SET: &str = "SET status = 'queued', reason = 'retried', exit_code = NULL, finished_at = NULL,
         lease_expires_at = NULL, cancel_requested = 0, crash_count = 0,
         worker_id = NULL, gpu_ids = NULL, started_at = NULL";

/// Puts the listed jobs that are in one of `from` back in the queue; returns their ids.
pub async fn retry_jobs(conn: impl Into<Conn<'_>>, ids: &[JobId], from: &[JobStatus]) -> anyhow::Result<Vec<JobId>> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let mut retried: Vec<i64> = sql::query_scalar(&format!(
            "UPDATE jobs {RETRY_SET}
         WHERE id IN (SELECT {}) AND status IN (SELECT {})
         RETURNING id",
            engine.json_ids(1),
            engine.json_texts(2)
        ))
        .bind(serde_json::to_string(ids)?)
        .bind(statuses(from))
        .fetch_all(&mut *conn)
        .await?;
        retried.sort_unstable();
        Ok(retried.into_iter().map(JobId::new).collect())
    })
}

/// Puts every job of the sweep that is in one of `from` back in the queue; returns their ids.
pub async fn retry_sweep(
    conn: impl Into<Conn<'_>>,
    sweep_id: SweepId,
    from: &[JobStatus],
) -> anyhow::Result<Vec<JobId>> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let mut retried: Vec<i64> = sql::query_scalar(&format!(
            "UPDATE jobs {RETRY_SET}
         WHERE sweep_id = $1 AND status IN (SELECT {})
         RETURNING id",
            engine.json_texts(2)
        ))
        .bind(sweep_id.get())
        .bind(statuses(from))
        .fetch_all(&mut *conn)
        .await?;
        retried.sort_unstable();
        Ok(retried.into_iter().map(JobId::new).collect())
    })
}

/// Jobs of the sweep that are queued or running.
pub async fn unfinished_jobs(conn: impl Into<Conn<'_>>, sweep_id: SweepId) -> sql::Result<u64> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let count: i64 =
            sql::query_scalar("SELECT count(*) FROM jobs WHERE sweep_id = $1 AND status IN ('queued', 'running')")
                .bind(sweep_id.get())
                .fetch_one(&mut *conn)
                .await?;
        Ok(count as u64)
    })
}

/// A result version on disk, to remove once the removal is committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovedVersion {
    pub job_id: JobId,
    pub attempt: u32,
    /// Relative to the data dir.
    pub path: String,
}

/// What [`delete_sweep`] removed from the database.
#[derive(Debug, Default)]
pub struct SweepRemoval {
    /// The removed jobs.
    pub job_ids: Vec<JobId>,
    pub versions: Vec<RemovedVersion>,
}

/// The tables holding rows per job, children first; each row goes with its job.
const JOB_TABLES: [&str; 7] =
    ["job_events", "job_logs", "job_metrics", "job_metric_summaries", "job_attempts", "staged_files", "results"];

/// Removes the sweep, its jobs and every row about them, if none of its jobs is queued or
/// running. Returns `None` (and the caller rolls back) when the guard failed: a job started or
/// was queued again meanwhile, or the sweep is gone.
pub async fn delete_sweep(conn: impl Into<Conn<'_>>, sweep_id: SweepId) -> anyhow::Result<Option<SweepRemoval>> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        // Only jobs in a terminal status are touched: a job still queued or running keeps its rows,
        // and then the sweep itself cannot go (checked last), so the caller rolls everything back.
        const FINISHED: &str =
            "SELECT id FROM jobs WHERE sweep_id = $1 AND status IN ('succeeded', 'failed', 'cancelled')";
        let versions: Vec<(i64, i64, String)> =
            sql::query_as(&format!("SELECT job_id, attempt, path FROM results WHERE job_id IN ({FINISHED})"))
                .bind(sweep_id.get())
                .fetch_all(&mut *conn)
                .await?;
        for table in JOB_TABLES {
            sql::query(&format!("DELETE FROM {table} WHERE job_id IN ({FINISHED})"))
                .bind(sweep_id.get())
                .execute(&mut *conn)
                .await?;
        }
        let job_ids: Vec<i64> = sql::query_scalar(&format!("DELETE FROM jobs WHERE id IN ({FINISHED}) RETURNING id"))
            .bind(sweep_id.get())
            .fetch_all(&mut *conn)
            .await?;
        // Moves first, then counts: the order `sweeps::fold_count_moves` takes them in, so the
        // two never wait for each other in a cycle.
        for counts in ["sweep_count_moves", "sweep_counts"] {
            sql::query(&format!("DELETE FROM {counts} WHERE sweep_id = $1"))
                .bind(sweep_id.get())
                .execute(&mut *conn)
                .await?;
        }
        let removed =
            // Nor while rows of it are still to be written (`sweep_jobs`): they are queued jobs.
            sql::query(
                "DELETE FROM sweeps WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM jobs WHERE sweep_id = $2)
                   AND NOT EXISTS (SELECT 1 FROM job_expansions WHERE sweep_id = $3)",
            )
            .bind(sweep_id.get())
            .bind(sweep_id.get())
            .bind(sweep_id.get())
            .execute(&mut *conn)
            .await?
            .rows_affected();
        if removed != 1 {
            return Ok(None);
        }
        let versions = versions
            .into_iter()
            .map(|(job_id, attempt, path)| RemovedVersion { job_id: JobId::new(job_id), attempt: attempt as u32, path })
            .collect();
        Ok(Some(SweepRemoval { job_ids: job_ids.into_iter().map(JobId::new).collect(), versions }))
    })
}
