//! The GP sampler: the next parameters of a bayes sweep from a Gaussian process
//! ([`super::gp`]) and log expected improvement, as W&B's `method: bayes` and Optuna's
//! `GPSampler` do, for spaces of integer and float parameters.
//!
//! - The first [`super::tpe::STARTUP_TRIALS`] proposals are random, drawn as TPE draws them.
//! - Each searched dimension maps to `[0, 1]` (log floats by their logarithm); a dimension whose
//!   range is one value is left out. The finished trials' metrics (minimised; NaN and infinite
//!   ones left out) are warped ([`super::warp`]: a long tail of bad runs compressed) and
//!   standardized.
//! - The kernel is fitted on at most [`FIT_POINTS`] trials (the best quarter and an even spread
//!   of the rest when there are more), the process conditioned on at most [`MODEL_POINTS`].
//! - Trials still running are believed to score the posterior mean at their point (the Kriging
//!   believer): the mean elsewhere is unchanged, the variance near them shrinks, so workers
//!   proposing at once spread out rather than propose the same point.
//! - Log expected improvement over the best standardized metric is maximised as Optuna's
//!   `GPSampler` does: scored at uniform points (2,048 for a small model, fewer for a large
//!   one: a bounded amount of work), then [`LOCAL_SEARCHES`] L-BFGS searches with its gradient
//!   from the best of them, the best run, and points drawn by their scores. The winner is
//!   rounded to the space (integers, steps).
//! - A categorical parameter is one dimension per choice, one-hot (as a one-hot kernel with a
//!   length scale per choice); candidates and searches end at one choice each.
//!
//! Each proposal draws from the `(seed, number)` stream TPE uses, so it is the same after a
//! restart.

use super::gp::{Gp, Hyper};
use super::space::{Param, Space};
use super::tpe::{still_random, Draws, Proposal, Trial};

/// Trials the kernel's parameters are fitted on, at most.
const FIT_POINTS: usize = 100;
/// Trials (and running ones) the process is conditioned on, at most.
const MODEL_POINTS: usize = 200;
/// Running trials believed, at most (the latest).
const BELIEVED: usize = 64;
/// Uniform candidates: about this many kernel evaluations' worth, within the bounds below.
const CANDIDATE_WORK: usize = 2048 * 40 * 40;
const MIN_CANDIDATES: usize = 256;
const MAX_CANDIDATES: usize = 2048;
/// Local searches (L-BFGS on log EI with its gradient), and their iterations: as many as a
/// fixed amount of work allows, within the bounds.
const LOCAL_SEARCHES: usize = 10;
const SEARCH_WORK: usize = 50 * 40 * 40;
const MIN_ITERATIONS: usize = 8;
const MAX_ITERATIONS: usize = 50;

/// One searched dimension: the parameter's index and how it maps to `[0, 1]` (an integer's
/// range padded by half a step each side, so that each value has a bin of one width), or one
/// choice of a categorical parameter, one-hot: 1 when the parameter takes it, else 0.
struct Dimension {
    index: usize,
    low: f64,
    high: f64,
    log: bool,
    /// Integers and stepped floats: the model sees only the points proposals can take.
    discrete: bool,
    /// The choice this dimension stands for, of a categorical parameter.
    choice: Option<usize>,
}

