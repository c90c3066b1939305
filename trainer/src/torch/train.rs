//! `app train` in one process (alone, or as one rank of a data-parallel run): the epoch loop,
//! evaluation, metrics, checkpoints, early stopping and resume.
//!
//! Outputs, written by rank 0 only: `config.json` (the resolved config), `training.log`,
//! `training_history.json` (one object per epoch), `model_best.pt` (+ `model_best.json`: the
//! epoch and metric it was chosen at) and `model_epoch_XXX.pt` every `checkpoint_every`
//! epochs (+ `.json`). Each epoch's metrics are also appended to the metrics file as a JSON
//! line (the worker ships `APP_METRICS_FILE`). Every rank runs the same collectives in the
//! same order (evaluation all-reduces), so their decisions (early stopping) agree.

use super::checkpoint::{self, CheckpointInfo};
use super::data::{self, Data};
use super::device::{self, Placement};
use super::ffi::ddp::ProcessGroup;
use super::loader::{Loader, LoaderOptions};
use super::saver::{Saver, Target};
use super::step::{Ddp, Engine, Evaluation};
use super::{io_error, TrainError};
use crate::batches::{check_step_rows, min_rows_per_step};
use crate::config::{Task, TrainConfig};
use crate::early::{EarlyStopping, Verdict};
use crate::ranks::RankInfo;
use crate::schedule::{learning_rate, Progress};
use serde_json::{json, Map, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tch::{Device, Kind, Tensor};

/// Where a run writes.
pub struct Outputs {
    pub dir: PathBuf,
    pub metrics_file: Option<PathBuf>,
    /// Also print the log lines to stdout.
    pub echo: bool,
}

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct Summary {
    pub epochs: usize,
    pub best_metric: String,
    pub best_value: Option<f64>,
    pub best_epoch: Option<usize>,
    pub history: Vec<Map<String, Value>>,
    pub devices: String,
    pub stopped_early: bool,
}

/// Trains alone (`rank: None`) or as one rank of a data-parallel run.
pub fn train(config: &TrainConfig, outputs: &Outputs, rank: Option<&RankInfo>) -> Result<Summary, TrainError> {
    if rank.is_some() {
        super::launch::die_with_launcher()?;
    }
    let placement = device::resolve(config, rank.map(|rank| rank.local_rank))?;
    let threads = device::set_threads(config, rank.map_or(1, |rank| rank.local_world));
    let main = rank.is_none_or(RankInfo::is_main);
    let mut log = RunLog::open(outputs, main)?;
    if main {
        write_json(&outputs.dir.join("config.json"), &serde_json::to_value(config).unwrap_or_default())?;
    }
    let (world, ranks_text) = match rank {
        Some(rank) => {
            let backend = if placement.cuda() { "NCCL" } else { "Gloo" };
            (rank.world, format!(", {} ranks over {backend} (this is rank {})", rank.world, rank.rank))
        }
        None => (1, String::new()),
    };
    log.line(&format!(
        "device {}, amp {}, tf32 {}, {threads} intra-op threads{ranks_text}",
        placement.describe(),
        config.amp.name(),
        if config.tf32 && placement.cuda() { "on" } else { "off" },
    ))?;
    check_step_rows(config.batch_size, world, config.grad_accum, config.model.batch_norm)?;

    let data = data::load(&config.data, config.seed)?;
    log.line(&format!(
        "data: {} train / {} val samples, sample shape {:?}, {}",
        data.train.len(),
        data.val.len(),
        data.sample_shape,
        match data.task {
            Task::Classification => format!("{} classes", data.outputs),
            Task::Regression => "regression".to_string(),
        }
    ))?;
    let data = place_data(data, config, &placement, &mut log)?;
    let mut engine = Engine::new(config, &data, placement.device)?;
    let metric = config.early_stopping.metric.clone();
    let mut stopping = EarlyStopping::new(&metric, config.early_stopping.patience, config.early_stopping.min_delta);
    let (mut first_epoch, mut step) = (1, 0);
    let mut history = Vec::new();
    let checkpoint_dir = crate::resume::checkpoint_dir();
    if let Some(path) = &crate::resume::resume_from(config.resume.as_deref(), checkpoint_dir.as_deref()) {
        if let Some(info) = checkpoint::resume(&mut engine, path)? {
            first_epoch = info.epoch + 1;
            step = info.step;
            stopping = stopping.with_best(info.best_value);
            if let (Some(scaler), Some(scale)) = (engine.scaler.as_mut(), info.loss_scale) {
                *scaler = crate::scaler::LossScaler::new(&crate::config::LossScaleConfig {
                    init: scale,
                    ..config.loss_scale.clone()
                });
            }
            history = read_history(&outputs.dir);
            history.retain(|entry: &Map<String, Value>| {
                entry.get("epoch").and_then(Value::as_u64).is_some_and(|epoch| (epoch as usize) < first_epoch)
            });
        }
        log.line(&format!("resumed from {} at epoch {first_epoch}", path.display()))?;
    }
    if let Some(rank) = rank {
        let timeout = Duration::from_secs(config.ddp_timeout);
        let group = ProcessGroup::join(
            &rank.master_addr,
            rank.master_port,
            rank.rank,
            rank.world,
            placement.cuda_index(),
            timeout,
        )
        .map_err(|error| TrainError::Ddp(format!("joining {}:{}: {error}", rank.master_addr, rank.master_port)))?;
        engine.join(Ddp { group, rank: rank.rank, world: rank.world }, config.ddp_bucket_mb)?;
    }

    let (rank_index, _) = engine.ranks();
    let options = LoaderOptions {
        batch_size: config.batch_size,
        threads: config.data.loader_threads,
        prefetch: config.data.prefetch,
        device: placement.device,
        pin_memory: config.data.pin_memory,
        rank: rank_index,
        ranks: world,
        min_step_rows: min_rows_per_step(world, config.grad_accum, config.model.batch_norm),
    };
    let steps_per_epoch =
        crate::batches::epoch_batches(data.train.len(), config.batch_size, options.min_step_rows)?.len();
    let total_steps = steps_per_epoch * config.epochs;
    let mut best_epoch = None;
    let mut saver = Saver::default();
    let mut stopped_early = false;
    let mut last_epoch = first_epoch.saturating_sub(1);
    for epoch in first_epoch..=config.epochs {
        // The same seed on every rank: they agree on the order and take their own shares.
        tch::manual_seed(config.seed as i64 + epoch as i64);
        last_epoch = epoch;
        reset_peak_memory(&placement);
        let started = Instant::now();
        let mut loss_sum = Tensor::zeros([], (Kind::Float, placement.device));
        let mut lr = config.optimizer.lr;
        let (mut seen, mut skipped) = (0usize, 0usize);
        for batch in Loader::shuffled(&data.train, options)? {
            lr = learning_rate(&config.schedule, config.optimizer.lr, Progress { step, steps_per_epoch, total_steps });
            engine.set_lr(lr);
            let result = engine.step(&batch)?;
            loss_sum += result.loss_sum;
            seen += batch.len();
            skipped += usize::from(!result.applied);
            step += 1;
        }
        let totals =
            Tensor::stack(&[loss_sum.to_kind(Kind::Double), Tensor::from(seen as f64).to_device(placement.device)], 0);
        engine.all_reduce_sum(&totals)?;
        device::synchronize(placement.device);
        let train_seconds = started.elapsed().as_secs_f64();
        let seen_everywhere = totals.double_value(&[1]);
        let train_loss = totals.double_value(&[0]) / seen_everywhere.max(1.0);
        let evaluation = if data.val.is_empty() { None } else { Some(engine.evaluate(&data.val, config.batch_size)?) };
        let entry = epoch_metrics(
            epoch,
            train_loss,
            evaluation,
            seen_everywhere / train_seconds,
            lr,
            &placement,
            &engine,
            skipped,
        );
        let value = entry.get(&metric).and_then(Value::as_f64).unwrap_or(f64::NAN);
        log.line(&describe(&entry))?;
        if main {
            append_metrics(outputs, &entry)?;
        }
        history.push(entry);
        if main {
            write_json(
                &outputs.dir.join("training_history.json"),
                &Value::Array(history.iter().cloned().map(Value::Object).collect()),
            )?;
        }

        let verdict = stopping.observe(value);
        let info = CheckpointInfo {
            epoch,
            step,
            metric: metric.clone(),
            value: value.is_finite().then_some(value),
            best_value: stopping.best(),
            loss_scale: engine.scaler.as_ref().map(crate::scaler::LossScaler::scale),
        };
        let extension = config.checkpoint_format.extension();
        let mut targets = Vec::new();
        if verdict == Verdict::Improved {
            targets.push(Target::File(outputs.dir.join(format!("model_best.{extension}"))));
            best_epoch = Some(epoch);
        }
        if config.checkpoint_every > 0 && epoch % config.checkpoint_every == 0 {
            targets.push(Target::File(outputs.dir.join(format!("model_epoch_{epoch:03}.{extension}"))));
        }
        if let Some(dir) = &checkpoint_dir {
            targets.push(Target::Latest { dir: dir.clone(), format: config.checkpoint_format });
        }
        if main {
            saver.save(&engine, targets, info)?;
        }
        if verdict == Verdict::Stop {
            log.line(&format!("early stop: no improvement of {metric} for {} epochs", config.early_stopping.patience))?;
            stopped_early = true;
            break;
        }
        if epoch < config.epochs && stop_requested(&engine, &placement)? {
            saver.finish()?;
            let sentence = crate::stop::sentence(epoch, checkpoint_dir.is_some());
            log.line(&sentence)?;
            return Err(TrainError::Stopped(sentence));
        }
    }
    saver.finish()?;
    if let Some(value) = stopping.best() {
        log.line(&format!(
            "best {metric} {value:.6} at epoch {}",
            best_epoch.map_or("(before resume)".into(), |e| e.to_string())
        ))?;
    }
    let devices = match rank {
        Some(rank) if placement.cuda() => format!("{} x {} ranks (NCCL)", placement.short(), rank.world),
        Some(rank) => format!("CPU x {} ranks (Gloo)", rank.world),
        None => placement.short(),
    };
    Ok(Summary {
        epochs: last_epoch,
        best_metric: metric,
        best_value: stopping.best(),
        best_epoch,
        history,
        devices,
        stopped_early,
    })
}

/// Whether SIGTERM asked the run to stop (`crate::stop`): any rank's signal stops them all,
/// after the same epoch (a tiny all-reduce per epoch), or a rank left alone would wait for
/// its peers' next collective until the worker's SIGKILL.
fn stop_requested(engine: &Engine, placement: &Placement) -> Result<bool, TrainError> {
    let flag = Tensor::from_slice(&[f64::from(u8::from(crate::stop::requested()))]).to_device(placement.device);
    engine.all_reduce_sum(&flag)?;
    Ok(flag.double_value(&[0]) > 0.0)
}

/// Moves the dataset to the GPU when asked, or (auto) when it takes under a quarter of the
/// GPU's free memory: batches are then gathered there and nothing is copied per step.
fn place_data(data: Data, config: &TrainConfig, placement: &Placement, log: &mut RunLog) -> Result<Data, TrainError> {
    let Some(index) = placement.cuda_index() else { return Ok(data) };
    let bytes = data.train.bytes() + data.val.bytes();
    let on_device = data::fits_on_device(config.data.on_device, index, bytes);
    let size = crate::bench::format_bytes(bytes);
    if !on_device {
        log.line(&format!("data ({size}) stays on the host: pinned batches, copied on a side stream"))?;
        return Ok(data);
    }
    log.line(&format!("data ({size}) lives on cuda:{index}"))?;
    let device = placement.device;
    Ok(Data { train: data.train.to_device(device), val: data.val.to_device(device), ..data })
}

#[allow(clippy::too_many_arguments)]
fn epoch_metrics(
    epoch: usize,
    train_loss: f64,
    evaluation: Option<Evaluation>,
    samples_per_s: f64,
    lr: f64,
    placement: &Placement,
    engine: &Engine,
    skipped: usize,
) -> Map<String, Value> {
    let mut entry = Map::new();
    entry.insert("step".into(), json!(epoch));
    entry.insert("epoch".into(), json!(epoch));
    entry.insert("train_loss".into(), json!(train_loss));
    if let Some(evaluation) = evaluation {
        entry.insert("val_loss".into(), json!(evaluation.loss));
        if let Some(accuracy) = evaluation.accuracy {
            entry.insert("val_accuracy".into(), json!(accuracy));
        }
        if let Some(mae) = evaluation.mae {
            entry.insert("val_mae".into(), json!(mae));
        }
    }
    entry.insert("samples_per_s".into(), json!(samples_per_s));
    entry.insert("lr".into(), json!(lr));
    if let Some(bytes) = placement.cuda_index().and_then(super::ffi::cuda_peak_allocated) {
        entry.insert("gpu_mem".into(), json!(bytes));
    }
    if let Some(scaler) = &engine.scaler {
        entry.insert("loss_scale".into(), json!(scaler.scale()));
        entry.insert("skipped_steps".into(), json!(skipped));
    }
    // JSON has no NaN: a diverged run's loss is written as null.
    for value in entry.values_mut() {
        if value.as_f64().is_some_and(|number| !number.is_finite()) {
            *value = Value::Null;
        }
    }
    entry
}

fn describe(entry: &Map<String, Value>) -> String {
    let parts: Vec<String> = entry
        .iter()
        .filter(|(key, _)| key.as_str() != "step")
        .map(|(key, value)| match value.as_f64() {
            Some(number) if key == "epoch" || key == "gpu_mem" || key == "skipped_steps" => format!("{key} {number}"),
            Some(number) if key == "samples_per_s" => format!("{key} {number:.0}"),
            Some(number) => format!("{key} {number:.6}"),
            None => format!("{key} {value}"),
        })
        .collect();
    parts.join("  ")
}

fn reset_peak_memory(placement: &Placement) {
    if let Some(index) = placement.cuda_index() {
        super::ffi::cuda_reset_peak(index);
    }
}

fn read_history(dir: &Path) -> Vec<Map<String, Value>> {
    std::fs::read_to_string(dir.join("training_history.json"))
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default()
}

fn write_json(path: &Path, value: &Value) -> Result<(), TrainError> {
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    std::fs::write(path, text + "\n").map_err(io_error(format!("writing {}", path.display())))
}

fn append_metrics(outputs: &Outputs, entry: &Map<String, Value>) -> Result<(), TrainError> {
    let Some(path) = &outputs.metrics_file else { return Ok(()) };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io_error(format!("opening {}", path.display())))?;
    let line = serde_json::to_string(entry).unwrap_or_default();
    writeln!(file, "{line}").map_err(io_error(format!("writing {}", path.display())))
}

