//! `app sweeps ls`, `app sweeps rm SWEEP... [--yes]`, `app sweeps resume SWEEP...` and `app
//! sweeps class SWEEP... --to CLASS | --default`: list sweeps, remove finished ones with their
//! jobs' records and result files after a confirmation (or `--yes`), resume sweeps their
//! failing runs paused, or move sweeps to another priority class.

use super::{format, table, UrlArg};
use anyhow::Context;
use clap::{Args, Subcommand};
use shared::api::SweepInfo;
use std::io::{BufRead, IsTerminal, Write};

#[derive(Debug, Subcommand)]
pub enum SweepsCommand {
    /// List the sweeps, newest first (as `app status`).
    Ls(LsArgs),
    /// Remove finished sweeps with their jobs, logs, metrics and result files.
    Rm(RmArgs),
    /// Resume sweeps their failing runs paused (`max_initial_failures`, `max_consecutive_failures`).
    Resume(ResumeArgs),
    /// Move sweeps to another priority class (`[server.priority_classes]`): their queued jobs
    /// are claimed, and their running ones preempted, by the new class's value.
    Class(ClassArgs),
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("class").required(true).args(["to", "default"])))]
pub struct ClassArgs {
    /// The sweeps (ids or names).
    #[arg(required = true, value_name = "SWEEP")]
    pub sweeps: Vec<String>,
    /// The class to move them to (above the default: an admin's to give).
    #[arg(long, value_name = "CLASS")]
    pub to: Option<String>,
    /// Move them back to the default class (value 0).
    #[arg(long)]
    pub default: bool,
    #[command(flatten)]
    pub url: UrlArg,
}

#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// The sweeps (ids or names).
    #[arg(required = true, value_name = "SWEEP")]
    pub sweeps: Vec<String>,
    #[command(flatten)]
    pub url: UrlArg,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub url: UrlArg,
}

#[derive(Debug, Args)]
pub struct RmArgs {
    /// The sweeps (ids or names). None of their jobs may be queued or running.
    #[arg(required = true, value_name = "SWEEP")]
    pub sweeps: Vec<String>,
    /// Remove without asking (for scripts; without a terminal, asking is impossible).
    #[arg(short, long)]
    pub yes: bool,
    #[command(flatten)]
    pub url: UrlArg,
}

pub async fn run(command: SweepsCommand) -> anyhow::Result<()> {
    match command {
        SweepsCommand::Ls(args) => list(args).await,
        SweepsCommand::Rm(args) => remove(args).await,
        SweepsCommand::Resume(args) => resume(args).await,
        SweepsCommand::Class(args) => class(args).await,
    }
}

async fn class(args: ClassArgs) -> anyhow::Result<()> {
    let client = super::client(&args.url)?;
    let mut out = std::io::stdout().lock();
    for key in &args.sweeps {
        let moved = client
            .set_sweep_class(key, args.to.as_deref())
            .await
            .with_context(|| format!("moving sweep {key} to another priority class"))?;
        match moved.priority_class {
            Some(class) => writeln!(out, "{key} is in priority class {class} ({})", moved.value)?,
            None => writeln!(out, "{key} is in the default priority class (0)")?,
        }
    }
    Ok(())
}

async fn resume(args: ResumeArgs) -> anyhow::Result<()> {
    let client = super::client(&args.url)?;
    let mut out = std::io::stdout().lock();
    for key in &args.sweeps {
        let answer = client.resume_sweep(key).await.with_context(|| format!("resuming sweep {key}"))?;
        match answer.resumed {
            true => writeln!(out, "resumed {key}: its queued jobs may run again")?,
            false => writeln!(out, "{key} was not paused")?,
        }
    }
    Ok(())
}

async fn list(args: LsArgs) -> anyhow::Result<()> {
    let client = super::client(&args.url)?;
    let at = client.base_url().to_string();
    let sweeps = client.sweeps().await.with_context(|| format!("listing sweeps at {at}"))?;
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&sweeps)?)?;
    } else if sweeps.is_empty() {
        writeln!(out, "no sweeps yet: submit one with `app submit FILE`")?;
    } else {
        let table = super::status::sweeps_table(&sweeps, format::now_ms(), table::terminal_width());
        writeln!(out, "{}", table::render(&table))?;
    }
    Ok(())
}

/// Why a sweep cannot be removed now, if it cannot.
pub fn refusal(sweep: &SweepInfo) -> Option<String> {
    let counts = &sweep.counts;
    (counts.queued + counts.running > 0).then(|| {
        format!(
            "sweep {} has {} queued and {} running jobs; cancel it first (app cancel {}) and wait for them to stop",
            sweep.name, counts.queued, counts.running, sweep.name
        )
    })
}

async fn remove(args: RmArgs) -> anyhow::Result<()> {
    let client = super::client(&args.url)?;
    // Every sweep is looked up and checked before anything is removed.
    let mut sweeps = Vec::new();
    for key in &args.sweeps {
        let sweep = client.sweep(key).await.with_context(|| format!("looking up sweep {key}"))?.info;
        if let Some(why) = refusal(&sweep) {
            anyhow::bail!(why);
        }
        sweeps.push(sweep);
    }
    if !args.yes {
        confirm(&sweeps)?;
    }
    let mut out = std::io::stdout().lock();
    for sweep in &sweeps {
        let removed = client
            .delete_sweep(&sweep.id.to_string())
            .await
            .with_context(|| format!("removing sweep {}", sweep.name))?;
        writeln!(
            out,
            "removed sweep {} (id {}): {} jobs, {} result versions",
            removed.name, removed.id, removed.jobs, removed.result_versions
        )?;
    }
    Ok(())
}

/// Asks on the terminal; without one, refuses (a script must say `--yes`).
fn confirm(sweeps: &[SweepInfo]) -> anyhow::Result<()> {
    let names: Vec<String> =
        sweeps.iter().map(|sweep| format!("{} ({} jobs)", sweep.name, sweep.counts.total())).collect();
    let stdin = std::io::stdin();
    anyhow::ensure!(
        stdin.is_terminal(),
        "not removing {} without confirmation: pass --yes to remove without asking",
        names.join(", ")
    );
    let mut stderr = std::io::stderr().lock();
    write!(stderr, "remove {} with all their logs, metrics and result files? [y/N] ", names.join(", "))?;
    stderr.flush()?;
    let mut answer = String::new();
    stdin.lock().read_line(&mut answer)?;
    anyhow::ensure!(matches!(answer.trim(), "y" | "Y" | "yes"), "nothing removed");
    Ok(())
}
