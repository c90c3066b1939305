//! `app-bench lab`: the scheduling policies on a simulated lab (issue 29's measure). Four
//! workers of 8 GPUs, six users whose sweeps arrive over two hours (a large grid first, small
//! and long ones, 4-GPU and 8-GPU jobs), jobs that checkpoint every 5 minutes and declare a
//! timeout of 1.5 times their nominal length (`--scale` makes them longer). The same trace
//! goes through six policies: today's dispatch order (FIFO by priority), the fair share at
//! claim time (`shared::fair_share::allot`), that with reservations and backfill (`backfill`,
//! after 15 min, a quarter of the workers at most), that with preemption too
//! (`preemption::plan`, `min_runtime` 10 min), the same with each stop at once, and the same
//! with held workers drained at their jobs' next checkpoints (`drain::drains`). The decisions
//! are the server's own pure functions; time is simulated in 10-second steps (no server, no
//! processes: claim latency is `app-bench shares`'s). Prints each user's share of GPU time
//! against an equal share over sliding
//! 30-minute windows, queue waits, the GPUs idle while work waits, and the work preemption
//! lost. A preempted job stops as its worker stops it: right after its next checkpoint when
//! that is due within half the grace (`checkpoint_wait`, decision 0088), else at once, losing
//! what it did since its last one. Asserts nothing.

use clap::Args;
use shared::backfill::{self, Busy, Worker};
use shared::checkpoint_wait;
use shared::drain::{drains, Hold};
use shared::fair_share::{allot, Contender, Held, Policy};
use shared::placement::Capacity;
use shared::preemption::{plan, Cluster, Queued, Running};
use shared::sweep::Resources;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Args)]
pub struct BenchLabArgs {
    /// Seed of the jobs' lengths.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Every job's length and every arrival time this many times as long (the checkpoints
    /// stay 5 minutes apart): 4 makes jobs of 12 minutes to 2 hours over 8 hours of arrivals.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i64).range(1..=20))]
    pub scale: i64,
    /// Run the trace through real processes instead (a server, 4 workers of 8 fake GPUs, real
    /// jobs that checkpoint), FIFO against fair share with preemption and reservations.
    #[arg(long)]
    pub live: bool,
    /// With --live: simulated seconds per real second (60: the 2 hours in about 4 minutes).
    #[arg(long, default_value_t = 60.0)]
    pub speed: f64,
}

pub(crate) const STEP: i64 = 10_000;
pub(crate) const MIN: i64 = 60_000;
pub(crate) const WORKERS: usize = 4;
pub(crate) const GPUS: u32 = 8;
pub(crate) const CHECKPOINT: i64 = 5 * MIN;
pub(crate) const MIN_RUNTIME: i64 = 10 * MIN;
pub(crate) const BACKFILL_AFTER: i64 = 15 * MIN;
/// The server's default `preempt_grace_secs`.
pub(crate) const PREEMPT_GRACE: i64 = 2 * MIN;
pub(crate) const USERS: [&str; 6] = ["ana", "ben", "cai", "dee", "eli", "fay"];

/// A sweep: its user, when it arrives, how many jobs of how many GPUs and minutes.
struct Sweep {
    user: usize,
    at_min: i64,
    jobs: usize,
    gpus: u32,
    minutes: i64,
}

/// Two hours of arrivals: a 300-job grid first, then the others; every length and arrival
/// time `scale` times as long.
fn trace(scale: i64) -> Vec<Sweep> {
    let mut sweeps = vec![
        Sweep { user: 0, at_min: 0, jobs: 300, gpus: 1, minutes: 8 },
        Sweep { user: 1, at_min: 10, jobs: 40, gpus: 1, minutes: 20 },
        Sweep { user: 2, at_min: 20, jobs: 12, gpus: 4, minutes: 30 },
        Sweep { user: 4, at_min: 60, jobs: 100, gpus: 1, minutes: 3 },
        Sweep { user: 5, at_min: 30, jobs: 6, gpus: 8, minutes: 25 },
    ];
    sweeps.extend((0..6).map(|k| Sweep { user: 3, at_min: 20 * k, jobs: 8, gpus: 1, minutes: 5 }));
    for sweep in &mut sweeps {
        (sweep.minutes, sweep.at_min) = (sweep.minutes * scale, sweep.at_min * scale);
    }
    sweeps
}

