//! Property tests of `shared::fair_share`: on a simulated cluster where every user always has
//! work waiting, filling the freed GPUs with `allot` (as a claim batch does) keeps every user
//! within their quota, and each user's share of the GPU time converges to their weight.

use proptest::prelude::*;
use shared::fair_share::{allot, decay, Contender, Held, Policy, Quota};
use shared::placement::Capacity;
use shared::sweep::Resources;
use std::collections::BTreeMap;

/// A running job: its user, GPUs and the time step at which it ends.
struct Running {
    user: usize,
    gpus: u32,
    ends: u64,
}

/// A worker with `gpus` free GPUs and a slot for each.
fn worker(gpus: u32) -> Capacity {
    Capacity::idle_gpus(gpus, gpus, 80 << 30)
}

/// Runs `steps` time steps of a cluster of `gpus` GPUs shared by backlogged users whose jobs
/// take `sizes[user]` GPUs and a duration drawn from `durations` in turn; returns each user's
/// GPU time over the second half, and checks the quotas at every step.
fn simulate(policy: &Policy, users: &[String], sizes: &[u32], durations: &[u64], gpus: u32, steps: u64) -> Vec<f64> {
    let mut usage = vec![0.0; users.len()];
    let mut late_time = vec![0.0; users.len()];
    let mut running: Vec<Running> = Vec::new();
    let mut next_duration = durations.iter().cycle();
    let resources: Vec<Resources> =
        sizes.iter().map(|size| Resources { gpus: Some(*size), ..Resources::default() }).collect();
    for step in 0..steps {
        running.retain(|job| job.ends > step);
        // The free GPUs as one worker's claim, filled by `allot` as the server fills a batch.
        let free = gpus - running.iter().map(|job| job.gpus).sum::<u32>();
        let held = |user: usize| Held {
            gpus: running.iter().filter(|job| job.user == user).map(|job| job.gpus).sum(),
            running: running.iter().filter(|job| job.user == user).count() as u32,
        };
        let contenders: Vec<Contender<'_>> = users
            .iter()
            .enumerate()
            .map(|(user, name)| Contender {
                user: name,
                usage: usage[user],
                held: held(user),
                jobs: vec![&resources[user]; free as usize],
                classes: Vec::new(),
            })
            .collect();
        for pick in allot(&[worker(free)], &contenders, policy) {
            let duration = *next_duration.next().unwrap();
            running.push(Running { user: pick.user, gpus: pick.placement.gpus.len() as u32, ends: step + duration });
        }
        for (user, name) in users.iter().enumerate() {
            let quota = policy.quota(name);
            let held: u32 = running.iter().filter(|job| job.user == user).map(|job| job.gpus).sum();
            let count = running.iter().filter(|job| job.user == user).count() as u32;
            assert!(quota.max_gpus.is_none_or(|max| held <= max), "{name} holds {held} GPUs");
            assert!(quota.max_running.is_none_or(|max| count <= max), "{name} runs {count} jobs");
        }
        // One step of GPU time, on top of the usage decayed by one step.
        for (user, total) in usage.iter_mut().enumerate() {
            let held: u32 = running.iter().filter(|job| job.user == user).map(|job| job.gpus).sum();
            *total = decay(*total, 1.0, policy.half_life_secs) + f64::from(held);
            if step >= steps / 2 {
                late_time[user] += f64::from(held);
            }
        }
    }
    late_time
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn each_backlogged_users_share_converges_to_its_weight(
        weights in prop::collection::vec(1u32..5, 2..5),
        durations in prop::collection::vec(1u64..10, 1..20),
    ) {
        let users: Vec<String> = (0..weights.len()).map(|user| format!("user-{user}")).collect();
        let policy = Policy {
            half_life_secs: 500.0,
            weights: users.iter().cloned().zip(weights.iter().map(|weight| f64::from(*weight))).collect(),
            ..Policy::default()
        };
        let time = simulate(&policy, &users, &vec![1; users.len()], &durations, 16, 6_000);
        let total_time: f64 = time.iter().sum();
        let total_weight: f64 = weights.iter().map(|weight| f64::from(*weight)).sum();
        for (user, weight) in weights.iter().enumerate() {
            let share = time[user] / total_time;
            let target = f64::from(*weight) / total_weight;
            prop_assert!((share - target).abs() < 0.05 + 0.1 * target, "user {user}: {share:.3} of the time, weight share {target:.3}");
        }
    }

    #[test]
    fn no_user_ever_holds_more_than_the_quota(
        max_gpus in prop::collection::vec(prop::option::of(1u32..6), 3),
        max_running in prop::collection::vec(prop::option::of(1u32..4), 3),
        size in 1u32..4,
        durations in prop::collection::vec(1u64..10, 1..10),
    ) {
        // One job size for all: with mixed sizes, small jobs fill the GPUs a larger job waits
        // for, which reservations (issue 29, item 4) are to prevent.
        let sizes = [size; 3];
        let users: Vec<String> = (0..3).map(|user| format!("user-{user}")).collect();
        let quotas: BTreeMap<String, Quota> = users
            .iter()
            .enumerate()
            .map(|(user, name)| (name.clone(), Quota { max_gpus: max_gpus[user], max_running: max_running[user] }))
            .collect();
        let policy = Policy { quotas, ..Policy::default() };
        // The checks are inside: every step, every user within quota.
        let time = simulate(&policy, &users, &sizes, &durations, 8, 500);
        // A user whose jobs fit their quota got GPU time: quotas hold back, they do not starve.
        for user in 0..3 {
            if max_gpus[user].is_none_or(|max| sizes[user] <= max) {
                prop_assert!(time[user] > 0.0, "user {user} never ran");
            }
        }
    }
}
