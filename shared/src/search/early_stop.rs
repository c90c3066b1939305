//! Whether a running trial should stop early, from the metric histories by step.
//!
//! Rung rules (W&B `early_terminate: hyperband`, native `early_stop: asha`): when a run
//! first reports at or past a rung's step, its best value up to that step is compared with the
//! best values up to that step of every other run that reached it. It goes on only if it is
//! within the best `1/eta` of them (Optuna's successive-halving rule: with fewer than `eta`
//! runs there, only the best goes on). The decision is taken at the crossing only, so a run
//! that passed a rung is never stopped at it later, and the function needs no memory of its
//! own: the same histories give the same answer.
//!
//! Median rule (native `early_stop: median`, Optuna's `MedianPruner`): after `warmup_steps`,
//! a run whose best value so far is worse than the median of the other runs' values at the
//! same step (their latest at or before it) stops, once at least `min_runs` others are there.

/// Which file key a rung rule came from (the rule is the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RungKind {
    /// W&B's `early_terminate: {type: hyperband}` brackets.
    Hyperband,
    /// Native `early_stop: {type: asha}`.
    Asha,
}

/// An early-stopping rule, validated.
#[derive(Debug, Clone, PartialEq)]
pub enum EarlyStop {
    /// Rungs at these steps (ascending, distinct, each at least 1), keeping the best `1/eta`.
    Rungs {
        kind: RungKind,
        rungs: Vec<u64>,
        eta: f64,
    },
    Median {
        warmup_steps: u64,
        min_runs: usize,
    },
}

/// What to do with a running trial.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Keep,
    /// Stop it: it fell below the cutoff at this rung (or step, for the median rule).
    Stop {
        rung: u64,
        cutoff: f64,
        reason: String,
    },
}

/// One run's metric history: `(step, value)` in report order. NaN and infinite values are
/// failures: they never make a run look good, and are left out of the competitors' values.
pub type History<'a> = &'a [(u64, f64)];

