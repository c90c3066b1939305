//! Reservations for jobs of several GPUs, and backfill (issue 29, item 4; decision 0080).
//!
//! The pass ([`Queue::reserve_for_large_jobs`], run by the reaper's leader beside the
//! preemption pass): each claimable job of more than one GPU that has waited
//! `backfill_after_secs` holds one healthy worker, the one where it could start soonest by the
//! running jobs' timeouts (`shared::backfill`), or sooner when the preemption pass drains
//! that worker for it (decision 0092); the rows change only when the choice does.
//! With priority classes, only jobs of the highest class that has claimable jobs hold one:
//! higher-class work is claimed first and preempts lower classes, so a hold for a lower class
//! would only keep it off the held worker.
//!
//! The claims ([`hold`], [`lend`]): a worker held for a job that fits it now gets that job
//! first; otherwise its GPUs go to no one in the batch's choice (its job slots still take jobs
//! without GPUs) and afterwards only to jobs whose timeout ends before the held job could
//! start. Every replica looks at the rows every second ([`Reservations::look`], from the fair
//! share's loop), so a claim reads nothing more unless a worker it serves is held.

use super::shares::Standing;
use super::{Queue, Tx};
use crate::db::claims::Candidate;
use crate::db::reservations::Reservation;
use crate::db::{self, now_ms};
use crate::error::ApiResult;
use shared::api::{JobId, WorkerId};
use shared::backfill::{choose, may_backfill, Busy, Worker};
use shared::fair_share::{allot, Contender, Policy, START_CHARGE_SECS};
use shared::placement::{place, Capacity, Placement};
use std::sync::{Arc, Mutex};

/// Jobs read per held worker that may backfill it.
const BACKFILL_CANDIDATES: u32 = 64;

/// The reservations as this replica last saw them.
#[derive(Default)]
pub(super) struct Reservations {
    seen: Mutex<Arc<Vec<Reservation>>>,
    /// When the last preemption pass's drains complete each held job's room (decision 0092):
    /// the pass that holds (run next, on the same replica) starts the job no later.
    drained: Mutex<Vec<(JobId, WorkerId, i64)>>,
}

impl Reservations {
    pub fn drained(&self, completes: Vec<(JobId, WorkerId, i64)>) {
        if let Ok(mut drained) = self.drained.lock() {
            *drained = completes;
        }
    }

    /// When the drain of `worker` completes `job`'s room (a hold moved elsewhere has none).
    fn drain_completes(&self, job: JobId, worker: WorkerId) -> Option<i64> {
        let drained = self.drained.lock().ok()?;
        drained.iter().find(|(held, on, _)| (*held, *on) == (job, worker)).map(|(_, _, complete)| *complete)
    }

    pub fn current(&self) -> Arc<Vec<Reservation>> {
        self.seen.lock().map(|seen| seen.clone()).unwrap_or_default()
    }

    pub fn store(&self, reservations: Vec<Reservation>) {
        if let Ok(mut seen) = self.seen.lock() {
            *seen = Arc::new(reservations);
        }
    }

    /// Reads the rows again (every second, from a reader).
    pub async fn look(&self, reader: &db::backend::Pool) -> ApiResult<()> {
        let reservations = db::reservations::all(reader).await?;
        self.store(reservations);
        Ok(())
    }
}

