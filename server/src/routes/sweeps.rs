//! `/api/sweeps`: submit (expanded here, on the server, in one transaction, owned by the
//! caller), list (all, or one owner's), show, cancel, resume (a sweep its failing runs paused),
//! and move to another priority class.

use crate::auth::Caller;
use crate::db;
use crate::error::{ApiError, ApiJson, ApiPath, ApiQuery, ApiResult};
use crate::queue;
use crate::state::AppState;
use axum::extract::rejection::StringRejection;
use axum::extract::State;
use axum::response::AppendHeaders;
use axum::routing::{get, post};
use axum::{Json, Router};
use shared::api::{
    CancelResponse, JobPreview, ResumeResponse, SearchPlan, SetClassRequest, SetClassResponse, SubmitQuery,
    SubmitResponse, SweepDetail, SweepInfo, SweepQuery,
};
use shared::names::check_sweep_name;
use std::sync::Arc;

/// Jobs shown by a dry run.
const PREVIEW_JOBS: u64 = 10;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/sweeps", post(submit).get(list))
        .route("/api/sweeps/{sweep}", get(show))
        .route("/api/sweeps/{sweep}/cancel", post(cancel))
        .route("/api/sweeps/{sweep}/resume", post(resume))
        .route("/api/sweeps/{sweep}/class", post(set_class))
}

async fn submit(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<SubmitQuery>,
    body: Result<String, StringRejection>,
) -> ApiResult<(AppendHeaders<[(&'static str, String); 1]>, Json<SubmitResponse>)> {
    // Server-Timing tells clients (and the queue benchmark) how long the server itself took.
    let started = std::time::Instant::now();
    let timing =
        move || AppendHeaders([("server-timing", format!("submit;dur={:.3}", started.elapsed().as_secs_f64() * 1e3))]);
    let source = Arc::new(body?);
    let sweep = state.queue.parse_sweep(source.clone(), query.command.clone()).await?;
    let base_name = sweep.name.clone().or(query.name.clone()).unwrap_or_else(|| "sweep".into());
    check_sweep_name(&base_name).map_err(ApiError::BadRequest)?;
    let class = state.queue.class_of(&sweep, &caller)?;
    let search = SearchPlan::of(&sweep);
    if query.dry_run {
        // An adaptive sweep shows its first runs: they are drawn before any result is in.
        let jobs: Vec<_> = if sweep.search.is_adaptive() {
            queue::search_preview(&sweep, PREVIEW_JOBS)
        } else {
            sweep.jobs().take(PREVIEW_JOBS as usize).collect()
        };
        let response = SubmitResponse {
            sweep_id: None,
            name: base_name,
            form: sweep.form,
            count: sweep.count(),
            dry_run: true,
            preview: jobs.into_iter().map(preview).collect::<Result<_, _>>()?,
            warnings: sweep.warnings.clone(),
            search,
        };
        return Ok((timing(), Json(response)));
    }
    let (form, warnings) = (sweep.form, sweep.warnings.clone());
    let workspace = state.queue.workspace_for(&sweep, &query).await?;
    let submitted = state.queue.submit(Arc::new(sweep), source, (base_name, caller.name, class), workspace).await?;
    let response = SubmitResponse {
        sweep_id: Some(submitted.sweep_id),
        name: submitted.name,
        form,
        count: submitted.count,
        dry_run: false,
        preview: Vec::new(),
        warnings,
        search,
    };
    Ok((timing(), Json(response)))
}

fn preview(job: shared::sweep::JobSpec) -> Result<JobPreview, ApiError> {
    let params =
        serde_json::from_str(&job.params).map_err(|error| anyhow::anyhow!("job params are not JSON: {error}"))?;
    Ok(JobPreview { index: job.index, params, command: job.command })
}

async fn list(State(state): State<AppState>, ApiQuery(query): ApiQuery<SweepQuery>) -> ApiResult<Json<Vec<SweepInfo>>> {
    let mut sweeps = db::sweeps::list(state.queue.reader(), query.owner.as_deref()).await?;
    state.queue.explain_quotas(&mut sweeps).await?;
    Ok(Json(sweeps))
}

async fn show(State(state): State<AppState>, ApiPath(key): ApiPath<String>) -> ApiResult<Json<SweepDetail>> {
    let mut sweep = state.queue.find_sweep(&key).await?;
    if sweep.info.counts.queued > 0 {
        sweep.unplaceable = state.queue.sweep_unplaceable(sweep.info.id).await?;
    }
    sweep.metric_missing = state.queue.metric_missing(&sweep.info).await?;
    state.queue.explain_quotas(std::slice::from_mut(&mut sweep.info)).await?;
    Ok(Json(sweep))
}

async fn cancel(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(key): ApiPath<String>,
) -> ApiResult<Json<CancelResponse>> {
    Ok(Json(state.queue.cancel_sweep(&caller, &key).await?))
}

async fn set_class(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(key): ApiPath<String>,
    ApiJson(request): ApiJson<SetClassRequest>,
) -> ApiResult<Json<SetClassResponse>> {
    Ok(Json(state.queue.set_class(&caller, &key, request.priority_class).await?))
}

async fn resume(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(key): ApiPath<String>,
) -> ApiResult<Json<ResumeResponse>> {
    Ok(Json(state.queue.resume_sweep(&caller, &key).await?))
}
