//! `app-bench page`: how fast the JSON endpoints of the web page answer on a large queue
//! (100,000 jobs, 1,000,000 metric points by default), against a server started in this
//! process on 127.0.0.1 with a temporary data directory. Prints figures; asserts nothing.

use crate::queue::{num_cpus, percentile};
use crate::server::{gpu_samples, BenchServer};
use anyhow::Context;
use clap::Args;
use client::Client;
use shared::api::{
    ClaimRequest, HeartbeatRequest, JobAttempt, JobQuery, MetricPoint, MetricsBatch, RegisterRequest, ReportRequest,
    SubmitQuery,
};
use shared::job::{JobStatus, Outcome};
use shared::placement::Capacity;
use std::time::Instant;

#[derive(Debug, Args)]
pub struct BenchPageArgs {
    /// Jobs in the sweep (a multiple of 1,000).
    #[arg(long, default_value_t = 100_000)]
    pub jobs: u64,
    /// Jobs that run and report metrics.
    #[arg(long, default_value_t = 1_000)]
    pub finished: u64,
    /// Metric points each finished job reports (two metrics, half the steps each).
    #[arg(long, default_value_t = 1_000)]
    pub points: u64,
    /// Requests per endpoint.
    #[arg(long, default_value_t = 100)]
    pub requests: u32,
}

fn sweep_yaml(jobs: u64) -> String {
    let axis = |n: u64| (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(", ");
    format!(
        "name: page\ncommand: \"true --lr {{lr}} --seed {{seed}}\"\nmetric: {{name: val_loss, goal: minimize}}\n\
         grid:\n  lr: [{}]\n  seed: [{}]\n",
        axis((jobs / 1000).max(1)),
        axis(jobs.min(1000))
    )
}

/// Runs `finished` jobs through claim, metrics and report (a few fail, a few keep running),
/// and sends an hour of 8-GPU telemetry at one sample per 5 s.
async fn fill(client: &Client, args: &BenchPageArgs) -> anyhow::Result<()> {
    let register = RegisterRequest {
        name: "bench-worker".into(),
        protocol: shared::PROTOCOL_VERSION,
        key: None,
        capacity: Capacity { job_slots: 100, gpus: Vec::new(), ..Capacity::default() },
        holding: Vec::new(),
    };
    let registered = client.register(&register).await?;
    let worker = registered.worker_id;
    let client = &client.with_session(&registered)?;
    let mut done = 0;
    let mut running = Vec::new();
    while done < args.finished {
        let want = (args.finished - done).min(100) as u32;
        let claim = ClaimRequest {
            capacity: Capacity { job_slots: want, gpus: Vec::new(), ..Capacity::default() },
            wait_ms: 0,
            reserve: 0,
        };
        let jobs = client.claim(worker, &claim).await?.jobs;
        anyhow::ensure!(!jobs.is_empty(), "the queue ran dry after {done} jobs");
        for job in jobs {
            let points = (0..args.points)
                .map(|point| {
                    let step = (point / 2) as i64;
                    let name = if point % 2 == 0 { "val_loss" } else { "train_loss" };
                    let value = 1.0 / (1.0 + step as f64) + (job.id.get() % 97) as f64 * 1e-3;
                    MetricPoint { step: Some(step), name: name.into(), value }
                })
                .collect();
            let batch = MetricsBatch { worker_id: worker, attempt: job.attempt, offset: 1, points };
            client.send_metrics(job.id, &batch).await?;
            done += 1;
            if done % 50 == 0 {
                running.push(JobAttempt { job_id: job.id, attempt: job.attempt });
                continue;
            }
            let code = if done % 10 == 0 { 1 } else { 0 };
            let report = ReportRequest { worker_id: worker, attempt: job.attempt, outcome: Outcome::Exited { code } };
            client.report(job.id, &report).await?;
        }
    }
    for tick in 0..720 {
        let gpus = gpu_samples(8, tick);
        client.heartbeat(worker, &HeartbeatRequest { running: running.clone(), gpus, saves: Vec::new() }).await?;
    }
    Ok(())
}

/// Times `requests` GETs of `path`; returns sorted milliseconds and the body size.
async fn time_get(http: &reqwest::Client, url: &str, path: &str, requests: u32) -> anyhow::Result<(Vec<f64>, usize)> {
    let mut times = Vec::new();
    let mut size = 0;
    for _ in 0..requests {
        let started = Instant::now();
        let body = http.get(format!("{url}{path}")).send().await?.error_for_status()?.bytes().await?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
        size = body.len();
    }
    times.sort_by(f64::total_cmp);
    Ok((times, size))
}

pub async fn run(args: BenchPageArgs) -> anyhow::Result<()> {
    // A long lease: the jobs left running stay running while the endpoints are measured.
    let bench = BenchServer::start(|config| config.lease = std::time::Duration::from_secs(3600)).await?;
    let url = bench.url.clone();
    let client = Client::new(&url)?;
    println!("web page endpoints on {} ({} cores), server at {url}", std::env::consts::ARCH, num_cpus());

    let started = Instant::now();
    let submitted = client.submit(&sweep_yaml(args.jobs), &SubmitQuery::default()).await?;
    fill(&client, &args).await?;
    println!(
        "filled in {:.1} s: {} jobs, {} with {} metric points each ({} points), 8 GPUs x 720 telemetry samples",
        started.elapsed().as_secs_f64(),
        submitted.count,
        args.finished,
        args.points,
        args.finished * args.points
    );
    let succeeded = JobQuery { status: Some(JobStatus::Succeeded), limit: Some(1), ..JobQuery::default() };
    let job = client.jobs(&succeeded).await?.jobs.pop().context("a succeeded job")?.id;
    let deep = args.jobs.saturating_sub(100);
    let paths = [
        "/api/overview".to_string(),
        "/api/sweeps".to_string(),
        "/api/sweeps/page".to_string(),
        "/api/jobs?limit=50".to_string(),
        "/api/jobs?limit=50&sort=duration&order=desc".to_string(),
        "/api/jobs?limit=50&status=succeeded&sort=started_at&order=desc".to_string(),
        "/api/jobs?limit=50&sweep=page&sort=priority&order=desc".to_string(),
        "/api/jobs?limit=50&worker=bench-worker&sort=status".to_string(),
        format!("/api/jobs?limit=50&offset={deep}"),
        format!("/api/jobs/{job}"),
        format!("/api/jobs/{job}/attempts"),
        format!("/api/jobs/{job}/metrics"),
        format!("/api/jobs/{job}/results"),
        format!("/api/jobs/{job}/log?offset=0"),
        "/api/sweeps/page/summary?top=20".to_string(),
        "/api/workers".to_string(),
        "/api/workers/bench-worker/telemetry".to_string(),
    ];
    let http = reqwest::Client::new();
    let mut worst: f64 = 0.0;
    println!("{:<64} {:>8} {:>8} {:>8} {:>10}", "endpoint", "p50 ms", "p95 ms", "max ms", "bytes");
    for path in &paths {
        let (times, size) = time_get(&http, &url, path, args.requests).await?;
        let p95 = percentile(&times, 0.95);
        worst = worst.max(p95);
        println!(
            "{path:<64} {:>8.1} {p95:>8.1} {:>8.1} {size:>10}",
            percentile(&times, 0.5),
            times.last().copied().unwrap_or(f64::NAN)
        );
    }
    println!("slowest p95: {worst:.1} ms (target < 100 ms)");
    bench.stop().await?;
    Ok(())
}
