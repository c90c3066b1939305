//! Draining a held worker at its jobs' next checkpoints (issue 29; decision 0092), decided
//! without the database. A worker held for a job of several GPUs (decision 0080) drains by
//! itself: each GPU that frees waits there, idle unless a job that ends in time borrows it,
//! until the last job ahead of the held one ends. Measured in the simulated lab, that wait
//! was every GPU idle while work waited. Where the jobs there save checkpoints, they need
//! not be waited for: one stopped right after its next save loses nothing (its worker waits
//! for that save, decision 0088) and resumes from it elsewhere.
//!
//! So the pass stops the jobs on a held worker at their saves: each right after a save (its
//! worker waits for it; or at once when its last one was just taken, within a tenth of its
//! interval and 10 s), at the last save it makes before the held job could start, so that
//! the GPUs it frees stand idle as little as possible. That start is when the jobs there that
//! may be stopped this way, taken in the order of their next saves, make room for the held
//! job with the GPUs already free. Each must be preemptible, of one GPU (a job of several
//! could itself take the hold once requeued), of a class no higher than the held job's, past
//! `min_runtime`, not preempted twice within the hour ([`may_preempt`]), and have a save
//! interval its worker has seen. A job that does not checkpoint, or that may not be stopped,
//! is waited for as before; while it stands between the free GPUs and the need, nothing is
//! stopped, since those stops would free GPUs only to leave them idle. Nor is anything
//! stopped for a held job its owner's quota holds back (the claims would not start it).

use crate::fair_share::{admits, Held, Policy};
use crate::preemption::{may_preempt, Cluster, Order, Running};

/// A worker held for a queued job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold<'a> {
    pub worker: u64,
    pub job: u64,
    /// The held job's owner, the GPUs it needs, and its priority class.
    pub user: &'a str,
    pub gpus: u32,
    pub class: i64,
}

/// The longest save interval a drain plans with: a day (a worker's heartbeat tells it, so it
/// is bounded before any arithmetic).
const MAX_EVERY_MS: i64 = 86_400_000;

/// When a drain may stop `job` at one of its saves: its last save (now at the latest) and
/// its interval. It may be preempted on its own account, holds one GPU, is of a class no
/// higher than the held one, and its worker has seen it save at an interval of at most a day,
/// the last time no longer ago than that interval and its slack (a job whose saves stopped is
/// one that cannot be waited for).
fn saves_of(job: &Running<'_>, hold: &Hold<'_>, now: i64, min_runtime_ms: i64) -> Option<(i64, i64)> {
    let every = job.save_every.filter(|every| (1..=MAX_EVERY_MS).contains(every))?;
    // (Bounded, so that nothing below overflows; a save older than its interval and slack
    // makes the job one that cannot be waited for anyway.)
    let saved = job.saved_at?.clamp(now.saturating_sub(2 * MAX_EVERY_MS), now);
    let slack = (every / 10).max(crate::checkpoint_wait::MIN_SLACK_MS);
    let fits = job.gpus == 1 && job.class <= hold.class && now - saved <= every + slack;
    (fits && may_preempt(job, now, min_runtime_ms)).then_some((saved, every))
}

/// When stopping a job that last saved at `saved`, every `every` ms, next loses next to
/// nothing, and whether that is now: its last save when that was just taken (a tenth of its
/// interval, as `checkpoint_wait` counts "just", between 1 and 10 s), else its next save, due
/// now when its worker would wait for it (within the cluster's `save_wait`, or a little late).
fn next_stop(job: &Running<'_>, (saved, every): (i64, i64), cluster: &Cluster<'_>, now: i64) -> (i64, bool) {
    // (At most 10 s: what a stop then loses.)
    let just = (every / 10).clamp(crate::checkpoint_wait::MIN_SLACK_MS, 10_000);
    if now - saved <= just {
        return (saved, true);
    }
    ((saved + every).max(now), job.loses(now, cluster.save_wait) == 0)
}

/// What a drain decides for one hold: the stops to order now, and when the room for the held
/// job is complete if the jobs there are stopped at their saves (`None`: they never make it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Drain {
    pub orders: Vec<Order>,
    pub complete: Option<i64>,
}

