//! The next parameters of a bayes sweep: Optuna's tree-structured Parzen estimator, one
//! univariate estimator per parameter (Optuna's default `TPESampler`), from the `tpe` crate.
//!
//! As in Optuna: the first 10 proposals are random; then finished trials are split at the
//! best `gamma = min(ceil(0.1 n), 25)`, a Parzen estimator is fitted to each side and, of 24
//! candidates drawn from the good side, the one with the largest density ratio is proposed.
//! Failed trials (no metric, NaN or infinite) are left out of the model, as Optuna leaves
//! out failed trials. Trials still running enter with the worst finished value (Optuna's
//! "constant liar"), so several free GPUs are not all handed the same point. Each proposal
//! draws from its own generator seeded by `(seed, number)`, so the same inputs give the same
//! proposal after a restart.

use rand::rngs::StdRng;
use rand::SeedableRng;
use tpe::{categorical_range, histogram_estimator, parzen_estimator, range, TpeOptimizerBuilder};

use super::space::{Param, Space};

/// Random proposals before the model is used (Optuna's `n_startup_trials`).
pub const STARTUP_TRIALS: usize = 10;
/// Candidates scored per parameter (Optuna's `n_ei_candidates`).
const CANDIDATES: usize = 24;

/// A finished trial: its values (in [`Space`] coordinates) and the metric it reached.
#[derive(Debug, Clone, PartialEq)]
pub struct Trial {
    pub values: Vec<f64>,
    /// `None`, NaN or infinite: the trial failed or never reported the metric.
    pub metric: Option<f64>,
}

/// The proposed values, and why they are random when they are.
#[derive(Debug, Clone, PartialEq)]
pub struct Proposal {
    pub values: Vec<f64>,
    /// Set when the proposal is random rather than from the model, in a sentence.
    pub random_because: Option<String>,
}

/// Proposes trial number `number` of a sweep seeded `seed`. `maximize` says the metric's goal.
pub fn propose(
    space: &Space,
    maximize: bool,
    finished: &[Trial],
    pending: &[Vec<f64>],
    seed: u64,
    number: u64,
) -> Proposal {
    let mut rng = StdRng::seed_from_u64(mix(seed, number));
    let scored: Vec<(&[f64], f64)> = finished
        .iter()
        .filter_map(|trial| {
            trial.metric.filter(|metric| metric.is_finite()).map(|metric| (trial.values.as_slice(), metric))
        })
        .map(|(values, metric)| (values, if maximize { -metric } else { metric }))
        .collect();
    let random_because = if scored.is_empty() && !finished.is_empty() {
        Some(format!(
            "no finished run reported the metric yet ({} finished), so this proposal is random",
            finished.len()
        ))
    } else if scored.len() < STARTUP_TRIALS {
        Some(format!(
            "{} of the first {STARTUP_TRIALS} runs have a metric; proposals are random until then",
            scored.len()
        ))
    } else {
        None
    };
    if random_because.is_some() {
        let values = space.params.iter().map(|param| param.sample(&mut rng)).collect();
        return Proposal { values, random_because };
    }
    // Constant liar: running trials count as the worst value seen.
    let worst = scored.iter().map(|(_, value)| *value).fold(f64::NEG_INFINITY, f64::max);
    let observed: Vec<(&[f64], f64)> =
        scored.iter().copied().chain(pending.iter().map(|values| (values.as_slice(), worst))).collect();
    let gamma = (0.1f64).min(25.0 / observed.len() as f64);
    let values = space
        .params
        .iter()
        .enumerate()
        .map(|(position, param)| propose_one(param, position, &observed, gamma, &mut rng))
        .collect();
    Proposal { values, random_because: None }
}

fn propose_one(param: &Param, position: usize, observed: &[(&[f64], f64)], gamma: f64, rng: &mut StdRng) -> f64 {
    let mut builder = TpeOptimizerBuilder::new();
    builder.gamma(gamma).candidates(CANDIDATES);
    let coordinate = |values: &[f64]| values.get(position).copied().unwrap_or(f64::NAN);
    match *param {
        Param::Fixed => 0.0,
        Param::Categorical { choices } => {
            let Ok(domain) = categorical_range(choices.max(1)) else { return 0.0 };
            let Ok(mut optimizer) = builder.build(histogram_estimator(), domain) else { return 0.0 };
            for (values, value) in observed {
                let _ = optimizer.tell(coordinate(values).clamp(0.0, choices as f64 - 0.5), *value);
            }
            param.snap(optimizer.ask(rng).unwrap_or(0.0), None)
        }
        Param::Int { low, high } => {
            let (start, end) = (low as f64 - 0.5, high as f64 + 0.5);
            let proposed = ask_parzen(&builder, start, end, observed.iter().map(|(v, m)| (coordinate(v), *m)), rng);
            param.snap(proposed.unwrap_or(low as f64), None)
        }
        Param::Float { low, high, log, step } => {
            let (to, from): (fn(f64) -> f64, fn(f64) -> f64) =
                if log { (f64::ln, f64::exp) } else { (identity, identity) };
            let half = step.map_or(0.0, |step| step / 2.0);
            let (start, end) = (to(low - if log { 0.0 } else { half }), to(high + if log { 0.0 } else { half }));
            let points = observed.iter().map(|(values, metric)| (to(coordinate(values)), *metric));
            let proposed = ask_parzen(&builder, start, end, points, rng).map(from);
            param.snap(proposed.unwrap_or(low), step)
        }
    }
}

