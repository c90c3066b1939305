//! Which parameters matter for a sweep's metric: for each parameter alone, the share of the
//! metric's variance across runs that its values explain (a one-way ANOVA main effect, the
//! first-order term fANOVA reports), corrected for chance so that a parameter which does not
//! matter scores near 0 however many values it took. Continuous parameters with many values
//! are grouped into equal-count bins first. Pure: runs in, ranking out.

use serde_json::Value;
use shared::api::ParamImportance;
use std::collections::{BTreeMap, HashMap};

/// How the page names the method.
pub const METHOD: &str = "main-effect variance share (one-way ANOVA ε², the first-order term of fANOVA): \
     how much of the metric's variance each parameter explains alone, corrected for chance; \
     numeric parameters with many values are split into equal-count bins";

/// Fewer runs than this say nothing about importance.
const MIN_RUNS: usize = 4;

/// One run: its parameters flattened to dotted names, and its value of the metric.
pub struct Run {
    pub params: BTreeMap<String, Value>,
    pub value: f64,
}

/// `{"model": {"lr": 1}}` as `{"model.lr": 1}`; lists and scalars are values.
pub fn flatten(params: &Value) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    flatten_into(params, String::new(), &mut out);
    out
}

fn flatten_into(value: &Value, prefix: String, out: &mut BTreeMap<String, Value>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
                flatten_into(value, path, out);
            }
        }
        other if !prefix.is_empty() => {
            out.insert(prefix, other.clone());
        }
        _ => {}
    }
}

/// Every parameter that varies across `runs`, most important first (ties by name). Runs with
/// a non-finite value are left out; a parameter a run lacks counts as its own value there.
pub fn importance(runs: &[Run]) -> Vec<ParamImportance> {
    let runs: Vec<&Run> = runs.iter().filter(|run| run.value.is_finite()).collect();
    if runs.len() < MIN_RUNS {
        return Vec::new();
    }
    let names: std::collections::BTreeSet<&String> = runs.iter().flat_map(|run| run.params.keys()).collect();
    let values: Vec<f64> = runs.iter().map(|run| run.value).collect();
    let mut ranked: Vec<ParamImportance> = names
        .into_iter()
        .filter_map(|name| {
            let column: Vec<Option<&Value>> = runs.iter().map(|run| run.params.get(name)).collect();
            one_parameter(name, &column, &values)
        })
        .collect();
    ranked.sort_by(|a, b| b.importance.total_cmp(&a.importance).then_with(|| a.name.cmp(&b.name)));
    ranked
}

fn one_parameter(name: &str, column: &[Option<&Value>], values: &[f64]) -> Option<ParamImportance> {
    let numbers: Option<Vec<f64>> = column.iter().map(|value| value.and_then(Value::as_f64)).collect();
    let groups = match &numbers {
        Some(numbers) => numeric_groups(numbers),
        None => categorical_groups(column),
    };
    let group_count = groups.iter().max().map_or(0, |max| max + 1);
    // Constant parameters explain nothing; one run per value leaves no within-group variance
    // to compare against.
    if group_count < 2 || values.len() <= group_count {
        return None;
    }
    Some(ParamImportance {
        name: name.to_string(),
        importance: epsilon_squared(&groups, group_count, values),
        correlation: numbers.as_deref().and_then(|numbers| spearman(numbers, values)),
        groups: group_count as u32,
    })
}

/// Group numbers of categorical values, by their JSON text, in order of first appearance.
fn categorical_groups(column: &[Option<&Value>]) -> Vec<usize> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    column
        .iter()
        .map(|value| {
            let text = value.map_or_else(|| "(absent)".to_string(), |value| value.to_string());
            let next = seen.len();
            *seen.entry(text).or_insert(next)
        })
        .collect()
}

/// Group numbers of numeric values: one group per distinct value when there are few, else
/// equal-count bins in value order (at most √n, at most 10), equal values in one bin.
fn numeric_groups(numbers: &[f64]) -> Vec<usize> {
    let mut distinct: Vec<f64> = numbers.to_vec();
    distinct.sort_by(f64::total_cmp);
    distinct.dedup();
    let bins = ((numbers.len() as f64).sqrt().floor() as usize).clamp(2, 10);
    if distinct.len() <= bins {
        return numbers.iter().map(|n| distinct.partition_point(|d| d.total_cmp(n).is_lt())).collect();
    }
    let mut order: Vec<usize> = (0..numbers.len()).collect();
    order.sort_by(|&a, &b| numbers[a].total_cmp(&numbers[b]));
    let mut groups = vec![0; numbers.len()];
    let mut group = 0;
    for (position, &run) in order.iter().enumerate() {
        let wanted = position * bins / numbers.len();
        let tied = position > 0 && numbers[order[position - 1]] == numbers[run];
        if wanted > group && !tied {
            group += 1;
        }
        groups[run] = group;
    }
    groups
}

/// ε² = (SS_between − (k − 1)·MS_within) / SS_total, clamped to [0, 1].
fn epsilon_squared(groups: &[usize], group_count: usize, values: &[f64]) -> f64 {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let total: f64 = values.iter().map(|v| (v - mean).powi(2)).sum();
    if total <= f64::EPSILON * mean.abs().max(1.0) {
        return 0.0;
    }
    let mut sums = vec![0.0; group_count];
    let mut counts = vec![0.0; group_count];
    for (&group, &value) in groups.iter().zip(values) {
        sums[group] += value;
        counts[group] += 1.0;
    }
    let between: f64 =
        sums.iter().zip(&counts).filter(|(_, &c)| c > 0.0).map(|(&s, &c)| c * (s / c - mean).powi(2)).sum();
    let within = (total - between).max(0.0);
    let k = group_count as f64;
    let mean_square_within = within / (n - k);
    ((between - (k - 1.0) * mean_square_within) / total).clamp(0.0, 1.0)
}

