//! Claims: a worker asks for jobs that fit its free capacity, waiting (long poll) until one
//! arrives. Claims waiting together are served as a batch by one dispatcher: one read of the
//! queue and one UPDATE, in one write unit, hand jobs to all of them.
//!
//! The single writer is the queue's bottleneck and every statement costs a round trip to
//! SQLite's thread; under load this turns `2 x claims` statements into 2 per batch. Placement
//! stays exact: each claim's jobs are chosen by `shared::placement::place` against the
//! capacity that worker reported, in arrival order, best jobs first.

use super::{Change, Queue, Tx};
use crate::db::{self, now_ms};
use crate::error::{ApiError, ApiResult};
use shared::api::{ClaimedJob, JobAttempt, JobId, SweepId, WorkerId};
use shared::job::JobStatus;
use shared::placement::{place, Capacity, Placement};
use shared::sweep::SweepForm;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// Queued jobs looked at per free job slot of the batch: enough to skip past the few jobs the
/// SQL filter lets through that still do not fit, without walking the queue.
const CANDIDATES_PER_SLOT: u32 = 4;
/// Claims served together at most.
const MAX_BATCH: usize = 128;
/// Queued jobs looked at per batch at most.
const MAX_CANDIDATES: u32 = 16_384;

/// One worker's claim waiting for its jobs.
pub struct ClaimTicket {
    worker_id: WorkerId,
    capacity: Capacity,
    reply: oneshot::Sender<ApiResult<Vec<ClaimedJob>>>,
}

pub type ClaimSender = mpsc::Sender<ClaimTicket>;

/// What a claim got: jobs, or nothing within its wait.
pub type ClaimOutcome = Vec<ClaimedJob>;

/// Serves claims until the queue is gone.
pub(super) async fn dispatch(queue: Weak<Queue>, mut tickets: mpsc::Receiver<ClaimTicket>) {
    while let Some(first) = tickets.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match tickets.try_recv() {
                Ok(ticket) => batch.push(ticket),
                Err(_) => break,
            }
        }
        // A worker that hung up gets nothing.
        batch.retain(|ticket| !ticket.reply.is_closed());
        let Some(queue) = queue.upgrade() else { return };
        if batch.is_empty() {
            continue;
        }
        let requests: Vec<(WorkerId, Capacity)> =
            batch.iter().map(|ticket| (ticket.worker_id, ticket.capacity.clone())).collect();
        let (lease, names) = (queue.config.lease, queue.sweep_names.clone());
        let (workspaces, search, views) = (queue.workspaces.clone(), queue.search.clone(), queue.views.clone());
        let shares = queue.shares.clone();
        if shares.engaged() {
            shares.refresh_usage(queue.reader(), db::now_ms()).await;
        }
        let served = queue
            .write(move |tx| {
                Box::pin(async move {
                    // Adaptive sweeps get their runs for these claims first (queue/search).
                    search.top_up(tx, &requests).await?;
                    claim_batch(tx, &requests, lease, (&names, &workspaces, &views, &shares)).await
                })
            })
            .await;
        match served {
            Ok(per_ticket) => {
                queue.meters.claimed(per_ticket.iter().map(Vec::len).sum());
                for (ticket, jobs) in batch.into_iter().zip(per_ticket) {
                    if let Err(Ok(unsent)) = ticket.reply.send(Ok(jobs)) {
                        queue.give_back(ticket.worker_id, unsent).await;
                    }
                }
            }
            Err(error) => {
                tracing::error!(error = ?error, "serving a batch of claims");
                for ticket in batch {
                    let _ = ticket.reply.send(Err(error.retry_copy()));
                }
            }
        }
    }
}

impl Queue {
    /// Hands `worker` the jobs that fit `capacity`, waiting up to `wait` for one to arrive.
    pub async fn claim(&self, worker: WorkerId, capacity: Capacity, wait: Duration) -> ApiResult<ClaimOutcome> {
        let deadline = Instant::now() + wait.min(self.config.max_long_poll);
        let mut shutting_down = self.shutting_down();
        loop {
            // Listen before looking, so a job submitted between the look and the wait still wakes us.
            let notified = self.events.work().notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let jobs = self.claim_now(worker, capacity.clone()).await?;
            if !jobs.is_empty() || Instant::now() >= deadline || capacity.job_slots == 0 || self.is_draining(worker) {
                return Ok(jobs);
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(deadline) => {}
                _ = shutting_down.wait_for(|stop| *stop) => return Err(ApiError::ShuttingDown),
            }
        }
    }

