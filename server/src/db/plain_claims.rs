//! Claims of a worker without GPUs in one statement, and a finishing attempt's guarded UPDATE
//! together with its worker's next claim in one round trip to SQLite.
//!
//! Every statement is a hop to sqlx's SQLite thread and back (two thread switches), and under
//! short jobs those hops, not SQLite's own work, were most of the server's CPU. For a worker
//! that reports no GPU, `shared::placement::place` accepts exactly the jobs that
//! [`super::jobs::queued_candidates`] lets through (no GPUs asked, no GPU memory, the trainer
//! only if the worker has it), with an empty placement; so the look and the UPDATE can be one
//! statement, and the jobs handed out are the same as by the two-step claim.

use super::backend::{on_conn, Conn, DbRow};
use super::jobs::JobState;
use shared::api::{JobId, ResultVersion, SweepId, WorkerId};
use shared::job::Finish;
use shared::sweep::Resources;
use sqlx::{Row, SqliteConnection};

/// A job as a claim left it: the columns every claim returns (`jobs::mark_running`, the
/// plain claim below and its twin on the writer's own connection, `db::fast`).
#[derive(Debug, Clone)]
pub struct ClaimedRow {
    pub id: JobId,
    pub attempt: u32,
    pub sweep_id: SweepId,
    pub index: u64,
    /// The parameters, as stored (a JSON object).
    pub params: String,
    pub command: String,
    pub config: Option<String>,
    pub resources: Resources,
    pub timeout_secs: Option<i64>,
    pub lease_expires_at: i64,
    pub priority: i64,
    pub worker_id: Option<WorkerId>,
    pub retries_left: u32,
    pub crash_count: u32,
}

impl ClaimedRow {
    pub fn from_row(row: &impl DbRow) -> sqlx::Result<ClaimedRow> {
        Ok(ClaimedRow {
            id: JobId::new(row.get_as("id")?),
            attempt: row.u32_at("attempt")?,
            sweep_id: SweepId::new(row.get_as("sweep_id")?),
            index: row.get_as::<i64>("idx")? as u64,
            params: row.get_as("params")?,
            command: row.get_as("command")?,
            config: row.get_as("config")?,
            resources: super::jobs::resources_of(row)?,
            timeout_secs: row.get_as("timeout_secs")?,
            lease_expires_at: row.get_as("lease_expires_at")?,
            priority: row.get_as("priority")?,
            worker_id: row.get_as::<Option<i64>>("worker_id")?.map(WorkerId::new),
            retries_left: row.u32_at("retries_left")?,
            crash_count: row.u32_at("crash_count")?,
        })
    }
}

/// The columns a claim returns, in [`ClaimedRow`]'s order.
pub const CLAIMED_COLUMNS: &str = "id, attempt, sweep_id, idx, params, command, config, gpus, gpu_memory, exclusive, \
     needs_trainer, timeout_secs, lease_expires_at, priority, worker_id, retries_left, crash_count";

/// `queued -> running` for the first `?5` queued jobs in dispatch order that need no GPU and
/// the trainer only if `?4`, for worker `?1`, returning [`CLAIMED_COLUMNS`] (`priority` gives
/// the dispatch order: RETURNING has none of its own). Parameters start at `?1` here; [`finish_and_claim`] shifts them and adds its `fence`.
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
         RETURNING {CLAIMED_COLUMNS}",
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

/// The plain claim's statement on its own, parameters `?1`-`?5` (also `db::fast`'s).
pub fn plain_claim_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| claim_sql(1, ""))
}

/// Claims up to `claim.slots` jobs in one statement; returns the claimed rows (any order).
/// On PostgreSQL the chosen rows are locked as they are picked and rows another replica's
/// claim holds are skipped (`FOR UPDATE SKIP LOCKED`): two claims at once get different jobs,
/// and neither waits for the other.
pub async fn claim(conn: impl Into<Conn<'_>>, claim: PlainClaim) -> sqlx::Result<Vec<ClaimedRow>> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        static POSTGRES: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let sql = engine.pick(plain_claim_sql(), POSTGRES.get_or_init(postgres_claim_sql));
        let rows = sqlx::query(sql)
            .bind(claim.worker_id.get())
            .bind(claim.lease_until)
            .bind(claim.now)
            .bind(claim.trainer)
            .bind(i64::from(claim.slots))
            .fetch_all(&mut *conn)
            .await?;
        rows.iter().map(ClaimedRow::from_row).collect()
    })
}