/// Decides for the run with history `run`; `others` are the histories of the sweep's other
/// runs (running, finished or stopped). `maximize` is the metric's goal.
pub fn decide(rule: &EarlyStop, maximize: bool, others: &[History<'_>], run: History<'_>) -> Decision {
    let Some(&(latest, _)) = run.iter().max_by_key(|(step, _)| *step) else { return Decision::Keep };
    let better = |a: f64, b: f64| if maximize { a > b } else { a < b };
    match rule {
        EarlyStop::Rungs { rungs, eta, .. } => {
            let previous = run.iter().map(|(step, _)| *step).filter(|step| *step < latest).max();
            // The rung crossed by the latest report, if any.
            let Some(&rung) = rungs.iter().rev().find(|&&rung| rung <= latest && previous.is_none_or(|p| p < rung))
            else {
                return Decision::Keep;
            };
            let Some(own) = at_rung(run, rung, maximize) else {
                return stop(rung, f64::NAN, "its metric is not a number".to_owned());
            };
            let mut values: Vec<f64> = others.iter().filter_map(|history| at_rung(history, rung, maximize)).collect();
            values.push(own);
            values.sort_by(|a, b| if maximize { b.total_cmp(a) } else { a.total_cmp(b) });
            let kept = ((values.len() as f64 / eta).floor() as usize).max(1);
            let cutoff = values[kept - 1];
            if better(cutoff, own) {
                let reason = format!(
                    "at step {rung} its best {own} is outside the best {kept} of {} runs there (cutoff {cutoff})",
                    values.len()
                );
                return stop(rung, cutoff, reason);
            }
            Decision::Keep
        }
        EarlyStop::Median { warmup_steps, min_runs } => {
            if latest < *warmup_steps {
                return Decision::Keep;
            }
            let Some(own) = best_up_to(run, latest, maximize) else {
                return stop(latest, f64::NAN, "its metric is not a number".to_owned());
            };
            let mut values: Vec<f64> = others.iter().filter_map(|history| latest_up_to(history, latest)).collect();
            if values.len() < (*min_runs).max(1) {
                return Decision::Keep;
            }
            values.sort_by(f64::total_cmp);
            let middle = values.len() / 2;
            let median =
                if values.len() % 2 == 1 { values[middle] } else { (values[middle - 1] + values[middle]) / 2.0 };
            if better(median, own) {
                let reason = format!(
                    "at step {latest} its best {own} is worse than the median {median} of {} other runs",
                    values.len()
                );
                return stop(latest, median, reason);
            }
            Decision::Keep
        }
    }
}

fn stop(rung: u64, cutoff: f64, reason: String) -> Decision {
    Decision::Stop { rung, cutoff, reason: format!("stopped early: {reason}") }
}

/// A run's value at a rung: its best up to its first report at or past the rung (reports
/// may skip steps); `None` when it has not reached the rung or has no finite value.
fn at_rung(history: History<'_>, rung: u64, maximize: bool) -> Option<f64> {
    let crossing = history.iter().map(|(step, _)| *step).filter(|step| *step >= rung).min()?;
    best_up_to(history, crossing, maximize)
}

/// The best finite value reported at or before `step`.
fn best_up_to(history: History<'_>, step: u64, maximize: bool) -> Option<f64> {
    let values = history.iter().filter(|(at, value)| *at <= step && value.is_finite()).map(|(_, value)| *value);
    if maximize {
        values.reduce(f64::max)
    } else {
        values.reduce(f64::min)
    }
}

/// The last finite value reported at or before `step`.
fn latest_up_to(history: History<'_>, step: u64) -> Option<f64> {
    history
        .iter()
        .filter(|(at, value)| *at <= step && value.is_finite())
        .max_by_key(|(at, _)| *at)
        .map(|(_, value)| *value)
}

/// W&B's brackets: from `min_iter`, `min_iter * eta^k` (the first `s` of them when `s` is
/// given, else up to `max_iter` or a large bound); from `max_iter` and `s`, `max_iter / eta^k`
/// for `k = 1..=s`. Steps are whole numbers, at least 1, ascending and distinct.
pub fn hyperband_rungs(min_iter: Option<u64>, max_iter: Option<u64>, s: Option<u64>, eta: f64) -> Vec<u64> {
    const MAX_RUNGS: usize = 64;
    let mut rungs: Vec<u64> = match (min_iter, max_iter) {
        (Some(min), max) => {
            let limit = max.unwrap_or(u64::MAX / 2) as f64;
            let count = s.map_or(MAX_RUNGS, |s| s as usize).min(MAX_RUNGS);
            (0..count)
                .map(|k| min as f64 * eta.powi(k as i32))
                .take_while(|step| *step <= limit)
                .map(|step| step.floor() as u64)
                .collect()
        }
        (None, Some(max)) => (1..=s.unwrap_or(1).min(MAX_RUNGS as u64))
            .map(|k| (max as f64 / eta.powi(k as i32)).floor() as u64)
            .collect(),
        (None, None) => Vec::new(),
    };
    rungs.retain(|step| *step >= 1);
    rungs.sort_unstable();
    rungs.dedup();
    rungs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rungs() -> EarlyStop {
        EarlyStop::Rungs { kind: RungKind::Asha, rungs: vec![1, 3, 9], eta: 3.0 }
    }

    #[test]
    fn brackets_follow_the_w_and_b_keys() {
        assert_eq!(hyperband_rungs(Some(3), None, Some(4), 3.0), [3, 9, 27, 81]);
        assert_eq!(hyperband_rungs(None, Some(27), Some(2), 3.0), [3, 9]);
        assert_eq!(hyperband_rungs(Some(1), Some(30), None, 2.0), [1, 2, 4, 8, 16]);
        assert_eq!(hyperband_rungs(None, Some(2), Some(5), 3.0), Vec::<u64>::new());
    }

    #[test]
    fn a_run_outside_the_best_third_stops_at_its_rung() {
        let others: Vec<Vec<(u64, f64)>> = (0..8).map(|n| vec![(1, n as f64), (2, n as f64), (3, n as f64)]).collect();
        let others: Vec<History<'_>> = others.iter().map(Vec::as_slice).collect();
        // 9 runs at step 3: the best 3 (values 0, 1, 2) go on.
        assert_eq!(decide(&rungs(), false, &others, &[(1, 0.5), (3, 1.5)]), Decision::Keep);
        let Decision::Stop { rung, cutoff, reason } = decide(&rungs(), false, &others, &[(1, 4.5), (3, 5.0)]) else {
            panic!()
        };
        assert_eq!((rung, cutoff), (3, 2.0));
        assert!(reason.starts_with("stopped early: at step 3"), "{reason}");
        // Maximizing turns the order round.
        assert_eq!(decide(&rungs(), true, &others, &[(1, 9.0), (3, 6.0)]), Decision::Keep);
    }

    #[test]
    fn the_decision_is_taken_at_the_crossing_only() {
        let others: Vec<Vec<(u64, f64)>> = (0..8).map(|n| vec![(3, n as f64)]).collect();
        let others: Vec<History<'_>> = others.iter().map(Vec::as_slice).collect();
        assert!(matches!(decide(&rungs(), false, &others, &[(3, 5.0)]), Decision::Stop { .. }));
        assert_eq!(decide(&rungs(), false, &others, &[(3, 5.0), (4, 5.0)]), Decision::Keep, "passed before");
        assert_eq!(decide(&rungs(), false, &others, &[(1, 0.0), (2, 5.0)]), Decision::Keep, "between rungs");
        assert_eq!(decide(&rungs(), false, &[], &[(1, 5.0)]), Decision::Keep, "alone at a rung is the best");
    }

    #[test]
    fn nan_is_a_failure_never_a_winner() {
        let others: Vec<Vec<(u64, f64)>> = vec![vec![(1, f64::NAN)], vec![(1, 1.0)]];
        let others: Vec<History<'_>> = others.iter().map(Vec::as_slice).collect();
        assert!(matches!(decide(&rungs(), false, &others, &[(1, f64::NAN)]), Decision::Stop { .. }));
        assert_eq!(decide(&rungs(), false, &others, &[(1, 0.5)]), Decision::Keep);
    }

    #[test]
    fn median_rule_waits_for_warmup_and_enough_runs() {
        let rule = EarlyStop::Median { warmup_steps: 2, min_runs: 3 };
        let others: Vec<Vec<(u64, f64)>> = (0..4).map(|n| vec![(1, n as f64), (2, n as f64)]).collect();
        let others: Vec<History<'_>> = others.iter().map(Vec::as_slice).collect();
        assert_eq!(decide(&rule, false, &others, &[(1, 9.0)]), Decision::Keep, "warm-up");
        assert_eq!(decide(&rule, false, &others[..2], &[(2, 9.0)]), Decision::Keep, "too few runs");
        let Decision::Stop { cutoff, .. } = decide(&rule, false, &others, &[(2, 9.0)]) else { panic!() };
        assert_eq!(cutoff, 1.5);
        assert_eq!(decide(&rule, false, &others, &[(2, 1.0)]), Decision::Keep);
    }
}