    /// Asks the dispatcher for jobs that fit `capacity` (without waiting for new work).
    async fn claim_now(&self, worker_id: WorkerId, capacity: Capacity) -> ApiResult<Vec<ClaimedJob>> {
        if self.is_draining(worker_id) {
            return Ok(Vec::new());
        }
        let (reply, answer) = oneshot::channel();
        self.claims.send(ClaimTicket { worker_id, capacity, reply }).await.map_err(|_| ApiError::ShuttingDown)?;
        answer.await.map_err(|_| ApiError::ShuttingDown)?
    }

    /// Jobs claimed for a worker that hung up before the answer: back to the queue, no crash.
    async fn give_back(&self, worker_id: WorkerId, jobs: Vec<ClaimedJob>) {
        let attempts: Vec<JobAttempt> =
            jobs.iter().map(|job| JobAttempt { job_id: job.id, attempt: job.attempt }).collect();
        let given = self
            .write(move |tx| {
                Box::pin(async move {
                    for attempt in attempts {
                        let Some(current) = db::jobs::state(tx.conn().await?, attempt.job_id).await? else { continue };
                        let still_ours = current.status == JobStatus::Running
                            && current.attempt == attempt.attempt
                            && current.worker_id == Some(worker_id);
                        if !still_ours {
                            continue;
                        }
                        super::workers::hand_back(tx, &current, worker_id, "its worker hung up before the answer")
                            .await?;
                    }
                    Ok(())
                })
            })
            .await;
        if let Err(error) = given {
            tracing::warn!(%error, "handing back jobs of a worker that hung up; their leases will expire");
        }
    }
}

/// Chooses each claim's jobs, in arrival order, best jobs first: `place` against the capacity
/// that worker reported, reserving as it goes. Returns the choices, the (job, worker) pairs in
/// dispatch order, and whether some claim still has free slots.
#[allow(clippy::type_complexity)]
fn assign(
    requests: &[(WorkerId, Capacity)],
    candidates: &[db::claims::Candidate],
) -> (HashMap<JobId, (usize, Placement)>, Vec<(JobId, WorkerId)>, bool) {
    let mut taken = vec![false; candidates.len()];
    let mut chosen = HashMap::new();
    let mut order = Vec::new();
    let mut unfilled = false;
    for (position, (worker_id, capacity)) in requests.iter().enumerate() {
        let mut free = capacity.clone();
        for (index, candidate) in candidates.iter().enumerate() {
            if free.job_slots == 0 {
                break;
            }
            if taken[index] {
                continue;
            }
            if let Some(placement) = place(&candidate.resources, &free) {
                free.reserve(&candidate.resources, &placement);
                taken[index] = true;
                order.push((candidate.id, *worker_id));
                chosen.insert(candidate.id, (position, placement));
            }
        }
        unfilled |= free.job_slots > 0;
    }
    (chosen, order, unfilled)
}

/// The name and form of each sweep seen, by id.
pub(super) type SweepNames = Arc<RwLock<HashMap<SweepId, (String, SweepForm)>>>;

/// What a claim batch works with of the queue's caches: sweep names, workspaces, the views of
/// plainly claimed jobs, the fair share.
pub(super) type Caches<'a> =
    (&'a SweepNames, &'a super::code::Workspaces, &'a super::views::Views, &'a super::shares::Shares);

