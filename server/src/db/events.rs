//! `job_events`: the append-only history of job transitions. Rows are written by the
//! `jobs_record_transition` trigger (migrations/), never by hand.

use super::backend::{on_pool, DbRow, PoolRef};
use super::sql;
use shared::api::{JobEvent, JobId};

pub async fn list(pool: impl Into<PoolRef<'_>>, job_id: JobId) -> anyhow::Result<Vec<JobEvent>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let rows = sql::query(
            "SELECT e.at, e.from_status, e.to_status, e.attempt, w.name AS worker, e.reason, e.gpu_ids, e.exit_code
         FROM job_events e LEFT JOIN workers w ON w.id = e.worker_id
         WHERE e.job_id = $1 ORDER BY e.id",
        )
        .bind(job_id.get())
        .fetch_all(pool)
        .await?;
        rows.iter()
            .map(|row| {
                let from: Option<String> = row.get_as("from_status")?;
                let to: String = row.get_as("to_status")?;
                Ok(JobEvent {
                    at: row.get_as("at")?,
                    from: from.map(|text| text.parse()).transpose().map_err(anyhow::Error::msg)?,
                    to: to.parse().map_err(anyhow::Error::msg)?,
                    attempt: row.u32_at("attempt")?,
                    worker: row.get_as("worker")?,
                    reason: row.get_as("reason")?,
                    gpus: super::jobs::gpu_ids_of(row)?,
                    exit_code: row.get_as::<Option<i64>>("exit_code")?.map(|code| code as i32),
                })
            })
            .collect()
    })
}
