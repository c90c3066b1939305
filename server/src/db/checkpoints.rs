//! `checkpoints`: the newest checkpoint of each job (see migrations/0005_code.sql); and
//! `job_saves`: the latest save each running job made, as its worker saw it (0019).

use super::backend::{on_conn, on_exec, Conn, DbRow, Exec};
use super::sql;
use shared::api::{CheckpointInfo, JobId, SaveNote};

/// Records `info` as the job's checkpoint, replacing the one before.
pub async fn replace(conn: impl Into<Conn<'_>>, info: &CheckpointInfo) -> sql::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sql::query(
            "INSERT INTO checkpoints (job_id, attempt, size, sha256, uploaded_at) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (job_id) DO UPDATE SET attempt = excluded.attempt, size = excluded.size,
             sha256 = excluded.sha256, uploaded_at = excluded.uploaded_at",
        )
        .bind(info.job_id.get())
        .bind(i64::from(info.attempt))
        .bind(info.size as i64)
        .bind(&info.sha256)
        .bind(info.uploaded_at)
        .execute(&mut *conn)
        .await?;
        Ok(())
    })
}

/// The job's checkpoint, if an attempt uploaded one.
pub async fn get(executor: impl Into<Exec<'_>>, job: JobId) -> sql::Result<Option<CheckpointInfo>> {
    let executor = executor.into();
    on_exec!(executor, |executor, engine| {
        let row = sql::query("SELECT job_id, attempt, size, sha256, uploaded_at FROM checkpoints WHERE job_id = $1")
            .bind(job.get())
            .fetch_optional(executor)
            .await?;
        row.map(|row| {
            Ok(CheckpointInfo {
                job_id: JobId::new(row.get_as("job_id")?),
                attempt: row.u32_at("attempt")?,
                size: row.get_as::<i64>("size")? as u64,
                sha256: row.get_as("sha256")?,
                uploaded_at: row.get_as("uploaded_at")?,
            })
        })
        .transpose()
    })
}

/// Records the saves a worker's heartbeat told of (each attempt's latest), replacing what an
/// attempt before told.
pub async fn note_saves(conn: impl Into<Conn<'_>>, saves: &[SaveNote]) -> sql::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        for save in saves {
            sql::query(
                "INSERT INTO job_saves (job_id, attempt, saved_at, every_ms) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (job_id) DO UPDATE SET attempt = excluded.attempt, saved_at = excluded.saved_at,
                     every_ms = excluded.every_ms",
            )
            .bind(save.attempt.job_id.get())
            .bind(i64::from(save.attempt.attempt))
            .bind(save.at)
            .bind(save.every_ms)
            .execute(&mut *conn)
            .await?;
        }
        Ok(())
    })
}
