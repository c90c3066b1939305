//! The writer's own synchronous connection (rusqlite, the same SQLite build as sqlx's) and the
//! statements it runs: a short job's bare finish, its result record and its worker's next
//! plain claim (`queue::finish_fast`). The SQL is the same text as the sqlx path's
//! (`jobs::FINISH_SQL`, `results::insert_sql`, `plain_claims::plain_claim_sql`); only the
//! calls differ. Each statement here is a call into SQLite on the writer's thread, where
//! through sqlx it is a trip to sqlx's SQLite thread and back.

use super::plain_claims::{ClaimedRow, FinishStep};
use anyhow::Context;
use rusqlite::{params, Connection, OpenFlags, Row};
use shared::api::{JobId, SweepId, WorkerId};
use shared::sweep::Resources;
use std::path::Path;
use std::time::Duration;

/// Opens the database file for writing with the settings of `Db::open`'s writer: WAL (the
/// file's own mode), synchronous NORMAL, foreign keys, the busy timeout, no checkpoint on
/// commit (the checkpointer does them).
pub fn open(path: &Path) -> rusqlite::Result<Connection> {
    // Never creates the file: `Db::open` made and migrated it.
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.execute_batch(
        "PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; PRAGMA cache_size = -32000;
         PRAGMA temp_store = memory; PRAGMA wal_autocheckpoint = 0;",
    )?;
    conn.set_prepared_statement_cache_capacity(16);
    Ok(conn)
}

/// What [`finish_and_claim`] did.
pub struct Finished {
    /// Whether the guarded UPDATE applied (the job was still as `seen`).
    pub applied: bool,
    /// Whether the version was recorded (false if the attempt had one already).
    pub stored: bool,
    /// The claimed rows, in no particular order; none if the finish did not apply.
    pub claimed: Vec<ClaimedRow>,
}

/// The finish's guarded UPDATE, the version without files before it (neither applies if the
/// attempt has metric summaries), and then, only if the finish applied, the plain claim: as
/// `plain_claims::finish_and_claim` does on a sqlx connection. `step.pending` is not used
/// (the writer opened the savepoint itself).
pub fn finish_and_claim(conn: &Connection, step: &FinishStep<'_>) -> anyhow::Result<Finished> {
    let mut stored = false;
    if let Some(version) = step.version {
        static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let columns = super::results::VersionColumns::of(version)?;
        let mut statement = conn.prepare_cached(SQL.get_or_init(|| super::results::insert_sql(1, true)))?;
        let mut rows = statement.query(params![
            version.job_id.get(),
            version.attempt,
            version.path,
            columns.manifest,
            columns.record,
            columns.params,
            columns.metrics,
            version.stored_at,
        ])?;
        stored = rows.next()?.is_some();
    }
    let (seen, decision) = (step.seen, step.decision);
    let sql = match step.version {
        Some(_) => super::plain_claims::finish_unless_metrics_sql(),
        None => super::jobs::FINISH_SQL,
    };
    let applied = conn.prepare_cached(sql)?.execute(params![
        decision.status.as_str(),
        decision.retries_left,
        decision.exit_code,
        decision.reason.as_deref(),
        decision.status.is_terminal(),
        step.now,
        seen.id.get(),
        seen.attempt,
        step.worker_id.get(),
        seen.retries_left,
        seen.cancel_requested,
    ])? == 1;
    let mut claimed = Vec::new();
    if let (true, Some(claim)) = (applied, step.claim) {
        let mut statement = conn.prepare_cached(super::plain_claims::plain_claim_sql())?;
        let rows = statement.query_map(
            params![claim.worker_id.get(), claim.lease_until, claim.now, claim.trainer, claim.slots],
            claimed_row,
        )?;
        for row in rows {
            claimed.push(row.context("reading a claimed job")?);
        }
    }
    Ok(Finished { applied, stored, claimed })
}

/// A row of [`super::plain_claims::CLAIMED_COLUMNS`].
fn claimed_row(row: &Row<'_>) -> rusqlite::Result<ClaimedRow> {
    Ok(ClaimedRow {
        id: JobId::new(row.get("id")?),
        attempt: row.get("attempt")?,
        sweep_id: SweepId::new(row.get("sweep_id")?),
        index: row.get::<_, i64>("idx")? as u64,
        params: row.get("params")?,
        command: row.get("command")?,
        config: row.get("config")?,
        resources: Resources {
            gpus: row.get("gpus")?,
            gpu_memory: row.get::<_, Option<i64>>("gpu_memory")?.map(|bytes| bytes as u64),
            exclusive: row.get("exclusive")?,
            trainer: row.get("needs_trainer")?,
        },
        timeout_secs: row.get("timeout_secs")?,
        lease_expires_at: row.get("lease_expires_at")?,
        priority: row.get("priority")?,
        worker_id: row.get::<_, Option<i64>>("worker_id")?.map(WorkerId::new),
        retries_left: row.get("retries_left")?,
        crash_count: row.get("crash_count")?,
    })
}
