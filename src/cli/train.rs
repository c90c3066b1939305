//! `app train --config train.yaml [--set key=value ...]`: the built-in trainer (trainer/).
//! Outputs go to `--out`, else `$APP_OUTPUT_DIR` (set for jobs of a `train:` sweep), else
//! `./train-out`; per-epoch metrics to `$APP_METRICS_FILE` when set. With several ranks
//! (`ddp: N`, several GPUs, or a worker's `WORLD_SIZE`) this process launches them as children
//! and each child, finding `RANK` set, trains as one of them.

use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// The trainer's YAML config (e.g. configs/train-mlp.yaml); without it, the defaults.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Override a config key, e.g. `--set optimizer.lr=0.01` (repeatable; wins over the file).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Where the checkpoints, history and log go.
    #[arg(long, env = "APP_OUTPUT_DIR")]
    pub out: Option<PathBuf>,
    /// Append each epoch's metrics here as a JSON line.
    #[arg(long, env = "APP_METRICS_FILE")]
    pub metrics_file: Option<PathBuf>,
}

/// `config` is `args.config`, the trainer's YAML config.
#[cfg(feature = "torch")]
pub async fn run(args: TrainArgs, config: Option<PathBuf>) -> anyhow::Result<()> {
    let settings = trainer::TrainConfig::load(config.as_deref(), &args.set)?;
    let outputs = trainer::torch::train::Outputs {
        dir: args.out.unwrap_or_else(|| PathBuf::from("train-out")),
        metrics_file: args.metrics_file.filter(|path| !path.as_os_str().is_empty()),
        echo: true,
    };
    let dir = outputs.dir.clone();
    // SIGTERM (a preemption, a cancel) lets the epoch under way finish and be saved.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::spawn(async move {
        if terminate.recv().await.is_some() {
            trainer::stop::request();
        }
    });
    let trained = blocking_torch(move || -> Result<_, trainer::torch::TrainError> {
        use trainer::ranks::Role;
        match trainer::torch::role(&settings)? {
            // Rank 0 prints the summary line; the launcher only reports a failed rank.
            Role::Launcher(plan) => trainer::torch::launch::run(&plan).map(|()| None),
            Role::Single => trainer::torch::train::train(&settings, &outputs, None).map(Some),
            Role::Rank(rank) => trainer::torch::train::train(&settings, &outputs, Some(&rank))
                .map(|summary| rank.is_main().then_some(summary)),
        }
    })
    .await?;
    let summary = match trained {
        Err(trainer::torch::TrainError::Stopped(sentence)) => {
            // The saved epoch is on disk (the saver finished): exit as a shell says SIGTERM.
            eprintln!("{sentence}");
            std::process::exit(trainer::stop::EXIT_STATUS);
        }
        other => other?,
    };
    let Some(summary) = summary else { return Ok(()) };
    match (summary.best_value, summary.best_epoch) {
        (Some(value), Some(epoch)) => println!(
            "done: {} epochs on {}, best {} {value:.6} at epoch {epoch}{}; outputs in {}",
            summary.epochs,
            summary.devices,
            summary.best_metric,
            if summary.stopped_early { " (stopped early)" } else { "" },
            dir.display()
        ),
        _ => println!("done: {} epochs on {}; outputs in {}", summary.epochs, summary.devices, dir.display()),
    }
    Ok(())
}

#[cfg(not(feature = "torch"))]
pub async fn run(_args: TrainArgs, _config: Option<PathBuf>) -> anyhow::Result<()> {
    anyhow::bail!(trainer::NOT_BUILT)
}

/// Runs libtorch work off the async runtime; a panic inside tch (it panics on libtorch
/// errors such as running out of memory) becomes a one-line error instead of a backtrace.
#[cfg(feature = "torch")]
pub async fn blocking_torch<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(move || {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        std::panic::set_hook(hook);
        outcome.map_err(|payload| {
            let message = trainer::torch::bench::panic_message(payload.as_ref());
            anyhow::anyhow!("libtorch: {}", trainer::torch::first_line(&message))
        })
    })
    .await?
}
