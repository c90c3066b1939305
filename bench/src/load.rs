//! `app-bench load`: many simulated workers against one server, both in this process (one
//! tokio runtime), the server on 127.0.0.1 with a temporary data directory. Every worker
//! registers, heartbeats every second with GPU telemetry, and claims (long poll), "runs" and
//! reports jobs, while sweeps keep arriving. Prints requests by kind, server errors, heartbeat
//! latency, claim+report cycles and the process's memory; asserts nothing.

use crate::queue::{num_cpus, percentile};
use crate::server::{gpu_samples, BenchServer};
use anyhow::Context;
use clap::Args;
use client::{Client, ClientError};
use shared::api::{ClaimRequest, HeartbeatRequest, JobAttempt, RegisterRequest, ReportRequest, SubmitQuery};
use shared::job::Outcome;
use shared::placement::Capacity;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

#[derive(Debug, Args)]
pub struct BenchLoadArgs {
    /// Simulated workers.
    #[arg(long, default_value_t = 500)]
    pub workers: u32,
    /// Seconds of load.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Jobs in each submitted sweep.
    #[arg(long, default_value_t = 1_000)]
    pub sweep_jobs: u64,
    /// Seconds between two sweep submissions.
    #[arg(long, default_value_t = 5.0)]
    pub sweep_every: f64,
    /// GPU telemetry samples in each heartbeat.
    #[arg(long, default_value_t = 2)]
    pub gpus: u32,
    /// A simulated job "runs" between 0 and twice this many milliseconds.
    #[arg(long, default_value_t = 2_000)]
    pub job_ms: u64,
}

/// What one kind of request did: sent, answered 5xx, never answered (transport errors).
#[derive(Default)]
struct Counter {
    sent: AtomicU64,
    server_errors: AtomicU64,
    transport_errors: AtomicU64,
    rejected: AtomicU64,
}

impl Counter {
    fn count<T>(&self, result: &Result<T, ClientError>) {
        self.sent.fetch_add(1, Ordering::Relaxed);
        let tally = match result {
            Ok(_) => return,
            Err(ClientError::Server { .. }) => &self.server_errors,
            Err(ClientError::Unreachable { .. } | ClientError::Decode { .. }) => &self.transport_errors,
            Err(ClientError::Rejected { .. }) => &self.rejected,
        };
        tally.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct Stats {
    register: Counter,
    heartbeat: Counter,
    claim: Counter,
    report: Counter,
    submit: Counter,
    /// Jobs claimed and then reported succeeded.
    cycles: AtomicU64,
    heartbeat_ms: Mutex<Vec<f64>>,
    /// One example of each kind of failure, for the printout.
    first_error: Mutex<Option<String>>,
}

impl Stats {
    fn note<T>(&self, counter: &Counter, result: &Result<T, ClientError>) {
        counter.count(result);
        if let Err(error) = result {
            if !matches!(error, ClientError::Rejected { .. }) {
                self.first_error.lock().unwrap().get_or_insert_with(|| error.to_string());
            }
        }
    }
}

/// The resident memory of this process (server and simulated workers together), in MiB.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<f64>().ok());
    kib.map_or(f64::NAN, |kib| kib / 1024.0)
}

/// A small deterministic generator: jobs' durations and start offsets differ per worker.
fn spread(seed: u64, range: u64) -> u64 {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    x % range.max(1)
}

/// One simulated worker: registers, then heartbeats and claims/reports until `stop`.
async fn simulated_worker(
    client: Client,
    number: u32,
    args: Arc<BenchLoadArgs>,
    stats: Arc<Stats>,
    stop: watch::Receiver<bool>,
) {
    let register = RegisterRequest {
        name: format!("load-{number}"),
        protocol: shared::PROTOCOL_VERSION,
        key: None,
        capacity: Capacity { job_slots: 1, gpus: Vec::new(), ..Capacity::default() },
        holding: Vec::new(),
    };
    let (worker_id, client) = loop {
        let registered = client.register(&register).await;
        stats.note(&stats.register, &registered);
        match registered {
            Ok(response) => match client.with_session(&response) {
                Ok(session) => break (response.worker_id, session),
                Err(_) => return,
            },
            Err(_) if !*stop.borrow() => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(_) => return,
        }
    };
    let running: Arc<Mutex<Vec<JobAttempt>>> = Arc::default();
    let beats = tokio::spawn(heartbeats(
        client.clone(),
        worker_id,
        number,
        args.clone(),
        stats.clone(),
        running.clone(),
        stop.clone(),
    ));
    claims(client, worker_id, number, args, stats, running, stop).await;
    let _ = beats.await;
}

async fn heartbeats(
    client: Client,
    worker_id: shared::api::WorkerId,
    number: u32,
    args: Arc<BenchLoadArgs>,
    stats: Arc<Stats>,
    running: Arc<Mutex<Vec<JobAttempt>>>,
    mut stop: watch::Receiver<bool>,
) {
    // Spread over the second, as real workers started at different times are.
    let offset = Duration::from_millis(spread(u64::from(number), 1000));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + offset, Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut beat = 0u64;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        beat += 1;
        let request = HeartbeatRequest {
            running: running.lock().unwrap().clone(),
            gpus: gpu_samples(args.gpus, beat),
            saves: Vec::new(),
        };
        let started = Instant::now();
        let answered = client.heartbeat(worker_id, &request).await;
        let elapsed = started.elapsed().as_secs_f64() * 1e3;
        stats.note(&stats.heartbeat, &answered);
        if answered.is_ok() {
            stats.heartbeat_ms.lock().unwrap().push(elapsed);
        }
    }
}

