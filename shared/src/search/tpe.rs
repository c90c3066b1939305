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

use super::space::{Param, Space};

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

/// A dimension as the kernels see it: numerical in transformed coordinates, or categorical.
#[derive(Debug, Clone, Copy)]
enum Dimension {
    /// `[low, high]` already widened by half a step, `step` the bin width (0: continuous).
    Numerical {
        low: f64,
        high: f64,
        step: f64,
        log: bool,
    },
    Categorical {
        choices: usize,
    },
    Fixed,
}

fn dimension(param: &Param) -> Dimension {
    match *param {
        Param::Categorical { choices } => Dimension::Categorical { choices: choices.max(1) },
        Param::Int { low, high } => {
            Dimension::Numerical { low: low as f64 - 0.5, high: high as f64 + 0.5, step: 1.0, log: false }
        }
        Param::Float { low, high, log: true, .. } => {
            Dimension::Numerical { low: low.ln(), high: high.ln(), step: 0.0, log: true }
        }
        Param::Float { low, high, log: false, step } => {
            let half = step.map_or(0.0, |step| step / 2.0);
            Dimension::Numerical { low: low - half, high: high + half, step: step.unwrap_or(0.0), log: false }
        }
        Param::Fixed => Dimension::Fixed,
    }
}

/// A proposal's coordinate back in the parameter's own terms.
fn external(param: &Param, value: f64) -> f64 {
    match *param {
        Param::Float { log: true, step, .. } => param.snap(value.exp(), step),
        Param::Float { step, .. } => param.snap(value, step),
        _ => param.snap(value, None),
    }
}

/// One kernel's part in one dimension.
#[derive(Debug, Clone)]
enum Part {
    Normal { mean: f64, sigma: f64, log_mass: f64 },
    Categorical(Vec<f64>),
    Fixed,
}

/// A weighted mixture of product kernels over every dimension.
struct Mixture {
    dimensions: Vec<Dimension>,
    /// `kernels[k][d]`.
    kernels: Vec<Vec<Part>>,
    log_weights: Vec<f64>,
    cumulative: Vec<f64>,
}

impl Mixture {
    fn new(space: &Space, points: &[&[f64]]) -> Mixture {
        let dimensions: Vec<Dimension> = space.params.iter().map(dimension).collect();
        let count = points.len();
        let mut kernels: Vec<Vec<Part>> = vec![Vec::with_capacity(dimensions.len()); count + 1];
        for (position, dimension) in dimensions.iter().enumerate() {
            let parts = parts(*dimension, points.iter().map(|point| point[position]).collect());
            for (kernel, part) in kernels.iter_mut().zip(parts) {
                kernel.push(part);
            }
        }
        let mut weights = ramp(count);
        weights.push(1.0);
        let total: f64 = weights.iter().sum();
        let mut running = 0.0;
        let cumulative = weights.iter().map(|weight| {
            running += weight / total;
            running
        });
        let cumulative = cumulative.collect();
        Mixture {
            dimensions,
            kernels,
            log_weights: weights.iter().map(|weight| (weight / total).ln()).collect(),
            cumulative,
        }
    }

    fn sample(&self, rng: &mut Draws) -> Vec<f64> {
        let draw = rng.unit();
        let kernel = self.cumulative.iter().position(|sum| draw < *sum).unwrap_or(self.kernels.len() - 1);
        self.kernels[kernel]
            .iter()
            .zip(&self.dimensions)
            .map(|(part, dimension)| match (part, dimension) {
                (Part::Normal { mean, sigma, .. }, Dimension::Numerical { low, high, step, .. }) => {
                    let value = rng.truncated_normal(*mean, *sigma, *low, *high);
                    if *step > 0.0 {
                        snap_to_bins(value, *low, *high, *step)
                    } else {
                        value
                    }
                }
                (Part::Categorical(probabilities), _) => {
                    let draw = rng.unit();
                    let mut running = 0.0;
                    probabilities
                        .iter()
                        .position(|p| {
                            running += p;
                            draw < running
                        })
                        .unwrap_or(probabilities.len() - 1) as f64
                }
                _ => 0.0,
            })
            .collect()
    }

    fn log_pdf(&self, point: &[f64]) -> f64 {
        let logs: Vec<f64> = self
            .kernels
            .iter()
            .zip(&self.log_weights)
            .map(|(kernel, log_weight)| {
                log_weight
                    + kernel
                        .iter()
                        .zip(&self.dimensions)
                        .zip(point)
                        .map(|((part, dimension), x)| part_log_pdf(part, dimension, *x))
                        .sum::<f64>()
            })
            .collect();
        let max = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if !max.is_finite() {
            return max;
        }
        max + logs.iter().map(|log| (log - max).exp()).sum::<f64>().ln()
    }
}

