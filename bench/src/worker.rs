//! `app-bench worker`: measures the worker on this machine. Prints figures; asserts nothing.
//!
//! (a) Throughput: N jobs of `true` through a server and one local worker with `--max-jobs 2`
//! (both in this process, as `app` runs them), against GNU `parallel -j2 true` over N inputs
//! in the same run. (b) Dispatch: an idle worker, a one-job sweep submitted, time until the
//! job's process has started. (c) An idle `app --client-only` process: CPU and memory.

use anyhow::Context;
use clap::Args;
use client::Client;
use shared::api::SubmitQuery;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct BenchWorkerArgs {
    /// Jobs of `true` for the throughput run.
    #[arg(long, default_value_t = 2_000)]
    pub jobs: u64,
    /// The worker's --max-jobs (and parallel's -j).
    #[arg(long, default_value_t = 2)]
    pub max_jobs: u32,
    /// Dispatch latency samples.
    #[arg(long, default_value_t = 30)]
    pub samples: u32,
    /// Seconds the idle worker process is watched.
    #[arg(long, default_value_t = 30)]
    pub idle_secs: u64,
}

fn now_ns() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|t| t.as_nanos()).unwrap_or(0)
}

pub async fn run(args: BenchWorkerArgs) -> anyhow::Result<()> {
    let bench = crate::server::BenchServer::start(|_| {}).await?;
    let (url, scratch) = (bench.url.clone(), bench.scratch().to_path_buf());
    let mut worker_config = worker::WorkerConfig::new(url.clone());
    worker_config.name = "bench".into();
    worker_config.max_jobs = Some(args.max_jobs);
    worker_config.work_dir = scratch.as_path().join("work");
    let (stop_worker, worker_stop) = tokio::sync::mpsc::unbounded_channel();
    let inventory: Arc<dyn worker::GpuInventory> = Arc::new(worker::inventory::NoGpus);
    let worker = tokio::spawn(worker::run(worker_config, inventory, worker_stop));
    let client = Client::new(&url)?;
    println!("worker benchmark on {} cores, server and worker at {url}", crate::queue::num_cpus());

    // (a) throughput
    let outer = (args.jobs / 1000).max(1);
    let inner = args.jobs.min(1000);
    let axis = |n: u64| (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(", ");
    let yaml = format!(
        "name: throughput\ncommand: \"true\"\nresources: {{gpus: 0}}\ngrid:\n  a: [{}]\n  b: [{}]\n",
        axis(outer),
        axis(inner)
    );
    let started = Instant::now();
    let count = client.submit(&yaml, &SubmitQuery::default()).await?.count;
    loop {
        let counts = client.sweep("throughput").await?.info.counts;
        if counts.succeeded + counts.failed + counts.cancelled >= count {
            anyhow::ensure!(counts.failed == 0, "{} jobs of `true` failed", counts.failed);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ours = count as f64 / started.elapsed().as_secs_f64();
    println!(
        "(a) {count} jobs of `true`, --max-jobs {}: {:.1} s, {ours:.0} jobs/s",
        args.max_jobs,
        started.elapsed().as_secs_f64()
    );
    match parallel_rate(count, args.max_jobs) {
        Ok(theirs) => println!(
            "(a) GNU parallel -j{} true over {count} inputs: {theirs:.0} jobs/s; app runs at {:.0}% of parallel's rate",
            args.max_jobs,
            100.0 * ours / theirs
        ),
        Err(error) => println!("(a) GNU parallel not measured: {error:#} (apt-get install parallel)"),
    }

    // (b) dispatch latency, idle worker
    let marks = scratch.as_path().join("marks");
    std::fs::create_dir_all(&marks)?;
    let mut latencies = Vec::new();
    for sample in 0..args.samples {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mark = marks.join(sample.to_string());
        let yaml =
            format!("name: latency-{sample}\ncommand: \"date +%s%N > {}\"\nresources: {{gpus: 0}}\n", mark.display());
        let submitted = now_ns();
        client.submit(&yaml, &SubmitQuery::default()).await?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let started: u128 = loop {
            if let Some(value) = std::fs::read_to_string(&mark).ok().and_then(|text| text.trim().parse().ok()) {
                break value;
            }
            anyhow::ensure!(Instant::now() < deadline, "sample {sample}: the job did not start within 10 s");
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        latencies.push(started.saturating_sub(submitted) as f64 / 1e6);
    }
    latencies.sort_by(f64::total_cmp);
    println!(
        "(b) idle worker, submit to process started, {} samples: p50 {:.1} ms, p99 {:.1} ms",
        latencies.len(),
        crate::queue::percentile(&latencies, 0.5),
        crate::queue::percentile(&latencies, 0.99)
    );
    let _ = stop_worker.send(());
    worker.await??;

    // (c) an idle worker process
    match idle_usage(&url, scratch.as_path(), Duration::from_secs(args.idle_secs)).await {
        Ok((cpu, rss)) => println!(
            "(c) idle `app --client-only` over {} s: {cpu:.2}% of one core, RSS {:.1} MB",
            args.idle_secs,
            rss as f64 / 1e6
        ),
        Err(error) => println!("(c) idle worker not measured: {error:#}"),
    }
    bench.stop().await?;
    Ok(())
}

fn parallel_rate(count: u64, jobs: u32) -> anyhow::Result<f64> {
    use std::io::Write;
    let started = Instant::now();
    let mut child = std::process::Command::new("parallel")
        .args([format!("-j{jobs}"), "true".to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting `parallel`")?;
    let mut input = child.stdin.take().context("parallel's stdin")?;
    for i in 0..count {
        writeln!(input, "{i}")?;
    }
    drop(input);
    anyhow::ensure!(child.wait()?.success(), "parallel failed");
    Ok(count as f64 / started.elapsed().as_secs_f64())
}

/// CPU share and resident memory of an idle worker process, from /proc.
async fn idle_usage(url: &str, scratch: &std::path::Path, watch: Duration) -> anyhow::Result<(f64, u64)> {
    let mut child = tokio::process::Command::new(crate::app_binary()?)
        .args(["--client-only", "--url", url, "--name", "idle", "--work-dir"])
        .arg(scratch.join("idle-work"))
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().context("the worker's pid")?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = cpu_ticks(pid)?;
    let clock = Instant::now();
    tokio::time::sleep(watch).await;
    let ticks = cpu_ticks(pid)? - before;
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))?
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.split_whitespace().next()?.parse::<u64>().ok())
        .context("VmRSS")?
        * 1024;
    let _ = child.kill().await;
    // Linux reports CPU time in clock ticks of 1/100 s.
    let cpu = ticks as f64 / 100.0 / clock.elapsed().as_secs_f64() * 100.0;
    Ok((cpu, rss))
}

/// CPU time (user and system, every thread) process `pid` has used, in clock ticks of 1/100 s.
pub(super) fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat.rsplit_once(')').context("stat")?.1.split_whitespace().collect();
    // utime and stime are fields 14 and 15; after the command name they are at 11 and 12.
    Ok(fields[11].parse::<u64>()? + fields[12].parse::<u64>()?)
}
