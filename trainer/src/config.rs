//! The trainer's config: a YAML file (or the `train:` mapping of a sweep file), then
//! `--set key=value` overrides, then validation. Every error names the key it is about.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A config mistake, shown as one line: `at optimizer.name: unknown variant ...`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("at {key}: {message}")]
pub struct ConfigError {
    pub key: String,
    pub message: String,
}

pub fn config_error(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError { key: key.into(), message: message.into() }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Seeds the weights, the synthetic data, the shuffling and dropout.
    pub seed: u64,
    pub data: DataConfig,
    pub model: ModelConfig,
    pub optimizer: OptimizerConfig,
    pub schedule: ScheduleConfig,
    /// Samples per optimizer step (split across the ranks; with `grad_accum` > 1 each
    /// rank's share is cut into `grad_accum` micro-batches).
    pub batch_size: usize,
    pub epochs: usize,
    /// Clip the global L2 norm of the gradients to this; 0 turns clipping off.
    pub grad_clip: f64,
    /// Micro-batches whose gradients are summed before one optimizer step.
    pub grad_accum: usize,
    pub amp: Amp,
    pub loss_scale: LossScaleConfig,
    /// TF32 tensor cores for fp32 matmuls and convolutions on CUDA (no effect on a CPU).
    pub tf32: bool,
    /// `auto` (CUDA when there is a GPU), `cpu`, `cuda` or `cuda:N`.
    pub device: String,
    /// Data-parallel ranks (one process each, gradients all-reduced over c10d): 0 means one
    /// per visible GPU (one on a CPU). `replicas` is the old name.
    #[serde(alias = "replicas")]
    pub ddp: usize,
    /// Seconds a rank waits for the others in a collective before giving up.
    pub ddp_timeout: u64,
    /// Gradient bucket size of the all-reduce, in MiB (PyTorch's DDP default is 25).
    pub ddp_bucket_mb: usize,
    /// Intra-op threads of libtorch; 0 means the job's share of the cores (the CPUs this
    /// process may run on, divided among the ranks on this machine), or `OMP_NUM_THREADS`.
    pub threads: usize,
    pub early_stopping: EarlyStoppingConfig,
    /// Save `model_epoch_XXX.pt` every this many epochs; 0 never.
    pub checkpoint_every: usize,
    /// The weights' file format: `pt` (torch.save's format, loaded by `torch.load`) or
    /// `safetensors`.
    pub checkpoint_format: CheckpointFormat,
    /// A checkpoint (`.pt` or `.safetensors` state dict, ours or PyTorch's) to continue from.
    pub resume: Option<PathBuf>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            seed: 0,
            data: DataConfig::default(),
            model: ModelConfig::default(),
            optimizer: OptimizerConfig::default(),
            schedule: ScheduleConfig::default(),
            batch_size: 256,
            epochs: 10,
            grad_clip: 0.0,
            grad_accum: 1,
            amp: Amp::Off,
            loss_scale: LossScaleConfig::default(),
            tf32: false,
            device: "auto".into(),
            ddp: 0,
            ddp_timeout: 600,
            ddp_bucket_mb: 25,
            threads: 0,
            early_stopping: EarlyStoppingConfig::default(),
            checkpoint_every: 0,
            checkpoint_format: CheckpointFormat::Pt,
            resume: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckpointFormat {
    Pt,
    Safetensors,
}

impl CheckpointFormat {
    pub fn extension(self) -> &'static str {
        match self {
            CheckpointFormat::Pt => "pt",
            CheckpointFormat::Safetensors => "safetensors",
        }
    }
}

