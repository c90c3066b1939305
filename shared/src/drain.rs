//! Draining a held worker at its jobs' next checkpoints (issue 29; decision 0092), decided
//! without the database. A worker held for a job of several GPUs (decision 0080) drains by
//! itself: each GPU that frees waits there, idle unless a job that ends in time borrows it,
//! until the last job ahead of the held one ends. Measured in the simulated lab, that wait
//! was every GPU idle while work waited. Where the jobs there save checkpoints, they need
//! not be waited for: one stopped right after its next save loses nothing (its worker waits
//! for that save, decision 0088) and resumes from it elsewhere.
//!
//! So the pass stops the jobs on a held worker whose next save is due within the worker's
//! wait, or was just taken (they lose next to nothing), as long as the jobs it may stop that way, now or at their later
//! saves, make room for the held job with the GPUs already free. Each must be preemptible, of
//! a class no higher than the held job's, past `min_runtime`, and not preempted twice within
//! the hour ([`may_preempt`]). A job that does not checkpoint, or that may not be stopped,
//! is waited for as before; while it stands between the free GPUs and the need, nothing is
//! stopped, since those stops would free GPUs only to leave them idle.

use crate::preemption::{may_preempt, Cluster, Order, Running};

/// A worker held for a queued job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    pub worker: u64,
    pub job: u64,
    /// The GPUs the held job needs, and its priority class.
    pub gpus: u32,
    pub class: i64,
}

/// Whether `job` is one a drain may stop at one of its saves: it may be preempted on its own
/// account, is of a class no higher than the held one, and its worker has seen it save at a
/// known interval (its next save can be waited for).
fn stoppable_at_a_save(job: &Running<'_>, hold: &Hold, now: i64, min_runtime_ms: i64) -> bool {
    job.class <= hold.class
        && job.saved_at.is_some()
        && job.save_every.is_some_and(|every| every > 0)
        && may_preempt(job, now, min_runtime_ms)
}

/// Whether stopping `job` now loses next to nothing: its worker will wait for its next save
/// (none lost), or its last one was just taken (a tenth of its interval at most, as
/// `checkpoint_wait` counts "just").
fn loses_next_to_nothing(job: &Running<'_>, cluster: &Cluster<'_>, now: i64) -> bool {
    let just = job.save_every.map_or(0, |every| (every / 10).max(crate::checkpoint_wait::MIN_SLACK_MS));
    job.loses(now, cluster.save_wait) == 0 || job.saved_at.is_some_and(|at| now - at <= just)
}

/// The stops that drain `hold`'s worker now: the jobs there whose next save is due within the
/// cluster's `save_wait` (the fewest GPUs left over first, then the youngest), until the held
/// job would fit. None when it fits already, or when the jobs that could be stopped at a save
/// never make room for it.
pub fn drain(hold: &Hold, cluster: &Cluster<'_>, now: i64, min_runtime_ms: i64) -> Vec<Order> {
    let free = cluster.free.get(&hold.worker).copied().unwrap_or(0);
    if free >= hold.gpus {
        return Vec::new();
    }
    let there: Vec<&Running<'_>> =
        cluster.running.iter().filter(|job| job.worker == hold.worker && job.gpus > 0).collect();
    let stoppable: Vec<&Running<'_>> =
        there.iter().copied().filter(|job| stoppable_at_a_save(job, hold, now, min_runtime_ms)).collect();
    if free + stoppable.iter().map(|job| job.gpus).sum::<u32>() < hold.gpus {
        return Vec::new();
    }
    let mut due: Vec<&Running<'_>> =
        stoppable.into_iter().filter(|job| loses_next_to_nothing(job, cluster, now)).collect();
    due.sort_by_key(|job| (std::cmp::Reverse(job.started_at), job.job));
    let mut room = free;
    let mut orders = Vec::new();
    for job in due {
        if room >= hold.gpus {
            break;
        }
        room += job.gpus;
        orders.push(Order { job: job.job, for_job: hold.job });
    }
    orders
}

