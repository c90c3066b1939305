//! `/api/jobs`: list and show jobs, their history; cancel, retry, reprioritise; and the
//! worker's report of a finished attempt, fenced by `(job, attempt, worker)`.

use crate::db::jobs::{JobFilter, JobState};
use crate::db::{self, now_ms};
use crate::error::{ApiError, ApiJson, ApiQuery, ApiResult};
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use shared::api::{
    AttemptInfo, BulkCancelRequest, BulkCancelResponse, CancelResponse, Job, JobAttempt, JobEvent, JobId, JobPage,
    JobQuery, PriorityRequest, ReportRequest, ReportResponse,
};
use shared::job::{self, CancelEffect, JobStatus};

const DEFAULT_PAGE: u32 = 100;
const MAX_PAGE: u32 = 1_000;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/jobs", get(list))
        .route("/api/jobs/{id}", get(show))
        .route("/api/jobs/cancel", post(cancel_many))
        .route("/api/jobs/{id}/events", get(events))
        .route("/api/jobs/{id}/attempts", get(attempts))
        .route("/api/jobs/{id}/cancel", post(cancel))
        .route("/api/jobs/{id}/retry", post(retry))
        .route("/api/jobs/{id}/priority", post(priority))
        .route("/api/jobs/{id}/report", post(report))
}

async fn list(State(state): State<AppState>, ApiQuery(query): ApiQuery<JobQuery>) -> ApiResult<Json<JobPage>> {
    let mut filter = JobFilter { status: query.status, ..JobFilter::default() };
    if let Some(key) = &query.sweep {
        filter.sweep_id = Some(super::sweeps::find(&state, key).await?.info.id);
    }
    if let Some(name) = &query.worker {
        let id = db::workers::id_by_name(&state.db.reader, name).await?;
        filter.worker_id = Some(id.ok_or_else(|| ApiError::NotFound(format!("no worker `{name}`")))?);
    }
    let limit = query.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE);
    let order = (query.sort.unwrap_or_default(), query.order.unwrap_or_default());
    Ok(Json(db::jobs::list(&state.db.reader, &filter, order, limit, query.offset.unwrap_or(0)).await?))
}

fn no_job(id: JobId) -> ApiError {
    ApiError::NotFound(format!("no job {id}"))
}

async fn show(State(state): State<AppState>, Path(id): Path<JobId>) -> ApiResult<Json<Job>> {
    Ok(Json(db::jobs::get(&state.db.reader, id).await?.ok_or_else(|| no_job(id))?))
}

async fn events(State(state): State<AppState>, Path(id): Path<JobId>) -> ApiResult<Json<Vec<JobEvent>>> {
    db::jobs::get(&state.db.reader, id).await?.ok_or_else(|| no_job(id))?;
    Ok(Json(db::events::list(&state.db.reader, id).await?))
}

async fn attempts(State(state): State<AppState>, Path(id): Path<JobId>) -> ApiResult<Json<Vec<AttemptInfo>>> {
    db::jobs::get(&state.db.reader, id).await?.ok_or_else(|| no_job(id))?;
    Ok(Json(shared::history::attempts(&db::events::list(&state.db.reader, id).await?)))
}

async fn state_of(conn: &mut sqlx::SqliteConnection, id: JobId) -> ApiResult<JobState> {
    db::jobs::state(conn, id).await?.ok_or_else(|| no_job(id))
}

fn raced(id: JobId) -> ApiError {
    ApiError::Conflict(format!("job {id} changed while this request ran; try again"))
}

async fn cancel(State(state): State<AppState>, Path(id): Path<JobId>) -> ApiResult<Json<CancelResponse>> {
    let mut tx = state.db.writer.begin().await?;
    let current = state_of(&mut tx, id).await?;
    let mut response = CancelResponse::default();
    match job::cancel(current.status) {
        CancelEffect::Now => {
            db::jobs::cancel_queued(&mut tx, id, now_ms()).await?.then_some(()).ok_or_else(|| raced(id))?;
            response.cancelled = 1;
        }
        CancelEffect::Requested => {
            let attempt = JobAttempt { job_id: id, attempt: current.attempt };
            db::jobs::request_cancel(&mut tx, attempt).await?.then_some(()).ok_or_else(|| raced(id))?;
            response.cancel_requested = 1;
        }
        CancelEffect::Refused => {
            return Err(ApiError::Conflict(format!(
                "job {id} is {}; only queued or running jobs can be cancelled",
                current.status
            )))
        }
    }
    tx.commit().await?;
    Ok(Json(response))
}

