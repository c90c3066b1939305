//! The sweep controller: makes the runs of adaptive sweeps (bayes, random without a cap) when
//! workers claim, and stops runs early (hyperband/ASHA rungs, the median rule) from their
//! streamed metric. The decisions are `shared::search`'s pure functions; this module reads
//! their inputs from the database and applies what they decide.
//!
//! Everything it must remember lives in the database (`sweep_search`, `early_stops`,
//! migrations/0006): the runs made so far (which is also the next run's index), whether the
//! sweep is still open, the notes. A restarted server re-reads the sweep's stored source and
//! goes on with the next index; proposals are seeded by `(seed, index)`, so the same results
//! give the same proposals. In memory there is only a cache of parsed sweeps and a hint that
//! lets claim batches skip the lookup while no adaptive sweep is open.

mod proposals;
mod stopping;

pub use proposals::preview;

use super::{Change, Tx};
use crate::db;
use crate::db::backend::Conn;
use crate::db::now_ms;
use crate::error::ApiResult;
use shared::api::{JobId, SearchMethod, SweepId};
use shared::sweep::Goal;
use shared::sweep::{ExpandOptions, Sweep, MAX_YAML_DEPTH};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The controller's in-memory side: parsed sweeps and the "maybe open" hint.
pub struct Controller {
    /// Every sweep looked up so far: `Some` when it has a controller row (adaptive or
    /// stopping runs early), `None` when it has none. Sources never change; a new submission
    /// overwrites its id's entry (SQLite may reuse the id of a removed sweep).
    sweeps: Mutex<HashMap<SweepId, Option<Arc<Sweep>>>>,
    /// False once a claim batch found no open adaptive sweep; set by every such submission.
    maybe_open: AtomicBool,
    /// Replicas share the database, and another replica's submission cannot set this one's
    /// hint: with them, any change that made jobs claimable (here or there, counted by
    /// `Events`) since the hint was cleared counts as a maybe.
    replicated: Option<Arc<std::sync::atomic::AtomicU64>>,
    /// That count when the hint was cleared.
    cleared_at: std::sync::atomic::AtomicU64,
}

