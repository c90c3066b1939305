//! `/api/jobs`: list and show jobs, their history; cancel, retry, reprioritise; and the
//! worker's report of a finished attempt.

use super::session_worker::SessionWorker;
use crate::auth::Caller;
use crate::db::{self, job_pages::JobFilter};
use crate::error::{ApiError, ApiJson, ApiPath, ApiQuery, ApiResult};
use crate::queue::Queue;
use crate::state::AppState;
use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use shared::api::{
    AttemptInfo, BulkCancelRequest, BulkCancelResponse, CancelResponse, Job, JobEvent, JobId, JobPage, JobQuery,
    PreemptResponse, PriorityRequest, ReportRequest, ReportResponse,
};

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
        .route("/api/jobs/{id}/preempt", post(preempt))
        .route("/api/jobs/{id}/priority", post(priority))
        .route("/api/jobs/{id}/report", post(report))
}

async fn list(State(state): State<AppState>, ApiQuery(query): ApiQuery<JobQuery>) -> ApiResult<Json<JobPage>> {
    let queue = &state.queue;
    let mut filter = JobFilter { status: query.status, owner: query.owner.clone(), ..JobFilter::default() };
    if let Some(key) = &query.sweep {
        filter.sweep_id = Some(queue.find_sweep(key).await?.info.id);
    }
    if let Some(name) = &query.worker {
        let id = db::workers::id_by_name(queue.reader(), name).await?;
        filter.worker_id = Some(id.ok_or_else(|| ApiError::NotFound(format!("no worker `{name}`")))?);
    }
    let limit = query.limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE);
    let order = (query.sort.unwrap_or_default(), query.order.unwrap_or_default());
    // SQLite counts in signed 64 bits: an offset past that is past every row.
    let Ok(offset) = i64::try_from(query.offset.unwrap_or(0)) else {
        let total = db::job_pages::list(queue.reader(), &filter, order, 1, 0).await?.total;
        return Ok(Json(JobPage { total, jobs: Vec::new() }));
    };
    let mut page = db::job_pages::list(queue.reader(), &filter, order, limit, offset as u64).await?;
    queue.explain_waiting(&mut page.jobs, query.positions).await?;
    Ok(Json(page))
}

async fn job(queue: &Queue, id: JobId) -> ApiResult<Job> {
    db::job_pages::get(queue.reader(), id).await?.ok_or_else(|| crate::queue::no_job(id))
}

async fn show(State(state): State<AppState>, ApiPath(id): ApiPath<JobId>) -> ApiResult<Json<Job>> {
    let mut job = job(&state.queue, id).await?;
    state.queue.explain_waiting(std::slice::from_mut(&mut job), true).await?;
    Ok(Json(job))
}

async fn events(State(state): State<AppState>, ApiPath(id): ApiPath<JobId>) -> ApiResult<Json<Vec<JobEvent>>> {
    job(&state.queue, id).await?;
    Ok(Json(db::events::list(state.queue.reader(), id).await?))
}

async fn attempts(State(state): State<AppState>, ApiPath(id): ApiPath<JobId>) -> ApiResult<Json<Vec<AttemptInfo>>> {
    job(&state.queue, id).await?;
    Ok(Json(shared::history::attempts(&db::events::list(state.queue.reader(), id).await?)))
}

async fn cancel(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<JobId>,
) -> ApiResult<Json<CancelResponse>> {
    Ok(Json(state.queue.cancel_job(&caller, id).await?))
}

async fn preempt(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<JobId>,
) -> ApiResult<Json<PreemptResponse>> {
    Ok(Json(state.queue.preempt_job(&caller, id).await?))
}

/// Cancels every listed job that is queued or running, in one transaction; the others are
/// named in `skipped` and left as they were.
async fn cancel_many(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(request): ApiJson<BulkCancelRequest>,
) -> ApiResult<Json<BulkCancelResponse>> {
    Ok(Json(state.queue.cancel_jobs(&caller, request.ids).await?))
}

async fn retry(State(state): State<AppState>, caller: Caller, ApiPath(id): ApiPath<JobId>) -> ApiResult<Json<Job>> {
    state.queue.retry_job(&caller, id).await?;
    Ok(Json(job(&state.queue, id).await?))
}

async fn priority(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<JobId>,
    ApiJson(request): ApiJson<PriorityRequest>,
) -> ApiResult<Json<Job>> {
    state.queue.set_priority(&caller, id, request.priority).await?;
    Ok(Json(job(&state.queue, id).await?))
}

async fn report(
    State(state): State<AppState>,
    session: SessionWorker,
    ApiPath(id): ApiPath<JobId>,
    ApiJson(request): ApiJson<ReportRequest>,
) -> ApiResult<Json<ReportResponse>> {
    let worker = session.check(request.worker_id)?;
    let status = state.queue.report(id, worker, request.attempt, request.outcome).await?;
    Ok(Json(ReportResponse { status }))
}
