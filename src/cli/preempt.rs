//! `app preempt JOB...`: stops running jobs by hand so that they go back to the queue and
//! resume from their checkpoints on any worker, no retry spent (as Slurm's `scontrol requeue`).

use super::UrlArg;
use anyhow::Context;
use clap::Args;
use shared::api::JobId;
use std::io::Write;

#[derive(Debug, Args)]
pub struct PreemptArgs {
    /// Running jobs, by id (yours; an admin's: anyone's).
    #[arg(required = true, value_name = "JOB")]
    pub jobs: Vec<JobId>,
    #[command(flatten)]
    pub url: UrlArg,
}

pub async fn run(args: PreemptArgs) -> anyhow::Result<()> {
    let client = super::client(&args.url)?;
    let mut out = std::io::stdout().lock();
    let mut failed = Vec::new();
    // Each job is tried: one that cannot be preempted does not keep the others running.
    for id in args.jobs {
        match client.preempt_job(id).await.with_context(|| format!("preempting job {id}")) {
            Ok(response) => writeln!(
                out,
                "job {id} attempt {}: stopped at its worker's next heartbeat (SIGTERM, then SIGKILL after the \
                 server's preemption grace), then queued again to resume from its checkpoint",
                response.attempt.attempt
            )?,
            Err(error) => {
                eprintln!("error: {error:#}");
                failed.push(id.to_string());
            }
        }
    }
    anyhow::ensure!(failed.is_empty(), "not preempted: {}", failed.join(", "));
    Ok(())
}
