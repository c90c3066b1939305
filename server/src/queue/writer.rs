//! The one writer: a thread that owns the database's writer connection and runs every change
//! as a *write unit*, committing the units waiting together in one transaction (group commit).
//!
//! A unit is an async closure over a [`Tx`]; it reads what it decides on and writes through the
//! same connection, so decide-then-apply needs no retry loop, and notes the [`Change`]s it made.
//! On SQLite the connection is the thread's own (rusqlite), each statement a call on this
//! thread; the thread drives the units with the runtime's handle. Units of one group run one
//! after another, each inside its own savepoint when the group has several, so a unit that
//! fails (a 409, a bad request) leaves the others' work intact. Nothing is acknowledged before
//! its group's COMMIT succeeded, and the changes a unit noted are announced only then:
//! durability is never weaker than one transaction per request.
//!
//! Bare finishes, each with its worker's next claim, take the *step* lane instead: a unit is a
//! step (data: the finish as decided on a reader's view, its record, its claim) and a
//! conclusion. The steps waiting together go to the backend's owner of the hot path
//! (`writer_steps.rs`, its `StepRunner`: `db::sqlite::steps`, statements on the writer's
//! thread; `db::postgres::steps`, a handful of set statements, five round trips for the group
//! instead of a dozen per unit), then each unit concludes on the group's connection. A step
//! group has no savepoints: a guard that refuses a step changes nothing of it, and a failure
//! after that abandons the whole group (every unit answered "retry"). A group PostgreSQL gives
//! up on (a deadlock with another replica) runs again.
//!
//! Failures of the database itself (a full disk, a read-only file, an I/O error) may make SQLite
//! roll back the whole transaction on its own. Then every unit of the group that already ran is
//! answered with the error, the connection is closed (so no half-open transaction can survive
//! on it: the bug behind "every write answers 200 and none is ever committed"), a fresh one is
//! opened, and the remaining units run in a new transaction. Units are also run to the end even
//! when the request that sent one went away, so a client disconnecting mid-write cannot leave a
//! transaction open either.

use super::events::{Change, Events};
use crate::db::backend::Conn;
use crate::db::claims::{Finished, Step};
use crate::db::WriterPool;
use crate::error::{ApiError, ApiResult};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, Postgres};
use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};

use conn::close;
pub use conn::WriterConn;
pub use order::start;
#[cfg(test)]
use order::start_with;
use steps::run_step_group;

/// Units waiting to be written, at most (senders wait beyond that: back pressure).
const QUEUE_DEPTH: usize = 4096;
/// Units committed together at most.
const MAX_GROUP: usize = 256;

/// The write side of a unit: the connection, inside the group's transaction, and the changes
/// the unit made.
pub struct Tx {
    conn: WriterConn,
    changes: Vec<Change>,
    /// Statements owed before the unit's first one (the group's `BEGIN`, the savepoint that
    /// fences it from the unit before): a unit that never reaches the database opens nothing.
    pending: Option<&'static str>,
    /// Whether the group's `BEGIN` was sent (it is owed until a unit reaches the database).
    begun: bool,
}

impl Tx {
    /// The connection, inside the group's transaction and the unit's savepoint.
    pub async fn conn(&mut self) -> ApiResult<Conn<'_>> {
        if let Some(statements) = self.pending.take() {
            self.begun = true;
            self.conn.execute(statements).await?;
        }
        Ok(self.conn.borrow())
    }

    /// Records that the unit changed something; announced once (and only if) it is committed.
    pub fn note(&mut self, change: Change) {
        self.changes.push(change);
    }
}

/// A unit's outcome, waiting for its group's commit.
trait Settle: Send {
    /// Whether the unit itself failed (its savepoint was rolled back).
    fn failed(&self) -> Option<&ApiError>;
    /// Answers the sender: the unit's own error, or its value once `committed` is Ok.
    fn settle(self: Box<Self>, committed: Result<(), &ApiError>);
}

struct Pending<T> {
    result: ApiResult<T>,
    reply: oneshot::Sender<ApiResult<T>>,
}

