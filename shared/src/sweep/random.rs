//! Seeded, reproducible sampling for W&B `method: random`.
//!
//! Job `i` draws from its own ChaCha8 stream (key from the sweep's seed, stream number `i`),
//! parameters in document order, so a job's values depend only on the seed, its index and
//! the parameter specs: expanding job 90 000 does not replay jobs 0 to 89 999, and a file
//! parsed twice gives the same jobs. Uniform floats come from the top 53 bits of a `u64` and
//! every transform (Box-Muller for normals) is written here rather than taken from `rand`'s
//! distributions, whose output may change between versions.

use std::borrow::Cow;

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

use super::render::{write_float, Rendered};
use super::yaml::yaml_float;

/// No standard normal draw is larger in magnitude: Box-Muller's radius is
/// `sqrt(-2 ln(1 - u))` with `1 - u >= 2^-53`, at most `sqrt(106 ln 2)` = 8.5716.
pub(crate) const MAX_STANDARD_NORMAL: f64 = 8.58;

/// One parameter's distribution, already validated.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Distribution {
    Constant(Rendered),
    /// `cumulative` holds the running sums of the probabilities, when given.
    Categorical {
        values: Vec<Rendered>,
        cumulative: Option<Vec<f64>>,
    },
    Uniform {
        min: f64,
        max: f64,
    },
    IntUniform {
        min: i64,
        max: i64,
    },
    QUniform {
        min: f64,
        max: f64,
        q: f64,
    },
    /// `min`, `max` are exponents.
    LogUniform {
        min: f64,
        max: f64,
    },
    QLogUniform {
        min: f64,
        max: f64,
        q: f64,
    },
    LogUniformValues {
        min: f64,
        max: f64,
    },
    QLogUniformValues {
        min: f64,
        max: f64,
        q: f64,
    },
    Normal {
        mu: f64,
        sigma: f64,
    },
    QNormal {
        mu: f64,
        sigma: f64,
        q: f64,
    },
    LogNormal {
        mu: f64,
        sigma: f64,
    },
    QLogNormal {
        mu: f64,
        sigma: f64,
        q: f64,
    },
}

impl Distribution {
    /// The W&B name, for messages.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Distribution::Constant(_) => "constant",
            Distribution::Categorical { .. } => "categorical",
            Distribution::Uniform { .. } => "uniform",
            Distribution::IntUniform { .. } => "int_uniform",
            Distribution::QUniform { .. } => "q_uniform",
            Distribution::LogUniform { .. } => "log_uniform",
            Distribution::QLogUniform { .. } => "q_log_uniform",
            Distribution::LogUniformValues { .. } => "log_uniform_values",
            Distribution::QLogUniformValues { .. } => "q_log_uniform_values",
            Distribution::Normal { .. } => "normal",
            Distribution::QNormal { .. } => "q_normal",
            Distribution::LogNormal { .. } => "log_normal",
            Distribution::QLogNormal { .. } => "q_log_normal",
        }
    }

    /// The values a grid search walks, or `None` for a continuous distribution.
    pub(crate) fn grid_values(&self) -> Option<&[Rendered]> {
        match self {
            Distribution::Constant(value) => Some(std::slice::from_ref(value)),
            Distribution::Categorical { values, .. } => Some(values),
            _ => None,
        }
    }

    fn sample(&self, draws: &mut Draws) -> Cow<'_, Rendered> {
        let uniform = |draws: &mut Draws, min: f64, max: f64| min + draws.unit() * (max - min);
        let quantize = |value: f64, q: f64| (value / q).round() * q;
        let float = match *self {
            Distribution::Constant(ref value) => return Cow::Borrowed(value),
            Distribution::Categorical { ref values, ref cumulative } => {
                let draw = draws.unit();
                let position = match cumulative {
                    Some(sums) => {
                        let total = sums.last().copied().unwrap_or(1.0);
                        sums.iter().position(|sum| draw * total < *sum).unwrap_or(values.len() - 1)
                    }
                    None => (draw * values.len() as f64) as usize,
                };
                return Cow::Borrowed(&values[position.min(values.len() - 1)]);
            }
            Distribution::IntUniform { min, max } => {
                let span = (i128::from(max) - i128::from(min) + 1) as f64;
                let offset = ((draws.unit() * span) as i128).min(i128::from(max) - i128::from(min));
                return Cow::Owned(integer(i128::from(min) + offset));
            }
            Distribution::Uniform { min, max } => uniform(draws, min, max),
            Distribution::QUniform { min, max, q } => quantize(uniform(draws, min, max), q),
            Distribution::LogUniform { min, max } => uniform(draws, min, max).exp(),
            Distribution::QLogUniform { min, max, q } => quantize(uniform(draws, min, max).exp(), q),
            Distribution::LogUniformValues { min, max } => uniform(draws, min.ln(), max.ln()).exp(),
            Distribution::QLogUniformValues { min, max, q } => quantize(uniform(draws, min.ln(), max.ln()).exp(), q),
            Distribution::Normal { mu, sigma } => mu + sigma * draws.standard_normal(),
            Distribution::QNormal { mu, sigma, q } => quantize(mu + sigma * draws.standard_normal(), q),
            Distribution::LogNormal { mu, sigma } => (mu + sigma * draws.standard_normal()).exp(),
            Distribution::QLogNormal { mu, sigma, q } => quantize((mu + sigma * draws.standard_normal()).exp(), q),
        };
        Cow::Owned(float_value(float))
    }
}

