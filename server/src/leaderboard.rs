//! A sweep's leaderboard: its runs ranked by the sweep's metric, which way each of its other
//! metrics improves, as JSON rows or CSV. Pure functions over rows already read, so ranking,
//! directions and quoting are tested without a server.

pub mod importance;
pub mod progress;

use serde_json::Value;
use shared::api::{DirectionBasis, MetricDirection, MetricSummary, SummaryRow, SweepSummary};
use shared::job::JobStatus;
use shared::sweep::{Goal, Metric};
use std::collections::BTreeSet;

/// Scores each row by the sweep metric (its min when minimizing, its max when maximizing),
/// sorts best first with ties and unscored rows in index order, numbers the scored rows
/// from 1, and keeps the first `top`. Without a metric, rows stay in index order. Runs
/// stopped early, then runs cancelled by hand, come after the ranked runs, unranked: their
/// score is from part of a run.
pub fn rank(mut rows: Vec<SummaryRow>, metric: Option<&Metric>, top: Option<u32>) -> Vec<SummaryRow> {
    for row in &mut rows {
        row.score = metric.and_then(|metric| Some(best_of(row.metrics.get(&metric.name)?, metric.goal)));
        row.rank = None;
    }
    let maximize = matches!(metric, Some(Metric { goal: Goal::Maximize, .. }));
    // Ranked runs, then runs stopped early, then runs cancelled by hand, then runs without a score.
    let group = |row: &SummaryRow| match (row.score, &row.stopped_early, row.status) {
        (_, Some(_), _) => 1,
        (Some(_), None, JobStatus::Cancelled) => 2,
        (Some(_), None, _) => 0,
        (None, None, _) => 3,
    };
    rows.sort_by(|a, b| {
        group(a).cmp(&group(b)).then_with(|| match (a.score, b.score) {
            (Some(x), Some(y)) => {
                let order = if maximize { y.total_cmp(&x) } else { x.total_cmp(&y) };
                order.then(a.index.cmp(&b.index))
            }
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => a.index.cmp(&b.index),
        })
    });
    for (position, row) in rows.iter_mut().filter(|row| group(row) == 0).enumerate() {
        row.rank = Some(position as u64 + 1);
    }
    if let Some(top) = top {
        rows.truncate(top as usize);
    }
    rows
}

/// Name parts that say a metric is better higher: accuracy, F-scores, areas under curves,
/// precision and recall, mean average precision, overlap scores, translation scores, rewards.
/// The same reading of metric names as KerasTuner's and TensorBoard's HParams defaults: the
/// name's words, not its letters anywhere (`mapping_time` is not mAP).
const HIGHER_IS_BETTER: &[&str] = &[
    "acc",
    "accuracy",
    "f1",
    "fscore",
    "f1score",
    "auc",
    "auroc",
    "auprc",
    "rocauc",
    "precision",
    "recall",
    "map",
    "ap",
    "iou",
    "miou",
    "dice",
    "bleu",
    "rouge",
    "psnr",
    "ssim",
    "r2",
    "reward",
    "rewards",
    "return",
    "returns",
];

/// Name parts that say a metric is better lower: losses, errors and error rates, perplexity,
/// regret, and times.
const LOWER_IS_BETTER: &[&str] = &[
    "loss",
    "losses",
    "nll",
    "error",
    "err",
    "mse",
    "mae",
    "rmse",
    "mape",
    "wer",
    "cer",
    "perplexity",
    "ppl",
    "regret",
    "time",
    "latency",
    "duration",
    "seconds",
];

/// Which way the metric `name` improves: the sweep's goal for the sweep's metric, else what its
/// name says, else unknown (a name that says both, like `loss_acc`, is unknown too).
pub fn direction(name: &str, sweep_metric: Option<&Metric>) -> MetricDirection {
    if let Some(metric) = sweep_metric.filter(|metric| metric.name == name) {
        return MetricDirection { name: name.into(), goal: Some(metric.goal), basis: DirectionBasis::SweepGoal };
    }
    let words = name_words(name);
    let says = |list: &[&str]| words.iter().any(|word| list.contains(&word.as_str()));
    let goal = match (says(HIGHER_IS_BETTER), says(LOWER_IS_BETTER)) {
        (true, false) => Some(Goal::Maximize),
        (false, true) => Some(Goal::Minimize),
        _ => None,
    };
    let basis = if goal.is_some() { DirectionBasis::Name } else { DirectionBasis::Unknown };
    MetricDirection { name: name.into(), goal, basis }
}

