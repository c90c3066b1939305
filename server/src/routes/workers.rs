//! `/api/workers`: register, claim (long-poll), heartbeat (which also stores GPU telemetry),
//! list.

use crate::db::{self, now_ms};
use crate::error::{ApiError, ApiJson, ApiResult};
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::routing::post;
use axum::{Json, Router};
use shared::api::{
    ClaimRequest, ClaimResponse, HeartbeatRequest, HeartbeatResponse, JobAttempt, RegisterRequest, RegisterResponse,
    WorkerId, WorkerInfo,
};
use shared::job;
use shared::names::check_name;
use std::collections::HashSet;
use std::time::Duration;
use tokio::time::Instant;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/workers", post(register).get(list))
        .route("/api/workers/{id}/claim", post(claim))
        .route("/api/workers/{id}/heartbeat", post(heartbeat))
}

fn lease_until(state: &AppState, now: i64) -> i64 {
    now + state.config.lease.as_millis() as i64
}

fn unknown_worker(id: WorkerId) -> ApiError {
    ApiError::NotFound(format!("no worker {id}; register first"))
}

async fn register(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<RegisterRequest>,
) -> ApiResult<Json<RegisterResponse>> {
    check_name("worker", &request.name).map_err(ApiError::BadRequest)?;
    request.capacity.check().map_err(ApiError::BadRequest)?;
    if request.protocol != shared::PROTOCOL_VERSION {
        return Err(ApiError::BadRequest(format!(
            "worker speaks protocol {} but this server speaks {}; run the same app version on both",
            request.protocol,
            shared::PROTOCOL_VERSION
        )));
    }
    let now = now_ms();
    let holding: HashSet<JobAttempt> = request.holding.iter().copied().collect();
    let mut tx = state.db.writer.begin().await?;
    let worker_id = db::workers::upsert(&mut tx, &request.name, &request.capacity, now).await?;
    let mut requeued = Vec::new();
    let mut ended = Vec::new();
    let mut still_held = Vec::new();
    for held in db::jobs::running_on(&mut tx, worker_id).await? {
        let attempt = JobAttempt { job_id: held.id, attempt: held.attempt };
        if holding.contains(&attempt) {
            still_held.push(attempt);
            continue;
        }
        // The worker came back without this job: its box restarted, the job died with it.
        let decision = job::lease_expired(held.crash_count, state.config.max_crashes, held.cancel_requested);
        if db::jobs::expire(&mut tx, attempt, &decision, now).await? {
            ended.push(held.id);
            if decision.status == job::JobStatus::Queued {
                requeued.push(held.id);
            }
        }
    }
    db::jobs::extend_leases(&mut tx, worker_id, &still_held, lease_until(&state, now)).await?;
    tx.commit().await?;
    for id in ended {
        state.job_signals.wake(id);
    }
    if !requeued.is_empty() {
        tracing::warn!(worker = %request.name, jobs = ?requeued, "worker re-registered without its jobs; requeued them");
        state.work_available.notify_waiters();
    }
    tracing::info!(worker = %request.name, id = %worker_id, "worker registered");
    Ok(Json(RegisterResponse {
        worker_id,
        lease_ms: state.config.lease.as_millis() as u64,
        heartbeat_ms: state.config.heartbeat.as_millis() as u64,
        requeued,
    }))
}

async fn list(State(state): State<AppState>) -> ApiResult<Json<Vec<WorkerInfo>>> {
    Ok(Json(list_workers(&state).await?))
}

/// Every worker, with its state judged by this server's heartbeat interval and lease.
pub async fn list_workers(state: &AppState) -> anyhow::Result<Vec<WorkerInfo>> {
    let (heartbeat, lease) = (state.config.heartbeat.as_millis() as u64, state.config.lease.as_millis() as u64);
    db::workers::list(&state.db.reader, db::now_ms(), heartbeat, lease).await
}

async fn heartbeat(
    State(state): State<AppState>,
    Path(id): Path<WorkerId>,
    ApiJson(request): ApiJson<HeartbeatRequest>,
) -> ApiResult<Json<HeartbeatResponse>> {
    let now = now_ms();
    let lease_expires_at = lease_until(&state, now);
    // Single-statement writes: no transaction needed, and none is paid for.
    let mut writer = state.db.writer.acquire().await?;
    if !db::workers::touch(&mut writer, id, now).await? {
        return Err(unknown_worker(id));
    }
    let held = db::jobs::extend_leases(&mut writer, id, &request.running, lease_expires_at).await?;
    if !request.gpus.is_empty() {
        db::telemetry::insert(&mut writer, id, now, &request.gpus).await?;
    }
    drop(writer);
    let known: HashSet<JobAttempt> = held.iter().map(|(attempt, _)| *attempt).collect();
    Ok(Json(HeartbeatResponse {
        cancel: held.iter().filter(|(_, cancel)| *cancel).map(|(attempt, _)| *attempt).collect(),
        unknown: request.running.iter().filter(|attempt| !known.contains(attempt)).copied().collect(),
        lease_expires_at,
    }))
}

/// Hands out the jobs that fit the worker's capacity, waiting up to `wait_ms` for one.
async fn claim(
    State(state): State<AppState>,
    Path(id): Path<WorkerId>,
    ApiJson(request): ApiJson<ClaimRequest>,
) -> ApiResult<Json<ClaimResponse>> {
    request.capacity.check().map_err(ApiError::BadRequest)?;
    let wait = Duration::from_millis(request.wait_ms).min(state.config.max_long_poll);
    let deadline = Instant::now() + wait;
    let mut shutting_down = state.shutting_down.clone();
    loop {
        // Listen before looking, so a job submitted between the look and the wait still wakes us.
        let notified = state.work_available.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        ensure_known(&state, id).await?;
        let jobs = crate::dispatch::claim(&state, id, request.capacity.clone()).await?;
        if !jobs.is_empty() || Instant::now() >= deadline || request.capacity.job_slots == 0 {
            return Ok(Json(ClaimResponse { jobs }));
        }
        tokio::select! {
            _ = &mut notified => {}
            _ = tokio::time::sleep_until(deadline) => {}
            _ = shutting_down.wait_for(|stop| *stop) => return Err(ApiError::ShuttingDown),
        }
    }
}

/// Workers are never deleted, so a worker seen once is known for good.
async fn ensure_known(state: &AppState, worker_id: WorkerId) -> ApiResult<()> {
    if state.known_workers.read().is_ok_and(|known| known.contains(&worker_id)) {
        return Ok(());
    }
    if !db::workers::exists(&state.db.reader, worker_id).await? {
        return Err(unknown_worker(worker_id));
    }
    if let Ok(mut known) = state.known_workers.write() {
        known.insert(worker_id);
    }
    Ok(())
}
