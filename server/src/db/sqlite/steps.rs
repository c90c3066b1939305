//! SQLite's owner of the hot path: a write group's bare finishes, each with its worker's next
//! claim (`db::claims::Step`), on the writer's connection inside the group's transaction.
//!
//! Here a statement is a call on the writer's own thread, so each step is its one-row
//! statements in turn: the guarded finish, then, only if it applied, the result record and
//! the plain claim. A refused finish changes nothing, so a group needs no savepoints.

use crate::db::claims::{self, Finished, Step};

/// Applies `steps` (at most one per job: a second finish of a job in the same group would be
/// decided on a state the first one changed) and returns, step by step, what each did.
pub async fn finish_and_claim(conn: &mut rusqlite::Connection, steps: &[&Step]) -> anyhow::Result<Vec<Finished>> {
    let mut done = Vec::with_capacity(steps.len());
    for step in steps {
        done.push(one(conn, step).await?);
    }
    Ok(done)
}

async fn one(conn: &mut rusqlite::Connection, step: &Step) -> anyhow::Result<Finished> {
    let unless_metrics = step.version.is_some();
    let applied =
        crate::db::jobs::finish(&mut *conn, &step.seen, step.worker_id, &step.decision, step.now, unless_metrics)
            .await?;
    if !applied {
        return Ok(Finished::default());
    }
    let stored = match &step.version {
        Some(version) => crate::db::results::insert_uncharged(&mut *conn, version).await?,
        None => false,
    };
    let claimed = match step.claim {
        Some(claim) if claim.slots > 0 => claims::claim(&mut *conn, claim).await?,
        _ => Vec::new(),
    };
    Ok(Finished { applied, stored, claimed })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::claims::{ClaimedRow, PlainClaim};
    use crate::db::jobs::JobState;
    use shared::api::{JobId, ResultVersion, WorkerId};
    use shared::job::{Finish, JobStatus};

    /// A database with one sweep: jobs 1-2 at priority 0, 3 needing a GPU, 4 the trainer, 5-6
    /// at priority 5; job 1 already running on worker 1.
    async fn queue() -> (tempfile::TempDir, crate::db::Db, rusqlite::Connection) {
        let directory = tempfile::tempdir().unwrap();
        let db = crate::db::Db::open(directory.path()).await.unwrap();
        let conn = db.sqlite_connection().unwrap().unwrap();
        conn.execute_batch(
            "INSERT INTO sweeps (id, name, form, source, job_count, created_at) VALUES (1, 's', 'native', '', 6, 0);
             INSERT INTO workers (id, name, capacity, registered_at, last_seen_at) VALUES (1, 'w', '{}', 0, 0);
             INSERT INTO jobs (id, sweep_id, idx, params, command, priority, gpus, needs_trainer, created_at) VALUES
                 (1, 1, 0, '{}', 'true', 0, NULL, 0, 0), (2, 1, 1, '{}', 'true', 0, NULL, 0, 0),
                 (3, 1, 2, '{}', 'true', 9, 1, 0, 0), (4, 1, 3, '{}', 'true', 9, NULL, 1, 0),
                 (5, 1, 4, '{}', 'true', 5, 0, 0, 0), (6, 1, 5, '{}', 'true', 5, NULL, 0, 0);
             UPDATE jobs SET status = 'running', attempt = 1, worker_id = 1 WHERE id = 1;",
        )
        .unwrap();
        (directory, db, conn)
    }

    fn asking(slots: u32) -> PlainClaim {
        PlainClaim { worker_id: WorkerId::new(1), slots, trainer: false, lease_until: 100, now: 10 }
    }

    /// The finish of job 1 attempt `attempt` by worker 1, succeeded, claiming `claim`.
    fn step(attempt: u32, claim: Option<PlainClaim>, version: Option<ResultVersion>) -> Step {
        Step {
            seen: JobState::running_on_worker_1(1, 1, attempt),
            worker_id: WorkerId::new(1),
            decision: Finish { status: JobStatus::Succeeded, retries_left: 0, exit_code: Some(0), reason: None },
            now: 10,
            version,
            claim,
        }
    }

    fn bare_version() -> ResultVersion {
        ResultVersion {
            job_id: JobId::new(1),
            attempt: 1,
            path: "results/s/0/v1".into(),
            files: Vec::new(),
            record: Default::default(),
            params: serde_json::json!({"lr": 0.1}),
            metrics: Default::default(),
            stored_at: 10,
        }
    }

    fn ids(rows: &[ClaimedRow]) -> Vec<i64> {
        let mut ids: Vec<i64> = rows.iter().map(|row| row.id.get()).collect();
        ids.sort();
        ids
    }

    fn statuses(conn: &rusqlite::Connection) -> Vec<(i64, String)> {
        let mut statement = conn.prepare("SELECT id, status FROM jobs ORDER BY id").unwrap();
        statement.query_map([], |row| Ok((row.get(0)?, row.get(1)?))).unwrap().map(Result::unwrap).collect()
    }

    fn count(conn: &rusqlite::Connection, sql: &str) -> i64 {
        conn.query_row(sql, [], |row| row.get(0)).unwrap()
    }

    #[tokio::test]
    async fn a_finish_claims_only_jobs_without_gpus_or_the_trainer_and_records_both_transitions() {
        let (_directory, _db, mut conn) = queue().await;
        let done = finish_and_claim(&mut conn, &[&step(1, Some(asking(3)), None)]).await.unwrap();
        assert!(done[0].applied && !done[0].stored);
        assert_eq!(ids(&done[0].claimed), [2, 5, 6], "not the GPU job 3, not the trainer job 4");
        let expected = [(1, "succeeded"), (2, "running"), (3, "queued"), (4, "queued"), (5, "running"), (6, "running")];
        let expected: Vec<(i64, String)> = expected.iter().map(|(id, status)| (*id, status.to_string())).collect();
        assert_eq!(statuses(&conn), expected);
        assert_eq!(count(&conn, "SELECT count(*) FROM job_events"), 5, "the setup's claim, the finish, three claims");
        assert_eq!(count(&conn, "SELECT jobs FROM sweep_counts WHERE status = 'running'"), 3);
    }

    #[tokio::test]
    async fn a_refused_finish_stores_and_claims_nothing() {
        let (_directory, _db, mut conn) = queue().await;
        let done = finish_and_claim(&mut conn, &[&step(2, Some(asking(3)), Some(bare_version()))]).await.unwrap();
        assert!(!done[0].applied && !done[0].stored && done[0].claimed.is_empty());
        assert_eq!(statuses(&conn).iter().filter(|(_, status)| status == "queued").count(), 5);
        assert_eq!(count(&conn, "SELECT count(*) FROM results"), 0);
    }

    #[tokio::test]
    async fn the_version_and_the_claim_follow_the_finish_and_a_second_finish_changes_nothing() {
        let (_directory, _db, mut conn) = queue().await;
        let first = step(1, Some(asking(1)), Some(bare_version()));
        let done = finish_and_claim(&mut conn, &[&first]).await.unwrap();
        assert!(done[0].applied && done[0].stored);
        assert_eq!(ids(&done[0].claimed), [5], "the oldest job of the highest priority a plain worker may run");
        let again = finish_and_claim(&mut conn, &[&step(1, None, Some(bare_version()))]).await.unwrap();
        assert!(!again[0].applied && !again[0].stored, "the attempt is finished and keeps its first version");
        let stored: (String, String) = conn
            .query_row("SELECT path, params FROM results WHERE job_id = 1 AND attempt = 1", [], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })
            .unwrap();
        assert_eq!(stored, ("results/s/0/v1".to_string(), r#"{"lr":0.1}"#.to_string()));
    }

    #[tokio::test]
    async fn a_version_made_without_metrics_is_neither_stored_nor_finished_once_the_attempt_has_some() {
        let (_directory, _db, mut conn) = queue().await;
        conn.execute(
            "INSERT INTO job_metric_summaries (job_id, name, attempt, last_value, min_value, max_value, point_count)
             VALUES (1, 'loss', 1, 0.5, 0.5, 0.5, 1)",
            [],
        )
        .unwrap();
        let done = finish_and_claim(&mut conn, &[&step(1, Some(asking(1)), Some(bare_version()))]).await.unwrap();
        assert!(!done[0].applied && !done[0].stored && done[0].claimed.is_empty());
        assert_eq!(statuses(&conn)[0], (1, "running".to_string()));
        // Without a version the metrics do not matter: the finish applies.
        let done = finish_and_claim(&mut conn, &[&step(1, None, None)]).await.unwrap();
        assert!(done[0].applied);
    }

    #[tokio::test]
    async fn a_claim_takes_the_best_jobs_first_up_to_its_slots() {
        let (_directory, _db, mut conn) = queue().await;
        let rows = claims::claim(&mut conn, PlainClaim { trainer: true, ..asking(2) }).await.unwrap();
        assert_eq!(
            ids(&rows),
            [4, 5],
            "the trainer job (priority 9) for a worker that has it, then the oldest of priority 5"
        );
    }
}
