//! `app bench --config train.yaml --batch-sizes 256,1024 --amp fp32,tf32,bf16 --steps 20 [--json]`:
//! per setting, the median time of each phase of a training step, throughput, model TFLOP/s
//! (and MFU against `--peak-tflops`), peak memory and utilisation; OOM settings are marked and
//! skipped; then the recommended setting. `--auto-batch-size` finds the largest batch that fits
//! instead.

use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The trainer's YAML config (e.g. configs/train-mlp.yaml); without it, the defaults.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Batch sizes to try (default: the config's).
    #[arg(long, value_delimiter = ',')]
    pub batch_sizes: Vec<usize>,
    /// Precisions to try: fp32 (or off), tf32 (fp32 with TF32 matmuls, CUDA), bf16, fp16 (CUDA).
    #[arg(long, value_delimiter = ',', default_value = "fp32")]
    pub amp: Vec<String>,
    /// The device's peak dense TFLOP/s for the MFU column (e.g. 790 for bf16 on an H100).
    #[arg(long)]
    pub peak_tflops: Option<f64>,
    /// Measured steps per setting (after the warm-up).
    #[arg(long, default_value_t = 20)]
    pub steps: usize,
    /// Warm-up steps per setting, not measured.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Treat a setting whose peak memory passes this as out of memory, e.g. `8GiB`.
    #[arg(long)]
    pub memory_limit: Option<String>,
    /// The recommendation keeps peak memory under this fraction of the capacity.
    #[arg(long, default_value_t = 0.9)]
    pub safety: f64,
    /// Find the largest batch size that fits (doubling, then binary search) for each --amp.
    #[arg(long)]
    pub auto_batch_size: bool,
    /// The largest batch --auto-batch-size tries.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_batch_size: usize,
    /// Override a config key, e.g. `--set model.hidden_dims=[4096,4096]`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[cfg(not(feature = "torch"))]
pub async fn run(_args: BenchArgs, _config: Option<PathBuf>) -> anyhow::Result<()> {
    anyhow::bail!(trainer::NOT_BUILT)
}

