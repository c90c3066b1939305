//! Job history folded into attempts: the job page's "where did it run and how did it end".

use crate::api::{AttemptInfo, JobEvent};
use crate::job::JobStatus;

/// Every attempt of a job, oldest first, from its transitions in order. An attempt starts
/// when the job turns `running` and ends at the next transition out of `running` of the same
/// attempt; one without an end is still running.
pub fn attempts(events: &[JobEvent]) -> Vec<AttemptInfo> {
    let mut attempts: Vec<AttemptInfo> = Vec::new();
    for event in events {
        if event.to == JobStatus::Running {
            attempts.push(AttemptInfo {
                attempt: event.attempt,
                worker: event.worker.clone(),
                gpus: event.gpus.clone(),
                started_at: event.at,
                ended_at: None,
                status: JobStatus::Running,
                exit_code: None,
                reason: None,
            });
        } else if event.from == Some(JobStatus::Running) {
            if let Some(open) = attempts.iter_mut().rev().find(|a| a.attempt == event.attempt && a.ended_at.is_none()) {
                open.ended_at = Some(event.at);
                open.status = event.to;
                open.exit_code = event.exit_code;
                open.reason = event.reason.clone();
            }
        }
    }
    attempts
}

#[cfg(test)]
mod tests {
    use super::*;
    use JobStatus::*;

    fn event(at: i64, from: Option<JobStatus>, to: JobStatus, attempt: u32) -> JobEvent {
        JobEvent {
            at,
            from,
            to,
            attempt,
            worker: Some(format!("w{attempt}")),
            reason: None,
            gpus: vec![attempt],
            exit_code: None,
        }
    }

    #[test]
    fn a_crash_a_requeue_and_a_success_make_two_attempts() {
        let mut lost = event(20, Some(Running), Queued, 1);
        lost.reason = Some("lease expired".into());
        let mut done = event(40, Some(Running), Succeeded, 2);
        done.exit_code = Some(0);
        let events = [
            event(10, None, Queued, 0),
            event(11, Some(Queued), Running, 1),
            lost,
            event(30, Some(Queued), Running, 2),
            done,
        ];
        let attempts = attempts(&events);
        assert_eq!(attempts.len(), 2);
        assert_eq!((attempts[0].started_at, attempts[0].ended_at, attempts[0].status), (11, Some(20), Queued));
        assert_eq!(attempts[0].reason.as_deref(), Some("lease expired"));
        assert_eq!((attempts[1].worker.as_deref(), attempts[1].gpus.as_slice()), (Some("w2"), &[2][..]));
        assert_eq!((attempts[1].ended_at, attempts[1].status, attempts[1].exit_code), (Some(40), Succeeded, Some(0)));
    }

    #[test]
    fn a_running_attempt_has_no_end_and_queue_moves_are_not_attempts() {
        let events = [
            event(10, Some(Queued), Cancelled, 0),
            event(11, Some(Cancelled), Queued, 0),
            event(12, Some(Queued), Running, 1),
        ];
        let attempts = attempts(&events);
        assert_eq!(attempts.len(), 1);
        assert_eq!((attempts[0].ended_at, attempts[0].status), (None, Running));
    }
}
