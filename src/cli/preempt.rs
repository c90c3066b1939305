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
    for id in args.jobs {
        let response = client.preempt_job(id).await.with_context(|| format!("preempting job {id}"))?;
        writeln!(
            out,
            "job {id} attempt {}: stopped at its worker's next heartbeat (SIGTERM, then SIGKILL after the \
             server's preemption grace), then queued again to resume from its checkpoint",
            response.attempt.attempt
        )?;
    }
    Ok(())
}
