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

use super::render::Rendered;

/// No standard normal draw is larger in magnitude: Box-Muller's radius is
/// `sqrt(-2 ln(1 - u))` with `1 - u >= 2^-53`, at most `sqrt(106 ln 2)` = 8.5716.
pub(crate) const MAX_STANDARD_NORMAL: f64 = 8.58;

/// A quantization step (`q`). An integer `q` gives integers, as in W&B (`isinstance(q, int)`):
/// `q: 128` draws `256`, not `256.0`; a float `q` gives floats. W&B's default `q` is the
/// integer 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Step {
    pub q: f64,
    pub integer: bool,
}

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
        q: Step,
    },
    /// `min`, `max` are exponents.
    LogUniform {
        min: f64,
        max: f64,
    },
    QLogUniform {
        min: f64,
        max: f64,
        q: Step,
    },
    LogUniformValues {
        min: f64,
        max: f64,
    },
    QLogUniformValues {
        min: f64,
        max: f64,
        q: Step,
    },
    /// `exp(-U(min, max))`: `log(1/X)` uniform between the exponents `min` and `max`.
    InvLogUniform {
        min: f64,
        max: f64,
    },
    /// `X` in `[min, max]` with `log(1/X)` uniform.
    InvLogUniformValues {
        min: f64,
        max: f64,
    },
    Normal {
        mu: f64,
        sigma: f64,
    },
    QNormal {
        mu: f64,
        sigma: f64,
        q: Step,
    },
    LogNormal {
        mu: f64,
        sigma: f64,
    },
    QLogNormal {
        mu: f64,
        sigma: f64,
        q: Step,
    },
    Beta {
        a: f64,
        b: f64,
    },
    QBeta {
        a: f64,
        b: f64,
        q: Step,
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
            Distribution::InvLogUniform { .. } => "inv_log_uniform",
            Distribution::InvLogUniformValues { .. } => "inv_log_uniform_values",
            Distribution::Normal { .. } => "normal",
            Distribution::QNormal { .. } => "q_normal",
            Distribution::LogNormal { .. } => "log_normal",
            Distribution::QLogNormal { .. } => "q_log_normal",
            Distribution::Beta { .. } => "beta",
            Distribution::QBeta { .. } => "q_beta",
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
        let (float, step) = match *self {
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
                return Cow::Owned(Rendered::integer(i128::from(min) + offset));
            }
            Distribution::Uniform { min, max } => (uniform(draws, min, max), None),
            Distribution::QUniform { min, max, q } => (uniform(draws, min, max), Some(q)),
            Distribution::LogUniform { min, max } => (uniform(draws, min, max).exp(), None),
            Distribution::QLogUniform { min, max, q } => (uniform(draws, min, max).exp(), Some(q)),
            Distribution::LogUniformValues { min, max } => (uniform(draws, min.ln(), max.ln()).exp(), None),
            Distribution::QLogUniformValues { min, max, q } => (uniform(draws, min.ln(), max.ln()).exp(), Some(q)),
            Distribution::InvLogUniform { min, max } => ((-uniform(draws, min, max)).exp(), None),
            Distribution::InvLogUniformValues { min, max } => ((-uniform(draws, -max.ln(), -min.ln())).exp(), None),
            Distribution::Normal { mu, sigma } => (mu + sigma * draws.standard_normal(), None),
            Distribution::QNormal { mu, sigma, q } => (mu + sigma * draws.standard_normal(), Some(q)),
            Distribution::LogNormal { mu, sigma } => ((mu + sigma * draws.standard_normal()).exp(), None),
            Distribution::QLogNormal { mu, sigma, q } => ((mu + sigma * draws.standard_normal()).exp(), Some(q)),
            Distribution::Beta { a, b } => (draws.beta(a, b), None),
            Distribution::QBeta { a, b, q } => (draws.beta(a, b), Some(q)),
        };
        Cow::Owned(quantized(float, step))
    }
}

