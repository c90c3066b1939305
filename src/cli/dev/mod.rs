//! `app dev`: maintainers' tools, kept out of the user's verbs. `app dev bench NAME` runs one
//! of seven benchmarks: `queue`, `worker`, `page` (the web page's endpoints), `load` (many
//! simulated workers), `search` (TPE and early stopping against Optuna, hostile sweep files),
//! `code` (code shipping) and `replicas` (SQLite against PostgreSQL replicas). Those that need
//! a server start it in this process. (`app bench` is the trainer's benchmark, for users.)

mod bench_code;
mod bench_load;
mod bench_page;
mod bench_queue;
mod bench_replicas;
mod bench_search;
mod bench_server;
mod bench_worker;
mod synthetic_project;

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum DevCommand {
    /// Benchmarks of app itself (not of training: that is `app bench`).
    #[command(subcommand)]
    Bench(DevBench),
}

#[derive(Debug, Subcommand)]
pub enum DevBench {
    /// The queue: submission, claim throughput, dispatch latency.
    Queue(bench_queue::BenchArgs),
    /// The worker: throughput against GNU parallel, dispatch, idle cost.
    Worker(bench_worker::BenchWorkerArgs),
    /// The web page's JSON endpoints on a large queue (100,000 jobs, 1,000,000 points).
    Page(bench_page::BenchPageArgs),
    /// 500 simulated workers heartbeat, claim and report while sweeps arrive (5xx, latency, memory).
    Load(bench_load::BenchLoadArgs),
    /// Search: app's TPE, random search and early stopping against Optuna (bench/search/run.sh).
    Search(bench_search::BenchSearchArgs),
    /// Code shipping: pack and upload, unchanged re-submit, a worker's fetch and unpack (5,000 files, 50 MB).
    Code(bench_code::BenchCodeArgs),
    /// SQLite against PostgreSQL with 1, 2 and 3 replicas: submission and claim+finish/s
    /// (scripts/bench-replicas.sh starts the PostgreSQL server).
    Replicas(bench_replicas::BenchReplicasArgs),
}

pub async fn run(command: DevCommand) -> anyhow::Result<()> {
    match command {
        DevCommand::Bench(DevBench::Queue(args)) => bench_queue::run(args).await,
        DevCommand::Bench(DevBench::Worker(args)) => bench_worker::run(args).await,
        DevCommand::Bench(DevBench::Page(args)) => bench_page::run(args).await,
        DevCommand::Bench(DevBench::Load(args)) => bench_load::run(args).await,
        DevCommand::Bench(DevBench::Search(args)) => bench_search::run(args).await,
        DevCommand::Bench(DevBench::Code(args)) => bench_code::run(args).await,
        DevCommand::Bench(DevBench::Replicas(args)) => bench_replicas::run(args).await,
    }
}
