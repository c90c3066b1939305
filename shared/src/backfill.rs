//! Reservations for jobs of several GPUs, and backfill (issue 29, item 4; decision 0080),
//! decided without the database. On a cluster busy with one-GPU jobs, a job of four GPUs
//! would wait for ever: each GPU that frees goes to a small job at once. Once it has waited
//! `backfill_after_secs`, the scheduler's pass holds one worker for it: that worker's GPUs go
//! to no one else as they free up, until it fits, except to jobs that end (by the `timeout`
//! their sweeps declare) before the reserved job could start anyway, as Slurm's backfill lends
//! them. When it could start is the latest end among the running jobs it waits for, each at
//! its start plus its timeout; a job without a timeout may run for ever, so then nobody knows,
//! and nothing is lent.

/// A running job on a worker, as a reservation sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy {
    /// GPUs it holds.
    pub gpus: u32,
    /// When its timeout ends it (Unix ms); `None` without a timeout.
    pub ends_at: Option<i64>,
}

/// A worker a reservation may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worker {
    pub worker: u64,
    /// Its GPUs.
    pub gpus: u32,
    /// Its GPUs no job holds now.
    pub free: u32,
    pub running: Vec<Busy>,
}

/// When `need` GPUs will be free on `worker` at the latest, by the timeouts of its running
/// jobs: `now` if they are; `None` when it takes a job without a timeout ending, or when the
/// worker has fewer GPUs than that.
pub fn starts_at(worker: &Worker, need: u32, now: i64) -> Option<i64> {
    if need > worker.gpus {
        return None;
    }
    if worker.free >= need {
        return Some(now);
    }
    let mut ends: Vec<(Option<i64>, u32)> = worker.running.iter().map(|job| (job.ends_at, job.gpus)).collect();
    // Known ends first, earliest first; the unknown ones last.
    ends.sort_by_key(|(ends_at, _)| (ends_at.is_none(), *ends_at));
    let mut free = worker.free;
    for (ends_at, gpus) in ends {
        free += gpus;
        if free >= need {
            return ends_at.map(|at| at.max(now));
        }
    }
    None
}

/// The worker to hold for a job of `need` GPUs among `workers` (those not held already): the
/// one where it could start soonest, then (nobody knows when) the one with the most GPUs free
/// now, then the fewest GPUs held by jobs without a timeout; ties by id. `None` when no worker
/// has `need` GPUs.
pub fn choose(workers: &[Worker], need: u32, now: i64) -> Option<(u64, Option<i64>)> {
    let open_ended = |worker: &Worker| -> u32 {
        worker.running.iter().filter(|job| job.ends_at.is_none()).map(|job| job.gpus).sum()
    };
    workers
        .iter()
        .filter(|worker| worker.gpus >= need)
        .map(|worker| (worker, starts_at(worker, need, now)))
        .min_by_key(|(worker, start)| {
            (start.is_none(), *start, std::cmp::Reverse(worker.free), open_ended(worker), worker.worker)
        })
        .map(|(worker, start)| (worker.worker, start))
}

/// How many of `workers` may be held at once: a quarter (one at least). Holding one for every
/// large job waiting would hand the whole cluster to large jobs, the small ones getting only
/// what ends before a large one starts (a simulated lab, `app-bench lab`, measured it).
pub fn most_held(workers: usize) -> usize {
    (workers / 4).max(1)
}

/// Whether a job that runs at most `timeout_secs` may use a held worker's GPUs at `now`: it
/// ends before the reserved job could start (`starts_at`), which must be known.
pub fn may_backfill(timeout_secs: Option<u64>, now: i64, starts_at: Option<i64>) -> bool {
    match (timeout_secs, starts_at) {
        (Some(timeout), Some(start)) => {
            let timeout = i64::try_from(timeout).unwrap_or(i64::MAX);
            now.saturating_add(timeout.saturating_mul(1000)) <= start
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_000_000;
    const MIN: i64 = 60_000;

    fn busy(gpus: u32, ends_in_min: Option<i64>) -> Busy {
        Busy { gpus, ends_at: ends_in_min.map(|minutes| NOW + minutes * MIN) }
    }

    #[test]
    fn a_job_could_start_when_enough_of_the_running_jobs_have_ended_by_their_timeouts() {
        let worker = Worker {
            worker: 1,
            gpus: 8,
            free: 1,
            running: vec![busy(2, Some(30)), busy(1, Some(10)), busy(4, None), busy(1, Some(20))],
        };
        assert_eq!(starts_at(&worker, 1, NOW), Some(NOW), "free now");
        assert_eq!(starts_at(&worker, 2, NOW), Some(NOW + 10 * MIN));
        assert_eq!(starts_at(&worker, 4, NOW), Some(NOW + 30 * MIN), "1 free + 1 + 1 + 2");
        assert_eq!(starts_at(&worker, 5, NOW), Some(NOW + 30 * MIN), "all four with timeouts");
        assert_eq!(starts_at(&worker, 6, NOW), None, "needs the job without a timeout");
        assert_eq!(starts_at(&worker, 9, NOW), None, "more GPUs than the worker has");
        // A timeout already past (a job about to be killed) counts as now.
        let late = Worker { worker: 1, gpus: 2, free: 0, running: vec![busy(2, Some(-5))] };
        assert_eq!(starts_at(&late, 2, NOW), Some(NOW));
    }

    #[test]
    fn the_worker_held_is_the_one_where_the_job_starts_soonest() {
        let soon = Worker { worker: 7, gpus: 4, free: 0, running: vec![busy(4, Some(5))] };
        let later = Worker { worker: 3, gpus: 4, free: 2, running: vec![busy(2, Some(50))] };
        let never = Worker { worker: 1, gpus: 4, free: 3, running: vec![busy(1, None)] };
        let small = Worker { worker: 0, gpus: 2, free: 2, running: Vec::new() };
        let all = [soon.clone(), later.clone(), never.clone(), small];
        assert_eq!(choose(&all, 4, NOW), Some((7, Some(NOW + 5 * MIN))));
        assert_eq!(choose(&[later.clone(), never.clone()], 4, NOW), Some((3, Some(NOW + 50 * MIN))));
        // Nobody knows: the most GPUs free now.
        let other = Worker { worker: 2, gpus: 4, free: 1, running: vec![busy(3, None)] };
        assert_eq!(choose(&[other, never], 4, NOW), Some((1, None)));
        assert_eq!(choose(&all, 5, NOW), None);
    }

    #[test]
    fn at_most_a_quarter_of_the_workers_are_held() {
        assert_eq!([1, 3, 4, 7, 8, 40].map(most_held), [1, 1, 1, 1, 2, 10]);
    }

    #[test]
    fn only_jobs_that_end_before_the_reserved_start_may_backfill() {
        let start = Some(NOW + 30 * MIN);
        assert!(may_backfill(Some(30 * 60), NOW, start), "ends exactly then");
        assert!(!may_backfill(Some(30 * 60 + 1), NOW, start));
        assert!(!may_backfill(None, NOW, start), "no timeout: it may run for ever");
        assert!(!may_backfill(Some(1), NOW, None), "the start unknown: nothing is lent");
        assert!(!may_backfill(Some(u64::MAX), NOW, start), "no overflow");
    }
}