/// `round(x / q) * q`, an integer when `q` is one; the float itself without a step.
pub(crate) fn quantized(value: f64, step: Option<Step>) -> Rendered {
    match step {
        None => Rendered::float(value),
        Some(Step { q, integer: false }) => Rendered::float((value / q).round() * q),
        Some(Step { q, integer: true }) => {
            let whole = (value / q).round() * q;
            if whole.is_finite() && whole.abs() < 1.7e38 {
                Rendered::integer(whole as i128)
            } else {
                Rendered::float(whole)
            }
        }
    }
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

    /// Marsaglia and Tsang's gamma variate (shape `shape > 0`, scale 1); shapes below 1 use
    /// `Gamma(shape + 1) * U^(1/shape)`.
    fn gamma(&mut self, shape: f64) -> f64 {
        if shape < 1.0 {
            let boost = (1.0 - self.unit()).powf(1.0 / shape);
            return self.gamma(shape + 1.0) * boost;
        }
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let z = self.standard_normal();
            let v = (1.0 + c * z).powi(3);
            if v <= 0.0 {
                continue;
            }
            let u = 1.0 - self.unit();
            if u.ln() < 0.5 * z * z + d - d * v + d * v.ln() {
                return d * v;
            }
        }
    }

    /// Beta(a, b) as `X / (X + Y)` with `X ~ Gamma(a)`, `Y ~ Gamma(b)`.
    fn beta(&mut self, a: f64, b: f64) -> f64 {
        let x = self.gamma(a);
        let y = self.gamma(b);
        if x + y > 0.0 {
            x / (x + y)
        } else {
            0.5
        }
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
        let quantized =
            draws(Distribution::QUniform { min: 0.0, max: 10.0, q: Step { q: 2.0, integer: false } }, 1, 200);
        assert!(quantized.iter().all(|value| value % 2.0 == 0.0));
    }

    #[test]
    fn standard_normal_draws_are_bounded() {
        assert!((-2.0 * (2f64.powi(-53)).ln()).sqrt() < MAX_STANDARD_NORMAL);
        let mut draws = Draws::for_job(5, 0);
        assert!((0..10_000).all(|_| draws.standard_normal().abs() < MAX_STANDARD_NORMAL));
    }

    #[test]
    fn new_distributions_follow_w_and_b_definitions() {
        let values = draws(Distribution::InvLogUniformValues { min: 0.001, max: 0.05 }, 2, 2000);
        assert!(values.iter().all(|value| (0.001..=0.05).contains(value)));
        // log(1/X) is uniform: its mean is the midpoint of -ln(max) and -ln(min).
        let mean = values.iter().map(|value| (1.0 / value).ln()).sum::<f64>() / values.len() as f64;
        assert!((mean - (-(0.05f64.ln()) - 0.001f64.ln()) / 2.0).abs() < 0.1, "{mean}");
        let exponents = draws(Distribution::InvLogUniform { min: 1.0, max: 3.0 }, 2, 500);
        assert!(exponents.iter().all(|value| ((-3f64).exp()..=(-1f64).exp()).contains(value)));
        let beta = draws(Distribution::Beta { a: 2.0, b: 5.0 }, 4, 4000);
        let mean = beta.iter().sum::<f64>() / beta.len() as f64;
        assert!(beta.iter().all(|value| (0.0..=1.0).contains(value)));
        assert!((mean - 2.0 / 7.0).abs() < 0.02, "beta mean {mean}");
        let small = draws(Distribution::Beta { a: 0.5, b: 0.5 }, 4, 500);
        assert!(small.iter().all(|value| (0.0..=1.0).contains(value)));
    }

    #[test]
    fn an_integer_q_gives_integers() {
        let q = Step { q: 128.0, integer: true };
        let sampler = Sampler { seed: 1, leaves: vec![Distribution::QUniform { min: 0.0, max: 1000.0, q }] };
        for index in 0..50 {
            let text = sampler.sample(index)[0].python.clone();
            assert!(!text.contains('.') && text.parse::<i64>().unwrap() % 128 == 0, "{text}");
        }
        let q = Step { q: 0.5, integer: false };
        let floats = Sampler { seed: 1, leaves: vec![Distribution::QUniform { min: 0.0, max: 10.0, q }] };
        assert!(floats.sample(0)[0].python.contains('.'));
    }

    #[test]
    fn categorical_follows_probabilities() {
        let value = |text: &str| Rendered::float(text.parse().unwrap());
        let categorical =
            Distribution::Categorical { values: vec![value("1"), value("2")], cumulative: Some(vec![0.0, 1.0]) };
        assert!(draws(categorical, 3, 100).iter().all(|drawn| *drawn == 2.0));
    }
}