pub(super) async fn claim_batch(
    tx: &mut Tx,
    requests: &[(WorkerId, Capacity)],
    lease: Duration,
    (names, workspaces, views, shares): Caches<'_>,
) -> ApiResult<Vec<Vec<ClaimedJob>>> {
    let now = now_ms();
    let lease_expires_at = now + lease.as_millis() as i64;
    // Workers held for jobs of several GPUs (decision 0080): the held job first where it
    // fits, the GPUs otherwise out of the choice and lent afterwards.
    let reservations = shares.reservations.current();
    let holds = match requests.iter().any(|(worker, _)| reservations.iter().any(|held| held.worker == *worker)) {
        true => {
            let quotas = shares.has_quotas().then(|| shares.policy());
            if quotas.is_some() {
                // The held job's owner's holdings are read under the quota lock.
                db::shares::lock_quotas(tx.conn().await?).await?;
            }
            Some(super::reservations::hold(tx, requests, &reservations, quotas).await?)
        }
        false => None,
    };
    let requests: &[(WorkerId, Capacity)] = holds.as_ref().map_or(requests, |holds| &holds.requests);
    let excluded: HashSet<JobId> = holds.iter().flat_map(|holds| holds.first.iter().map(|(id, _, _)| *id)).collect();
    let charged: Vec<(String, u32)> = holds.as_ref().map_or_else(Vec::new, |holds| holds.charged.clone());
    let slots: u32 = requests.iter().map(|(_, capacity)| capacity.job_slots).sum();
    let usable = |capacity: &Capacity| capacity.gpus.iter().filter(|gpu| !gpu.exclusive_held).count() as u32;
    let max_gpus = requests.iter().map(|(_, capacity)| usable(capacity)).max().unwrap_or(0);
    let max_free_memory = requests
        .iter()
        .flat_map(|(_, capacity)| capacity.gpus.iter().filter(|gpu| !gpu.exclusive_held))
        .map(|gpu| gpu.memory_free)
        .max()
        .unwrap_or(0);
    let trainer = requests.iter().any(|(_, capacity)| capacity.capabilities.trainer);
    let mut per_ticket: Vec<Vec<ClaimedJob>> = requests.iter().map(|_| Vec::new()).collect();
    // (A held job placed above may have taken the last slot, or a held worker's last slot be
    // kept for its job: the held job is still claimed below, the GPUs still lent.)
    if slots == 0 && holds.as_ref().is_none_or(|holds| holds.first.is_empty() && holds.lend.is_empty()) {
        return Ok(per_ticket);
    }
    // Several users waiting, or quotas: each user's queue, chosen between by the fair share.
    let waiting = match shares.engaged() {
        true => shares.waiting(tx).await?,
        false => None,
    };
    if let (None, Some(claim)) = (&waiting, plain_claim(requests, lease_expires_at, now)) {
        let rows = db::claims::claim(tx.conn().await?, claim).await?;
        return Ok(vec![claimed_plain(tx, rows, (names, workspaces, views)).await?]);
    }
    // The look and the update run in one write unit: no other writer runs in between, and all
    // chosen jobs change in one statement.
    let mut limit = slots.saturating_mul(CANDIDATES_PER_SLOT).clamp(CANDIDATES_PER_SLOT, MAX_CANDIDATES);
    let (mut chosen, mut order, standing) = loop {
        let fitting = db::claims::Fitting { gpus: max_gpus, max_free_memory, trainer, limit };
        let (chosen, order, unfilled, cut, standing) = match &waiting {
            Some(waiting) => shares.choose(tx, requests, waiting, (fitting, &excluded, &charged), now).await?,
            None => {
                let mut candidates = db::claims::queued_candidates(tx.conn().await?, fitting, None).await?;
                candidates.retain(|candidate| !excluded.contains(&candidate.id));
                let (chosen, order, unfilled) = assign(requests, &candidates);
                (chosen, order, unfilled, candidates.len() as u32 >= limit, Vec::new())
            }
        };
        // Jobs that fit nobody (exclusive ones while the GPUs are shared, say) may fill the
        // head of the queue: look further while a claim still has room and the queue has more.
        if !unfilled || !cut || limit >= MAX_CANDIDATES {
            break (chosen, order, standing);
        }
        limit = limit.saturating_mul(8).min(MAX_CANDIDATES);
    };
    if let Some(holds) = &holds {
        for (id, position, placement) in &holds.first {
            chosen.insert(*id, (*position, placement.clone()));
            order.insert(0, (*id, requests[*position].0));
        }
        let taken: HashSet<JobId> = chosen.keys().copied().collect();
        let mut used = vec![0u32; requests.len()];
        for (position, _) in chosen.values() {
            used[*position] += 1;
        }
        // With a fair share, lent in its order and under the quotas, from where the users
        // stand after the choice; otherwise in dispatch order.
        let fair = waiting.is_some().then(|| (standing, shares.policy()));
        let lent = super::reservations::lend(tx, holds, (&taken, &used), now, fair).await?;
        for (id, position, placement) in lent {
            chosen.insert(id, (position, placement));
            order.push((id, requests[position].0));
        }
    }
    if order.is_empty() {
        return Ok(per_ticket);
    }
    // The GPUs the server chose are recorded with the claim; the worker keeps them while
    // they still fit (see worker/src/daemon.rs `start`).
    let rows = {
        let assignments: Vec<(JobId, WorkerId, &[u32])> =
            order.iter().map(|(id, worker)| (*id, *worker, chosen[id].1.gpus.as_slice())).collect();
        db::claims::mark_running(tx.conn().await?, &assignments, lease_expires_at, now).await?
    };
    if rows.len() < order.len() {
        // Another replica's claim took some of the jobs chosen here first (PostgreSQL): the
        // waiting claims (this one among them; the other replicas' through the relay) look
        // again at once rather than at their next wake-up (up to a long poll later).
        tx.note(Change::Claimable);
    }
    for row in &rows {
        let id = row.id;
        // A new attempt: a view of an earlier one (or of a deleted job whose id this one
        // reuses) must not decide its finish.
        views.forget(id);
        if let Some((position, placement)) = chosen.remove(&id) {
            per_ticket[position].push(claimed_job(tx, row, placement, names, workspaces).await?);
            // Log followers waiting for a queued job's first attempt learn it started.
            tx.note(Change::Job(id));
        }
    }
    for jobs in &mut per_ticket {
        // Dispatch order: priority first, then age, as the candidates came.
        jobs.sort_by_key(|job| order.iter().position(|(id, _)| *id == job.id));
    }
    Ok(per_ticket)
}