impl<T: Send> Settle for Pending<T> {
    fn failed(&self) -> Option<&ApiError> {
        self.result.as_ref().err()
    }

    fn settle(self: Box<Self>, committed: Result<(), &ApiError>) {
        let answer = match (self.result, committed) {
            (Err(error), _) => Err(error),
            (Ok(value), Ok(())) => Ok(value),
            (Ok(_), Err(error)) => Err(error.retry_copy()),
        };
        let _ = self.reply.send(answer);
    }
}

type RunUnit = Box<dyn for<'c> FnOnce(&'c mut Tx) -> BoxFuture<'c, Box<dyn Settle>> + Send>;
/// What follows a step: its conclusion on the group's connection, given what the step did, or
/// only the answer when the step did not run.
type StepThen = Box<dyn for<'c> FnOnce(StepRun<'c>) -> BoxFuture<'c, Box<dyn Settle>> + Send>;

/// How a step unit's group went.
pub enum StepRun<'c> {
    /// The steps ran; the unit concludes inside the group's transaction.
    Done(&'c mut Tx, Finished),
    /// The unit's `still` said no when its group was about to run: its step did not run.
    Declined,
    /// The group could not run: the unit answers this error.
    Failed(ApiError),
}

/// A bare finish for the step lane: its step, run with the group's others by the backend's
/// owner of the hot path, then its own conclusion on the group's connection.
struct StepUnit {
    step: Step,
    /// Asked right before the group runs: whether the step may still go this way.
    still: Box<dyn Fn() -> bool + Send>,
    then: StepThen,
}

enum Work {
    /// Runs inside the group's transaction.
    Unit(RunUnit),
    /// Runs inside the group's transaction, its step with the group's others.
    Step(Box<StepUnit>),
    /// Runs alone, with no transaction open on the writer (a WAL restart must see no open
    /// write transaction, else it waits for itself).
    Outside(Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>),
    /// Runs in a group of its own when the writer is idle, or once its turn comes under load
    /// (see [`Writer::write_in_background`]).
    Background(RunUnit),
}

/// Sends write units to the writer task.
#[derive(Clone)]
pub struct Writer {
    sender: mpsc::Sender<Work>,
    /// Why the last units were dropped unrun (the database could not be opened for writing,
    /// or a transaction could not begin).
    refused: Arc<Mutex<Option<ApiError>>>,
}

impl Writer {
    fn unanswered(&self) -> ApiError {
        match self.refused.lock().ok().and_then(|why| why.as_ref().map(ApiError::retry_copy)) {
            Some(why) => why,
            None => ApiError::ShuttingDown,
        }
    }
}

