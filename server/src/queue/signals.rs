//! Per-job wake-ups for log followers (`app logs JOB -f`).
//!
//! A follower waits on its job's [`Notify`]; appends and the end of an attempt wake only the
//! followers of that job, so a busy log never makes every other follower re-read. Entries are
//! weak: the map holds no follower alive, and dead entries are dropped as the map is used.

use shared::api::JobId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use tokio::sync::Notify;

/// Past this many entries, `listen` sweeps out the ones nobody waits on any more.
const SWEEP_AT: usize = 1_024;

#[derive(Debug, Default)]
pub struct JobSignals {
    waiting: Mutex<HashMap<JobId, Weak<Notify>>>,
}

impl JobSignals {
    /// The job's signal; keep it while waiting (register interest with `Notified::enable`
    /// before looking, so a wake between the look and the wait is not lost).
    pub fn listen(&self, job: JobId) -> Arc<Notify> {
        let Ok(mut waiting) = self.waiting.lock() else { return Arc::new(Notify::new()) };
        if let Some(signal) = waiting.get(&job).and_then(Weak::upgrade) {
            return signal;
        }
        if waiting.len() >= SWEEP_AT {
            waiting.retain(|_, signal| signal.strong_count() > 0);
        }
        let signal = Arc::new(Notify::new());
        waiting.insert(job, Arc::downgrade(&signal));
        signal
    }

    /// Wakes every follower of `job`: new bytes, or its attempt ended or started.
    pub fn wake(&self, job: JobId) {
        let Ok(mut waiting) = self.waiting.lock() else { return };
        match waiting.get(&job).map(Weak::upgrade) {
            Some(Some(signal)) => signal.notify_waiters(),
            Some(None) => {
                waiting.remove(&job);
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_wake_reaches_the_followers_of_that_job_only() {
        let signals = JobSignals::default();
        let (one, two) = (signals.listen(JobId::new(1)), signals.listen(JobId::new(2)));
        let (woken, other) = (one.notified(), two.notified());
        tokio::pin!(woken, other);
        woken.as_mut().enable();
        other.as_mut().enable();
        signals.wake(JobId::new(1));
        tokio::time::timeout(Duration::from_secs(1), woken).await.expect("job 1 woken");
        assert!(tokio::time::timeout(Duration::from_millis(50), other).await.is_err(), "job 2 was woken");
    }

    #[test]
    fn entries_of_gone_followers_are_dropped() {
        let signals = JobSignals::default();
        drop(signals.listen(JobId::new(7)));
        signals.wake(JobId::new(7));
        assert!(signals.waiting.lock().unwrap().is_empty());
    }
}
