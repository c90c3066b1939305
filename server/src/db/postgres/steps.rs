//! PostgreSQL's owner of the hot path: a write group's bare finishes, with their workers' next
//! claims (`db::claims::Step`), as set statements: one UPDATE for every finish, one INSERT for
//! their result records, one claim for every worker that asked (per trainer flag). Here every
//! statement is a network round trip and a transaction's locks are held until its COMMIT, so a
//! group of 64 finishes costs five round trips instead of some 700, and holds its sweep's count
//! rows for as long. Each statement keeps the guard of its one-row twin: a finish applies only
//! to the attempt as its unit saw it (`jobs::finish`), a record is stored only with its finish
//! and only while the attempt has no metric summaries, a claim takes queued jobs that need no
//! GPU in dispatch order, skipping those another transaction holds (`claims::claim`).

use crate::db::claims::{plain_jobs, ClaimedRow, Finished, PlainClaim, Step, CLAIMED_COLUMNS, DISPATCH_ORDER};
use crate::db::results::VersionColumns;
use shared::api::ResultVersion;
use sqlx::{PgConnection, Row};
use std::collections::{HashMap, HashSet};

/// The finishes, one row each of the arrays `$1`-`$12`, returning the ids of those that applied
/// (`finished_id`). The finish's rows are found by id alone: the rest of the guard is one comparison of the
/// row with what its unit saw (`IS NOT DISTINCT FROM`, which is `=` here: the finish's
/// values are never NULL), which no index serves. Written as separate equalities, the planner
/// (on statistics taken when nothing ran) found jobs by `worker_id` or through the partial
/// index of running jobs, walking every entry, live or dead, that the worker's earlier jobs
/// left there since the last vacuum: 1,200-8,245 pages for 32 finishes, against 96 by id.
const FINISH_SQL: &str = "UPDATE jobs SET status = f.status, retries_left = f.retries_left, exit_code = f.exit_code,
        reason = f.reason, lease_expires_at = NULL,
        finished_at = CASE WHEN f.terminal THEN f.at ELSE NULL END,
        worker_id = CASE WHEN f.status = 'queued' THEN NULL ELSE jobs.worker_id END,
        gpu_ids = CASE WHEN f.status = 'queued' THEN NULL ELSE jobs.gpu_ids END,
        started_at = CASE WHEN f.status = 'queued' THEN NULL ELSE jobs.started_at END
    FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::text[], $7::bigint[],
                $8::bigint[], $9::text[], $10::bool[], $11::bigint[], $12::bool[])
        AS f(id, attempt, worker, seen_retries, seen_cancel, status, retries_left, exit_code, reason, terminal, at,
             unless_metrics)
    WHERE jobs.id = f.id
      AND (jobs.status, jobs.attempt, jobs.worker_id, jobs.retries_left, jobs.cancel_requested)
          IS NOT DISTINCT FROM ('running', f.attempt, f.worker, f.seen_retries, f.seen_cancel)
      AND NOT (f.unless_metrics
               AND EXISTS (SELECT 1 FROM job_metric_summaries m WHERE m.job_id = f.id AND m.attempt = f.attempt))
    RETURNING jobs.id AS finished_id";

const VERSIONS_SQL: &str = "INSERT INTO results (job_id, attempt, path, manifest, record, params, metrics, stored_at)
    SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
                         $8::bigint[])
    ON CONFLICT (job_id, attempt) DO NOTHING RETURNING job_id";

