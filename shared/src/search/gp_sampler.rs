//! The GP sampler: the next parameters of a bayes sweep from a Gaussian process
//! ([`super::gp`]) and log expected improvement, as W&B's `method: bayes` and Optuna's
//! `GPSampler` do, for spaces of integer and float parameters.
//!
//! - The first [`super::tpe::STARTUP_TRIALS`] proposals are random, drawn as TPE draws them.
//! - Each searched dimension maps to `[0, 1]` (log floats by their logarithm); a dimension whose
//!   range is one value is left out. The finished trials' metrics (minimised; NaN and infinite
//!   ones left out) are standardized.
//! - The kernel is fitted on at most [`FIT_POINTS`] trials (the best quarter and an even spread
//!   of the rest when there are more), the process conditioned on at most [`MODEL_POINTS`].
//! - Trials still running are believed to score the posterior mean at their point (the Kriging
//!   believer): the mean elsewhere is unchanged, the variance near them shrinks, so workers
//!   proposing at once spread out rather than propose the same point.
//! - Log expected improvement over the best standardized metric is maximised over
//!   [`RANDOM_CANDIDATES`] uniform points and [`LOCAL_CANDIDATES`] around each of the best
//!   trials, the best few then refined by a pattern search. The winner is rounded to the
//!   space (integers, steps).
//!
//! Categorical parameters are not modelled here: [`super::Sampler::resolve`] sends such
//! spaces to TPE. Each proposal draws from the `(seed, number)` stream TPE uses, so it is
//! the same after a restart.

use super::gp::{Gp, Hyper};
use super::space::{Param, Space};
use super::tpe::{still_random, Draws, Proposal, Trial};

/// Trials the kernel's parameters are fitted on, at most.
const FIT_POINTS: usize = 100;
/// Trials (and running ones) the process is conditioned on, at most.
const MODEL_POINTS: usize = 200;
/// Running trials believed, at most (the latest).
const BELIEVED: usize = 64;
const RANDOM_CANDIDATES: usize = 512;
/// Candidates drawn around each of the best [`INCUMBENTS`] trials.
const LOCAL_CANDIDATES: usize = 32;
const INCUMBENTS: usize = 5;
/// Candidates refined by the pattern search, and its evaluations each.
const REFINED: usize = 3;
const REFINE_EVALUATIONS: usize = 80;

/// One searched dimension: the parameter's index and how it maps to `[0, 1]`.
struct Dimension {
    index: usize,
    low: f64,
    high: f64,
    log: bool,
}

impl Dimension {
    fn encode(&self, value: f64) -> f64 {
        let value = if self.log { value.max(f64::MIN_POSITIVE).ln() } else { value };
        ((value - self.low) / (self.high - self.low)).clamp(0.0, 1.0)
    }

    fn decode(&self, unit: f64) -> f64 {
        let value = self.low + unit.clamp(0.0, 1.0) * (self.high - self.low);
        if self.log {
            value.exp()
        } else {
            value
        }
    }
}

/// The searched dimensions of `space`, or `None` when it has a categorical parameter.
fn dimensions(space: &Space) -> Option<Vec<Dimension>> {
    let mut dimensions = Vec::new();
    for (index, param) in space.params.iter().enumerate() {
        let (low, high, log) = match *param {
            Param::Categorical { .. } => return None,
            Param::Int { low, high } => (low as f64, high as f64, false),
            Param::Float { low, high, log: true, .. } => (low.ln(), high.ln(), true),
            Param::Float { low, high, log: false, .. } => (low, high, false),
            Param::Fixed => continue,
        };
        if high > low && (high - low).is_finite() {
            dimensions.push(Dimension { index, low, high, log });
        }
    }
    Some(dimensions)
}

/// Whether the GP models `space`: no categorical parameter, and 1 to `max_dims` searched ones.
pub fn models(space: &Space, max_dims: usize) -> bool {
    dimensions(space).is_some_and(|dims| (1..=max_dims).contains(&dims.len()))
}