/// [`plain_claim_sql`] for PostgreSQL: `$N` parameters, and the jobs picked in a CTE that
/// locks them as it chooses them and skips those another transaction holds (`FOR UPDATE SKIP
/// LOCKED`), materialized once: the UPDATE changes exactly the rows picked.
fn postgres_claim_sql() -> String {
    let sqlite = super::backend::dollars(plain_claim_sql());
    let (set, _) = sqlite.split_once(" WHERE ").expect("the claim has a WHERE");
    format!(
        "WITH picked AS (
             SELECT id AS picked FROM jobs
             WHERE status = 'queued' AND (gpus IS NULL OR gpus <= 0) AND (gpu_memory IS NULL OR gpu_memory <= 0)
               AND (needs_trainer = 0 OR $4)
             ORDER BY priority DESC, id LIMIT $5 FOR UPDATE SKIP LOCKED)
         {set} FROM picked WHERE jobs.id = picked.picked
         RETURNING {CLAIMED_COLUMNS}"
    )
}

/// What [`finish_and_claim`] sends to SQLite in one query string.
pub struct FinishStep<'a> {
    /// Statements owed before anything else (`queue::Tx::owed`).
    pub pending: Option<&'static str>,
    /// The state the decision was made on; the UPDATE is guarded by it.
    pub seen: &'a JobState,
    pub worker_id: WorkerId,
    pub decision: &'a Finish,
    pub now: i64,
    /// A result version without files, recorded before the finish.
    pub version: Option<&'a ResultVersion>,
    /// The worker's next claim, made only if the finish applied.
    pub claim: Option<PlainClaim>,
}

/// What [`finish_and_claim`] did.
pub struct Finished {
    /// Whether the guarded UPDATE applied (the job was still as `seen`).
    pub applied: bool,
    /// Whether the version was recorded (false if the attempt had one already).
    pub stored: bool,
    /// The claimed rows, in no particular order.
    pub claimed: Vec<ClaimedRow>,
}

/// More than the parameters the statements of a step skip in all (11 before the claim's own,
/// 16 before the version's).
const SPARE_ARGUMENTS: usize = 32;

/// The statements after the owed ones, for a step with or without a version and a claim.
/// A version is made without metric summaries (the caller saw none), so with one, the INSERT
/// and the finish both require that the attempt still has none: else neither applies, and the
/// caller's full path makes the version with them.
fn step_sql(version: bool, claim: bool) -> &'static str {
    static SQL: [std::sync::OnceLock<String>; 4] = [const { std::sync::OnceLock::new() }; 4];
    SQL[usize::from(version) | usize::from(claim) << 1].get_or_init(|| {
        let mut statements = Vec::new();
        // Parameters: the finish's ?1-?11, then the claim's, then the version's.
        let version_first = if claim { 17 } else { 12 };
        let finish = match version {
            true => {
                statements.push(super::results::insert_sql(version_first, true));
                finish_unless_metrics_sql()
            }
            false => super::jobs::FINISH_SQL,
        };
        statements.push(format!("{finish} RETURNING id AS finished"));
        if claim {
            statements.push(claim_sql(12, "changes() = 1 AND "));
        }
        statements.join(";\n")
    })
}

/// `jobs::FINISH_SQL` that also requires the attempt to have no metric summaries (for a finish
/// that records a version made without them).
pub fn finish_unless_metrics_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        format!(
            "{} AND NOT EXISTS (SELECT 1 FROM job_metric_summaries m WHERE m.job_id = ?7 AND m.attempt = ?8)",
            super::jobs::FINISH_SQL
        )
    })
}