impl Default for Controller {
    fn default() -> Self {
        // Open until a batch has looked: a restarted server may have open sweeps.
        Controller {
            sweeps: Mutex::default(),
            maybe_open: AtomicBool::new(true),
            replicated: None,
            cleared_at: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl Controller {
    /// For a server that shares its database with other replicas; `claimable` counts the
    /// changes that made jobs claimable (`Events::claimable_counter`).
    pub(in crate::queue) fn replicated(claimable: Arc<std::sync::atomic::AtomicU64>) -> Controller {
        Controller { replicated: Some(claimable), ..Controller::default() }
    }

    /// The count to clear the hint at, read before looking for open sweeps.
    pub(in crate::queue) fn generation(&self) -> u64 {
        self.replicated.as_ref().map_or(0, |count| count.load(Ordering::SeqCst))
    }

    /// Sets the hint again, in the writer's order, for a unit that may have made an adaptive
    /// sweep open to claims again (a resume: its search was left out while it was paused).
    pub(in crate::queue) fn reopen(&self) {
        self.maybe_open.store(true, Ordering::SeqCst);
    }

    /// Clears the hint as of `generation` (see [`Controller::generation`]).
    pub(in crate::queue) fn clear_hint(&self, generation: u64) {
        self.cleared_at.store(generation, Ordering::SeqCst);
        self.maybe_open.store(false, Ordering::SeqCst);
    }
}

/// The options a stored source is parsed again with: it was accepted once, so no limit of
/// the current configuration may refuse it now (adaptive sweeps have no jobs to count).
fn reparse_options() -> ExpandOptions {
    ExpandOptions { max_jobs: u64::MAX, command: None, max_depth: MAX_YAML_DEPTH }
}

impl Controller {
    /// Whether an adaptive sweep may still want runs made for a claim (`top_up` would look).
    pub(in crate::queue) fn may_be_open(&self) -> bool {
        self.maybe_open.load(Ordering::SeqCst)
            || self
                .replicated
                .as_ref()
                .is_some_and(|count| count.load(Ordering::SeqCst) != self.cleared_at.load(Ordering::SeqCst))
    }

    /// Called in the submission's write unit: sets up the controller of a sweep that needs one.
    /// The hint is set here, in the writer's order, so a claim batch woken by this commit (or
    /// run after it) looks, whatever a batch before it concluded.
    pub(super) async fn on_submit(&self, tx: &mut Tx, sweep_id: SweepId, sweep: &Sweep) -> ApiResult<()> {
        let method = SearchMethod::of(&sweep.search);
        if method == SearchMethod::Fixed && sweep.early_stop.is_none() && sweep.metric_target.is_none() {
            return Ok(());
        }
        if sweep.search.is_adaptive() {
            self.maybe_open.store(true, Ordering::SeqCst);
        }
        let seed = match sweep.search {
            shared::search::Search::Bayes { seed, .. }
            | shared::search::Search::AdaptiveRandom { seed }
            | shared::search::Search::Random { seed } => seed,
            shared::search::Search::Grid => 0,
        };
        let search = db::search::NewSearch {
            method,
            seed,
            run_cap: sweep.search.run_cap(),
            early_stop: sweep.early_stop.is_some(),
        };
        db::search::insert(tx.conn().await?, sweep_id, &search).await?;
        Ok(())
    }

    /// After a submission committed: remember its parse (only then: a rolled-back id may be
    /// given to another sweep).
    pub(super) fn submitted(&self, sweep_id: SweepId, sweep: Arc<Sweep>) {
        let has_controller = sweep.search.is_adaptive() || sweep.early_stop.is_some() || sweep.metric_target.is_some();
        if let Ok(mut sweeps) = self.sweeps.lock() {
            sweeps.insert(sweep_id, has_controller.then_some(sweep));
        }
    }

    /// Called in the cancel's write unit: no more runs are made.
    pub(super) async fn on_cancel(tx: &mut Tx, sweep_id: SweepId) -> ApiResult<()> {
        if db::search::close(tx.conn().await?, sweep_id).await? {
            db::search::add_note(tx.conn().await?, sweep_id, "the sweep was cancelled: no more runs are made").await?;
            tx.note(Change::Page);
        }
        Ok(())
    }

    /// After a run of the sweep succeeded: if it reached the sweep's `metric.target`, the sweep
    /// launches nothing more, as W&B's does: its queued jobs are cancelled with that reason
    /// (running ones finish) and an adaptive sweep makes no more runs. Costs a cached lookup
    /// for sweeps without a target.
    pub(super) async fn after_success(
        &self,
        tx: &mut Tx,
        job: JobId,
        attempt: u32,
        sweep_id: SweepId,
    ) -> ApiResult<()> {
        let Some(sweep) = self.sweep_in(tx, sweep_id).await? else { return Ok(()) };
        let (Some(target), Some(metric)) = (sweep.metric_target, sweep.metric.as_ref()) else { return Ok(()) };
        let minimize = metric.goal == Goal::Minimize;
        let Some(value) = db::search::best_of(tx.conn().await?, job, attempt, &metric.name, minimize).await? else {
            return Ok(());
        };
        if !(if minimize { value <= target } else { value >= target }) {
            return Ok(());
        }
        let reason = format!(
            "job {job} reached metric.target {target} ({} = {value}): the sweep starts no more runs",
            metric.name
        );
        let cancelled = db::jobs::cancel_queued_of_sweep(tx.conn().await?, sweep_id, &reason, now_ms()).await?;
        let closed = db::search::close(tx.conn().await?, sweep_id).await?;
        if closed || !cancelled.is_empty() {
            let note = format!("{reason}; {} queued jobs cancelled, running ones finish", cancelled.len());
            db::search::add_note(tx.conn().await?, sweep_id, &note).await?;
            tx.note(Change::Page);
        }
        for job in cancelled {
            tx.note(Change::Job(job));
        }
        Ok(())
    }

    /// Whether the sweep has a `metric.target` (a cached lookup).
    pub(super) async fn has_target(&self, tx: &mut Tx, sweep_id: SweepId) -> ApiResult<bool> {
        Ok(self.sweep_in(tx, sweep_id).await?.is_some_and(|sweep| sweep.metric_target.is_some()))
    }

    /// Whether the sweep has a `metric.target`, if its sweep is cached (`None`: not known yet).
    pub(super) fn cached_target(&self, sweep_id: SweepId) -> Option<bool> {
        self.cached(sweep_id).map(|sweep| sweep.is_some_and(|sweep| sweep.metric_target.is_some()))
    }

    /// [`Controller::sweep`] inside a write unit, reaching the database only if not cached
    /// (so a unit's owed statements are not sent on their own for a cached lookup).
    async fn sweep_in(&self, tx: &mut Tx, sweep_id: SweepId) -> ApiResult<Option<Arc<Sweep>>> {
        match self.cached(sweep_id) {
            Some(known) => Ok(known),
            None => self.sweep(tx.conn().await?, sweep_id).await,
        }
    }

    fn cached(&self, sweep_id: SweepId) -> Option<Option<Arc<Sweep>>> {
        self.sweeps.lock().ok().and_then(|sweeps| sweeps.get(&sweep_id).cloned())
    }

    /// The parsed sweep if it has a controller, from the cache or its stored source.
    async fn sweep(&self, conn: Conn<'_>, sweep_id: SweepId) -> ApiResult<Option<Arc<Sweep>>> {
        if let Some(known) = self.cached(sweep_id) {
            return Ok(known);
        }
        let parsed = match db::search::source_of(conn, sweep_id).await? {
            None => None,
            Some((source, _)) => match Sweep::parse(&source, &reparse_options()) {
                Ok(sweep) => Some(Arc::new(sweep)),
                Err(error) => {
                    // Accepted once, refused now: a newer server reads files differently. Its
                    // runs go on as they are; nothing new is proposed or stopped.
                    tracing::error!(sweep = %sweep_id, %error, "a stored sweep no longer parses; its controller stops");
                    None
                }
            },
        };
        if let Ok(mut sweeps) = self.sweeps.lock() {
            sweeps.insert(sweep_id, parsed.clone());
        }
        Ok(parsed)
    }
}
