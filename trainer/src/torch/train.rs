//! `app train`: the epoch loop, evaluation, metrics, checkpoints, early stopping and resume.
//!
//! Outputs in the run's directory: `config.json` (the resolved config), `training.log`,
//! `training_history.json` (one object per epoch), `model_best.pt` (+ `model_best.json`: the
//! epoch and metric it was chosen at) and `model_epoch_XXX.pt` every `checkpoint_every`
//! epochs (+ `.json`). Each epoch's metrics are also appended to the metrics file as a JSON
//! line (the worker ships `APP_METRICS_FILE`).

use super::data::{self, Data};
use super::device::{self, Devices};
use super::loader::{Loader, LoaderOptions};
use super::step::{Engine, Evaluation};
use super::{io_error, TrainError};
use crate::config::{Task, TrainConfig};
use crate::early::{EarlyStopping, Verdict};
use crate::schedule::{learning_rate, Progress};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

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

/// The sidecar of a checkpoint, read back on resume.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointInfo {
    pub epoch: usize,
    pub step: usize,
    pub metric: String,
    pub value: Option<f64>,
    pub best_value: Option<f64>,
    pub loss_scale: Option<f64>,
}

pub fn train(config: &TrainConfig, outputs: &Outputs) -> Result<Summary, TrainError> {
    let devices = device::resolve(config)?;
    if config.threads > 0 {
        tch::set_num_threads(config.threads as i32);
    }
    std::fs::create_dir_all(&outputs.dir).map_err(io_error(format!("creating {}", outputs.dir.display())))?;
    let mut log = RunLog::open(outputs)?;
    write_json(&outputs.dir.join("config.json"), &serde_json::to_value(config).unwrap_or_default())?;
    log.line(&format!(
        "device {}, amp {}, {} intra-op threads",
        devices.describe(),
        config.amp.name(),
        tch::get_num_threads()
    ))?;

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
    let mut engine = Engine::new(config, &data, &devices)?;
    let metric = config.early_stopping.metric.clone();
    let mut stopping = EarlyStopping::new(&metric, config.early_stopping.patience, config.early_stopping.min_delta);
    let (mut first_epoch, mut step) = (1, 0);
    let mut history = Vec::new();
    if let Some(path) = &config.resume {
        let info = resume(&mut engine, path)?;
        if let Some(info) = info {
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

    let options = LoaderOptions {
        batch_size: config.batch_size,
        threads: config.data.loader_threads,
        prefetch: config.data.prefetch,
        pin_for: (config.data.pin_memory && devices.cuda).then(|| devices.master()),
    };
    let steps_per_epoch = data.train.len().div_ceil(config.batch_size);
    let total_steps = steps_per_epoch * config.epochs;
    let mut best_epoch = None;
    let mut stopped_early = false;
    let mut last_epoch = first_epoch.saturating_sub(1);
    tch::manual_seed(config.seed as i64 + first_epoch as i64);
    for epoch in first_epoch..=config.epochs {
        last_epoch = epoch;
        reset_peak_memory(&devices);
        let started = Instant::now();
        let mut loss_sum = tch::Tensor::zeros([], (tch::Kind::Float, engine.master_device()));
        let mut lr = config.optimizer.lr;
        let (mut seen, mut skipped) = (0usize, 0usize);
        for batch in Loader::shuffled(&data.train, options) {
            lr = learning_rate(&config.schedule, config.optimizer.lr, Progress { step, steps_per_epoch, total_steps });
            engine.set_lr(lr);
            let result = engine.step(&batch);
            loss_sum += result.loss * batch.len() as f64;
            seen += batch.len();
            skipped += usize::from(!result.applied);
            step += 1;
        }
        device::synchronize(engine.master_device());
        let train_seconds = started.elapsed().as_secs_f64();
        let train_loss = loss_sum.double_value(&[]) / seen.max(1) as f64;
        let evaluation = (!data.val.is_empty()).then(|| engine.evaluate(&data.val, options));
        let entry =
            epoch_metrics(epoch, train_loss, evaluation, seen as f64 / train_seconds, lr, &devices, &engine, skipped);
        let value = entry.get(&metric).and_then(Value::as_f64).unwrap_or(f64::NAN);
        append_metrics(outputs, &entry)?;
        log.line(&describe(&entry))?;
        history.push(entry);
        write_json(
            &outputs.dir.join("training_history.json"),
            &Value::Array(history.iter().cloned().map(Value::Object).collect()),
        )?;

        let verdict = stopping.observe(value);
        let info = CheckpointInfo {
            epoch,
            step,
            metric: metric.clone(),
            value: value.is_finite().then_some(value),
            best_value: stopping.best(),
            loss_scale: engine.scaler.as_ref().map(crate::scaler::LossScaler::scale),
        };
        if verdict == Verdict::Improved {
            save_checkpoint(&engine, &outputs.dir.join("model_best.pt"), &info)?;
            best_epoch = Some(epoch);
        }
        if config.checkpoint_every > 0 && epoch % config.checkpoint_every == 0 {
            save_checkpoint(&engine, &outputs.dir.join(format!("model_epoch_{epoch:03}.pt")), &info)?;
        }
        if verdict == Verdict::Stop {
            log.line(&format!("early stop: no improvement of {metric} for {} epochs", config.early_stopping.patience))?;
            stopped_early = true;
            break;
        }
    }
    if let Some(value) = stopping.best() {
        log.line(&format!(
            "best {metric} {value:.6} at epoch {}",
            best_epoch.map_or("(before resume)".into(), |e| e.to_string())
        ))?;
    }
    Ok(Summary {
        epochs: last_epoch,
        best_metric: metric,
        best_value: stopping.best(),
        best_epoch,
        history,
        devices: devices.describe(),
        stopped_early,
    })
}

#[allow(clippy::too_many_arguments)]
fn epoch_metrics(
    epoch: usize,
    train_loss: f64,
    evaluation: Option<Evaluation>,
    samples_per_s: f64,
    lr: f64,
    devices: &Devices,
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
    if let Some(bytes) = peak_memory(devices) {
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

fn reset_peak_memory(devices: &Devices) {
    if devices.cuda {
        for device in &devices.replicas {
            if let tch::Device::Cuda(index) = device {
                super::ffi::cuda_reset_peak(*index);
            }
        }
    }
}

/// The largest per-GPU peak of the epoch; none on the CPU.
fn peak_memory(devices: &Devices) -> Option<u64> {
    if !devices.cuda {
        return None;
    }
    devices
        .replicas
        .iter()
        .filter_map(|device| match device {
            tch::Device::Cuda(index) => super::ffi::cuda_peak_allocated(*index),
            _ => None,
        })
        .max()
}

/// Saves the master's weights and the sidecar `.json` beside them.
pub fn save_checkpoint(engine: &Engine, path: &Path, info: &CheckpointInfo) -> Result<(), TrainError> {
    engine.master().vs.save(path)?;
    write_json(&path.with_extension("json"), &serde_json::to_value(info).unwrap_or_default())
}

/// Loads weights into every replica; the sidecar (if there) says where training stopped.
/// (tch's `VarStore::load` expects a Python pickle for `.pt`, while `save` writes a
/// TorchScript archive, so the tensors are loaded by name here.)
pub fn resume(engine: &mut Engine, path: &Path) -> Result<Option<CheckpointInfo>, TrainError> {
    let bad = |error: String| TrainError::Config(crate::config::config_error("resume", error));
    let loading =
        |error: tch::TchError| bad(format!("loading {}: {}", path.display(), super::first_line(&error.to_string())));
    for replica in &mut engine.replicas {
        let saved: std::collections::HashMap<String, tch::Tensor> =
            tch::Tensor::load_multi_with_device(path, replica.device).map_err(loading)?.into_iter().collect();
        for (name, mut variable) in replica.vs.variables() {
            let source = saved
                .get(&name)
                .ok_or_else(|| bad(format!("{} has no tensor `{name}`: a different model?", path.display())))?;
            if source.size() != variable.size() {
                return Err(bad(format!(
                    "`{name}` in {} has shape {:?}, the model {:?}",
                    path.display(),
                    source.size(),
                    variable.size()
                )));
            }
            tch::no_grad(|| variable.f_copy_(source)).map_err(loading)?;
        }
    }
    let sidecar = path.with_extension("json");
    match std::fs::read_to_string(&sidecar) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|error| bad(format!("reading {}: {error}", sidecar.display()))),
        Err(_) => Ok(None),
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

/// training.log, and stdout when asked.
struct RunLog {
    file: std::fs::File,
    echo: bool,
    path: PathBuf,
}

impl RunLog {
    fn open(outputs: &Outputs) -> Result<RunLog, TrainError> {
        let path = outputs.dir.join("training.log");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io_error(format!("opening {}", path.display())))?;
        Ok(RunLog { file, echo: outputs.echo, path })
    }

    fn line(&mut self, text: &str) -> Result<(), TrainError> {
        if self.echo {
            println!("{text}");
        }
        writeln!(self.file, "{text}").map_err(io_error(format!("writing {}", self.path.display())))
    }
}

/// Loads a checkpoint into a fresh model and evaluates it on the run's validation split
/// (what `model_best.pt` promised).
pub fn evaluate_checkpoint(config: &TrainConfig, path: &Path) -> Result<Evaluation, TrainError> {
    let devices = device::resolve(config)?;
    let data: Data = data::load(&config.data, config.seed)?;
    let single = Devices { replicas: vec![devices.master()], cuda: devices.cuda };
    let mut engine = Engine::new(config, &data, &single)?;
    resume(&mut engine, path)?;
    let options = LoaderOptions { batch_size: config.batch_size, threads: 1, prefetch: 2, pin_for: None };
    Ok(engine.evaluate(&data.val, options))
}
