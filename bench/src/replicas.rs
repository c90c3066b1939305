//! `app-bench replicas`: the queue on SQLite (one server) against PostgreSQL with 1, 2 and
//! 3 replicas, in one run: a 100,000-job submission and claim+finish cycles/s of simulated
//! workers spread over the replicas. Each PostgreSQL configuration gets a new database on the
//! server `--database-url` names (`scripts/bench-replicas.sh` starts one). The replicas run
//! in this process, on one shared data directory. Prints figures, with the CPU time spent per
//! cycle by this process (servers and simulated workers) and by the local `postgres`
//! processes; asserts nothing.

use crate::queue::{claim_throughput_retried, grid_yaml, timed_submit};
use crate::server::BenchServer;
use crate::worker::cpu_ticks;
use clap::Args;
use client::Client;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct BenchReplicasArgs {
    /// A PostgreSQL server to make the benchmark's databases on (the user may create them).
    #[arg(long)]
    pub database_url: String,
    /// Replica counts to measure on PostgreSQL.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    pub replicas: Vec<u32>,
    /// Jobs of the submission.
    #[arg(long, default_value_t = 100_000)]
    pub jobs: u64,
    /// Simulated workers for the claim throughput.
    #[arg(long, default_value_t = 64)]
    pub workers: u32,
    /// Seconds of claim throughput per configuration (the jobs must outlast them).
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Times each configuration is measured, in alternating order.
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
}

/// One configuration's figures in one round.
#[derive(Debug, Clone, Copy)]
struct Figures {
    submit_ms: f64,
    cycles_per_s: f64,
    /// Requests answered "retry" (and sent again) per second.
    retried_per_s: f64,
    /// CPU µs per cycle of this process: the servers and the simulated workers.
    app_us: f64,
    /// CPU µs per cycle of the `postgres` processes of this machine (0 on SQLite).
    postgres_us: f64,
}

pub async fn run(args: BenchReplicasArgs) -> anyhow::Result<()> {
    let mut configurations: Vec<Option<u32>> = vec![None];
    configurations.extend(args.replicas.iter().map(|&count| Some(count.max(1))));
    let mut figures: Vec<Vec<Figures>> = vec![Vec::new(); configurations.len()];
    let mut databases = 0u32;
    for round in 0..args.rounds {
        // Alternating order: the first configuration of a round is not always the same.
        let mut order: Vec<usize> = (0..configurations.len()).collect();
        order.rotate_left(round as usize % configurations.len());
        for index in order {
            let measured = match configurations[index] {
                None => measure_sqlite(&args).await?,
                Some(count) => {
                    databases += 1;
                    let url = fresh_database(
                        &args.database_url,
                        &format!("bench_replicas_{}_{databases}", std::process::id()),
                    )
                    .await?;
                    measure_postgres(&args, &url, count).await?
                }
            };
            println!(
                "round {} {}: submit {:.0} ms, {:.0} cycles/s, CPU per cycle: app {:.0} us, PostgreSQL {:.0} us",
                round + 1,
                name(configurations[index]),
                measured.submit_ms,
                measured.cycles_per_s,
                measured.app_us,
                measured.postgres_us
            );
            figures[index].push(measured);
        }
    }
    println!(
        "\n{} jobs submitted, {} workers claiming and finishing for {} s; median of {} rounds\n",
        args.jobs, args.workers, args.seconds, args.rounds
    );
    println!(
        "| queue | submit {} jobs | claim+finish/s | vs SQLite | retried/s | CPU µs/cycle: app | PostgreSQL |",
        args.jobs
    );
    println!("|---|---|---|---|---|---|---|");
    let sqlite = median(figures[0].iter().map(|figure| figure.cycles_per_s).collect());
    for (configuration, measured) in configurations.iter().zip(&figures) {
        let of = |field: fn(&Figures) -> f64| median(measured.iter().map(field).collect());
        let cycles = of(|figure| figure.cycles_per_s);
        println!(
            "| {} | {:.2} s | {:.0} | {:.2}x | {:.0} | {:.0} | {:.0} |",
            name(*configuration),
            of(|figure| figure.submit_ms) / 1e3,
            cycles,
            cycles / sqlite,
            of(|figure| figure.retried_per_s),
            of(|figure| figure.app_us),
            of(|figure| figure.postgres_us)
        );
    }
    Ok(())
}