/// The claims of several workers in one statement: the asks in their order, each given the
/// next `slots` of the jobs picked (in dispatch order), which are locked as they are picked and
/// skipped when another transaction holds them. Each ask is one row per slot, numbered on
/// from the ask before, so the jobs meet their slots by rank (a hash join; ranges of ranks
/// were compared pair by pair, 4,000 comparisons for 63 claims). `asker` says whose each row is.
fn claim_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        let columns: Vec<String> = CLAIMED_COLUMNS.split(',').map(|column| format!("jobs.{}", column.trim())).collect();
        format!(
            "WITH slots AS MATERIALIZED (
                 SELECT a.asker, a.ask_worker, a.ask_lease, a.ask_now,
                        row_number() OVER (ORDER BY a.asker, slot) AS slot_rank
                 FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[])
                      WITH ORDINALITY AS a(ask_worker, ask_slots, ask_lease, ask_now, asker),
                      generate_series(1, a.ask_slots) AS slot
             ), {}
             SELECT * FROM claimed",
            pick_sql("$5", "$6", &columns)
        )
    })
}

/// The whole group in one statement, its own transaction (no BEGIN, no COMMIT: one round trip
/// where the steps one by one took five): the finishes, then, of those that applied, the
/// records and the claims, as data-modifying CTEs over the same snapshot (the jobs claimed
/// were queued in it, the jobs finished were running: never the same rows). PostgreSQL merges
/// the two UPDATEs of `jobs` into one transition table, so the statement triggers record and
/// count every transition once. Parameters: the finishes `$1`-`$12` (as [`FINISH_SQL`]), the
/// records `$13`-`$20`, the asks `$21`-`$25` (the finishing job, worker, slots, lease, now),
/// whether they have the trainer `$26`, and all the slots asked `$27`: the jobs picked are
/// at most that many, and those picked beyond the slots of the finishes that applied stay
/// queued (a LIMIT counted from the finishes that applied, a subquery, had the planner sort
/// every queued job: 1,790 cycles/s against 7,800). It runs on a lane of generic plans
/// ([`open_lane`]), where no parameter's value shapes the plan. One row always; the claimed
/// jobs' columns are NULL when nothing was claimed.
pub fn at_once_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| {
        let columns: Vec<String> = CLAIMED_COLUMNS.split(',').map(|column| format!("jobs.{}", column.trim())).collect();
        format!(
            "WITH finished AS (
                 {finish}
             ), stored AS (
                 INSERT INTO results (job_id, attempt, path, manifest, record, params, metrics, stored_at)
                 SELECT v.* FROM unnest($13::bigint[], $14::bigint[], $15::text[], $16::text[], $17::text[],
                                        $18::text[], $19::text[], $20::bigint[])
                     AS v(job_id, attempt, path, manifest, record, params, metrics, stored_at)
                 WHERE v.job_id IN (SELECT finished_id FROM finished)
                 ON CONFLICT (job_id, attempt) DO NOTHING RETURNING job_id AS stored_id
             ), slots AS MATERIALIZED (
                 SELECT a.asker, a.ask_worker, a.ask_lease, a.ask_now,
                        row_number() OVER (ORDER BY a.asker, slot) AS slot_rank
                 FROM unnest($21::bigint[], $22::bigint[], $23::bigint[], $24::bigint[], $25::bigint[])
                      WITH ORDINALITY AS a(ask_job, ask_worker, ask_slots, ask_lease, ask_now, asker),
                      generate_series(1, a.ask_slots) AS slot
                 WHERE a.ask_job IN (SELECT finished_id FROM finished)
             ), {pick}
             SELECT (SELECT array_agg(finished_id) FROM finished) AS finished_ids,
                    (SELECT array_agg(stored_id) FROM stored) AS stored_ids, claimed.*
             FROM (VALUES (1)) AS one (x) LEFT JOIN claimed ON true",
            finish = FINISH_SQL,
            pick = pick_sql("$26", "$27", &columns)
        )
    })
}

