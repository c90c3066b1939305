//! `app-bench capture`: what capturing a script's own loggers costs. Prints figures (medians
//! over alternating rounds, each a fresh Python process); asserts nothing.
//!
//! (a) Start-up: `python -c pass` and `python -c 'import wandb'` with the worker's capture
//! directory first on `PYTHONPATH` (as a job gets it) against without, in alternating rounds:
//! with the real package (`--python`, an interpreter that has wandb) and with app's built-in
//! module (`python3`, which has none). (b) The cost of one `wandb.log` of three floats through
//! the built-in module, timed inside Python over many calls. (c) The delay from
//! `SummaryWriter.add_scalar` + `flush()` in a running job to the point being visible through
//! the server's API: the job writes the wall-clock time as the value, the benchmark reads it
//! back every 10 ms (server and worker in this process, as `app` runs them).

use anyhow::Context;
use clap::Args;
use client::Client;
use shared::api::SubmitQuery;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct BenchCaptureArgs {
    /// Alternating rounds of each start-up measurement.
    #[arg(long, default_value_t = 20)]
    pub rounds: u32,
    /// An interpreter with the real `wandb` (and torch with tensorboard, for (c)).
    #[arg(long, default_value = ".venv-torch/bin/python")]
    pub python: PathBuf,
    /// `wandb.log` calls timed in (b).
    #[arg(long, default_value_t = 100_000)]
    pub calls: u32,
    /// Scalars written in (c).
    #[arg(long, default_value_t = 20)]
    pub samples: u32,
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Wall time of one run of `python -c code`, with the capture directory on `PYTHONPATH` or not.
fn once(python: &Path, code: &str, capture: Option<&Path>, metrics: &Path) -> anyhow::Result<f64> {
    let mut command = Command::new(python);
    command.args(["-c", code]).env("APP_METRICS_FILE", metrics).env("APP_PARAMS", "{}").env("WANDB_MODE", "offline");
    command.env_remove("PYTHONPATH");
    if let Some(dir) = capture {
        command.env("PYTHONPATH", dir);
    }
    let started = Instant::now();
    let output = command.output().with_context(|| format!("running {}", python.display()))?;
    let took = started.elapsed().as_secs_f64() * 1e3;
    anyhow::ensure!(output.status.success(), "{code}: {}", String::from_utf8_lossy(&output.stderr));
    Ok(took)
}

/// Medians (ms) of `(without, with)` over alternating rounds.
fn startup(
    python: &Path,
    without: &str,
    with: &str,
    dir: &Path,
    metrics: &Path,
    rounds: u32,
) -> anyhow::Result<(f64, f64)> {
    let (mut plain, mut captured) = (Vec::new(), Vec::new());
    once(python, without, None, metrics)?; // warm the page cache
    for round in 0..rounds {
        if round % 2 == 0 {
            plain.push(once(python, without, None, metrics)?);
            captured.push(once(python, with, Some(dir), metrics)?);
        } else {
            captured.push(once(python, with, Some(dir), metrics)?);
            plain.push(once(python, without, None, metrics)?);
        }
    }
    Ok((median(plain), median(captured)))
}

pub async fn run(args: BenchCaptureArgs) -> anyhow::Result<()> {
    let bench = crate::server::BenchServer::start(|_| {}).await?;
    let scratch = bench.scratch().to_path_buf();
    let dir = worker::collect::python::install(&scratch)?;
    let metrics = scratch.join("metrics.jsonl");
    let system = PathBuf::from("python3");
    println!("capture benchmark, {} rounds each, medians", args.rounds);

    // (a) start-up
    let (plain, captured) = startup(&system, "pass", "pass", &dir, &metrics, args.rounds)?;
    println!("  python3 -c pass: {plain:.1} ms, with capture {captured:.1} ms (+{:.1} ms)", captured - plain);
    let (plain, builtin) = startup(&system, "pass", "import wandb", &dir, &metrics, args.rounds)?;
    println!(
        "  python3 -c 'import wandb' (app's module) {builtin:.1} ms against -c pass without capture {plain:.1} ms (+{:.1} ms)",
        builtin - plain
    );
    let has_wandb =
        Command::new(&args.python).args(["-c", "import wandb"]).output().is_ok_and(|out| out.status.success());
    if has_wandb {
        let (plain, captured) = startup(&args.python, "import wandb", "import wandb", &dir, &metrics, args.rounds)?;
        println!(
            "  {} -c 'import wandb' (the real package): {plain:.1} ms, with capture {captured:.1} ms (+{:.1} ms)",
            args.python.display(),
            captured - plain
        );
    } else {
        println!("  {} has no wandb: the real package's start-up not measured", args.python.display());
    }

    // (b) wandb.log through the built-in module
    let code = format!(
        "import time, wandb\nwandb.init()\nn = {calls}\nt = time.perf_counter()\n\
         for i in range(n):\n    wandb.log({{'loss': 1.0 / (i + 1), 'acc': 0.5, 'lr': 1e-3}})\n\
         print((time.perf_counter() - t) / n * 1e6)\n",
        calls = args.calls
    );
    let mut per_call = Vec::new();
    for _ in 0..3 {
        let _ = std::fs::remove_file(&metrics);
        let output = Command::new(&system)
            .args(["-c", &code])
            .env("PYTHONPATH", &dir)
            .env("APP_METRICS_FILE", &metrics)
            .env("APP_PARAMS", "{}")
            .output()?;
        anyhow::ensure!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        per_call.push(String::from_utf8_lossy(&output.stdout).trim().parse::<f64>()?);
    }
    let lines = std::fs::read_to_string(&metrics).map(|text| text.lines().count()).unwrap_or(0);
    println!(
        "  wandb.log of 3 floats, app's module: {:.2} µs a call (median of 3 runs of {}; {lines} lines written)",
        median(per_call),
        args.calls
    );

    // (c) SummaryWriter -> the server
    if has_wandb {
        let delays = tensorboard_delay(&bench.url, &scratch, &args).await?;
        println!(
            "  SummaryWriter.add_scalar + flush -> visible at the server: p50 {:.0} ms, max {:.0} ms ({} samples)",
            median(delays.clone()),
            delays.iter().copied().fold(0.0, f64::max),
            delays.len()
        );
    }
    bench.stop().await
}

fn now_secs() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|t| t.as_secs_f64()).unwrap_or(0.0)
}

