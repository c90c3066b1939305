//! `metrics_regex:`: metric points from the lines a script prints, for scripts that log
//! nothing else. A pattern's named groups say what a match gives:
//!
//! - `name` and `value`: one point per match, so `(?P<name>\w+)=(?P<value>\S+)` reads every
//!   `key=value` pair of `epoch 3 loss=0.41 acc=0.88`;
//! - any other names: each group is a metric of that name, so
//!   `val_loss (?P<val_loss>[0-9.e+-]+)` gives `val_loss`;
//! - `step`, in either case: the step of the line's points.
//!
//! A group that did not take part in a match, or whose text is not a finite number, gives no
//! point. Patterns are Rust's `regex` syntax (no look-around or back-references), which runs
//! in time linear in the line: a pattern cannot hang a worker on a hostile line.

use regex::Regex;

/// The longest line a pattern is tried on; longer lines are skipped.
pub const MAX_LINE: usize = 64 * 1024;

#[derive(Debug, Clone)]
pub struct MetricPattern {
    regex: Regex,
    /// Whether the pattern names its points through `name` and `value` groups.
    pairs: bool,
    /// The metric groups (every named group but `step`), when not `pairs`.
    metrics: Vec<String>,
}

impl MetricPattern {
    /// Compiles `pattern`; refused with a reason when it does not compile or has no group that
    /// could give a point.
    pub fn new(pattern: &str) -> Result<MetricPattern, String> {
        let regex = regex::RegexBuilder::new(pattern)
            .size_limit(1 << 20)
            .build()
            .map_err(|error| format!("`{pattern}` is not a valid pattern: {}", one_line(&error.to_string())))?;
        let names: Vec<String> = regex.capture_names().flatten().map(str::to_string).collect();
        let has = |group: &str| names.iter().any(|name| name == group);
        let pairs = has("name") && has("value");
        let metrics: Vec<String> = names.iter().filter(|name| name.as_str() != "step").cloned().collect();
        if !pairs && metrics.is_empty() {
            return Err(format!(
                "`{pattern}` names no metric: use groups `(?P<name>...)` and `(?P<value>...)`, \
                 or a group named after the metric, like `(?P<val_loss>[0-9.e+-]+)`"
            ));
        }
        Ok(MetricPattern { regex, pairs, metrics })
    }

    /// The points `line` gives: `(step, name, value)`.
    pub fn points(&self, line: &str) -> Vec<(Option<i64>, String, f64)> {
        if line.len() > MAX_LINE {
            return Vec::new();
        }
        let mut points = Vec::new();
        for captures in self.regex.captures_iter(line) {
            let step = captures.name("step").and_then(|step| number(step.as_str())).map(|step| step as i64);
            if self.pairs {
                let (Some(name), Some(value)) = (captures.name("name"), captures.name("value")) else { continue };
                if let Some(value) = number(value.as_str()) {
                    points.push((step, name.as_str().to_string(), value));
                }
            } else {
                for metric in &self.metrics {
                    if let Some(value) = captures.name(metric).and_then(|value| number(value.as_str())) {
                        points.push((step, metric.clone(), value));
                    }
                }
            }
        }
        points
    }
}

/// A finite number, allowing a trailing `,` or `;` the pattern took in.
fn number(text: &str) -> Option<f64> {
    text.trim().trim_end_matches([',', ';']).parse::<f64>().ok().filter(|value| value.is_finite())
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_give_a_point_per_match_with_the_line_s_step() {
        let pattern = MetricPattern::new(r"(?:step (?P<step>\d+))|(?P<name>\w+)=(?P<value>\S+)").unwrap();
        let points = pattern.points("loss=0.41 acc=0.88, lr=oops");
        assert_eq!(points, vec![(None, "loss".into(), 0.41), (None, "acc".into(), 0.88)]);
    }

    #[test]
    fn named_groups_are_metrics_and_step_is_the_step() {
        let pattern = MetricPattern::new(r"epoch (?P<step>\d+): val_loss (?P<val_loss>\S+) acc (?P<acc>\S+)?").unwrap();
        assert_eq!(
            pattern.points("epoch 3: val_loss 0.25 acc nan"),
            vec![(Some(3), "val_loss".into(), 0.25)],
            "a NaN is no point"
        );
        assert!(pattern.points("nothing here").is_empty());
        assert!(pattern.points(&"x".repeat(MAX_LINE + 1)).is_empty());
    }

    #[test]
    fn patterns_that_cannot_give_points_are_refused_with_a_reason() {
        assert!(MetricPattern::new("(unclosed").unwrap_err().contains("not a valid pattern"));
        assert!(MetricPattern::new(r"loss (\d+)").unwrap_err().contains("names no metric"));
        assert!(MetricPattern::new(r"(?P<step>\d+)").unwrap_err().contains("names no metric"));
        assert!(MetricPattern::new(r"(?=look)(?P<x>\d)").unwrap_err().contains("not a valid pattern"));
    }
}
