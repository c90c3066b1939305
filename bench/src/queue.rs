//! `app-bench queue`: measures the queue on this machine, against a server started in this
//! process on 127.0.0.1 with a temporary data directory. Prints figures; asserts nothing.

use clap::Args;
use client::Client;
use shared::api::{ClaimRequest, FinishRequest, JobQuery, RegisterRequest, ReportRequest, SubmitQuery};
use shared::job::{JobStatus, Outcome};
use shared::placement::Capacity;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Jobs in the large grid.
    #[arg(long, default_value_t = 100_000)]
    pub grid_jobs: u64,
    /// Jobs in each of the successive submissions.
    #[arg(long, default_value_t = 20_000)]
    pub batch_jobs: u64,
    /// Successive submissions.
    #[arg(long, default_value_t = 5)]
    pub batches: u32,
    /// Pause before each of the successive submissions (lets the previous one's background
    /// checkpoint finish), e.g. 1s or 500ms.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub pause: Duration,
    /// Times the series of successive submissions is repeated (the queue keeps growing).
    #[arg(long, default_value_t = 10)]
    pub rounds: u32,
    /// Simulated workers for the claim throughput.
    #[arg(long, default_value_t = 64)]
    pub workers: u32,
    /// Seconds of claim throughput.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Dispatch latency samples.
    #[arg(long, default_value_t = 100)]
    pub samples: u32,
    /// A server already running, with an empty queue and no tokens (`app --server-only` started
    /// apart, so that the simulated workers talk to it as separate processes do and each side's
    /// CPU is counted apart), instead of one started in this process.
    #[arg(long)]
    pub url: Option<String>,
    /// With `--url`: the server's process, whose CPU per claim+finish cycle is then printed.
    #[arg(long, requires = "url")]
    pub server_pid: Option<u32>,
}

/// A grid of `jobs` trivial runs (two axes, so the count is exact for multiples of 1000).
pub(super) fn grid_yaml(name: &str, jobs: u64) -> String {
    let outer = (jobs / 1000).max(1);
    let inner = jobs.min(1000);
    let axis = |n: u64| (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(", ");
    format!(
        "name: {name}\ncommand: \"true --a {{a}} --b {{b}}\"\ngrid:\n  a: [{}]\n  b: [{}]\n",
        axis(outer),
        axis(inner)
    )
}

/// Submits and returns (end-to-end ms, server-side ms from the Server-Timing header).
pub(super) async fn timed_submit(http: &reqwest::Client, url: &str, yaml: String) -> anyhow::Result<(f64, f64, u64)> {
    let started = Instant::now();
    let response = http.post(format!("{url}/api/sweeps")).body(yaml).send().await?.error_for_status()?;
    let server_ms = response
        .headers()
        .get("server-timing")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split("dur=").nth(1))
        .and_then(|value| value.parse::<f64>().ok())
        .unwrap_or(f64::NAN);
    let body: shared::api::SubmitResponse = response.json().await?;
    Ok((started.elapsed().as_secs_f64() * 1e3, server_ms, body.count))
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, scale) = match text.strip_suffix("ms") {
        Some(number) => (number, 1e-3),
        None => (text.strip_suffix('s').unwrap_or(text), 1.0),
    };
    let seconds: f64 = number.trim().parse().map_err(|_| format!("`{text}` is not a duration like 2s or 500ms"))?;
    Duration::try_from_secs_f64(seconds * scale).map_err(|error| error.to_string())
}

