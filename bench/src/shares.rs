//! `app-bench shares`: what the fair share (issue 29, item 2) adds to a claim. A simulated
//! worker with 8 GPUs claims one job at a time (no wait) and finishes it with a record of a
//! minute of GPU time, against a queue of one-GPU jobs held by one user (today's claim) or by
//! six (each claim reads six users' queues, what they hold and their usage), with quotas or
//! without (with: every claim counts what its user holds). Each case in a fresh in-process
//! server, cases alternating over rounds; prints the claim's p50 and p95 and their medians
//! over the rounds. Asserts nothing.

use crate::queue::percentile;
use crate::server::BenchServer;
use clap::Args;
use client::{Client, ClientOptions};
use shared::api::{
    AttemptRecord, ClaimRequest, FinishRequest, GpuUsage, InlineResult, RegisterRequest, ReportRequest, SubmitQuery,
};
use shared::job::Outcome;
use shared::placement::Capacity;
use std::time::Instant;

#[derive(Debug, Args)]
pub struct BenchSharesArgs {
    /// Queued one-GPU jobs per user.
    #[arg(long, default_value_t = 2_000)]
    pub jobs_per_user: u32,
    /// Claims timed per case and round.
    #[arg(long, default_value_t = 300)]
    pub claims: u32,
    /// Rounds (each case once per round, in a fresh server).
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
}

const WORKER_TOKEN: &str = "bench-worker-token-0123456789";

#[derive(Debug, Clone, Copy)]
struct Case {
    name: &'static str,
    users: u32,
    quotas: bool,
}

const CASES: [Case; 3] = [
    Case { name: "one user (today's claim)", users: 1, quotas: false },
    Case { name: "six users, fair share", users: 6, quotas: false },
    Case { name: "six users, fair share and quotas", users: 6, quotas: true },
];

fn token(user: u32) -> String {
    format!("bench-user-{user}-token-0123456789")
}

/// A worker with 8 free 80 GiB GPUs and `slots` job slots.
fn eight_gpus(slots: u32) -> Capacity {
    Capacity::idle_gpus(slots, 8, 80 << 30)
}

