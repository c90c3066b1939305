//! `GET /api/sweeps/{sweep}/summary`: a sweep's leaderboard (params and metrics of every run,
//! best first by the sweep's metric, with the direction each metric improves in) as JSON or,
//! with `format=csv`, as CSV.

use crate::db;
use crate::error::{ApiError, ApiPath, ApiQuery, ApiResult};
use crate::leaderboard;
use crate::state::AppState;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use shared::api::{Leaderboard, SummaryQuery, SummaryRow, SweepSummary};

pub fn router() -> Router<AppState> {
    Router::new().route("/api/sweeps/{sweep}/summary", get(summary))
}

async fn summary(
    State(state): State<AppState>,
    ApiPath(key): ApiPath<String>,
    ApiQuery(query): ApiQuery<SummaryQuery>,
) -> ApiResult<Response> {
    let csv = match query.format.as_deref() {
        None | Some("json") => false,
        Some("csv") => true,
        Some(other) => return Err(ApiError::BadRequest(format!("unknown format `{other}`; use `json` or `csv`"))),
    };
    let sweep = state.queue.find_sweep(&key).await?.info;
    let mut stopped = db::search::stopped_in_sweep(state.queue.reader(), sweep.id).await?;
    // A top's ranked places come from runs not cancelled; the runs stopped early (cancelled)
    // are read after them by `sweep_top_jobs` itself.
    let (jobs, mut summaries) = match query.top {
        Some(top) => db::metrics::sweep_top_jobs(state.queue.reader(), sweep.id, sweep.metric.as_ref(), top).await?,
        None => db::metrics::sweep_jobs(state.queue.reader(), sweep.id).await?,
    };
    let ids: Vec<_> = jobs.iter().map(|job| job.id).collect();
    let mut usage = db::gpu::usage_of(state.queue.reader(), &ids).await?;
    let rows = jobs
        .into_iter()
        .map(|job| {
            Ok(SummaryRow {
                rank: None,
                job_id: job.id,
                index: job.index,
                status: job.status,
                params: serde_json::from_str(&job.params)?,
                metrics: summaries.remove(&job.id).unwrap_or_default(),
                score: None,
                stopped_early: stopped.remove(&job.id),
                gpu_usage: usage.remove(&job.id),
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let rows = leaderboard::rank(rows, sweep.metric.as_ref(), query.top);
    let summary = SweepSummary { sweep: sweep.name, metric: sweep.metric, rows };
    if csv {
        let body = leaderboard::to_csv(&summary);
        return Ok(([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], body).into_response());
    }
    let directions = leaderboard::directions(&summary.rows, summary.metric.as_ref());
    Ok(Json(Leaderboard { summary, directions }).into_response())
}
