//! The searched parameters of an adaptive sweep, in the coordinates proposals use: a
//! category's index, an integer, or a float (already quantized when the parameter has a step).

use super::tpe::Draws;

/// One searched parameter.
#[derive(Debug, Clone, PartialEq)]
pub enum Param {
    /// One of `choices` values, proposed as its index `0..choices`.
    Categorical { choices: usize },
    /// An integer in `low..=high`.
    Int { low: i64, high: i64 },
    /// A float in `[low, high]`, searched on a log scale when `log` (then `low > 0`), and
    /// rounded to a multiple of `step` when given (`round(x / step) * step`, as W&B's `q`).
    Float { low: f64, high: f64, log: bool, step: Option<f64> },
    /// Not searched (a constant); always 0.
    Fixed,
}

/// The parameters of a sweep, in template-slot order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Space {
    pub params: Vec<Param>,
}

impl Param {
    /// A uniform draw (log-uniform for log floats).
    pub(crate) fn sample(&self, rng: &mut Draws) -> f64 {
        match *self {
            Param::Categorical { choices } => {
                ((rng.unit() * choices.max(1) as f64) as usize).min(choices.max(1) - 1) as f64
            }
            Param::Int { low, high } => {
                let span = (i128::from(high) - i128::from(low) + 1) as f64;
                (i128::from(low) + ((rng.unit() * span) as i128).min(i128::from(high) - i128::from(low))) as f64
            }
            Param::Float { low, high, log, step } => {
                let unit = rng.unit();
                let value =
                    if log { (low.ln() + unit * (high.ln() - low.ln())).exp() } else { low + unit * (high - low) };
                self.snap(value, step)
            }
            Param::Fixed => 0.0,
        }
    }

    /// `value` brought into the parameter's domain: rounded, stepped and clamped.
    pub(crate) fn snap(&self, value: f64, step: Option<f64>) -> f64 {
        match *self {
            Param::Categorical { choices } => value.floor().clamp(0.0, choices.saturating_sub(1) as f64),
            Param::Int { low, high } => value.round().clamp(low as f64, high as f64),
            Param::Float { low, high, .. } => {
                let stepped = match step {
                    Some(step) => (value / step).round() * step,
                    None => value,
                };
                // A step can round past a bound; W&B keeps such a value, we keep it too
                // unless it leaves the float range entirely.
                if step.is_some() {
                    stepped
                } else {
                    stepped.clamp(low, high)
                }
            }
            Param::Fixed => 0.0,
        }
    }
}