/// Cancels every listed job that is queued or running, in one transaction; the others are
/// named in `skipped` and left as they were.
async fn cancel_many(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<BulkCancelRequest>,
) -> ApiResult<Json<BulkCancelResponse>> {
    if request.ids.len() > MAX_PAGE as usize {
        return Err(ApiError::BadRequest(format!(
            "{} ids in one cancel; at most {MAX_PAGE} (cancel a whole sweep with POST /api/sweeps/{{sweep}}/cancel)",
            request.ids.len()
        )));
    }
    let mut tx = state.db.writer.begin().await?;
    let (cancelled, requested) = db::jobs::cancel_many(&mut tx, &request.ids, now_ms()).await?;
    tx.commit().await?;
    let done: std::collections::HashSet<JobId> = cancelled.iter().chain(&requested).copied().collect();
    let mut skipped: Vec<JobId> = request.ids.iter().copied().filter(|id| !done.contains(id)).collect();
    skipped.sort_unstable();
    skipped.dedup();
    Ok(Json(BulkCancelResponse {
        cancelled: cancelled.len() as u64,
        cancel_requested: requested.len() as u64,
        skipped,
    }))
}

async fn retry(State(state): State<AppState>, Path(id): Path<JobId>) -> ApiResult<Json<Job>> {
    let mut tx = state.db.writer.begin().await?;
    let current = state_of(&mut tx, id).await?;
    if !job::can_retry(current.status) {
        return Err(ApiError::Conflict(format!(
            "job {id} is {}; only failed or cancelled jobs can be retried",
            current.status
        )));
    }
    db::jobs::retry(&mut tx, id, current.status).await?.then_some(()).ok_or_else(|| raced(id))?;
    tx.commit().await?;
    state.work_available.notify_waiters();
    show(State(state), Path(id)).await
}

async fn priority(
    State(state): State<AppState>,
    Path(id): Path<JobId>,
    ApiJson(request): ApiJson<PriorityRequest>,
) -> ApiResult<Json<Job>> {
    let mut tx = state.db.writer.begin().await?;
    let current = state_of(&mut tx, id).await?;
    if !job::can_change_priority(current.status) {
        return Err(ApiError::Conflict(format!("job {id} is {}; its priority no longer matters", current.status)));
    }
    db::jobs::set_priority(&mut tx, id, current.status, request.priority)
        .await?
        .then_some(())
        .ok_or_else(|| raced(id))?;
    tx.commit().await?;
    show(State(state), Path(id)).await
}

async fn report(
    State(state): State<AppState>,
    Path(id): Path<JobId>,
    ApiJson(request): ApiJson<ReportRequest>,
) -> ApiResult<Json<ReportResponse>> {
    // Reports are the hot path: decide on a read from the reader pool, then apply with one
    // UPDATE guarded by everything the decision used. If the job changed in between (a cancel
    // arrived), the guard fails, nothing changes, and the decision is made again.
    let succeeded = job::finish(&request.outcome, 0, false);
    if succeeded.status == JobStatus::Succeeded {
        // A success changes neither retries nor depends on them; only a pending cancel would
        // change the decision, and the guard checks for it.
        let attempt = JobAttempt { job_id: id, attempt: request.attempt };
        let mut writer = state.db.writer.acquire().await?;
        if db::jobs::succeed(&mut writer, attempt, request.worker_id, &succeeded, now_ms()).await? {
            drop(writer);
            state.job_signals.wake(id);
            return Ok(Json(ReportResponse { status: succeeded.status }));
        }
    }
    let mut tries = 0;
    let decision = loop {
        tries += 1;
        let current = state_of(&mut *state.db.reader.acquire().await?, id).await?;
        let holds = current.status == JobStatus::Running
            && current.attempt == request.attempt
            && current.worker_id == Some(request.worker_id);
        if !holds {
            return Err(ApiError::Conflict(format!(
                "stale report for job {id} attempt {}: the job is {} at attempt {}",
                request.attempt, current.status, current.attempt
            )));
        }
        let decision = job::finish(&request.outcome, current.retries_left, current.cancel_requested);
        let mut writer = state.db.writer.acquire().await?;
        if db::jobs::finish(&mut writer, &current, request.worker_id, &decision, now_ms()).await? {
            break decision;
        }
        if tries >= 5 {
            return Err(raced(id));
        }
    };
    if decision.status == JobStatus::Queued {
        state.work_available.notify_waiters();
    }
    // Followers of the attempt's log learn it ended.
    state.job_signals.wake(id);
    tracing::debug!(job = %id, attempt = request.attempt, status = %decision.status, "attempt finished");
    Ok(Json(ReportResponse { status: decision.status }))
}
