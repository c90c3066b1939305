//! `app cancel TARGET...` and `app retry TARGET... | --failed`: a target is a job id (a
//! number) or a sweep (anything else, or any target with `--sweep`).

use super::UrlArg;
use anyhow::Context;
use clap::Args;
use shared::api::JobId;
use std::io::Write;

/// Ids per bulk request (the server's limit).
const IDS_PER_REQUEST: usize = 1_000;

#[derive(Debug, Args)]
pub struct CancelArgs {
    /// Job ids (numbers) and sweeps (ids with --sweep, or names).
    #[arg(required = true, value_name = "JOB|SWEEP")]
    pub targets: Vec<String>,
    /// Treat every target as a sweep (id or name), even a number.
    #[arg(long)]
    pub sweep: bool,
    #[command(flatten)]
    pub url: UrlArg,
}

#[derive(Debug, Args)]
pub struct RetryArgs {
    /// Job ids (failed or cancelled ones are queued again) and sweeps (their failed jobs are).
    #[arg(value_name = "JOB|SWEEP", required_unless_present = "failed")]
    pub targets: Vec<String>,
    /// Treat every target as a sweep (id or name), even a number.
    #[arg(long)]
    pub sweep: bool,
    /// Retry the failed jobs of every sweep you may change (yours; an admin's: every sweep),
    /// or of the sweeps named.
    #[arg(long)]
    pub failed: bool,
    #[command(flatten)]
    pub url: UrlArg,
}

/// Job ids and sweep keys, in the order given.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Targets {
    pub jobs: Vec<JobId>,
    pub sweeps: Vec<String>,
}

pub fn targets(items: &[String], all_sweeps: bool) -> Targets {
    let mut targets = Targets::default();
    for item in items {
        match item.parse::<JobId>() {
            Ok(id) if !all_sweeps => targets.jobs.push(id),
            _ => targets.sweeps.push(item.clone()),
        }
    }
    targets
}

pub async fn run(args: CancelArgs) -> anyhow::Result<()> {
    let client = super::client(&args.url)?;
    let Targets { jobs, sweeps } = targets(&args.targets, args.sweep);
    let mut out = std::io::stdout().lock();
    for sweep in &sweeps {
        let response = client.cancel_sweep(sweep).await.with_context(|| format!("cancelling sweep {sweep}"))?;
        writeln!(
            out,
            "sweep {sweep}: {} cancelled, {} running (killed at their worker's next heartbeat)",
            response.cancelled, response.cancel_requested
        )?;
    }
    if let [id] = jobs[..] {
        // One job: its own endpoint, which says why a job cannot be cancelled.
        let response = client.cancel_job(id).await.with_context(|| format!("cancelling job {id}"))?;
        let how = if response.cancelled > 0 { "cancelled" } else { "will be killed at its worker's next heartbeat" };
        writeln!(out, "job {id}: {how}")?;
        return Ok(());
    }
    let (mut cancelled, mut requested, mut skipped) = (0, 0, Vec::new());
    for chunk in jobs.chunks(IDS_PER_REQUEST) {
        let response = client.cancel_jobs(chunk).await.context("cancelling jobs")?;
        cancelled += response.cancelled;
        requested += response.cancel_requested;
        skipped.extend(response.skipped);
    }
    if !jobs.is_empty() {
        writeln!(out, "{cancelled} jobs cancelled, {requested} running (killed at their worker's next heartbeat)")?;
        if !skipped.is_empty() {
            writeln!(out, "left as they were (not queued or running, or unknown): {}", id_list(&skipped))?;
        }
        anyhow::ensure!(cancelled + requested > 0, "none of the jobs listed is queued or running");
    }
    Ok(())
}

pub async fn retry(args: RetryArgs) -> anyhow::Result<()> {
    let client = super::client(&args.url)?;
    let Targets { jobs, mut sweeps } = targets(&args.targets, args.sweep);
    anyhow::ensure!(
        !args.failed || jobs.is_empty(),
        "--failed retries the failed jobs of sweeps; it takes sweep names, not job ids ({})",
        id_list(&jobs)
    );
    if args.failed && sweeps.is_empty() {
        let at = client.base_url().to_string();
        // Others' sweeps would be refused: only the caller's own are asked for, unless an admin.
        let me = client.whoami().await.with_context(|| format!("asking {at} who your token names"))?;
        let query = shared::api::SweepQuery { owner: (!me.admin).then_some(me.name) };
        let all = client.sweeps_where(&query).await.with_context(|| format!("listing sweeps at {at}"))?;
        sweeps = all.into_iter().filter(|sweep| sweep.counts.failed > 0).map(|sweep| sweep.name).collect();
        if sweeps.is_empty() {
            println!("no failed jobs");
            return Ok(());
        }
    }
    let mut out = std::io::stdout().lock();
    for sweep in &sweeps {
        let response = client.retry_sweep(sweep).await.with_context(|| format!("retrying sweep {sweep}"))?;
        writeln!(out, "sweep {sweep}: {} failed jobs queued again", response.retried.len())?;
    }
    if let [id] = jobs[..] {
        let job = client.retry_job(id).await.with_context(|| format!("retrying job {id}"))?;
        writeln!(out, "job {} is {} again", job.id, job.status)?;
        return Ok(());
    }
    let (mut retried, mut skipped) = (Vec::new(), Vec::new());
    for chunk in jobs.chunks(IDS_PER_REQUEST) {
        let response = client.retry_jobs(chunk).await.context("retrying jobs")?;
        retried.extend(response.retried);
        skipped.extend(response.skipped);
    }
    if !jobs.is_empty() {
        writeln!(out, "{} jobs queued again", retried.len())?;
        if !skipped.is_empty() {
            writeln!(out, "left as they were (not failed or cancelled, or unknown): {}", id_list(&skipped))?;
        }
        anyhow::ensure!(!retried.is_empty(), "none of the jobs listed is failed or cancelled");
    }
    Ok(())
}

fn id_list(ids: &[JobId]) -> String {
    ids.iter().map(JobId::to_string).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_jobs_and_names_are_sweeps_unless_told_otherwise() {
        let items: Vec<String> = ["12", "vaep-grid", "13", "7x"].map(String::from).to_vec();
        assert_eq!(
            targets(&items, false),
            Targets { jobs: vec![JobId::new(12), JobId::new(13)], sweeps: vec!["vaep-grid".into(), "7x".into()] }
        );
        let all = targets(&items, true);
        assert!(all.jobs.is_empty() && all.sweeps.len() == 4);
    }
}
