//! `job_events`: the append-only history of job transitions. Rows are written by the
//! `jobs_record_transition` trigger (migrations/), never by hand.

use shared::api::{JobEvent, JobId};
use sqlx::{Row, SqlitePool};

pub async fn list(pool: &SqlitePool, job_id: JobId) -> anyhow::Result<Vec<JobEvent>> {
    let rows = sqlx::query(
        "SELECT e.at, e.from_status, e.to_status, e.attempt, w.name AS worker, e.reason, e.gpu_ids, e.exit_code
         FROM job_events e LEFT JOIN workers w ON w.id = e.worker_id
         WHERE e.job_id = ? ORDER BY e.id",
    )
    .bind(job_id.get())
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| {
            let from: Option<String> = row.try_get("from_status")?;
            let to: String = row.try_get("to_status")?;
            Ok(JobEvent {
                at: row.try_get("at")?,
                from: from.map(|text| text.parse()).transpose().map_err(anyhow::Error::msg)?,
                to: to.parse().map_err(anyhow::Error::msg)?,
                attempt: row.try_get("attempt")?,
                worker: row.try_get("worker")?,
                reason: row.try_get("reason")?,
                gpus: super::jobs::gpu_ids_of(row)?,
                exit_code: row.try_get("exit_code")?,
            })
        })
        .collect()
}
