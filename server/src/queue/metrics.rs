//! Metric points of a running attempt, in batches that are idempotent by metrics-file offset.

use super::{Change, Queue, Tx};
use crate::db;
use crate::error::ApiResult;
use shared::api::{JobId, MetricPoint, MetricSummary, SweepId, WorkerId};
use std::collections::BTreeMap;

/// Last, min, max, step and count of each metric over `points`, in order.
pub(super) fn summarize(points: &[MetricPoint]) -> BTreeMap<String, MetricSummary> {
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

/// What [`record`] did: the metrics-file offset now stored up to, the job's sweep, and
/// whether the batch was new.
pub(super) struct Stored {
    pub offset: u64,
    pub sweep_id: SweepId,
    pub fresh: bool,
}

/// Stores a batch in `tx` (fenced). The offset is where the batch ends in the file: one at or
/// before what is stored is a retry of a batch already kept.
pub(super) async fn record(
    tx: &mut Tx,
    job: JobId,
    attempt: u32,
    worker: WorkerId,
    offset: u64,
    points: &[MetricPoint],
) -> ApiResult<Stored> {
    let sweep_id = super::fence::holder(tx.conn().await?, job, attempt, worker, "metrics batch").await?.sweep_id;
    // What the routes' parsing lets through from an older worker or the finish's tail: a
    // point with an unusable name or value is dropped, never stored.
    let usable =
        |point: &MetricPoint| point.value.is_finite() && shared::metric_check::name_problem(&point.name).is_none();
    let kept: Vec<MetricPoint>;
    let points = if points.iter().all(usable) {
        points
    } else {
        kept = points.iter().filter(|point| usable(point)).cloned().collect();
        &kept[..]
    };
    let (stored_offset, stored_points) = db::metrics::progress(tx.conn().await?, job, attempt).await?;
    if offset <= stored_offset {
        return Ok(Stored { offset: stored_offset, sweep_id, fresh: false });
    }
    db::metrics::append(tx.conn().await?, job, attempt, stored_points, points).await?;
    db::metrics::merge_summaries(tx.conn().await?, job, attempt, &summarize(points)).await?;
    db::metrics::set_progress(tx.conn().await?, job, attempt, offset, stored_points + points.len() as u64).await?;
    if !points.is_empty() {
        tx.note(Change::Page);
    }
    Ok(Stored { offset, sweep_id, fresh: !points.is_empty() })
}

impl Queue {
    /// A worker's batch of metric points for a running attempt; then, for a sweep that stops
    /// runs early, whether this run should stop (queue/search).
    pub async fn record_metrics(
        &self,
        job: JobId,
        attempt: u32,
        worker: WorkerId,
        offset: u64,
        points: Vec<MetricPoint>,
    ) -> ApiResult<u64> {
        let points = std::sync::Arc::new(points);
        let batch = points.clone();
        let stored = self
            .write(move |tx| Box::pin(async move { record(tx, job, attempt, worker, offset, &batch).await }))
            .await?;
        if stored.fresh {
            self.search.after_metrics(self, job, attempt, stored.sweep_id, &points).await;
        }
        Ok(stored.offset)
    }
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
}
