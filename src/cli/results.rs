//! `app results SWEEP [--top 5] [--csv | --json]`: the leaderboard, its ranking metric first.

use super::{format, table, UrlArg};
use anyhow::Context;
use clap::Args;
use comfy_table::Table;
use shared::api::{SummaryRow, SweepSummary};
use shared::sweep::Goal;
use std::collections::BTreeSet;
use std::io::Write;

#[derive(Debug, Args)]
pub struct ResultsArgs {
    /// The sweep (id or name).
    pub sweep: String,
    /// Only the best N runs.
    #[arg(long)]
    pub top: Option<u32>,
    /// Print CSV instead of a table.
    #[arg(long, conflicts_with = "json")]
    pub csv: bool,
    /// Print the leaderboard as JSON (exact values).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub url: UrlArg,
}

pub async fn run(args: ResultsArgs) -> anyhow::Result<()> {
    let client = super::client(&args.url)?;
    let mut out = std::io::stdout().lock();
    if args.csv {
        let csv =
            client.summary_csv(&args.sweep, args.top).await.with_context(|| format!("summarising {}", args.sweep))?;
        out.write_all(csv.as_bytes())?;
        return Ok(());
    }
    let summary = client.summary(&args.sweep, args.top).await.with_context(|| format!("summarising {}", args.sweep))?;
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&summary)?)?;
        return Ok(());
    }
    match &summary.metric {
        Some(metric) => writeln!(
            out,
            "sweep {}, ranked by {} ({})",
            summary.sweep,
            metric.name,
            super::status::goal_word(metric.goal)
        )?,
        None => writeln!(out, "sweep {} (no metric: in index order)", summary.sweep)?,
    }
    // Said on stderr, before the table: a ranking by a metric nobody reported ranks nothing.
    if summary.metric.is_some() {
        if let Ok(detail) = client.sweep(&args.sweep).await {
            if let Some(missing) = detail.metric_missing {
                eprintln!("warning: {}", missing.sentence());
            }
        }
    }
    if summary.rows.is_empty() {
        writeln!(out, "no runs yet")?;
        return Ok(());
    }
    // Parameters every run has the same value of (W&B's `value:`) are said once, not as columns
    // (not for a top: the same in the best N is not the same in every run).
    let (constants, summary) = match args.top {
        None => without_constants(summary),
        Some(_) => (Vec::new(), summary),
    };
    let width = table::terminal_width();
    if !constants.is_empty() {
        writeln!(out, "the same in every run:")?;
        for (name, value) in &constants {
            writeln!(out, "{}", fit(&format!("  {name}={value}"), width))?;
        }
    }
    writeln!(out, "{}", table::render(&leaderboard(&summary, width)))?;
    Ok(())
}

/// `line` cut to `width` characters with an ellipsis (whole without a width: piped output).
fn fit(line: &str, width: Option<u16>) -> String {
    match width.map(usize::from) {
        Some(width) if line.chars().count() > width => {
            line.chars().take(width.saturating_sub(1)).chain(std::iter::once('…')).collect()
        }
        _ => line.to_string(),
    }
}

/// A run's status as the table says it: a run stopped early is not one cancelled by hand.
fn status_word(row: &SummaryRow) -> String {
    match row.stopped_early {
        Some(_) => "stopped early".to_string(),
        None => row.status.to_string(),
    }
}

/// Splits off the parameters that have one value in every row (when there are two rows or
/// more), shown as `name=value`; the rows keep the others.
pub fn without_constants(mut summary: SweepSummary) -> (Vec<(String, String)>, SweepSummary) {
    if summary.rows.len() < 2 {
        return (Vec::new(), summary);
    }
    let names = format::param_names(summary.rows.iter().map(|row| &row.params));
    let first = &summary.rows[0].params;
    let constant: Vec<String> = names
        .into_iter()
        .filter(|name| {
            let value = first.get(name);
            value.is_some() && summary.rows.iter().all(|row| row.params.get(name) == value)
        })
        .collect();
    let shown = constant.iter().map(|name| (name.clone(), format::param_value(&first[name]))).collect();
    for row in &mut summary.rows {
        if let serde_json::Value::Object(params) = &mut row.params {
            for name in &constant {
                params.remove(name);
            }
        }
    }
    (shown, summary)
}

