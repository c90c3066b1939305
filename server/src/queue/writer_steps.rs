//! The writer's step lane: a group of bare finishes, each with its worker's next claim, run
//! together by the backend's owner of finish+claim ([`StepRunner`]), then concluded unit by
//! unit on the group's connection.

use super::*;

/// Times a step group is run when the database gives it up (a deadlock or a serialization
/// failure between replicas) before its units are answered "retry".
const STEP_TRIES: u32 = 3;

/// Runs a group of step units in one transaction: their steps together (the backend's
/// [`StepRunner`]), then each unit's conclusion in turn; returns the connection if it is still
/// sound. A PostgreSQL group that fits one statement runs it on `lane` (opened as needed), its
/// own transaction, and is concluded on `conn` once committed. A group the database gives up
/// on is rolled back and run again; any other failure (or a conclusion that fails: there are
/// no savepoints to undo one unit alone) abandons the group, every unit answered "retry",
/// nothing of theirs committed.
pub(super) async fn run_step_group(
    mut conn: WriterConn,
    lane: &mut Option<PgConnection>,
    pool: &WriterPool,
    group: Vec<StepUnit>,
    events: &Events,
) -> Option<WriterConn> {
    let (steps, thens): (Vec<Step>, Vec<StepThen>) = group.into_iter().map(|unit| (unit.step, unit.then)).unzip();
    let refs: Vec<&Step> = steps.iter().collect();
    let runner = StepRunner::of(&conn, &refs);
    let mut tries = 0;
    let done = loop {
        tries += 1;
        let ran = runner.run(&mut conn, lane, pool, &refs).await;
        match ran {
            Ok(done) => break done,
            Err(error)
                if tries < STEP_TRIES
                    && is_given_up(&error)
                    && (runner.is_own_transaction() || conn.execute("ROLLBACK").await.is_ok()) =>
            {
                tracing::debug!(error = %error, tries, "the database gave a step group up; running it again");
            }
            Err(error) => {
                let error = ApiError::from(error);
                tracing::error!(error = ?error, units = thens.len(), "a step group failed; it was abandoned");
                let cause = error.retry_copy();
                for then in thens {
                    then(StepRun::Failed(cause.retry_copy())).await.settle(Ok(()));
                }
                if runner.is_own_transaction() {
                    // Nothing ran on the writer's connection; the lane's goes (it may be lost).
                    if let Some(lane) = lane.take() {
                        tokio::spawn(sqlx::Connection::close(lane));
                    }
                    return Some(conn);
                }
                close(conn);
                return None;
            }
        }
    };
    let committed = runner.is_own_transaction();
    let mut tx = Tx { conn, changes: Vec::new(), pending: None, begun: !committed };
    let mut ran: Vec<(Box<dyn Settle>, Vec<Change>)> = Vec::new();
    let mut concluding = thens.into_iter().zip(done);
    while let Some((then, done)) = concluding.next() {
        let outcome = match AssertUnwindSafe(then(StepRun::Done(&mut tx, done))).catch_unwind().await {
            Ok(outcome) => outcome,
            Err(_) if committed => {
                // Committed already: the others are answered; this one's sender is gone.
                tracing::error!("a write unit panicked after its group was committed");
                continue;
            }
            Err(_) => {
                tracing::error!("a write unit panicked; its group is rolled back");
                let why = "a write failed inside the server";
                answer_unconcluded(concluding.map(|(then, _)| then), why).await;
                return abandon(tx, ran, &mut VecDeque::new(), why).0;
            }
        };
        let changes = std::mem::take(&mut tx.changes);
        let failed = outcome.failed().is_some();
        ran.push((outcome, changes));
        if failed && !committed {
            // Its step may have written: without a savepoint, only the whole group is undone.
            let why = "a write failed while it was concluded";
            answer_unconcluded(concluding.map(|(then, _)| then), why).await;
            return abandon(tx, ran, &mut VecDeque::new(), why).0;
        }
        // Once committed, a conclusion that fails (a sweep's name that could not be read) is
        // that unit's answer alone, as a lost answer would be: the worker sends its finish
        // again and is told the attempt is over.
    }
    if committed {
        answer_committed(ran, events);
        return Some(tx.conn);
    }
    match execute(&mut tx, "COMMIT").await {
        Ok(()) => {
            answer_committed(ran, events);
            Some(tx.conn)
        }
        Err(error) => {
            answer_failed_commit(ran, ApiError::from(error));
            close(tx.conn);
            None
        }
    }
}

