//! `job_logs` (append-only log chunks) and the log columns of `job_attempts`.

use shared::api::JobId;
use sqlx::{Row, SqliteConnection, SqlitePool};

/// How much of an attempt's log the server has: `received` counts bytes of the worker's log
/// file accounted for (acks and offsets of appends are in these), `stored` counts bytes kept
/// (what readers page through), which stops growing once `truncated`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogLength {
    pub received: u64,
    pub stored: u64,
    pub truncated: bool,
}

pub async fn length(conn: &mut SqliteConnection, job: JobId, attempt: u32) -> sqlx::Result<LogLength> {
    let row = sqlx::query(
        "SELECT log_received, log_stored, log_truncated FROM job_attempts WHERE job_id = ? AND attempt = ?",
    )
    .bind(job.get())
    .bind(attempt)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(LogLength::default()) };
    Ok(LogLength {
        received: row.try_get::<i64, _>("log_received")? as u64,
        stored: row.try_get::<i64, _>("log_stored")? as u64,
        truncated: row.try_get("log_truncated")?,
    })
}

pub async fn set_length(conn: &mut SqliteConnection, job: JobId, attempt: u32, length: LogLength) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO job_attempts (job_id, attempt, log_received, log_stored, log_truncated) VALUES (?, ?, ?, ?, ?)
         ON CONFLICT (job_id, attempt) DO UPDATE SET log_received = excluded.log_received,
             log_stored = excluded.log_stored, log_truncated = excluded.log_truncated",
    )
    .bind(job.get())
    .bind(attempt)
    .bind(length.received as i64)
    .bind(length.stored as i64)
    .bind(length.truncated)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Stores one chunk starting at `offset` of the stored log.
pub async fn append(
    conn: &mut SqliteConnection,
    job: JobId,
    attempt: u32,
    offset: u64,
    data: &[u8],
) -> sqlx::Result<()> {
    sqlx::query("INSERT INTO job_logs (job_id, attempt, byte_offset, data) VALUES (?, ?, ?, ?)")
        .bind(job.get())
        .bind(attempt)
        .bind(offset as i64)
        .bind(data)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Bytes kept of an attempt's log, for readers.
pub async fn stored_length(pool: &SqlitePool, job: JobId, attempt: u32) -> sqlx::Result<u64> {
    let stored: Option<i64> =
        sqlx::query_scalar("SELECT log_stored FROM job_attempts WHERE job_id = ? AND attempt = ?")
            .bind(job.get())
            .bind(attempt)
            .fetch_optional(pool)
            .await?;
    Ok(stored.unwrap_or(0) as u64)
}

/// Up to `max` stored bytes from `offset` on.
pub async fn read(pool: &SqlitePool, job: JobId, attempt: u32, offset: u64, max: u64) -> sqlx::Result<Vec<u8>> {
    let end = offset.saturating_add(max);
    // The chunk holding `offset` starts at the largest chunk start <= offset; from there on the
    // index walks chunks in order, and stopping at `end` bounds what is fetched.
    let rows = sqlx::query(
        "SELECT byte_offset, data FROM job_logs
         WHERE job_id = ? AND attempt = ? AND byte_offset < ? AND byte_offset >= coalesce(
             (SELECT max(byte_offset) FROM job_logs WHERE job_id = ? AND attempt = ? AND byte_offset <= ?), 0)
         ORDER BY byte_offset",
    )
    .bind(job.get())
    .bind(attempt)
    .bind(end.min(i64::MAX as u64) as i64)
    .bind(job.get())
    .bind(attempt)
    .bind(offset.min(i64::MAX as u64) as i64)
    .fetch_all(pool)
    .await?;
    let mut bytes = Vec::new();
    for row in rows {
        let start = row.try_get::<i64, _>("byte_offset")? as u64;
        let data: Vec<u8> = row.try_get("data")?;
        let from = offset.saturating_sub(start).min(data.len() as u64) as usize;
        let to = (end.saturating_sub(start)).min(data.len() as u64) as usize;
        bytes.extend_from_slice(&data[from..to.max(from)]);
    }
    Ok(bytes)
}
