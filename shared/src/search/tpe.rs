//! The next parameters of a bayes sweep: the tree-structured Parzen estimator as Optuna 5's
//! `TPESampler` runs it by default for one objective (multivariate, constant liar). Optuna 4's
//! default is the independent TPE, and its `multivariate=True` widens kernels by Scott's rule
//! instead of the gaps below: both trail this form (docs/decisions/0075).
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
//! inputs give the same proposal after a restart. Given the same trials, `log l(x) - log g(x)`
//! agrees with Optuna 5.0.0's to 1e-6 (`search::comparison`). The `tpe` crate was considered:
//! it implements Optuna's older univariate TPE, which trails the multivariate default by 15%
//! on Hartmann-6 at 50 trials (docs/decisions/0027), so the algorithm is written here.

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

use super::kernels::{external, Bandwidth, Mixture};
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
    propose_with(Bandwidth::default(), space, maximize, finished, pending, seed, number)
}

/// [`propose`] with the kernels' bandwidth rule chosen (the comparison tests try both).
pub(crate) fn propose_with(
    bandwidth: Bandwidth,
    space: &Space,
    maximize: bool,
    finished: &[Trial],
    pending: &[Vec<f64>],
    seed: u64,
    number: u64,
) -> Proposal {
    let mut rng = Draws::for_proposal(seed, number);
    let groups = match Groups::split(space, maximize, finished, pending) {
        Ok(groups) => groups,
        Err(reason) => {
            let values = space.params.iter().map(|param| param.sample(&mut rng)).collect();
            return Proposal { values, random_because: Some(reason) };
        }
    };
    let good = Mixture::new(space, &groups.below, bandwidth);
    let bad = Mixture::new(space, &groups.above, bandwidth);
    let best = best_candidate(&good, &bad, &mut rng);
    let values = space.params.iter().zip(&best).map(|(param, value)| external(param, *value)).collect();
    Proposal { values, random_because: None }
}

/// Why a proposal is random while fewer than [`STARTUP_TRIALS`] of the `finished` trials have
/// a metric (`scored` of them); `None` once the model is used.
pub(crate) fn still_random(scored: usize, finished: usize) -> Option<String> {
    if scored == 0 && finished > 0 {
        return Some(format!(
            "no finished run reported the metric yet ({finished} finished), so this proposal is random"
        ));
    }
    (scored < STARTUP_TRIALS)
        .then(|| format!("{scored} of the first {STARTUP_TRIALS} runs have a metric; proposals are random until then"))
}

/// The trials the two densities are built from, in trial order: `below` the best
/// `min(ceil(0.1 n), 25)` finished, `above` the other finished, then the running ones.
pub(crate) struct Groups<'a> {
    pub(crate) below: Vec<&'a [f64]>,
    pub(crate) above: Vec<&'a [f64]>,
}

impl<'a> Groups<'a> {
    /// The split, or why the proposal is random instead (too few finished trials with a metric).
    pub(crate) fn split(
        space: &Space,
        maximize: bool,
        finished: &'a [Trial],
        pending: &'a [Vec<f64>],
    ) -> Result<Groups<'a>, String> {
        let scored: Vec<(&[f64], f64)> = finished
            .iter()
            .filter(|trial| trial.values.len() == space.params.len())
            .filter_map(|trial| {
                trial.metric.filter(|metric| metric.is_finite()).map(|metric| (&trial.values[..], metric))
            })
            .map(|(values, metric)| (values, if maximize { -metric } else { metric }))
            .collect();
        if let Some(reason) = still_random(scored.len(), finished.len()) {
            return Err(reason);
        }
        let mut order: Vec<usize> = (0..scored.len()).collect();
        order.sort_by(|&a, &b| scored[a].1.total_cmp(&scored[b].1).then(a.cmp(&b)));
        let below_count = ((scored.len() as f64 * 0.1).ceil() as usize).min(25);
        let mut below: Vec<usize> = order[..below_count].to_vec();
        let mut above: Vec<usize> = order[below_count..].to_vec();
        below.sort_unstable();
        above.sort_unstable();
        let running = pending.iter().filter(|values| values.len() == space.params.len()).map(Vec::as_slice);
        Ok(Groups {
            below: below.iter().map(|&index| scored[index].0).collect(),
            above: above.iter().map(|&index| scored[index].0).chain(running).collect(),
        })
    }
}

/// Of [`CANDIDATES`] draws from `good`, the one with the largest `log l(x) - log g(x)`.
pub(crate) fn best_candidate(good: &Mixture, bad: &Mixture, rng: &mut Draws) -> Vec<f64> {
    (0..CANDIDATES)
        .map(|_| good.sample(rng))
        .map(|candidate| (good.log_pdf(&candidate) - bad.log_pdf(&candidate), candidate))
        .max_by(|(a, _), (b, _)| a.total_cmp(b))
        .map(|(_, candidate)| candidate)
        .unwrap_or_default()
}

