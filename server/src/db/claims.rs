//! Claims: `queued -> running`. The claimed row and its columns, the dispatch order every
//! claim text uses, the claim of a worker without GPUs in one statement ([`claim`]), the
//! general claim's two halves (the candidates, then [`mark_running`]), and what a bare finish
//! with its worker's next claim asks of a backend's finish+claim owner ([`Step`], answered by
//! `db::sqlite::steps` or `db::postgres::steps` with [`Finished`]).

use super::backend::{on_conn, Conn, Engine};
use super::jobs::JobState;
use super::sql::{self, DbRow};
use shared::api::{JobId, ResultVersion, SweepId, WorkerId};
use shared::job::Finish;
use shared::sweep::Resources;

/// The order jobs are handed out in: highest priority first, then oldest. Every claim text
/// and [`dispatch_key`] follow it.
pub const DISPATCH_ORDER: &str = "priority DESC, id";

/// The jobs a claim may take: queued, and not held by a paused sweep (`db::fail_fast`). It is
/// the predicate of the claims' partial index `jobs_queue` (migrations/0010): every text that
/// walks that index says exactly this.
pub const CLAIMABLE: &str = "status = 'queued' AND held = 0";

/// [`DISPATCH_ORDER`] for rows already read.
pub fn dispatch_key(priority: i64, id: JobId) -> (std::cmp::Reverse<i64>, i64) {
    (std::cmp::Reverse(priority), id.get())
}

/// The columns a claim returns, read by [`ClaimedRow::from_row`].
pub const CLAIMED_COLUMNS: &str = "id, attempt, sweep_id, idx, params, command, config, gpus, gpu_memory, exclusive, \
     needs_trainer, timeout_secs, lease_expires_at, priority, worker_id, retries_left, crash_count";

/// A job as a claim left it.
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
    pub fn from_row(row: &impl DbRow) -> sql::Result<ClaimedRow> {
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

/// What a claim of a worker without GPUs asks for.
#[derive(Debug, Clone, Copy)]
pub struct PlainClaim {
    pub worker_id: WorkerId,
    pub slots: u32,
    pub trainer: bool,
    pub lease_until: i64,
    pub now: i64,
}

/// The claimable jobs a worker without GPUs may run: none asking for a GPU or GPU memory, the
/// trainer only if `trainer` (a parameter's place) is true. `shared::placement::place` accepts
/// exactly these for such a worker, with an empty placement.
pub fn plain_jobs(trainer: &str) -> String {
    format!(
        "{CLAIMABLE} AND (gpus IS NULL OR gpus <= 0) AND (gpu_memory IS NULL OR gpu_memory <= 0)
           AND (needs_trainer = 0 OR {trainer})"
    )
}

/// `queued -> running` for worker `$1` with lease `$2` at `$3`, on no GPUs.
const RUNNING: &str = "status = 'running', attempt = attempt + 1, worker_id = $1, gpu_ids = '[]',
     lease_expires_at = $2, started_at = $3, finished_at = NULL, exit_code = NULL, reason = NULL,
     cancel_requested = 0";

/// The plain claim on SQLite: the first `$5` queued jobs in dispatch order that need no GPU,
/// the trainer only if `$4` (the queue's index is in dispatch order: `INDEXED BY`, as without
/// statistics SQLite would sort every queued job).
fn sqlite_claim_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        format!(
            "UPDATE jobs SET {RUNNING}
             WHERE status = 'queued' AND id IN (
                 SELECT id FROM jobs INDEXED BY jobs_queue WHERE {jobs} ORDER BY {DISPATCH_ORDER} LIMIT $5)
             RETURNING {CLAIMED_COLUMNS}",
            jobs = plain_jobs("$4"),
        )
    })
}

/// The plain claim on PostgreSQL: the jobs picked in a CTE that locks them as it chooses them
/// and skips those another replica's transaction holds (`FOR UPDATE SKIP LOCKED`): two claims
/// at once get different jobs, and neither waits for the other. With SQLite's `id IN
/// (subquery)`, a second claim beside a first took a job past the next one.
fn postgres_claim_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        format!(
            "WITH picked AS (
                 SELECT id AS picked FROM jobs WHERE {jobs} ORDER BY {DISPATCH_ORDER} LIMIT $5 FOR UPDATE SKIP LOCKED)
             UPDATE jobs SET {RUNNING} FROM picked WHERE jobs.id = picked.picked
             RETURNING {CLAIMED_COLUMNS}",
            jobs = plain_jobs("$4"),
        )
    })
}

/// Claims up to `claim.slots` jobs for a worker without GPUs in one statement; returns the
/// claimed rows (any order).
pub async fn claim(conn: impl Into<Conn<'_>>, claim: PlainClaim) -> sql::Result<Vec<ClaimedRow>> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let rows = sql::query(engine.pick(sqlite_claim_sql(), postgres_claim_sql()))
            .bind(claim.worker_id.get())
            .bind(claim.lease_until)
            .bind(claim.now)
            .bind(claim.trainer)
            .bind(claim.slots)
            .fetch_all(&mut *conn)
            .await?;
        rows.iter().map(ClaimedRow::from_row).collect()
    })
}

/// A queued job the general claim may hand out.
pub struct Candidate {
    pub id: JobId,
    pub resources: Resources,
    /// Its sweep's `timeout`, in seconds.
    pub timeout_secs: Option<u64>,
    /// Its sweep's priority class value (read where users are chosen between; else 0).
    pub class: i64,
}

/// The column [`Candidate::from_row`] reads a job's class from: its sweep's, where users are
/// chosen between (a primary-key lookup per job read).
pub const CLASS_OF_JOB: &str = "(SELECT class_value FROM sweeps s WHERE s.id = jobs.sweep_id) AS class_value";