#[cfg(feature = "torch")]
pub async fn run(args: BenchArgs, config: Option<PathBuf>) -> anyhow::Result<()> {
    use trainer::bench::{format_bytes, recommend, BenchRow, Precision};
    use trainer::torch::bench::{Bench, BenchOptions};

    let settings = trainer::TrainConfig::load(config.as_deref(), &args.set)?;
    let amps = args.amp.iter().map(|text| Precision::parse(text)).collect::<Result<Vec<_>, _>>()?;
    if args.peak_tflops.is_some_and(|peak| !(peak > 0.0 && peak.is_finite())) {
        anyhow::bail!("at --peak-tflops: must be a positive number");
    }
    if args.batch_sizes.contains(&0) {
        anyhow::bail!("at --batch-sizes: every batch size must be at least 1");
    }
    if args.steps == 0 {
        anyhow::bail!("at --steps: must be at least 1");
    }
    if !(args.safety > 0.0 && args.safety <= 1.0) {
        anyhow::bail!("at --safety: must be in (0, 1]");
    }
    let memory_limit = args
        .memory_limit
        .as_deref()
        .map(shared::size::parse_bytes)
        .transpose()
        .map_err(|error| anyhow::anyhow!("at --memory-limit: {error}"))?;
    let batch_sizes = if args.batch_sizes.is_empty() { vec![settings.batch_size] } else { args.batch_sizes.clone() };
    let options = BenchOptions { steps: args.steps, warmup: args.warmup, memory_limit };
    let (auto, safety, max) = (args.auto_batch_size, args.safety, args.max_batch_size);
    let settings_tf32 = settings.tf32;
    let (machine, rows, found) = super::train::blocking_torch(move || -> anyhow::Result<_> {
        let bench = Bench::new(&settings, options)?;
        let mut rows = Vec::new();
        let mut found = Vec::new();
        for &amp in &amps {
            if auto {
                let (largest, probes) = bench.auto_batch_size(amp, max, safety)?;
                rows.extend(probes);
                found.push((amp, largest));
            } else {
                for &batch_size in &batch_sizes {
                    rows.push(bench.measure(batch_size, amp)?);
                }
            }
        }
        Ok((bench.machine.clone(), rows, found))
    })
    .await??;
    let recommended = recommend(&rows, machine.capacity_bytes, safety);
    let mfu = |row: &BenchRow| Some(row.tflops? / args.peak_tflops?);
    if args.json {
        let value = serde_json::json!({
            "device": machine.placement.describe(),
            "gpu": machine.placement.gpu_name,
            "threads": machine.threads,
            "train_flops_per_sample": machine.flops_per_sample,
            "peak_tflops": args.peak_tflops,
            "mfu": rows.iter().map(mfu).collect::<Vec<_>>(),
            "capacity_bytes": machine.capacity_bytes,
            "rows": rows,
            "recommended": recommended.map(|index| serde_json::json!({"batch_size": rows[index].batch_size, "amp": rows[index].amp})),
            "auto_batch_size": found.iter().map(|(amp, size)| serde_json::json!({"amp": amp.name(), "batch_size": size})).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    let device = match machine.placement.cuda() {
        true => machine.placement.describe(),
        false => format!("{}, {} threads", machine.placement.describe(), machine.threads),
    };
    println!("device: {device}; tf32 on in tf32 rows, {} in the others", if settings_tf32 { "on" } else { "off" });
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED);
    table.set_header([
        "batch",
        "precision",
        "data ms",
        "forward ms",
        "backward ms",
        "optim ms",
        "step ms",
        "samples/s",
        "TFLOP/s",
        "MFU",
        "peak mem",
        "util",
        "",
    ]);
    let ms = |value: f64| if value.is_finite() { format!("{value:.2}") } else { "-".into() };
    for (index, row) in rows.iter().enumerate() {
        let status = match (&row.error, Some(index) == recommended) {
            (Some(error), _) if row.status == trainer::bench::BenchStatus::Unsupported => {
                format!("unsupported: {error}")
            }
            (Some(error), _) => format!("OOM: {error}"),
            (None, true) => "recommended".into(),
            (None, false) => String::new(),
        };
        let samples = if row.samples_per_s > 0.0 { format!("{:.0}", row.samples_per_s) } else { "-".into() };
        table.add_row([
            row.batch_size.to_string(),
            row.amp.clone(),
            ms(row.data_ms),
            ms(row.forward_ms),
            ms(row.backward_ms),
            ms(row.optimizer_ms),
            ms(row.step_ms),
            samples,
            row.tflops
                .filter(|_| row.error.is_none())
                .map(|tflops| format!("{tflops:.2}"))
                .unwrap_or_else(|| "-".into()),
            mfu(row)
                .filter(|_| row.error.is_none())
                .map(|mfu| format!("{:.1}%", mfu * 100.0))
                .unwrap_or_else(|| "-".into()),
            row.peak_memory_bytes.map(format_bytes).unwrap_or_else(|| "-".into()),
            match (row.gpu_utilization, row.cpu_utilization) {
                (Some(util), _) => format!("GPU {util:.0}%"),
                (None, Some(util)) => format!("CPU {util:.0}%"),
                _ => "-".into(),
            },
            status,
        ]);
    }
    println!("{table}");
    for (amp, size) in &found {
        match size {
            Some(size) => println!("largest batch that fits with {}: {size}", amp.name()),
            None => println!("with {} not even a batch of 1 fits", amp.name()),
        }
    }
    match recommended {
        Some(index) => {
            let row: &BenchRow = &rows[index];
            println!(
                "recommended: batch_size {} with {} ({:.0} samples/s, peak memory under {:.0}% of {})",
                row.batch_size,
                row.amp,
                row.samples_per_s,
                safety * 100.0,
                machine.capacity_bytes.map(format_bytes).unwrap_or_else(|| "the device".into())
            );
        }
        None => println!("no setting ran within the memory limits"),
    }
    Ok(())
}