/// The claim of one worker that reports no GPU, made in one statement (`db::claims::claim`):
/// `place` would accept every job the SQL filter lets through, with no GPUs.
pub(super) fn plain_claim(
    requests: &[(WorkerId, Capacity)],
    lease_until: i64,
    now: i64,
) -> Option<db::claims::PlainClaim> {
    let [(worker_id, capacity)] = requests else { return None };
    if !capacity.gpus.is_empty() || capacity.job_slots == 0 {
        return None;
    }
    let trainer = capacity.capabilities.trainer;
    Some(db::claims::PlainClaim { worker_id: *worker_id, slots: capacity.job_slots, trainer, lease_until, now })
}

/// The jobs of a plain claim's rows, in dispatch order (priority first, then age).
pub(super) async fn claimed_plain(
    tx: &mut Tx,
    mut rows: Vec<db::claims::ClaimedRow>,
    (names, workspaces, views): (&SweepNames, &super::code::Workspaces, &super::views::Views),
) -> ApiResult<Vec<ClaimedJob>> {
    in_dispatch_order(&mut rows);
    let mut jobs = Vec::with_capacity(rows.len());
    for row in rows {
        let job = claimed_job(tx, &row, Placement { gpus: Vec::new() }, names, workspaces).await?;
        jobs.push(keep_claimed(tx, views, &row, job));
    }
    Ok(jobs)
}

fn in_dispatch_order(rows: &mut [db::claims::ClaimedRow]) {
    rows.sort_by_key(|row| db::claims::dispatch_key(row.priority, row.id));
}

/// Keeps the view of a plainly claimed job (its finish is decided on it) and notes its start.
fn keep_claimed(tx: &mut Tx, views: &super::views::Views, row: &db::claims::ClaimedRow, job: ClaimedJob) -> ClaimedJob {
    views.keep(
        db::jobs::JobState {
            id: job.id,
            sweep_id: job.sweep_id,
            status: JobStatus::Running,
            attempt: job.attempt,
            worker_id: row.worker_id,
            retries_left: row.retries_left,
            crash_count: row.crash_count,
            cancel_requested: false,
        },
        db::jobs::ResultSource {
            sweep: job.sweep.clone(),
            index: job.index,
            params: job.params.clone(),
            has_metrics: false,
        },
    );
    // Log followers waiting for a queued job's first attempt learn it started.
    tx.note(Change::Job(job.id));
    job
}

async fn claimed_job(
    tx: &mut Tx,
    row: &db::claims::ClaimedRow,
    placement: Placement,
    names: &SweepNames,
    workspaces: &super::code::Workspaces,
) -> ApiResult<ClaimedJob> {
    let (name, workspace) = sweep_of(tx, row.sweep_id, (names, workspaces)).await?;
    job_of(row, placement, name, workspace)
}

/// What a claimed job carries of its sweep (name and form, workspace), from the caches or the
/// database (which fills them).
pub(super) async fn sweep_of(
    tx: &mut Tx,
    sweep_id: SweepId,
    (names, workspaces): (&SweepNames, &super::code::Workspaces),
) -> ApiResult<((String, SweepForm), shared::api::Workspace)> {
    let name = sweep_name(tx, sweep_id, names).await?;
    Ok((name, super::code::workspace_of(tx, sweep_id, workspaces).await?))
}

fn job_of(
    row: &db::claims::ClaimedRow,
    placement: Placement,
    (sweep, form): (String, SweepForm),
    workspace: shared::api::Workspace,
) -> ApiResult<ClaimedJob> {
    Ok(ClaimedJob {
        id: row.id,
        attempt: row.attempt,
        sweep_id: row.sweep_id,
        sweep,
        form,
        index: row.index,
        params: serde_json::from_str(&row.params).map_err(anyhow::Error::from)?,
        command: row.command.clone(),
        config: row.config.clone(),
        resources: row.resources.clone(),
        timeout_secs: row.timeout_secs.map(|secs| secs as u64),
        placement,
        lease_expires_at: row.lease_expires_at,
        workspace,
    })
}

async fn sweep_name(tx: &mut Tx, sweep_id: SweepId, names: &SweepNames) -> ApiResult<(String, SweepForm)> {
    let cached = names.read().ok().and_then(|names| names.get(&sweep_id).cloned());
    if let Some(known) = cached {
        return Ok(known);
    }
    let known = db::sweeps::name_and_form_of(tx.conn().await?, sweep_id).await?;
    if let Ok(mut names) = names.write() {
        names.insert(sweep_id, known.clone());
    }
    Ok(known)
}
