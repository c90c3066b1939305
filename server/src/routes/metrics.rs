//! `/api/jobs/{id}/metrics`: workers send batches of metric points ([`shared::api::MetricsBatch`],
//! fenced, idempotent by metrics-file offset); readers get the latest attempt's series.

use super::session_worker::SessionWorker;
use crate::db;
use crate::error::{ApiJson, ApiPath, ApiResult};
use crate::state::AppState;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use shared::api::{JobId, MetricPoint, MetricSeries, MetricsAck, WorkerId};

pub fn router() -> Router<AppState> {
    Router::new().route("/api/jobs/{id}/metrics", get(series).post(record))
}

/// [`MetricsBatch`] as it arrives. serde_json writes a NaN or an infinity as `null`, so a
/// value may be missing; such points are dropped rather than failing the whole batch.
#[derive(Debug, Deserialize)]
struct IncomingBatch {
    worker_id: WorkerId,
    attempt: u32,
    offset: u64,
    points: Vec<IncomingPoint>,
}

#[derive(Debug, Deserialize)]
struct IncomingPoint {
    step: Option<i64>,
    name: String,
    value: Option<f64>,
}

/// Points worth storing: a finite value and a usable name. Anything else is dropped rather
/// than refused, so one odd line in a metrics file cannot stall the worker's stream.
fn usable(point: IncomingPoint) -> Option<MetricPoint> {
    let value = point.value.filter(|value| value.is_finite())?;
    let named = shared::metric_check::name_problem(&point.name).is_none();
    named.then_some(MetricPoint { step: point.step, name: point.name, value })
}

async fn record(
    State(state): State<AppState>,
    session: SessionWorker,
    ApiPath(id): ApiPath<JobId>,
    ApiJson(batch): ApiJson<IncomingBatch>,
) -> ApiResult<Json<MetricsAck>> {
    let worker = session.check(batch.worker_id)?;
    let points: Vec<MetricPoint> = batch.points.into_iter().filter_map(usable).collect();
    let offset = state.queue.record_metrics(id, batch.attempt, worker, batch.offset, points).await?;
    Ok(Json(MetricsAck { offset }))
}

async fn series(State(state): State<AppState>, ApiPath(id): ApiPath<JobId>) -> ApiResult<Json<Vec<MetricSeries>>> {
    let reader = state.queue.reader();
    let job = db::jobs::state(reader.acquire().await?.conn(), id).await?.ok_or_else(|| crate::queue::no_job(id))?;
    Ok(Json(db::metrics::series(reader, id, job.attempt).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(step: Option<i64>, name: &str, value: f64) -> MetricPoint {
        MetricPoint { step, name: name.into(), value }
    }

    #[test]
    fn non_finite_or_missing_values_and_blank_names_are_not_kept() {
        let incoming = |name: &str, value: Option<f64>| IncomingPoint { step: None, name: name.into(), value };
        let long = "x".repeat(201);
        let kept: Vec<_> = [
            incoming("loss", None),
            incoming("loss", Some(f64::INFINITY)),
            incoming(" ", Some(1.0)),
            incoming(&long, Some(1.0)),
            incoming("loss", Some(1.0)),
        ]
        .into_iter()
        .filter_map(usable)
        .collect();
        assert_eq!(kept, [point(None, "loss", 1.0)]);
    }
}
