//! The command line: modes (`--server-only`, `--client-only`, embedded) and verbs against a
//! server (`submit`, `status`, `cancel`, `retry`, `bench-queue`). One file per verb.

mod bench;
mod bench_load;
mod bench_page;
mod bench_queue;
mod bench_search;
mod bench_server;
mod bench_worker;
mod cancel;
mod logs;
mod results;
mod serve;
mod status;
mod submit;
mod train;

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
    /// Run only a worker daemon against `--url`.
    #[arg(long)]
    pub client_only: bool,
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub worker: WorkerArgs,
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// The server a worker (--client-only) connects to.
    #[arg(long, env = "APP_URL")]
    pub url: Option<String>,
    /// This worker's name, unique per box (default: the host name; `local` when embedded).
    #[arg(long, env = "APP_WORKER_NAME")]
    pub name: Option<String>,
    /// Use only these GPUs, e.g. `--gpus 0,1`.
    #[arg(long, value_delimiter = ',')]
    pub gpus: Option<Vec<u32>>,
    /// Run at most this many jobs at once (default: 4 per GPU, or one per core).
    #[arg(long)]
    pub max_jobs: Option<u32>,
    /// Where attempts get their fresh directories (default ./app-work).
    #[arg(long, env = "APP_WORK_DIR")]
    pub work_dir: Option<PathBuf>,
    /// Testing aid: simulate GPUs, e.g. `--fake-gpus 2x24GiB`.
    #[arg(long, env = "APP_FAKE_GPUS")]
    pub fake_gpus: Option<String>,
    /// Grace between SIGTERM and SIGKILL when a job is cancelled or times out, in seconds.
    #[arg(long)]
    pub kill_grace_secs: Option<f64>,
    /// Keep each attempt's directory on the worker after its log, metrics, results and outcome
    /// reached the server (by default it is removed then).
    #[arg(long)]
    pub keep_work_dirs: bool,
    /// A file holding the worker token (or set APP_TOKEN) when the server requires tokens.
    #[arg(long, env = "APP_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// PEM certificate of a private CA that signed the server's HTTPS certificate.
    #[arg(long, env = "APP_CA")]
    pub ca: Option<PathBuf>,
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
    /// File of user tokens, one per line (or set APP_USER_TOKEN): submit, cancel, read.
    #[arg(long, env = "APP_USER_TOKEN_FILE")]
    pub user_token_file: Option<PathBuf>,
    /// File of worker tokens, one per line (or set APP_WORKER_TOKEN): register, claim, report.
    #[arg(long, env = "APP_WORKER_TOKEN_FILE")]
    pub worker_token_file: Option<PathBuf>,
    /// Serve HTTPS with this PEM certificate chain (with --tls-key).
    #[arg(long, env = "APP_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, env = "APP_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Allow listening beyond loopback without tokens (anyone who reaches the port can then
    /// run commands on every worker).
    #[arg(long)]
    pub insecure_no_auth: bool,
}

#[derive(Debug, Args, Clone)]
pub struct UrlArg {
    /// The server's URL.
    #[arg(long, env = "APP_URL", default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// A file holding your user token (or set APP_TOKEN) when the server requires tokens.
    #[arg(long, env = "APP_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// PEM certificate of a private CA that signed the server's HTTPS certificate.
    #[arg(long, env = "APP_CA")]
    pub ca: Option<PathBuf>,
}

impl UrlArg {
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
    /// Show sweeps, or the jobs of one sweep.
    Status(status::StatusArgs),
    /// Cancel a job (by id) or a whole sweep (by name).
    Cancel(cancel::CancelArgs),
    /// Put a failed or cancelled job back in the queue.
    Retry(cancel::RetryArgs),
    /// Print a job's log; -f follows it live.
    Logs(logs::LogsArgs),
    /// A sweep's leaderboard: parameters and metrics, best first.
    Results(results::ResultsArgs),
    /// A job's stored result versions and files; --download fetches them.
    Files(results::FilesArgs),
    /// Load test: 500 simulated workers heartbeat, claim and report while sweeps arrive (5xx, latency, memory).
    BenchLoad(bench_load::BenchLoadArgs),
    /// Measure the web page's JSON endpoints on a large queue (100,000 jobs, 1,000,000 points).
    BenchPage(bench_page::BenchPageArgs),
    /// Measure the queue on this machine: submission, claim throughput, dispatch latency.
    BenchQueue(bench_queue::BenchArgs),
    /// Compare app's TPE, random search and early stopping with Optuna (bench/search/run.sh).
    BenchSearch(bench_search::BenchSearchArgs),
    /// Measure the worker on this machine: throughput against GNU parallel, dispatch, idle cost.
    BenchWorker(bench_worker::BenchWorkerArgs),
    /// Train the built-in MLP/CNN: `app train --config train.yaml [--set key=value]` (feature `torch`).
    Train(train::TrainArgs),
    /// Benchmark training settings: `app bench --config train.yaml --batch-sizes 256,1024 --amp bf16,off`.
    Bench(bench::BenchArgs),
}

pub fn init_tracing(cli: &Cli) {
    // Daemons log at info by default; one-shot verbs stay quiet unless asked.
    let default = if cli.command.is_none() { "info" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    // `--config` is global; for `train` and `bench` it names the trainer's YAML config.
    let config = cli.server.config.clone();
    match cli.command {
        None if cli.client_only => serve::run_worker(&cli.server, &cli.worker).await,
        None => serve::run(&cli.server, &cli.worker, cli.server_only).await,
        Some(Command::Submit(args)) => submit::run(args).await,
        Some(Command::Status(args)) => status::run(args).await,
        Some(Command::Cancel(args)) => cancel::run(args).await,
        Some(Command::Retry(args)) => cancel::retry(args).await,
        Some(Command::Logs(args)) => logs::run(args).await,
        Some(Command::Results(args)) => results::run(args).await,
        Some(Command::Files(args)) => results::files(args).await,
        Some(Command::BenchLoad(args)) => bench_load::run(args).await,
        Some(Command::BenchPage(args)) => bench_page::run(args).await,
        Some(Command::BenchQueue(args)) => bench_queue::run(args).await,
        Some(Command::BenchSearch(args)) => bench_search::run(args).await,
        Some(Command::BenchWorker(args)) => bench_worker::run(args).await,
        Some(Command::Train(args)) => train::run(args, config).await,
        Some(Command::Bench(args)) => bench::run(args, config).await,
    }
}

/// The client for a verb, with the URL in any error.
pub fn client(url: &UrlArg) -> anyhow::Result<client::Client> {
    Ok(client::Client::with_options(&url.url, &url.options()?)?)
}
