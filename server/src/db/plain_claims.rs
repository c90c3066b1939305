//! Claims of a worker without GPUs in one statement, and a finishing attempt's guarded UPDATE
//! together with its worker's next claim in one round trip to SQLite.
//!
//! Every statement is a hop to sqlx's SQLite thread and back (two thread switches), and under
//! short jobs those hops, not SQLite's own work, were most of the server's CPU. For a worker
//! that reports no GPU, `shared::placement::place` accepts exactly the jobs that
//! [`super::jobs::queued_candidates`] lets through (no GPUs asked, no GPU memory, the trainer
//! only if the worker has it), with an empty placement; so the look and the UPDATE can be one
//! statement, and the jobs handed out are the same as by the two-step claim.

use super::jobs::JobState;
use shared::api::WorkerId;
use shared::job::Finish;
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection};

/// `queued -> running` for the first `?5` queued jobs in dispatch order that need no GPU and
/// the trainer only if `?4`, for worker `?1`; the same columns as `jobs::mark_running`, plus
/// `priority` for the dispatch order (RETURNING has none of its own). Parameters start at `?1`
/// here; [`finish_and_claim`] shifts them and adds its `fence`.
fn claim_sql(first: usize, fence: &str) -> String {
    let at = |n: usize| format!("?{}", first + n - 1);
    format!(
        "UPDATE jobs SET status = 'running', attempt = attempt + 1, worker_id = {w}, gpu_ids = '[]',
                lease_expires_at = {lease}, started_at = {now}, finished_at = NULL, exit_code = NULL,
                reason = NULL, cancel_requested = 0
         WHERE {fence}status = 'queued' AND id IN (
             SELECT id FROM jobs INDEXED BY jobs_queue
             WHERE status = 'queued' AND (gpus IS NULL OR gpus <= 0) AND (gpu_memory IS NULL OR gpu_memory <= 0)
               AND (needs_trainer = 0 OR {trainer})
             ORDER BY priority DESC, id LIMIT {slots})
         RETURNING id, attempt, sweep_id, idx, params, command, config, gpus, gpu_memory, exclusive,
                   needs_trainer, timeout_secs, lease_expires_at, priority",
        w = at(1),
        lease = at(2),
        now = at(3),
        trainer = at(4),
        slots = at(5),
    )
}

/// What a claim of a worker without GPUs asks for.
#[derive(Debug, Clone, Copy)]
pub struct PlainClaim {
    pub worker_id: WorkerId,
    pub slots: u32,
    pub trainer: bool,
    pub lease_until: i64,
    pub now: i64,
}

/// Claims up to `claim.slots` jobs in one statement; returns the claimed rows (any order).
pub async fn claim(conn: &mut SqliteConnection, claim: PlainClaim) -> sqlx::Result<Vec<SqliteRow>> {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    sqlx::query(SQL.get_or_init(|| claim_sql(1, "")))
        .bind(claim.worker_id.get())
        .bind(claim.lease_until)
        .bind(claim.now)
        .bind(claim.trainer)
        .bind(claim.slots)
        .fetch_all(&mut *conn)
        .await
}