/// The words of a metric name, lowercase: split at anything not a letter or digit and before a
/// capital that starts a word after a lowercase letter (`valAcc`, but `mAP` and `IoU` stay
/// whole), each also without a trailing number (`acc1`, `map50`).
fn name_words(name: &str) -> Vec<String> {
    let characters: Vec<char> = name.chars().collect();
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    for (at, &character) in characters.iter().enumerate() {
        let starts_word = at > 0
            && character.is_uppercase()
            && characters[at - 1].is_lowercase()
            && characters.get(at + 1).is_some_and(|next| next.is_lowercase());
        if (starts_word || !character.is_alphanumeric()) && !word.is_empty() {
            words.push(std::mem::take(&mut word));
        }
        if character.is_alphanumeric() {
            word.extend(character.to_lowercase());
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    let stripped: Vec<String> = words
        .iter()
        .map(|word| word.trim_end_matches(|c: char| c.is_ascii_digit()).to_string())
        .filter(|word| !word.is_empty())
        .collect();
    words.extend(stripped);
    words
}

/// The direction of every metric the rows have, by name.
pub fn directions(rows: &[SummaryRow], sweep_metric: Option<&Metric>) -> Vec<MetricDirection> {
    let names: BTreeSet<&String> = rows.iter().flat_map(|row| row.metrics.keys()).collect();
    names.into_iter().map(|name| direction(name, sweep_metric)).collect()
}

/// The leaderboard as CSV: `rank,index,job_id,status,score`, then `param.<name>` for every
/// top-level parameter and `<metric>.last`, `.min`, `.max` for every metric seen, and
/// `<metric>.best` (its max or min) for each metric whose direction is known; then, when any
/// run recorded its GPU use, `gpu.util_mean`, `gpu.util_p95`, `gpu.memory_peak` (bytes),
/// `gpu.hours` and `gpu.idle` (the GPUs flagged mostly idle, space-separated).
pub fn to_csv(summary: &SweepSummary) -> String {
    let mut params: Vec<String> = Vec::new();
    for row in &summary.rows {
        if let Value::Object(map) = &row.params {
            for name in map.keys() {
                if !params.contains(name) {
                    params.push(name.clone());
                }
            }
        }
    }
    let metrics = directions(&summary.rows, summary.metric.as_ref());
    let mut header: Vec<String> = ["rank", "index", "job_id", "status", "score"].map(String::from).to_vec();
    header.extend(params.iter().map(|name| format!("param.{name}")));
    for metric in &metrics {
        header.extend(["last", "min", "max"].map(|field| format!("{}.{field}", metric.name)));
        if metric.goal.is_some() {
            header.push(format!("{}.best", metric.name));
        }
    }
    let gpu = summary.rows.iter().any(|row| row.gpu_usage.is_some());
    if gpu {
        header.extend(GPU_COLUMNS.map(String::from));
    }
    let mut out = String::new();
    push_record(&mut out, &header);
    for row in &summary.rows {
        let optional = |value: Option<String>| value.unwrap_or_default();
        let mut record = vec![
            optional(row.rank.map(|rank| rank.to_string())),
            row.index.to_string(),
            row.job_id.to_string(),
            if row.stopped_early.is_some() { "stopped_early".to_owned() } else { row.status.to_string() },
            optional(row.score.map(|score| score.to_string())),
        ];
        record.extend(params.iter().map(|name| param_text(row.params.get(name))));
        for metric in &metrics {
            let values = row.metrics.get(&metric.name);
            match values {
                Some(values) => record.extend([values.last, values.min, values.max].map(|value| value.to_string())),
                None => record.extend([String::new(), String::new(), String::new()]),
            }
            if let Some(goal) = metric.goal {
                record.push(optional(values.map(|values| best_of(values, goal).to_string())));
            }
        }
        if gpu {
            record.extend(gpu_fields(row.gpu_usage.as_ref()));
        }
        push_record(&mut out, &record);
    }
    out
}

const GPU_COLUMNS: [&str; 5] = ["gpu.util_mean", "gpu.util_p95", "gpu.memory_peak", "gpu.hours", "gpu.idle"];

fn gpu_fields(usage: Option<&shared::api::GpuUsage>) -> [String; 5] {
    let Some(usage) = usage else { return Default::default() };
    let text = |value: Option<f64>| value.map(|value| value.to_string()).unwrap_or_default();
    let idle: Vec<String> = usage.idle_gpus.iter().map(u32::to_string).collect();
    [
        text(usage.utilization_mean),
        text(usage.utilization_p95),
        usage.memory_peak.map(|bytes| bytes.to_string()).unwrap_or_default(),
        format!("{:.4}", usage.gpu_hours),
        idle.join(" "),
    ]
}

/// A metric's best value over a run: its max or its min.
pub fn best_of(values: &MetricSummary, goal: Goal) -> f64 {
    match goal {
        Goal::Maximize => values.max,
        Goal::Minimize => values.min,
    }
}

/// A parameter as a CSV cell: strings as they are, lists and objects as compact JSON.
fn param_text(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    }
}

fn push_record(out: &mut String, fields: &[String]) {
    for (position, field) in fields.iter().enumerate() {
        if position > 0 {
            out.push(',');
        }
        push_field(out, field);
    }
    out.push('\n');
}

/// RFC 4180 quoting: a field with a comma, a quote or a line break is quoted, quotes doubled.
fn push_field(out: &mut String, field: &str) {
    if field.contains([',', '"', '\n', '\r']) {
        out.push('"');
        out.push_str(&field.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(field);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use shared::api::JobId;

    fn row(index: u64, loss: Option<f64>) -> SummaryRow {
        let mut metrics = std::collections::BTreeMap::new();
        if let Some(value) = loss {
            metrics.insert(
                "loss".to_string(),
                MetricSummary { last: value, min: value, max: value, step: None, count: 1 },
            );
        }
        SummaryRow {
            gpu_usage: None,
            rank: None,
            job_id: JobId::new(index as i64 + 100),
            index,
            status: JobStatus::Succeeded,
            params: json!({"lr": 0.1, "name": "a,\"b\"", "dims": [1, 2]}),
            metrics,
            score: None,
            stopped_early: None,
        }
    }

    #[test]
    fn csv_has_gpu_columns_when_a_run_recorded_its_gpu_use() {
        let mut measured = row(1, Some(0.2));
        measured.gpu_usage = Some(shared::api::GpuUsage {
            gpus: vec![0],
            samples: 10,
            utilization_mean: Some(12.5),
            utilization_p95: Some(30.0),
            memory_peak: Some(1 << 30),
            gpu_hours: 0.25,
            idle_gpus: vec![0],
        });
        let summary = SweepSummary { sweep: "s".into(), metric: None, rows: vec![row(0, None), measured] };
        let csv = to_csv(&summary);
        let lines: Vec<&str> = csv.lines().collect();
        assert!(lines[0].ends_with(",gpu.util_mean,gpu.util_p95,gpu.memory_peak,gpu.hours,gpu.idle"), "{}", lines[0]);
        assert!(lines[1].ends_with(",,,,,"), "{}", lines[1]);
        assert!(lines[2].ends_with(",12.5,30,1073741824,0.2500,0"), "{}", lines[2]);
        let without = SweepSummary { sweep: "s".into(), metric: None, rows: vec![row(0, None)] };
        assert!(!to_csv(&without).contains("gpu."));
    }

    fn metric(goal: Goal) -> Metric {
        Metric { name: "loss".into(), goal }
    }

    fn order(rows: &[SummaryRow]) -> Vec<(u64, Option<u64>)> {
        rows.iter().map(|row| (row.index, row.rank)).collect()
    }

    #[test]
    fn rows_rank_by_goal_with_unscored_rows_last_and_ties_by_index() {
        let rows = vec![row(0, None), row(1, Some(0.5)), row(2, Some(0.2)), row(3, Some(0.5))];
        let minimized = rank(rows.clone(), Some(&metric(Goal::Minimize)), None);
        assert_eq!(order(&minimized), [(2, Some(1)), (1, Some(2)), (3, Some(3)), (0, None)]);
        let maximized = rank(rows.clone(), Some(&metric(Goal::Maximize)), Some(2));
        assert_eq!(order(&maximized), [(1, Some(1)), (3, Some(2))]);
        let unranked = rank(rows, None, None);
        assert_eq!(order(&unranked), [(0, None), (1, None), (2, None), (3, None)]);
    }

    #[test]
    fn runs_stopped_early_come_after_the_ranked_runs_without_a_rank() {
        let stopped = |index, loss| SummaryRow {
            status: JobStatus::Cancelled,
            stopped_early: Some(shared::api::StoppedEarly {
                rung: 3,
                cutoff: Some(0.3),
                reason: "stopped early".into(),
                at: 1,
            }),
            ..row(index, loss)
        };
        let rows =
            vec![stopped(0, Some(0.1)), row(1, Some(0.5)), row(2, None), stopped(3, Some(0.9)), row(4, Some(0.2))];
        let ranked = rank(rows, Some(&metric(Goal::Minimize)), None);
        assert_eq!(order(&ranked), [(4, Some(1)), (1, Some(2)), (0, None), (3, None), (2, None)]);
        let top = rank(ranked.clone(), Some(&metric(Goal::Minimize)), Some(2));
        assert_eq!(order(&top), [(4, Some(1)), (1, Some(2))], "a stopped run never takes a place in the top");
        // A run cancelled by hand mid-run is not ranked with its partial value either: it comes
        // after the stopped ones, before the runs without a value.
        let cancelled = SummaryRow { status: JobStatus::Cancelled, ..row(5, Some(0.01)) };
        let with = rank([ranked.clone(), vec![cancelled]].concat(), Some(&metric(Goal::Minimize)), None);
        assert_eq!(order(&with), [(4, Some(1)), (1, Some(2)), (0, None), (3, None), (5, None), (2, None)]);
        let csv = to_csv(&SweepSummary { sweep: "s".into(), metric: Some(metric(Goal::Minimize)), rows: ranked });
        assert!(csv.lines().nth(3).unwrap().starts_with(",0,100,stopped_early,0.1,"), "{csv}");
    }

    #[test]
    fn csv_quotes_what_needs_it_and_flattens_params() {
        let summary = SweepSummary {
            sweep: "s".into(),
            metric: None,
            rows: rank(vec![row(0, Some(0.25)), row(1, None)], Some(&metric(Goal::Minimize)), None),
        };
        let csv = to_csv(&summary);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(
            lines[0],
            "rank,index,job_id,status,score,param.lr,param.name,param.dims,loss.last,loss.min,loss.max,loss.best"
        );
        assert_eq!(lines[1], r#"1,0,100,succeeded,0.25,0.1,"a,""b""","[1,2]",0.25,0.25,0.25,0.25"#);
        assert_eq!(lines[2], r#",1,101,succeeded,,0.1,"a,""b""","[1,2]",,,,"#);
    }

    fn goal_of(name: &str, sweep: Option<&Metric>) -> Option<Goal> {
        direction(name, sweep).goal
    }

    #[test]
    fn metric_names_say_which_way_they_improve() {
        for name in [
            "acc",
            "val_acc",
            "val_accuracy",
            "top1_acc",
            "acc1",
            "valAcc",
            "f1",
            "macro_f1",
            "roc_auc",
            "auc",
            "precision",
            "recall@10",
            "mAP",
            "map50",
            "bbox/AP",
            "miou",
            "test/IoU",
            "bleu",
            "episode_reward",
            "mean_return",
        ] {
            assert_eq!(goal_of(name, None), Some(Goal::Maximize), "{name}");
        }
        for name in [
            "loss",
            "val_loss",
            "trainLoss",
            "error",
            "top1_error",
            "mse",
            "val_mae",
            "rmse",
            "perplexity",
            "ppl",
            "epoch_time",
            "step_time",
            "wer",
        ] {
            assert_eq!(goal_of(name, None), Some(Goal::Minimize), "{name}");
        }
        // Letters inside another word do not count, and a name saying both ways is unknown.
        for name in ["lr", "grad_norm", "mapping", "accumulation_steps", "timestep", "loss_acc", "epoch", "step"] {
            assert_eq!(direction(name, None).basis, DirectionBasis::Unknown, "{name}");
        }
    }

    #[test]
    fn the_sweep_metric_follows_the_sweep_goal_and_the_others_their_names() {
        let maximized_loss = Metric { name: "loss".into(), goal: Goal::Maximize };
        let own = direction("loss", Some(&maximized_loss));
        assert_eq!((own.goal, own.basis), (Some(Goal::Maximize), DirectionBasis::SweepGoal));
        // Under "minimize loss", accuracy is still best at its max.
        let accuracy = direction("val_accuracy", Some(&metric(Goal::Minimize)));
        assert_eq!((accuracy.goal, accuracy.basis), (Some(Goal::Maximize), DirectionBasis::Name));
        let mut rows = vec![row(0, Some(0.5))];
        rows[0].metrics.insert("lr".into(), MetricSummary { last: 0.1, min: 0.01, max: 0.1, step: None, count: 2 });
        let found = directions(&rows, Some(&metric(Goal::Minimize)));
        let names: Vec<(&str, Option<Goal>)> = found.iter().map(|d| (d.name.as_str(), d.goal)).collect();
        assert_eq!(names, [("loss", Some(Goal::Minimize)), ("lr", None)]);
    }

    #[test]
    fn csv_best_columns_follow_each_metrics_direction_and_unknown_ones_have_none() {
        let mut first = row(0, Some(0.5));
        first.metrics.insert("acc".into(), MetricSummary { last: 0.7, min: 0.2, max: 0.9, step: None, count: 3 });
        first.metrics.insert("lr".into(), MetricSummary { last: 0.1, min: 0.01, max: 0.1, step: None, count: 2 });
        let summary = SweepSummary { sweep: "s".into(), metric: Some(metric(Goal::Minimize)), rows: vec![first] };
        let csv = to_csv(&summary);
        let lines: Vec<&str> = csv.lines().collect();
        assert!(
            lines[0].ends_with(
                "acc.last,acc.min,acc.max,acc.best,loss.last,loss.min,loss.max,loss.best,lr.last,lr.min,lr.max"
            ),
            "{}",
            lines[0]
        );
        assert!(lines[1].ends_with("0.7,0.2,0.9,0.9,0.5,0.5,0.5,0.5,0.1,0.01,0.1"), "{}", lines[1]);
    }
}