/// The finish's guarded UPDATE (`jobs::finish`, the same guard), with the statements owed
/// before it, the version without files before it, and then, only if it applied, [`claim`]:
/// one query string, so one round trip to sqlx's SQLite thread, which runs every statement
/// of a query in one command.
///
/// The claim is fenced by `changes() = 1`, SQLite's count of the rows the statement before
/// changed (the finish itself, not its triggers), so a refused finish claims nothing even
/// before its unit is rolled back; the version is recorded either way, and a refused finish's
/// unit is rolled back or goes on to record it anyway. Rows tell the statements apart by their
/// columns: `stored` (the version's), `finished` (the finish's), `priority` (the claim's).
/// sqlx has marked queries of several statements for removal (launchbadge/sqlx#3108); should a
/// release refuse them, this becomes one call per statement, with the same effect.
pub async fn finish_and_claim(conn: &mut SqliteConnection, step: FinishStep<'_>) -> anyhow::Result<Finished> {
    let rest = step_sql(step.version.is_some(), step.claim.is_some());
    let sql = match step.pending {
        Some(pending) => std::borrow::Cow::Owned(format!("{pending};\n{rest}")),
        None => std::borrow::Cow::Borrowed(rest),
    };
    let (seen, decision) = (step.seen, step.decision);
    let mut query = sqlx::query(&sql)
        .bind(decision.status.as_str())
        .bind(decision.retries_left)
        .bind(decision.exit_code)
        .bind(decision.reason.as_deref())
        .bind(decision.status.is_terminal())
        .bind(step.now)
        .bind(seen.id.get())
        .bind(seen.attempt)
        .bind(step.worker_id.get())
        .bind(seen.retries_left)
        .bind(seen.cancel_requested);
    if let Some(claim) = step.claim {
        query = query
            .bind(claim.worker_id.get())
            .bind(claim.lease_until)
            .bind(claim.now)
            .bind(claim.trainer)
            .bind(claim.slots);
    }
    if let Some(version) = step.version {
        query = super::results::bind_version(query, version)?;
    }
    // sqlx binds a statement's parameters that it does not use itself (the claim's `?1`-`?11`,
    // the version's `?1`-`?16`) to the next arguments in turn, and stops binding that
    // statement at the first one past the end, leaving its own `?12`... NULL. Spare arguments
    // keep it going (the step test fails without them).
    for _ in 0..SPARE_ARGUMENTS {
        query = query.bind(None::<i64>);
    }
    let rows = query.fetch_all(&mut *conn).await?;
    let mut finished = Finished { applied: false, stored: false, claimed: Vec::new() };
    for row in rows {
        if row.try_get::<i64, _>("finished").is_ok() {
            finished.applied = true;
        } else if row.try_get::<i64, _>("stored").is_ok() {
            finished.stored = true;
        } else {
            finished.claimed.push(ClaimedRow::from_row(&row)?);
        }
    }
    Ok(finished)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::api::JobId;
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
        sqlx::raw_sql(setup).execute(db.sqlite_writer().unwrap()).await.unwrap();
        (directory, db)
    }

    fn seen(attempt: u32) -> JobState {
        JobState::running_on_worker_1(1, 1, attempt)
    }

    fn succeeded() -> Finish {
        Finish { status: JobStatus::Succeeded, retries_left: 0, exit_code: Some(0), reason: None }
    }

    fn asking(slots: u32) -> PlainClaim {
        PlainClaim { worker_id: WorkerId::new(1), slots, trainer: false, lease_until: 100, now: 10 }
    }

    /// The finish of job 1 attempt `attempt` by worker 1, claiming `claim`.
    fn step<'a>(seen: &'a JobState, decision: &'a Finish, claim: Option<PlainClaim>) -> FinishStep<'a> {
        FinishStep { pending: None, seen, worker_id: WorkerId::new(1), decision, now: 10, version: None, claim }
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

    async fn statuses(db: &super::super::Db) -> Vec<(i64, String)> {
        sqlx::query_as("SELECT id, status FROM jobs ORDER BY id").fetch_all(db.reader.sqlite().unwrap()).await.unwrap()
    }

    #[tokio::test]
    async fn a_finish_claims_only_jobs_without_gpus_or_the_trainer_and_records_both_transitions() {
        let (_directory, db) = queue().await;
        let mut conn = db.sqlite_writer().unwrap().acquire().await.unwrap();
        let (seen, decision) = (seen(1), succeeded());
        let done = finish_and_claim(&mut conn, step(&seen, &decision, Some(asking(3)))).await.unwrap();
        assert!(done.applied && !done.stored);
        assert_eq!(ids(&done.claimed), [2, 5, 6], "not the GPU job 3, not the trainer job 4");
        drop(conn);
        let expected = [(1, "succeeded"), (2, "running"), (3, "queued"), (4, "queued"), (5, "running"), (6, "running")];
        let expected: Vec<(i64, String)> = expected.iter().map(|(id, status)| (*id, status.to_string())).collect();
        assert_eq!(statuses(&db).await, expected);
        let history: i64 =
            sqlx::query_scalar("SELECT count(*) FROM job_events").fetch_one(db.reader.sqlite().unwrap()).await.unwrap();
        assert_eq!(history, 5, "the setup's claim of job 1, its finish, three claims");
        let counted: i64 = sqlx::query_scalar("SELECT jobs FROM sweep_counts WHERE status = 'running'")
            .fetch_one(db.reader.sqlite().unwrap())
            .await
            .unwrap();
        assert_eq!(counted, 3);
    }

    #[tokio::test]
    async fn a_refused_finish_claims_nothing() {
        let (_directory, db) = queue().await;
        let mut conn = db.sqlite_writer().unwrap().acquire().await.unwrap();
        let (stale, decision) = (seen(2), succeeded());
        let done = finish_and_claim(&mut conn, step(&stale, &decision, Some(asking(3)))).await.unwrap();
        assert!(!done.applied && done.claimed.is_empty());
        drop(conn);
        let queued = statuses(&db).await.into_iter().filter(|(_, status)| status == "queued").count();
        assert_eq!(queued, 5, "every queued job is still queued");
    }

    #[tokio::test]
    async fn owed_statements_the_version_the_finish_and_the_claim_go_as_one_step() {
        let (_directory, db) = queue().await;
        let mut conn = db.sqlite_writer().unwrap().acquire().await.unwrap();
        let (seen, decision, version) = (seen(1), succeeded(), bare_version());
        let step = FinishStep {
            pending: Some("BEGIN IMMEDIATE"),
            version: Some(&version),
            ..step(&seen, &decision, Some(asking(1)))
        };
        let done = finish_and_claim(&mut conn, step).await.unwrap();
        assert!(done.applied && done.stored);
        assert_eq!(ids(&done.claimed), [5], "the oldest job of the highest priority a plain worker may run");
        let record = FinishStep { version: Some(&version), ..self::step(&seen, &decision, None) };
        let again = finish_and_claim(&mut conn, record).await.unwrap();
        assert!(!again.applied && !again.stored, "the attempt is finished and keeps its first version");
        let stored: (String, String) =
            sqlx::query_as("SELECT path, params FROM results WHERE job_id = 1 AND attempt = 1")
                .fetch_one(&mut *conn)
                .await
                .unwrap();
        assert_eq!(stored, ("results/s/0/v1".to_string(), r#"{"lr":0.1}"#.to_string()));
        // The owed BEGIN went first: rolling back undoes the whole step.
        sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await.unwrap();
        drop(conn);
        let running: Vec<i64> =
            statuses(&db).await.into_iter().filter(|(_, status)| status == "running").map(|(id, _)| id).collect();
        assert_eq!(running, [1]);
        let versions: i64 =
            sqlx::query_scalar("SELECT count(*) FROM results").fetch_one(db.reader.sqlite().unwrap()).await.unwrap();
        assert_eq!(versions, 0);
    }

    #[tokio::test]
    async fn a_version_made_without_metrics_is_neither_stored_nor_finished_once_the_attempt_has_some() {
        let (_directory, db) = queue().await;
        sqlx::query(
            "INSERT INTO job_metric_summaries (job_id, name, attempt, last_value, min_value, max_value, point_count)
             VALUES (1, 'loss', 1, 0.5, 0.5, 0.5, 1)",
        )
        .execute(db.sqlite_writer().unwrap())
        .await
        .unwrap();
        let mut conn = db.sqlite_writer().unwrap().acquire().await.unwrap();
        let (seen, decision, version) = (seen(1), succeeded(), bare_version());
        let step = FinishStep { version: Some(&version), ..step(&seen, &decision, Some(asking(1))) };
        let done = finish_and_claim(&mut conn, step).await.unwrap();
        assert!(!done.applied && !done.stored && done.claimed.is_empty());
        drop(conn);
        assert_eq!(statuses(&db).await[0], (1, "running".to_string()));
        let versions: i64 =
            sqlx::query_scalar("SELECT count(*) FROM results").fetch_one(db.reader.sqlite().unwrap()).await.unwrap();
        assert_eq!(versions, 0);
    }

    #[tokio::test]
    async fn a_claim_takes_the_best_jobs_first_up_to_its_slots() {
        let (_directory, db) = queue().await;
        let mut conn = db.sqlite_writer().unwrap().acquire().await.unwrap();
        let rows = claim(&mut *conn, PlainClaim { trainer: true, ..asking(2) }).await.unwrap();
        let mut claimed: Vec<i64> = rows.iter().map(|row| row.id.get()).collect();
        claimed.sort();
        assert_eq!(
            claimed,
            [4, 5],
            "the trainer job (priority 9) for a worker that has it, then the oldest of priority 5"
        );
    }

    /// Every table a finish and a claim touch, as text (the events' wall-clock times left out).
    fn dump(path: &std::path::Path) -> Vec<String> {
        let conn = rusqlite::Connection::open(path).unwrap();
        let mut dump = Vec::new();
        for table in ["jobs", "results", "job_events", "sweep_counts"] {
            let mut statement = conn.prepare(&format!("SELECT * FROM {table} ORDER BY 1, 2")).unwrap();
            let names: Vec<String> = statement.column_names().iter().map(|name| name.to_string()).collect();
            let mut rows = statement.query([]).unwrap();
            while let Some(row) = rows.next().unwrap() {
                let values: Vec<String> = (0..names.len())
                    .filter(|&column| names[column] != "at")
                    .map(|column| {
                        format!("{}={:?}", names[column], row.get::<_, rusqlite::types::Value>(column).unwrap())
                    })
                    .collect();
                dump.push(format!("{table}: {}", values.join(" ")));
            }
        }
        dump
    }

    /// The writer's own connection (`db::fast`) runs the same statements as the sqlx step: in
    /// every case the same answer, the same claimed rows and the same tables afterwards.
    #[tokio::test]
    async fn the_writers_own_connection_does_exactly_what_the_sqlx_step_does() {
        let summary =
            "INSERT INTO job_metric_summaries (job_id, name, attempt, last_value, min_value, max_value, point_count)
                       VALUES (1, 'loss', 1, 0.5, 0.5, 0.5, 1)";
        let version = bare_version();
        // (attempt seen, claim, version, a metric summary first)
        let cases: [(u32, Option<PlainClaim>, bool, bool); 6] = [
            (1, Some(asking(3)), false, false),
            (1, Some(PlainClaim { trainer: true, ..asking(2) }), false, false),
            (2, Some(asking(3)), false, false),
            (1, Some(asking(1)), true, false),
            (1, None, true, false),
            (1, Some(asking(1)), true, true),
        ];
        for (number, (attempt, claim, with_version, summarised)) in cases.into_iter().enumerate() {
            let (seen, decision) = (seen(attempt), succeeded());
            let version = with_version.then_some(&version);
            let step = || FinishStep { version, ..step(&seen, &decision, claim) };
            let (sqlx_dir, sqlx_db) = queue().await;
            let (fast_dir, fast_db) = queue().await;
            if summarised {
                sqlx::query(summary).execute(sqlx_db.sqlite_writer().unwrap()).await.unwrap();
                sqlx::query(summary).execute(fast_db.sqlite_writer().unwrap()).await.unwrap();
            }
            let mut conn = sqlx_db.sqlite_writer().unwrap().acquire().await.unwrap();
            let by_sqlx = finish_and_claim(&mut conn, step()).await.unwrap();
            drop(conn);
            let by_fast =
                super::super::fast::finish_and_claim(&super::super::fast::open(&fast_db.path()).unwrap(), &step())
                    .unwrap();
            assert_eq!((by_fast.applied, by_fast.stored), (by_sqlx.applied, by_sqlx.stored), "case {number}");
            let rows = |rows: &[ClaimedRow]| {
                let mut rows: Vec<String> = rows.iter().map(|row| format!("{row:?}")).collect();
                rows.sort();
                rows
            };
            assert_eq!(rows(&by_fast.claimed), rows(&by_sqlx.claimed), "case {number}");
            let (sqlx_tables, fast_tables) = (dump(&sqlx_db.path()), dump(&fast_db.path()));
            assert!(sqlx_tables.len() >= 8, "case {number}: {sqlx_tables:?}");
            assert_eq!(fast_tables, sqlx_tables, "case {number}");
            sqlx_db.close().await;
            fast_db.close().await;
            drop((sqlx_dir, fast_dir));
        }
    }
}
