//! The next parameters of a bayes sweep: the tree-structured Parzen estimator as Optuna's
//! `TPESampler` runs it by default for one objective (Optuna 4 and 5: multivariate).
//!
//! - The first 10 proposals are random (`n_startup_trials`).
//! - Finished trials are split: the best `min(ceil(0.1 n), 25)` are "below", the rest and the
//!   trials still running (Optuna's default `constant_liar`) "above".
//! - Each group is a mixture of product kernels, one per trial plus a prior: per numerical
//!   dimension a Gaussian truncated to the range (log scale for log parameters; integers and
//!   stepped floats as masses of their bins), its bandwidth the larger gap to its sorted
//!   neighbours (the outermost points take their inner gap), clipped to
//!   `[range / min(100, n + 2), range]`; the prior sits mid-range with the whole range as
//!   bandwidth. A categorical dimension gives each kernel `1/(n+1)` on every choice plus 1 on
//!   its own, normalised. Kernel weights are 1 (older trials ramped down past 25) and 1 for the
//!   prior.
//! - 24 candidates are drawn from "below"; the one with the largest `log l(x) - log g(x)` is
//!   proposed.
//!
//! Failed trials (no metric, NaN or infinite) are left out, as Optuna leaves out failed ones.
//! Each proposal draws from its own ChaCha8 stream keyed by `(seed, number)`, so the same
//! inputs give the same proposal after a restart. The `tpe` crate was considered: it
//! implements Optuna's older univariate TPE, which trails the multivariate default by 15%
//! on Hartmann-6 at 50 trials (`app bench-search`), so the algorithm is written here.

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

use super::kernels::{external, Mixture};
use super::space::Space;

/// Random proposals before the model is used (Optuna's `n_startup_trials`).
pub const STARTUP_TRIALS: usize = 10;
/// Candidates scored per proposal (Optuna's `n_ei_candidates`).
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

/// Proposes trial number `number` of a sweep seeded `seed`. `maximize` says the metric's goal;
/// `pending` are the values of trials still running.
pub fn propose(
    space: &Space,
    maximize: bool,
    finished: &[Trial],
    pending: &[Vec<f64>],
    seed: u64,
    number: u64,
) -> Proposal {
    let mut rng = Draws(ChaCha8Rng::seed_from_u64(mix(seed, number)));
    let scored: Vec<(&[f64], f64)> = finished
        .iter()
        .filter(|trial| trial.values.len() == space.params.len())
        .filter_map(|trial| trial.metric.filter(|metric| metric.is_finite()).map(|metric| (&trial.values[..], metric)))
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
    // Below: the best; above: the rest, in trial order, then the running trials.
    let mut order: Vec<usize> = (0..scored.len()).collect();
    order.sort_by(|&a, &b| scored[a].1.total_cmp(&scored[b].1).then(a.cmp(&b)));
    let below_count = ((scored.len() as f64 * 0.1).ceil() as usize).min(25);
    let mut below: Vec<usize> = order[..below_count].to_vec();
    let mut above: Vec<usize> = order[below_count..].to_vec();
    below.sort_unstable();
    above.sort_unstable();
    let below: Vec<&[f64]> = below.iter().map(|&index| scored[index].0).collect();
    let above: Vec<&[f64]> = above
        .iter()
        .map(|&index| scored[index].0)
        .chain(pending.iter().filter(|values| values.len() == space.params.len()).map(Vec::as_slice))
        .collect();
    let good = Mixture::new(space, &below);
    let bad = Mixture::new(space, &above);
    let best = (0..CANDIDATES)
        .map(|_| good.sample(&mut rng))
        .map(|candidate| (good.log_pdf(&candidate) - bad.log_pdf(&candidate), candidate))
        .max_by(|(a, _), (b, _)| a.total_cmp(b))
        .map(|(_, candidate)| candidate)
        .unwrap_or_default();
    let values = space.params.iter().zip(&best).map(|(param, value)| external(param, *value)).collect();
    Proposal { values, random_because: None }
}

