//! `app logs JOB [-f]`: a job's log, followed live with `-f`.

use super::UrlArg;
use anyhow::Context;
use clap::Args;
use shared::api::LogQuery;
use std::io::Write;

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The job id.
    pub job: shared::api::JobId,
    /// Keep printing as the job writes, until its attempt ends.
    #[arg(short, long)]
    pub follow: bool,
    /// Which attempt (default: the latest).
    #[arg(long)]
    pub attempt: Option<u32>,
    #[command(flatten)]
    pub url: UrlArg,
}

pub async fn run(args: LogsArgs) -> anyhow::Result<()> {
    let client = super::client(&args.url)?;
    let mut query = LogQuery { attempt: args.attempt, offset: 0, wait_ms: if args.follow { 20_000 } else { 0 } };
    let mut out = std::io::stdout().lock();
    loop {
        let chunk =
            client.log(args.job, &query).await.with_context(|| format!("reading the log of job {}", args.job))?;
        out.write_all(chunk.text.as_bytes())?;
        out.flush()?;
        query.attempt = Some(chunk.attempt);
        query.offset = chunk.next_offset;
        // Without -f, read to the end of what is stored (it comes in pages); with -f, until
        // the attempt has ended and everything it wrote has been printed.
        let drained = chunk.text.is_empty();
        if drained && (!args.follow || chunk.finished) {
            return Ok(());
        }
    }
}