fn name(configuration: Option<u32>) -> String {
    match configuration {
        None => "SQLite, one server".to_string(),
        Some(1) => "PostgreSQL, 1 replica".to_string(),
        Some(count) => format!("PostgreSQL, {count} replicas"),
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    crate::queue::percentile(&values, 0.5)
}

async fn measure_sqlite(args: &BenchReplicasArgs) -> anyhow::Result<Figures> {
    let jobs = args.jobs;
    let server =
        BenchServer::start(move |config| config.max_jobs_per_sweep = config.max_jobs_per_sweep.max(jobs)).await?;
    let measured = measure(args, std::slice::from_ref(&server.url)).await;
    server.stop().await?;
    measured
}

async fn measure_postgres(args: &BenchReplicasArgs, url: &str, count: u32) -> anyhow::Result<Figures> {
    let shared = tempfile::tempdir()?;
    let mut replicas = Vec::new();
    for _ in 0..count {
        let (url, data_dir, jobs) = (url.to_string(), shared.path().to_path_buf(), args.jobs);
        replicas.push(
            BenchServer::start(move |config| {
                config.database_url = Some(url);
                config.data_dir = data_dir;
                config.max_jobs_per_sweep = config.max_jobs_per_sweep.max(jobs);
            })
            .await?,
        );
    }
    let urls: Vec<String> = replicas.iter().map(|replica| replica.url.clone()).collect();
    let measured = measure(args, &urls).await;
    for replica in replicas {
        replica.stop().await?;
    }
    measured
}

/// Submits the sweep on the first server, then lets the workers claim and finish.
async fn measure(args: &BenchReplicasArgs, urls: &[String]) -> anyhow::Result<Figures> {
    let http = reqwest::Client::new();
    let (submit_ms, _, count) = timed_submit(&http, &urls[0], grid_yaml("grid", args.jobs)).await?;
    anyhow::ensure!(count == args.jobs, "submitted {count} jobs, not {}", args.jobs);
    let clients = urls.iter().map(|url| Client::new(url)).collect::<Result<Vec<_>, _>>()?;
    let before = (cpu_ticks(std::process::id())?, postgres_ticks());
    let (cycles, retried) = claim_throughput_retried(&clients, args.workers, Duration::from_secs(args.seconds)).await?;
    let after = (cpu_ticks(std::process::id())?, postgres_ticks());
    if cycles >= args.jobs {
        println!("(the queue ran dry: the rate below is a floor; give more --jobs or fewer --seconds)");
    }
    let seconds = args.seconds as f64;
    // A tick is 1/100 s: 10,000 µs.
    let per_cycle = |ticks: u64| ticks as f64 * 10_000.0 / cycles.max(1) as f64;
    Ok(Figures {
        submit_ms,
        cycles_per_s: cycles as f64 / seconds,
        retried_per_s: retried as f64 / seconds,
        app_us: per_cycle(after.0.saturating_sub(before.0)),
        postgres_us: per_cycle(after.1.saturating_sub(before.1)),
    })
}

/// CPU ticks of every live process of this machine named `postgres` (the server's backends
/// and its helpers); a backend that ends during the window takes its ticks with it, which the
/// benchmark's, living as long as their replicas, do not.
fn postgres_ticks() -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0 };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == "postgres"))
        .filter_map(|pid| cpu_ticks(pid).ok())
        .sum()
}

/// Makes database `name` on the server of `admin` (a URL to any of its databases); its URL.
async fn fresh_database(admin: &str, name: &str) -> anyhow::Result<String> {
    server::db::postgres::create_database(admin, name).await
}