async fn tensorboard_delay(url: &str, scratch: &Path, args: &BenchCaptureArgs) -> anyhow::Result<Vec<f64>> {
    let mut config = worker::WorkerConfig::new(url.to_string());
    config.name = "bench".into();
    config.max_jobs = Some(1);
    config.work_dir = scratch.join("work");
    let (stop_worker, worker_stop) = tokio::sync::mpsc::unbounded_channel();
    let inventory: Arc<dyn worker::GpuInventory> = Arc::new(worker::inventory::NoGpus);
    let worker = tokio::spawn(worker::run(config, inventory, worker_stop));
    let script = scratch.join("tb.py");
    // Steps 0.5 s apart, each value the time of its flush since `base` (seconds: a float32
    // holds them to microseconds, where it would hold a Unix time to minutes).
    let base = now_secs().floor();
    std::fs::write(
        &script,
        format!(
            "import time\nfrom torch.utils.tensorboard import SummaryWriter\nw = SummaryWriter()\ntime.sleep(2)\n\
             for i in range({}):\n    w.add_scalar('flushed_at', time.time() - {base}, i)\n    w.flush()\n    time.sleep(0.5)\nw.close()\n",
            args.samples
        ),
    )?;
    // Absolute, not canonical: a venv's python is a symlink, and only its own path is the venv.
    let python = std::path::absolute(&args.python)?;
    let yaml = format!("name: tb-delay\ncommand: {} {}\ngrid: {{i: [1]}}\n", python.display(), script.display());
    let client = Client::new(url)?;
    client.submit(&yaml, &SubmitQuery::default()).await?;
    let job = loop {
        let query = shared::api::JobQuery { sweep: Some("tb-delay".into()), ..Default::default() };
        if let Some(job) = client.jobs(&query).await?.jobs.into_iter().next() {
            break job;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut delays: Vec<f64> = Vec::new();
    let mut seen = 0;
    let deadline = Instant::now() + Duration::from_secs(60 + u64::from(args.samples));
    while Instant::now() < deadline {
        // Every point, so that two arriving in one shipment are both timed.
        let series = client.metrics(job.id).await?;
        let now = now_secs() - base;
        if let Some(flushed) = series.iter().find(|series| series.name == "flushed_at") {
            delays.extend(flushed.values.iter().skip(seen).map(|value| (now - value) * 1e3));
            seen = seen.max(flushed.values.len());
        }
        if seen >= args.samples as usize {
            break;
        }
        let job = client.job(job.id).await?;
        anyhow::ensure!(
            !job.status.is_terminal() || series.iter().any(|series| series.name == "flushed_at"),
            "the SummaryWriter job ended ({:?}) with no point",
            job.status
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = stop_worker.send(());
    let _ = worker.await;
    Ok(delays)
}
