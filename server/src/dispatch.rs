//! Claims, served in batches. Every claim that arrives while the previous batch is being
//! served joins the next one: one read of the queue and one UPDATE hand jobs to all of them.
//!
//! The single writer connection is the queue's bottleneck, and each statement costs a round
//! trip to SQLite's thread; under load this turns `2 x claims` statements into 2 per batch.
//! Placement stays exact: each claim's jobs are chosen by `shared::placement::place` against
//! the capacity that worker reported, in arrival order, best jobs first.

use crate::db::{self, now_ms};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use shared::api::{ClaimedJob, JobId, SweepId, WorkerId};
use shared::job::{self, JobStatus, Outcome};
use shared::placement::{place, Capacity, Placement};
use sqlx::Row;
use std::collections::HashMap;
use tokio::sync::{mpsc, oneshot};

/// Queued jobs looked at per free job slot of the batch: enough to skip past the few jobs the
/// SQL filter lets through that still do not fit, without walking the queue.
const CANDIDATES_PER_SLOT: u32 = 4;
/// Claims served together at most.
const MAX_BATCH: usize = 128;
/// Queued jobs looked at per batch at most.
const MAX_CANDIDATES: u32 = 16_384;

/// One worker's claim waiting for its jobs.
pub struct ClaimTicket {
    pub worker_id: WorkerId,
    pub capacity: Capacity,
    pub reply: oneshot::Sender<ApiResult<Vec<ClaimedJob>>>,
}

pub type ClaimSender = mpsc::Sender<ClaimTicket>;

/// Serves claims until every sender is gone.
pub async fn run(state: AppState, mut tickets: mpsc::Receiver<ClaimTicket>) {
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
        if batch.is_empty() {
            continue;
        }
        match claim_batch(&state, &batch).await {
            Ok(mut per_ticket) => {
                for (ticket, jobs) in batch.into_iter().zip(per_ticket.drain(..)) {
                    if let Err(Ok(unsent)) = ticket.reply.send(Ok(jobs)) {
                        give_back(&state, ticket.worker_id, unsent).await;
                    }
                }
            }
            Err(error) => {
                tracing::error!(error = ?error, "serving a batch of claims");
                for ticket in batch {
                    let _ =
                        ticket.reply.send(Err(ApiError::Internal(anyhow::anyhow!("claim failed; see the server log"))));
                }
            }
        }
    }
}

/// Asks the dispatcher for jobs that fit `capacity` (without waiting for new work).
pub async fn claim(state: &AppState, worker_id: WorkerId, capacity: Capacity) -> ApiResult<Vec<ClaimedJob>> {
    let (reply, answer) = oneshot::channel();
    state.claims.send(ClaimTicket { worker_id, capacity, reply }).await.map_err(|_| ApiError::ShuttingDown)?;
    answer.await.map_err(|_| ApiError::ShuttingDown)?
}

/// Chooses each claim's jobs, in arrival order, best jobs first: `place` against the capacity
/// that worker reported, reserving as it goes. Returns the choices, the (job, worker) pairs in
/// dispatch order, and whether some claim still has free slots.
#[allow(clippy::type_complexity)]
fn assign(
    batch: &[ClaimTicket],
    candidates: &[db::jobs::Candidate],
) -> (HashMap<JobId, (usize, Placement)>, Vec<(JobId, WorkerId)>, bool) {
    let mut taken = vec![false; candidates.len()];
    let mut chosen = HashMap::new();
    let mut order = Vec::new();
    let mut unfilled = false;
    for (position, ticket) in batch.iter().enumerate() {
        let mut free = ticket.capacity.clone();
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
                order.push((candidate.id, ticket.worker_id));
                chosen.insert(candidate.id, (position, placement));
            }
        }
        unfilled |= free.job_slots > 0;
    }
    (chosen, order, unfilled)
}

