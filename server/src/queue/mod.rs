//! The queue service: the one layer between the HTTP routes and the database.
//!
//! Routes parse a request into typed values, call one method here and map its answer. This
//! layer owns the database handle, the writer (every change is a write unit, group-committed:
//! [`writer`]), the claim dispatcher ([`claims`]) and the wake-ups ([`events`]): it applies the
//! pure decisions of `shared::job` through typed `db` calls, each unit noting what it changed,
//! and only the writer turns committed changes into wake-ups. Reads go to the reader pool
//! directly ([`Queue::reader`]); nothing outside this module writes.

mod checkpoints;
mod claims;
mod code;
pub mod events;
pub mod expansions;
mod fail_fast;
mod fence;
mod finish;
mod jobs;
mod leases;
pub mod logs;
mod maintenance;
pub mod meters;
mod metrics;
mod owners;
mod preempter;
mod relay;
mod reports;
mod reservations;
mod results;
mod search;
mod sessions;
mod shares;
mod signals;
mod sweeps;
mod views;
mod waiting;
mod workers;
mod writer;

pub use claims::ClaimOutcome;
pub use events::{Change, Events};
pub use jobs::no_job;
pub use leases::LeaseExpiry;
pub use logs::LogStore;
pub use search::preview as search_preview;
pub use sessions::{same_worker, SHARED_SESSION_TTL};
pub use writer::{StepRun, Tx};

use crate::config::ServerConfig;
use crate::db::Db;
use crate::error::ApiResult;
use crate::storage::Layout;
use futures_util::future::BoxFuture;
use shared::api::{JobId, WorkerId};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// An attempt as its worker names it: everything a worker sends about an attempt is fenced by
/// all three (the job runs this attempt, on this worker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerAttempt {
    pub job: JobId,
    pub attempt: u32,
    pub worker: WorkerId,
}

/// The service. Cheap to share: handlers hold an `Arc<Queue>`.
pub struct Queue {
    db: Db,
    writer: writer::Writer,
    events: Events,
    config: Arc<ServerConfig>,
    claims: claims::ClaimSender,
    layout: Layout,
    logs: LogStore,
    /// Sweep names and forms never change, and every claimed job carries them.
    sweep_names: claims::SweepNames,
    /// So do their workspaces (code, workdir, env, setup).
    workspaces: code::Workspaces,
    /// The jobs handed to workers without GPUs, as claimed (for their bare finish).
    views: Arc<views::Views>,
    /// Checkpoints are placed one at a time (see `checkpoints`).
    checkpoint_lock: tokio::sync::Mutex<()>,
    /// Turns true when the server shuts down, so long polls end instead of holding it open.
    shutting_down: watch::Receiver<bool>,
    /// This database's identity (see `sessions`).
    instance: String,
    sessions: sessions::Sessions,
    /// Workers that stopped taking jobs.
    draining: Mutex<HashSet<WorkerId>>,
    /// What this process counted, for `/metrics`.
    meters: meters::Meters,
    /// The sweep controller (adaptive runs, early stopping).
    search: Arc<search::Controller>,
    /// Told when a submission left rows for the background (see `expansions`).
    expansions: tokio::sync::Notify,
    /// Fair share between users at claim time.
    shares: Arc<shares::Shares>,
}

/// The service's background tasks, awaited at shutdown.
pub struct Tasks {
    /// Told when the writer thread ended.
    writer: tokio::sync::oneshot::Receiver<()>,
    dispatcher: tokio::task::JoinHandle<()>,
}

impl Tasks {
    /// Waits for the tasks to end; call after every handle on the [`Queue`] is gone.
    pub async fn finish(self) {
        let _ = self.dispatcher.await;
        let _ = self.writer.await;
    }
}

impl Queue {
    /// The service over an opened database; starts the writer and the claim dispatcher.
    pub fn start(
        db: Db,
        config: Arc<ServerConfig>,
        instance: String,
        shutting_down: watch::Receiver<bool>,
    ) -> (Arc<Queue>, Tasks) {
        let events = Events::default();
        let search = Arc::new(match db.postgres_pool().is_some() {
            true => search::Controller::replicated(events.claimable_counter()),
            false => search::Controller::default(),
        });
        if let Some(pool) = db.postgres_pool() {
            relay::start(pool.clone(), &events, shutting_down.clone());
        }
        let (writer, writer_task) = writer::start(db.writer_pool(), events.clone());
        let (claims, tickets) = tokio::sync::mpsc::channel(1024);
        let layout = Layout::new(&config.data_dir);
        let shares = Arc::new(shares::Shares::new(config.shares.clone()));
        let queue = Arc::new(Queue {
            logs: LogStore::new(&config.data_dir),
            db,
            writer,
            events,
            config,
            claims,
            layout,
            sweep_names: Arc::default(),
            workspaces: Arc::default(),
            views: Arc::default(),
            checkpoint_lock: tokio::sync::Mutex::default(),
            shutting_down,
            instance,
            sessions: sessions::Sessions::default(),
            draining: Mutex::default(),
            meters: meters::Meters::default(),
            search,
            expansions: tokio::sync::Notify::new(),
            shares,
        });
        let dispatcher = tokio::spawn(claims::dispatch(Arc::downgrade(&queue), tickets));
        tokio::spawn(shares::keep_looking(Arc::downgrade(&queue)));
        (queue, Tasks { writer: writer_task, dispatcher })
    }

    /// The reader pool, for queries that change nothing.
    pub fn reader(&self) -> &crate::db::backend::Pool {
        &self.db.reader
    }

    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    pub fn meters(&self) -> &meters::Meters {
        &self.meters
    }

    pub fn events(&self) -> &Events {
        &self.events
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Adds the job slots' time the finish+claim steps recorded to the users' usage (as the
    /// fair share's loop does every few seconds): before the server stops.
    pub async fn add_slot_time(&self) {
        self.shares.add_slot_time(self).await
    }

    /// Runs one write unit (see [`writer`]); its noted changes wake their waiters once committed.
    pub async fn write<T, F>(&self, unit: F) -> ApiResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut Tx) -> BoxFuture<'c, ApiResult<T>> + Send + 'static,
    {
        self.writer.write(unit).await
    }

    /// Moves the whole write-ahead log into the database and restarts it, with writes held off
    /// between two groups (see `reaper::run_checkpointer`); returns its length in pages before.
    pub async fn restart_wal(&self) -> ApiResult<crate::db::sql::Result<i64>> {
        let db = self.db.clone();
        self.writer.outside(async move { db.restart_wal().await }).await
    }

    /// Truncates the write-ahead log file between two write groups (see `reaper`).
    pub async fn truncate_wal(&self) -> ApiResult<crate::db::sql::Result<()>> {
        let db = self.db.clone();
        self.writer.outside(async move { db.truncate_wal().await }).await
    }

    fn shutting_down(&self) -> watch::Receiver<bool> {
        self.shutting_down.clone()
    }
}
