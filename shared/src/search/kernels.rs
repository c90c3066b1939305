//! The kernel mixtures of the TPE (see [`super::tpe`]): per dimension a truncated Gaussian
//! (Optuna's bandwidth rule, bins for integers and stepped floats) or a categorical with a
//! prior, one product kernel per trial plus a prior kernel, weighted as Optuna weighs them.

use super::space::{Param, Space};
use super::tpe::Draws;

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
pub(crate) fn external(param: &Param, value: f64) -> f64 {
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

/// How wide each kernel is in a numerical dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Bandwidth {
    /// Per point, the larger gap to its sorted neighbours in that dimension (Optuna's
    /// independent TPE, and Optuna 5's multivariate one).
    #[default]
    NeighbourGap,
    /// One width per dimension from the number of points and of `searched` dimensions
    /// (Optuna 4's `multivariate=True`): measured in the comparison tests, not shipped.
    #[cfg(test)]
    Scott { searched: usize },
}

/// A weighted mixture of product kernels over every dimension.
pub(crate) struct Mixture {
    dimensions: Vec<Dimension>,
    /// `kernels[k][d]`.
    kernels: Vec<Vec<Part>>,
    log_weights: Vec<f64>,
    cumulative: Vec<f64>,
}

impl Mixture {
    pub(crate) fn new(space: &Space, points: &[&[f64]], bandwidth: Bandwidth) -> Mixture {
        let dimensions: Vec<Dimension> = space.params.iter().map(dimension).collect();
        let count = points.len();
        let mut kernels: Vec<Vec<Part>> = vec![Vec::with_capacity(dimensions.len()); count + 1];
        for (position, dimension) in dimensions.iter().enumerate() {
            let values = points.iter().map(|point| point[position]).collect();
            let parts = parts(*dimension, values, bandwidth);
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

    pub(crate) fn sample(&self, rng: &mut Draws) -> Vec<f64> {
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

    pub(crate) fn log_pdf(&self, point: &[f64]) -> f64 {
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
fn parts(dimension: Dimension, points: Vec<f64>, bandwidth: Bandwidth) -> Vec<Part> {
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
            let sigmas = match bandwidth {
                Bandwidth::NeighbourGap => bandwidths(&means, low, high),
                #[cfg(test)]
                Bandwidth::Scott { searched } => scott(means.len(), searched, low, high),
            };
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

/// Optuna 4's multivariate bandwidth, one for every kernel of a dimension:
/// `0.2 n^(-1/(d+4))` of the range for `n` points in `d` searched dimensions, then clipped as
/// [`bandwidths`] clips.
#[cfg(test)]
fn scott(count: usize, searched: usize, low: f64, high: f64) -> Vec<f64> {
    let width = high - low;
    let sigma = 0.2 * (count.max(1) as f64).powf(-1.0 / (searched as f64 + 4.0)) * width;
    let min_sigma = width / 100f64.min(count as f64 + 2.0);
    vec![sigma.clamp(min_sigma, width); count]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidths_follow_optuna() {
        // Sorted 2, 3, 7 in [0, 10]: outermost take their inner gap, the middle the larger gap.
        assert_eq!(bandwidths(&[7.0, 2.0, 3.0], 0.0, 10.0), [4.0, 2.0, 4.0], "the 1 is clipped to 10 / 5");
        assert_eq!(ramp(27).len(), 27);
        assert!((ramp(27)[0] - 1.0 / 27.0).abs() < 1e-12 && ramp(27)[1] == 1.0);
        assert!((normal_cdf(1.96) - 0.975).abs() < 1e-4);
    }
}
