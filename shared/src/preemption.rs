//! Preemption (issue 29, item 3; decisions 0078, 0079), decided without the database: which
//! running jobs to stop so that waiting jobs of users below their share can start. The
//! scheduler's pass (`server::preempter`) reads the cluster, calls [`plan`] and gives the orders;
//! the worker's SIGTERM, grace and requeue do the rest.
//!
//! A user's share is the cluster's GPUs split among the users with work (running or waiting)
//! by weight. A waiting job may take GPUs from others only while its user, with it, stays
//! within their share; the jobs it takes them from are preemptible, have run at least the
//! minimum runtime, have not been preempted twice in the last hour, and belong to users who
//! stay at or above their own share without them and who rank after the waiting user in the
//! fair share (more usage per unit of weight): the claim that follows gives freed GPUs to the
//! user who ranks first, so a preemption for anyone else would hand them back. The jobs that
//! would lose the least work go first (the least time since their attempt's last checkpoint,
//! else since its start: the youngest), all on one worker (a job's GPUs are on one box).

use crate::fair_share::{admits, rank, Held, Policy, START_CHARGE_SECS};
use std::collections::BTreeMap;

/// Preempted this many times within [`GUARD_MS`], a job is not preempted again until the
/// oldest of them is that old.
pub const GUARD_COUNT: usize = 2;
/// An hour.
pub const GUARD_MS: i64 = 3_600_000;

/// A running job as the preemption sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Running<'a> {
    pub job: u64,
    pub user: &'a str,
    pub worker: u64,
    /// GPUs it holds.
    pub gpus: u32,
    /// When its attempt started (Unix ms).
    pub started_at: i64,
    /// When its attempt last stored a checkpoint (Unix ms), if it has.
    pub checkpointed_at: Option<i64>,
    /// When its attempt last saved one, as its worker saw it (before the upload), and the
    /// time between its last two saves (decision 0089).
    pub saved_at: Option<i64>,
    pub save_every: Option<i64>,
    pub preemptible: bool,
    /// Its sweep's priority class value (0: the default).
    pub class: i64,
    /// When it was preempted before (Unix ms), any order.
    pub preempted_at: Vec<i64>,
}

/// A waiting job that no free place fits: its user, the GPUs it needs on one worker, and the
/// workers that could run it (empty: any).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need<'a> {
    pub user: &'a str,
    pub gpus: u32,
    pub on: &'a [u64],
    /// Its priority class value: jobs of a lower class give way whatever the shares.
    pub class: i64,
}

/// A queued job as the pass sees it: one of its user's, in their dispatch order, with the
/// workers that could run it (by their GPUs' memory, the trainer; empty: any).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued<'a> {
    pub job: u64,
    pub user: &'a str,
    pub gpus: u32,
    pub on: Vec<u64>,
    pub class: i64,
}

impl Running<'_> {
    /// The work a preemption at `now` would lose: the time since its attempt's last
    /// checkpoint (saved or stored), or since it started (a job that checkpoints on SIGTERM
    /// loses less).
    pub fn at_stake(&self, now: i64) -> i64 {
        let last = [self.checkpointed_at, self.saved_at].into_iter().flatten().fold(self.started_at, i64::max);
        (now - last).max(0)
    }

    /// The work a preemption at `now` would lose as its worker stops it: none when its next
    /// save is due within `save_wait` (the worker waits for it, `checkpoint_wait`), else
    /// [`Running::at_stake`].
    pub fn loses(&self, now: i64, save_wait: i64) -> i64 {
        let saves = self.saved_at.zip(self.save_every).map(|(at, every)| [at.saturating_sub(every), at]);
        match saves.and_then(|saves| crate::checkpoint_wait::wait_until(&saves, now, save_wait)) {
            Some(_) => 0,
            None => self.at_stake(now),
        }
    }
}

/// What the cluster looks like now.
#[derive(Debug, Clone, Default)]
pub struct Cluster<'a> {
    /// Each live worker's free GPUs (a job being preempted already counts as gone).
    pub free: BTreeMap<u64, u32>,
    pub running: Vec<Running<'a>>,
    /// Users with waiting jobs (the running ones' users count as active too).
    pub waiting: Vec<&'a str>,
    /// GPUs of every worker together.
    pub total_gpus: u32,
    /// Each user's usage as the fair share ranks it (decayed GPU-seconds, running jobs
    /// included); a user not listed has none.
    pub usage: BTreeMap<&'a str, f64>,
    /// Each user's running jobs without GPUs (not in `running`: they hold no GPU, but they
    /// count against `max_running`).
    pub cpu_running: BTreeMap<&'a str, u32>,
    /// How long a preempted job's worker waits for its next save (half the grace, ms).
    pub save_wait: i64,
}

