//! How a parsed sweep turns an index into a job: counting with the cap and the limit, and
//! decoding the index over the axes, in document order (first axis slowest) or spread.

use super::error::SweepError;
use super::random::{quantized, Distribution, Sampler};
use super::render::template::{JsonShape, Template};
use super::render::Rendered;
use super::JobSpec;
use crate::search::{Param, Space};

/// The job count after the cap, or [`SweepError::TooManyJobs`]. `lengths` are the axis
/// lengths; their product saturates instead of overflowing, so a 10^30-job grid is refused
/// here, before anything is built.
pub(crate) fn count_jobs(
    lengths: impl IntoIterator<Item = usize>,
    cap: Option<u64>,
    max_jobs: u64,
) -> Result<u64, SweepError> {
    check_count(grid_size(lengths), cap, max_jobs)
}

/// The number of grid points, saturating.
pub(crate) fn grid_size(lengths: impl IntoIterator<Item = usize>) -> u128 {
    lengths.into_iter().fold(1u128, |product, length| product.saturating_mul(length as u128))
}

/// Applies the cap to a job count and refuses it past `max_jobs`.
pub(crate) fn check_count(count: u128, cap: Option<u64>, max_jobs: u64) -> Result<u64, SweepError> {
    let count = cap.map_or(count, |cap| count.min(u128::from(cap)));
    if count > u128::from(max_jobs) {
        return Err(SweepError::TooManyJobs { count, limit: max_jobs });
    }
    // Not above max_jobs, so it fits.
    Ok(count as u64)
}

/// The three texts of every job, with slots for the job's values.
#[derive(Debug, Clone)]
pub(crate) struct Templates {
    /// Where each slot sits in the params object.
    pub shape: JsonShape,
    pub params: Template,
    pub command: Template,
    pub config: Option<Template>,
}

impl Templates {
    pub(crate) fn new(shape: JsonShape, command: Template, config: Option<Template>) -> Templates {
        Templates { params: shape.template(), shape, command, config }
    }

    pub(crate) fn build(&self, index: u64, values: &[&Rendered]) -> JobSpec {
        let mut params = String::with_capacity(128);
        self.params.render(values, index, &mut params);
        let mut command = String::with_capacity(128);
        self.command.render(values, index, &mut command);
        let config = self.config.as_ref().map(|template| {
            let mut config = String::with_capacity(512);
            template.render(values, index, &mut config);
            config
        });
        JobSpec { index, params, command, config }
    }
}

/// Where each job's values come from.
#[derive(Debug, Clone)]
pub(crate) enum Source {
    /// The cartesian product of the axes: slot `k` takes a value of `axes[k]`.
    Grid(Vec<Vec<Rendered>>, GridOrder),
    /// Seeded random draws, one per slot.
    Random(Sampler),
}

/// The order in which a grid's points become jobs (`max_runs_order`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GridOrder {
    /// Document order, first axis slowest: `max_runs: 20` keeps the first 20 points.
    #[default]
    InOrder,
    /// Every axis varies from the first job on: the first jobs visit every value of every
    /// axis (all of them within the longest axis's length), then the rest of the grid.
    Spread,
}

/// Everything needed to build any job of a sweep on its own.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub count: u64,
    /// The count before `max_runs` / `run_cap` (saturating).
    pub full_count: u128,
    pub source: Source,
    pub templates: Templates,
}

impl Plan {
    pub(crate) fn job(&self, index: u64) -> Option<JobSpec> {
        if index >= self.count {
            return None;
        }
        self.build(index)
    }

    /// Job `index` with no upper bound: a random search's seeded draw `index`.
    pub(crate) fn draw(&self, index: u64) -> Option<JobSpec> {
        match &self.source {
            Source::Random(_) => self.build(index),
            Source::Grid(..) => self.job(index),
        }
    }

    /// The parameters in proposal coordinates: grid axes and categorical values as indices,
    /// distributions as their ranges (normal ones as mu ± 4 sigma, where nearly all draws fall).
    pub(crate) fn space(&self) -> Space {
        let params = match &self.source {
            Source::Grid(axes, _) => axes.iter().map(|axis| Param::Categorical { choices: axis.len() }).collect(),
            Source::Random(sampler) => sampler.leaves.iter().map(param_of).collect(),
        };
        Space { params }
    }

