//! Property tests of `shared::preemption::plan` on random clusters: every order stops a job
//! that may be stopped (and frees a GPU), of another user who ranks after the one it is for,
//! once; no user is left below their share by the orders, and none is given more than theirs.

use proptest::prelude::*;
use shared::fair_share::{rank, Policy};
use shared::preemption::{may_preempt, plan, shares, Cluster, Queued, Running, GUARD_MS};
use std::collections::{BTreeMap, BTreeSet};

const USERS: [&str; 4] = ["ann", "bob", "cy", "dee"];
const NOW: i64 = 100 * GUARD_MS;
const MIN_RUNTIME: i64 = 600_000;

/// A running job drawn: user, GPUs, age in minutes, preemptible, preempted this hour.
type Drawn = (usize, u32, i64, bool, usize);

/// Fills workers of `sizes` GPUs with the drawn jobs in turn while they fit.
fn cluster(sizes: &[u32], drawn: &[Drawn], usage: &[f64]) -> Cluster<'static> {
    let mut free: BTreeMap<u64, u32> = sizes.iter().enumerate().map(|(at, gpus)| (at as u64, *gpus)).collect();
    let mut running = Vec::new();
    for (id, (user, gpus, age, preemptible, recent)) in drawn.iter().enumerate() {
        let Some((worker, room)) = free.iter_mut().find(|(_, room)| **room >= *gpus) else { continue };
        *room -= gpus;
        running.push(Running {
            job: id as u64,
            user: USERS[*user],
            worker: *worker,
            gpus: *gpus,
            started_at: NOW - age * 60_000,
            checkpointed_at: None,
            saved_at: None,
            save_every: None,
            preemptible: *preemptible,
            class: 0,
            preempted_at: (0..*recent).map(|at| NOW - 60_000 * (at as i64 + 1)).collect(),
        });
    }
    let usage = USERS.iter().zip(usage).map(|(user, usage)| (*user, *usage)).collect();
    Cluster { free, running, waiting: Vec::new(), total_gpus: sizes.iter().sum(), usage, ..Cluster::default() }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn orders_stop_only_what_may_be_stopped_and_keep_everyone_within_shares(
        sizes in prop::collection::vec(1u32..=8, 1..=4),
        drawn in prop::collection::vec((0usize..4, 0u32..=3, 0i64..60, any::<bool>(), 0usize..=2), 0..30),
        usage in prop::collection::vec(0.0f64..1e5, 4),
        waiting in prop::collection::vec((0usize..4, 1u32..=4, 0u32..=3), 1..=4),
        weights in prop::collection::vec(1u32..=3, 4),
    ) {
        let weights = USERS.iter().zip(&weights).map(|(user, weight)| (user.to_string(), f64::from(*weight))).collect();
        let policy = Policy { weights, ..Policy::default() };
        let mut cluster = cluster(&sizes, &drawn, &usage);
        let mut queues: BTreeMap<usize, Vec<Queued<'static>>> = BTreeMap::new();
        for (at, (user, jobs, gpus)) in waiting.iter().enumerate() {
            let queue = queues.entry(*user).or_default();
            queue.extend((0..*jobs).map(|job| Queued { job: 1_000 + at as u64 * 10 + u64::from(job), user: USERS[*user], gpus: *gpus, on: Vec::new(), class: 0 }));
        }
        cluster.waiting = queues.keys().map(|user| USERS[*user]).collect();
        let queues: Vec<Vec<Queued<'static>>> = queues.into_values().collect();
        let orders = plan(cluster.clone(), &queues, &policy, NOW, MIN_RUNTIME);

        let shares = shares(&cluster, &policy);
        let owner_of = |job: u64| queues.iter().flatten().find(|queued| queued.job == job).map(|queued| queued.user);
        let mut stopped = BTreeSet::new();
        let mut lost: BTreeMap<&str, u32> = BTreeMap::new();
        let mut gained: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
        for order in &orders {
            prop_assert!(stopped.insert(order.job), "job {} ordered twice", order.job);
            let job = cluster.running.iter().find(|job| job.job == order.job).expect("a running job");
            prop_assert!(may_preempt(job, NOW, MIN_RUNTIME), "{job:?} may not be preempted");
            prop_assert!(job.gpus > 0, "{job:?} frees no GPU");
            let for_user = owner_of(order.for_job).expect("a queued job");
            prop_assert_ne!(job.user, for_user);
            let rank_of = |user: &str| rank(user, usage[USERS.iter().position(|u| *u == user).unwrap()], &policy);
            prop_assert!(rank_of(job.user) > rank_of(for_user), "{} ranks before {for_user}", job.user);
            *lost.entry(job.user).or_default() += job.gpus;
            gained.entry(for_user).or_default().insert(order.for_job);
        }
        let held = |user: &str| cluster.running.iter().filter(|job| job.user == user).map(|job| job.gpus).sum::<u32>();
        for (user, lost) in &lost {
            prop_assert!(f64::from(held(user) - lost) >= shares[user].floor(), "{user} left below their share");
        }
        for (user, jobs) in &gained {
            let needs: u32 = queues.iter().flatten().filter(|queued| jobs.contains(&queued.job)).map(|queued| queued.gpus).sum();
            prop_assert!(f64::from(held(user) + needs) <= shares[user].ceil(), "{user} given more than their share");
        }
    }
}
