//! `app results SWEEP [--top 5] [--csv]` (the leaderboard) and `app files JOB [--download DIR]`
//! (a job's stored result versions).

use super::UrlArg;
use anyhow::Context;
use clap::Args;
use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::Table;
use shared::api::SummaryRow;
use std::io::Write;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ResultsArgs {
    /// The sweep (id or name).
    pub sweep: String,
    /// Only the best N runs.
    #[arg(long)]
    pub top: Option<u32>,
    /// Print CSV instead of a table.
    #[arg(long)]
    pub csv: bool,
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
    let param_names = summary
        .rows
        .first()
        .and_then(|row| row.params.as_object())
        .map(|params| params.keys().cloned().collect::<Vec<_>>())
        .unwrap_or_default();
    let metric_names: std::collections::BTreeSet<String> =
        summary.rows.iter().flat_map(|row| row.metrics.keys().cloned()).collect();
    let mut header = vec!["rank".to_string(), "job".into(), "#".into(), "status".into()];
    header.extend(param_names.iter().cloned());
    header.extend(metric_names.iter().flat_map(|name| [format!("{name} (last)"), format!("{name} (best)")]));
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header(header);
    let goal_is_max = summary.metric.as_ref().is_some_and(|metric| metric.goal == shared::sweep::Goal::Maximize);
    for row in &summary.rows {
        table.add_row(cells(row, &param_names, &metric_names, goal_is_max));
    }
    if let Some(metric) = &summary.metric {
        writeln!(
            out,
            "sweep {}, ranked by {} ({})",
            summary.sweep,
            metric.name,
            format!("{:?}", metric.goal).to_lowercase()
        )?;
    } else {
        writeln!(out, "sweep {} (no metric: in index order)", summary.sweep)?;
    }
    writeln!(out, "{table}")?;
    Ok(())
}

fn cells(
    row: &SummaryRow,
    params: &[String],
    metrics: &std::collections::BTreeSet<String>,
    goal_is_max: bool,
) -> Vec<String> {
    let mut cells = vec![
        row.rank.map(|rank| rank.to_string()).unwrap_or_default(),
        row.job_id.to_string(),
        row.index.to_string(),
        row.status.to_string(),
    ];
    for name in params {
        cells.push(match row.params.get(name) {
            Some(serde_json::Value::String(text)) => text.clone(),
            Some(value) => value.to_string(),
            None => String::new(),
        });
    }
    for name in metrics {
        match row.metrics.get(name) {
            Some(summary) => {
                cells.push(format!("{:.6}", summary.last));
                cells.push(format!("{:.6}", if goal_is_max { summary.max } else { summary.min }));
            }
            None => cells.extend([String::new(), String::new()]),
        }
    }
    cells
}

#[derive(Debug, Args)]
pub struct FilesArgs {
    /// The job id.
    pub job: shared::api::JobId,
    /// Download the files of the latest version (or --attempt) into this directory.
    #[arg(long)]
    pub download: Option<PathBuf>,
    /// The result version (attempt) to download.
    #[arg(long)]
    pub attempt: Option<u32>,
    #[command(flatten)]
    pub url: UrlArg,
}

pub async fn files(args: FilesArgs) -> anyhow::Result<()> {
    let client = super::client(&args.url)?;
    let versions = client.results(args.job).await.with_context(|| format!("listing results of job {}", args.job))?;
    let mut out = std::io::stdout().lock();
    if versions.is_empty() {
        writeln!(out, "job {} has no stored results yet", args.job)?;
        return Ok(());
    }
    let Some(directory) = &args.download else {
        for version in &versions {
            writeln!(
                out,
                "v{} ({}, {}): {}",
                version.attempt, version.record.outcome, version.record.worker, version.path
            )?;
            for file in &version.files {
                writeln!(out, "  {:>12}  {}  {}", file.size, file.sha256, file.path)?;
            }
        }
        return Ok(());
    };
    let version = match args.attempt {
        Some(attempt) => versions
            .iter()
            .find(|version| version.attempt == attempt)
            .with_context(|| format!("job {} has no result v{attempt}", args.job))?,
        None => versions.last().context("no versions")?,
    };
    for file in &version.files {
        let destination = directory.join(&file.path);
        if let Some(parent) = destination.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        client
            .download_file(args.job, version.attempt, &file.path, &destination)
            .await
            .with_context(|| format!("downloading {}", file.path))?;
        writeln!(out, "{}", destination.display())?;
    }
    Ok(())
}
