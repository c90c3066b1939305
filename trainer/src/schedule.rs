//! Learning-rate schedules as plain functions of the optimizer step.

use crate::config::{ScheduleConfig, ScheduleName};

/// Where in training a step is: `step` counts optimizer steps from 0.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub step: usize,
    pub steps_per_epoch: usize,
    pub total_steps: usize,
}

/// The learning rate for `progress`: linear warm-up over `warmup_steps`, then the schedule.
pub fn learning_rate(schedule: &ScheduleConfig, base_lr: f64, progress: Progress) -> f64 {
    let Progress { step, steps_per_epoch, total_steps } = progress;
    let warmup = schedule.warmup_steps;
    if step < warmup {
        return base_lr * (step + 1) as f64 / warmup as f64;
    }
    match schedule.name {
        ScheduleName::Constant => base_lr,
        ScheduleName::Step => {
            let epoch = step / steps_per_epoch.max(1);
            base_lr * schedule.gamma.powi((epoch / schedule.step_size.max(1)) as i32)
        }
        ScheduleName::Cosine => {
            let span = total_steps.saturating_sub(warmup).saturating_sub(1).max(1);
            let done = (step - warmup).min(span) as f64 / span as f64;
            schedule.min_lr + (base_lr - schedule.min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * done).cos())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(schedule: &ScheduleConfig, step: usize) -> f64 {
        learning_rate(schedule, 1.0, Progress { step, steps_per_epoch: 10, total_steps: 101 })
    }

    #[test]
    fn warmup_rises_linearly_to_the_base_rate() {
        let schedule = ScheduleConfig { warmup_steps: 4, ..ScheduleConfig::default() };
        let rates: Vec<f64> = (0..6).map(|step| at(&schedule, step)).collect();
        assert_eq!(rates, vec![0.25, 0.5, 0.75, 1.0, 1.0, 1.0]);
    }

    #[test]
    fn cosine_runs_from_the_base_rate_to_min_lr() {
        let schedule = ScheduleConfig { name: ScheduleName::Cosine, min_lr: 0.1, ..ScheduleConfig::default() };
        assert!((at(&schedule, 0) - 1.0).abs() < 1e-12);
        assert!((at(&schedule, 50) - 0.55).abs() < 1e-12);
        assert!((at(&schedule, 100) - 0.1).abs() < 1e-12);
        assert!((at(&schedule, 500) - 0.1).abs() < 1e-12, "past the end it stays at min_lr");
        let rates: Vec<f64> = (0..=100).map(|step| at(&schedule, step)).collect();
        assert!(rates.windows(2).all(|pair| pair[1] <= pair[0]));
    }

    #[test]
    fn cosine_starts_after_warmup() {
        let schedule = ScheduleConfig { name: ScheduleName::Cosine, warmup_steps: 11, ..ScheduleConfig::default() };
        assert!((at(&schedule, 10) - 1.0).abs() < 1e-12);
        assert!((at(&schedule, 11) - 1.0).abs() < 1e-12);
        assert!(at(&schedule, 100) < 1e-12);
    }

    #[test]
    fn step_decays_every_step_size_epochs() {
        let schedule =
            ScheduleConfig { name: ScheduleName::Step, step_size: 2, gamma: 0.5, ..ScheduleConfig::default() };
        assert_eq!(at(&schedule, 19), 1.0);
        assert_eq!(at(&schedule, 20), 0.5);
        assert_eq!(at(&schedule, 45), 0.25);
    }
}
