//! `app workers [--json]`: every worker the server knows, its state, GPUs and running jobs.

use super::{format, table, UrlArg};
use anyhow::Context;
use clap::Args;
use comfy_table::Table;
use shared::api::{WorkerInfo, WorkerState};
use std::io::Write;

#[derive(Debug, Args)]
pub struct WorkersArgs {
    /// Print the workers as JSON (capacities in bytes, times in Unix milliseconds).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub url: UrlArg,
}

pub async fn run(args: WorkersArgs) -> anyhow::Result<()> {
    let client = super::client(&args.url)?;
    let at = client.base_url().to_string();
    let workers = client.workers().await.with_context(|| format!("listing workers at {at}"))?;
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&workers)?)?;
    } else if workers.is_empty() {
        writeln!(out, "no workers yet: start one with `app --client-only --url {}`", client.base_url())?;
    } else {
        writeln!(out, "{}", table::render(&workers_table(&workers, format::now_ms(), table::terminal_width())))?;
    }
    Ok(())
}

fn state_word(state: WorkerState) -> &'static str {
    match state {
        WorkerState::Healthy => "healthy",
        WorkerState::Stale => "stale",
        WorkerState::Lost => "lost",
        WorkerState::Left => "left",
    }
}

/// `0: 24 GiB` per GPU, one per line; `none (CPU)` without.
fn gpus(worker: &WorkerInfo) -> String {
    if worker.capacity.gpus.is_empty() {
        return "none (CPU)".into();
    }
    let lines: Vec<String> =
        worker.capacity.gpus.iter().map(|gpu| format!("{}: {}", gpu.index, format::bytes(gpu.memory_total))).collect();
    lines.join("\n")
}

pub fn workers_table(workers: &[WorkerInfo], now: i64, width: Option<u16>) -> Table {
    let mut table = table::new(["worker", "state", "last seen", "gpus", "slots", "code", "running", "jobs"], width);
    for worker in workers {
        let jobs: Vec<String> = worker.running_jobs.iter().map(|id| id.to_string()).collect();
        table.add_row(vec![
            worker.name.clone(),
            state_word(worker.state).to_string(),
            format::age(worker.last_seen_at, now),
            gpus(worker),
            worker.capacity.job_slots.to_string(),
            // How attempts get their copy of the code there (overlay, copy).
            worker.capacity.capabilities.code_copy.clone().unwrap_or_else(|| "-".into()),
            worker.running.to_string(),
            jobs.join(" "),
        ]);
    }
    table::align_right(&mut table, &[2, 4, 6]);
    table
}