/// Proposes trial `number` of a sweep seeded `seed` from the GP; `None` when the space has a
/// categorical parameter or nothing to search (the caller uses TPE).
pub fn propose(
    space: &Space,
    maximize: bool,
    finished: &[Trial],
    pending: &[Vec<f64>],
    seed: u64,
    number: u64,
) -> Option<Proposal> {
    let dims = dimensions(space)?;
    if dims.is_empty() {
        return None;
    }
    let mut rng = Draws::for_proposal(seed, number);
    let width = space.params.len();
    let scored: Vec<(Vec<f64>, f64)> = finished
        .iter()
        .filter(|trial| trial.values.len() == width)
        .filter_map(|trial| trial.metric.filter(|metric| metric.is_finite()).map(|metric| (trial, metric)))
        .map(|(trial, metric)| {
            let point = dims.iter().map(|dim| dim.encode(trial.values[dim.index])).collect();
            (point, if maximize { -metric } else { metric })
        })
        .collect();
    if let Some(reason) = still_random(scored.len(), finished.len()) {
        let values = space.params.iter().map(|param| param.sample(&mut rng)).collect();
        return Some(Proposal { values, random_because: Some(reason) });
    }
    let (mean, spread) = moments(scored.iter().map(|(_, value)| *value));
    let standard: Vec<(Vec<f64>, f64)> =
        scored.into_iter().map(|(point, value)| (point, (value - mean) / spread)).collect();
    let best = standard.iter().map(|(_, value)| *value).fold(f64::INFINITY, f64::min);
    let fit_set = subsample(&standard, FIT_POINTS);
    let (fit_points, fit_values): (Vec<Vec<f64>>, Vec<f64>) = fit_set.into_iter().unzip();
    let fitted = Gp::fit(&fit_points, &fit_values, Hyper::start(dims.len()))?;
    let model_set = subsample(&standard, MODEL_POINTS.saturating_sub(BELIEVED.min(pending.len())));
    let (mut points, mut values): (Vec<Vec<f64>>, Vec<f64>) = model_set.into_iter().unzip();
    let model = Gp::condition(&points, &values, fitted.hyper().clone())?;
    // The Kriging believer: each running trial scores the mean at its point.
    let running: Vec<Vec<f64>> = pending
        .iter()
        .rev()
        .filter(|values| values.len() == width)
        .take(BELIEVED)
        .map(|values| dims.iter().map(|dim| dim.encode(values[dim.index])).collect())
        .collect();
    let model = match running.is_empty() {
        true => model,
        false => {
            for point in running {
                values.push(model.predict(&point).0);
                points.push(point);
            }
            Gp::condition(&points, &values, fitted.hyper().clone())?
        }
    };
    let score = |point: &[f64]| {
        let (mean, variance) = model.predict(point);
        log_expected_improvement(best, mean, variance.sqrt())
    };
    let incumbents: Vec<&Vec<f64>> = {
        let mut order: Vec<&(Vec<f64>, f64)> = standard.iter().collect();
        order.sort_by(|a, b| a.1.total_cmp(&b.1));
        order.into_iter().take(INCUMBENTS).map(|(point, _)| point).collect()
    };
    let mut candidates: Vec<Vec<f64>> =
        (0..RANDOM_CANDIDATES).map(|_| (0..dims.len()).map(|_| rng.unit()).collect()).collect();
    for incumbent in incumbents {
        for _ in 0..LOCAL_CANDIDATES {
            candidates.push(incumbent.iter().map(|x| rng.truncated_normal(*x, 0.1, 0.0, 1.0)).collect());
        }
    }
    let mut scored: Vec<(f64, Vec<f64>)> = candidates.into_iter().map(|point| (score(&point), point)).collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    let chosen = scored
        .into_iter()
        .take(REFINED)
        .map(|(value, point)| refine(&score, point, value))
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, point)| point)?;
    let mut values: Vec<f64> = space.params.iter().map(fixed_value).collect();
    for (dim, unit) in dims.iter().zip(&chosen) {
        let param = &space.params[dim.index];
        let step = match param {
            Param::Float { step, .. } => *step,
            _ => None,
        };
        values[dim.index] = param.snap(dim.decode(*unit), step);
    }
    Some(Proposal { values, random_because: None })
}