/// The CTEs that pick queued jobs for the `slots` CTE's rows and claim them (`claimed`).
fn pick_sql(trainer: &str, total: &str, columns: &[String]) -> String {
    format!(
        "picked AS MATERIALIZED (
             SELECT id, priority FROM jobs WHERE {jobs}
             ORDER BY {DISPATCH_ORDER} LIMIT {total} FOR UPDATE SKIP LOCKED
         ), ranked AS MATERIALIZED (
             SELECT id AS picked_id, row_number() OVER (ORDER BY {DISPATCH_ORDER}) AS picked_rank FROM picked
         ), claimed AS (
             UPDATE jobs SET status = 'running', attempt = jobs.attempt + 1, worker_id = slots.ask_worker,
                    gpu_ids = '[]', lease_expires_at = slots.ask_lease, started_at = slots.ask_now, finished_at = NULL,
                    exit_code = NULL, reason = NULL, cancel_requested = 0
             FROM ranked JOIN slots ON slots.slot_rank = ranked.picked_rank
             WHERE jobs.id = ranked.picked_id AND jobs.id = ANY(ARRAY(SELECT id FROM picked))
             RETURNING slots.asker, {columns}
         )",
        jobs = plain_jobs(trainer),
        columns = columns.join(", ")
    )
}

/// Opens the connection that runs [`finish_and_claim_at_once`] and nothing else, out of
/// `pool` (detached: it never serves another statement). Its plans are generic: the statement
/// is prepared once and never planned again, where PostgreSQL otherwise plans it for every
/// group's arrays (custom plans win on estimates: a parameter LIMIT is taken as a tenth of the
/// jobs), 0.42 ms of its 2.4 ms for 32 finishes. The statement is written so that its generic
/// plan is the custom one: the CTEs joined are materialized (inlined, they were run again for
/// each row joined), and the claimed jobs are found through the array of those picked, so no
/// estimate of how many were picked can turn the claim into a scan of every job.
/// `the_one_statement_group_has_a_generic_plan_that_never_scans_every_job` (server/tests/postgres)
/// reads the plan.
pub async fn open_lane(pool: &sqlx::PgPool) -> sqlx::Result<PgConnection> {
    let mut conn = pool.acquire().await?.detach();
    sqlx::query("SET plan_cache_mode = force_generic_plan").execute(&mut conn).await?;
    Ok(conn)
}

/// Whether `steps` go as one statement ([`finish_and_claim_at_once`]): their claims all ask
/// with the trainer or all without (a mix takes [`finish_and_claim`], inside a transaction).
pub fn fits_one_statement(steps: &[&Step]) -> bool {
    let mut flags = steps.iter().filter_map(|step| step.claim.map(|claim| claim.trainer));
    let first = flags.next();
    flags.all(|flag| Some(flag) == first)
}

