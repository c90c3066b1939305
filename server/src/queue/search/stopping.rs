//! Early stopping: after a running attempt's metric points are stored, its history of the
//! sweep metric is judged against the other runs' by `shared::search::decide` (hyperband/ASHA
//! rungs, or the median rule), and a run below its rung's cutoff is cancelled through the
//! ordinary cancel path: flagged here, killed by its worker at its next heartbeat. The stop is
//! recorded in `early_stops`, which makes the cancelled job "stopped early", its reason the
//! decision's sentence (migrations/0006).
//!
//! Decisions are taken at the moment a report crosses a rung, and a batch may hold several
//! reports: each of the batch's points is judged with the history up to it, in order. The
//! histories are read after the batch is committed, from the reader pool, so the single writer
//! never waits for them; only a stop is a write. Points that carry no `step` count by their
//! position (the n-th report is step n), as W&B counts logged values.
//!
//! A finishing attempt's last points are not judged (it has ended; stopping it saves nothing);
//! they are stored and count as the others' history for later decisions.

use super::Controller;
use crate::db::{self, now_ms};
use crate::error::ApiResult;
use crate::queue::{Change, Queue};
use shared::api::{JobId, MetricPoint, StoppedEarly, SweepId};
use shared::job::JobStatus;
use shared::search::{decide, Decision, EarlyStop};
use shared::sweep::Goal;

impl Controller {
    /// Judges the attempt after its batch `points` was stored. Errors are logged, not
    /// returned: the batch itself is stored, and the next one is judged again.
    pub(in crate::queue) async fn after_metrics(
        &self,
        queue: &Queue,
        job: JobId,
        attempt: u32,
        sweep_id: SweepId,
        points: &[MetricPoint],
    ) {
        if let Err(error) = self.judge(queue, job, attempt, sweep_id, points).await {
            tracing::warn!(%job, attempt, %error, "deciding whether to stop a run early");
        }
    }

    async fn judge(
        &self,
        queue: &Queue,
        job: JobId,
        attempt: u32,
        sweep_id: SweepId,
        points: &[MetricPoint],
    ) -> ApiResult<()> {
        let sweep = {
            let mut conn = queue.reader().acquire().await?;
            self.sweep(conn.conn(), sweep_id).await?
        };
        let Some(sweep) = sweep else { return Ok(()) };
        let (Some(rule), Some(metric)) = (&sweep.early_stop, &sweep.metric) else { return Ok(()) };
        let fresh = points.iter().filter(|point| point.name == metric.name).count();
        if fresh == 0 {
            return Ok(());
        }
        let own = by_step(&db::search::history_of(queue.reader(), job, attempt, &metric.name).await?);
        let judged = own.len().saturating_sub(fresh)..own.len();
        if !judged.clone().any(|at| needs_others(rule, &own[..=at])) {
            return Ok(());
        }
        // The median rule looks at the others up to this run's step only.
        let max_step = match rule {
            EarlyStop::Median { .. } => own.iter().map(|(step, _)| *step).max().map(|step| step as i64),
            EarlyStop::Rungs { .. } => None,
        };
        let others: Vec<Vec<(u64, f64)>> = db::search::histories(queue.reader(), sweep_id, &metric.name, max_step)
            .await?
            .iter()
            .filter(|(other, _)| *other != job)
            .map(|(_, points)| by_step(points))
            .collect();
        let others: Vec<&[(u64, f64)]> = others.iter().map(Vec::as_slice).collect();
        let maximize = metric.goal == Goal::Maximize;
        let stop = judged.into_iter().find_map(|at| match decide(rule, maximize, &others, &own[..=at]) {
            Decision::Stop { rung, cutoff, reason } => Some(StoppedEarly {
                rung,
                cutoff: Some(cutoff).filter(|cutoff| cutoff.is_finite()),
                reason,
                at: now_ms(),
            }),
            Decision::Keep => None,
        });
        if let Some(stop) = stop {
            stop_run(queue, job, attempt, stop).await?;
        }
        Ok(())
    }
}