#[derive(Debug, Clone)]
pub(crate) struct Job {
    pub(crate) user: usize,
    pub(crate) gpus: u32,
    pub(crate) work: i64,
    pub(crate) timeout: i64,
    pub(crate) submitted: i64,
    /// Progress kept by the last checkpoint (what a next attempt resumes from).
    saved: i64,
    started: Option<i64>,
    first_start: Option<i64>,
    worker: usize,
    done: bool,
    preempted_at: Vec<i64>,
    /// Ordered to stop: when it will (at its next checkpoint).
    stop_at: Option<i64>,
    resources: Resources,
}

impl Job {
    fn progress(&self, now: i64) -> i64 {
        self.saved + self.started.map_or(0, |at| now - at)
    }

    /// When its attempt last checkpointed, if it has (what the server reads from its uploads).
    fn last_checkpoint(&self, now: i64) -> Option<i64> {
        let started = self.started?;
        let taken = (now - started) / CHECKPOINT;
        (taken > 0).then_some(started + taken * CHECKPOINT)
    }

    /// Progress kept if stopped now: the last checkpoint taken while it ran.
    fn checkpointed(&self, now: i64) -> i64 {
        self.saved + self.started.map_or(0, |at| (now - at) / CHECKPOINT * CHECKPOINT)
    }

    /// The checkpoints its attempt has saved by `now`.
    fn saves(&self, now: i64) -> Vec<i64> {
        match self.started {
            Some(at) => (1..=(now - at) / CHECKPOINT).map(|k| at + k * CHECKPOINT).collect(),
            None => Vec::new(),
        }
    }

    /// Ordered to stop at `now`: at once, or (as its worker would, seeing its last two saves)
    /// one step after its next checkpoint when that is due within `wait` (half the grace).
    fn order_stop(&mut self, now: i64, wait: i64, free: &mut [u32; WORKERS]) -> i64 {
        self.preempted_at.push(now);
        let saves = self.saves(now);
        match (checkpoint_wait::wait_until(&saves, now, wait), saves.last()) {
            (Some(_), Some(last)) => {
                self.stop_at = Some(last + CHECKPOINT + STEP);
                0
            }
            _ => self.stop(now, free),
        }
    }

    /// Stops now: returns the GPU-ms lost since its last checkpoint.
    fn stop(&mut self, now: i64, free: &mut [u32; WORKERS]) -> i64 {
        let kept = self.checkpointed(now);
        let lost = (self.progress(now) - kept) * i64::from(self.gpus);
        (self.saved, self.started, self.stop_at) = (kept, None, None);
        free[self.worker] += self.gpus;
        lost
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Fifo,
    Fair,
    FairReserve,
    FairPreemptReserve,
    /// The same, each preempted job stopped at once (before decision 0088).
    FairPreemptReserveAtOnce,
    /// Fair share, preemption and reservations, held workers drained at their jobs' saves
    /// (decision 0092).
    FairPreemptReserveDrain,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Fifo => "FIFO by priority (today without users)",
            Mode::Fair => "fair share at claim time",
            Mode::FairReserve => "fair share + reservations",
            Mode::FairPreemptReserve => "fair share + preemption + reservations",
            Mode::FairPreemptReserveAtOnce => "the same, each preempted job stopped at once (before 2026-11-29)",
            Mode::FairPreemptReserveDrain => "the same, held workers drained at their jobs' next checkpoints",
        }
    }
}

/// What one policy's run measured.
pub(crate) struct Outcome {
    /// Per user, each job's wait from submission to its first start (ms).
    pub(crate) waits: Vec<Vec<i64>>,
    /// Per step, each user's GPUs in use, and whether they had work queued.
    pub(crate) used: Vec<Vec<u32>>,
    pub(crate) backlogged: Vec<Vec<bool>>,
    pub(crate) idle_while_waiting: f64,
    pub(crate) lost_fraction: f64,
    pub(crate) preemptions: usize,
    pub(crate) makespan_min: f64,
}