/// [`finish_and_claim`] in one statement, which is its own transaction: call it outside one,
/// only for steps that [`fits_one_statement`].
pub async fn finish_and_claim_at_once(conn: &mut PgConnection, steps: &[&Step]) -> anyhow::Result<Vec<Finished>> {
    let mut done: Vec<Finished> =
        steps.iter().map(|_| Finished { applied: false, stored: false, claimed: Vec::new() }).collect();
    if steps.is_empty() {
        return Ok(done);
    }
    let versions: Vec<(&ResultVersion, VersionColumns)> = steps
        .iter()
        .filter_map(|step| step.version.as_ref())
        .map(|version| Ok((version, VersionColumns::of(version)?)))
        .collect::<serde_json::Result<_>>()?;
    let asking: Vec<(usize, PlainClaim)> = steps
        .iter()
        .enumerate()
        .filter_map(|(index, step)| step.claim.filter(|claim| claim.slots > 0).map(|claim| (index, claim)))
        .collect();
    let trainer = asking.first().is_some_and(|(_, claim)| claim.trainer);
    let query = bind_versions(bind_finishes(sqlx::query(at_once_sql()), steps), &versions)
        .bind(asking.iter().map(|(index, _)| steps[*index].seen.id.get()).collect::<Vec<i64>>())
        .bind(asking.iter().map(|(_, claim)| claim.worker_id.get()).collect::<Vec<i64>>())
        .bind(asking.iter().map(|(_, claim)| i64::from(claim.slots)).collect::<Vec<i64>>())
        .bind(asking.iter().map(|(_, claim)| claim.lease_until).collect::<Vec<i64>>())
        .bind(asking.iter().map(|(_, claim)| claim.now).collect::<Vec<i64>>())
        .bind(trainer)
        .bind(asking.iter().map(|(_, claim)| i64::from(claim.slots)).sum::<i64>());
    let rows = query.fetch_all(&mut *conn).await?;
    let first = rows.first().ok_or_else(|| anyhow::anyhow!("the bulk statement returned no row"))?;
    let applied: HashSet<i64> =
        first.try_get::<Option<Vec<i64>>, _>("finished_ids")?.unwrap_or_default().into_iter().collect();
    let stored: HashSet<i64> =
        first.try_get::<Option<Vec<i64>>, _>("stored_ids")?.unwrap_or_default().into_iter().collect();
    for (step, done) in steps.iter().zip(done.iter_mut()) {
        done.applied = applied.contains(&step.seen.id.get());
        done.stored = done.applied && step.version.is_some() && stored.contains(&step.seen.id.get());
    }
    for row in &rows {
        let Some(asker) = row.try_get::<Option<i64>, _>("asker")? else { continue };
        // `asker` counts the asks from 1 (WITH ORDINALITY).
        let (index, _) = usize::try_from(asker - 1)
            .ok()
            .and_then(|position| asking.get(position))
            .ok_or_else(|| anyhow::anyhow!("a claimed row for ask {asker}, of none"))?;
        done[*index].claimed.push(ClaimedRow::from_row(row)?);
    }
    Ok(done)
}

/// Binds `versions` as eight arrays, in the order of the `results` columns.
fn bind_versions<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    versions: &[(&ResultVersion, VersionColumns)],
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let texts =
        |pick: &dyn Fn(&(&ResultVersion, VersionColumns)) -> String| versions.iter().map(pick).collect::<Vec<_>>();
    query
        .bind(versions.iter().map(|(version, _)| version.job_id.get()).collect::<Vec<i64>>())
        .bind(versions.iter().map(|(version, _)| i64::from(version.attempt)).collect::<Vec<i64>>())
        .bind(texts(&|(version, _)| version.path.clone()))
        .bind(texts(&|(_, columns)| columns.manifest.clone()))
        .bind(texts(&|(_, columns)| columns.record.clone()))
        .bind(texts(&|(_, columns)| columns.params.clone()))
        .bind(texts(&|(_, columns)| columns.metrics.clone()))
        .bind(versions.iter().map(|(version, _)| version.stored_at).collect::<Vec<i64>>())
}

/// Binds the finishes of `steps` to `$1`-`$12` of [`FINISH_SQL`].
fn bind_finishes<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    steps: &[&Step],
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let column = |pick: &dyn Fn(&Step) -> i64| steps.iter().map(|step| pick(step)).collect::<Vec<i64>>();
    query
        .bind(column(&|step| step.seen.id.get()))
        .bind(column(&|step| i64::from(step.seen.attempt)))
        .bind(column(&|step| step.worker_id.get()))
        .bind(column(&|step| i64::from(step.seen.retries_left)))
        .bind(column(&|step| i64::from(step.seen.cancel_requested)))
        .bind(steps.iter().map(|step| step.decision.status.as_str().to_string()).collect::<Vec<String>>())
        .bind(column(&|step| i64::from(step.decision.retries_left)))
        .bind(steps.iter().map(|step| step.decision.exit_code.map(i64::from)).collect::<Vec<Option<i64>>>())
        .bind(steps.iter().map(|step| step.decision.reason.clone()).collect::<Vec<Option<String>>>())
        .bind(steps.iter().map(|step| step.decision.status.is_terminal()).collect::<Vec<bool>>())
        .bind(column(&|step| step.now))
        .bind(steps.iter().map(|step| step.version.is_some()).collect::<Vec<bool>>())
}