/// The leaderboard: rank, the ranking metric's best value, the run, the other metrics' last
/// values, then a column per parameter; when that does not fit, the run in one cell, metric
/// headers over two lines and the parameters folded into one `key=value` per line.
pub fn leaderboard(summary: &SweepSummary, width: Option<u16>) -> Table {
    let ranking = summary.metric.as_ref();
    let others: Vec<String> = summary
        .rows
        .iter()
        .flat_map(|row| row.metrics.keys())
        .filter(|name| ranking.is_none_or(|metric| &metric.name != *name))
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let params = format::param_names(summary.rows.iter().map(|row| &row.params));
    // (name, qualifier) of each metric column. Other metrics show their last value: which of
    // min or max is "best" depends on the metric, which only the ranking metric says.
    let mut metrics: Vec<(String, &str)> = Vec::new();
    if let Some(metric) = ranking {
        metrics.push((metric.name.clone(), if metric.goal == Goal::Maximize { "max" } else { "min" }));
    }
    metrics.extend(others.iter().map(|name| (name.clone(), "last")));
    let metric_cells = |row: &SummaryRow| -> Vec<String> {
        let mut cells = Vec::new();
        if ranking.is_some() {
            cells.push(row.score.map(format::metric).unwrap_or_default());
        }
        cells.extend(
            others
                .iter()
                .map(|name| row.metrics.get(name).map(|summary| format::metric(summary.last)).unwrap_or_default()),
        );
        cells
    };
    let rank = |row: &SummaryRow| row.rank.map(|rank| rank.to_string()).unwrap_or_default();

    let mut header = vec!["rank".to_string()];
    header.extend(metrics.iter().take(usize::from(ranking.is_some())).map(|(name, word)| format!("{name} ({word})")));
    header.extend(["job", "#", "status"].map(String::from));
    header.extend(metrics.iter().skip(usize::from(ranking.is_some())).map(|(name, word)| format!("{name} ({word})")));
    header.extend(params.iter().cloned());
    let mut wide = table::Layout::new(header);
    for row in &summary.rows {
        let values = metric_cells(row);
        let (ranked, rest) = values.split_at(usize::from(ranking.is_some()));
        let mut cells = vec![rank(row)];
        cells.extend(ranked.iter().cloned());
        cells.extend([row.job_id.to_string(), row.index.to_string(), status_word(row)]);
        cells.extend(rest.iter().cloned());
        cells.extend(params.iter().map(|name| row.params.get(name).map(format::param_value).unwrap_or_default()));
        wide.rows.push(cells);
    }
    let ranked = usize::from(ranking.is_some());
    // rank, the ranking metric, job, #, then the other metrics after status.
    let numbers: Vec<usize> = (0..=ranked)
        .chain([ranked + 1, ranked + 2])
        .chain((0..others.len()).map(|offset| ranked + 4 + offset))
        .collect();
    wide.right = numbers.clone();
    wide.fixed = numbers.into_iter().chain([ranked + 3]).collect();

    let narrow = || {
        let mut header = vec!["rank".to_string()];
        header.extend(metrics.iter().take(ranked).map(|(name, word)| format!("{name}\n({word})")));
        header.push("job".into());
        header.extend(metrics.iter().skip(ranked).map(|(name, word)| format!("{name}\n({word})")));
        header.push("params".into());
        let mut narrow = table::Layout::new(header);
        for row in &summary.rows {
            let values = metric_cells(row);
            let (ranked_value, rest) = values.split_at(ranked);
            let mut cells = vec![rank(row)];
            cells.extend(ranked_value.iter().cloned());
            // The run, and its status when it did not succeed.
            let mut run = format!("{} #{}", row.job_id, row.index);
            if row.status != shared::job::JobStatus::Succeeded {
                run = format!("{run}\n{}", row.status);
            }
            cells.push(run);
            cells.extend(rest.iter().cloned());
            cells.push(format::params_lines(&row.params));
            narrow.rows.push(cells);
        }
        let numbers: Vec<usize> = (0..=ranked).chain((0..others.len()).map(|offset| ranked + 2 + offset)).collect();
        narrow.right = numbers.clone();
        narrow.fixed = numbers.into_iter().chain([ranked + 1]).collect();
        narrow
    };
    table::fit(wide, narrow, width)
}