/// A proposal's random stream.
pub(crate) struct Draws(ChaCha8Rng);

impl Draws {
    /// Uniform in `[0, 1)`.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A normal draw kept inside `[low, high]` by rejection; a kernel keeps a good share of
    /// its mass inside (its centre is inside and its bandwidth at most the range), so this
    /// ends fast, and the bound only guards a degenerate range.
    pub(crate) fn truncated_normal(&mut self, mean: f64, sigma: f64, low: f64, high: f64) -> f64 {
        for _ in 0..1000 {
            let radius = (-2.0 * (1.0 - self.unit()).ln()).sqrt();
            let draw = mean + sigma * radius * (std::f64::consts::TAU * self.unit()).cos();
            if (low..=high).contains(&draw) {
                return draw;
            }
        }
        mean.clamp(low, high)
    }
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
    use crate::search::Param;

    fn space() -> Space {
        Space {
            params: vec![
                Param::Float { low: -5.0, high: 5.0, log: false, step: None },
                Param::Categorical { choices: 3 },
                Param::Int { low: 1, high: 8 },
                Param::Float { low: 1e-5, high: 1e-1, log: true, step: None },
                Param::Float { low: 0.0, high: 1.0, log: false, step: Some(0.25) },
            ],
        }
    }

    fn objective(values: &[f64]) -> f64 {
        values[0].powi(2) + values[1] + (values[2] - 3.0).abs() + (values[3].log10() + 3.0).powi(2) + values[4]
    }

    #[test]
    fn proposals_are_reproducible_and_in_the_domain() {
        let space = space();
        let mut finished = Vec::new();
        for number in 0..40 {
            let proposal = propose(&space, false, &finished, &[], 7, number);
            assert_eq!(proposal, propose(&space, false, &finished, &[], 7, number));
            let values = &proposal.values;
            assert!((-5.0..=5.0).contains(&values[0]) && [0.0, 1.0, 2.0].contains(&values[1]), "{values:?}");
            assert!((1.0..=8.0).contains(&values[2]) && values[2].fract() == 0.0, "{values:?}");
            assert!((1e-5..=1e-1).contains(&values[3]), "{values:?}");
            assert!([0.0, 0.25, 0.5, 0.75, 1.0].contains(&values[4]), "{values:?}");
            assert_eq!(proposal.random_because.is_some(), number < STARTUP_TRIALS as u64);
            finished.push(Trial { values: values.clone(), metric: Some(objective(values)) });
        }
    }

    #[test]
    fn the_model_beats_its_random_start() {
        let space = space();
        let best_of = |model: bool| {
            let mut bests = Vec::new();
            for seed in 0..5 {
                let mut finished: Vec<Trial> = Vec::new();
                for number in 0..60 {
                    let visible = if model { &finished[..] } else { &[] };
                    let values = propose(&space, false, visible, &[], seed, number).values;
                    finished.push(Trial { metric: Some(objective(&values)), values });
                }
                bests.push(finished.iter().filter_map(|trial| trial.metric).fold(f64::INFINITY, f64::min));
            }
            bests.sort_by(f64::total_cmp);
            bests[2]
        };
        let (tpe, random) = (best_of(true), best_of(false));
        assert!(tpe < random, "tpe {tpe} random {random}");
    }

    #[test]
    fn failures_and_missing_metrics_fall_back_to_random_with_a_reason() {
        let space = space();
        let metrics = [None, Some(f64::NAN), Some(f64::INFINITY)];
        let failed: Vec<Trial> =
            (0..12).map(|n| Trial { values: vec![0.0, 0.0, 1.0, 0.01, 0.5], metric: metrics[n % 3] }).collect();
        let proposal = propose(&space, true, &failed, &[vec![1.0, 1.0, 2.0, 0.001, 0.0]], 1, 12);
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