/// Flags the attempt for its worker to kill and records why, if it still runs uncancelled.
async fn stop_run(queue: &Queue, job: JobId, attempt: u32, stop: StoppedEarly) -> ApiResult<()> {
    let reason = stop.reason.clone();
    let stopped = queue
        .write(move |tx| {
            Box::pin(async move {
                let Some(current) = db::jobs::state(tx.conn().await?, job).await? else { return Ok(false) };
                if current.status != JobStatus::Running || current.attempt != attempt || current.cancel_requested {
                    return Ok(false);
                }
                let attempt_of = shared::api::JobAttempt { job_id: job, attempt };
                if !db::jobs::request_cancel(tx.conn().await?, attempt_of).await? {
                    return Ok(false);
                }
                db::search::record_stop(tx.conn().await?, job, attempt, &stop).await?;
                db::jobs::add_note(tx.conn().await?, job, attempt, &stop.reason).await?;
                tx.note(Change::Job(job));
                Ok(true)
            })
        })
        .await?;
    if stopped {
        tracing::info!(%job, attempt, %reason, "run stopped early");
    }
    Ok(())
}

/// `(step, value)` for `decide`: a missing step is the report's position (from 1), a value
/// that is not a finite number is NaN (a failure to `decide`), a negative step is 0.
fn by_step(points: &db::search::Points) -> Vec<(u64, f64)> {
    points
        .iter()
        .enumerate()
        .map(|(position, (step, value))| {
            let step = step.map_or(position as u64 + 1, |step| step.max(0) as u64);
            (step, value.unwrap_or(f64::NAN))
        })
        .collect()
}

/// Whether the report that ends `history` asks for a decision: it crosses a rung, or (median
/// rule) it is past the warm-up. Saves reading every other run's history for the reports
/// between rungs, which no rung rule judges.
fn needs_others(rule: &EarlyStop, history: &[(u64, f64)]) -> bool {
    let Some(&(latest, _)) = history.last() else { return false };
    let before = history[..history.len() - 1].iter().map(|(step, _)| *step).max();
    match rule {
        EarlyStop::Rungs { rungs, .. } => {
            rungs.iter().any(|&rung| rung <= latest && before.is_none_or(|before| before < rung))
        }
        EarlyStop::Median { warmup_steps, .. } => latest >= *warmup_steps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::search::RungKind;

    fn rungs() -> EarlyStop {
        EarlyStop::Rungs { kind: RungKind::Hyperband, rungs: vec![2, 6], eta: 3.0 }
    }

    #[test]
    fn missing_steps_count_by_position_and_bad_values_become_nan() {
        let points = vec![(None, Some(0.5)), (None, None), (Some(7), Some(0.1)), (Some(-3), Some(0.2))];
        let steps = by_step(&points);
        assert_eq!(steps.iter().map(|(step, _)| *step).collect::<Vec<_>>(), [1, 2, 7, 0]);
        assert!(steps[1].1.is_nan());
    }

    #[test]
    fn only_reports_that_cross_a_rung_need_the_others() {
        assert!(!needs_others(&rungs(), &[(1, 0.0)]));
        assert!(needs_others(&rungs(), &[(1, 0.0), (2, 0.0)]));
        assert!(!needs_others(&rungs(), &[(1, 0.0), (2, 0.0), (3, 0.0)]));
        assert!(needs_others(&rungs(), &[(1, 0.0), (9, 0.0)]), "a report may jump past a rung");
        let median = EarlyStop::Median { warmup_steps: 3, min_runs: 2 };
        assert!(!needs_others(&median, &[(2, 0.0)]));
        assert!(needs_others(&median, &[(2, 0.0), (3, 0.0)]));
        assert!(!needs_others(&rungs(), &[]));
    }

    #[test]
    fn a_batch_of_several_reports_is_judged_at_the_rung_it_crossed() {
        // Two runs reached step 2 at 0.0; this run's batch holds steps 1 to 3. Judged only at
        // its last report (step 3), nothing would be crossed; at step 2 it is outside the best.
        let others = [vec![(1, 0.0), (2, 0.0)], vec![(1, 0.0), (2, 0.0)]];
        let others: Vec<&[(u64, f64)]> = others.iter().map(Vec::as_slice).collect();
        let own = [(1, 5.0), (2, 5.0), (3, 5.0)];
        assert_eq!(decide(&rungs(), false, &others, &own), Decision::Keep);
        let stops: Vec<u64> = (0..own.len())
            .filter(|&at| needs_others(&rungs(), &own[..=at]))
            .filter_map(|at| match decide(&rungs(), false, &others, &own[..=at]) {
                Decision::Stop { rung, .. } => Some(rung),
                Decision::Keep => None,
            })
            .collect();
        assert_eq!(stops, [2]);
    }
}
