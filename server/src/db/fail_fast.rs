//! Sweeps that pause themselves when their runs keep failing (`shared::sweep::FailFast`
//! decides; this reads its inputs and records the pause). A paused sweep's queued jobs are
//! `held`, out of the claims' index (`claims::CLAIMABLE`); a job queued again while its sweep
//! is paused is held by the trigger `jobs_hold_when_paused` (migrations/0010).

use super::backend::{on_conn, Conn, DbRow};
use super::sql;
use shared::api::{JobId, SweepId};
use shared::sweep::FailFast;

/// Where a sweep stands on failures: its limits, whether it is paused, whether any run of it
/// ever succeeded, and the runs that failed since its last success or resume, newest first.
#[derive(Debug, Clone)]
pub struct Failures {
    pub fail_fast: FailFast,
    pub paused: bool,
    pub any_succeeded: bool,
    pub failed_in_a_row: Vec<FailedRun>,
}

/// A failed run: the job, its last attempt, its exit code and the reason recorded with it.
#[derive(Debug, Clone)]
pub struct FailedRun {
    pub job: JobId,
    pub attempt: u32,
    pub exit_code: Option<i64>,
    pub reason: Option<String>,
}

/// Reads [`Failures`] of `sweep_id`, listing as many failed runs as its larger limit (index
/// ranges of `jobs_by_sweep_status`: the last success, then the failures after it).
pub async fn failures(conn: impl Into<Conn<'_>>, sweep_id: SweepId) -> sql::Result<Option<Failures>> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, _engine| {
        let Some(sweep) = sql::query(
            "SELECT max_initial_failures, max_consecutive_failures, paused_at, resumed_at,
                    (SELECT max(finished_at) FROM jobs WHERE sweep_id = $1 AND status = 'succeeded') AS last_success
             FROM sweeps WHERE id = $2",
        )
        .bind(sweep_id.get())
        .bind(sweep_id.get())
        .fetch_optional(&mut *conn)
        .await?
        else {
            return Ok(None);
        };
        let limit_of =
            |column: &str| -> sql::Result<u32> { Ok(sweep.get_as::<i64>(column)?.clamp(0, u32::MAX.into()) as u32) };
        let fail_fast =
            FailFast { initial: limit_of("max_initial_failures")?, consecutive: limit_of("max_consecutive_failures")? };
        let last_success: Option<i64> = sweep.get_as("last_success")?;
        let resumed_at: Option<i64> = sweep.get_as("resumed_at")?;
        // After the last success, and from the resume on (a failure the writer applied after
        // the resume may share its millisecond). A failure in the last success's millisecond
        // counts when its transition was recorded after the success's (`job_events` ids follow
        // the writes): jobs that end together, or a test's, share milliseconds.
        let rows = sql::query(
            "SELECT id, attempt, exit_code, reason FROM jobs
             WHERE sweep_id = $1 AND status = 'failed' AND finished_at >= $3
               AND (finished_at > $2 OR (finished_at = $2
                    AND (SELECT max(e.id) FROM job_events e WHERE e.job_id = jobs.id AND e.to_status = 'failed')
                      > (SELECT max(e.id) FROM jobs s JOIN job_events e ON e.job_id = s.id
                         WHERE s.sweep_id = $1 AND s.status = 'succeeded' AND s.finished_at = $2
                           AND e.to_status = 'succeeded')))
             ORDER BY finished_at DESC, id DESC LIMIT $4",
        )
        .bind(sweep_id.get())
        .bind(last_success.unwrap_or(i64::MIN))
        .bind(resumed_at.unwrap_or(i64::MIN))
        .bind(fail_fast.initial.max(fail_fast.consecutive))
        .fetch_all(&mut *conn)
        .await?;
        let failed_in_a_row = rows
            .iter()
            .map(|row| {
                Ok(FailedRun {
                    job: JobId::new(row.get_as("id")?),
                    attempt: row.u32_at("attempt")?,
                    exit_code: row.get_as("exit_code")?,
                    reason: row.get_as("reason")?,
                })
            })
            .collect::<sql::Result<Vec<_>>>()?;
        Ok(Some(Failures {
            fail_fast,
            paused: sweep.get_as::<Option<i64>>("paused_at")?.is_some(),
            any_succeeded: last_success.is_some(),
            failed_in_a_row,
        }))
    })
}

