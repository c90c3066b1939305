//! A sweep's leaderboard: its runs ranked by the sweep's metric, as JSON rows or CSV. Pure
//! functions over rows already read, so ranking and quoting are tested without a server.

use serde_json::Value;
use shared::api::{SummaryRow, SweepSummary};
use shared::sweep::{Goal, Metric};
use std::collections::BTreeSet;

/// Scores each row by the sweep metric (its min when minimizing, its max when maximizing),
/// sorts best first with ties and unscored rows in index order, numbers the scored rows
/// from 1, and keeps the first `top`. Without a metric, rows stay in index order.
pub fn rank(mut rows: Vec<SummaryRow>, metric: Option<&Metric>, top: Option<u32>) -> Vec<SummaryRow> {
    for row in &mut rows {
        row.score = metric.and_then(|metric| {
            let summary = row.metrics.get(&metric.name)?;
            Some(match metric.goal {
                Goal::Minimize => summary.min,
                Goal::Maximize => summary.max,
            })
        });
        row.rank = None;
    }
    let maximize = matches!(metric, Some(Metric { goal: Goal::Maximize, .. }));
    rows.sort_by(|a, b| match (a.score, b.score) {
        (Some(x), Some(y)) => {
            let order = if maximize { y.total_cmp(&x) } else { x.total_cmp(&y) };
            order.then(a.index.cmp(&b.index))
        }
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => a.index.cmp(&b.index),
    });
    for (position, row) in rows.iter_mut().filter(|row| row.score.is_some()).enumerate() {
        row.rank = Some(position as u64 + 1);
    }
    if let Some(top) = top {
        rows.truncate(top as usize);
    }
    rows
}

/// The leaderboard as CSV: `rank,index,job_id,status,score`, then `param.<name>` for every
/// top-level parameter and `<metric>.last`, `.min`, `.max` for every metric seen.
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
    let metrics: BTreeSet<&String> = summary.rows.iter().flat_map(|row| row.metrics.keys()).collect();
    let mut header: Vec<String> = ["rank", "index", "job_id", "status", "score"].map(String::from).to_vec();
    header.extend(params.iter().map(|name| format!("param.{name}")));
    for name in &metrics {
        header.extend(["last", "min", "max"].map(|field| format!("{name}.{field}")));
    }
    let mut out = String::new();
    push_record(&mut out, &header);
    for row in &summary.rows {
        let optional = |value: Option<String>| value.unwrap_or_default();
        let mut record = vec![
            optional(row.rank.map(|rank| rank.to_string())),
            row.index.to_string(),
            row.job_id.to_string(),
            row.status.to_string(),
            optional(row.score.map(|score| score.to_string())),
        ];
        record.extend(params.iter().map(|name| param_text(row.params.get(name))));
        for name in &metrics {
            match row.metrics.get(*name) {
                Some(metric) => record.extend([metric.last, metric.min, metric.max].map(|value| value.to_string())),
                None => record.extend([String::new(), String::new(), String::new()]),
            }
        }
        push_record(&mut out, &record);
    }
    out
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
    use shared::api::{JobId, MetricSummary};
    use shared::job::JobStatus;

    fn row(index: u64, loss: Option<f64>) -> SummaryRow {
        let mut metrics = std::collections::BTreeMap::new();
        if let Some(value) = loss {
            metrics.insert(
                "loss".to_string(),
                MetricSummary { last: value, min: value, max: value, step: None, count: 1 },
            );
        }
        SummaryRow {
            rank: None,
            job_id: JobId::new(index as i64 + 100),
            index,
            status: JobStatus::Succeeded,
            params: json!({"lr": 0.1, "name": "a,\"b\"", "dims": [1, 2]}),
            metrics,
            score: None,
        }
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
            "rank,index,job_id,status,score,param.lr,param.name,param.dims,loss.last,loss.min,loss.max"
        );
        assert_eq!(lines[1], r#"1,0,100,succeeded,0.25,0.1,"a,""b""","[1,2]",0.25,0.25,0.25"#);
        assert_eq!(lines[2], r#",1,101,succeeded,,0.1,"a,""b""","[1,2]",,,"#);
    }
}