impl Dimension {
    fn encode(&self, value: f64) -> f64 {
        if let Some(choice) = self.choice {
            return if value.round() as usize == choice { 1.0 } else { 0.0 };
        }
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

    /// The value of `param` (this dimension's) at `unit`: decoded, rounded, stepped, clamped;
    /// a categorical's choice when `unit` says the parameter takes it, else `None`.
    fn value(&self, param: &Param, unit: f64) -> Option<f64> {
        match self.choice {
            Some(choice) => (unit > 0.5).then_some(choice as f64),
            None => Some(param.snap(self.decode(unit), step_of(param))),
        }
    }

    /// `unit` moved to where the value it stands for lies, for a discrete dimension: the model
    /// scores the runs proposals can make, not points between two of them (which would round
    /// back to a run already made, again and again).
    fn snap(&self, param: &Param, unit: f64) -> f64 {
        match (self.discrete, self.value(param, unit)) {
            (true, Some(value)) if self.choice.is_none() => self.encode(value),
            _ => unit,
        }
    }
}

fn step_of(param: &Param) -> Option<f64> {
    match param {
        Param::Float { step, .. } => *step,
        _ => None,
    }
}

/// The searched dimensions of `space` (a categorical parameter's choices one each, in order),
/// or `None` when it has a range the model cannot map (not finite) or more than `most`.
fn dimensions(space: &Space, most: usize) -> Option<Vec<Dimension>> {
    let mut dimensions = Vec::new();
    for (index, param) in space.params.iter().enumerate() {
        let (low, high, log, discrete) = match *param {
            Param::Categorical { choices } if choices > 1 => {
                if dimensions.len() + choices > most {
                    return None;
                }
                let one_hot = (0..choices).map(|choice| Dimension {
                    index,
                    low: 0.0,
                    high: 1.0,
                    log: false,
                    discrete: true,
                    choice: Some(choice),
                });
                dimensions.extend(one_hot);
                continue;
            }
            Param::Categorical { .. } | Param::Fixed => continue,
            Param::Int { low, high } if high > low => (low as f64 - 0.5, high as f64 + 0.5, false, true),
            Param::Int { .. } => continue,
            Param::Float { low, high, log: true, step } => (low.ln(), high.ln(), true, step.is_some()),
            Param::Float { low, high, log: false, step } => (low, high, false, step.is_some()),
        };
        if !(low.is_finite() && high.is_finite() && (high - low).is_finite()) {
            return None;
        }
        if high > low {
            dimensions.push(Dimension { index, low, high, log, discrete, choice: None });
        }
    }
    (dimensions.len() <= most).then_some(dimensions)
}

/// The dimensions the GP would search in `space` (a categorical parameter one per choice),
/// however many.
pub fn dimension_count(space: &Space) -> usize {
    dimensions(space, usize::MAX).map_or(0, |dims| dims.len())
}

/// Whether the GP models `space`: 1 to `max_dims` searched dimensions (a categorical parameter
/// counting one per choice).
pub fn models(space: &Space, max_dims: usize) -> bool {
    dimensions(space, max_dims).is_some_and(|dims| !dims.is_empty())
}

/// What the proposals for one set of finished trials share: random ones until enough trials
/// have a metric, then the warped, standardized trials and the kernel fitted to them (the
/// bulk of a proposal's cost), which proposals with any trials running can reuse.
pub(crate) enum Prepared {
    /// Proposals are random, for this reason.
    Random(String),
    /// The model's trials and kernel.
    Model(Fitted),
}

/// The fitted kernel and the trials it was fitted to.
pub(crate) struct Fitted {
    dims: Vec<Dimension>,
    /// Every finished trial with a metric: its point in the unit box and its standardized value.
    standard: Vec<(Vec<f64>, f64)>,
    best: f64,
    hyper: Hyper,
}

/// Prepares the proposals for `finished`; `None` when the space has nothing to search or more
/// than [`super::GP_MAX_DIMS`] dimensions, or the kernel has no fit (the caller uses TPE).
pub(crate) fn prepare(space: &Space, maximize: bool, finished: &[Trial]) -> Option<Prepared> {
    let dims = dimensions(space, super::GP_MAX_DIMS)?;
    if dims.is_empty() {
        return None;
    }
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
        return Some(Prepared::Random(reason));
    }
    let (points, values): (Vec<Vec<f64>>, Vec<f64>) = scored.into_iter().unzip();
    let start = &values[..values.len().min(super::tpe::STARTUP_TRIALS)];
    let warped = super::warp::warp(&values, super::warp::spans_decades(start));
    let (mean, spread) = moments(&warped);
    let standard: Vec<(Vec<f64>, f64)> =
        points.into_iter().zip(warped).map(|(point, value)| (point, (value - mean) / spread)).collect();
    let best = standard.iter().map(|(_, value)| *value).fold(f64::INFINITY, f64::min);
    let fit_set = subsample(&standard, FIT_POINTS);
    let (fit_points, fit_values): (Vec<Vec<f64>>, Vec<f64>) = fit_set.into_iter().unzip();
    let hyper = Gp::fit(&fit_points, &fit_values, Hyper::start(dims.len()))?.hyper().clone();
    Some(Prepared::Model(Fitted { dims, standard, best, hyper }))
}