/// The jobs to preempt for a need: on `worker`, the least work at stake first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Victims {
    pub worker: u64,
    pub jobs: Vec<u64>,
}

/// An order of the pass: preempt `job` so that `for_job` can start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Order {
    pub job: u64,
    pub for_job: u64,
}

/// Each active user's share of the cluster's GPUs, by weight.
pub fn shares<'a>(cluster: &Cluster<'a>, policy: &Policy) -> BTreeMap<&'a str, f64> {
    let mut active: Vec<&str> = cluster.waiting.clone();
    active.extend(cluster.running.iter().map(|job| job.user));
    active.sort_unstable();
    active.dedup();
    let total_weight: f64 = active.iter().map(|user| policy.weight(user)).sum();
    active
        .into_iter()
        .map(|user| (user, f64::from(cluster.total_gpus) * policy.weight(user) / total_weight.max(f64::MIN_POSITIVE)))
        .collect()
}

/// Whether a job may be preempted at `now` on its own account: preemptible, run at least
/// `min_runtime_ms`, and not preempted [`GUARD_COUNT`] times within the last [`GUARD_MS`].
pub fn may_preempt(job: &Running<'_>, now: i64, min_runtime_ms: i64) -> bool {
    let recent = job.preempted_at.iter().filter(|at| now - **at < GUARD_MS).count();
    job.preemptible && now - job.started_at >= min_runtime_ms && recent < GUARD_COUNT
}

/// The jobs to preempt so that `need` can start, or `None` when its user is not below their
/// share or no worker can make the room. Among the workers that can, the one where the least
/// GPUs are freed beyond the need, then the least work is lost (the victims' GPUs times
/// [`Running::loses`]).
pub fn victims(
    need: Need<'_>,
    cluster: &Cluster<'_>,
    policy: &Policy,
    now: i64,
    min_runtime_ms: i64,
) -> Option<Victims> {
    let shares = shares(cluster, policy);
    let mut held: BTreeMap<&str, u32> = BTreeMap::new();
    for job in &cluster.running {
        *held.entry(job.user).or_default() += job.gpus;
    }
    let share = |user: &str| shares.get(user).copied().unwrap_or(0.0);
    let holds = |user: &str| held.get(user).copied().unwrap_or(0);
    // Within its class, a need takes only while its user stays within their share; jobs of a
    // lower class give way whatever the shares (as Kubernetes' priority classes).
    let within_share = f64::from(holds(need.user) + need.gpus) <= share(need.user).ceil();
    let rank_of = |user: &str| rank(user, cluster.usage.get(user).copied().unwrap_or(0.0), policy);
    let needing = rank_of(need.user);
    // What the waiting user will hold per unit of weight: a victim's user keeps at least that.
    let after = f64::from(holds(need.user) + need.gpus) / policy.weight(need.user);
    let mut best: Option<(u32, i64, Victims)> = None;
    for (&worker, &free) in cluster.free.iter().filter(|(worker, _)| need.on.is_empty() || need.on.contains(worker)) {
        let mut candidates: Vec<&Running<'_>> = cluster
            .running
            .iter()
            .filter(|job| job.worker == worker && job.user != need.user && job.gpus > 0)
            .filter(|job| may_preempt(job, now, min_runtime_ms))
            .filter(|job| {
                job.class < need.class || (job.class == need.class && within_share && rank_of(job.user) > needing)
            })
            .collect();
        // The lowest class first, then the least work lost (none when its worker will wait for
        // its next save, else the time since a checkpoint, else since the start: the
        // youngest), then the youngest; ties by id, so the input's order does not matter.
        let wait = cluster.save_wait;
        candidates.sort_by_key(|job| (job.class, job.loses(now, wait), std::cmp::Reverse(job.started_at), job.job));
        let (mut room, mut lost, mut chosen) = (free, 0i64, Vec::new());
        let mut left = held.clone();
        for job in candidates {
            if room >= need.gpus {
                break;
            }
            let remaining = left.get(job.user).copied().unwrap_or(0).saturating_sub(job.gpus);
            // Within a class: never below their own share, and never below the waiting user per
            // unit of weight (with 9 GPUs between two, 5 and 4 would otherwise trade places back
            // and forth).
            let below = f64::from(remaining) < share(job.user).floor()
                || f64::from(remaining) / policy.weight(job.user) < after;
            if job.class == need.class && below {
                continue;
            }
            left.insert(job.user, remaining);
            room += job.gpus;
            lost += job.loses(now, wait) * i64::from(job.gpus);
            chosen.push(job.job);
        }
        if room < need.gpus || chosen.is_empty() {
            continue;
        }
        let key = (room - need.gpus, lost);
        if best.as_ref().is_none_or(|(over, best_lost, _)| key < (*over, *best_lost)) {
            best = Some((key.0, key.1, Victims { worker, jobs: chosen }));
        }
    }
    best.map(|(_, _, victims)| victims)
}