    /// The job for proposed values, one per slot.
    pub(crate) fn job_from(&self, index: u64, values: &[f64]) -> Option<JobSpec> {
        let rendered: Vec<std::borrow::Cow<'_, Rendered>> = match &self.source {
            Source::Grid(axes, _) if axes.len() == values.len() => {
                axes.iter().zip(values).map(|(axis, value)| std::borrow::Cow::Borrowed(pick(axis, *value))).collect()
            }
            Source::Random(sampler) if sampler.leaves.len() == values.len() => {
                sampler.leaves.iter().zip(values).map(|(leaf, value)| value_of(leaf, *value)).collect()
            }
            _ => return None,
        };
        let refs: Vec<&Rendered> = rendered.iter().map(|value| value.as_ref()).collect();
        Some(self.templates.build(index, &refs))
    }

    fn build(&self, index: u64) -> Option<JobSpec> {
        match &self.source {
            Source::Grid(axes, GridOrder::InOrder) => Some(self.templates.build(index, &choose(axes, index))),
            Source::Grid(axes, GridOrder::Spread) => Some(self.templates.build(index, &spread(axes, index))),
            Source::Random(sampler) => {
                let values = sampler.sample(index);
                let refs: Vec<&Rendered> = values.iter().map(|value| value.as_ref()).collect();
                Some(self.templates.build(index, &refs))
            }
        }
    }
}

fn pick(values: &[Rendered], index: f64) -> &Rendered {
    &values[(index.max(0.0) as usize).min(values.len() - 1)]
}

/// A proposed coordinate as the value a job receives.
fn value_of(leaf: &Distribution, value: f64) -> std::borrow::Cow<'_, Rendered> {
    use std::borrow::Cow;
    match leaf {
        Distribution::Constant(constant) => Cow::Borrowed(constant),
        Distribution::Categorical { values, .. } => Cow::Borrowed(pick(values, value)),
        Distribution::IntUniform { .. } => Cow::Owned(Rendered::integer(value.round() as i128)),
        Distribution::QUniform { q, .. }
        | Distribution::QLogUniform { q, .. }
        | Distribution::QLogUniformValues { q, .. }
        | Distribution::QNormal { q, .. }
        | Distribution::QLogNormal { q, .. }
        | Distribution::QBeta { q, .. } => Cow::Owned(quantized(value, Some(*q))),
        _ => Cow::Owned(Rendered::float(value)),
    }
}

fn param_of(leaf: &Distribution) -> Param {
    let float = |low: f64, high: f64, log: bool, step: Option<f64>| Param::Float { low, high, log, step };
    let normal = |mu: f64, sigma: f64| (mu - 4.0 * sigma, mu + 4.0 * sigma);
    match *leaf {
        Distribution::Constant(_) => Param::Fixed,
        Distribution::Categorical { ref values, .. } => Param::Categorical { choices: values.len() },
        Distribution::IntUniform { min, max } => Param::Int { low: min, high: max },
        Distribution::Uniform { min, max } => float(min, max, false, None),
        Distribution::QUniform { min, max, q } => float(min, max, false, Some(q.q)),
        Distribution::LogUniform { min, max } => float(min.exp(), max.exp(), true, None),
        Distribution::QLogUniform { min, max, q } => float(min.exp(), max.exp(), true, Some(q.q)),
        Distribution::LogUniformValues { min, max } => float(min, max, true, None),
        Distribution::QLogUniformValues { min, max, q } => float(min, max, true, Some(q.q)),
        Distribution::InvLogUniform { min, max } => float((-max).exp(), (-min).exp(), true, None),
        Distribution::InvLogUniformValues { min, max } => float(min, max, true, None),
        Distribution::Normal { mu, sigma } => float(normal(mu, sigma).0, normal(mu, sigma).1, false, None),
        Distribution::QNormal { mu, sigma, q } => float(normal(mu, sigma).0, normal(mu, sigma).1, false, Some(q.q)),
        Distribution::LogNormal { mu, sigma } => {
            float(normal(mu, sigma).0.exp(), normal(mu, sigma).1.exp(), true, None)
        }
        Distribution::QLogNormal { mu, sigma, q } => {
            float(normal(mu, sigma).0.exp(), normal(mu, sigma).1.exp(), true, Some(q.q))
        }
        Distribution::Beta { .. } => float(0.0, 1.0, false, None),
        Distribution::QBeta { q, .. } => float(0.0, 1.0, false, Some(q.q)),
    }
}