fn identity(value: f64) -> f64 {
    value
}

fn ask_parzen(
    builder: &TpeOptimizerBuilder,
    start: f64,
    end: f64,
    points: impl Iterator<Item = (f64, f64)>,
    rng: &mut StdRng,
) -> Option<f64> {
    let domain = range(start, end).ok()?;
    let mut optimizer = builder.build(parzen_estimator(), domain).ok()?;
    for (point, value) in points {
        // A value outside the domain (a file edited between runs) is left out of the model.
        if domain.contains(point) {
            let _ = optimizer.tell(point, value);
        }
    }
    optimizer.ask(rng).ok()
}

/// SplitMix64 of the sweep's seed and the proposal number: one stream per proposal.
fn mix(seed: u64, number: u64) -> u64 {
    let mut state = seed ^ number.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    state = (state ^ (state >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    state = (state ^ (state >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    state ^ (state >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space() -> Space {
        Space {
            params: vec![
                Param::Float { low: -5.0, high: 5.0, log: false, step: None },
                Param::Categorical { choices: 3 },
                Param::Int { low: 1, high: 8 },
                Param::Float { low: 1e-5, high: 1e-1, log: true, step: None },
            ],
        }
    }

    fn objective(values: &[f64]) -> f64 {
        values[0].powi(2) + values[1] + (values[2] - 3.0).abs() + (values[3].log10() + 3.0).powi(2)
    }

    #[test]
    fn proposals_are_reproducible_and_in_the_domain() {
        let space = space();
        let mut finished = Vec::new();
        for number in 0..40 {
            let proposal = propose(&space, false, &finished, &[], 7, number);
            assert_eq!(proposal, propose(&space, false, &finished, &[], 7, number));
            let values = &proposal.values;
            assert!((-5.0..=5.0).contains(&values[0]) && [0.0, 1.0, 2.0].contains(&values[1]));
            assert!((1.0..=8.0).contains(&values[2]) && values[2].fract() == 0.0);
            assert!((1e-5..=1e-1).contains(&values[3]));
            assert_eq!(proposal.random_because.is_some(), number < STARTUP_TRIALS as u64);
            finished.push(Trial { values: values.clone(), metric: Some(objective(values)) });
        }
    }

    #[test]
    fn the_model_beats_its_random_start() {
        let space = space();
        let best_of = |model: bool| {
            let mut medians = Vec::new();
            for seed in 0..5 {
                let mut finished: Vec<Trial> = Vec::new();
                for number in 0..60 {
                    let visible = if model { &finished[..] } else { &[] };
                    let values = propose(&space, false, visible, &[], seed, number).values;
                    finished.push(Trial { metric: Some(objective(&values)), values });
                }
                medians.push(finished.iter().filter_map(|trial| trial.metric).fold(f64::INFINITY, f64::min));
            }
            medians.sort_by(f64::total_cmp);
            medians[2]
        };
        let (tpe, random) = (best_of(true), best_of(false));
        assert!(tpe < random, "tpe {tpe} random {random}");
    }

    #[test]
    fn failures_and_missing_metrics_fall_back_to_random_with_a_reason() {
        let space = space();
        let failed: Vec<Trial> = (0..12)
            .map(|n| Trial {
                values: vec![0.0, 0.0, 1.0, 0.01],
                metric: [None, Some(f64::NAN), Some(f64::INFINITY)][n % 3],
            })
            .collect();
        let proposal = propose(&space, true, &failed, &[vec![1.0, 1.0, 2.0, 0.001]], 1, 12);
        assert!(proposal.random_because.unwrap().contains("no finished run reported the metric"));
    }

    #[test]
    fn running_trials_push_proposals_away() {
        let space = Space { params: vec![Param::Categorical { choices: 4 }] };
        let finished: Vec<Trial> = (0..20)
            .map(|n| Trial { values: vec![(n % 4) as f64], metric: Some(if n % 4 == 0 { 0.0 } else { 1.0 }) })
            .collect();
        let pending = vec![vec![0.0]; 40];
        let free = (0..50).filter(|&n| propose(&space, false, &finished, &[], 3, n).values[0] == 0.0).count();
        let liar = (0..50).filter(|&n| propose(&space, false, &finished, &pending, 3, n).values[0] == 0.0).count();
        assert!(liar < free, "with 40 runs in flight at 0, 0 was proposed {liar} times (vs {free} without)");
    }
}