/// The drain of `hold`'s worker now (see the module's text): nothing when the held job fits
/// already, its owner's quota holds it back, or the jobs that could be stopped at a save never
/// make room for it.
pub fn drain(hold: &Hold<'_>, cluster: &Cluster<'_>, policy: &Policy, now: i64, min_runtime_ms: i64) -> Drain {
    let free = cluster.free.get(&hold.worker).copied().unwrap_or(0);
    if free >= hold.gpus {
        return Drain::default();
    }
    let cpu = Held { gpus: 0, running: cluster.cpu_running.get(hold.user).copied().unwrap_or(0) };
    let held = cluster
        .running
        .iter()
        .filter(|job| job.user == hold.user)
        .fold(cpu, |held, job| Held { gpus: held.gpus + job.gpus, running: held.running + 1 });
    if admits(hold.user, held, hold.gpus, policy).is_err() {
        return Drain::default();
    }
    // Each job there that may be stopped at a save: when next, whether that is now, its interval.
    let mut stops: Vec<(i64, bool, i64, &Running<'_>)> = cluster
        .running
        .iter()
        .filter(|job| job.worker == hold.worker && job.gpus > 0)
        .filter_map(|job| {
            let saves = saves_of(job, hold, now, min_runtime_ms)?;
            let (at, now_due) = next_stop(job, saves, cluster, now);
            Some((at, now_due, saves.1, job))
        })
        .collect();
    stops.sort_by_key(|(at, _, _, job)| (*at, std::cmp::Reverse(job.started_at), job.job));
    let mut room = free;
    let mut needed = Vec::new();
    for stop in stops {
        if room >= hold.gpus {
            break;
        }
        room += stop.3.gpus;
        needed.push(stop);
    }
    let Some(&(complete, ..)) = needed.last().filter(|_| room >= hold.gpus) else { return Drain::default() };
    // A job due now whose following save still comes before the room is complete is stopped
    // at that one instead: it works on meanwhile rather than leave its GPU idle.
    let orders = needed
        .into_iter()
        .filter(|(at, now_due, every, _)| *now_due && at + every > complete)
        .map(|(_, _, _, job)| Order { job: job.job, for_job: hold.job })
        .collect();
    Drain { orders, complete: Some(complete) }
}

/// The drains of each of `holds`' workers, on `cluster` as the `ordered` stops
/// (`preemption::plan`'s, made first) leave it: their jobs gone, their GPUs free. Returns the
/// stops to order, and each hold's room's completion where the drain makes one.
pub fn drains<'a>(
    holds: &[Hold<'a>],
    mut cluster: Cluster<'_>,
    ordered: &[Order],
    policy: &Policy,
    now: i64,
    min_runtime_ms: i64,
) -> (Vec<Order>, Vec<(Hold<'a>, i64)>) {
    for order in ordered {
        if let Some(at) = cluster.running.iter().position(|job| job.job == order.job) {
            let gone = cluster.running.remove(at);
            *cluster.free.entry(gone.worker).or_default() += gone.gpus;
        }
    }
    let (mut orders, mut completes) = (Vec::new(), Vec::new());
    for hold in holds {
        let drain = drain(hold, &cluster, policy, now, min_runtime_ms);
        orders.extend(drain.orders);
        completes.extend(drain.complete.map(|complete| (*hold, complete)));
    }
    (orders, completes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fair_share::Quota;
    use std::collections::BTreeMap;

    const MIN: i64 = 60_000;
    const NOW: i64 = 100 * MIN;
    /// Half the default grace: a save due within a minute is waited for.
    const WAIT: i64 = MIN;
    const MIN_RUNTIME: i64 = 10 * MIN;

    /// A one-GPU job of `ana`'s on worker 0 that started `age` minutes ago and saves every 5
    /// minutes, the last time `since_save` minutes ago (`None`: it never saved).
    fn job(id: u64, age: i64, since_save: Option<i64>) -> Running<'static> {
        Running {
            job: id,
            user: "ana",
            worker: 0,
            gpus: 1,
            started_at: NOW - age * MIN,
            checkpointed_at: None,
            saved_at: since_save.map(|minutes| NOW - minutes * MIN),
            save_every: since_save.map(|_| 5 * MIN),
            preemptible: true,
            class: 0,
            preempted_at: Vec::new(),
        }
    }

    fn cluster(free: u32, running: Vec<Running<'static>>) -> Cluster<'static> {
        Cluster {
            free: BTreeMap::from([(0, free), (1, 0)]),
            running,
            total_gpus: 16,
            save_wait: WAIT,
            ..Cluster::default()
        }
    }

    /// Worker 0 held for `fay`'s job of 8 GPUs.
    const HOLD: Hold<'static> = Hold { worker: 0, job: 99, user: "fay", gpus: 8, class: 0 };

    /// The jobs stopped at `now` for [`HOLD`], sorted.
    fn stopped_at(free: u32, running: Vec<Running<'static>>, now: i64) -> Vec<u64> {
        let mut jobs: Vec<u64> = drain(&HOLD, &cluster(free, running), &Policy::default(), now, MIN_RUNTIME)
            .orders
            .iter()
            .inspect(|order| assert_eq!(order.for_job, 99))
            .map(|order| order.job)
            .collect();
        jobs.sort_unstable();
        jobs
    }

    fn stopped(free: u32, running: Vec<Running<'static>>) -> Vec<u64> {
        stopped_at(free, running, NOW)
    }

    #[test]
    fn each_job_is_stopped_at_its_last_save_before_the_room_is_complete() {
        // 5 GPUs free; three jobs there, due in 1, 3 and 4 minutes: the room is complete in 4.
        // The first is due now and saves next after that: stopped now.
        let running = vec![job(1, 20, Some(4)), job(2, 30, Some(1)), job(3, 40, Some(2))];
        assert_eq!(stopped(5, running.clone()), [1]);
        // Three minutes on, with the first gone, the other two are due: both stop.
        assert_eq!(stopped_at(6, running[1..].to_vec(), NOW + 3 * MIN), [2, 3]);
        // A job saving every minute, due now, and one due in 5 minutes: the first saves again
        // before the room is complete, so it works on until its last save before then.
        let mut often = job(1, 20, None);
        (often.saved_at, often.save_every) = (Some(NOW - 50_000), Some(MIN));
        let seldom = Running { save_every: Some(10 * MIN), ..job(2, 30, Some(5)) };
        assert_eq!(stopped(6, vec![often.clone(), seldom.clone()]), Vec::<u64>::new());
        let later = NOW + 270_000; // `often` saved 20 s before, `seldom` is due in 30 s.
        often.saved_at = Some(NOW + 250_000);
        assert_eq!(stopped_at(6, vec![often, seldom], later), [1, 2]);
    }

    #[test]
    fn a_save_a_little_late_is_due_now() {
        // Every 5 minutes, the last 5:10 ago: 10 s late, within the slack: due now, and the
        // other job's save (in 4 minutes) completes the room after it saves again.
        let late = Running { saved_at: Some(NOW - 310_000), ..job(1, 20, Some(5)) };
        assert_eq!(stopped(6, vec![late.clone(), job(2, 30, Some(1))]), [1]);
        // 40 s late, past the slack (30 s): its saves stopped; it blocks the room.
        let later = Running { saved_at: Some(NOW - 340_000), ..late };
        assert_eq!(stopped(6, vec![later.clone(), job(2, 30, Some(1))]), Vec::<u64>::new());
        let drained = drain(
            &HOLD,
            &cluster(6, vec![later, job(2, 30, Some(1)), job(3, 30, Some(4))]),
            &Policy::default(),
            NOW,
            MIN_RUNTIME,
        );
        assert_eq!(drained.complete, Some(NOW + 4 * MIN), "made by the other two");
    }

    #[test]
    fn the_drain_says_when_the_room_is_complete_and_bounds_what_workers_tell() {
        let running = vec![job(1, 20, Some(4)), job(2, 30, Some(1)), job(3, 40, Some(2))];
        let drained = drain(&HOLD, &cluster(5, running), &Policy::default(), NOW, MIN_RUNTIME);
        assert_eq!(drained.complete, Some(NOW + 4 * MIN));
        // Absurd saves from a hostile worker: no overflow, nothing planned from them.
        for (saved_at, every) in [(i64::MIN, i64::MAX), (i64::MAX, 1), (NOW, i64::MAX), (NOW - MIN, -5), (0, 0)] {
            let odd = Running { saved_at: Some(saved_at), save_every: Some(every), ..job(1, 20, None) };
            let drained = drain(&HOLD, &cluster(7, vec![odd]), &Policy::default(), NOW, MIN_RUNTIME);
            assert!(drained.complete.is_none_or(|at| (NOW - 10 * MIN..=NOW + 86_400_000).contains(&at)), "{drained:?}");
        }
    }

    #[test]
    fn a_save_just_taken_counts_as_now_for_ten_seconds_at_most() {
        // Saved 5 s ago, every 5 minutes: stopped at once (losing 5 s).
        let mut just = job(1, 20, None);
        (just.saved_at, just.save_every) = (Some(NOW - 5_000), Some(5 * MIN));
        assert_eq!(stopped(7, vec![just.clone()]), [1]);
        // Saved 20 s ago: not "just" (it would lose 20 s); due in 4:40, not now.
        just.saved_at = Some(NOW - 20_000);
        assert_eq!(stopped(7, vec![just]), Vec::<u64>::new());
    }

    #[test]
    fn nothing_is_stopped_while_a_job_that_cannot_be_waited_for_blocks_the_room() {
        // Three jobs with saves due, one that never saved: stopping the three leaves 7 of 8.
        let blocked = vec![job(1, 20, Some(4)), job(2, 30, Some(4)), job(3, 40, Some(4)), job(4, 50, None)];
        assert_eq!(stopped(4, blocked.clone()), Vec::<u64>::new());
        // Young (under min_runtime), not preemptible, preempted twice this hour, of a higher
        // class, of two GPUs (itself a job that could hold a worker): each blocks alike.
        let young = job(4, 5, Some(4));
        let pinned = Running { preemptible: false, ..job(4, 50, Some(4)) };
        let churned = Running { preempted_at: vec![NOW - 30 * MIN, NOW - 20 * MIN], ..job(4, 50, Some(4)) };
        let urgent = Running { class: 1, ..job(4, 50, Some(4)) };
        let wide = Running { gpus: 2, ..job(4, 50, Some(4)) };
        for (free, blocker) in [(4, young), (4, pinned), (4, churned), (4, urgent), (3, wide)] {
            let mut running = blocked[..3].to_vec();
            running.push(blocker.clone());
            assert_eq!(stopped(free, running), Vec::<u64>::new(), "{blocker:?}");
        }
        // Without the blocker, the room is there: all three stop.
        assert_eq!(stopped(5, blocked[..3].to_vec()), [1, 2, 3]);
    }

    #[test]
    fn only_what_the_held_job_needs_is_stopped_and_nothing_once_it_fits_or_past_its_quota() {
        // Six free, four due at once: two stop (the youngest), the held job then fits.
        let running = vec![job(1, 20, Some(4)), job(2, 30, Some(4)), job(3, 40, Some(4)), job(4, 50, Some(4))];
        assert_eq!(stopped(6, running.clone()), [1, 2]);
        assert_eq!(stopped(8, running.clone()), Vec::<u64>::new(), "it fits");
        // Jobs on another worker, or without GPUs, are never stopped for it.
        let elsewhere: Vec<Running<'static>> =
            running.iter().cloned().map(|job| Running { worker: 1, ..job }).collect();
        assert_eq!(stopped(6, elsewhere), Vec::<u64>::new());
        let cpu: Vec<Running<'static>> = running.iter().cloned().map(|job| Running { gpus: 0, ..job }).collect();
        assert_eq!(stopped(6, cpu), Vec::<u64>::new());
        // fay holds 4 GPUs on worker 1 and may hold 8: her job would not start, nothing stops.
        let mut quota = running.clone();
        quota.push(Running { user: "fay", worker: 1, gpus: 4, preemptible: false, ..job(9, 30, None) });
        let policy = Policy {
            quotas: BTreeMap::from([("fay".to_string(), Quota { max_gpus: Some(8), max_running: None })]),
            ..Policy::default()
        };
        assert_eq!(drain(&HOLD, &cluster(6, quota.clone()), &policy, NOW, MIN_RUNTIME), Drain::default());
        assert_eq!(drain(&HOLD, &cluster(6, quota), &Policy::default(), NOW, MIN_RUNTIME).orders.len(), 2);
    }

    #[test]
    fn stops_already_ordered_count_as_room_and_are_not_ordered_twice() {
        // Four GPUs free, four jobs due: the plan already stops job 1 (for someone else), so
        // three more make room, not four.
        let running = vec![job(1, 20, Some(4)), job(2, 30, Some(4)), job(3, 40, Some(4)), job(4, 50, Some(4))];
        let planned = [Order { job: 1, for_job: 7 }];
        let policy = Policy::default();
        let ids = |(orders, _): (Vec<Order>, _)| orders.iter().map(|order: &Order| order.job).collect::<Vec<u64>>();
        let stops = drains(&[HOLD], cluster(4, running.clone()), &planned, &policy, NOW, MIN_RUNTIME);
        assert_eq!(ids(stops), [2, 3, 4]);
        assert_eq!(ids(drains(&[HOLD], cluster(4, running), &[], &policy, NOW, MIN_RUNTIME)), [1, 2, 3, 4]);
    }
}