/// A small deterministic generator (no dependency): lengths within +-20%.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

pub(crate) fn jobs(seed: u64, scale: i64) -> Vec<Job> {
    let mut random = Lcg(seed);
    let mut jobs = Vec::new();
    for sweep in trace(scale) {
        for _ in 0..sweep.jobs {
            let work = (sweep.minutes as f64 * MIN as f64 * (0.8 + 0.4 * random.next())) as i64;
            jobs.push(Job {
                user: sweep.user,
                gpus: sweep.gpus,
                work,
                timeout: sweep.minutes * MIN * 3 / 2,
                submitted: sweep.at_min * MIN,
                saved: 0,
                started: None,
                first_start: None,
                worker: 0,
                done: false,
                preempted_at: Vec::new(),
                stop_at: None,
                resources: Resources { gpus: Some(sweep.gpus), ..Resources::default() },
            });
        }
    }
    // Submission order is dispatch order (one priority).
    jobs.sort_by_key(|job| job.submitted);
    jobs
}

fn simulate(mode: Mode, seed: u64, scale: i64) -> Outcome {
    let mut jobs = jobs(seed, scale);
    let policy = Policy::default();
    let mut free = [GPUS; WORKERS];
    let mut usage = vec![0.0f64; USERS.len()];
    let (mut used, mut backlogged) = (Vec::new(), Vec::new());
    let (mut idle, mut waiting_gpu_steps, mut lost, mut total, mut preemptions) = (0u64, 0u64, 0i64, 0i64, 0usize);
    let mut held: BTreeMap<usize, (usize, Option<i64>)> = BTreeMap::new(); // worker -> (job, starts_at)
    let mut now = 0;
    while jobs.iter().any(|job| !job.done) && now < 24 * 60 * MIN * scale {
        // Jobs that end, and jobs preempted that stop now (after their checkpoint).
        for job in jobs.iter_mut().filter(|job| job.started.is_some() && job.progress(now) >= job.work) {
            free[job.worker] += job.gpus;
            (job.started, job.done, job.stop_at) = (None, true, None);
        }
        for job in jobs.iter_mut().filter(|job| job.stop_at.is_some_and(|at| at <= now)) {
            lost += job.stop(now, &mut free);
        }
        let queued = |job: &Job| !job.done && job.started.is_none() && job.submitted <= now;
        if matches!(mode, Mode::FairPreemptReserve | Mode::FairPreemptReserveAtOnce | Mode::FairPreemptReserveDrain) {
            let wait = if mode == Mode::FairPreemptReserveAtOnce { 0 } else { PREEMPT_GRACE / 2 };
            let draining = mode == Mode::FairPreemptReserveDrain;
            preemptions +=
                preempt(&mut jobs, &mut free, (&usage, &policy), (now, wait, draining), &mut lost, &mut held);
        }
        if mode != Mode::Fifo && mode != Mode::Fair {
            reserve(&jobs, &free, &mut held, now);
        }
        // Claims: each worker with free GPUs, in turn (`free` changes as they claim).
        #[allow(clippy::needless_range_loop)]
        for worker in 0..WORKERS {
            if free[worker] == 0 {
                continue;
            }
            let mut starts: Vec<usize> = Vec::new();
            let mut room = free[worker];
            if let Some(&(job, starts_at)) = held.get(&worker) {
                if queued(&jobs[job]) && jobs[job].gpus <= room {
                    starts.push(job);
                    room -= jobs[job].gpus;
                    held.remove(&worker);
                } else if queued(&jobs[job]) {
                    // Lent only to jobs that end before the held one could start.
                    for (index, candidate) in jobs.iter().enumerate() {
                        if queued(candidate)
                            && candidate.gpus <= room
                            && backfill::may_backfill(Some((candidate.timeout / 1000) as u64), now, starts_at)
                            && index != job
                        {
                            starts.push(index);
                            room -= candidate.gpus;
                        }
                    }
                    room = 0;
                } else {
                    held.remove(&worker);
                }
            }
            if room > 0 {
                starts.extend(choose(mode, &jobs, room, &usage, &policy, now, &starts));
            }
            for index in starts {
                let job = &mut jobs[index];
                free[worker] -= job.gpus;
                job.started = Some(now);
                job.worker = worker;
                job.first_start.get_or_insert(now);
            }
        }
        // Accounting over this step.
        let mut step_used = vec![0u32; USERS.len()];
        for job in jobs.iter().filter(|job| job.started.is_some()) {
            step_used[job.user] += job.gpus;
            usage[job.user] += f64::from(job.gpus) * STEP as f64 / 1000.0;
            total += i64::from(job.gpus) * STEP;
        }
        let step_backlog: Vec<bool> =
            (0..USERS.len()).map(|user| jobs.iter().any(|j| j.user == user && queued(j))).collect();
        if step_backlog.iter().any(|waiting| *waiting) {
            idle += u64::from(free.iter().sum::<u32>());
            waiting_gpu_steps += u64::from(GPUS * WORKERS as u32);
        }
        used.push(step_used);
        backlogged.push(step_backlog);
        now += STEP;
    }
    let mut waits = vec![Vec::new(); USERS.len()];
    for job in &jobs {
        waits[job.user].push(job.first_start.unwrap_or(now) - job.submitted);
    }
    Outcome {
        waits,
        used,
        backlogged,
        idle_while_waiting: idle as f64 / waiting_gpu_steps.max(1) as f64,
        lost_fraction: lost as f64 / total.max(1) as f64,
        preemptions,
        makespan_min: now as f64 / MIN as f64,
    }
}