fn integer(value: i128) -> Rendered {
    Rendered::number(value.to_string())
}

/// A sampled float; one that overflowed is written as `null`, the only JSON for it (parsing
/// refuses parameters whose draws can overflow, so this is a last resort).
fn float_value(value: f64) -> Rendered {
    let mut text = String::new();
    if write_float(value, &mut text).is_err() {
        return Rendered::number("null".to_owned());
    }
    // Resolved configs are YAML, which wants its own float form (`1.0e-06`).
    Rendered { yaml: yaml_float(value), ..Rendered::number(text) }
}

/// A job's random stream.
struct Draws(ChaCha8Rng);

impl Draws {
    fn for_job(seed: u64, index: u64) -> Draws {
        // SplitMix64 spreads the seed over the 256-bit key, so seeds 0 and 1 share no bytes.
        let mut state = seed;
        let mut key = [0u8; 32];
        for chunk in key.chunks_exact_mut(8) {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut mixed = state;
            mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            chunk.copy_from_slice(&(mixed ^ (mixed >> 31)).to_le_bytes());
        }
        let mut rng = ChaCha8Rng::from_seed(key);
        rng.set_stream(index);
        Draws(rng)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Box-Muller; `1 - unit()` is in `(0, 1]`, so the logarithm is finite.
    fn standard_normal(&mut self) -> f64 {
        let radius = (-2.0 * (1.0 - self.unit()).ln()).sqrt();
        radius * (std::f64::consts::TAU * self.unit()).cos()
    }
}

/// Draws every parameter of a random-search job.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sampler {
    pub seed: u64,
    /// One per template slot, in document order.
    pub leaves: Vec<Distribution>,
}

impl Sampler {
    pub(crate) fn sample(&self, index: u64) -> Vec<Cow<'_, Rendered>> {
        let mut draws = Draws::for_job(self.seed, index);
        self.leaves.iter().map(|leaf| leaf.sample(&mut draws)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draws(distribution: Distribution, seed: u64, count: u64) -> Vec<f64> {
        let sampler = Sampler { seed, leaves: vec![distribution] };
        (0..count).map(|index| sampler.sample(index)[0].json.parse::<f64>().unwrap()).collect()
    }

    #[test]
    fn samples_stay_in_range_and_depend_only_on_seed_and_index() {
        let values = draws(Distribution::LogUniformValues { min: 1e-5, max: 1e-1 }, 7, 500);
        assert!(values.iter().all(|value| (1e-5..=1e-1).contains(value)));
        assert_eq!(values, draws(Distribution::LogUniformValues { min: 1e-5, max: 1e-1 }, 7, 500));
        assert_ne!(values, draws(Distribution::LogUniformValues { min: 1e-5, max: 1e-1 }, 8, 500));
        let ints = draws(Distribution::IntUniform { min: -2, max: 2 }, 0, 500);
        for wanted in -2..=2 {
            assert!(ints.contains(&f64::from(wanted)), "{wanted} never drawn");
        }
        assert!(ints.iter().all(|value| (-2.0..=2.0).contains(value) && value.fract() == 0.0));
    }

    #[test]
    fn normal_draws_have_the_asked_mean_and_spread() {
        let values = draws(Distribution::Normal { mu: 3.0, sigma: 2.0 }, 1, 4000);
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        let variance = values.iter().map(|value| (value - mean).powi(2)).sum::<f64>() / values.len() as f64;
        assert!((mean - 3.0).abs() < 0.15, "mean {mean}");
        assert!((variance.sqrt() - 2.0).abs() < 0.15, "sigma {}", variance.sqrt());
        let quantized = draws(Distribution::QUniform { min: 0.0, max: 10.0, q: 2.0 }, 1, 200);
        assert!(quantized.iter().all(|value| value % 2.0 == 0.0));
    }

    #[test]
    fn standard_normal_draws_are_bounded() {
        assert!((-2.0 * (2f64.powi(-53)).ln()).sqrt() < MAX_STANDARD_NORMAL);
        let mut draws = Draws::for_job(5, 0);
        assert!((0..10_000).all(|_| draws.standard_normal().abs() < MAX_STANDARD_NORMAL));
    }

    #[test]
    fn categorical_follows_probabilities() {
        let value = |text: &str| float_value(text.parse().unwrap());
        let categorical =
            Distribution::Categorical { values: vec![value("1"), value("2")], cumulative: Some(vec![0.0, 1.0]) };
        assert!(draws(categorical, 3, 100).iter().all(|drawn| *drawn == 2.0));
    }
}
