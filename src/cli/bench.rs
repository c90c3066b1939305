//! `app bench --config train.yaml --batch-sizes 256,1024 --amp bf16,off --steps 20 [--json]`:
//! per setting, the median time of each phase of a training step, throughput, peak memory and
//! GPU utilisation; OOM settings are marked and skipped; then the recommended setting.
//! `--auto-batch-size` finds the largest batch that fits instead.

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
    /// Mixed-precision settings to try: bf16, fp16, off.
    #[arg(long, value_delimiter = ',', default_value = "off")]
    pub amp: Vec<String>,
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
    use trainer::bench::{format_bytes, recommend, BenchRow};
    use trainer::config::Amp;
    use trainer::torch::bench::{Bench, BenchOptions};

    let settings = trainer::TrainConfig::load(config.as_deref(), &args.set)?;
    let amps = args.amp.iter().map(|text| Amp::parse(text)).collect::<Result<Vec<_>, _>>()?;
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
    if args.json {
        let value = serde_json::json!({
            "device": machine.devices.describe(),
            "gpu": machine.gpu_name,
            "threads": machine.threads,
            "capacity_bytes": machine.capacity_bytes,
            "rows": rows,
            "recommended": recommended.map(|index| serde_json::json!({"batch_size": rows[index].batch_size, "amp": rows[index].amp})),
            "auto_batch_size": found.iter().map(|(amp, size)| serde_json::json!({"amp": amp.name(), "batch_size": size})).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    let device = match &machine.gpu_name {
        Some(name) => format!("{} ({name})", machine.devices.describe()),
        None => format!("{}, {} threads", machine.devices.describe(), machine.threads),
    };
    println!("device: {device}");
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED);
    table.set_header([
        "batch",
        "amp",
        "data ms",
        "forward ms",
        "backward ms",
        "optim ms",
        "step ms",
        "samples/s",
        "peak mem",
        "GPU util",
        "",
    ]);
    let ms = |value: f64| if value.is_finite() { format!("{value:.2}") } else { "-".into() };
    for (index, row) in rows.iter().enumerate() {
        let status = match (&row.error, Some(index) == recommended) {
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
            row.peak_memory_bytes.map(format_bytes).unwrap_or_else(|| "-".into()),
            row.gpu_utilization.map(|util| format!("{util:.0}%")).unwrap_or_else(|| "-".into()),
            status,
        ]);
    }
    println!("{table}");
    for (amp, size) in &found {
        match size {
            Some(size) => println!("largest batch that fits with amp {}: {size}", amp.name()),
            None => println!("with amp {} not even a batch of 1 fits", amp.name()),
        }
    }
    match recommended {
        Some(index) => {
            let row: &BenchRow = &rows[index];
            println!(
                "recommended: batch_size {} with amp {} ({:.0} samples/s, peak memory under {:.0}% of {})",
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