/// The jobs a claim of `room` GPUs starts: in dispatch order (FIFO), or by `allot`.
fn choose(
    mode: Mode,
    jobs: &[Job],
    room: u32,
    usage: &[f64],
    policy: &Policy,
    now: i64,
    taken: &[usize],
) -> Vec<usize> {
    let queued: Vec<usize> = (0..jobs.len())
        .filter(|&i| !jobs[i].done && jobs[i].started.is_none() && jobs[i].submitted <= now && !taken.contains(&i))
        .collect();
    let capacity = Capacity::idle_gpus(room, room, 80 << 30);
    if mode == Mode::Fifo {
        let mut left = room;
        let mut starts = Vec::new();
        for i in queued {
            if jobs[i].gpus <= left {
                starts.push(i);
                left -= jobs[i].gpus;
            }
        }
        return starts;
    }
    let per_user: Vec<Vec<usize>> = (0..USERS.len())
        .map(|user| queued.iter().copied().filter(|&i| jobs[i].user == user).take(64).collect())
        .collect();
    let contenders: Vec<Contender<'_>> = (0..USERS.len())
        .filter(|&user| !per_user[user].is_empty())
        .map(|user| Contender {
            user: USERS[user],
            // All GPU time so far, running attempts' included (as the server sums it).
            usage: usage[user],
            held: Held::default(),
            jobs: per_user[user].iter().map(|&i| &jobs[i].resources).collect(),
            classes: Vec::new(),
        })
        .collect();
    let users: Vec<usize> = (0..USERS.len()).filter(|&user| !per_user[user].is_empty()).collect();
    allot(&[capacity], &contenders, policy).into_iter().map(|pick| per_user[users[pick.user]][pick.job]).collect()
}

