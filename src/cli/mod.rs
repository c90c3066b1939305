//! The command line: modes (`--server-only`, `--client-only`, embedded) and verbs against a
//! server (`submit`, `status`, `cancel`, `retry`, `bench-queue`). One file per verb.

mod bench_queue;
mod cancel;
mod serve;
mod status;
mod submit;

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(name = "app", version, about = "A distributed experiment queue for GPU sweeps", long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Run only the head node: HTTP API and SQLite queue, no local worker.
    #[arg(long, conflicts_with = "client_only")]
    pub server_only: bool,
    /// Run only a worker daemon against `--url` (arrives with the worker; see issue 3).
    #[arg(long)]
    pub client_only: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Address to listen on. Default 127.0.0.1:8000; use 0.0.0.0:8000 to accept workers on
    /// other machines.
    #[arg(long, env = "APP_BIND", global = true)]
    pub bind: Option<String>,
    /// Where the queue database (and results) live.
    #[arg(long, env = "APP_DATA_DIR", global = true)]
    pub data_dir: Option<PathBuf>,
    /// A TOML config file (see configs/server.example.toml); flags and APP_* variables win.
    #[arg(long, env = "APP_CONFIG_FILE", global = true)]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Args, Clone)]
pub struct UrlArg {
    /// The server's URL.
    #[arg(long, env = "APP_URL", default_value = "http://127.0.0.1:8000")]
    pub url: String,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Submit a sweep file (native, W&B or CVLab-Kit form), or count it with --dry-run.
    Submit(submit::SubmitArgs),
    /// Show sweeps, or the jobs of one sweep.
    Status(status::StatusArgs),
    /// Cancel a job (by id) or a whole sweep (by name).
    Cancel(cancel::CancelArgs),
    /// Put a failed or cancelled job back in the queue.
    Retry(cancel::RetryArgs),
    /// Measure the queue on this machine: submission, claim throughput, dispatch latency.
    BenchQueue(bench_queue::BenchArgs),
}

pub fn init_tracing(cli: &Cli) {
    // Daemons log at info by default; one-shot verbs stay quiet unless asked.
    let default = if cli.command.is_none() { "info" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        None if cli.client_only => anyhow::bail!(
            "the worker daemon (--client-only) is not built yet; run `app --server-only` and submit sweeps"
        ),
        None => serve::run(&cli.server, cli.server_only).await,
        Some(Command::Submit(args)) => submit::run(args).await,
        Some(Command::Status(args)) => status::run(args).await,
        Some(Command::Cancel(args)) => cancel::run(args).await,
        Some(Command::Retry(args)) => cancel::retry(args).await,
        Some(Command::BenchQueue(args)) => bench_queue::run(args).await,
    }
}

/// The client for a verb, with the URL in any error.
pub fn client(url: &UrlArg) -> anyhow::Result<client::Client> {
    Ok(client::Client::new(&url.url)?)
}