/// Where the dataset lives while training on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnDevice {
    /// On the GPU when it takes under a quarter of the GPU's memory.
    Auto,
    Always,
    Never,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataSource {
    Synthetic,
    Csv,
    Npy,
    Safetensors,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    Classification,
    Regression,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    pub source: DataSource,
    /// csv: the file; npy: the features file; safetensors: the file with both tensors.
    pub path: Option<PathBuf>,
    /// npy: the labels file.
    pub labels: Option<PathBuf>,
    /// csv: the label column; safetensors: the labels tensor's name.
    pub label: String,
    /// csv: the feature columns (default: every column but the label); safetensors: unused.
    pub feature_columns: Option<Vec<String>>,
    /// safetensors: the features tensor's name.
    pub features_key: String,
    pub task: Task,
    /// synthetic: rows, features per row, classes, label noise (fraction flipped / noise std).
    pub samples: usize,
    pub features: usize,
    pub classes: usize,
    pub noise: f64,
    /// synthetic images `[channels, height, width]` (for the CNN) instead of feature rows.
    pub image: Option<[usize; 3]>,
    pub val_fraction: f64,
    pub split_seed: u64,
    /// Standardise features with the training split's mean and std.
    pub normalize: bool,
    /// Background threads that assemble batches, and how many batches wait ready per thread.
    pub loader_threads: usize,
    pub prefetch: usize,
    /// Pin batches in page-locked host memory (CUDA only) so copies can be non-blocking.
    pub pin_memory: bool,
    /// Keep the whole dataset on the GPU (batches are then gathered there, with no copies).
    pub on_device: OnDevice,
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            source: DataSource::Synthetic,
            path: None,
            labels: None,
            label: "label".into(),
            feature_columns: None,
            features_key: "x".into(),
            task: Task::Classification,
            samples: 8192,
            features: 32,
            classes: 2,
            noise: 0.0,
            image: None,
            val_fraction: 0.2,
            split_seed: 0,
            normalize: true,
            loader_threads: 2,
            prefetch: 4,
            pin_memory: true,
            on_device: OnDevice::Auto,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelName {
    Mlp,
    Cnn,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    Relu,
    Gelu,
    Tanh,
    Silu,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    pub name: ModelName,
    /// MLP hidden layer widths; for the CNN, the widths of the head after the convolutions.
    pub hidden_dims: Vec<usize>,
    pub activation: Activation,
    pub dropout: f64,
    pub batch_norm: bool,
    /// CNN: output channels of each 3x3 convolution block (each followed by 2x2 max pooling).
    pub channels: Vec<usize>,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            name: ModelName::Mlp,
            hidden_dims: vec![256, 128],
            activation: Activation::Relu,
            dropout: 0.0,
            batch_norm: false,
            channels: vec![16, 32],
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerName {
    Sgd,
    Adam,
    Adamw,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimizerConfig {
    pub name: OptimizerName,
    pub lr: f64,
    /// SGD only.
    pub momentum: f64,
    pub nesterov: bool,
    pub weight_decay: f64,
    /// Adam and AdamW.
    pub betas: [f64; 2],
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        OptimizerConfig {
            name: OptimizerName::Adam,
            lr: 1e-3,
            momentum: 0.9,
            nesterov: false,
            weight_decay: 0.0,
            betas: [0.9, 0.999],
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScheduleName {
    Constant,
    Cosine,
    Step,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScheduleConfig {
    pub name: ScheduleName,
    /// Optimizer steps of linear warm-up from lr/warmup_steps to lr.
    pub warmup_steps: usize,
    /// `step`: multiply by `gamma` every `step_size` epochs.
    pub step_size: usize,
    pub gamma: f64,
    /// `cosine`: the rate it decays to at the last step.
    pub min_lr: f64,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig { name: ScheduleName::Constant, warmup_steps: 0, step_size: 10, gamma: 0.1, min_lr: 0.0 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Amp {
    Off,
    Bf16,
    Fp16,
}

impl Amp {
    pub fn name(self) -> &'static str {
        match self {
            Amp::Off => "off",
            Amp::Bf16 => "bf16",
            Amp::Fp16 => "fp16",
        }
    }

    pub fn parse(text: &str) -> Result<Amp, ConfigError> {
        match text.trim() {
            "off" | "fp32" | "none" => Ok(Amp::Off),
            "bf16" => Ok(Amp::Bf16),
            "fp16" => Ok(Amp::Fp16),
            other => Err(config_error("amp", format!("unknown value `{other}`, expected `bf16`, `fp16` or `off`"))),
        }
    }
}

/// Dynamic loss scaling for `amp: fp16` (see `scaler`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LossScaleConfig {
    pub init: f64,
    pub growth_factor: f64,
    pub backoff_factor: f64,
    /// Clean steps in a row before the scale grows.
    pub growth_interval: u32,
}

impl Default for LossScaleConfig {
    fn default() -> Self {
        LossScaleConfig { init: 65536.0, growth_factor: 2.0, backoff_factor: 0.5, growth_interval: 2000 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EarlyStoppingConfig {
    /// Epochs without improvement before stopping; 0 never stops early.
    pub patience: usize,
    /// The metric watched (and the one `model_best.pt` is chosen by).
    pub metric: String,
    /// An improvement smaller than this does not count.
    pub min_delta: f64,
}

impl Default for EarlyStoppingConfig {
    fn default() -> Self {
        EarlyStoppingConfig { patience: 0, metric: "val_loss".into(), min_delta: 0.0 }
    }
}

/// `auto`, `cpu`, `cuda` or `cuda:N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceChoice {
    Auto,
    Cpu,
    Cuda(Option<usize>),
}

pub fn parse_device(text: &str) -> Result<DeviceChoice, ConfigError> {
    match text {
        "auto" => Ok(DeviceChoice::Auto),
        "cpu" => Ok(DeviceChoice::Cpu),
        "cuda" | "gpu" => Ok(DeviceChoice::Cuda(None)),
        other => other
            .strip_prefix("cuda:")
            .and_then(|index| index.parse().ok())
            .map(|index| DeviceChoice::Cuda(Some(index)))
            .ok_or_else(|| {
                config_error("device", format!("unknown device `{other}`, expected auto, cpu, cuda or cuda:N"))
            }),
    }
}

/// fp16 autocast and loss scaling need CUDA; on a CPU, bf16 is the mixed precision there is.
pub fn check_amp_on_device(amp: Amp, cuda: bool) -> Result<(), ConfigError> {
    if amp == Amp::Fp16 && !cuda {
        return Err(config_error("amp", "fp16 needs a CUDA device; on a CPU use `amp: bf16` or `amp: off`"));
    }
    Ok(())
}

#[path = "config_load.rs"]
mod load;
