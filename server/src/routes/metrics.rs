//! `/api/jobs/{id}/metrics`: workers send batches of metric points ([`shared::api::MetricsBatch`],
//! fenced, idempotent by metrics-file offset); readers get the latest attempt's series.

use super::fence;
use crate::db;
use crate::error::{ApiError, ApiJson, ApiPath, ApiResult};
use crate::state::AppState;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use shared::api::{JobId, MetricPoint, MetricSeries, MetricSummary, MetricsAck, WorkerId};
use std::collections::BTreeMap;

/// Longest metric name kept; names become CSV columns and map keys.
const MAX_NAME_BYTES: usize = 200;

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
    let named = !point.name.trim().is_empty() && point.name.len() <= MAX_NAME_BYTES;
    named.then_some(MetricPoint { step: point.step, name: point.name, value })
}

/// Last, min, max, step and count of each metric over `points`, in order.
fn summarize(points: &[MetricPoint]) -> BTreeMap<String, MetricSummary> {
    let mut summaries: BTreeMap<String, MetricSummary> = BTreeMap::new();
    for point in points {
        summaries
            .entry(point.name.clone())
            .and_modify(|summary| {
                summary.last = point.value;
                summary.step = point.step;
                summary.min = summary.min.min(point.value);
                summary.max = summary.max.max(point.value);
                summary.count += 1;
            })
            .or_insert(MetricSummary {
                last: point.value,
                min: point.value,
                max: point.value,
                step: point.step,
                count: 1,
            });
    }
    summaries
}

async fn record(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<JobId>,
    ApiJson(batch): ApiJson<IncomingBatch>,
) -> ApiResult<Json<MetricsAck>> {
    let points: Vec<MetricPoint> = batch.points.into_iter().filter_map(usable).collect();
    let summaries = summarize(&points);
    let mut tx = state.db.writer.begin().await?;
    fence::holder(&mut tx, id, batch.attempt, batch.worker_id, "metrics batch").await?;
    let (stored_offset, stored_points) = db::metrics::progress(&mut tx, id, batch.attempt).await?;
    // The offset is where the batch ends in the metrics file: one at or before what is stored
    // is a retry of a batch already kept.
    if batch.offset <= stored_offset {
        return Ok(Json(MetricsAck { offset: stored_offset }));
    }
    db::metrics::append(&mut tx, id, batch.attempt, stored_points, &points).await?;
    db::metrics::merge_summaries(&mut tx, id, batch.attempt, &summaries).await?;
    db::metrics::set_progress(&mut tx, id, batch.attempt, batch.offset, stored_points + points.len() as u64).await?;
    tx.commit().await?;
    Ok(Json(MetricsAck { offset: batch.offset }))
}

async fn series(State(state): State<AppState>, ApiPath(id): ApiPath<JobId>) -> ApiResult<Json<Vec<MetricSeries>>> {
    let job = db::jobs::state(&mut *state.db.reader.acquire().await?, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no job {id}")))?;
    Ok(Json(db::metrics::series(&state.db.reader, id, job.attempt).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(step: Option<i64>, name: &str, value: f64) -> MetricPoint {
        MetricPoint { step, name: name.into(), value }
    }

    #[test]
    fn summaries_keep_the_last_the_extremes_and_the_count() {
        let points = [point(Some(1), "loss", 0.5), point(Some(1), "acc", 0.7), point(Some(2), "loss", 0.9)];
        let summaries = summarize(&points);
        assert_eq!(summaries["loss"], MetricSummary { last: 0.9, min: 0.5, max: 0.9, step: Some(2), count: 2 });
        assert_eq!(summaries["acc"].count, 1);
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