/// Pauses `sweep_id` with `reason`, unless it already is, holding its queued jobs; returns
/// whether it was paused now.
pub async fn pause(conn: impl Into<Conn<'_>>, sweep_id: SweepId, reason: &str, now: i64) -> sql::Result<bool> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, _engine| {
        let done =
            sql::query("UPDATE sweeps SET paused_at = $1, paused_reason = $2 WHERE id = $3 AND paused_at IS NULL")
                .bind(now)
                .bind(reason)
                .bind(sweep_id.get())
                .execute(&mut *conn)
                .await?;
        if done.rows_affected() == 0 {
            return Ok(false);
        }
        // Rows of it still to be written are written held (`sweep_jobs`).
        sql::query("UPDATE jobs SET held = 1 WHERE sweep_id = $1 AND status = 'queued' AND held = 0")
            .bind(sweep_id.get())
            .execute(&mut *conn)
            .await?;
        Ok(true)
    })
}

/// Resumes `sweep_id` if paused, releasing its held jobs: its failures are counted again from
/// `now`. Returns whether it was paused.
pub async fn resume(conn: impl Into<Conn<'_>>, sweep_id: SweepId, now: i64) -> sql::Result<bool> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, _engine| {
        let done = sql::query(
            "UPDATE sweeps SET paused_at = NULL, paused_reason = NULL, resumed_at = $1
             WHERE id = $2 AND paused_at IS NOT NULL",
        )
        .bind(now)
        .bind(sweep_id.get())
        .execute(&mut *conn)
        .await?;
        if done.rows_affected() == 0 {
            return Ok(false);
        }
        sql::query("UPDATE jobs SET held = 0 WHERE sweep_id = $1 AND status = 'queued' AND held = 1")
            .bind(sweep_id.get())
            .execute(&mut *conn)
            .await?;
        super::sweep_jobs::hold_last_while_expanding(&mut *conn, sweep_id).await?;
        Ok(true)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failure_in_the_last_successs_millisecond_counts_only_if_it_came_after() {
        let directory = tempfile::tempdir().unwrap();
        let db = crate::db::Db::open(directory.path()).await.unwrap();
        // Job 4 fails, job 1 succeeds, jobs 2 and 3 fail: all in millisecond 1000.
        let setup = "INSERT INTO sweeps (id, name, form, source, job_count, created_at, max_consecutive_failures)
                 VALUES (1, 's', 'native', '', 4, 0, 3);
             INSERT INTO jobs (id, sweep_id, idx, params, command, priority, created_at) VALUES
                 (1, 1, 0, '{}', 'true', 0, 0), (2, 1, 1, '{}', 'true', 0, 0),
                 (3, 1, 2, '{}', 'true', 0, 0), (4, 1, 3, '{}', 'true', 0, 0);
             UPDATE jobs SET status = 'failed', finished_at = 1000 WHERE id = 4;
             UPDATE jobs SET status = 'succeeded', finished_at = 1000 WHERE id = 1;
             UPDATE jobs SET status = 'failed', finished_at = 1000 WHERE id = 2;
             UPDATE jobs SET status = 'failed', finished_at = 1000 WHERE id = 3;";
        db.sqlite_connection().unwrap().unwrap().execute_batch(setup).unwrap();
        let mut reader = db.reader.acquire().await.unwrap();
        let failures = failures(reader.conn(), SweepId::new(1)).await.unwrap().unwrap();
        let jobs: Vec<i64> = failures.failed_in_a_row.iter().map(|run| run.job.get()).collect();
        assert_eq!(jobs, [3, 2], "after the success, not before");
        assert!(failures.any_succeeded);
    }
}
