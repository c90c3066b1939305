//! What the server knows of each job it handed to a worker without GPUs, as of the claim, so
//! that the job's bare finish (finish.rs `quick`) is decided without reading the job again:
//! one round trip to a reader's SQLite thread less per short job.
//!
//! A view may be stale (a cancel since, a claim whose group was rolled back, a lease that
//! expired): the bare finish's guarded UPDATE checks every field its decision reads (status,
//! attempt, worker, retries, cancel, no metric summaries), and the full path takes over when
//! it does not apply, exactly as for a reader's view that changed before the write.

use crate::db::jobs::{JobState, ResultSource};
use shared::api::JobId;
use std::collections::HashMap;
use std::sync::Mutex;

/// Views kept at most; past that the map starts afresh (views of jobs that were requeued or
/// deleted are otherwise only dropped when the job is claimed or finished again).
const MAX_VIEWS: usize = 1 << 16;

#[derive(Default)]
pub struct Views {
    by_job: Mutex<HashMap<JobId, (JobState, ResultSource)>>,
}

impl Views {
    pub fn keep(&self, state: JobState, source: ResultSource) {
        let Ok(mut by_job) = self.by_job.lock() else { return };
        if by_job.len() >= MAX_VIEWS {
            by_job.clear();
        }
        by_job.insert(state.id, (state, source));
    }

    /// Drops any view of `job` (it was handed out by a claim that keeps none).
    pub fn forget(&self, job: JobId) {
        if let Ok(mut by_job) = self.by_job.lock() {
            by_job.remove(&job);
        }
    }

    /// The view of `job` as claimed for `attempt`, if kept; any view of the job is dropped.
    pub fn take(&self, job: JobId, attempt: u32) -> Option<(JobState, ResultSource)> {
        let mut by_job = self.by_job.lock().ok()?;
        by_job.remove(&job).filter(|(state, _)| state.attempt == attempt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(id: i64, attempt: u32) -> (JobState, ResultSource) {
        let state = JobState::running_on_worker_1(id, 1, attempt);
        let source = ResultSource { sweep: "s".into(), index: 0, params: serde_json::json!({}), has_metrics: false };
        (state, source)
    }

    #[test]
    fn a_view_is_taken_once_and_only_for_its_attempt() {
        let views = Views::default();
        let (state, source) = view(7, 2);
        views.keep(state, source);
        assert!(views.take(JobId::new(7), 1).is_none(), "another attempt's view is not this one's");
        assert!(views.take(JobId::new(7), 2).is_none(), "the mismatched take dropped it");
        let (state, source) = view(7, 2);
        views.keep(state, source);
        assert_eq!(views.take(JobId::new(7), 2).map(|(state, _)| state.attempt), Some(2));
        assert!(views.take(JobId::new(7), 2).is_none(), "taken once");
    }

    #[test]
    fn the_map_starts_afresh_when_full() {
        let views = Views::default();
        for id in 0..MAX_VIEWS as i64 + 1 {
            let (state, source) = view(id, 1);
            views.keep(state, source);
        }
        assert!(views.take(JobId::new(0), 1).is_none());
        assert!(views.take(JobId::new(MAX_VIEWS as i64), 1).is_some());
    }
}
