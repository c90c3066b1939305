//! `/api/sweeps`: submit (expanded here, on the server, in one transaction), list, show, cancel.

use crate::db::{self, now_ms};
use crate::error::{ApiError, ApiQuery, ApiResult};
use crate::state::AppState;
use axum::extract::rejection::StringRejection;
use axum::extract::{Path, State};
use axum::response::AppendHeaders;
use axum::routing::{get, post};
use axum::{Json, Router};
use shared::api::{CancelResponse, JobPreview, SubmitQuery, SubmitResponse, SweepDetail, SweepInfo};
use shared::names::check_name;
use shared::sweep::{ExpandOptions, Sweep};

/// Jobs shown by a dry run.
const PREVIEW_JOBS: u64 = 10;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/sweeps", post(submit).get(list))
        .route("/api/sweeps/{sweep}", get(show))
        .route("/api/sweeps/{sweep}/cancel", post(cancel))
}

async fn submit(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<SubmitQuery>,
    body: Result<String, StringRejection>,
) -> ApiResult<(AppendHeaders<[(&'static str, String); 1]>, Json<SubmitResponse>)> {
    // Server-Timing tells clients (and the queue benchmark) how long the server itself took.
    let started = std::time::Instant::now();
    let timing =
        move || AppendHeaders([("server-timing", format!("submit;dur={:.3}", started.elapsed().as_secs_f64() * 1e3))]);
    let source = body?;
    let options = ExpandOptions {
        max_jobs: state.config.max_jobs_per_sweep,
        command: query.command.clone(),
        max_depth: state.config.max_yaml_depth,
    };
    let sweep = Sweep::parse(&source, &options).map_err(|error| ApiError::BadRequest(error.to_string()))?;
    let base_name = sweep.name.clone().or(query.name).unwrap_or_else(|| "sweep".into());
    check_name("sweep", &base_name).map_err(ApiError::BadRequest)?;
    // Adaptive sweeps have no jobs up front; until the sweep controller runs them, refuse
    // rather than record an empty sweep.
    if let Some(adaptive) = sweep.search.describe().filter(|_| !query.dry_run) {
        return Err(ApiError::BadRequest(format!("{adaptive}: adaptive search is not run by this server yet")));
    }
    if query.dry_run {
        let preview = sweep.jobs().take(PREVIEW_JOBS as usize).map(preview).collect::<Result<_, _>>()?;
        let response = SubmitResponse {
            sweep_id: None,
            name: base_name,
            form: sweep.form,
            count: sweep.count(),
            dry_run: true,
            preview,
        };
        return Ok((timing(), Json(response)));
    }
    let now = now_ms();
    let mut tx = state.db.writer.begin().await?;
    let name = db::sweeps::unique_name(&mut tx, &base_name).await?;
    let sweep_id = db::sweeps::insert(&mut tx, &name, &sweep, &source, now).await?;
    let inserted = db::sweeps::insert_jobs(&mut tx, sweep_id, &sweep, now).await?;
    tx.commit().await?;
    tracing::info!(sweep = %name, jobs = inserted, "sweep submitted");
    state.sweep_names.write().map_err(|_| anyhow::anyhow!("sweep name cache poisoned"))?.insert(sweep_id, name.clone());
    state.work_available.notify_waiters();
    let response = SubmitResponse {
        sweep_id: Some(sweep_id),
        name,
        form: sweep.form,
        count: inserted,
        dry_run: false,
        preview: Vec::new(),
    };
    Ok((timing(), Json(response)))
}

fn preview(job: shared::sweep::JobSpec) -> Result<JobPreview, ApiError> {
    let params =
        serde_json::from_str(&job.params).map_err(|error| anyhow::anyhow!("job params are not JSON: {error}"))?;
    Ok(JobPreview { index: job.index, params, command: job.command })
}

async fn list(State(state): State<AppState>) -> ApiResult<Json<Vec<SweepInfo>>> {
    Ok(Json(db::sweeps::list(&state.db.reader).await?))
}

pub async fn find(state: &AppState, key: &str) -> ApiResult<SweepDetail> {
    db::sweeps::find(&state.db.reader, key).await?.ok_or_else(|| ApiError::NotFound(format!("no sweep `{key}`")))
}

async fn show(State(state): State<AppState>, Path(key): Path<String>) -> ApiResult<Json<SweepDetail>> {
    Ok(Json(find(&state, &key).await?))
}

async fn cancel(State(state): State<AppState>, Path(key): Path<String>) -> ApiResult<Json<CancelResponse>> {
    let sweep = find(&state, &key).await?;
    let mut tx = state.db.writer.begin().await?;
    let (cancelled, cancel_requested) = db::jobs::cancel_sweep(&mut tx, sweep.info.id, now_ms()).await?;
    tx.commit().await?;
    tracing::info!(sweep = %sweep.info.name, cancelled, cancel_requested, "sweep cancelled");
    Ok(Json(CancelResponse { cancelled, cancel_requested }))
}
