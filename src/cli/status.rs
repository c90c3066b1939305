//! `app status [SWEEP]`: the sweeps in the queue, or one sweep's jobs.

use super::UrlArg;
use anyhow::Context;
use clap::Args;
use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::Table;
use shared::api::{Job, JobQuery};
use shared::job::JobStatus;
use std::io::Write;

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// A sweep (id or name): list its jobs. Without it, list the sweeps.
    pub sweep: Option<String>,
    /// Only jobs in this status.
    #[arg(long)]
    pub status: Option<JobStatus>,
    /// How many jobs to list.
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    #[command(flatten)]
    pub url: UrlArg,
}

fn table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header(header.iter().copied());
    table
}

pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let client = super::client(&args.url)?;
    let mut out = std::io::stdout().lock();
    let Some(key) = &args.sweep else {
        let sweeps = client.sweeps().await.with_context(|| format!("listing sweeps at {}", client.base_url()))?;
        if sweeps.is_empty() {
            writeln!(out, "no sweeps yet: submit one with `app submit FILE`")?;
            return Ok(());
        }
        let mut table =
            table(&["id", "sweep", "form", "jobs", "queued", "running", "succeeded", "failed", "cancelled"]);
        for sweep in sweeps {
            let counts = &sweep.counts;
            table.add_row(vec![
                sweep.id.to_string(),
                sweep.name,
                sweep.form.to_string(),
                counts.total().to_string(),
                counts.queued.to_string(),
                counts.running.to_string(),
                counts.succeeded.to_string(),
                counts.failed.to_string(),
                counts.cancelled.to_string(),
            ]);
        }
        writeln!(out, "{table}")?;
        return Ok(());
    };
    let sweep = client.sweep(key).await.with_context(|| format!("looking up sweep {key}"))?;
    let counts = &sweep.info.counts;
    writeln!(
        out,
        "sweep {} (id {}): {} jobs: {} queued, {} running, {} succeeded, {} failed, {} cancelled",
        sweep.info.name,
        sweep.info.id,
        counts.total(),
        counts.queued,
        counts.running,
        counts.succeeded,
        counts.failed,
        counts.cancelled
    )?;
    let query = JobQuery {
        sweep: Some(sweep.info.id.to_string()),
        status: args.status,
        limit: Some(args.limit),
        ..JobQuery::default()
    };
    let page = client.jobs(&query).await.context("listing jobs")?;
    let mut table = table(&["job", "#", "status", "attempt", "worker", "exit", "params", "reason"]);
    for job in &page.jobs {
        table.add_row(job_row(job));
    }
    writeln!(out, "{table}")?;
    if page.total > page.jobs.len() as u64 {
        writeln!(out, "... {} more (use --limit or --status)", page.total - page.jobs.len() as u64)?;
    }
    Ok(())
}

fn job_row(job: &Job) -> Vec<String> {
    vec![
        job.id.to_string(),
        job.index.to_string(),
        job.status.to_string(),
        job.attempt.to_string(),
        job.worker.clone().unwrap_or_default(),
        job.exit_code.map(|code| code.to_string()).unwrap_or_default(),
        job.params.to_string(),
        job.reason.clone().unwrap_or_default(),
    ]
}
