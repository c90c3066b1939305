//! Whether a sweep's metric has arrived, and if not, what did: so that `val_loss` against
//! `val/loss` is obvious. Pure: the server lists the names its finished runs reported.

use serde::{Deserialize, Serialize};

/// The longest metric name kept; names become CSV columns, map keys and page labels.
pub const MAX_NAME_BYTES: usize = 200;

/// Why a metric name a job reported cannot be kept, if it cannot: empty, longer than
/// [`MAX_NAME_BYTES`], or holding control characters (they would garble a terminal or a log).
pub fn name_problem(name: &str) -> Option<String> {
    if name.trim().is_empty() {
        Some("an empty metric name".to_string())
    } else if name.len() > MAX_NAME_BYTES {
        Some(format!("a metric name of {} bytes (at most {MAX_NAME_BYTES})", name.len()))
    } else if name.chars().any(char::is_control) {
        Some(format!("the metric name {:?} holds control characters", name.chars().take(60).collect::<String>()))
    } else {
        None
    }
}

/// A sweep's `metric.name` that none of its finished runs has reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricMissing {
    /// The metric the sweep ranks by.
    pub name: String,
    /// Runs succeeded so far.
    pub finished: u64,
    /// The metric names its finished runs did report (at most a few dozen), sorted.
    pub arrived: Vec<String>,
    /// The arrived name most like `name`, when one is close.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub did_you_mean: Option<String>,
}

impl MetricMissing {
    /// `None` when the metric arrived or no run has succeeded yet (`finished`: runs succeeded).
    pub fn check(name: &str, finished: u64, arrived: Vec<String>) -> Option<MetricMissing> {
        if finished == 0 || arrived.iter().any(|reported| reported == name) {
            return None;
        }
        let did_you_mean = closest(name, &arrived);
        Some(MetricMissing { name: name.to_string(), finished, arrived, did_you_mean })
    }

    /// One sentence for the CLI and the page.
    pub fn sentence(&self) -> String {
        let runs = if self.finished == 1 { "run has" } else { "runs have" };
        let mut text =
            format!("the metric `{}` has not arrived: {} succeeded {runs} not reported it", self.name, self.finished);
        match self.arrived.is_empty() {
            true => text.push_str("; no run reported any metric (write JSON lines to $APP_METRICS_FILE)"),
            false => {
                let names: Vec<String> = self.arrived.iter().map(|name| format!("`{name}`")).collect();
                text.push_str(&format!("; they reported {}", names.join(", ")));
            }
        }
        if let Some(guess) = &self.did_you_mean {
            text.push_str(&format!(": did you mean `{guess}`?"));
        }
        text
    }
}

/// The name most like `wanted`, ignoring case and the separators people swap (`val_loss`,
/// `val/loss`, `val-loss`, `valLoss`); `None` when none is close.
fn closest(wanted: &str, names: &[String]) -> Option<String> {
    let fold = |text: &str| -> String {
        text.chars().filter(|c| !matches!(c, '_' | '/' | '-' | '.' | ' ')).flat_map(char::to_lowercase).collect()
    };
    let target = fold(wanted);
    names
        .iter()
        .map(|name| {
            let folded = fold(name);
            let distance = strsim::levenshtein(&folded, &target);
            (distance, name)
        })
        .filter(|(distance, _)| *distance <= (target.chars().count() / 4).max(1))
        .min_by_key(|(distance, name)| (*distance, name.len()))
        .map(|(_, name)| name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|name| name.to_string()).collect()
    }

    #[test]
    fn a_metric_that_arrived_or_a_sweep_without_finished_runs_is_fine() {
        assert_eq!(MetricMissing::check("loss", 3, names(&["acc", "loss"])), None);
        assert_eq!(MetricMissing::check("loss", 0, Vec::new()), None);
    }

    #[test]
    fn a_missing_metric_names_what_arrived_and_the_likely_one() {
        let missing = MetricMissing::check("val_loss", 12, names(&["epoch", "train/loss", "val/loss"])).unwrap();
        assert_eq!(missing.did_you_mean.as_deref(), Some("val/loss"));
        assert_eq!(
            missing.sentence(),
            "the metric `val_loss` has not arrived: 12 succeeded runs have not reported it; they reported `epoch`, \
             `train/loss`, `val/loss`: did you mean `val/loss`?"
        );
        assert_eq!(
            MetricMissing::check("valLoss", 1, names(&["val-loss"])).unwrap().did_you_mean.as_deref(),
            Some("val-loss")
        );
        assert_eq!(MetricMissing::check("accuracy", 2, names(&["loss", "lr"])).unwrap().did_you_mean, None);
        let none = MetricMissing::check("loss", 1, Vec::new()).unwrap();
        assert!(none.sentence().contains("1 succeeded run has not") && none.sentence().contains("$APP_METRICS_FILE"));
    }
}