pub fn percentile(sorted: &[f64], fraction: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let grid_jobs = args.grid_jobs;
    let bench = match &args.url {
        Some(_) => None,
        None => Some(
            crate::server::BenchServer::start(|config| {
                config.max_jobs_per_sweep = config.max_jobs_per_sweep.max(grid_jobs);
            })
            .await?,
        ),
    };
    let url = match (&bench, &args.url) {
        (Some(bench), _) => bench.url.clone(),
        (None, url) => url.clone().unwrap_or_default(),
    };
    let client = Client::new(&url)?;
    let http = reqwest::Client::new();
    println!("queue benchmark on {} ({} cores), server at {url}", std::env::consts::ARCH, num_cpus());

    let started = Instant::now();
    let (total, server_ms, count) = timed_submit(&http, &url, grid_yaml("grid", args.grid_jobs)).await?;
    // A large sweep's rows after the first few thousand are written after the submission returns
    // (decision 0076): how long until every one is there, and claimable.
    let written = loop {
        let query = JobQuery { sweep: Some("grid".into()), limit: Some(1), ..JobQuery::default() };
        if client.jobs(&query).await?.total >= count {
            break started.elapsed().as_secs_f64() * 1e3;
        }
        anyhow::ensure!(started.elapsed() < Duration::from_secs(600), "the grid's rows were not all written");
        // Each look counts the rows (tens of ms at a million): not so often that looking slows
        // the writing down on 2 cores.
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "(a) {count}-job grid: server side {server_ms:.0} ms, end to end {total:.0} ms, every row written at {written:.0} ms"
    );

    // The series is run `rounds` times on the growing queue; each position's median is the
    // figure, since single ~40 ms timings on a shared 2-core machine move by tens of percent.
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); args.batches as usize];
    for round in 1..=args.rounds {
        let mut line = Vec::new();
        for batch in 1..=args.batches {
            // Let the background checkpoint of the previous submission finish: the question is
            // whether a submission slows down as the queue grows, not how two of them overlap.
            tokio::time::sleep(args.pause).await;
            let name = format!("batch-{round}-{batch}");
            let (_, server_ms, _) = timed_submit(&http, &url, grid_yaml(&name, args.batch_jobs)).await?;
            times[batch as usize - 1].push(server_ms);
            line.push(format!("{server_ms:.0}"));
        }
        println!("(b) round {round}: {} x {} jobs, server side ms: {}", args.batches, args.batch_jobs, line.join(", "));
    }
    // Noise on a shared machine comes in bursts of seconds that only ever add time, so the
    // fastest of the rounds is the clearest view of what a position costs; medians are shown
    // too.
    let summarise = |label: &str, pick: &dyn Fn(&[f64]) -> f64| {
        let values: Vec<f64> = times
            .iter()
            .map(|samples| {
                let mut sorted = samples.clone();
                sorted.sort_by(f64::total_cmp);
                pick(&sorted)
            })
            .collect();
        let first = values.first().copied().unwrap_or(f64::NAN);
        let shown: Vec<String> = values.iter().map(|value| format!("{value:.0} ms ({:.2}x)", value / first)).collect();
        println!("(b) {label} per position over {} rounds: {}", args.rounds, shown.join(", "));
    };
    summarise("fastest", &|sorted| sorted.first().copied().unwrap_or(f64::NAN));
    summarise("median", &|sorted| percentile(sorted, 0.5));

    let ticks = |pid: Option<u32>| pid.and_then(|pid| crate::worker::cpu_ticks(pid).ok());
    let before = (ticks(args.server_pid), ticks(Some(std::process::id())));
    let cycles =
        claim_throughput(std::slice::from_ref(&client), args.workers, Duration::from_secs(args.seconds)).await?;
    let after = (ticks(args.server_pid), ticks(Some(std::process::id())));
    println!(
        "(c) claim+finish with {} workers over {} s: {cycles} cycles, {:.0} cycles/s",
        args.workers,
        args.seconds,
        cycles as f64 / args.seconds as f64
    );
    // Clock ticks are 10 ms: over seconds of cycles, µs per cycle to within a few percent.
    let per_cycle = |ticks: u64| ticks as f64 * 1e4 / cycles.max(1) as f64;
    if let ((Some(server_before), Some(own_before)), (Some(server_after), Some(own_after))) = (before, after) {
        println!(
            "(c) CPU per cycle: server process {:.0} µs, this process (the simulated workers) {:.0} µs",
            per_cycle(server_after - server_before),
            per_cycle(own_after - own_before)
        );
    }

    for sweep in client.sweeps().await? {
        client.cancel_sweep(&sweep.name).await?;
    }
    let mut latencies = dispatch_latency(&client, args.samples).await?;
    latencies.sort_by(f64::total_cmp);
    println!(
        "(d) dispatch latency over {} samples: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        latencies.len(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or(f64::NAN)
    );
    if let Some(bench) = bench {
        bench.stop().await?;
    }
    Ok(())
}

pub fn num_cpus() -> usize {
    std::thread::available_parallelism().map(usize::from).unwrap_or(1)
}

pub fn cpu_worker(name: String) -> RegisterRequest {
    RegisterRequest {
        name,
        protocol: shared::PROTOCOL_VERSION,
        key: None,
        capacity: Capacity { job_slots: 1, gpus: Vec::new(), ..Capacity::default() },
        holding: Vec::new(),
    }
}

