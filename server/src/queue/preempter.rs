//! The scheduler's preemption pass (issue 29, item 3; decision 0079): when a user below their
//! share waits and no free GPU fits their job, stop the preemptible jobs of users above theirs
//! that lose least (decisions 0084, 0089), never on a worker held for another job (0080); and
//! stop the jobs on a held worker at their next saves, so that it drains for its job (0092).
//! It reads the cluster from a reader (live workers' GPUs, running jobs, each waiting user's
//! queue, usage as the fair share ranks it), lets `shared::preemption::plan` and
//! `shared::drain::drains` decide, and gives each order in one write; the worker's next
//! heartbeat carries it.
//!
//! The reaper runs it (on PostgreSQL, the replica that leads), every second while jobs wait.
//! Jobs ordered already count as gone, their GPUs as free: a pass never orders twice for one
//! need, and the next pass sees the freed GPUs taken by the jobs they were freed for.

use super::Queue;
use crate::config::Preemptible;
use crate::db::{self, now_ms};
use crate::error::ApiResult;
use shared::api::{JobId, WorkerId, WorkerState};
use shared::drain::{drains, Hold};
use shared::placement::Capacity;
use shared::preemption::{plan, Cluster, Queued, Running, GUARD_MS};
use shared::sweep::Resources;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The most queued jobs read per waiting user (past this many GPUs' worth, no user's share
/// grows).
const MAX_READ: u32 = 1_024;

/// A healthy worker's GPUs and how many of them no running job holds (a job ordered to stop
/// counts as gone).
pub(super) struct Live {
    pub id: WorkerId,
    pub gpus: u32,
    pub free: u32,
    /// What it registered with: its GPUs (all of them) and what it can run.
    pub capacity: Capacity,
}

impl Live {
    /// Whether it could ever run a job asking for `resources` (its GPUs' memory, the trainer).
    pub(super) fn could_run(&self, resources: &Resources) -> bool {
        let mut idle = self.capacity.clone();
        idle.job_slots = idle.job_slots.max(1);
        for gpu in &mut idle.gpus {
            (gpu.memory_free, gpu.exclusive_held, gpu.shared_jobs) = (gpu.memory_total, false, 0);
        }
        shared::placement::place(resources, &idle).is_some()
    }
}

impl Queue {
    /// The healthy workers (heartbeating on time) with their GPUs free of `running`'s jobs.
    pub(super) async fn live_workers(&self, running: &[db::preemptions::RunningJob], now: i64) -> ApiResult<Vec<Live>> {
        let (heartbeat, lease) = (self.config.heartbeat.as_millis() as u64, self.config.lease.as_millis() as u64);
        let workers = db::workers::list(self.reader(), now, heartbeat, lease).await?;
        let mut held: HashMap<i64, BTreeSet<u32>> = HashMap::new();
        for job in running.iter().filter(|job| !job.ordered) {
            if let Some(worker) = job.worker {
                held.entry(worker).or_default().extend(&job.gpu_ids);
            }
        }
        Ok(workers
            .iter()
            .filter(|worker| worker.state == WorkerState::Healthy)
            .map(|worker| {
                let gpus = worker.capacity.gpus.len() as u32;
                let taken = held.get(&worker.id.get()).map_or(0, |gpus| gpus.len()) as u32;
                Live { id: worker.id, gpus, free: gpus.saturating_sub(taken), capacity: worker.capacity.clone() }
            })
            .collect())
    }

    /// Whether the pass may have work: someone waits. The reaper then runs it every second.
    pub fn preemption_may_be_due(&self) -> bool {
        self.shares.anyone_waits()
    }

    /// Resolves when users start to wait: the reaper, asleep, runs the pass.
    pub async fn preemption_wanted(&self) {
        self.shares.started_waiting().await
    }

    /// One pass: gives the orders the plan makes; returns the jobs ordered to stop.
    pub async fn preempt_for_shares(&self) -> ApiResult<Vec<JobId>> {
        let now = now_ms();
        // (A pass that ends early drains nothing: no hold starts sooner for it.)
        self.shares.reservations.drained(Vec::new());
        let waiting = {
            let mut reader = self.reader().acquire().await?;
            db::shares::waiting_owners(reader.conn()).await?
        };
        if waiting.is_empty() {
            return Ok(Vec::new());
        }
        let running = db::preemptions::running(self.reader(), now - GUARD_MS).await?;
        // (The holds as the claims see them: looked at every second, and stored by the
        // reservation pass that runs after this one.)
        let holds = self.shares.reservations.current();
        // Only the one waiting user runs, and no worker drains for a held job: nobody to take
        // GPUs from.
        if holds.is_empty() && running.iter().all(|job| waiting.len() == 1 && job.owner == waiting[0]) {
            return Ok(Vec::new());
        }
        let live = self.live_workers(&running, now).await?;
        let free: BTreeMap<u64, u32> = live.iter().map(|worker| (worker.id.get() as u64, worker.free)).collect();
        let total_gpus: u32 = live.iter().map(|worker| worker.gpus).sum();
        if total_gpus == 0 {
            return Ok(Vec::new());
        }
        let default = self.config.preemptible;
        // A GPU two jobs share is not freed by stopping one of them: neither is stopped.
        let mut sharing: HashMap<(Option<i64>, u32), u32> = HashMap::new();
        for job in running.iter().filter(|job| !job.ordered) {
            for gpu in &job.gpu_ids {
                *sharing.entry((job.worker, *gpu)).or_default() += 1;
            }
        }
        let shares_a_gpu =
            |job: &db::preemptions::RunningJob| job.gpu_ids.iter().any(|gpu| sharing[&(job.worker, *gpu)] > 1);
        // Jobs without GPUs hold none to give (and their users no part of the GPUs' shares).
        let jobs: Vec<Running<'_>> = running
            .iter()
            .filter(|job| !job.ordered && !job.gpu_ids.is_empty())
            .map(|job| Running {
                job: job.id.get() as u64,
                user: &job.owner,
                worker: job.worker.map_or(u64::MAX, |worker| worker as u64),
                gpus: job.gpu_ids.len() as u32,
                started_at: job.started_at,
                checkpointed_at: job.checkpointed_at,
                saved_at: job.saved_at,
                save_every: job.save_every,
                class: job.class,
                preemptible: !shares_a_gpu(job)
                    && job.preemptible.unwrap_or(match default {
                        Preemptible::All => true,
                        Preemptible::Never => false,
                        Preemptible::Checkpointing => job.checkpointed,
                    }),
                preempted_at: job.preempted_at.clone(),
            })
            .collect();
        let fitting = db::claims::Fitting {
            gpus: u32::MAX,
            max_free_memory: u64::MAX,
            trainer: true,
            // Jobs without GPUs are read too (and passed over): a few times the GPUs.
            limit: total_gpus.saturating_mul(4).min(MAX_READ),
        };
        // A held worker's GPUs go to the job it is held for (decision 0080): room is made there
        // for that job alone, and for that job nowhere else.
        let may_free = |worker: WorkerId, job: JobId| match holds.iter().find(|hold| hold.job == job) {
            Some(hold) => hold.worker == worker,
            None => holds.iter().all(|hold| hold.worker != worker),
        };
        let mut queues = Vec::with_capacity(waiting.len());
        for user in &waiting {
            let mut reader = self.reader().acquire().await?;
            let candidates = db::claims::queued_candidates(reader.conn(), fitting, Some(user)).await?;
            let queued = candidates.iter().map(|candidate| {
                let able: Vec<u64> = live
                    .iter()
                    .filter(|w| w.could_run(&candidate.resources) && may_free(w.id, candidate.id))
                    .map(|w| w.id.get() as u64)
                    .collect();
                Queued {
                    job: candidate.id.get() as u64,
                    user,
                    // A job that does not say takes one GPU on a GPU box (the only kind here).
                    gpus: candidate.resources.gpus.unwrap_or(1),
                    class: candidate.class,
                    // Nobody able: no worker to free for it (an empty list would mean any).
                    on: if able.len() == live.len() {
                        Vec::new()
                    } else if able.is_empty() {
                        vec![u64::MAX]
                    } else {
                        able
                    },
                }
            });
            queues.push(queued.collect::<Vec<_>>());
        }
        // Users with GPU work share the GPUs: those whose waiting jobs ask for some.
        let gpu_waiting: Vec<&str> = queues
            .iter()
            .filter(|queue| queue.iter().any(|queued| queued.gpus > 0))
            .filter_map(|queue| queue.first().map(|queued| queued.user))
            .collect();
        // Usage as the claims rank it: recorded GPU time, decayed, and what running jobs ran.
        self.shares.refresh_usage(self.reader(), now).await;
        let recorded = self.shares.usage_at(now);
        let holdings = {
            let mut reader = self.reader().acquire().await?;
            db::shares::holdings(reader.conn(), now).await?
        };
        let mut usage: BTreeMap<&str, f64> = BTreeMap::new();
        for user in waiting.iter().map(String::as_str).chain(running.iter().map(|job| job.owner.as_str())) {
            let running = holdings.iter().find(|holding| holding.owner == user).map_or(0.0, |h| h.running_secs);
            usage.insert(user, recorded.get(user).copied().unwrap_or(0.0) + running);
        }
        let mut cpu_running: BTreeMap<&str, u32> = BTreeMap::new();
        for job in running.iter().filter(|job| job.gpu_ids.is_empty()) {
            *cpu_running.entry(job.owner.as_str()).or_default() += 1;
        }
        // A preempted job's worker waits up to half the grace for its next save (decision 0088).
        let save_wait = (self.config.preempt_grace / 2).as_millis() as i64;
        let cluster = Cluster { free, running: jobs, waiting: gpu_waiting, total_gpus, usage, cpu_running, save_wait };
        let min_runtime = self.config.min_runtime.as_millis() as i64;
        // Each held worker whose job was read drains at its jobs' next saves (decision 0092).
        let draining: Vec<Hold> = holds
            .iter()
            .filter_map(|hold| {
                let queued = queues.iter().flatten().find(|queued| queued.job == hold.job.get() as u64)?;
                let (worker, user) = (hold.worker.get() as u64, queued.user);
                Some(Hold { worker, job: queued.job, user, gpus: queued.gpus, class: queued.class })
            })
            .collect();
        let mut orders = plan(cluster.clone(), &queues, self.shares.policy(), now, min_runtime);
        let (drained, completes) = drains(&draining, cluster, &orders, self.shares.policy(), now, min_runtime);
        orders.extend(drained);
        let completes =
            completes.iter().map(|(hold, at)| (JobId::new(hold.job as i64), WorkerId::new(hold.worker as i64), *at));
        self.shares.reservations.drained(completes.collect());
        if orders.is_empty() {
            return Ok(Vec::new());
        }
        // Each order says whose sweep it makes room for.
        let mut reasons: HashMap<u64, String> = HashMap::new();
        for order in &orders {
            if let std::collections::hash_map::Entry::Vacant(entry) = reasons.entry(order.for_job) {
                let sweep = db::preemptions::sweep_of(self.reader(), JobId::new(order.for_job as i64)).await?;
                let reason = match sweep {
                    Some((owner, name)) => format!("preempted for {owner}'s sweep {name}"),
                    None => "preempted for another user's job".to_string(),
                };
                entry.insert(reason);
            }
        }
        let given: Vec<(JobId, u32, String)> = orders
            .iter()
            .filter_map(|order| {
                let job = running.iter().find(|job| job.id.get() as u64 == order.job)?;
                Some((job.id, job.attempt, reasons[&order.for_job].clone()))
            })
            .collect();
        self.write(move |tx| {
            Box::pin(async move {
                let mut ordered = Vec::with_capacity(given.len());
                for (job, attempt, reason) in &given {
                    // A job that ended or was cancelled since the read is left alone.
                    if db::preemptions::order(tx.conn().await?, *job, *attempt, reason, now).await? {
                        tx.note(super::Change::Job(*job));
                        ordered.push(*job);
                    }
                }
                Ok(ordered)
            })
        })
        .await
        .inspect(|ordered| self.meters.preempted(ordered.len(), true))
    }
}