impl Candidate {
    /// From a row with `id`, the resource columns, `timeout_secs` and `class_value`.
    pub fn from_row(row: &impl DbRow) -> anyhow::Result<Candidate> {
        let timeout: Option<i64> = row.get_as("timeout_secs")?;
        Ok(Candidate {
            id: JobId::new(row.get_as("id")?),
            resources: super::jobs::resources_of(row)?,
            timeout_secs: timeout.map(|secs| secs.max(0) as u64),
            class: row.get_as("class_value")?,
        })
    }
}

/// What a claim batch asks of the queue: jobs that could fit a worker with `gpus` GPUs, the
/// largest having `max_free_memory` bytes free, that run the built-in trainer only if
/// `trainer` (some worker asking has it), `limit` of them at most.
#[derive(Debug, Clone, Copy)]
pub struct Fitting {
    pub gpus: u32,
    pub max_free_memory: u64,
    pub trainer: bool,
    pub limit: u32,
}

/// Queued jobs in dispatch order that [`Fitting`] lets through, of every user or of `owner`'s
/// sweeps only. The caller places them exactly. `INDEXED BY`: without statistics SQLite would
/// take `jobs_by_status` for `status = ?` and sort every queued job (a 25x slower claim on a
/// million-job queue); the partial indexes are already in dispatch order (by owner first for
/// one user's: migrations/0013).
pub async fn queued_candidates(
    conn: impl Into<Conn<'_>>,
    fitting: Fitting,
    owner: Option<&str>,
) -> anyhow::Result<Vec<Candidate>> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let index = if owner.is_some() { "jobs_queue_by_owner" } else { "jobs_queue" };
        let hint = engine.pick(format!(" INDEXED BY {index}"), String::new());
        let of_owner = if owner.is_some() { " AND owner = $5" } else { "" };
        // One user's queue is read to choose between users: with each job's class.
        let class = if owner.is_some() { CLASS_OF_JOB } else { "CAST(0 AS BIGINT) AS class_value" };
        let sql = format!(
            "SELECT id, gpus, gpu_memory, exclusive, needs_trainer, timeout_secs, {class} FROM jobs{hint}
             WHERE {CLAIMABLE} AND (gpus IS NULL OR gpus <= $1) AND (gpu_memory IS NULL OR gpu_memory <= $2)
               AND (needs_trainer = 0 OR $3){of_owner}
             ORDER BY {DISPATCH_ORDER} LIMIT $4"
        );
        let mut query = sql::query(&sql)
            .bind(fitting.gpus)
            .bind(fitting.max_free_memory.min(i64::MAX as u64) as i64)
            .bind(fitting.trainer)
            .bind(fitting.limit);
        if let Some(owner) = owner {
            query = query.bind(owner);
        }
        let rows = query.fetch_all(&mut *conn).await?;
        rows.iter().map(Candidate::from_row).collect()
    })
}

/// `queued -> running` for every `(job, worker, gpus)` whose job is still queued, in one
/// statement (a batch of claims is atomic without a transaction); returns the claimed rows.
pub async fn mark_running(
    conn: impl Into<Conn<'_>>,
    pairs: &[(JobId, WorkerId, &[u32])],
    lease_until: i64,
    now: i64,
) -> anyhow::Result<Vec<ClaimedRow>> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let pairs = serde_json::to_string(pairs)?;
        let (pair, worker, gpus, id) = match engine {
            Engine::Sqlite => ("json_each($1)", "value ->> 1", "value ->> 2", "value ->> 0"),
            Engine::Postgres => (
                "jsonb_array_elements($1::jsonb) AS e(value)",
                "(value ->> 1)::bigint",
                "value ->> 2",
                "(value ->> 0)::bigint",
            ),
        };
        let sql = format!(
            "UPDATE jobs SET status = 'running', attempt = attempt + 1,
                worker_id = (SELECT {worker} FROM {pair} WHERE {id} = jobs.id),
                gpu_ids = (SELECT {gpus} FROM {pair} WHERE {id} = jobs.id),
                lease_expires_at = $2, started_at = $3, finished_at = NULL, exit_code = NULL, reason = NULL,
                cancel_requested = 0
             WHERE {CLAIMABLE} AND id IN (SELECT {id} FROM {pair})
             RETURNING {CLAIMED_COLUMNS}"
        );
        let rows = sql::query(&sql).bind(pairs).bind(lease_until).bind(now).fetch_all(&mut *conn).await?;
        Ok(rows.iter().map(ClaimedRow::from_row).collect::<sql::Result<_>>()?)
    })
}

/// One bare finish, with its worker's next claim, for a backend's finish+claim owner: the
/// finish as decided on `seen` (the guard: it applies only to the attempt as seen), a result
/// version without files stored only if the finish applies (and, since it was made without
/// metric summaries, the finish applies only while the attempt has none), and the claim made
/// only if the finish applies.
#[derive(Debug, Clone)]
pub struct Step {
    pub seen: JobState,
    pub worker_id: WorkerId,
    pub decision: Finish,
    pub now: i64,
    pub version: Option<ResultVersion>,
    pub claim: Option<PlainClaim>,
}

/// What one [`Step`] did.
#[derive(Debug, Default)]
pub struct Finished {
    /// Whether the guarded finish applied (the job was still as seen).
    pub applied: bool,
    /// Whether the version was stored (false if the attempt had one already).
    pub stored: bool,
    /// The claimed rows, in no particular order; none if the finish did not apply.
    pub claimed: Vec<ClaimedRow>,
}