/// One preemption pass: the orders `plan` gives, each job stopped as its worker would (the
/// jobs save on SIGTERM only what their last checkpoint kept: the rest is lost); returns how
/// many. As the server's pass: jobs ordered count as gone and their GPUs as free, and a held
/// worker is freed only for the job it is held for, that job nowhere else (decision 0080).
fn preempt(
    jobs: &mut [Job],
    free: &mut [u32; WORKERS],
    (usage, policy): (&[f64], &Policy),
    (now, wait, draining): (i64, i64, bool),
    lost: &mut i64,
    held: &mut BTreeMap<usize, (usize, Option<i64>)>,
) -> usize {
    let running: Vec<Running<'_>> = jobs
        .iter()
        .enumerate()
        .filter(|(_, job)| job.started.is_some() && job.stop_at.is_none())
        .map(|(i, job)| Running {
            job: i as u64,
            user: USERS[job.user],
            worker: job.worker as u64,
            gpus: job.gpus,
            started_at: job.started.unwrap_or(now),
            checkpointed_at: job.last_checkpoint(now),
            // As its worker tells them: the last save, and the interval once there are two.
            saved_at: job.last_checkpoint(now),
            save_every: (job.saves(now).len() >= 2).then_some(CHECKPOINT),
            preemptible: true,
            class: 0,
            preempted_at: job.preempted_at.clone(),
        })
        .collect();
    let mut queues: Vec<Vec<Queued<'_>>> = vec![Vec::new(); USERS.len()];
    for (i, job) in
        jobs.iter().enumerate().filter(|(_, job)| !job.done && job.started.is_none() && job.submitted <= now)
    {
        if queues[job.user].len() < (GPUS as usize * WORKERS) {
            let on: Vec<u64> = match held.iter().find(|(_, (held_job, _))| *held_job == i) {
                Some((worker, _)) => vec![*worker as u64],
                None if held.is_empty() => Vec::new(),
                None => (0..WORKERS).filter(|worker| !held.contains_key(worker)).map(|worker| worker as u64).collect(),
            };
            let on = if on.is_empty() && !held.is_empty() { vec![u64::MAX] } else { on };
            let queued = Queued { job: i as u64, user: USERS[job.user], gpus: job.gpus, on, class: 0 };
            queues[job.user].push(queued);
        }
    }
    let waiting: Vec<&str> = queues.iter().filter_map(|queue| queue.first().map(|q| q.user)).collect();
    let usage_by: BTreeMap<&str, f64> = USERS.iter().zip(usage).map(|(user, usage)| (*user, *usage)).collect();
    let cluster = Cluster {
        free: (0..WORKERS)
            .map(|worker| {
                let stopping = jobs.iter().filter(|job| job.stop_at.is_some() && job.worker == worker);
                (worker as u64, free[worker] + stopping.map(|job| job.gpus).sum::<u32>())
            })
            .collect(),
        running,
        waiting,
        total_gpus: GPUS * WORKERS as u32,
        usage: usage_by,
        cpu_running: BTreeMap::new(),
        save_wait: wait,
    };
    let mut orders = plan(cluster.clone(), &queues, policy, now, MIN_RUNTIME);
    if draining {
        let (drained, completes) = drains(&holds(jobs, held), cluster, &orders, policy, now, MIN_RUNTIME);
        orders.extend(drained);
        // A drained hold starts no later than its room is complete, and only jobs that end by
        // then borrow its GPUs. (The server's reservation pass computes the start again each
        // pass, and a borrower can make the room incomplete again, decision 0092; here a
        // hold's start, set when it is made, only comes sooner.)
        for (hold, complete) in completes {
            if let Some((_, starts_at)) = held.get_mut(&(hold.worker as usize)) {
                *starts_at = Some(starts_at.map_or(complete, |at| at.min(complete)));
            }
        }
    }
    let stopped: BTreeSet<usize> = orders.iter().map(|order| order.job as usize).collect();
    for &i in &stopped {
        *lost += jobs[i].order_stop(now, wait, free);
    }
    stopped.len()
}

/// The holds `drain::drains` sees: each held worker whose job still waits.
fn holds(jobs: &[Job], held: &BTreeMap<usize, (usize, Option<i64>)>) -> Vec<Hold<'static>> {
    held.iter()
        .filter(|(_, (job, _))| !jobs[*job].done && jobs[*job].started.is_none())
        .map(|(&worker, &(job, _))| {
            let user = USERS[jobs[job].user];
            Hold { worker: worker as u64, job: job as u64, user, gpus: jobs[job].gpus, class: 0 }
        })
        .collect()
}