impl Queue {
    /// One pass: holds a worker for each job of several GPUs that waited `backfill_after`, and
    /// lets go of the others; returns the reservations kept.
    pub async fn reserve_for_large_jobs(&self) -> ApiResult<Vec<Reservation>> {
        let now = now_ms();
        let current = db::reservations::all(self.reader()).await?;
        let before = now - self.config.backfill_after.as_millis() as i64;
        let running = db::preemptions::running(self.reader(), now).await?;
        let live = self.live_workers(&running, now).await?;
        // With priority classes, only jobs of the highest class waiting hold workers: a hold
        // for a lower one would keep higher-class work off the worker's freed GPUs.
        let class = match self.config.priority_classes.is_empty() || live.is_empty() {
            true => None,
            false => db::reservations::highest_waiting_class(self.reader()).await?,
        };
        // A few times the workers: jobs no worker can run are read and passed over.
        let limit = live.len() as u32 * 4 + 16;
        let waited = match live.is_empty() {
            true => Vec::new(),
            false => db::reservations::waited_long(self.reader(), before, limit, class).await?,
        };
        if waited.is_empty() && current.is_empty() {
            return Ok(Vec::new());
        }
        let mut workers: Vec<Worker> = live
            .iter()
            .map(|worker| Worker {
                worker: worker.id.get() as u64,
                gpus: worker.gpus,
                free: worker.free,
                running: running
                    .iter()
                    .filter(|job| job.worker == Some(worker.id.get()) && !job.ordered)
                    .map(|job| Busy {
                        gpus: job.gpu_ids.len() as u32,
                        ends_at: job.timeout_secs.map(|secs| job.started_at.saturating_add(secs as i64 * 1000)),
                    })
                    .collect(),
            })
            .collect();
        let mut wanted = Vec::new();
        // The oldest first; a job keeps the worker it holds while that worker stays healthy; a
        // quarter of the workers at most.
        for job in &waited {
            if wanted.len() >= shared::backfill::most_held(live.len()) {
                break;
            }
            let need = job.resources.gpus.unwrap_or(1);
            // Only workers that could run it (its GPUs' memory, the trainer), by registration.
            let able: Vec<Worker> = workers
                .iter()
                .filter(|w| live.iter().any(|l| l.id.get() as u64 == w.worker && l.could_run(&job.resources)))
                .cloned()
                .collect();
            let kept = current.iter().find(|held| held.job == job.id).map(|held| held.worker.get() as u64);
            let at = kept.and_then(|worker| able.iter().position(|w| w.worker == worker && w.gpus >= need));
            let chosen = match at {
                Some(at) => Some((able[at].worker, shared::backfill::starts_at(&able[at], need, now))),
                None => choose(&able, need, now),
            };
            let Some((worker, starts_at)) = chosen else { continue };
            // Drained (decision 0092), it starts when its room is complete, if that is sooner:
            // only jobs that end before then borrow the GPUs the drain frees.
            let starts_at = match self.shares.reservations.drain_completes(job.id, WorkerId::new(worker as i64)) {
                Some(complete) => Some(starts_at.map_or(complete, |at| at.min(complete))),
                None => starts_at,
            };
            workers.retain(|w| w.worker != worker);
            wanted.push(Reservation { job: job.id, worker: WorkerId::new(worker as i64), gpus: need, starts_at });
        }
        let mut sorted = wanted.clone();
        sorted.sort_by_key(|reservation| reservation.job);
        // A start already due reads as now, which moves every pass: equal to any other due one.
        let due = |at: Option<i64>| at.map(|at| at.max(now));
        let same = |a: &Reservation, b: &Reservation| {
            (a.job, a.worker, a.gpus) == (b.job, b.worker, b.gpus) && due(a.starts_at) == due(b.starts_at)
        };
        let unchanged = sorted.len() == current.len() && sorted.iter().zip(&current).all(|(a, b)| same(a, b));
        if unchanged {
            sorted = current.clone();
        } else {
            let rows = sorted.clone();
            self.write(move |tx| {
                Box::pin(async move {
                    db::reservations::replace(tx.conn().await?, &rows, now).await?;
                    // A worker let go (or held elsewhere) may claim again at once.
                    tx.note(super::Change::Claimable);
                    Ok(())
                })
            })
            .await?;
        }
        self.shares.reservations.store(sorted.clone());
        Ok(sorted)
    }
}

/// What a claim batch does for the held workers it serves.
pub(super) struct Holds {
    /// The capacities the batch's choice sees: a held worker's GPUs taken out of it.
    pub requests: Vec<(WorkerId, Capacity)>,
    /// Held jobs that fit their worker now, claimed first: (job, request, GPUs).
    pub first: Vec<(JobId, usize, Placement)>,
    /// Held workers whose job does not fit yet: (request, its capacity for backfill, when the
    /// held job could start).
    pub lend: Vec<(usize, Capacity, Option<i64>)>,
    /// The owners of the `first` jobs and their GPUs, for the choice's quotas.
    pub charged: Vec<(String, u32)>,
}

/// Sorts out a claim batch's `requests` against the `reservations`; with `quotas`, a held job
/// its owner's quota refuses now holds nothing (the claims would not start it either).
pub(super) async fn hold(
    tx: &mut Tx,
    requests: &[(WorkerId, Capacity)],
    reservations: &[Reservation],
    quotas: Option<&shared::fair_share::Policy>,
) -> ApiResult<Holds> {
    let mut holds = Holds { requests: requests.to_vec(), first: Vec::new(), lend: Vec::new(), charged: Vec::new() };
    let holdings = match quotas {
        Some(_) => db::shares::holdings(tx.conn().await?, now_ms()).await?,
        None => Vec::new(),
    };
    for (position, (worker, capacity)) in requests.iter().enumerate() {
        let Some(reservation) = reservations.iter().find(|reservation| reservation.worker == *worker) else { continue };
        // A job claimed or cancelled since holds nothing.
        let Some((job, owner)) = db::reservations::claimable(tx.conn().await?, reservation.job).await? else {
            continue;
        };
        if holds.first.iter().any(|(id, _, _)| *id == job.id) {
            continue;
        }
        let gpus = job.resources.gpus.unwrap_or(1);
        if let Some(policy) = quotas {
            // What the owner holds, with the held jobs this batch takes for them already.
            let mut held = holdings.iter().find(|holding| holding.owner == owner).map(|h| h.held).unwrap_or_default();
            for (_, taken) in holds.charged.iter().filter(|(charged, _)| *charged == owner) {
                (held.gpus, held.running) = (held.gpus + taken, held.running + 1);
            }
            if shared::fair_share::admits(&owner, held, gpus, policy).is_err() {
                continue;
            }
        }
        match place(&job.resources, capacity) {
            Some(placement) => {
                holds.requests[position].1.reserve(&job.resources, &placement);
                holds.first.push((job.id, position, placement));
                holds.charged.push((owner, gpus));
            }
            None => {
                let mut without_gpus = capacity.clone();
                for gpu in &mut without_gpus.gpus {
                    gpu.exclusive_held = true;
                }
                // One slot stays free for the held job (jobs without GPUs could fill them all).
                without_gpus.job_slots = without_gpus.job_slots.saturating_sub(1);
                holds.requests[position].1 = without_gpus;
                holds.lend.push((position, capacity.clone(), reservation.starts_at));
            }
        }
    }
    Ok(holds)
}

