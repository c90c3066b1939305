//! Best-epoch tracking and early stopping on one metric.

/// Whether a metric is better higher (accuracy) or lower (losses, errors).
pub fn maximize(metric: &str) -> bool {
    metric.contains("acc")
}

#[derive(Debug, Clone)]
pub struct EarlyStopping {
    maximize: bool,
    patience: usize,
    min_delta: f64,
    best: Option<f64>,
    epochs_without_improvement: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A new best: save `model_best.pt`.
    Improved,
    NoImprovement,
    /// Patience ran out.
    Stop,
}

impl EarlyStopping {
    /// `patience` 0 never stops.
    pub fn new(metric: &str, patience: usize, min_delta: f64) -> EarlyStopping {
        EarlyStopping { maximize: maximize(metric), patience, min_delta, best: None, epochs_without_improvement: 0 }
    }

    pub fn best(&self) -> Option<f64> {
        self.best
    }

    /// Restores the best value seen before a resume.
    pub fn with_best(mut self, best: Option<f64>) -> EarlyStopping {
        self.best = best;
        self
    }

    pub fn observe(&mut self, value: f64) -> Verdict {
        let improved = match self.best {
            None => value.is_finite(),
            Some(best) if self.maximize => value > best + self.min_delta,
            Some(best) => value < best - self.min_delta,
        };
        if improved {
            self.best = Some(value);
            self.epochs_without_improvement = 0;
            return Verdict::Improved;
        }
        self.epochs_without_improvement += 1;
        if self.patience > 0 && self.epochs_without_improvement >= self.patience {
            Verdict::Stop
        } else {
            Verdict::NoImprovement
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_after_patience_epochs_without_improvement() {
        let mut stopping = EarlyStopping::new("val_loss", 2, 0.0);
        assert_eq!(stopping.observe(1.0), Verdict::Improved);
        assert_eq!(stopping.observe(0.5), Verdict::Improved);
        assert_eq!(stopping.observe(0.6), Verdict::NoImprovement);
        assert_eq!(stopping.observe(0.4), Verdict::Improved);
        assert_eq!(stopping.observe(0.4), Verdict::NoImprovement);
        assert_eq!(stopping.observe(0.9), Verdict::Stop);
        assert_eq!(stopping.best(), Some(0.4));
    }

    #[test]
    fn accuracy_is_maximized_and_nan_never_improves() {
        let mut stopping = EarlyStopping::new("val_accuracy", 0, 0.0);
        assert_eq!(stopping.observe(f64::NAN), Verdict::NoImprovement);
        assert_eq!(stopping.observe(0.5), Verdict::Improved);
        assert_eq!(stopping.observe(0.4), Verdict::NoImprovement);
        assert_eq!(stopping.observe(0.7), Verdict::Improved);
        for _ in 0..10 {
            assert_eq!(stopping.observe(0.1), Verdict::NoImprovement, "patience 0 never stops");
        }
    }
}