/// Claim+finish cycles of `workers` simulated workers in `duration`, worker `n` talking to
/// `servers[n % servers.len()]` (replicas of one queue, or one server).
pub(super) async fn claim_throughput(servers: &[Client], workers: u32, duration: Duration) -> anyhow::Result<u64> {
    Ok(claim_throughput_retried(servers, workers, duration).await?.0)
}

/// [`claim_throughput`], and how many requests were answered "retry" and sent again.
pub(super) async fn claim_throughput_retried(
    servers: &[Client],
    workers: u32,
    duration: Duration,
) -> anyhow::Result<(u64, u64)> {
    let cycles = Arc::new(AtomicU64::new(0));
    let retried = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + duration;
    let mut tasks = Vec::new();
    for number in 0..workers {
        let client = servers[number as usize % servers.len()].clone();
        let (cycles, retried) = (cycles.clone(), retried.clone());
        tasks.push(tokio::spawn(async move {
            let worker = client.register(&cpu_worker(format!("bench-{number}"))).await?;
            let client = client.with_session(&worker)?;
            let request = ClaimRequest {
                capacity: Capacity { job_slots: 1, gpus: Vec::new(), ..Capacity::default() },
                wait_ms: 1_000,
                reserve: 0,
            };
            // As a worker does: one claim to start, then each finish claims the next job.
            let claim = |client: &Client| {
                let (client, request, retried) = (client.clone(), request.clone(), retried.clone());
                async move {
                    match client.claim(worker.worker_id, &request).await {
                        Ok(answer) => anyhow::Ok(answer.jobs),
                        Err(error) if error.is_retryable() => {
                            retried.fetch_add(1, Ordering::Relaxed);
                            Ok(Vec::new())
                        }
                        Err(error) => Err(error.into()),
                    }
                }
            };
            let mut jobs = claim(&client).await?;
            while Instant::now() < deadline {
                let Some(job) = jobs.pop() else {
                    jobs = claim(&client).await?;
                    continue;
                };
                let finish = FinishRequest {
                    claim: Some(ClaimRequest { wait_ms: 0, ..request.clone() }),
                    ..FinishRequest::outcome(job.id, job.attempt, Outcome::Exited { code: 0 })
                };
                // As a worker does, a retryable answer (a write the database gave up, such as a
                // PostgreSQL deadlock between replicas) is sent again.
                let mut tries = 0;
                jobs = loop {
                    match client.finish(worker.worker_id, &finish).await {
                        Ok(answer) => break answer.jobs,
                        Err(error) if error.is_retryable() && tries < 20 => {
                            tries += 1;
                            retried.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(error) => return Err(error.into()),
                    }
                };
                cycles.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok((cycles.load(Ordering::Relaxed), retried.load(Ordering::Relaxed)))
}

async fn dispatch_latency(client: &Client, samples: u32) -> anyhow::Result<Vec<f64>> {
    let queued =
        client.jobs(&JobQuery { status: Some(JobStatus::Queued), limit: Some(1), ..JobQuery::default() }).await?;
    anyhow::ensure!(queued.total == 0, "the queue should be empty before measuring dispatch latency");
    let worker = client.register(&cpu_worker("latency".into())).await?;
    let client = &client.with_session(&worker)?;
    let mut latencies = Vec::new();
    for sample in 0..samples {
        let claimer = client.clone();
        let request = ClaimRequest {
            capacity: Capacity { job_slots: 1, gpus: Vec::new(), ..Capacity::default() },
            wait_ms: 10_000,
            reserve: 0,
        };
        let claim = tokio::spawn(async move {
            let response = claimer.claim(worker.worker_id, &request).await;
            (Instant::now(), response)
        });
        // Let the claim reach the server and park before the job exists.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let submitted = Instant::now();
        let yaml = format!("name: latency-{sample}\ncommand: \"true\"\n");
        client.submit(&yaml, &SubmitQuery::default()).await?;
        let (claimed_at, response) = claim.await?;
        let jobs = response?.jobs;
        anyhow::ensure!(jobs.len() == 1, "the parked claim should return the one new job");
        latencies.push(claimed_at.duration_since(submitted).as_secs_f64() * 1e3);
        let report = ReportRequest {
            worker_id: worker.worker_id,
            attempt: jobs[0].attempt,
            outcome: Outcome::Exited { code: 0 },
        };
        client.report(jobs[0].id, &report).await?;
    }
    Ok(latencies)
}