/// The owner of the hot path for a group of steps: one per backend, and on PostgreSQL one
/// statement when the group's claims all ask with the trainer or all without.
enum StepRunner {
    /// `db::sqlite::steps`, inside a transaction on the writer's connection.
    Sqlite,
    /// `db::postgres::steps::finish_and_claim_at_once` on the lane: its own transaction.
    PostgresAtOnce,
    /// `db::postgres::steps::finish_and_claim`, inside a transaction on the writer's connection.
    Postgres,
}

impl StepRunner {
    fn of(conn: &WriterConn, steps: &[&Step]) -> StepRunner {
        match conn {
            WriterConn::Sqlite(_) => StepRunner::Sqlite,
            WriterConn::Postgres(_) if crate::db::postgres::steps::fits_one_statement(steps) => {
                StepRunner::PostgresAtOnce
            }
            WriterConn::Postgres(_) => StepRunner::Postgres,
        }
    }

    /// Whether the steps commit by themselves (nothing is open on the writer's connection).
    fn is_own_transaction(&self) -> bool {
        matches!(self, StepRunner::PostgresAtOnce)
    }

    async fn run(
        &self,
        conn: &mut WriterConn,
        lane: &mut Option<PgConnection>,
        pool: &WriterPool,
        steps: &[&Step],
    ) -> anyhow::Result<Vec<Finished>> {
        match (self, conn) {
            (StepRunner::Sqlite, WriterConn::Sqlite(conn)) => {
                conn.execute_batch("BEGIN IMMEDIATE")?;
                crate::db::sqlite::steps::finish_and_claim(conn, steps).await
            }
            (StepRunner::PostgresAtOnce, _) => {
                let WriterPool::Postgres(pool) = pool else { anyhow::bail!("a PostgreSQL step group on SQLite") };
                let conn = match lane {
                    Some(conn) => conn,
                    None => lane.insert(crate::db::postgres::steps::open_lane(pool).await?),
                };
                crate::db::postgres::steps::finish_and_claim_at_once(conn, steps).await
            }
            (StepRunner::Postgres, WriterConn::Postgres(conn)) => {
                sqlx::query("BEGIN").execute(&mut **conn).await?;
                crate::db::postgres::steps::finish_and_claim(conn, steps).await
            }
            _ => anyhow::bail!("a step group on another backend's connection"),
        }
    }
}

/// Answers the units of an abandoned step group that were not concluded yet: "retry", as the
/// ones that were (nothing of theirs is committed).
pub(super) async fn answer_unconcluded(thens: impl Iterator<Item = StepThen>, why: &str) {
    for then in thens {
        then(StepRun::Failed(ApiError::Unavailable(format!("{why}; retry")))).await.settle(Ok(()));
    }
}

/// Whether the database gave the transaction up rather than refusing it: a deadlock or a
/// serialization failure, which the same transaction run again may pass.
fn is_given_up(error: &anyhow::Error) -> bool {
    let error = match error.downcast_ref::<crate::db::sql::Error>() {
        Some(crate::db::sql::Error::Postgres(error)) => Some(error),
        _ => error.downcast_ref::<sqlx::Error>(),
    };
    let Some(sqlx::Error::Database(database)) = error else { return false };
    matches!(database.code().as_deref(), Some("40P01" | "40001"))
}
