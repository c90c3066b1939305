//! What every handler shares.

use crate::config::ServerConfig;
use crate::db::Db;
use crate::signals::JobSignals;
use shared::api::{SweepId, WorkerId};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use tokio::sync::{watch, Notify};

#[derive(Clone)]
pub struct AppState {
    pub db: Db,
    pub config: Arc<ServerConfig>,
    /// Woken whenever a job becomes claimable, so long-polling claims return at once.
    pub work_available: Arc<Notify>,
    /// Turns true when the server shuts down, so long polls end instead of holding it open.
    pub shutting_down: watch::Receiver<bool>,
    /// Sweep names never change, and every claimed job carries its sweep's name.
    pub sweep_names: Arc<RwLock<HashMap<SweepId, String>>>,
    /// Workers seen registered, so a claim need not look its worker up.
    pub known_workers: Arc<RwLock<HashSet<WorkerId>>>,
    /// The claim dispatcher, which serves concurrent claims in batches.
    pub claims: crate::dispatch::ClaimSender,
    /// Woken on every log append and whenever an attempt starts or ends (log followers).
    pub job_signals: Arc<JobSignals>,
    /// Counts changes to the queue (every successful write request, every reaped lease); the
    /// web page's event stream follows it.
    pub changes: Arc<watch::Sender<u64>>,
}

impl AppState {
    /// Tells the web page's followers that the queue changed.
    pub fn changed(&self) {
        self.changes.send_modify(|seq| *seq += 1);
    }
}
