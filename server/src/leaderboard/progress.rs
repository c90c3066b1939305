//! A sweep over time: the best result as runs finish, and when its remaining jobs will have
//! run. Pure: run times in, curve and estimate out.

use shared::api::{BestSoFarPoint, JobId, SweepEta};
use shared::sweep::Goal;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A finished run's value of the metric and when it finished.
pub struct Finished {
    pub job_id: JobId,
    pub finished_at: i64,
    pub value: f64,
}

/// Runs in order of finishing (ties by id), each with the best value of all finished by then.
pub fn best_so_far(mut runs: Vec<Finished>, goal: Goal) -> Vec<BestSoFarPoint> {
    runs.retain(|run| run.value.is_finite());
    runs.sort_by_key(|run| (run.finished_at, run.job_id));
    let mut best: Option<f64> = None;
    runs.into_iter()
        .map(|run| {
            let better = match (best, goal) {
                (None, _) => true,
                (Some(best), Goal::Minimize) => run.value < best,
                (Some(best), Goal::Maximize) => run.value > best,
            };
            if better {
                best = Some(run.value);
            }
            BestSoFarPoint {
                at: run.finished_at,
                job_id: run.job_id,
                value: run.value,
                best: best.unwrap_or(run.value),
            }
        })
        .collect()
}

/// Where a sweep stands, for [`eta`].
pub struct Pace {
    pub queued: u64,
    /// When each running job started (Unix ms).
    pub running_since: Vec<i64>,
    /// Runs that ran to an end of their own (succeeded or failed).
    pub finished: u64,
    /// Their mean run time, ms.
    pub mean_run_ms: Option<f64>,
    pub now: i64,
}

/// When the queued and running jobs will all have run, if runs keep taking their mean time and
/// as many run at once as now: each running job ends after the mean (at once if it is past
/// it), and each queued job takes the earliest free slot.
pub fn eta(pace: &Pace) -> SweepEta {
    let running = pace.running_since.len() as u64;
    let mean = pace.mean_run_ms.filter(|mean| mean.is_finite() && *mean >= 0.0);
    let answer = |remaining_ms: Option<u64>, note: String| SweepEta {
        queued: pace.queued,
        running,
        finished: pace.finished,
        mean_run_ms: mean.map(|mean| mean.round() as u64),
        remaining_ms,
        note,
    };
    if pace.queued == 0 && running == 0 {
        return answer(Some(0), "every job has ended".into());
    }
    let Some(mean) = mean.filter(|_| pace.finished > 0) else {
        return answer(None, "an estimate comes once a run has finished".into());
    };
    if running == 0 {
        return answer(None, "no job of this sweep is running: its queued jobs wait for a worker that fits".into());
    }
    let mut slots: BinaryHeap<Reverse<u64>> = pace
        .running_since
        .iter()
        .map(|&started| Reverse((mean - pace.now.saturating_sub(started) as f64).max(0.0).round() as u64))
        .collect();
    let per_run = mean.round() as u64;
    // Past a slot count's worth of rounds the pattern repeats: whole rounds are added at once,
    // so a 100,000-job queue costs as much as a short one.
    let rounds = pace.queued / running;
    let mut rest = pace.queued % running;
    if rounds > 0 {
        slots = slots.into_iter().map(|Reverse(end)| Reverse(end + rounds * per_run)).collect();
    }
    while rest > 0 {
        let Reverse(end) = slots.pop().expect("one slot per running job");
        slots.push(Reverse(end + per_run));
        rest -= 1;
    }
    let remaining = slots.into_iter().map(|Reverse(end)| end).max().unwrap_or(0);
    let note = format!("{running} at a time, {} per run on average", words(per_run));
    answer(Some(remaining), note)
}

/// `3h 02m`, `4m 05s`, `12s`: a duration for a note.
fn words(ms: u64) -> String {
    let seconds = ms / 1000;
    match seconds {
        0..60 => format!("{}s", seconds.max(1)),
        60..3600 => format!("{}m {:02}s", seconds / 60, seconds % 60),
        _ => format!("{}h {:02}m", seconds / 3600, seconds / 60 % 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished(job_id: i64, finished_at: i64, value: f64) -> Finished {
        Finished { job_id: JobId::new(job_id), finished_at, value }
    }

    #[test]
    fn the_best_so_far_follows_finishing_order_and_the_goal() {
        let runs = || vec![finished(3, 30, 0.5), finished(1, 10, 0.8), finished(2, 20, 0.9), finished(4, 40, f64::NAN)];
        let low: Vec<(i64, f64)> =
            best_so_far(runs(), Goal::Minimize).iter().map(|p| (p.job_id.get(), p.best)).collect();
        assert_eq!(low, [(1, 0.8), (2, 0.8), (3, 0.5)]);
        let high: Vec<(i64, f64)> =
            best_so_far(runs(), Goal::Maximize).iter().map(|p| (p.job_id.get(), p.best)).collect();
        assert_eq!(high, [(1, 0.8), (2, 0.9), (3, 0.9)]);
    }

    fn pace(queued: u64, running_since: Vec<i64>, finished: u64, mean: Option<f64>) -> Pace {
        Pace { queued, running_since, finished, mean_run_ms: mean, now: 100_000 }
    }

    #[test]
    fn queued_jobs_fill_the_running_slots_at_the_mean_run_time() {
        // Two slots: one job 4 s in, one 12 s in (past the 10 s mean: ends now). Three queued:
        // slot B takes 0-10 and 10-20, slot A ends at 6 then takes 6-16: all done at 20 s.
        let estimate = eta(&pace(3, vec![96_000, 88_000], 5, Some(10_000.0)));
        assert_eq!(estimate.remaining_ms, Some(20_000));
        assert_eq!((estimate.running, estimate.queued, estimate.mean_run_ms), (2, 3, Some(10_000)));
        assert!(estimate.note.contains("2 at a time"), "{}", estimate.note);
        // A long queue is whole rounds: 1,000,000 jobs on 4 slots of 1 s each.
        let long = eta(&pace(1_000_000, vec![100_000; 4], 1, Some(1_000.0)));
        assert_eq!(long.remaining_ms, Some(1_000 + 250_000 * 1_000));
    }

    #[test]
    fn no_estimate_without_a_finished_run_or_a_running_one_and_zero_when_done() {
        assert_eq!(eta(&pace(3, vec![99_000], 0, None)).remaining_ms, None);
        let stalled = eta(&pace(3, vec![], 2, Some(1_000.0)));
        assert!(stalled.remaining_ms.is_none() && stalled.note.contains("wait for a worker"), "{stalled:?}");
        assert_eq!(eta(&pace(0, vec![], 4, Some(1_000.0))).remaining_ms, Some(0));
    }
}