/// One case in a fresh server: the claim latencies (ms), sorted, and how many of the timed
/// claims each user's sweep got (a check that the fair share chose: about even over six).
async fn run_case(case: Case, args: &BenchSharesArgs) -> anyhow::Result<(Vec<f64>, Vec<u32>)> {
    let server = BenchServer::start(|config| {
        let users: Vec<String> = (0..case.users).map(|user| format!("user-{user}:{}", token(user))).collect();
        let _ = config.tokens.add_users(&users.join(","), "bench");
        let _ = config.tokens.add(server::auth::Role::Worker, WORKER_TOKEN, "bench");
        if case.quotas {
            let quota = shared::fair_share::Quota { max_gpus: Some(64), max_running: Some(1_000) };
            config.shares.default_quota = quota;
        }
    })
    .await?;
    let as_token =
        |token: &str| Client::with_options(&server.url, &ClientOptions { token: Some(token.into()), ca_pem: None });
    let axis: Vec<String> = (0..args.jobs_per_user).map(|i| i.to_string()).collect();
    for user in 0..case.users {
        let yaml = format!(
            "name: grid-{user}\ncommand: \"true\"\nresources: {{gpus: 1}}\ngrid:\n  i: [{}]\n",
            axis.join(", ")
        );
        as_token(&token(user))?.submit(&yaml, &SubmitQuery::default()).await?;
    }
    let worker = as_token(WORKER_TOKEN)?;
    let registration = RegisterRequest {
        name: "bench-box".into(),
        protocol: shared::PROTOCOL_VERSION,
        key: None,
        capacity: eight_gpus(8),
        holding: Vec::new(),
    };
    let registered = worker.register(&registration).await?;
    let worker = worker.with_session(&registered)?;
    let id = registered.worker_id;
    // Seven GPUs held by earlier claims, as on a busy box: each timed claim takes the eighth.
    let request = |slots| ClaimRequest { capacity: eight_gpus(slots), wait_ms: 0, reserve: 0 };
    let mut held = worker.claim(id, &request(7)).await?.jobs;
    let mut latencies = Vec::with_capacity(args.claims as usize);
    let mut served = vec![0u32; case.users as usize];
    for _ in 0..args.claims {
        let mut capacity = eight_gpus(1);
        capacity.gpus.retain(|gpu| gpu.index == 7);
        let started = Instant::now();
        let jobs = worker.claim(id, &ClaimRequest { capacity, wait_ms: 0, reserve: 0 }).await?.jobs;
        latencies.push(started.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(jobs.len() == 1, "each claim should get one job, got {}", jobs.len());
        let job = &jobs[0];
        if let Some(user) = job.sweep.strip_prefix("grid-").and_then(|user| user.parse::<usize>().ok()) {
            served[user] += 1;
        }
        // Its record says it held its GPU a minute, as a worker's does: the fair share counts it.
        let record = AttemptRecord {
            exit_code: Some(0),
            outcome: "exited with code 0".into(),
            worker: "bench-box".into(),
            gpu_usage: Some(GpuUsage { gpus: vec![7], samples: 12, gpu_hours: 1.0 / 60.0, ..GpuUsage::default() }),
            ..AttemptRecord::default()
        };
        let finish = FinishRequest {
            result: Some(InlineResult { files: Vec::new(), streamed: Vec::new(), record }),
            ..FinishRequest::outcome(job.id, job.attempt, Outcome::Exited { code: 0 })
        };
        worker.finish(id, &finish).await?;
        // The oldest held job ends too and its place is taken again, so users' holdings move.
        if let Some(oldest) = held.first().cloned() {
            held.remove(0);
            worker
                .report(
                    oldest.id,
                    &ReportRequest { worker_id: id, attempt: oldest.attempt, outcome: Outcome::Exited { code: 0 } },
                )
                .await?;
            held.extend(worker.claim(id, &request(1)).await?.jobs);
        }
    }
    server.stop().await?;
    latencies.sort_by(f64::total_cmp);
    Ok((latencies, served))
}

pub async fn run(args: BenchSharesArgs) -> anyhow::Result<()> {
    println!(
        "fair-share claim latency: {} one-GPU jobs per user, {} claims per case, {} rounds",
        args.jobs_per_user, args.claims, args.rounds
    );
    let mut p50s: Vec<Vec<f64>> = vec![Vec::new(); CASES.len()];
    let mut p95s: Vec<Vec<f64>> = vec![Vec::new(); CASES.len()];
    for round in 1..=args.rounds {
        // Alternating the order from round to round, so no case always runs on a warmer machine.
        let order: Vec<usize> =
            if round % 2 == 1 { (0..CASES.len()).collect() } else { (0..CASES.len()).rev().collect() };
        for at in order {
            let (latencies, served) = run_case(CASES[at], &args).await?;
            let (p50, p95) = (percentile(&latencies, 0.5), percentile(&latencies, 0.95));
            println!(
                "round {round}: {:<36} p50 {p50:.3} ms, p95 {p95:.3} ms, claims by user {served:?}",
                CASES[at].name
            );
            p50s[at].push(p50);
            p95s[at].push(p95);
        }
    }
    let median = |values: &[f64]| {
        let mut values = values.to_vec();
        values.sort_by(f64::total_cmp);
        percentile(&values, 0.5)
    };
    let base = median(&p50s[0]);
    for (at, case) in CASES.iter().enumerate() {
        let (p50, p95) = (median(&p50s[at]), median(&p95s[at]));
        println!("{:<36} p50 {p50:.3} ms (+{:.3}), p95 {p95:.3} ms, medians over rounds", case.name, p50 - base);
    }
    Ok(())
}