/// The stops that drain each of `holds`' workers, on `cluster` as the `ordered` stops
/// (`preemption::plan`'s, made first) leave it: their jobs gone, their GPUs free.
pub fn drains(
    holds: &[Hold],
    mut cluster: Cluster<'_>,
    ordered: &[Order],
    now: i64,
    min_runtime_ms: i64,
) -> Vec<Order> {
    for order in ordered {
        if let Some(at) = cluster.running.iter().position(|job| job.job == order.job) {
            let gone = cluster.running.remove(at);
            *cluster.free.entry(gone.worker).or_default() += gone.gpus;
        }
    }
    holds.iter().flat_map(|hold| drain(hold, &cluster, now, min_runtime_ms)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    const MIN: i64 = 60_000;
    const NOW: i64 = 100 * MIN;
    /// Half the default grace: a save due within a minute is waited for.
    const WAIT: i64 = MIN;
    const MIN_RUNTIME: i64 = 10 * MIN;

    /// A one-GPU job on worker 0 that started `age` minutes ago and saves every 5 minutes, the
    /// last time `since_save` minutes ago (`None`: it never saved).
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

    const HOLD: Hold = Hold { worker: 0, job: 99, gpus: 8, class: 0 };

    fn stopped(orders: &[Order]) -> Vec<u64> {
        orders.iter().map(|order| order.job).collect()
    }

    #[test]
    fn jobs_whose_next_save_is_due_within_the_wait_are_stopped_for_the_held_job() {
        // 5 GPUs free; three jobs there: one saves within the minute, two later.
        let running = vec![job(1, 20, Some(4)), job(2, 30, Some(1)), job(3, 40, Some(2))];
        let orders = drain(&HOLD, &cluster(5, running.clone()), NOW, MIN_RUNTIME);
        assert_eq!(orders, vec![Order { job: 1, for_job: 99 }], "the one due now, for the held job");
        // Four minutes on, the other two are due: they are stopped too (the first counted gone).
        let later = NOW + 3 * MIN;
        assert_eq!(stopped(&drain(&HOLD, &cluster(6, running[1..].to_vec()), later, MIN_RUNTIME)), vec![2, 3]);
    }

    #[test]
    fn nothing_is_stopped_while_a_job_that_cannot_be_waited_for_blocks_the_room() {
        // Three jobs with saves due, one that never saved: stopping the three leaves 7 of 8.
        let blocked = vec![job(1, 20, Some(4)), job(2, 30, Some(4)), job(3, 40, Some(4)), job(4, 50, None)];
        assert!(drain(&HOLD, &cluster(4, blocked.clone()), NOW, MIN_RUNTIME).is_empty());
        // Young (under min_runtime), not preemptible, preempted twice this hour, of a higher
        // class: each blocks alike.
        let mut young = job(4, 5, Some(4));
        young.started_at = NOW - 5 * MIN;
        let mut pinned = job(4, 50, Some(4));
        pinned.preemptible = false;
        let mut churned = job(4, 50, Some(4));
        churned.preempted_at = vec![NOW - 30 * MIN, NOW - 20 * MIN];
        let mut urgent = job(4, 50, Some(4));
        urgent.class = 1;
        for blocker in [young, pinned, churned, urgent] {
            let mut running = blocked[..3].to_vec();
            running.push(blocker.clone());
            assert!(drain(&HOLD, &cluster(4, running), NOW, MIN_RUNTIME).is_empty(), "{blocker:?}");
        }
        // Without the blocker, the room is there: all three stop.
        assert_eq!(stopped(&drain(&HOLD, &cluster(5, blocked[..3].to_vec()), NOW, MIN_RUNTIME)), vec![1, 2, 3]);
    }

    #[test]
    fn stops_already_ordered_count_as_room_and_are_not_ordered_twice() {
        // Four GPUs free, four jobs due: the plan already stops job 1 (for someone else), so
        // three more make room, not four.
        let running = vec![job(1, 20, Some(4)), job(2, 30, Some(4)), job(3, 40, Some(4)), job(4, 50, Some(4))];
        let planned = [Order { job: 1, for_job: 7 }];
        let stops = drains(&[HOLD], cluster(4, running.clone()), &planned, NOW, MIN_RUNTIME);
        assert_eq!(stopped(&stops), vec![2, 3, 4]);
        assert_eq!(stopped(&drains(&[HOLD], cluster(4, running), &[], NOW, MIN_RUNTIME)), vec![1, 2, 3, 4]);
    }

    #[test]
    fn only_what_the_held_job_needs_is_stopped_and_nothing_once_it_fits() {
        // Six free, four due: two stop (the youngest), the held job then fits.
        let running = vec![job(1, 20, Some(4)), job(2, 30, Some(4)), job(3, 40, Some(4)), job(4, 50, Some(4))];
        assert_eq!(stopped(&drain(&HOLD, &cluster(6, running.clone()), NOW, MIN_RUNTIME)), vec![1, 2]);
        assert!(drain(&HOLD, &cluster(8, running.clone()), NOW, MIN_RUNTIME).is_empty(), "it fits");
        // Jobs on another worker, or without GPUs, are never stopped for it.
        let elsewhere: Vec<Running<'static>> =
            running.iter().cloned().map(|job| Running { worker: 1, ..job }).collect();
        assert!(drain(&HOLD, &cluster(6, elsewhere), NOW, MIN_RUNTIME).is_empty());
        // A job that last saved 2 minutes ago is due in 3, past the wait: not now.
        let later = vec![job(1, 20, Some(2)), job(2, 30, Some(2))];
        assert!(drain(&HOLD, &cluster(6, later), NOW, MIN_RUNTIME).is_empty());
    }
}