/// The finish's guarded UPDATE (`jobs::finish`, the same guard) and then, only if it applied,
/// [`claim`], in one query string: sqlx's SQLite driver runs every statement of a query in
/// one command of its thread, so this is one round trip instead of two. Returns whether the
/// finish applied and the claimed rows.
///
/// The claim is fenced by `changes() = 1`, SQLite's count of the rows the statement before
/// changed (the finish itself, not its triggers), so a refused finish claims nothing even
/// before its unit is rolled back. The finish returns its row's id, which tells the two
/// statements' rows apart (the claim's have `priority`). sqlx has marked queries of several
/// statements for removal (launchbadge/sqlx#3108); should a release refuse them, this becomes
/// `jobs::finish` followed by [`claim`], with the same effect.
pub async fn finish_and_claim(
    conn: &mut SqliteConnection,
    seen: &JobState,
    worker_id: WorkerId,
    decision: &Finish,
    claim: PlainClaim,
) -> sqlx::Result<(bool, Vec<SqliteRow>)> {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let sql = SQL.get_or_init(|| {
        let claim = claim_sql(12, "changes() = 1 AND ");
        format!("{} RETURNING id AS finished;\n{claim}", super::jobs::FINISH_SQL)
    });
    let mut rows = sqlx::query(sql)
        .bind(decision.status.as_str())
        .bind(decision.retries_left)
        .bind(decision.exit_code)
        .bind(decision.reason.as_deref())
        .bind(decision.status.is_terminal())
        .bind(claim.now)
        .bind(seen.id.get())
        .bind(seen.attempt)
        .bind(worker_id.get())
        .bind(seen.retries_left)
        .bind(seen.cancel_requested)
        .bind(claim.worker_id.get())
        .bind(claim.lease_until)
        .bind(claim.now)
        .bind(claim.trainer)
        .bind(claim.slots)
        .fetch_all(&mut *conn)
        .await?;
    let finished = rows.first().is_some_and(|row| row.try_get::<i64, _>("finished").is_ok());
    if finished {
        rows.remove(0);
    }
    Ok((finished, rows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::api::{JobId, SweepId};
    use shared::job::JobStatus;

    /// A database with one sweep: jobs 1-2 at priority 0, 3 needing a GPU, 4 the trainer, 5-6
    /// at priority 5; job 1 already running on worker 1.
    async fn queue() -> (tempfile::TempDir, super::super::Db) {
        let directory = tempfile::tempdir().unwrap();
        let db = super::super::Db::open(directory.path()).await.unwrap();
        let setup =
            "INSERT INTO sweeps (id, name, form, source, job_count, created_at) VALUES (1, 's', 'native', '', 6, 0);
             INSERT INTO workers (id, name, capacity, registered_at, last_seen_at) VALUES (1, 'w', '{}', 0, 0);
             INSERT INTO jobs (id, sweep_id, idx, params, command, priority, gpus, needs_trainer, created_at) VALUES
                 (1, 1, 0, '{}', 'true', 0, NULL, 0, 0), (2, 1, 1, '{}', 'true', 0, NULL, 0, 0),
                 (3, 1, 2, '{}', 'true', 9, 1, 0, 0), (4, 1, 3, '{}', 'true', 9, NULL, 1, 0),
                 (5, 1, 4, '{}', 'true', 5, 0, 0, 0), (6, 1, 5, '{}', 'true', 5, NULL, 0, 0);
             UPDATE jobs SET status = 'running', attempt = 1, worker_id = 1 WHERE id = 1;";
        sqlx::raw_sql(setup).execute(&db.writer).await.unwrap();
        (directory, db)
    }

    fn seen(attempt: u32) -> JobState {
        JobState {
            id: JobId::new(1),
            sweep_id: SweepId::new(1),
            status: JobStatus::Running,
            attempt,
            worker_id: Some(WorkerId::new(1)),
            retries_left: 0,
            crash_count: 0,
            cancel_requested: false,
        }
    }

    fn succeeded() -> Finish {
        Finish { status: JobStatus::Succeeded, retries_left: 0, exit_code: Some(0), reason: None }
    }

    fn asking(slots: u32) -> PlainClaim {
        PlainClaim { worker_id: WorkerId::new(1), slots, trainer: false, lease_until: 100, now: 10 }
    }

    async fn statuses(db: &super::super::Db) -> Vec<(i64, String)> {
        sqlx::query_as("SELECT id, status FROM jobs ORDER BY id").fetch_all(&db.reader).await.unwrap()
    }

    #[tokio::test]
    async fn a_finish_claims_only_jobs_without_gpus_or_the_trainer_and_records_both_transitions() {
        let (_directory, db) = queue().await;
        let mut conn = db.writer.acquire().await.unwrap();
        let (finished, rows) =
            finish_and_claim(&mut conn, &seen(1), WorkerId::new(1), &succeeded(), asking(3)).await.unwrap();
        assert!(finished);
        let mut claimed: Vec<i64> = rows.iter().map(|row| row.try_get("id").unwrap()).collect();
        claimed.sort();
        assert_eq!(claimed, [2, 5, 6], "not the GPU job 3, not the trainer job 4");
        drop(conn);
        let expected = [(1, "succeeded"), (2, "running"), (3, "queued"), (4, "queued"), (5, "running"), (6, "running")];
        let expected: Vec<(i64, String)> = expected.iter().map(|(id, status)| (*id, status.to_string())).collect();
        assert_eq!(statuses(&db).await, expected);
        let history: i64 = sqlx::query_scalar("SELECT count(*) FROM job_events").fetch_one(&db.reader).await.unwrap();
        assert_eq!(history, 5, "the setup's claim of job 1, its finish, three claims");
        let counted: i64 = sqlx::query_scalar("SELECT jobs FROM sweep_counts WHERE status = 'running'")
            .fetch_one(&db.reader)
            .await
            .unwrap();
        assert_eq!(counted, 3);
    }

    #[tokio::test]
    async fn a_refused_finish_claims_nothing() {
        let (_directory, db) = queue().await;
        let mut conn = db.writer.acquire().await.unwrap();
        let stale = seen(2);
        let (finished, rows) =
            finish_and_claim(&mut conn, &stale, WorkerId::new(1), &succeeded(), asking(3)).await.unwrap();
        assert!(!finished && rows.is_empty());
        drop(conn);
        let queued = statuses(&db).await.into_iter().filter(|(_, status)| status == "queued").count();
        assert_eq!(queued, 5, "every queued job is still queued");
    }

    #[tokio::test]
    async fn a_claim_takes_the_best_jobs_first_up_to_its_slots() {
        let (_directory, db) = queue().await;
        let mut conn = db.writer.acquire().await.unwrap();
        let rows = claim(&mut conn, PlainClaim { trainer: true, ..asking(2) }).await.unwrap();
        let mut claimed: Vec<i64> = rows.iter().map(|row| row.try_get("id").unwrap()).collect();
        claimed.sort();
        assert_eq!(
            claimed,
            [4, 5],
            "the trainer job (priority 9) for a worker that has it, then the oldest of priority 5"
        );
    }
}