/// The kernels' parts in one dimension: one per point, then the prior.
fn parts(dimension: Dimension, points: Vec<f64>) -> Vec<Part> {
    let count = points.len();
    match dimension {
        Dimension::Fixed => vec![Part::Fixed; count + 1],
        Dimension::Categorical { choices } => {
            let base = 1.0 / (count + 1) as f64;
            let mut rows: Vec<Part> = points
                .iter()
                .map(|point| {
                    let mut row = vec![base; choices];
                    row[(point.max(0.0) as usize).min(choices - 1)] += 1.0;
                    let total: f64 = row.iter().sum();
                    Part::Categorical(row.into_iter().map(|weight| weight / total).collect())
                })
                .collect();
            rows.push(Part::Categorical(vec![1.0 / choices as f64; choices]));
            rows
        }
        Dimension::Numerical { low, high, log, .. } => {
            let width = high - low;
            let means: Vec<f64> = points.iter().map(|point| if log { point.ln() } else { *point }).collect();
            let sigmas = bandwidths(&means, low, high);
            let normal = |mean: f64, sigma: f64| {
                let mass = normal_cdf((high - mean) / sigma) - normal_cdf((low - mean) / sigma);
                Part::Normal { mean, sigma, log_mass: mass.max(1e-300).ln() }
            };
            let mut parts: Vec<Part> = means.iter().zip(sigmas).map(|(mean, sigma)| normal(*mean, sigma)).collect();
            parts.push(normal(0.5 * (low + high), width));
            parts
        }
    }
}

/// Optuna's bandwidths: the larger gap to the sorted neighbours (range ends included; the
/// outermost points take their inner gap when there are two or more), clipped.
fn bandwidths(means: &[f64], low: f64, high: f64) -> Vec<f64> {
    let width = high - low;
    let mut order: Vec<usize> = (0..means.len()).collect();
    order.sort_by(|&a, &b| means[a].total_cmp(&means[b]));
    let ends: Vec<f64> =
        std::iter::once(low).chain(order.iter().map(|&index| means[index])).chain(std::iter::once(high)).collect();
    let mut sigmas = vec![width; means.len()];
    let count = means.len();
    for position in 0..count {
        let left = ends[position + 1] - ends[position];
        let right = ends[position + 2] - ends[position + 1];
        let sigma = if ends.len() >= 4 && position == 0 {
            right
        } else if ends.len() >= 4 && position == count - 1 {
            left
        } else {
            left.max(right)
        };
        sigmas[order[position]] = sigma;
    }
    let min_sigma = width / 100f64.min(count as f64 + 2.0);
    sigmas.into_iter().map(|sigma| sigma.clamp(min_sigma, width)).collect()
}

fn part_log_pdf(part: &Part, dimension: &Dimension, x: f64) -> f64 {
    match (part, dimension) {
        (Part::Normal { mean, sigma, log_mass }, Dimension::Numerical { step, .. }) if *step > 0.0 => {
            // A bin's mass: Optuna's discrete truncated normal.
            let half = step / 2.0;
            let mass = normal_cdf((x + half - mean) / sigma) - normal_cdf((x - half - mean) / sigma);
            mass.max(1e-300).ln() - log_mass
        }
        (Part::Normal { mean, sigma, log_mass }, _) => {
            let z = (x - mean) / sigma;
            -0.5 * z * z - sigma.ln() - 0.5 * (std::f64::consts::TAU).ln() - log_mass
        }
        (Part::Categorical(probabilities), _) => probabilities[(x.max(0.0) as usize).min(probabilities.len() - 1)].ln(),
        (Part::Fixed, _) => 0.0,
    }
}

/// The centre of the bin of `value` (bins of `step` from `low`, which is half a step below the
/// first value).
fn snap_to_bins(value: f64, low: f64, high: f64, step: f64) -> f64 {
    let first = low + step / 2.0;
    let last = high - step / 2.0;
    (first + ((value - first) / step).round() * step).clamp(first, last)
}

/// Optuna's `default_weights`: 1 each, the oldest ramped from `1/n` up past 25.
fn ramp(count: usize) -> Vec<f64> {
    if count < 25 {
        return vec![1.0; count];
    }
    let ramped = count - 25;
    let mut weights: Vec<f64> = (0..ramped)
        .map(|i| {
            let start = 1.0 / count as f64;
            if ramped == 1 {
                start
            } else {
                start + (1.0 - start) * i as f64 / (ramped - 1) as f64
            }
        })
        .collect();
    weights.extend(std::iter::repeat_n(1.0, 25));
    weights
}

/// The standard normal CDF through a rational approximation of `erfc` (relative error below
/// 1.2e-7): ample for kernel masses.
fn normal_cdf(x: f64) -> f64 {
    let z = (x / std::f64::consts::SQRT_2).abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98 + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let erfc = t * poly.exp();
    if x >= 0.0 {
        1.0 - 0.5 * erfc
    } else {
        0.5 * erfc
    }
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
    fn truncated_normal(&mut self, mean: f64, sigma: f64, low: f64, high: f64) -> f64 {
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
    fn bandwidths_follow_optuna() {
        // Sorted 2, 3, 7 in [0, 10]: outermost take their inner gap, the middle the larger gap.
        assert_eq!(bandwidths(&[7.0, 2.0, 3.0], 0.0, 10.0), [4.0, 2.0, 4.0], "the 1 is clipped to 10 / 5");
        assert_eq!(ramp(27).len(), 27);
        assert!((ramp(27)[0] - 1.0 / 27.0).abs() < 1e-12 && ramp(27)[1] == 1.0);
        assert!((normal_cdf(1.96) - 0.975).abs() < 1e-4);
    }
}