impl Writer {
    /// Runs `unit` in the next group and answers once the group committed (or the unit failed).
    pub async fn write<T, F>(&self, unit: F) -> ApiResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut Tx) -> BoxFuture<'c, ApiResult<T>> + Send + 'static,
    {
        self.send_unit(unit, Work::Unit).await
    }

    /// Runs `unit` as [`Writer::write`] does, but in a group of its own, when the writer has had
    /// no other unit for [`order::IDLE`], or (under a steady stream of them) once it has been
    /// the next background unit for [`order::BACKGROUND_EVERY`]: for work nobody waits on, so
    /// that it delays the units that are waited on by one such unit at most, and rarely.
    /// Background units run in the order sent.
    pub async fn write_in_background<T, F>(&self, unit: F) -> ApiResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut Tx) -> BoxFuture<'c, ApiResult<T>> + Send + 'static,
    {
        self.send_unit(unit, Work::Background).await
    }

    async fn send_unit<T, F>(&self, unit: F, kind: fn(RunUnit) -> Work) -> ApiResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut Tx) -> BoxFuture<'c, ApiResult<T>> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let run: RunUnit = Box::new(move |tx| {
            Box::pin(async move {
                let result = unit(tx).await;
                Box::new(Pending { result, reply }) as Box<dyn Settle>
            })
        });
        self.sender.send(kind(run)).await.map_err(|_| ApiError::ShuttingDown)?;
        answer.await.map_err(|_| self.unanswered())?
    }

    /// Runs `step` with the other steps waiting (the backend's owner of the hot path), then
    /// `then` with what it did, inside the group's transaction; answers once the group
    /// committed. `still` is asked right before the group runs; when it says no, the step does
    /// not run and `then` gets [`StepRun::Declined`]. `then` must not fail once the step
    /// applied: the group has no savepoints, so its error abandons the whole group.
    pub async fn step<T, F>(&self, step: Step, still: impl Fn() -> bool + Send + 'static, then: F) -> ApiResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(StepRun<'c>) -> BoxFuture<'c, ApiResult<T>> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let then: StepThen = Box::new(move |run| {
            Box::pin(async move {
                let result = then(run).await;
                Box::new(Pending { result, reply }) as Box<dyn Settle>
            })
        });
        let unit = StepUnit { step, still: Box::new(still), then };
        self.sender.send(Work::Step(Box::new(unit))).await.map_err(|_| ApiError::ShuttingDown)?;
        answer.await.map_err(|_| self.unanswered())?
    }

    /// Waits until `count` units wait in the channel (the writer busy with a group meanwhile).
    #[cfg(test)]
    pub async fn wait_for_queued(&self, count: usize) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while self.sender.max_capacity() - self.sender.capacity() < count {
            assert!(tokio::time::Instant::now() < deadline, "{count} units never queued");
            tokio::task::yield_now().await;
        }
    }

    /// Holds the writer with a unit that waits until the returned sender is dropped (or sent
    /// on); units sent meanwhile queue behind it ([`Writer::wait_for_queued`]) and form the next
    /// group. Also returns the holding unit's task.
    #[cfg(test)]
    pub async fn hold(&self) -> (oneshot::Sender<()>, tokio::task::JoinHandle<ApiResult<()>>) {
        let (started, running) = oneshot::channel();
        let (release, released) = oneshot::channel::<()>();
        let holder = self.clone();
        let held = tokio::spawn(async move {
            holder
                .write(move |_tx| {
                    Box::pin(async move {
                        let _ = started.send(());
                        let _ = released.await;
                        Ok(())
                    })
                })
                .await
        });
        running.await.expect("the holding unit ran");
        (release, held)
    }

    /// Runs `task` between groups, while no write transaction is open.
    pub async fn outside<T, F>(&self, task: F) -> ApiResult<T>
    where
        T: Send + 'static,
        F: std::future::Future<Output = T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let work = Work::Outside(Box::new(move || {
            Box::pin(async move {
                let _ = reply.send(task.await);
            })
        }));
        self.sender.send(work).await.map_err(|_| ApiError::ShuttingDown)?;
        answer.await.map_err(|_| ApiError::ShuttingDown)
    }
}

/// What the writer thread works with.
struct Thread {
    handle: Handle,
    pool: WriterPool,
    events: Events,
    refused: Arc<Mutex<Option<ApiError>>>,
    /// [`order::BACKGROUND_EVERY`], but in tests.
    background_every: Duration,
}

impl Thread {
    fn refuse(&self, why: Option<ApiError>) {
        if let Ok(mut refused) = self.refused.lock() {
            *refused = why;
        }
    }

    /// Says why the units waiting are dropped unrun: their connection cannot be opened.
    fn cannot_open(&self, error: ApiError) {
        tracing::error!(error = ?error, "opening the database for writing");
        // The database's own errors (ApiError::Unavailable) already end in "; retry".
        let error = error.to_string();
        let error = error.strip_suffix("; retry").unwrap_or(&error);
        self.refuse(Some(ApiError::Unavailable(format!("the database cannot be opened for writing: {error}; retry"))));
    }

    /// `connection`, or a new one; `None` when none can be had (said to the senders).
    async fn connection(&self, connection: Option<WriterConn>) -> Option<WriterConn> {
        let conn = match connection {
            Some(conn) => conn,
            None => match WriterConn::acquire(&self.pool).await {
                Ok(conn) => conn,
                Err(error) => {
                    self.cannot_open(ApiError::from(error));
                    return None;
                }
            },
        };
        self.refuse(None);
        Some(conn)
    }