async fn claim_batch(state: &AppState, batch: &[ClaimTicket]) -> ApiResult<Vec<Vec<ClaimedJob>>> {
    let now = now_ms();
    let lease_expires_at = now + state.config.lease.as_millis() as i64;
    let slots: u32 = batch.iter().map(|ticket| ticket.capacity.job_slots).sum();
    let usable = |capacity: &Capacity| capacity.gpus.iter().filter(|gpu| !gpu.exclusive_held).count() as u32;
    let max_gpus = batch.iter().map(|ticket| usable(&ticket.capacity)).max().unwrap_or(0);
    let max_free_memory = batch
        .iter()
        .flat_map(|ticket| ticket.capacity.gpus.iter().filter(|gpu| !gpu.exclusive_held))
        .map(|gpu| gpu.memory_free)
        .max()
        .unwrap_or(0);
    let mut per_ticket: Vec<Vec<ClaimedJob>> = batch.iter().map(|_| Vec::new()).collect();
    if slots == 0 {
        return Ok(per_ticket);
    }
    // Holding the only writer connection makes the look and the update one unit: no other
    // writer runs in between. All chosen jobs change in one statement, atomically.
    let mut writer = state.db.writer.acquire().await?;
    let mut limit = slots.saturating_mul(CANDIDATES_PER_SLOT).clamp(CANDIDATES_PER_SLOT, MAX_CANDIDATES);
    let (mut chosen, order) = loop {
        let candidates = db::jobs::queued_candidates(&mut writer, max_gpus, max_free_memory, limit).await?;
        let (chosen, order, unfilled) = assign(batch, &candidates);
        // Jobs that fit nobody (exclusive ones while the GPUs are shared, say) may fill the
        // head of the queue: look further while a claim still has room and the queue has more.
        if !unfilled || (candidates.len() as u32) < limit || limit >= MAX_CANDIDATES {
            break (chosen, order);
        }
        limit = limit.saturating_mul(8).min(MAX_CANDIDATES);
    };
    if order.is_empty() {
        return Ok(per_ticket);
    }
    // The GPUs the server chose are recorded with the claim; the worker keeps them while
    // they still fit (see worker/src/daemon.rs `start`).
    let rows = {
        let assignments: Vec<(JobId, WorkerId, &[u32])> =
            order.iter().map(|(id, worker)| (*id, *worker, chosen[id].1.gpus.as_slice())).collect();
        db::jobs::mark_running(&mut writer, &assignments, lease_expires_at, now).await?
    };
    for row in &rows {
        let id: JobId = JobId::new(row.try_get("id")?);
        if let Some((position, placement)) = chosen.remove(&id) {
            per_ticket[position].push(claimed_job(state, &mut writer, row, placement).await?);
        }
    }
    drop(writer);
    for jobs in &mut per_ticket {
        // Dispatch order: priority first, then age, as the candidates came.
        jobs.sort_by_key(|job| order.iter().position(|(id, _)| *id == job.id));
        // Log followers waiting for a queued job's first attempt learn it started.
        for job in jobs.iter() {
            state.job_signals.wake(job.id);
        }
    }
    Ok(per_ticket)
}

/// Jobs claimed for a worker that hung up before the answer: back to the queue, no crash.
async fn give_back(state: &AppState, worker_id: WorkerId, jobs: Vec<ClaimedJob>) {
    let Ok(mut writer) = state.db.writer.acquire().await else { return };
    for job in jobs {
        let Ok(Some(current)) = db::jobs::state(&mut writer, job.id).await else { continue };
        let still_ours = current.status == JobStatus::Running
            && current.attempt == job.attempt
            && current.worker_id == Some(worker_id);
        if !still_ours {
            continue;
        }
        let decision = job::finish(&Outcome::Abandoned, current.retries_left, current.cancel_requested);
        if let Ok(true) = db::jobs::finish(&mut writer, &current, worker_id, &decision, now_ms()).await {
            tracing::info!(job = %job.id, "claimed for a worker that hung up; back in the queue");
        }
    }
    drop(writer);
    state.work_available.notify_waiters();
}

async fn claimed_job(
    state: &AppState,
    conn: &mut sqlx::SqliteConnection,
    row: &sqlx::sqlite::SqliteRow,
    placement: Placement,
) -> ApiResult<ClaimedJob> {
    let sweep_id = SweepId::new(row.try_get("sweep_id")?);
    let params: String = row.try_get("params")?;
    Ok(ClaimedJob {
        id: JobId::new(row.try_get("id")?),
        attempt: row.try_get("attempt")?,
        sweep_id,
        sweep: sweep_name(state, conn, sweep_id).await?,
        index: row.try_get::<i64, _>("idx")? as u64,
        params: serde_json::from_str(&params).map_err(anyhow::Error::from)?,
        command: row.try_get("command")?,
        config: row.try_get("config")?,
        resources: db::jobs::resources_of(row)?,
        timeout_secs: row.try_get::<Option<i64>, _>("timeout_secs")?.map(|secs| secs as u64),
        placement,
        lease_expires_at: row.try_get("lease_expires_at")?,
    })
}

async fn sweep_name(state: &AppState, conn: &mut sqlx::SqliteConnection, sweep_id: SweepId) -> ApiResult<String> {
    let cached = state.sweep_names.read().ok().and_then(|names| names.get(&sweep_id).cloned());
    if let Some(name) = cached {
        return Ok(name);
    }
    let name = db::sweeps::name_of(conn, sweep_id).await?;
    if let Ok(mut names) = state.sweep_names.write() {
        names.insert(sweep_id, name.clone());
    }
    Ok(name)
}