async fn claims(
    client: Client,
    worker_id: shared::api::WorkerId,
    number: u32,
    args: Arc<BenchLoadArgs>,
    stats: Arc<Stats>,
    running: Arc<Mutex<Vec<JobAttempt>>>,
    mut stop: watch::Receiver<bool>,
) {
    let request = ClaimRequest {
        capacity: Capacity { job_slots: 1, gpus: Vec::new(), ..Capacity::default() },
        wait_ms: 25_000,
        reserve: 0,
    };
    let mut runs = 0u64;
    while !*stop.borrow() {
        let claimed = tokio::select! {
            claimed = client.claim(worker_id, &request) => claimed,
            _ = stop.wait_for(|stop| *stop) => return,
        };
        stats.note(&stats.claim, &claimed);
        let jobs = match claimed {
            Ok(response) => response.jobs,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        for job in jobs {
            let attempt = JobAttempt { job_id: job.id, attempt: job.attempt };
            running.lock().unwrap().push(attempt);
            runs += 1;
            let duration = Duration::from_millis(spread(u64::from(number) << 32 | runs, 2 * args.job_ms + 1));
            tokio::select! {
                _ = tokio::time::sleep(duration) => {}
                _ = stop.wait_for(|stop| *stop) => return,
            }
            let report = ReportRequest { worker_id, attempt: job.attempt, outcome: Outcome::Exited { code: 0 } };
            let reported = client.report(job.id, &report).await;
            stats.note(&stats.report, &reported);
            if reported.is_ok() {
                stats.cycles.fetch_add(1, Ordering::Relaxed);
            }
            running.lock().unwrap().retain(|held| *held != attempt);
        }
    }
}

/// Submits a sweep of `jobs` every `every` until `stop`.
async fn submitter(client: Client, jobs: u64, every: Duration, stats: Arc<Stats>, mut stop: watch::Receiver<bool>) {
    let axis = |n: u64| (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(", ");
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for number in 0u64.. {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        let yaml = format!(
            "name: load-{number}\ncommand: \"true --a {{a}} --b {{b}}\"\ngrid:\n  a: [{}]\n  b: [{}]\n",
            axis((jobs / 1000).max(1)),
            axis(jobs.min(1000))
        );
        let submitted = client.submit(&yaml, &SubmitQuery::default()).await;
        stats.note(&stats.submit, &submitted);
    }
}

fn line(kind: &str, counter: &Counter) {
    println!(
        "  {kind:<10} {:>9} {:>6} {:>10} {:>9}",
        counter.sent.load(Ordering::Relaxed),
        counter.server_errors.load(Ordering::Relaxed),
        counter.transport_errors.load(Ordering::Relaxed),
        counter.rejected.load(Ordering::Relaxed)
    );
}

pub async fn run(args: BenchLoadArgs) -> anyhow::Result<()> {
    let bench = BenchServer::start(|config| config.heartbeat = Duration::from_secs(1)).await?;
    let (url, data_dir) = (bench.url.clone(), bench.data_dir());
    let baseline = rss_mib();
    println!(
        "load benchmark on {} ({} cores), server at {url}: {} workers for {} s, a {}-job sweep every {} s",
        std::env::consts::ARCH,
        num_cpus(),
        args.workers,
        args.seconds,
        args.sweep_jobs,
        args.sweep_every
    );
    let args = Arc::new(args);
    let stats = Arc::new(Stats::default());
    let (stop, stopped) = watch::channel(false);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for number in 0..args.workers {
        // One client (and so one connection pool) per worker, as separate machines would have.
        let client = Client::new(&url)?;
        tasks.push(tokio::spawn(simulated_worker(client, number, args.clone(), stats.clone(), stopped.clone())));
    }
    let every = Duration::try_from_secs_f64(args.sweep_every).context("--sweep-every")?;
    tasks.push(tokio::spawn(submitter(Client::new(&url)?, args.sweep_jobs, every, stats.clone(), stopped.clone())));
    let mut peak = baseline;
    let wal = data_dir.join("queue.db-wal");
    let wal_mib = || std::fs::metadata(&wal).map_or(0.0, |meta| meta.len() as f64 / f64::from(1 << 20));
    let mut wal_peak = wal_mib();
    let deadline = started + Duration::from_secs(args.seconds);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250).min(deadline - Instant::now())).await;
        peak = peak.max(rss_mib());
        wal_peak = wal_peak.max(wal_mib());
    }
    let _ = stop.send(true);
    for task in tasks {
        let _ = task.await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let end = rss_mib();

    println!("requests by kind over {elapsed:.1} s:");
    println!("  {:<10} {:>9} {:>6} {:>10} {:>9}", "kind", "sent", "5xx", "transport", "4xx");
    for (kind, counter) in [
        ("register", &stats.register),
        ("heartbeat", &stats.heartbeat),
        ("claim", &stats.claim),
        ("report", &stats.report),
        ("submit", &stats.submit),
    ] {
        line(kind, counter);
    }
    let counters = [&stats.register, &stats.heartbeat, &stats.claim, &stats.report, &stats.submit];
    let server_errors: u64 = counters.iter().map(|counter| counter.server_errors.load(Ordering::Relaxed)).sum();
    let transport: u64 = counters.iter().map(|counter| counter.transport_errors.load(Ordering::Relaxed)).sum();
    println!(
        "5xx: {server_errors}, transport errors: {transport} ({})",
        if server_errors + transport == 0 { "ok" } else { "NOT zero" }
    );
    if let Some(error) = stats.first_error.lock().unwrap().as_ref() {
        println!("  first failure: {error}");
    }
    let mut times = std::mem::take(&mut *stats.heartbeat_ms.lock().unwrap());
    times.sort_by(f64::total_cmp);
    let p99 = percentile(&times, 0.99);
    println!(
        "heartbeat latency over {} beats: p50 {:.1} ms, p99 {p99:.1} ms, max {:.1} ms (target p99 < 50 ms: {})",
        times.len(),
        percentile(&times, 0.5),
        times.last().copied().unwrap_or(f64::NAN),
        if p99 < 50.0 { "met" } else { "MISSED" }
    );
    let cycles = stats.cycles.load(Ordering::Relaxed);
    println!("claim+report cycles: {cycles} ({:.0}/s)", cycles as f64 / elapsed);
    println!("resident memory (server and simulated workers): baseline {baseline:.0} MiB, peak {peak:.0} MiB, end {end:.0} MiB");
    let database = std::fs::metadata(data_dir.join("queue.db")).map_or(0, |meta| meta.len()) >> 20;
    println!("database: queue.db {database} MiB, write-ahead log peak {wal_peak:.0} MiB, end {:.0} MiB", wal_mib());
    bench.stop().await?;
    Ok(())
}
