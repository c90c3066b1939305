//! `app-bench`: the maintainers' benchmarks of app itself, a binary of its own beside `app`
//! (which ships none of this). It links the same libraries as `app`, with the same global
//! allocator, so the server a benchmark starts in this process runs as `app`'s does.
//! `app-bench NAME` runs one of eight benchmarks: `queue`, `worker`, `page` (the web page's
//! endpoints), `load` (many simulated workers), `search` (TPE and early stopping against
//! Optuna, hostile sweep files), `capture` (scripts' own loggers), `code` (code shipping) and `replicas` (SQLite against
//! PostgreSQL replicas). Those that need a server start it in this process. (`app bench` is
//! the trainer's benchmark, for users.) Build: `cargo build --release -p bench`.

mod capture;
mod code;
mod lab;
mod lab_live;
mod load;
mod page;
mod processes;
mod queue;
mod replicas;
mod search;
mod search_queue;
mod search_table;
mod server;
mod shares;
mod synthetic_project;
mod worker;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// The same allocator as `app` (src/main.rs; docs/decisions/0070): the figures of a server
/// started in this process hold for `app`.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Benchmarks of app itself (not of training: that is `app bench`). Each prints figures and
/// asserts nothing.
#[derive(Debug, Parser)]
#[command(name = "app-bench", version)]
struct Cli {
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// The queue: submission, claim throughput, dispatch latency.
    Queue(queue::BenchArgs),
    /// The worker: throughput against GNU parallel, dispatch, idle cost.
    Worker(worker::BenchWorkerArgs),
    /// The web page's JSON endpoints on a large queue (100,000 jobs, 1,000,000 points).
    Page(page::BenchPageArgs),
    /// 500 simulated workers heartbeat, claim and report while sweeps arrive (5xx, latency, memory).
    Load(load::BenchLoadArgs),
    /// Search: app's TPE, random search and early stopping against Optuna (bench/search/run.sh).
    Search(search::BenchSearchArgs),
    /// Capturing scripts' own loggers: Python start-up, a wandb.log call, SummaryWriter to server.
    Capture(capture::BenchCaptureArgs),
    /// Code shipping: pack and upload, unchanged re-submit, a worker's fetch and unpack (5,000 files, 50 MB).
    Code(code::BenchCodeArgs),
    /// SQLite against PostgreSQL with 1, 2 and 3 replicas: submission and claim+finish/s
    /// (scripts/bench-replicas.sh starts the PostgreSQL server).
    Replicas(replicas::BenchReplicasArgs),
    /// The fair share: claim latency with six users' queues (and quotas) against one user's.
    Shares(shares::BenchSharesArgs),
    /// The scheduling policies on a simulated lab: shares, waits, idle GPUs, work lost.
    Lab(lab::BenchLabArgs),
    /// One run of `search --queue`'s sweeps, inside a job (not a benchmark).
    #[command(hide = true)]
    SearchRun(search_queue::SearchRunArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: starting the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        match cli.bench {
            Bench::Queue(args) => queue::run(args).await,
            Bench::Worker(args) => worker::run(args).await,
            Bench::Page(args) => page::run(args).await,
            Bench::Load(args) => load::run(args).await,
            Bench::Search(args) => search::run(args).await,
            Bench::Capture(args) => capture::run(args).await,
            Bench::Code(args) => code::run(args).await,
            Bench::Replicas(args) => replicas::run(args).await,
            Bench::Shares(args) => shares::run(args).await,
            Bench::Lab(args) => lab::run(args).await,
            Bench::SearchRun(args) => search_queue::search_run(&args),
        }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// The `app` binary beside this one (Cargo builds both into one directory), or `$APP_BIN`:
/// the worker benchmark runs a real worker process.
pub fn app_binary() -> anyhow::Result<std::path::PathBuf> {
    if let Some(path) = std::env::var_os("APP_BIN") {
        return Ok(path.into());
    }
    let own = std::env::current_exe()?;
    let app = own.with_file_name("app");
    anyhow::ensure!(
        app.is_file(),
        "no app binary beside {} (build it: cargo build --release; or set APP_BIN)",
        own.display()
    );
    Ok(app)
}