/// Holds a worker for each job of several GPUs queued longer than [`BACKFILL_AFTER`].
fn reserve(jobs: &[Job], free: &[u32; WORKERS], held: &mut BTreeMap<usize, (usize, Option<i64>)>, now: i64) {
    for (i, job) in jobs.iter().enumerate() {
        let waiting = !job.done && job.started.is_none() && job.submitted <= now - BACKFILL_AFTER;
        if !waiting || job.gpus < 2 || held.values().any(|(held_job, _)| *held_job == i) {
            continue;
        }
        if held.len() >= backfill::most_held(WORKERS) {
            break;
        }
        let workers: Vec<Worker> = (0..WORKERS)
            .filter(|worker| !held.contains_key(worker))
            .map(|worker| Worker {
                worker: worker as u64,
                gpus: GPUS,
                free: free[worker],
                running: jobs
                    .iter()
                    .filter(|other| other.started.is_some() && other.worker == worker)
                    .map(|other| Busy { gpus: other.gpus, ends_at: other.started.map(|at| at + other.timeout) })
                    .collect(),
            })
            .collect();
        if let Some((worker, starts_at)) = backfill::choose(&workers, job.gpus, now) {
            held.insert(worker as usize, (i, starts_at));
        }
    }
}

/// The `q` quantile of `values` (ms), in minutes.
fn percentile_min(values: &[i64], q: f64) -> f64 {
    let mut minutes: Vec<f64> = values.iter().map(|value| *value as f64 / MIN as f64).collect();
    minutes.sort_by(f64::total_cmp);
    crate::queue::percentile(&minutes, q)
}

/// Mean |share - fair share| over 30-minute windows (every 10 minutes), among the users who
/// had work queued for the whole window, with equal weights.
fn share_error(outcome: &Outcome) -> f64 {
    let (window, stride) = ((30 * MIN / STEP) as usize, (10 * MIN / STEP) as usize);
    let (mut sum, mut count) = (0.0, 0usize);
    let mut start = 0;
    while start + window <= outcome.used.len() {
        let range = start..start + window;
        let users: Vec<usize> =
            (0..USERS.len()).filter(|&user| range.clone().all(|step| outcome.backlogged[step][user])).collect();
        if users.len() >= 2 {
            let time: Vec<f64> =
                users.iter().map(|&user| range.clone().map(|step| f64::from(outcome.used[step][user])).sum()).collect();
            let all: f64 = time.iter().sum();
            if all > 0.0 {
                for t in &time {
                    sum += (t / all - 1.0 / users.len() as f64).abs();
                    count += 1;
                }
            }
        }
        start += stride;
    }
    if count == 0 {
        0.0
    } else {
        sum / count as f64
    }
}

pub async fn run(args: BenchLabArgs) -> anyhow::Result<()> {
    if args.live {
        anyhow::ensure!(args.scale == 1, "--scale is the simulation's alone: --live runs the trace as described");
        return crate::lab_live::run(&args).await;
    }
    println!(
        "simulated lab: {WORKERS} workers x {GPUS} GPUs, {} users, {} hours of arrivals (seed {})",
        USERS.len(),
        2 * args.scale,
        args.seed
    );
    for mode in [
        Mode::Fifo,
        Mode::Fair,
        Mode::FairReserve,
        Mode::FairPreemptReserve,
        Mode::FairPreemptReserveAtOnce,
        Mode::FairPreemptReserveDrain,
    ] {
        print_outcome(mode.name(), &simulate(mode, args.seed, args.scale));
    }
    Ok(())
}

/// Prints what one policy's run measured.
pub(crate) fn print_outcome(name: &str, outcome: &Outcome) {
    println!("\n{name}");
    println!(
        "  share error {:.3} (mean |share - 1/n| over 30-min windows), GPUs idle while work waits {:.1}%, \
         work lost to preemption {:.2}% ({} preemptions), all done at {:.0} min",
        share_error(outcome),
        outcome.idle_while_waiting * 100.0,
        outcome.lost_fraction * 100.0,
        outcome.preemptions,
        outcome.makespan_min
    );
    for (user, waits) in outcome.waits.iter().enumerate() {
        println!(
            "  {:<4} {:>4} jobs  wait p50 {:>6.1} min  p95 {:>6.1} min",
            USERS[user],
            waits.len(),
            percentile_min(waits, 0.5),
            percentile_min(waits, 0.95)
        );
    }
}
