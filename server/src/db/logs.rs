//! The log columns of `job_attempts` (the bytes are files, see `queue::logs`), and the
//! `job_logs` table where older versions kept the bytes, read once to move them into files.

use super::backend::{on_conn, on_pool, Conn, DbRow, PoolRef};
use super::sql;
use shared::api::{JobId, SweepId};

/// How much of an attempt's log the server has: `received` counts bytes of the worker's log
/// file accounted for (acks and offsets of appends are in these), `stored` counts bytes kept
/// (what readers page through), which stops growing once `truncated`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogLength {
    pub received: u64,
    pub stored: u64,
    pub truncated: bool,
}

pub async fn length(conn: impl Into<Conn<'_>>, job: JobId, attempt: u32) -> sql::Result<LogLength> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let row = sql::query(
            "SELECT log_received, log_stored, log_truncated FROM job_attempts WHERE job_id = $1 AND attempt = $2",
        )
        .bind(job.get())
        .bind(i64::from(attempt))
        .fetch_optional(&mut *conn)
        .await?;
        let Some(row) = row else { return Ok(LogLength::default()) };
        Ok(LogLength {
            received: row.get_as::<i64>("log_received")? as u64,
            stored: row.get_as::<i64>("log_stored")? as u64,
            truncated: row.flag_at("log_truncated")?,
        })
    })
}

pub async fn set_length(conn: impl Into<Conn<'_>>, job: JobId, attempt: u32, length: LogLength) -> sql::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sql::query(
        "INSERT INTO job_attempts (job_id, attempt, log_received, log_stored, log_truncated) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (job_id, attempt) DO UPDATE SET log_received = excluded.log_received,
             log_stored = excluded.log_stored, log_truncated = excluded.log_truncated",
    )
    .bind(job.get())
    .bind(i64::from(attempt))
    .bind(length.received as i64)
    .bind(length.stored as i64)
    .bind(i64::from(length.truncated))
    .execute(&mut *conn)
    .await?;
        Ok(())
    })
}

/// Bytes kept of an attempt's log, for readers.
pub async fn stored_length(pool: impl Into<PoolRef<'_>>, job: JobId, attempt: u32) -> sql::Result<u64> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let stored: Option<i64> =
            sql::query_scalar("SELECT log_stored FROM job_attempts WHERE job_id = $1 AND attempt = $2")
                .bind(job.get())
                .bind(i64::from(attempt))
                .fetch_optional(pool)
                .await?;
        Ok(stored.unwrap_or(0) as u64)
    })
}

/// An attempt whose log bytes are still in the database (kept there by older versions),
/// with its sweep: `(sweep, job, attempt)`.
pub async fn first_stored_attempt(pool: impl Into<PoolRef<'_>>) -> sql::Result<Option<(SweepId, JobId, u32)>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let row =
            sql::query("SELECT j.sweep_id, l.job_id, l.attempt FROM job_logs l JOIN jobs j ON j.id = l.job_id LIMIT 1")
                .fetch_optional(pool)
                .await?;
        row.map(|row| {
            Ok((SweepId::new(row.get_as("sweep_id")?), JobId::new(row.get_as("job_id")?), row.u32_at("attempt")?))
        })
        .transpose()
    })
}

/// Up to about `max` log bytes kept in the database from `offset` on (whole chunks).
pub async fn read_blobs(
    pool: impl Into<PoolRef<'_>>,
    job: JobId,
    attempt: u32,
    offset: u64,
    max: u64,
) -> sql::Result<Vec<u8>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let rows = sql::query(
            "SELECT byte_offset, data FROM job_logs WHERE job_id = $1 AND attempt = $2 AND byte_offset >= $3
         ORDER BY byte_offset",
        )
        .bind(job.get())
        .bind(i64::from(attempt))
        .bind(offset.min(i64::MAX as u64) as i64)
        .fetch_all(pool)
        .await?;
        let mut bytes = Vec::new();
        for row in rows {
            let start = row.get_as::<i64>("byte_offset")? as u64;
            if start != offset + bytes.len() as u64 || bytes.len() as u64 >= max {
                break;
            }
            bytes.extend_from_slice(&row.get_as::<Vec<u8>>("data")?);
        }
        Ok(bytes)
    })
}

/// Drops an attempt's log bytes from the database once they are in a file.
pub async fn forget_blobs(conn: impl Into<Conn<'_>>, job: JobId, attempt: u32) -> sql::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sql::query("DELETE FROM job_logs WHERE job_id = $1 AND attempt = $2")
            .bind(job.get())
            .bind(i64::from(attempt))
            .execute(&mut *conn)
            .await?;
        Ok(())
    })
}