/// Spearman's rank correlation (average ranks for ties); `None` if either side is constant.
fn spearman(xs: &[f64], ys: &[f64]) -> Option<f64> {
    let (rx, ry) = (ranks(xs), ranks(ys));
    let n = xs.len() as f64;
    let (mx, my) = (rx.iter().sum::<f64>() / n, ry.iter().sum::<f64>() / n);
    let mut covariance = 0.0;
    let (mut vx, mut vy) = (0.0, 0.0);
    for (x, y) in rx.iter().zip(&ry) {
        covariance += (x - mx) * (y - my);
        vx += (x - mx).powi(2);
        vy += (y - my).powi(2);
    }
    (vx > 0.0 && vy > 0.0).then(|| (covariance / (vx * vy).sqrt()).clamp(-1.0, 1.0))
}

fn ranks(values: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
    let mut ranks = vec![0.0; values.len()];
    let mut start = 0;
    while start < order.len() {
        let mut end = start;
        while end + 1 < order.len() && values[order[end + 1]] == values[order[start]] {
            end += 1;
        }
        let average = (start + end) as f64 / 2.0 + 1.0;
        for &run in &order[start..=end] {
            ranks[run] = average;
        }
        start = end + 1;
    }
    ranks
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A deterministic stream of numbers in [0, 1) (a 64-bit LCG), for noise and sampling.
    struct Noise(u64);

    impl Noise {
        fn next(&mut self) -> f64 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (self.0 >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    fn run(params: Value, value: f64) -> Run {
        Run { params: flatten(&params), value }
    }

    fn find<'a>(ranked: &'a [ParamImportance], name: &str) -> &'a ParamImportance {
        ranked.iter().find(|item| item.name == name).unwrap_or_else(|| panic!("no {name} in {ranked:?}"))
    }

    #[test]
    fn on_a_grid_the_parameter_that_drives_the_metric_dominates_and_the_other_scores_near_zero() {
        let mut noise = Noise(7);
        let mut runs = Vec::new();
        for lr in [0.1, 0.01, 0.001, 0.0001] {
            for batch in [32, 64, 128, 256] {
                let loss = -f64::log10(lr) + 0.05 * noise.next();
                runs.push(run(json!({"lr": lr, "batch_size": batch}), loss));
            }
        }
        let ranked = importance(&runs);
        assert_eq!(ranked[0].name, "lr");
        assert!(find(&ranked, "lr").importance > 0.95, "{ranked:?}");
        assert!(find(&ranked, "batch_size").importance < 0.05, "{ranked:?}");
        // Lower lr, higher loss: a perfect negative rank correlation.
        assert!(find(&ranked, "lr").correlation.unwrap() < -0.9);
        assert_eq!(find(&ranked, "lr").groups, 4);
    }

    #[test]
    fn continuous_random_parameters_are_binned_and_noise_parameters_stay_low() {
        let mut noise = Noise(42);
        let runs: Vec<Run> = (0..200)
            .map(|_| {
                let (x, y) = (noise.next(), noise.next());
                run(json!({"model": {"dropout": x}, "seed_noise": y}), 3.0 * x + 0.2 * noise.next())
            })
            .collect();
        let ranked = importance(&runs);
        let dropout = find(&ranked, "model.dropout");
        assert!(dropout.importance > 0.8, "{ranked:?}");
        assert_eq!(dropout.groups, 10);
        assert!(find(&ranked, "seed_noise").importance < 0.1, "{ranked:?}");
        assert!(dropout.correlation.unwrap() > 0.9);
    }

    #[test]
    fn categorical_parameters_count_and_constant_or_one_run_per_value_ones_are_left_out() {
        let runs: Vec<Run> = (0..12)
            .map(|i| {
                let optimizer = if i % 2 == 0 { "adam" } else { "sgd" };
                let value = if i % 2 == 0 { 1.0 } else { 2.0 } + 0.01 * (i as f64);
                run(json!({"optimizer": optimizer, "fixed": 3, "name": format!("run-{i}"), "dims": [i % 3, 1]}), value)
            })
            .collect();
        let ranked = importance(&runs);
        let names: Vec<&str> = ranked.iter().map(|item| item.name.as_str()).collect();
        assert_eq!(names, ["optimizer", "dims"]);
        assert!(ranked[0].importance > 0.95 && ranked[0].correlation.is_none());
        assert!(ranked[1].importance < 0.1, "{ranked:?}");
    }

    #[test]
    fn too_few_runs_or_a_flat_metric_say_nothing() {
        let few: Vec<Run> = (0..3).map(|i| run(json!({"a": i}), i as f64)).collect();
        assert!(importance(&few).is_empty());
        let flat: Vec<Run> = (0..8).map(|i| run(json!({"a": i % 2}), 1.0)).collect();
        assert_eq!(importance(&flat)[0].importance, 0.0);
        let broken: Vec<Run> = (0..8).map(|i| run(json!({"a": i % 2}), f64::NAN)).collect();
        assert!(importance(&broken).is_empty());
    }
}