/// training.log, and stdout when asked; nothing on ranks other than 0.
struct RunLog {
    file: Option<std::fs::File>,
    echo: bool,
    path: PathBuf,
}

impl RunLog {
    fn open(outputs: &Outputs, main: bool) -> Result<RunLog, TrainError> {
        let path = outputs.dir.join("training.log");
        if !main {
            return Ok(RunLog { file: None, echo: false, path });
        }
        std::fs::create_dir_all(&outputs.dir).map_err(io_error(format!("creating {}", outputs.dir.display())))?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io_error(format!("opening {}", path.display())))?;
        Ok(RunLog { file: Some(file), echo: outputs.echo, path })
    }

    fn line(&mut self, text: &str) -> Result<(), TrainError> {
        if self.echo {
            println!("{text}");
        }
        match &mut self.file {
            Some(file) => writeln!(file, "{text}").map_err(io_error(format!("writing {}", self.path.display()))),
            None => Ok(()),
        }
    }
}

/// Loads a checkpoint into a fresh model and evaluates it on the run's validation split
/// (what `model_best.pt` promised), on one device.
pub fn evaluate_checkpoint(config: &TrainConfig, path: &Path) -> Result<Evaluation, TrainError> {
    let placement = device::resolve(config, None)?;
    let data: Data = data::load(&config.data, config.seed)?;
    let mut engine = Engine::new(config, &data, placement.device)?;
    checkpoint::resume(&mut engine, path)?;
    let val = if placement.device == Device::Cpu { data.val } else { data.val.to_device(placement.device) };
    engine.evaluate(&val, config.batch_size)
}