/// Applies `steps` (at most one per job: a second finish of a job in the same group would be
/// decided on a state the first one changed) and returns, step by step, what each did.
pub async fn finish_and_claim(conn: &mut PgConnection, steps: &[&Step]) -> anyhow::Result<Vec<Finished>> {
    let mut done: Vec<Finished> =
        steps.iter().map(|_| Finished { applied: false, stored: false, claimed: Vec::new() }).collect();
    if steps.is_empty() {
        return Ok(done);
    }
    let rows = bind_finishes(sqlx::query(FINISH_SQL), steps).fetch_all(&mut *conn).await?;
    let applied: HashSet<i64> =
        rows.iter().map(|row| row.try_get::<i64, _>("finished_id")).collect::<Result<_, _>>()?;
    for (step, done) in steps.iter().zip(done.iter_mut()) {
        done.applied = applied.contains(&step.seen.id.get());
    }
    store_versions(conn, steps, &mut done).await?;
    for trainer in [false, true] {
        claim(conn, steps, &mut done, trainer).await?;
    }
    Ok(done)
}

/// Stores the records of the finishes that applied; `stored` for those inserted.
async fn store_versions(conn: &mut PgConnection, steps: &[&Step], done: &mut [Finished]) -> anyhow::Result<()> {
    let mut versions = Vec::new();
    for (step, done) in steps.iter().zip(done.iter()) {
        if let Some(version) = step.version.as_ref().filter(|_| done.applied) {
            versions.push((version, VersionColumns::of(version)?));
        }
    }
    if versions.is_empty() {
        return Ok(());
    }
    let rows = bind_versions(sqlx::query(VERSIONS_SQL), &versions).fetch_all(&mut *conn).await?;
    let stored: HashSet<i64> = rows.iter().map(|row| row.try_get::<i64, _>(0)).collect::<Result<_, _>>()?;
    for (step, done) in steps.iter().zip(done.iter_mut()) {
        done.stored = done.applied && step.version.is_some() && stored.contains(&step.seen.id.get());
    }
    Ok(())
}

/// Claims for the applied finishes whose workers asked, with the trainer or without.
async fn claim(conn: &mut PgConnection, steps: &[&Step], done: &mut [Finished], trainer: bool) -> anyhow::Result<()> {
    // The steps that ask, in group order: the first gets the first jobs.
    let asking: Vec<(usize, PlainClaim)> = steps
        .iter()
        .enumerate()
        .filter(|(index, _)| done[*index].applied)
        .filter_map(|(index, step)| {
            step.claim.filter(|claim| claim.trainer == trainer && claim.slots > 0).map(|c| (index, c))
        })
        .collect();
    if asking.is_empty() {
        return Ok(());
    }
    let total: i64 = asking.iter().map(|(_, claim)| i64::from(claim.slots)).sum();
    let rows = sqlx::query(claim_sql())
        .bind(asking.iter().map(|(_, claim)| claim.worker_id.get()).collect::<Vec<i64>>())
        .bind(asking.iter().map(|(_, claim)| i64::from(claim.slots)).collect::<Vec<i64>>())
        .bind(asking.iter().map(|(_, claim)| claim.lease_until).collect::<Vec<i64>>())
        .bind(asking.iter().map(|(_, claim)| claim.now).collect::<Vec<i64>>())
        .bind(trainer)
        .bind(total)
        .fetch_all(&mut *conn)
        .await?;
    // `asker` counts the asks from 1 (WITH ORDINALITY).
    let by_asker: HashMap<i64, usize> =
        asking.iter().enumerate().map(|(position, (index, _))| (position as i64 + 1, *index)).collect();
    for row in &rows {
        let asker: i64 = row.try_get("asker")?;
        let index = *by_asker.get(&asker).ok_or_else(|| anyhow::anyhow!("a claimed row for ask {asker}, of none"))?;
        done[index].claimed.push(ClaimedRow::from_row(row)?);
    }
    Ok(())
}
