//! `app cancel JOB|SWEEP` and `app retry JOB`.

use super::UrlArg;
use anyhow::Context;
use clap::Args;
use std::io::Write;

#[derive(Debug, Args)]
pub struct CancelArgs {
    /// A job id (a number) or a sweep name (anything else; or use --sweep).
    pub target: String,
    /// Treat TARGET as a sweep (id or name) even if it is a number.
    #[arg(long)]
    pub sweep: bool,
    #[command(flatten)]
    pub url: UrlArg,
}

pub async fn run(args: CancelArgs) -> anyhow::Result<()> {
    let client = super::client(&args.url)?;
    let job_id = args.target.parse::<shared::api::JobId>().ok().filter(|_| !args.sweep);
    let (what, response) = match job_id {
        Some(id) => (format!("job {id}"), client.cancel_job(id).await),
        None => (format!("sweep {}", args.target), client.cancel_sweep(&args.target).await),
    };
    let response = response.with_context(|| format!("cancelling {what}"))?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{what}: {} cancelled, {} running (killed at their worker's next heartbeat)",
        response.cancelled, response.cancel_requested
    )?;
    Ok(())
}

#[derive(Debug, Args)]
pub struct RetryArgs {
    /// The job id.
    pub job: shared::api::JobId,
    #[command(flatten)]
    pub url: UrlArg,
}

pub async fn retry(args: RetryArgs) -> anyhow::Result<()> {
    let client = super::client(&args.url)?;
    let job = client.retry_job(args.job).await.with_context(|| format!("retrying job {}", args.job))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "job {} is {} again", job.id, job.status)?;
    Ok(())
}