/// Proposes trial `number` of a sweep seeded `seed` from the GP, with what [`prepare`] made of
/// the same `space` and `finished` trials (which the caller keeps the same:
/// [`super::Proposer`] holds all three); `None` when the model cannot propose (the caller uses
/// TPE).
pub(crate) fn propose_with(
    prepared: &Prepared,
    space: &Space,
    finished: &[Trial],
    pending: &[Vec<f64>],
    seed: u64,
    number: u64,
) -> Option<Proposal> {
    let mut rng = Draws::for_proposal(seed, number);
    let Fitted { dims, standard, best, hyper } = match prepared {
        Prepared::Random(reason) => {
            let values = space.params.iter().map(|param| param.sample(&mut rng)).collect();
            return Some(Proposal { values, random_because: Some(reason.clone()) });
        }
        Prepared::Model(fitted) => fitted,
    };
    let (best, width) = (*best, space.params.len());
    let model_set = subsample(standard, MODEL_POINTS.saturating_sub(BELIEVED.min(pending.len())));
    let (mut points, mut values): (Vec<Vec<f64>>, Vec<f64>) = model_set.into_iter().unzip();
    let model = Gp::condition(&points, &values, hyper.clone())?;
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
            Gp::condition(&points, &values, hyper.clone())?
        }
    };
    // On a space of integers and stepped floats only, a run already made (or in flight) is not
    // made again: the model, which allows for noise, could otherwise keep choosing the best one.
    let key = |point: &[f64]| point.iter().map(|unit| (unit * 1e9).round() as i64).collect::<Vec<i64>>();
    let made: std::collections::HashSet<Vec<i64>> = match dims.iter().all(|dim| dim.discrete) {
        true => finished
            .iter()
            .map(|trial| &trial.values)
            .chain(pending)
            .filter(|values| values.len() == width)
            .map(|values| key(&dims.iter().map(|dim| dim.encode(values[dim.index])).collect::<Vec<f64>>()))
            .collect(),
        false => Default::default(),
    };
    let score = |point: &[f64]| {
        if !made.is_empty() && made.contains(&key(point)) {
            return f64::NEG_INFINITY;
        }
        let (mean, variance) = model.predict(point);
        log_expected_improvement(best, mean, variance.sqrt())
    };
    // As many uniform points as a fixed amount of work allows: 2,048 up to 40 runs in the
    // model, 256 from 113 on (a prediction costs the model's size squared).
    let size = points.len().max(1);
    let uniform = (CANDIDATE_WORK / size.pow(2)).clamp(MIN_CANDIDATES, MAX_CANDIDATES);
    let on_grid = |point: Vec<f64>| -> Vec<f64> {
        let mut point: Vec<f64> =
            dims.iter().zip(point).map(|(dim, unit)| dim.snap(&space.params[dim.index], unit)).collect();
        one_hot(dims, &mut point);
        point
    };
    let candidates: Vec<Vec<f64>> =
        (0..uniform).map(|_| on_grid((0..dims.len()).map(|_| rng.unit()).collect())).collect();
    let scored: Vec<f64> = candidates.iter().map(|point| score(point)).collect();
    // Local searches start from the best candidate, the best run so far, and candidates drawn
    // with weights exp(log EI - its largest), as Optuna's GPSampler picks them: the promising
    // places, not only the neighbours of the best one.
    let top = (0..scored.len()).max_by(|&a, &b| scored[a].total_cmp(&scored[b]))?;
    let mut starts: Vec<Vec<f64>> = vec![candidates[top].clone()];
    if let Some((incumbent, _)) = standard.iter().min_by(|a, b| a.1.total_cmp(&b.1)) {
        starts.push(incumbent.clone());
    }
    let mut weights: Vec<f64> = scored.iter().map(|value| (value - scored[top]).exp()).collect();
    weights[top] = 0.0;
    for _ in 0..LOCAL_SEARCHES.saturating_sub(starts.len()) {
        let total: f64 = weights.iter().sum();
        if total.is_nan() || total <= 0.0 {
            break;
        }
        let mut threshold = rng.unit() * total;
        let picked = weights.iter().position(|weight| {
            threshold -= weight;
            threshold < 0.0
        });
        let Some(picked) = picked.or_else(|| weights.iter().rposition(|weight| *weight > 0.0)) else { break };
        weights[picked] = 0.0;
        starts.push(candidates[picked].clone());
    }
    let bounds = vec![(0.0, 1.0); dims.len()];
    let negative = |point: &[f64]| {
        let (value, gradient) = log_ei_with_gradient(&model, best, point);
        (-value, gradient.into_iter().map(|slope| -slope).collect())
    };
    let iterations = (SEARCH_WORK / size.pow(2)).clamp(MIN_ITERATIONS, MAX_ITERATIONS);
    let chosen = starts
        .into_iter()
        .map(|start| {
            let value = score(&start);
            let refined = on_grid(super::lbfgs::minimize(negative, start.clone(), &bounds, iterations));
            let refined_value = score(&refined);
            let best = if refined_value > value { (refined_value, refined) } else { (value, start) };
            best_choices(dims, best, &score)
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, point)| point)?;
    let mut values: Vec<f64> = space.params.iter().map(fixed_value).collect();
    for (dim, unit) in dims.iter().zip(&chosen) {
        if let Some(value) = dim.value(&space.params[dim.index], *unit) {
            values[dim.index] = value;
        }
    }
    Some(Proposal { values, random_because: None })
}