    /// Runs async units until all are done, opening the connection again as needed.
    async fn run_units(&self, mut connection: Option<WriterConn>, mut group: VecDeque<RunUnit>) -> Option<WriterConn> {
        while !group.is_empty() {
            // Dropped unrun when none can be had: their senders read why.
            let conn = self.connection(connection.take()).await?;
            let (kept, rest) = run_group(conn, &mut group, &self.events).await;
            connection = kept;
            group = rest;
        }
        connection
    }

    /// Runs step units until all are done, opening the connections again as needed (`lane`:
    /// PostgreSQL's one-statement groups', `db::postgres::steps::open_lane`). A unit whose
    /// `still` says no is declined; a job's second finish in one group waits for the next (it
    /// is decided on a state the first may change).
    async fn run_steps(
        &self,
        mut connection: Option<WriterConn>,
        lane: &mut Option<PgConnection>,
        mut group: VecDeque<StepUnit>,
    ) -> Option<WriterConn> {
        while !group.is_empty() {
            let mut jobs = std::collections::HashSet::new();
            let mut now = Vec::new();
            let mut later = VecDeque::new();
            for unit in std::mem::take(&mut group) {
                if !(unit.still)() {
                    (unit.then)(StepRun::Declined).await.settle(Ok(()));
                } else if jobs.insert(unit.step.seen.id) {
                    now.push(unit);
                } else {
                    later.push_back(unit);
                }
            }
            group = later;
            if now.is_empty() {
                continue;
            }
            // Dropped unrun when none can be had: their senders read why.
            let conn = self.connection(connection.take()).await?;
            connection = run_step_group(conn, lane, &self.pool, now, &self.events).await;
        }
        connection
    }
}

/// Runs units from `group` in one transaction until they are all done or the transaction is
/// lost; returns the connection if it is still sound, and the units not run yet.
async fn run_group(
    conn: WriterConn,
    group: &mut VecDeque<RunUnit>,
    events: &Events,
) -> (Option<WriterConn>, VecDeque<RunUnit>) {
    // The statements that open the transaction and fence each unit of a group are owed
    // (`Tx::pending`) and go before the unit's first statement: `BEGIN` (and the first
    // savepoint) before the first unit's; for the others, `RELEASE` of the previous savepoint
    // and a new one. A unit that never reached the database leaves them owed to the next. A
    // refused unit's `ROLLBACK TO` keeps its savepoint open for the next unit, and `COMMIT`
    // releases the last one.
    let savepoints = group.len() > 1;
    let begin = match (&conn, savepoints) {
        (WriterConn::Sqlite(_), true) => "BEGIN IMMEDIATE; SAVEPOINT unit",
        (WriterConn::Sqlite(_), false) => "BEGIN IMMEDIATE",
        (WriterConn::Postgres(_), true) => "BEGIN; SAVEPOINT unit",
        (WriterConn::Postgres(_), false) => "BEGIN",
    };
    let mut tx = Tx { conn, changes: Vec::new(), pending: Some(begin), begun: false };
    let mut ran: Vec<(Box<dyn Settle>, Vec<Change>)> = Vec::new();
    while let Some(unit) = group.pop_front() {
        let outcome = match AssertUnwindSafe(unit(&mut tx)).catch_unwind().await {
            Ok(outcome) => outcome,
            Err(_) => {
                // The unit's sender is gone with it; the others must not be committed half-checked.
                tracing::error!("a write unit panicked; its group is rolled back");
                return abandon(tx, ran, group, "a write failed inside the server");
            }
        };
        let changes = std::mem::take(&mut tx.changes);
        match outcome.failed().map(is_database_failure) {
            None => {
                ran.push((outcome, changes));
                if savepoints && !group.is_empty() && tx.pending.is_none() {
                    tx.pending = Some("RELEASE unit; SAVEPOINT unit");
                }
            }
            Some(false) => {
                // The unit refused (409, 400, ...): undo what it wrote, keep the others. One
                // that never reached the database wrote nothing, and the savepoint it was owed
                // is still owed (rolling back to the open one would undo the unit before).
                let touched = tx.pending.is_none();
                let undone = !savepoints || !touched || execute(&mut tx, "ROLLBACK TO unit").await.is_ok();
                ran.push((outcome, Vec::new()));
                if !undone {
                    return abandon(tx, ran, group, "a refused unit could not be undone");
                }
            }
            Some(true) => {
                // The database failed under this unit: the transaction may be gone already.
                ran.push((outcome, Vec::new()));
                return abandon(tx, ran, group, "the database failed during a write");
            }
        }
    }
    let all_refused = ran.iter().all(|(outcome, _)| outcome.failed().is_some());
    let statement = if all_refused && !savepoints { "ROLLBACK" } else { "COMMIT" };
    // No unit reached the database: there is no transaction to end.
    let ended = match tx.begun {
        true => execute(&mut tx, statement).await,
        false => Ok(()),
    };
    match ended {
        Ok(()) => {
            answer_committed(ran, events);
            (Some(tx.conn), std::mem::take(group))
        }
        Err(error) => {
            answer_failed_commit(ran, ApiError::from(error));
            close(tx.conn);
            (None, std::mem::take(group))
        }
    }
}