/// The pass's orders: the waiting users in fair-share order (the furthest below their share
/// first), each one's `queues` in their dispatch order, each job placed where GPUs are free
/// or, failing that, where [`victims`] make room; a user's first job that neither fits nor
/// finds room (or that their quota refuses) ends their turn, as it would hold their later ones
/// at claim time. Placed jobs count as held and used from then on, so one user never takes
/// more than their share and a freed GPU is never counted twice. Jobs without GPUs need none
/// and are never stopped.
pub fn plan<'a>(
    mut cluster: Cluster<'a>,
    queues: &[Vec<Queued<'a>>],
    policy: &Policy,
    now: i64,
    min_runtime_ms: i64,
) -> Vec<Order> {
    // The users whose first job with GPUs is of the highest class first, then by fair share.
    let mut users: Vec<(i64, f64, &str, &[Queued<'a>])> = queues
        .iter()
        .filter_map(|queue| {
            let user = queue.first()?.user;
            let class = queue.iter().find(|queued| queued.gpus > 0).map_or(0, |queued| queued.class);
            Some((class, rank(user, cluster.usage.get(user).copied().unwrap_or(0.0), policy), user, &queue[..]))
        })
        .collect();
    users.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.total_cmp(&b.1)).then_with(|| a.2.cmp(b.2)));
    let mut orders = Vec::new();
    for (_, _, user, queue) in users {
        for queued in queue.iter().filter(|queued| queued.gpus > 0) {
            let cpu = Held { gpus: 0, running: cluster.cpu_running.get(user).copied().unwrap_or(0) };
            let held = cluster
                .running
                .iter()
                .filter(|job| job.user == user)
                .fold(cpu, |held, job| Held { gpus: held.gpus + job.gpus, running: held.running + 1 });
            if admits(user, held, queued.gpus, policy).is_err() {
                break;
            }
            // Where it fits now: the worker with the fewest free GPUs that fit it.
            let eligible = |worker: &u64| queued.on.is_empty() || queued.on.contains(worker);
            let fits = cluster
                .free
                .iter()
                .filter(|(worker, free)| **free >= queued.gpus && eligible(worker))
                .min_by_key(|(_, free)| **free);
            let worker = match fits.map(|(worker, _)| *worker) {
                Some(worker) => worker,
                None => {
                    let need = Need { user, gpus: queued.gpus, on: &queued.on, class: queued.class };
                    let Some(chosen) = victims(need, &cluster, policy, now, min_runtime_ms) else { break };
                    for job in &chosen.jobs {
                        orders.push(Order { job: *job, for_job: queued.job });
                    }
                    let freed: u32 =
                        cluster.running.iter().filter(|job| chosen.jobs.contains(&job.job)).map(|job| job.gpus).sum();
                    cluster.running.retain(|job| !chosen.jobs.contains(&job.job));
                    *cluster.free.entry(chosen.worker).or_default() += freed;
                    chosen.worker
                }
            };
            if let Some(free) = cluster.free.get_mut(&worker) {
                *free = free.saturating_sub(queued.gpus);
            }
            *cluster.usage.entry(user).or_default() += START_CHARGE_SECS * f64::from(queued.gpus);
            cluster.running.push(Running {
                job: queued.job,
                user,
                worker,
                gpus: queued.gpus,
                started_at: now,
                checkpointed_at: None,
                saved_at: None,
                save_every: None,
                preemptible: false,
                class: queued.class,
                preempted_at: Vec::new(),
            });
        }
    }
    orders
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 600_000;
    const NOW: i64 = 10 * GUARD_MS;

    fn job(job: u64, user: &'static str, worker: u64, gpus: u32, age_min: i64) -> Running<'static> {
        Running {
            job,
            user,
            worker,
            gpus,
            started_at: NOW - age_min * 60_000,
            checkpointed_at: None,
            saved_at: None,
            save_every: None,
            preemptible: true,
            class: 0,
            preempted_at: Vec::new(),
        }
    }

    /// Two workers of 4 GPUs, every one held by user-a's jobs (ids 1-8, ages 11-18 minutes,
    /// job 1 the youngest); user-b waits.
    fn busy() -> Cluster<'static> {
        let running = (1..=8).map(|id| job(id, "user-a", (id - 1) / 4, 1, 10 + id as i64)).collect();
        let usage = BTreeMap::from([("user-a", 8.0 * 900.0)]);
        let free = BTreeMap::from([(0, 0), (1, 0)]);
        Cluster { free, running, waiting: vec!["user-b"], total_gpus: 8, usage, ..Cluster::default() }
    }

    #[test]
    fn a_user_below_their_share_takes_the_youngest_jobs_of_one_worker() {
        let need = Need { user: "user-b", gpus: 2, on: &[], class: 0 };
        let chosen = victims(need, &busy(), &Policy::default(), NOW, MIN).unwrap();
        assert_eq!(chosen, Victims { worker: 0, jobs: vec![1, 2] }, "the two youngest on worker 0");
        let one = victims(Need { user: "user-b", gpus: 1, on: &[], class: 0 }, &busy(), &Policy::default(), NOW, MIN)
            .unwrap();
        assert_eq!(one.jobs, [1], "exactly what is needed");
    }

    #[test]
    fn nobody_is_preempted_below_their_share_nor_for_a_user_at_theirs() {
        let mut cluster = busy();
        // user-b already holds 4 of 8 (its share): no more.
        cluster.running.retain(|job| job.worker == 0);
        cluster.running.extend((9..=12).map(|id| job(id, "user-b", 1, 1, 30)));
        cluster.usage.insert("user-b", 4.0 * 1800.0);
        assert_eq!(
            victims(Need { user: "user-b", gpus: 1, on: &[], class: 0 }, &cluster, &Policy::default(), NOW, MIN),
            None
        );
        // A third user makes each share 8/3: user-c takes from the two above theirs, the job
        // that lost least (user-a's youngest, 11 minutes, before user-b's 30).
        cluster.waiting.push("user-c");
        let chosen =
            victims(Need { user: "user-c", gpus: 1, on: &[], class: 0 }, &cluster, &Policy::default(), NOW, MIN)
                .unwrap();
        assert_eq!(chosen, Victims { worker: 0, jobs: vec![1] });
        // A 5-GPU need is past user-b's share of 4 even from nothing.
        let need = Need { user: "user-b", gpus: 5, on: &[], class: 0 };
        assert_eq!(victims(need, &busy(), &Policy::default(), NOW, MIN), None);
    }

    #[test]
    fn the_jobs_that_checkpointed_last_go_before_the_youngest() {
        let mut cluster = busy();
        // Job 4 (14 minutes old) stored a checkpoint a minute ago, job 3 (13) one four minutes
        // ago, job 1 (11) one of an earlier attempt (before this one started: it counts from
        // its start), jobs 2 and 5-8 none.
        cluster.running[3].checkpointed_at = Some(NOW - 60_000);
        cluster.running[2].checkpointed_at = Some(NOW - 4 * 60_000);
        cluster.running[0].checkpointed_at = Some(NOW - 30 * 60_000);
        assert_eq!(cluster.running[0].at_stake(NOW), 11 * 60_000);
        let chosen =
            victims(Need { user: "user-b", gpus: 3, on: &[], class: 0 }, &cluster, &Policy::default(), NOW, MIN)
                .unwrap();
        assert_eq!(chosen, Victims { worker: 0, jobs: vec![4, 3, 1] }, "then the youngest");
    }

    #[test]
    fn a_job_whose_next_save_its_worker_will_wait_for_goes_first_and_saves_count_as_checkpoints() {
        const MINUTE: i64 = 60_000;
        let mut cluster = busy();
        cluster.save_wait = MINUTE;
        // Job 4 stored a checkpoint a minute ago; job 6 saved 4.5 minutes ago, every 5
        // minutes: its worker waits for the next, due in 30 s, and it loses nothing.
        cluster.running[3].checkpointed_at = Some(NOW - MINUTE);
        (cluster.running[5].saved_at, cluster.running[5].save_every) = (Some(NOW - 270_000), Some(5 * MINUTE));
        assert_eq!((cluster.running[5].at_stake(NOW), cluster.running[5].loses(NOW, MINUTE)), (270_000, 0));
        let need = Need { user: "user-b", gpus: 1, on: &[], class: 0 };
        let chosen = victims(need, &cluster, &Policy::default(), NOW, MIN).unwrap();
        assert_eq!(chosen, Victims { worker: 1, jobs: vec![6] });
        // Its worker would not wait (none): job 4, which checkpointed last.
        cluster.save_wait = 0;
        let chosen = victims(need, &cluster, &Policy::default(), NOW, MIN).unwrap();
        assert_eq!(chosen, Victims { worker: 0, jobs: vec![4] });
        // A save its worker saw counts as a checkpoint though not yet uploaded.
        cluster.running[0].saved_at = Some(NOW - 10_000);
        assert_eq!(cluster.running[0].at_stake(NOW), 10_000);
    }

    #[test]
    fn a_higher_class_takes_from_lower_ones_whatever_the_shares_and_never_from_higher() {
        // user-b holds worker 1's four GPUs (its share of 8), user-a worker 0's; user-b has
        // used least. Within one class user-b may take nothing more.
        let mut cluster = busy();
        for job in cluster.running.iter_mut().filter(|job| job.worker == 1) {
            job.user = "user-b";
        }
        let need = |class| Need { user: "user-b", gpus: 2, on: &[], class };
        assert_eq!(victims(need(0), &cluster, &Policy::default(), NOW, MIN), None, "at its share");
        // A class-10 job of user-b's takes user-a's two least at stake (class 0).
        let chosen = victims(need(10), &cluster, &Policy::default(), NOW, MIN).unwrap();
        assert_eq!(chosen, Victims { worker: 0, jobs: vec![1, 2] });
        // Jobs of its own class or higher are out of its reach (one of class 10 would be taken
        // only within the shares).
        for job in cluster.running.iter_mut() {
            job.class = 10;
        }
        assert_eq!(victims(need(10), &cluster, &Policy::default(), NOW, MIN), None);
        for job in cluster.running.iter_mut() {
            job.class = 20;
        }
        assert_eq!(victims(need(10), &cluster, &Policy::default(), NOW, MIN), None, "a higher class");
        // Even below its share (user-b holds nothing here), never from a higher class.
        let mut higher = busy();
        for job in higher.running.iter_mut() {
            job.class = 20;
        }
        assert_eq!(victims(need(10), &higher, &Policy::default(), NOW, MIN), None);
        assert!(victims(need(20), &higher, &Policy::default(), NOW, MIN).is_some(), "its own class, by the shares");
        // Guards still hold: a lower class under the minimum runtime is kept.
        for job in cluster.running.iter_mut() {
            (job.class, job.started_at) = (0, NOW - MIN + 1);
        }
        assert_eq!(victims(need(10), &cluster, &Policy::default(), NOW, MIN), None);
    }

    #[test]
    fn a_pass_serves_the_highest_class_first() {
        // Both users wait for one worker's four GPUs; user-c has used less, but user-b's job is
        // of class 10: its need is placed first.
        let mut cluster = busy();
        cluster.free.insert(0, 2);
        cluster.running.retain(|job| job.job != 1 && job.job != 2);
        cluster.usage.insert("user-b", 5_000.0);
        let mut b = queue("user-b", 100, 1, 2);
        b[0].class = 10;
        let c = queue("user-c", 200, 1, 2);
        let orders = plan(cluster, &[c, b], &Policy::default(), NOW, MIN);
        // user-b's job takes the two free GPUs; user-c's finds room by the share rules only.
        assert!(orders.iter().all(|order| order.for_job != 100), "{orders:?}");
    }

    #[test]
    fn young_guarded_and_non_preemptible_jobs_are_kept() {
        let mut cluster = busy();
        cluster.running[0].started_at = NOW - MIN + 1; // job 1: under the minimum runtime
        cluster.running[1].preemptible = false; // job 2
        cluster.running[2].preempted_at = vec![NOW - 50 * 60_000, NOW - 10 * 60_000]; // job 3: twice this hour
        cluster.running[3].preempted_at = vec![NOW - 2 * GUARD_MS, NOW - 10 * 60_000]; // job 4: once this hour
        let chosen =
            victims(Need { user: "user-b", gpus: 1, on: &[], class: 0 }, &cluster, &Policy::default(), NOW, MIN)
                .unwrap();
        assert_eq!(chosen, Victims { worker: 0, jobs: vec![4] });
        assert!(!may_preempt(&cluster.running[2], NOW, MIN));
        assert!(may_preempt(&cluster.running[2], NOW + 51 * 60_000, MIN), "an hour after the first of the two");
    }

    #[test]
    fn free_gpus_count_and_the_worker_losing_least_is_chosen() {
        let mut cluster = busy();
        cluster.free.insert(1, 1);
        cluster.running.retain(|job| job.job != 5); // worker 1 has one GPU free
        let chosen =
            victims(Need { user: "user-b", gpus: 2, on: &[], class: 0 }, &cluster, &Policy::default(), NOW, MIN)
                .unwrap();
        assert_eq!(chosen, Victims { worker: 1, jobs: vec![6] }, "one job lost instead of two");
        // Weights: user-b weighs 3, so its share is 6 of 8 and user-a's 2; user-a, holding 4
        // after losing worker 0's jobs, may lose 2 more but not 3.
        let policy = Policy { weights: BTreeMap::from([("user-b".to_string(), 3.0)]), ..Policy::default() };
        let mut cluster = busy();
        cluster.running.retain(|job| job.worker == 1);
        cluster.running.extend((9..=12).map(|id| job(id, "user-b", 0, 1, 30)));
        cluster.usage.insert("user-b", 100.0);
        let two = victims(Need { user: "user-b", gpus: 2, on: &[], class: 0 }, &cluster, &policy, NOW, MIN).unwrap();
        assert_eq!(two, Victims { worker: 1, jobs: vec![5, 6] });
        assert_eq!(
            victims(Need { user: "user-b", gpus: 3, on: &[], class: 0 }, &cluster, &policy, NOW, MIN),
            None,
            "past user-b's 6"
        );
    }

    #[test]
    fn only_users_ranking_after_the_waiting_one_lose_jobs() {
        // user-b used more than user-a lately: a claim would give freed GPUs back to user-a.
        let mut cluster = busy();
        cluster.usage.insert("user-b", 9.0 * 900.0);
        assert_eq!(
            victims(Need { user: "user-b", gpus: 1, on: &[], class: 0 }, &cluster, &Policy::default(), NOW, MIN),
            None
        );
        // With a weight of 2, user-b's 8,100 GPU-seconds rank as 4,050: before user-a's 7,200.
        let policy = Policy { weights: BTreeMap::from([("user-b".to_string(), 2.0)]), ..Policy::default() };
        assert!(victims(Need { user: "user-b", gpus: 1, on: &[], class: 0 }, &cluster, &policy, NOW, MIN).is_some());
    }

    fn queue(user: &'static str, first: u64, jobs: u64, gpus: u32) -> Vec<Queued<'static>> {
        (first..first + jobs).map(|job| Queued { job, user, gpus, on: Vec::new(), class: 0 }).collect()
    }

    #[test]
    fn a_pass_frees_a_share_for_a_new_user_and_no_more() {
        let orders = plan(busy(), &[queue("user-b", 100, 6, 1)], &Policy::default(), NOW, MIN);
        let pairs: Vec<(u64, u64)> = orders.iter().map(|order| (order.job, order.for_job)).collect();
        assert_eq!(pairs, [(1, 100), (2, 101), (3, 102), (4, 103)], "half of 8, the youngest first");
        // user-a waits too, but holds more than its share: nothing is taken for it.
        let both = plan(busy(), &[queue("user-a", 50, 3, 1), queue("user-b", 100, 6, 1)], &Policy::default(), NOW, MIN);
        assert_eq!(both, orders);
    }

    #[test]
    fn free_and_freeing_gpus_are_used_before_anything_is_preempted() {
        // Two of user-a's jobs on worker 1 are being preempted already: their GPUs count free.
        let mut cluster = busy();
        cluster.running.retain(|job| job.job != 5 && job.job != 6);
        cluster.free.insert(1, 2);
        let orders = plan(cluster.clone(), &[queue("user-b", 100, 6, 1)], &Policy::default(), NOW, MIN);
        let pairs: Vec<(u64, u64)> = orders.iter().map(|order| (order.job, order.for_job)).collect();
        assert_eq!(pairs, [(1, 102), (2, 103)], "two placed in the free GPUs, two preempted for");
        // A quota of 3 GPUs: one preemption only.
        let quotas =
            BTreeMap::from([("user-b".to_string(), crate::fair_share::Quota { max_gpus: Some(3), max_running: None })]);
        let policy = Policy { quotas, ..Policy::default() };
        let orders = plan(cluster, &[queue("user-b", 100, 6, 1)], &policy, NOW, MIN);
        assert_eq!(orders, [Order { job: 1, for_job: 102 }]);
    }

    #[test]
    fn a_job_that_cannot_be_placed_ends_its_users_turn_and_cpu_jobs_need_nothing() {
        // A 5-GPU job is past user-b's share of 4: neither it nor the 1-GPU jobs behind it take
        // anything (a claim would not start them before it either).
        let mut jobs = queue("user-b", 100, 1, 5);
        jobs.extend(queue("user-b", 101, 2, 1));
        assert_eq!(plan(busy(), &[jobs], &Policy::default(), NOW, MIN), []);
        let mut jobs = queue("user-b", 100, 3, 0);
        jobs.extend(queue("user-b", 103, 1, 1));
        assert_eq!(plan(busy(), &[jobs], &Policy::default(), NOW, MIN), [Order { job: 1, for_job: 103 }]);
        assert_eq!(plan(Cluster::default(), &[queue("user-b", 1, 2, 1)], &Policy::default(), NOW, MIN), []);
    }

    #[test]
    fn jobs_without_gpus_are_never_stopped_and_only_workers_that_could_run_the_job_are_looked_at() {
        let mut cluster = busy();
        // A CPU job on worker 0, younger than every GPU job there: it frees nothing.
        cluster.running.push(job(99, "user-a", 0, 0, 10));
        let chosen =
            victims(Need { user: "user-b", gpus: 1, on: &[], class: 0 }, &cluster, &Policy::default(), NOW, MIN)
                .unwrap();
        assert_eq!(chosen, Victims { worker: 0, jobs: vec![1] });
        // The job can only run on worker 1 (its GPUs' memory, say).
        let chosen =
            victims(Need { user: "user-b", gpus: 1, on: &[1], class: 0 }, &cluster, &Policy::default(), NOW, MIN)
                .unwrap();
        assert_eq!(chosen, Victims { worker: 1, jobs: vec![5] });
        let mut jobs = queue("user-b", 100, 1, 1);
        jobs[0].on = vec![7];
        assert_eq!(plan(busy(), &[jobs], &Policy::default(), NOW, MIN), [], "no worker can run it");
    }

    #[test]
    fn an_odd_gpu_does_not_change_hands_back_and_forth() {
        // 9 GPUs, two users: user-a holds 5, user-b 4; user-b, now ranking first, would reach
        // 5 (its share rounded up) and leave user-a 4 (its share rounded down): then user-a
        // would rank first, and so on. The one holding more keeps it.
        let running: Vec<Running<'static>> =
            (1..=9).map(|id| job(id, if id <= 5 { "user-a" } else { "user-b" }, (id - 1) / 5, 1, 20)).collect();
        let usage = BTreeMap::from([("user-a", 5.0 * 1200.0), ("user-b", 4.0 * 1200.0)]);
        let free = BTreeMap::from([(0, 0), (1, 0)]);
        let cluster = Cluster { free, running, waiting: vec!["user-b"], total_gpus: 9, usage, ..Cluster::default() };
        assert_eq!(
            victims(Need { user: "user-b", gpus: 1, on: &[], class: 0 }, &cluster, &Policy::default(), NOW, MIN),
            None
        );
    }
}