/// A proposal's random stream.
pub(crate) struct Draws(ChaCha8Rng);

impl Draws {
    /// The stream of proposal `number` of a sweep seeded `seed`.
    pub(crate) fn for_proposal(seed: u64, number: u64) -> Draws {
        Draws(ChaCha8Rng::seed_from_u64(mix(seed, number)))
    }

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
    use proptest::prelude::*;

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

    #[test]
    fn the_best_tenth_is_below_and_running_trials_are_above() {
        let space = Space { params: vec![Param::Float { low: 0.0, high: 1.0, log: false, step: None }] };
        let finished: Vec<Trial> =
            (0..31).map(|n| Trial { values: vec![n as f64 / 31.0], metric: Some((n * 7 % 31) as f64) }).collect();
        let pending = [vec![0.5], vec![0.25, 0.0]];
        let groups = Groups::split(&space, true, &finished, &pending).unwrap();
        // ceil(0.1 * 31) = 4 best when maximising: metrics 30, 29, 28, 27, in trial order.
        let below: Vec<f64> = groups.below.iter().map(|point| point[0] * 31.0).collect();
        let mut expected: Vec<f64> = (0..31).filter(|n| n * 7 % 31 >= 27).map(f64::from).collect();
        expected.sort_by(f64::total_cmp);
        assert_eq!(below.iter().map(|n| n.round()).collect::<Vec<_>>(), expected);
        assert_eq!(groups.above.len(), 27 + 1, "the running trial of the right length is above");
        assert_eq!(groups.above.last().unwrap(), &[0.5]);
    }

    fn param() -> impl Strategy<Value = Param> {
        prop_oneof![
            (1usize..6).prop_map(|choices| Param::Categorical { choices }),
            (-10i64..10, 0i64..20).prop_map(|(low, span)| Param::Int { low, high: low + span }),
            (-5.0f64..5.0, 0.1f64..10.0, prop::option::of(prop::sample::select(vec![0.1, 0.25, 1.0])))
                .prop_map(|(low, width, step)| Param::Float { low, high: low + width, log: false, step }),
            (-5.0f64..0.0, 0.5f64..4.0).prop_map(|(low, decades)| Param::Float {
                low: 10f64.powf(low),
                high: 10f64.powf(low + decades),
                log: true,
                step: None
            }),
            Just(Param::Fixed),
        ]
    }

    /// Inside the parameter's domain; a stepped float may round one step past a bound (W&B's `q`).
    fn inside(param: &Param, value: f64) -> bool {
        match *param {
            Param::Categorical { choices } => value.fract() == 0.0 && (0.0..choices as f64).contains(&value),
            Param::Int { low, high } => value.fract() == 0.0 && (low as f64..=high as f64).contains(&value),
            Param::Float { low, high, step: None, .. } => (low..=high).contains(&value),
            Param::Float { low, high, step: Some(step), .. } => {
                ((value / step).round() * step - value).abs() < 1e-9 && (low - step..=high + step).contains(&value)
            }
            Param::Fixed => value == 0.0,
        }
    }

    proptest! {
        #[test]
        fn proposals_stay_inside_and_repeat_for_a_seed(
            params in prop::collection::vec(param(), 1..6),
            metrics in prop::collection::vec(
                prop_oneof![4 => (-1e3f64..1e3).prop_map(Some), 1 => Just(None), 1 => Just(Some(f64::NAN))],
                0..40,
            ),
            running in 0usize..4,
            maximize in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let space = Space { params };
            let mut rng = Draws::for_proposal(!seed, 0);
            let mut draw = |space: &Space| space.params.iter().map(|param| param.sample(&mut rng)).collect::<Vec<f64>>();
            let finished: Vec<Trial> = metrics.iter().map(|metric| Trial { values: draw(&space), metric: *metric }).collect();
            let pending: Vec<Vec<f64>> = (0..running).map(|_| draw(&space)).collect();
            let number = finished.len() as u64;
            let proposal = propose(&space, maximize, &finished, &pending, seed, number);
            prop_assert_eq!(&proposal, &propose(&space, maximize, &finished, &pending, seed, number));
            prop_assert_eq!(proposal.values.len(), space.params.len());
            for (param, value) in space.params.iter().zip(&proposal.values) {
                prop_assert!(inside(param, *value), "{:?} outside {:?}", value, param);
            }
            let scored = metrics.iter().filter(|metric| metric.is_some_and(f64::is_finite)).count();
            prop_assert_eq!(proposal.random_because.is_none(), scored >= STARTUP_TRIALS);
        }
    }
}
