//! `checkpoints`: the newest checkpoint of each job (see migrations/0005_code.sql).

use shared::api::{CheckpointInfo, JobId};
use sqlx::{Row, SqliteConnection, SqliteExecutor};

/// Records `info` as the job's checkpoint, replacing the one before.
pub async fn replace(conn: &mut SqliteConnection, info: &CheckpointInfo) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO checkpoints (job_id, attempt, size, sha256, uploaded_at) VALUES (?, ?, ?, ?, ?)
         ON CONFLICT (job_id) DO UPDATE SET attempt = excluded.attempt, size = excluded.size,
             sha256 = excluded.sha256, uploaded_at = excluded.uploaded_at",
    )
    .bind(info.job_id.get())
    .bind(info.attempt)
    .bind(info.size as i64)
    .bind(&info.sha256)
    .bind(info.uploaded_at)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The job's checkpoint, if an attempt uploaded one.
pub async fn get<'e>(executor: impl SqliteExecutor<'e>, job: JobId) -> sqlx::Result<Option<CheckpointInfo>> {
    let row = sqlx::query("SELECT job_id, attempt, size, sha256, uploaded_at FROM checkpoints WHERE job_id = ?")
        .bind(job.get())
        .fetch_optional(executor)
        .await?;
    row.map(|row| {
        Ok(CheckpointInfo {
            job_id: JobId::new(row.try_get("job_id")?),
            attempt: row.try_get("attempt")?,
            size: row.try_get::<i64, _>("size")? as u64,
            sha256: row.try_get("sha256")?,
            uploaded_at: row.try_get("uploaded_at")?,
        })
    })
    .transpose()
}
