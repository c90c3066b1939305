//! The command line. Without a verb, `app` serves (`--server-only`, `--client-only`, or both in
//! one process); its flags are the serving modes' own (`settings`). Verbs against a server
//! (`submit`, `status`, `wait`, ...) share one `UrlArg`; the trainer's verbs (`train`, `bench`)
//! take their own YAML `--config`. One file per verb; tables and units in `table` and `format`.
//! The maintainers' benchmarks are a binary of their own (bench/, `app-bench`).

mod bench;
mod cancel;
mod capabilities;
mod files;
pub mod format;
mod logs;
mod preempt;
mod results;
mod script_check;
pub mod secrets;
mod serve;
mod settings;
pub mod snapshot;
mod status;
mod submit;
mod sweeps;
mod table;
#[cfg(test)]
mod table_tests;
mod train;
mod wait;
mod whoami;
mod workers;

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

const AFTER_HELP: &str = "\
Without a command, app serves: the server and a local worker (`app`), the head node alone
(`app --server-only`) or a worker alone (`app --client-only --url http://HEAD:8000`).
Every command has its own --help.";

#[derive(Debug, Parser)]
#[command(
    name = "app",
    version,
    about = "A distributed experiment queue for GPU sweeps",
    long_about = None,
    args_conflicts_with_subcommands = true,
    after_help = AFTER_HELP
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: settings::ServeArgs,
}

/// The server a verb talks to when neither `--url` nor `APP_URL` names one.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8000";

/// How a verb reaches the server.
#[derive(Debug, Args, Clone)]
pub struct UrlArg {
    /// The server's URL. Several, comma-separated (replicas of one queue: `--url
    /// http://a:8000,http://b:8000`), are tried in order; the one that answers is kept.
    #[arg(long, env = "APP_URL", default_value = DEFAULT_URL)]
    pub url: String,
    /// A file holding your user token (or set APP_TOKEN) when the server requires tokens.
    #[arg(long, env = "APP_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// PEM certificate of a private CA that signed the server's HTTPS certificate.
    #[arg(long, env = "APP_CA", value_name = "FILE")]
    pub ca: Option<PathBuf>,
}

impl UrlArg {
    /// The files this client was handed (its token file): never shipped with a project's code.
    pub fn given_files(&self) -> Vec<PathBuf> {
        self.token_file.iter().cloned().collect()
    }

    /// The token (APP_TOKEN or --token-file) and CA to reach the server with.
    pub fn options(&self) -> anyhow::Result<client::ClientOptions> {
        client::ClientOptions::load(std::env::var("APP_TOKEN").ok(), self.token_file.as_deref(), self.ca.as_deref())
            .map_err(anyhow::Error::msg)
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Submit a sweep file (native, W&B or CVLab-Kit form), or count it with --dry-run.
    Submit(submit::SubmitArgs),
    /// Show sweeps, or jobs (of a sweep, or in a --status) with start, duration and metric.
    Status(status::StatusArgs),
    /// Wait until a sweep or job has finished; exit non-zero if any job failed.
    Wait(wait::WaitArgs),
    /// Print a job's log; -f follows it live.
    Logs(logs::LogsArgs),
    /// A sweep's leaderboard: its metric first, then the runs' parameters.
    Results(results::ResultsArgs),
    /// A job's stored result versions and files; --download fetches them.
    Files(files::FilesArgs),
    /// Cancel jobs (by id) or whole sweeps (by name).
    Cancel(cancel::CancelArgs),
    /// Queue failed or cancelled jobs again: by id, a sweep's failed jobs, or --failed.
    Retry(cancel::RetryArgs),
    /// Stop running jobs so that they resume from their checkpoints later, no retry spent.
    Preempt(preempt::PreemptArgs),
    /// The workers: state, GPUs, running jobs.
    Workers(workers::WorkersArgs),
    /// The user your token names (and whether an admin).
    Whoami(whoami::WhoamiArgs),
    /// List sweeps, or remove finished ones with their results (`app sweeps rm NAME`).
    #[command(subcommand)]
    Sweeps(sweeps::SweepsCommand),
    /// Train the built-in MLP/CNN: `app train --config train.yaml [--set key=value]` (feature `torch`).
    Train(train::TrainArgs),
    /// Benchmark training settings: `app bench --config train.yaml --batch-sizes 256,1024 --amp bf16,off`.
    Bench(bench::BenchArgs),
    /// What the built-in trainer finds on this machine, as JSON (asked by the worker at start).
    #[command(name = "probe-trainer", hide = true)]
    ProbeTrainer,
}

pub fn init_tracing(cli: &Cli) {
    use std::io::IsTerminal;
    // Daemons log at info by default; one-shot verbs stay quiet unless asked.
    // PostgreSQL's notices (a replica's migrator finding its table there: "already exists,
    // skipping") are not news.
    let default = if cli.command.is_none() { "info,sqlx::postgres::notice=warn" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colours only on a terminal: a log redirected to a file stays plain text.
    let colour = std::io::stderr().is_terminal();
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(colour).with_writer(std::io::stderr).init();
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let Some(command) = cli.command else {
        return serve::run(&cli.serve).await;
    };
    match command {
        Command::Submit(args) => submit::run(args).await,
        Command::Status(args) => status::run(args).await,
        Command::Wait(args) => wait::run(args).await,
        Command::Logs(args) => logs::run(args).await,
        Command::Results(args) => results::run(args).await,
        Command::Files(args) => files::run(args).await,
        Command::Cancel(args) => cancel::run(args).await,
        Command::Retry(args) => cancel::retry(args).await,
        Command::Preempt(args) => preempt::run(args).await,
        Command::Workers(args) => workers::run(args).await,
        Command::Whoami(args) => whoami::run(args).await,
        Command::Sweeps(command) => sweeps::run(command).await,
        Command::Train(args) => {
            let config = args.config.clone();
            train::run(args, config).await
        }
        Command::Bench(args) => {
            let config = args.config.clone();
            bench::run(args, config).await
        }
        Command::ProbeTrainer => capabilities::probe(),
    }
}

/// The client for a verb, with the URL in any error.
pub fn client(url: &UrlArg) -> anyhow::Result<client::Client> {
    Ok(client::Client::with_options(&url.url, &url.options()?)?)
}