/// Each categorical parameter's one-hot dimensions in `point` set to its largest one: the point
/// moved to the run it stands for (a choice, not a blend of several).
fn one_hot(dims: &[Dimension], point: &mut [f64]) {
    for (start, end) in choice_groups(dims) {
        let top = (start..end).max_by(|&a, &b| point[a].total_cmp(&point[b]).then(b.cmp(&a))).unwrap_or(start);
        choose(point, start, end, top);
    }
}

/// Each categorical parameter's one-hot dimensions: `start..end` in `dims`.
fn choice_groups(dims: &[Dimension]) -> Vec<(usize, usize)> {
    let mut groups = Vec::new();
    let mut start = 0;
    while start < dims.len() {
        let group = |dim: &Dimension| dim.choice.is_some() && dim.index == dims[start].index;
        let end = start + dims[start..].iter().take_while(|dim| group(dim)).count().max(1);
        if dims[start].choice.is_some() {
            groups.push((start, end));
        }
        start = end;
    }
    groups
}

/// `point`'s dimensions `start..end` (one categorical parameter) set to the choice `chosen`.
fn choose(point: &mut [f64], start: usize, end: usize, chosen: usize) {
    for (offset, unit) in point[start..end].iter_mut().enumerate() {
        *unit = if start + offset == chosen { 1.0 } else { 0.0 };
    }
}

/// `(score, point)` after trying, one categorical parameter at a time, each of its other
/// choices with the rest of `point` kept, and keeping each that scores higher; twice over, as
/// Optuna's GPSampler searches its categorical parameters. The gradient search only moves
/// the one-hot coordinates of the relaxed space, which rounds back to a choice near where
/// it started; this weighs them all (at most a few dozen predictions).
fn best_choices(
    dims: &[Dimension],
    (mut value, mut point): (f64, Vec<f64>),
    score: &impl Fn(&[f64]) -> f64,
) -> (f64, Vec<f64>) {
    let groups = choice_groups(dims);
    for _ in 0..2 {
        let before = value;
        for &(start, end) in &groups {
            for chosen in start..end {
                if point[chosen] == 1.0 {
                    continue;
                }
                let mut candidate = point.clone();
                choose(&mut candidate, start, end, chosen);
                let candidate_value = score(&candidate);
                if candidate_value > value {
                    (value, point) = (candidate_value, candidate);
                }
            }
        }
        if value <= before {
            break;
        }
    }
    (value, point)
}

/// The value of a parameter the model leaves out (a constant, a range of one value, a
/// category of one choice), as a random draw would give it.
fn fixed_value(param: &Param) -> f64 {
    match *param {
        Param::Int { low, .. } => low as f64,
        Param::Float { low, step, .. } => param.snap(low, step),
        Param::Categorical { .. } | Param::Fixed => 0.0,
    }
}

/// Mean and standard deviation (1 when the values are all alike).
fn moments(values: &[f64]) -> (f64, f64) {
    let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
    let spread = super::warp::spread(values);
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

/// `log EI` at `point` and its gradient there.
fn log_ei_with_gradient(model: &Gp, best: f64, point: &[f64]) -> (f64, Vec<f64>) {
    let (mean, variance, mean_slope, variance_slope) = model.predict_with_gradient(point);
    let sd = variance.sqrt();
    let z = (best - mean) / sd;
    let log_h_z = log_h(z);
    // d log h / dz = Φ(z) / h(z).
    let ratio = (log_cdf(z) - log_h_z).exp();
    let gradient = mean_slope
        .iter()
        .zip(&variance_slope)
        .map(|(mean_slope, variance_slope)| {
            let sd_slope = variance_slope / (2.0 * sd);
            let z_slope = -(mean_slope + z * sd_slope) / sd;
            sd_slope / sd + ratio * z_slope
        })
        .collect();
    (sd.max(1e-12).ln() + log_h_z, gradient)
}

/// `log Φ(z)`, with its asymptotic series far below 0.
fn log_cdf(z: f64) -> f64 {
    if z > -10.0 {
        (0.5 * libm::erfc(-z / std::f64::consts::SQRT_2)).max(f64::MIN_POSITIVE).ln()
    } else {
        let u = 1.0 / (z * z);
        -0.5 * z * z - 0.5 * (2.0 * std::f64::consts::PI).ln() - (-z).ln()
            + (1.0 - u * (1.0 - u * (3.0 - u * 15.0))).ln()
    }
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