/// Gives up the transaction: every unit that ran is answered with a retryable error (nothing of
/// theirs was committed), the connection is closed, and the units not run yet are returned.
fn abandon(
    tx: Tx,
    ran: Vec<(Box<dyn Settle>, Vec<Change>)>,
    group: &mut VecDeque<RunUnit>,
    why: &str,
) -> (Option<WriterConn>, VecDeque<RunUnit>) {
    answer_abandoned(ran, why);
    close(tx.conn);
    (None, std::mem::take(group))
}

/// Answers every unit of a committed group, then announces what they changed (never before the
/// commit: a follower woken earlier could read the state from before it).
fn answer_committed(ran: Vec<(Box<dyn Settle>, Vec<Change>)>, events: &Events) {
    let mut changes = Vec::new();
    for (outcome, noted) in ran {
        outcome.settle(Ok(()));
        changes.extend(noted);
    }
    events.emit(&changes);
}

/// Answers every unit of a group whose COMMIT failed with that failure.
fn answer_failed_commit(ran: Vec<(Box<dyn Settle>, Vec<Change>)>, error: ApiError) {
    tracing::error!(error = ?error, units = ran.len(), "committing a group of writes failed");
    for (outcome, _) in ran {
        outcome.settle(Err(&error));
    }
}

/// Answers every unit of an abandoned transaction with a retryable error: the failing unit's
/// own (a full disk says best what happened), else one saying `why`.
fn answer_abandoned(ran: Vec<(Box<dyn Settle>, Vec<Change>)>, why: &str) {
    let failure = ran.iter().rev().find_map(|(outcome, _)| outcome.failed().filter(|error| is_database_failure(error)));
    if let Some(failure) = failure {
        // What the database said, for the log: the answer below is a retryable copy.
        tracing::error!(error = ?failure, "a write unit failed in the database");
    }
    let cause = failure.map(ApiError::retry_copy).unwrap_or_else(|| ApiError::Unavailable(format!("{why}; retry")));
    tracing::error!(error = %cause, units = ran.len(), "{why}; the write transaction was abandoned");
    for (outcome, _) in ran {
        outcome.settle(Err(&cause));
    }
}

/// Runs one or more statements without arguments.
async fn execute(tx: &mut Tx, statements: &'static str) -> crate::db::sql::Result<()> {
    tx.conn.execute(statements).await
}

/// Whether a unit's error came from the database rather than from a decision: then the whole
/// transaction is suspect.
fn is_database_failure(error: &ApiError) -> bool {
    matches!(
        error,
        ApiError::Database(_) | ApiError::Internal(_) | ApiError::InsufficientStorage(_) | ApiError::Unavailable(_)
    )
}

#[path = "writer_conn.rs"]
mod conn;
#[path = "writer_order.rs"]
mod order;
#[path = "writer_steps.rs"]
mod steps;
#[cfg(test)]
#[path = "writer_tests.rs"]
mod tests;