/// Decodes `index` in mixed radix, the last axis varying fastest.
fn choose(axes: &[Vec<Rendered>], index: u64) -> Vec<&Rendered> {
    let mut rest = index;
    let mut chosen = Vec::with_capacity(axes.len());
    // Filled back to front, then reversed, to avoid a placeholder value per slot.
    for axis in axes.iter().rev() {
        let length = axis.len() as u64;
        chosen.push(&axis[(rest % length) as usize]);
        rest /= length;
    }
    chosen.reverse();
    chosen
}

/// The spread order: a bijection of the grid in which the longest axis varies fastest and
/// each other axis is sheared by the index's lower digits, `d_k = (e_k + i mod P_k) mod L_k`
/// (`e_k` the mixed-radix digit, `P_k` the product of the faster axes' lengths). With the axes
/// taken longest first, `P_k >= L_k`, so job `i < L_k` has `d_k = i`: every value of every
/// axis appears among the first `max L` jobs. The map is triangular with unit diagonal, so it
/// visits every grid point exactly once.
fn spread(axes: &[Vec<Rendered>], index: u64) -> Vec<&Rendered> {
    let mut by_length: Vec<usize> = (0..axes.len()).collect();
    by_length.sort_by_key(|&axis| std::cmp::Reverse(axes[axis].len()));
    let mut chosen = vec![None; axes.len()];
    let (mut rest, mut lower_product) = (u128::from(index), 1u128);
    for axis in by_length {
        let length = axes[axis].len() as u128;
        let digit = rest % length;
        rest /= length;
        let lower = u128::from(index) % lower_product;
        chosen[axis] = Some(&axes[axis][((digit + lower) % length) as usize]);
        lower_product = lower_product.saturating_mul(length);
    }
    chosen.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::load::Loader;
    use std::collections::HashSet;

    #[test]
    fn counts_saturate_and_respect_cap_and_limit() {
        assert_eq!(count_jobs([3, 3, 4, 3], None, 1000), Ok(108));
        assert_eq!(count_jobs([3, 3, 4, 3], Some(20), 1000), Ok(20));
        assert_eq!(count_jobs([], None, 1000), Ok(1));
        let huge = count_jobs([10; 30], None, 100_000);
        assert_eq!(huge, Err(SweepError::TooManyJobs { count: 10u128.pow(30), limit: 100_000 }));
        assert_eq!(count_jobs([10; 30], Some(20), 100_000), Ok(20));
        let saturated = count_jobs([usize::MAX; 8], None, 5);
        assert_eq!(saturated, Err(SweepError::TooManyJobs { count: u128::MAX, limit: 5 }));
    }

    #[test]
    fn last_axis_varies_fastest() {
        let loader = Loader::for_text("");
        let axis = |texts: &[&str]| -> Vec<Rendered> {
            texts.iter().map(|text| Rendered::new(&loader.load(text).unwrap()).unwrap()).collect()
        };
        let axes = vec![axis(&["a", "b"]), axis(&["1", "2", "3"])];
        let pick = |index| choose(&axes, index).iter().map(|value| value.raw.clone()).collect::<Vec<_>>().join(" ");
        let all: Vec<String> = (0..6).map(pick).collect();
        assert_eq!(all, ["a 1", "a 2", "a 3", "b 1", "b 2", "b 3"]);
    }

    #[test]
    fn spread_visits_every_point_once_and_every_value_early() {
        let axis = |length: usize| -> Vec<Rendered> { (0..length).map(|n| Rendered::integer(n as i128)).collect() };
        for lengths in [vec![3, 3, 4, 3], vec![2, 5], vec![1, 7, 2], vec![4], vec![5, 5, 5]] {
            let axes: Vec<Vec<Rendered>> = lengths.iter().map(|&length| axis(length)).collect();
            let total: usize = lengths.iter().product();
            let points: Vec<Vec<String>> = (0..total as u64)
                .map(|index| spread(&axes, index).iter().map(|value| value.json.clone()).collect())
                .collect();
            assert_eq!(points.iter().collect::<HashSet<_>>().len(), total, "{lengths:?}: a point repeats");
            let longest = *lengths.iter().max().unwrap();
            for (axis, &length) in lengths.iter().enumerate() {
                let seen: HashSet<&String> = points[..longest].iter().map(|point| &point[axis]).collect();
                assert_eq!(seen.len(), length, "{lengths:?}: axis {axis} not covered in {longest} jobs");
            }
        }
    }
}