/// After the batch's choice: the held workers' GPUs to jobs that end before the held job could
/// start (`shared::backfill::may_backfill`); `taken` are the jobs chosen already, `used` the
/// job slots the choice gave each request. With `fair` (where each waiting user stands after
/// the choice, and the policy), each lent place goes as the choice's did: to the user furthest
/// below their share whose quota admits the job (`fair_share::allot`); otherwise in dispatch
/// order.
pub(super) async fn lend(
    tx: &mut Tx,
    holds: &Holds,
    (taken, used): (&std::collections::HashSet<JobId>, &[u32]),
    now: i64,
    mut fair: Option<(Vec<Standing>, &Policy)>,
) -> ApiResult<Vec<(JobId, usize, Placement)>> {
    let mut lent: Vec<(JobId, usize, Placement)> = Vec::new();
    for (position, capacity, starts_at) in &holds.lend {
        let Some(start) = starts_at else { continue };
        let within = (start - now) / 1000;
        if within <= 0 {
            continue;
        }
        let mut free = capacity.clone();
        // (Lent jobs end before the held job starts: the slots they take are free by then.)
        free.job_slots = free.job_slots.saturating_sub(used[*position]);
        let mut candidates =
            db::reservations::backfill_candidates(tx.conn().await?, within, BACKFILL_CANDIDATES).await?;
        candidates.retain(|(candidate, _)| {
            let already = taken.contains(&candidate.id) || lent.iter().any(|(id, _, _)| *id == candidate.id);
            !already && may_backfill(candidate.timeout_secs, now, *starts_at)
        });
        match &mut fair {
            Some((standing, policy)) => lent.extend(
                lend_fairly(standing, policy, &candidates, &free)
                    .into_iter()
                    .map(|(id, placement)| (id, *position, placement)),
            ),
            None => {
                for (candidate, _) in &candidates {
                    if free.job_slots == 0 {
                        break;
                    }
                    if let Some(placement) = place(&candidate.resources, &free) {
                        free.reserve(&candidate.resources, &placement);
                        lent.push((candidate.id, *position, placement));
                    }
                }
            }
        }
    }
    Ok(lent)
}

/// The jobs among `candidates` (with their owners, in dispatch order) lent `free` by the fair
/// share, and `standing` moved on by them: what they hold and their start's charge.
fn lend_fairly(
    standing: &mut [Standing],
    policy: &Policy,
    candidates: &[(Candidate, String)],
    free: &Capacity,
) -> Vec<(JobId, Placement)> {
    let mut queues: Vec<Vec<&Candidate>> = vec![Vec::new(); standing.len()];
    for (candidate, owner) in candidates {
        // (A job whose owner was not waiting at the choice's look waits for the next claim.)
        if let Some(user) = standing.iter().position(|standing| standing.user == *owner) {
            queues[user].push(candidate);
        }
    }
    let contenders: Vec<Contender<'_>> = standing
        .iter()
        .zip(&queues)
        .map(|(standing, queue)| Contender {
            user: &standing.user,
            usage: standing.usage,
            held: standing.held,
            jobs: queue.iter().map(|candidate| &candidate.resources).collect(),
            classes: queue.iter().map(|candidate| candidate.class).collect(),
        })
        .collect();
    let picks = allot(std::slice::from_ref(free), &contenders, policy);
    let mut lent = Vec::with_capacity(picks.len());
    for pick in picks {
        let gpus = pick.placement.gpus.len() as u32;
        let user = &mut standing[pick.user];
        (user.held.gpus, user.held.running) = (user.held.gpus + gpus, user.held.running + 1);
        user.usage += f64::from(gpus.max(1)) * START_CHARGE_SECS;
        lent.push((queues[pick.user][pick.job].id, pick.placement));
    }
    lent
}
