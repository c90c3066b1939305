//! The job state machine: `queued -> running -> succeeded | failed | cancelled`, and back to
//! `queued` on retry, requeue after a lost worker, or a retried failure.
//!
//! These functions decide *what* a transition does; the server applies the decision with one
//! guarded UPDATE (`WHERE id = ? AND status = ? AND attempt = ?`), so a decision made on a
//! stale read simply changes nothing.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobStatus {
    pub const ALL: [JobStatus; 5] =
        [JobStatus::Queued, JobStatus::Running, JobStatus::Succeeded, JobStatus::Failed, JobStatus::Cancelled];

    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Queued => "queued",
            JobStatus::Running => "running",
            JobStatus::Succeeded => "succeeded",
            JobStatus::Failed => "failed",
            JobStatus::Cancelled => "cancelled",
        }
    }

    /// A finished job stays finished unless someone retries it.
    pub fn is_terminal(self) -> bool {
        matches!(self, JobStatus::Succeeded | JobStatus::Failed | JobStatus::Cancelled)
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobStatus {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        JobStatus::ALL.into_iter().find(|status| status.as_str() == text).ok_or_else(|| {
            format!("unknown job status `{text}` (expected queued, running, succeeded, failed or cancelled)")
        })
    }
}

/// How an attempt ended, as the worker reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    /// The process ran and exited with this code (a signal death is reported as 128 + signal).
    Exited { code: i32 },
    /// The process could not be started or run (command not found, bad working directory).
    Error { reason: String },
    /// The worker killed it because a cancel was requested or its timeout passed.
    Killed { reason: String },
    /// The worker gave the job up (forced shutdown); it goes back to the queue at once.
    Abandoned,
    /// The worker stopped it because the server preempted it (SIGTERM, then SIGKILL after the
    /// grace); it goes back to the queue, resuming from its checkpoint, no retry spent.
    Preempted,
}

/// The decided result of a finished attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finish {
    pub status: JobStatus,
    pub retries_left: u32,
    pub exit_code: Option<i32>,
    pub reason: Option<String>,
}

/// Decides what a reported outcome does to a running job.
pub fn finish(outcome: &Outcome, retries_left: u32, cancel_requested: bool) -> Finish {
    let (exit_code, failure) = match outcome {
        Outcome::Exited { code: 0 } => (Some(0), None),
        Outcome::Exited { code } => (Some(*code), Some(exit_reason(*code))),
        Outcome::Error { reason } => (None, Some(reason.clone())),
        Outcome::Killed { reason } => (None, Some(reason.clone())),
        Outcome::Abandoned => (None, Some("abandoned by its worker".to_string())),
        Outcome::Preempted => (None, Some("preempted".to_string())),
    };
    if cancel_requested {
        return Finish { status: JobStatus::Cancelled, retries_left, exit_code, reason: Some("cancelled".into()) };
    }
    match (outcome, failure) {
        (_, None) => Finish { status: JobStatus::Succeeded, retries_left, exit_code, reason: None },
        // Abandoning or a preemption is not the job's fault: requeue without spending a retry.
        (Outcome::Abandoned | Outcome::Preempted, reason) => {
            Finish { status: JobStatus::Queued, retries_left, exit_code, reason }
        }
        (_, reason) if retries_left > 0 => {
            Finish { status: JobStatus::Queued, retries_left: retries_left - 1, exit_code, reason }
        }
        (_, reason) => Finish { status: JobStatus::Failed, retries_left, exit_code, reason },
    }
}

/// Says what a shell's exit code usually means, so `failed` explains itself.
pub fn exit_reason(code: i32) -> String {
    let meaning = match code {
        126 => " (the command is not executable)".to_string(),
        127 => " (command not found)".to_string(),
        129..=192 => {
            let signal = code - 128;
            let name = match signal {
                1 => "SIGHUP",
                2 => "SIGINT",
                6 => "SIGABRT",
                9 => "SIGKILL, often the out-of-memory killer",
                11 => "SIGSEGV",
                15 => "SIGTERM",
                _ => "a signal",
            };
            format!(" (killed by signal {signal}: {name})")
        }
        _ => String::new(),
    };
    format!("exited with code {code}{meaning}")
}

/// The decided result of a lease that ran out (the worker stopped heartbeating).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseExpiry {
    pub status: JobStatus,
    pub crash_count: u32,
    pub reason: &'static str,
}

