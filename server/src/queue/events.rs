//! Changes and the wake-ups they cause, in one place.
//!
//! Every write unit notes what it changed ([`Change`]); once its group is committed the writer
//! hands the changes to [`Events::emit`], which is the only code that wakes anyone: long-polling
//! claims when jobs became claimable, log followers of a job, and the web page's event stream.
//! A handler cannot forget a wake-up, because handlers never wake anyone themselves.

use super::signals::JobSignals;
use shared::api::JobId;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use tokio::sync::{mpsc, watch, Notify};

/// What a committed write changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Jobs became claimable: submitted, requeued, retried or handed back.
    Claimable,
    /// A job's status or attempt changed (started, finished, cancelled, requeued).
    Job(JobId),
    /// New bytes in a job's log (followers re-read; the page's views do not care).
    Log(JobId),
    /// Something else the page shows: workers, priorities, telemetry, results.
    Page,
}

/// The wake-ups: one per kind of waiter.
#[derive(Clone, Default)]
pub struct Events {
    /// Counts changes the page shows; `/api/events` follows it.
    page: Arc<watch::Sender<u64>>,
    /// Long-polling claims wait here for claimable work.
    work: Arc<Notify>,
    /// Log followers wait on their job's signal.
    jobs: Arc<JobSignals>,
    /// Told after every commit (the checkpointer waits here; one stored permit is enough).
    committed: Arc<Notify>,
    /// Where this replica's changes go to reach the others (PostgreSQL; see `relay`).
    relay: Arc<OnceLock<mpsc::UnboundedSender<Vec<Change>>>>,
    /// Counts the emits that made jobs claimable, this replica's and the others'.
    claimable: Arc<AtomicU64>,
}

impl Events {
    /// Wakes whoever waits for what `changes` changed, here and on the other replicas.
    pub fn emit(&self, changes: &[Change]) {
        self.committed.notify_one();
        if let Some(relay) = self.relay.get() {
            if !changes.is_empty() {
                let _ = relay.send(changes.to_vec());
            }
        }
        self.emit_local(changes);
    }

    /// Sends every change emitted from now on to the other replicas through `relay` too.
    pub fn relay_to(&self, relay: mpsc::UnboundedSender<Vec<Change>>) {
        let _ = self.relay.set(relay);
    }

    /// Wakes this replica's waiters for what `changes` changed (another replica's changes).
    pub fn emit_local(&self, changes: &[Change]) {
        let mut page = false;
        let mut work = false;
        for change in changes {
            match change {
                Change::Claimable => {
                    work = true;
                    page = true;
                }
                Change::Job(job) => {
                    self.jobs.wake(*job);
                    page = true;
                }
                Change::Log(job) => self.jobs.wake(*job),
                Change::Page => page = true,
            }
        }
        if work {
            self.claimable.fetch_add(1, Ordering::SeqCst);
            self.work.notify_waiters();
        }
        if page {
            self.page.send_modify(|seq| *seq += 1);
        }
    }

    /// How many emits made jobs claimable so far (here or on another replica).
    pub fn claimable_counter(&self) -> Arc<AtomicU64> {
        self.claimable.clone()
    }

    /// The page's change counter.
    pub fn page_changes(&self) -> watch::Receiver<u64> {
        self.page.subscribe()
    }

    /// Where long-polling claims wait for claimable jobs.
    pub fn work(&self) -> &Notify {
        &self.work
    }

    /// Told after every committed write: the write-ahead log grew.
    pub fn committed(&self) -> Arc<Notify> {
        self.committed.clone()
    }

    /// The signal of `job`'s log followers (keep it while waiting).
    pub fn job(&self, job: JobId) -> Arc<Notify> {
        self.jobs.listen(job)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn each_change_wakes_its_own_waiters() {
        let events = Events::default();
        let page = events.page_changes();
        let job = events.job(JobId::new(1));
        let (claim, follower) = (events.work().notified(), job.notified());
        tokio::pin!(claim, follower);
        claim.as_mut().enable();
        follower.as_mut().enable();
        events.emit(&[Change::Log(JobId::new(1))]);
        tokio::time::timeout(Duration::from_secs(1), &mut follower).await.expect("the log follower woke");
        assert!(!page.has_changed().unwrap(), "a log append is no page change");
        assert!(tokio::time::timeout(Duration::from_millis(20), &mut claim).await.is_err(), "no claim woke");
        events.emit(&[Change::Claimable]);
        tokio::time::timeout(Duration::from_secs(1), claim).await.expect("the claim woke");
        assert!(page.has_changed().unwrap());
    }
}