/// The value of a parameter the model leaves out (a constant, or a range of one value).
fn fixed_value(param: &Param) -> f64 {
    match *param {
        Param::Int { low, .. } => low as f64,
        Param::Float { low, .. } => low,
        Param::Categorical { .. } | Param::Fixed => 0.0,
    }
}

/// Mean and standard deviation (1 when the values are all alike).
fn moments(values: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let count = values.clone().count().max(1) as f64;
    let mean = values.clone().sum::<f64>() / count;
    let variance = values.map(|value| (value - mean).powi(2)).sum::<f64>() / count;
    let spread = variance.sqrt();
    (mean, if spread > 1e-12 && spread.is_finite() { spread } else { 1.0 })
}

/// At most `most` of the observations: all when they fit, else the best quarter and an even
/// spread of the others (in trial order), so that a long history costs a bounded fit.
fn subsample(observations: &[(Vec<f64>, f64)], most: usize) -> Vec<(Vec<f64>, f64)> {
    if observations.len() <= most {
        return observations.to_vec();
    }
    let mut order: Vec<usize> = (0..observations.len()).collect();
    order.sort_by(|&a, &b| observations[a].1.total_cmp(&observations[b].1).then(a.cmp(&b)));
    let best = most / 4;
    let mut keep: Vec<usize> = order[..best].to_vec();
    let mut rest: Vec<usize> = order[best..].to_vec();
    rest.sort_unstable();
    let others = most - best;
    keep.extend((0..others).map(|k| rest[k * rest.len() / others]));
    keep.sort_unstable();
    keep.into_iter().map(|index| observations[index].clone()).collect()
}

/// A pattern search from `point`: each coordinate moved by ± a step while the score rises, the
/// step halved when none does; within [`REFINE_EVALUATIONS`] scores.
fn refine(score: &impl Fn(&[f64]) -> f64, mut point: Vec<f64>, mut value: f64) -> (f64, Vec<f64>) {
    let mut step = 0.05;
    let mut evaluations = 0;
    while step > 1e-3 && evaluations < REFINE_EVALUATIONS {
        let mut improved = false;
        for dim in 0..point.len() {
            for sign in [1.0, -1.0] {
                let mut moved = point.clone();
                moved[dim] = (moved[dim] + sign * step).clamp(0.0, 1.0);
                evaluations += 1;
                let moved_value = score(&moved);
                if moved_value > value {
                    (point, value, improved) = (moved, moved_value, true);
                    break;
                }
            }
        }
        if !improved {
            step /= 2.0;
        }
    }
    (value, point)
}

/// `log EI` of a point whose posterior is `N(mean, sd²)` against the best value `best`
/// (minimising): `log(sd · h(z))`, `z = (best - mean) / sd`, `h(z) = φ(z) + zΦ(z)`, computed
/// without underflow far below the best (where EI itself is 0 in floating point), so that
/// candidates there still rank by how close they come.
pub(crate) fn log_expected_improvement(best: f64, mean: f64, sd: f64) -> f64 {
    let sd = sd.max(1e-12);
    let z = (best - mean) / sd;
    sd.ln() + log_h(z)
}

fn log_h(z: f64) -> f64 {
    let log_phi = -0.5 * z * z - 0.5 * (2.0 * std::f64::consts::PI).ln();
    if z > -10.0 {
        let cdf = 0.5 * libm::erfc(-z / std::f64::consts::SQRT_2);
        let pdf = log_phi.exp();
        (pdf + z * cdf).max(f64::MIN_POSITIVE).ln()
    } else {
        // h(z) = φ(z) · (1 - |z| R(|z|)), R the Mills ratio; 1 - tR(t) = 1/t² - 3/t⁴ + 15/t⁶ - ...
        let u = 1.0 / (z * z);
        log_phi + (u * (1.0 - u * (3.0 - u * (15.0 - u * (105.0 - u * 945.0))))).ln()
    }
}

#[cfg(test)]
#[path = "gp_sampler_tests.rs"]
mod tests;