/// A lost attempt counts as a crash; a job is lost at most `max_crashes` times, then it fails
/// with `worker_lost`. A job whose cancel was pending is simply cancelled.
pub fn lease_expired(crash_count: u32, max_crashes: u32, cancel_requested: bool) -> LeaseExpiry {
    let crash_count = crash_count + 1;
    if cancel_requested {
        LeaseExpiry { status: JobStatus::Cancelled, crash_count, reason: "cancelled" }
    } else if crash_count >= max_crashes {
        LeaseExpiry { status: JobStatus::Failed, crash_count, reason: "worker_lost" }
    } else {
        LeaseExpiry { status: JobStatus::Queued, crash_count, reason: "lease_expired" }
    }
}

/// What a cancel request does to a job in a given state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelEffect {
    /// Queued: cancelled on the spot.
    Now,
    /// Running: flagged; its worker kills it at its next heartbeat.
    Requested,
    /// Already finished: a conflict.
    Refused,
}

pub fn cancel(status: JobStatus) -> CancelEffect {
    match status {
        JobStatus::Queued => CancelEffect::Now,
        JobStatus::Running => CancelEffect::Requested,
        _ => CancelEffect::Refused,
    }
}

/// Only jobs that ended badly go back to the queue by hand.
pub fn can_retry(status: JobStatus) -> bool {
    matches!(status, JobStatus::Failed | JobStatus::Cancelled)
}

/// Priority matters only to jobs that have not finished.
pub fn can_change_priority(status: JobStatus) -> bool {
    !status.is_terminal()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_exit_succeeds_and_keeps_retries() {
        let decision = finish(&Outcome::Exited { code: 0 }, 2, false);
        assert_eq!(decision.status, JobStatus::Succeeded);
        assert_eq!(decision.retries_left, 2);
        assert_eq!(decision.exit_code, Some(0));
    }

    #[test]
    fn failure_spends_a_retry_then_fails() {
        let first = finish(&Outcome::Exited { code: 3 }, 1, false);
        assert_eq!((first.status, first.retries_left), (JobStatus::Queued, 0));
        let second = finish(&Outcome::Exited { code: 3 }, first.retries_left, false);
        assert_eq!(second.status, JobStatus::Failed);
        assert_eq!(second.exit_code, Some(3));
        assert_eq!(second.reason.as_deref(), Some("exited with code 3"));
    }

    #[test]
    fn exit_reasons_explain_shell_codes() {
        assert_eq!(exit_reason(3), "exited with code 3");
        assert_eq!(exit_reason(127), "exited with code 127 (command not found)");
        assert!(exit_reason(137).contains("SIGKILL"));
    }

    #[test]
    fn pending_cancel_wins_over_exit_code() {
        let decision = finish(&Outcome::Killed { reason: "cancel".into() }, 5, true);
        assert_eq!(decision.status, JobStatus::Cancelled);
    }

    #[test]
    fn abandoned_job_is_requeued_without_spending_a_retry() {
        let decision = finish(&Outcome::Abandoned, 0, false);
        assert_eq!((decision.status, decision.retries_left), (JobStatus::Queued, 0));
    }

    #[test]
    fn a_preempted_job_is_requeued_without_spending_a_retry_unless_cancelled() {
        let decision = finish(&Outcome::Preempted, 0, false);
        assert_eq!((decision.status, decision.retries_left), (JobStatus::Queued, 0));
        assert_eq!(decision.reason.as_deref(), Some("preempted"));
        assert_eq!(finish(&Outcome::Preempted, 2, true).status, JobStatus::Cancelled, "a pending cancel wins");
    }

    #[test]
    fn lost_job_fails_once_crashes_reach_the_limit() {
        assert_eq!(lease_expired(0, 3, false).status, JobStatus::Queued);
        assert_eq!(lease_expired(1, 3, false).status, JobStatus::Queued);
        let last = lease_expired(2, 3, false);
        assert_eq!((last.status, last.crash_count, last.reason), (JobStatus::Failed, 3, "worker_lost"));
        assert_eq!(lease_expired(0, 3, true).status, JobStatus::Cancelled);
    }

    #[test]
    fn cancel_retry_and_priority_rules() {
        assert_eq!(cancel(JobStatus::Queued), CancelEffect::Now);
        assert_eq!(cancel(JobStatus::Running), CancelEffect::Requested);
        assert_eq!(cancel(JobStatus::Succeeded), CancelEffect::Refused);
        assert!(can_retry(JobStatus::Failed) && can_retry(JobStatus::Cancelled));
        assert!(!can_retry(JobStatus::Running) && !can_retry(JobStatus::Succeeded));
        assert!(can_change_priority(JobStatus::Queued) && !can_change_priority(JobStatus::Failed));
    }

    #[test]
    fn status_round_trips_through_text() {
        for status in JobStatus::ALL {
            assert_eq!(status.as_str().parse::<JobStatus>(), Ok(status));
        }
        assert!("done".parse::<JobStatus>().is_err());
    }
}
