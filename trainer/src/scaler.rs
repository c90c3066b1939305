//! Dynamic loss scaling for fp16 (as torch.cuda.amp.GradScaler): the loss is multiplied by
//! `scale` before backward; a step whose unscaled gradients hold an inf or NaN is skipped
//! and the scale multiplied by `backoff_factor`; after `growth_interval` clean steps in a row
//! it is multiplied by `growth_factor`. This is the state machine; the tensor work (unscale,
//! the inf check) is in `torch::amp`.

use crate::config::LossScaleConfig;

#[derive(Debug, Clone, PartialEq)]
pub struct LossScaler {
    scale: f64,
    growth_factor: f64,
    backoff_factor: f64,
    growth_interval: u32,
    clean_steps: u32,
    skipped: u64,
}

/// What to do with the gradients of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepDecision {
    Apply,
    Skip,
}

impl LossScaler {
    pub fn new(config: &LossScaleConfig) -> LossScaler {
        LossScaler {
            scale: config.init,
            growth_factor: config.growth_factor,
            backoff_factor: config.backoff_factor,
            growth_interval: config.growth_interval.max(1),
            clean_steps: 0,
            skipped: 0,
        }
    }

    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// Steps skipped so far because of non-finite gradients.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Called once per optimizer step with whether any gradient was inf or NaN.
    pub fn update(&mut self, found_non_finite: bool) -> StepDecision {
        if found_non_finite {
            self.scale *= self.backoff_factor;
            self.clean_steps = 0;
            self.skipped += 1;
            return StepDecision::Skip;
        }
        self.clean_steps += 1;
        if self.clean_steps >= self.growth_interval {
            self.scale *= self.growth_factor;
            self.clean_steps = 0;
        }
        StepDecision::Apply
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scaler(interval: u32) -> LossScaler {
        LossScaler::new(&LossScaleConfig { init: 1024.0, growth_interval: interval, ..LossScaleConfig::default() })
    }

    #[test]
    fn an_overflow_skips_the_step_and_halves_the_scale() {
        let mut scaler = scaler(3);
        assert_eq!(scaler.update(true), StepDecision::Skip);
        assert_eq!(scaler.scale(), 512.0);
        assert_eq!(scaler.skipped(), 1);
    }

    #[test]
    fn the_scale_grows_after_interval_clean_steps_and_an_overflow_restarts_the_count() {
        let mut scaler = scaler(3);
        assert_eq!(scaler.update(false), StepDecision::Apply);
        assert_eq!(scaler.update(false), StepDecision::Apply);
        assert_eq!(scaler.update(true), StepDecision::Skip);
        assert_eq!(scaler.scale(), 512.0);
        for _ in 0..2 {
            scaler.update(false);
        }
        assert_eq!(scaler.scale(), 512.0, "two clean steps since the overflow are not enough");
        scaler.update(false);
        assert_eq!(scaler.scale(), 1024.0);
    }

    proptest::proptest! {
        #[test]
        fn the_scale_is_init_times_growth_and_backoff_counts(steps in proptest::collection::vec(proptest::bool::ANY, 0..200)) {
            let mut scaler = scaler(5);
            let (mut grown, mut clean) = (0i32, 0);
            for &overflow in &steps {
                scaler.update(overflow);
                if overflow { clean = 0 } else { clean += 1; if clean == 5 { grown += 1; clean = 0 } }
            }
            let skipped = steps.iter().filter(|&&overflow| overflow).count() as i32;
            proptest::prop_assert_eq!(scaler.scale(), 1024.0 * 2f64.powi(grown) * 0.5f64.powi(skipped));
            proptest::prop_assert_eq!(scaler.skipped(), skipped as u64);
        }
    }
}
