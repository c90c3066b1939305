//! Preemptions (issue 29, item 3; migration 0014): the order on a running attempt, which its
//! worker's heartbeats carry (`db::jobs::extend_leases`), the reason its requeue records, and
//! the log of every order (`preemptions`).

use super::backend::{on_conn, Conn};
use super::sql;
use shared::api::JobId;

/// Orders the preemption of `job`'s running `attempt`, saying `reason`, at `now`; false (and
/// nothing changed) when it is not running as that attempt, a cancel is pending, or it was
/// ordered already.
pub async fn order(conn: impl Into<Conn<'_>>, job: JobId, attempt: u32, reason: &str, now: i64) -> sql::Result<bool> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let ordered = sql::query(
            "UPDATE jobs SET preempt_attempt = $2, preempt_reason = $3
             WHERE id = $1 AND status = 'running' AND attempt = $2 AND cancel_requested = 0
               AND (preempt_attempt IS NULL OR preempt_attempt <> $2)",
        )
        .bind(job.get())
        .bind(i64::from(attempt))
        .bind(reason)
        .execute(&mut *conn)
        .await?
        .rows_affected()
            == 1;
        if ordered {
            sql::query("INSERT INTO preemptions (job_id, attempt, at, reason) VALUES ($1, $2, $3, $4)")
                .bind(job.get())
                .bind(i64::from(attempt))
                .bind(now)
                .bind(reason)
                .execute(&mut *conn)
                .await?;
        }
        Ok(ordered)
    })
}

/// Why `job`'s `attempt` was preempted, if it was.
pub async fn reason_of(conn: impl Into<Conn<'_>>, job: JobId, attempt: u32) -> sql::Result<Option<String>> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let reason: Option<Option<String>> =
            sql::query_scalar("SELECT preempt_reason FROM jobs WHERE id = $1 AND preempt_attempt = $2")
                .bind(job.get())
                .bind(i64::from(attempt))
                .fetch_optional(&mut *conn)
                .await?;
        Ok(reason.flatten())
    })
}
