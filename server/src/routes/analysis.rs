//! The sweep page's analysis and the job page's GPU view: `GET /api/sweeps/{sweep}/analysis`
//! (parameter importance, best so far, finish estimate for one metric) and
//! `GET /api/jobs/{id}/gpu` (the readings of the GPUs an attempt held, while it held them).
//! Reads only; the decisions are the pure functions of `leaderboard`.

use crate::db::{self, now_ms};
use crate::error::{ApiError, ApiPath, ApiQuery, ApiResult};
use crate::leaderboard::{self, importance, progress};
use crate::state::AppState;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use shared::api::{AnalysisQuery, JobGpuQuery, JobGpuUsage, JobId, SweepAnalysis};

pub fn router() -> Router<AppState> {
    Router::new().route("/api/sweeps/{sweep}/analysis", get(sweep_analysis)).route("/api/jobs/{id}/gpu", get(job_gpu))
}

async fn sweep_analysis(
    State(state): State<AppState>,
    ApiPath(key): ApiPath<String>,
    ApiQuery(query): ApiQuery<AnalysisQuery>,
) -> ApiResult<Json<SweepAnalysis>> {
    if query.metric.as_deref().is_some_and(|name| name.trim().is_empty()) {
        return Err(ApiError::BadRequest("`metric` is empty; leave it out for the sweep's own metric".into()));
    }
    let sweep = state.queue.find_sweep(&key).await?.info;
    let reader = state.queue.reader();
    let metric_name = match (&query.metric, &sweep.metric) {
        (Some(name), _) => Some(name.clone()),
        (None, Some(metric)) => Some(metric.name.clone()),
        (None, None) => db::analysis::most_reported_metric(reader, sweep.id).await?,
    };
    let pace = db::analysis::pace(reader, sweep.id).await?;
    let eta = progress::eta(&progress::Pace {
        queued: sweep.counts.queued,
        running_since: pace.running_since,
        finished: pace.finished,
        mean_run_ms: pace.mean_run_ms,
        now: now_ms(),
    });
    let mut analysis = SweepAnalysis {
        sweep: sweep.name,
        metric: None,
        importance_method: importance::METHOD.into(),
        importance: Vec::new(),
        runs_used: 0,
        best_so_far: Vec::new(),
        eta,
    };
    let Some(metric_name) = metric_name else { return Ok(Json(analysis)) };
    let direction = leaderboard::direction(&metric_name, sweep.metric.as_ref());
    let runs = db::analysis::runs_with_metric(reader, sweep.id, &metric_name).await?;
    // A run's value: its best when the metric's direction is known, else its last.
    let value_of = |values: &shared::api::MetricSummary| match direction.goal {
        Some(goal) => leaderboard::best_of(values, goal),
        None => values.last,
    };
    let scored: Vec<importance::Run> = runs
        .iter()
        .map(|run| importance::Run { params: importance::flatten(&run.params), value: value_of(&run.values) })
        .collect();
    analysis.runs_used = scored.iter().filter(|run| run.value.is_finite()).count() as u64;
    analysis.importance = importance::importance(&scored);
    if let Some(goal) = direction.goal {
        let finished = runs
            .iter()
            .filter(|run| run.status.is_terminal())
            .filter_map(|run| {
                Some(progress::Finished {
                    job_id: run.job_id,
                    finished_at: run.finished_at?,
                    value: value_of(&run.values),
                })
            })
            .collect();
        analysis.best_so_far = progress::best_so_far(finished, goal);
    }
    analysis.metric = Some(direction);
    Ok(Json(analysis))
}

async fn job_gpu(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<JobId>,
    ApiQuery(query): ApiQuery<JobGpuQuery>,
) -> ApiResult<Json<JobGpuUsage>> {
    let reader = state.queue.reader();
    let job = db::job_pages::get(reader, id).await?.ok_or_else(|| ApiError::NotFound(format!("no job {id}")))?;
    let attempts = shared::history::attempts(&db::events::list(reader, id).await?);
    let attempt = match query.attempt {
        Some(number) => attempts.iter().rev().find(|attempt| attempt.attempt == number),
        None => attempts.last(),
    };
    let Some(attempt) = attempt else {
        return Err(ApiError::NotFound(match query.attempt {
            Some(number) => format!("job {id} has no attempt {number} that started"),
            None => format!("job {id} has not started yet"),
        }));
    };
    let to = attempt.ended_at.unwrap_or_else(now_ms);
    let mut usage = JobGpuUsage {
        job_id: id,
        attempt: attempt.attempt,
        worker: attempt.worker.clone(),
        gpus: attempt.gpus.clone(),
        from: attempt.started_at,
        to: attempt.ended_at,
        gpu_memory: job.resources.gpu_memory,
        samples: Vec::new(),
        shared_with: Vec::new(),
        retention_ms: state.config.telemetry_retention.as_millis() as u64,
        usage: None,
        timeline: Vec::new(),
    };
    if let Some((accounted, timeline)) = db::gpu::attempt_usage(reader, id, attempt.attempt).await? {
        usage.usage = Some(accounted);
        usage.timeline = timeline;
    }
    let worker = match &attempt.worker {
        Some(name) if !attempt.gpus.is_empty() => db::workers::id_by_name(reader, name).await?,
        _ => None,
    };
    if let Some(worker) = worker {
        usage.samples = db::analysis::gpu_readings(reader, worker, &attempt.gpus, attempt.started_at, to).await?;
        usage.shared_with =
            db::analysis::gpu_neighbours(reader, id, worker, &attempt.gpus, attempt.started_at, to).await?;
    }
    Ok(Json(usage))
}
