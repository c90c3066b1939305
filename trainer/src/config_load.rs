//! Reading a trainer config: the document, `--set key=value` overrides, then validation.

use super::*;
use serde_norway::{Mapping, Value};

const METRICS: [&str; 4] = ["val_loss", "val_accuracy", "val_mae", "train_loss"];

impl TrainConfig {
    /// The file (if any), then each `key=value` override in order, then validation.
    pub fn load(path: Option<&Path>, overrides: &[String]) -> Result<TrainConfig, ConfigError> {
        let mut document = match path {
            Some(path) => read_document(path)?,
            None => Mapping::new(),
        };
        for item in overrides {
            apply_override(&mut document, item)?;
        }
        let config = from_document(document)?;
        config.validate()?;
        Ok(config)
    }

    /// Parses YAML text (a trainer config, or a sweep file with `train:`) without overrides.
    pub fn from_yaml(text: &str) -> Result<TrainConfig, ConfigError> {
        let config = from_document(parse_document(text)?)?;
        config.validate()?;
        Ok(config)
    }

    /// Checks what the types cannot: ranges, required paths, combinations.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive = |value: usize, key: &str| {
            if value == 0 {
                Err(config_error(key, "must be at least 1"))
            } else {
                Ok(())
            }
        };
        positive(self.batch_size, "batch_size")?;
        positive(self.epochs, "epochs")?;
        positive(self.grad_accum, "grad_accum")?;
        if self.batch_size < self.grad_accum {
            return Err(config_error("grad_accum", "must not exceed batch_size (each micro-batch needs a sample)"));
        }
        crate::batches::check_step_rows(self.batch_size, self.ddp.max(1), self.grad_accum, self.model.batch_norm)?;
        if !(self.grad_clip >= 0.0 && self.grad_clip.is_finite()) {
            return Err(config_error("grad_clip", "must be 0 (off) or a positive number"));
        }
        self.validate_data()?;
        self.validate_model()?;
        let optimizer = &self.optimizer;
        if !(optimizer.lr > 0.0 && optimizer.lr.is_finite()) {
            return Err(config_error("optimizer.lr", "must be a positive number"));
        }
        if !(0.0..1.0).contains(&optimizer.momentum) {
            return Err(config_error("optimizer.momentum", "must be in [0, 1)"));
        }
        if optimizer.weight_decay < 0.0 {
            return Err(config_error("optimizer.weight_decay", "must not be negative"));
        }
        if optimizer.betas.iter().any(|beta| !(0.0..1.0).contains(beta)) {
            return Err(config_error("optimizer.betas", "both must be in [0, 1)"));
        }
        if self.schedule.name == ScheduleName::Step && self.schedule.step_size == 0 {
            return Err(config_error("schedule.step_size", "must be at least 1"));
        }
        if !(self.schedule.min_lr >= 0.0 && self.schedule.min_lr <= optimizer.lr) {
            return Err(config_error("schedule.min_lr", "must be between 0 and optimizer.lr"));
        }
        let scale = &self.loss_scale;
        if !(scale.init > 0.0 && scale.growth_factor > 1.0 && scale.backoff_factor > 0.0 && scale.backoff_factor < 1.0)
        {
            return Err(config_error("loss_scale", "needs init > 0, growth_factor > 1 and 0 < backoff_factor < 1"));
        }
        positive(scale.growth_interval as usize, "loss_scale.growth_interval")?;
        let device = parse_device(&self.device)?;
        if matches!(device, DeviceChoice::Cuda(Some(_))) && self.ddp > 1 {
            return Err(config_error("ddp", "a single device (cuda:N) runs one rank; use device: cuda for several"));
        }
        positive(self.ddp_timeout as usize, "ddp_timeout")?;
        positive(self.ddp_bucket_mb, "ddp_bucket_mb")?;
        let metric = &self.early_stopping.metric;
        if !METRICS.contains(&metric.as_str()) {
            return Err(config_error(
                "early_stopping.metric",
                format!("unknown metric `{metric}`, expected one of {METRICS:?}"),
            ));
        }
        if self.data.val_fraction == 0.0 && metric.starts_with("val_") {
            return Err(config_error(
                "data.val_fraction",
                format!("0 leaves no validation set to measure `{metric}` on"),
            ));
        }
        let wrong_task = match self.data.task {
            Task::Classification => metric == "val_mae",
            Task::Regression => metric == "val_accuracy",
        };
        if wrong_task {
            return Err(config_error(
                "early_stopping.metric",
                format!("`{metric}` is not measured for this data.task"),
            ));
        }
        if let Some(resume) = &self.resume {
            if !resume.is_file() {
                return Err(config_error("resume", format!("no checkpoint at {}", resume.display())));
            }
        }
        Ok(())
    }

    fn validate_data(&self) -> Result<(), ConfigError> {
        let data = &self.data;
        let existing = |path: &Option<PathBuf>, key: &str, what: &str| -> Result<(), ConfigError> {
            match path {
                None => Err(config_error(key, format!("required for data.source {what}"))),
                Some(path) if !path.is_file() => Err(config_error(key, format!("no such file: {}", path.display()))),
                Some(_) => Ok(()),
            }
        };
        match data.source {
            DataSource::Synthetic => {
                if data.samples < 2 {
                    return Err(config_error("data.samples", "must be at least 2"));
                }
                if data.image.is_none() && data.features == 0 {
                    return Err(config_error("data.features", "must be at least 1"));
                }
                if data.image.is_some_and(|shape| shape.contains(&0)) {
                    return Err(config_error("data.image", "every dimension must be at least 1"));
                }
                if !(0.0..=1.0).contains(&data.noise) && data.task == Task::Classification {
                    return Err(config_error("data.noise", "is the fraction of flipped labels: between 0 and 1"));
                }
            }
            DataSource::Csv => existing(&data.path, "data.path", "csv")?,
            DataSource::Npy => {
                existing(&data.path, "data.path", "npy (the features .npy)")?;
                existing(&data.labels, "data.labels", "npy (the labels .npy)")?;
            }
            DataSource::Safetensors => existing(&data.path, "data.path", "safetensors")?,
        }
        if data.task == Task::Classification && data.classes < 2 && data.source == DataSource::Synthetic {
            return Err(config_error("data.classes", "must be at least 2"));
        }
        if !(0.0..1.0).contains(&data.val_fraction) {
            return Err(config_error("data.val_fraction", "must be in [0, 1)"));
        }
        if data.loader_threads == 0 {
            return Err(config_error("data.loader_threads", "must be at least 1"));
        }
        if data.prefetch == 0 {
            return Err(config_error("data.prefetch", "must be at least 1"));
        }
        Ok(())
    }

    fn validate_model(&self) -> Result<(), ConfigError> {
        let model = &self.model;
        if model.hidden_dims.contains(&0) {
            return Err(config_error("model.hidden_dims", "every width must be at least 1"));
        }
        if !(0.0..1.0).contains(&model.dropout) {
            return Err(config_error("model.dropout", "must be in [0, 1)"));
        }
        if model.name == ModelName::Cnn {
            if model.channels.is_empty() || model.channels.contains(&0) {
                return Err(config_error("model.channels", "needs at least one block, each with at least 1 channel"));
            }
            if self.data.source == DataSource::Synthetic && self.data.image.is_none() {
                return Err(config_error(
                    "data.image",
                    "the cnn needs image data: set data.image: [channels, height, width]",
                ));
            }
        }
        Ok(())
    }
}

fn read_document(path: &Path) -> Result<Mapping, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| config_error("config", format!("reading {}: {error}", path.display())))?;
    parse_document(&text)
        .map_err(|error| ConfigError { message: format!("{} ({})", error.message, path.display()), ..error })
}

fn parse_document(text: &str) -> Result<Mapping, ConfigError> {
    let value: Value = serde_norway::from_str(text).map_err(|error| config_error("config", error.to_string()))?;
    match value {
        Value::Null => Ok(Mapping::new()),
        // A sweep file's `train:` mapping works as a config on its own.
        Value::Mapping(mut root) => match root.remove("train") {
            Some(Value::Mapping(train)) if root.contains_key("name") || root.contains_key("grid") => Ok(train),
            Some(other) => {
                root.insert(Value::from("train"), other);
                Ok(root)
            }
            None => Ok(root),
        },
        _ => Err(config_error("config", "expected a mapping of settings")),
    }
}

fn from_document(document: Mapping) -> Result<TrainConfig, ConfigError> {
    serde_path_to_error::deserialize(Value::Mapping(document)).map_err(|error| {
        let key = error.path().to_string();
        let key = if key == "." { "config".to_string() } else { key };
        config_error(key, error.into_inner().to_string())
    })
}

/// `key.sub=value`: the value is read as YAML (`0.01`, `adam`, `[256, 128]`).
fn apply_override(document: &mut Mapping, item: &str) -> Result<(), ConfigError> {
    let (key, text) =
        item.split_once('=').ok_or_else(|| config_error("--set", format!("expected key=value, found `{item}`")))?;
    let key = key.trim();
    if key.is_empty() || key.split('.').any(str::is_empty) {
        return Err(config_error("--set", format!("bad key in `{item}`")));
    }
    let value: Value =
        serde_norway::from_str(text).map_err(|error| config_error(key, format!("bad value: {error}")))?;
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts.pop().unwrap_or(key);
    let mut current = document;
    for (depth, part) in parts.iter().enumerate() {
        let entry = current.entry(Value::from(*part)).or_insert_with(|| Value::Mapping(Mapping::new()));
        if entry.is_null() {
            *entry = Value::Mapping(Mapping::new());
        }
        current = match entry {
            Value::Mapping(inner) => inner,
            _ => return Err(config_error(parts[..=depth].join("."), "is not a mapping, so it has no keys to set")),
        };
    }
    current.insert(Value::from(last), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(yaml: &str) -> ConfigError {
        TrainConfig::from_yaml(yaml).unwrap_err()
    }

    #[test]
    fn defaults_then_file_then_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train.yaml");
        std::fs::write(&path, "batch_size: 64\noptimizer: {name: sgd, lr: 0.1}\nmodel: {hidden_dims: [8]}\n").unwrap();
        let sets = ["optimizer.lr=0.5".to_string(), "model.hidden_dims=[4, 2]".into(), "amp=bf16".into()];
        let config = TrainConfig::load(Some(&path), &sets).unwrap();
        assert_eq!(config.batch_size, 64);
        assert_eq!(config.optimizer.name, OptimizerName::Sgd);
        assert_eq!(config.optimizer.lr, 0.5);
        assert_eq!(config.model.hidden_dims, vec![4, 2]);
        assert_eq!(config.amp, Amp::Bf16);
        assert_eq!(config.epochs, TrainConfig::default().epochs);
    }

    #[test]
    fn a_sweep_files_train_mapping_is_a_config() {
        let config = TrainConfig::from_yaml("name: s\ntrain: {batch_size: 32}\ngrid: {epochs: [1, 2]}\n").unwrap();
        assert_eq!(config.batch_size, 32);
    }

    #[test]
    fn mistakes_name_their_key() {
        assert_eq!(error("batch_size: 0").key, "batch_size");
        assert_eq!(error("model: {name: transformer}").key, "model.name");
        assert!(error("model: {name: transformer}").message.contains("unknown variant `transformer`"));
        assert_eq!(error("optimizer: {name: lion}").key, "optimizer.name");
        assert_eq!(error("optimizer: {lr: -1}").key, "optimizer.lr");
        assert_eq!(error("amp: fp8").key, "amp");
        assert_eq!(error("data: {source: csv}").key, "data.path");
        assert_eq!(error("data: {source: csv, path: /nonexistent/x.csv}").key, "data.path");
        assert!(error("data: {source: csv, path: /nonexistent/x.csv}").message.contains("/nonexistent/x.csv"));
        assert_eq!(error("model: {hiden_dims: [3]}").key, "model.hiden_dims");
        assert!(error("model: {hiden_dims: [3]}").message.contains("hiden_dims"));
        assert_eq!(error("device: tpu").key, "device");
        assert_eq!(error("batch_size: lots").key, "batch_size");
        assert_eq!(
            error("data: {task: regression}\nearly_stopping: {metric: val_accuracy}").key,
            "early_stopping.metric"
        );
        assert_eq!(error("model: {name: cnn}").key, "data.image");
        assert_eq!(error("resume: /nonexistent.pt").key, "resume");
        let display = error("batch_size: 0").to_string();
        assert_eq!(display, "at batch_size: must be at least 1");
    }

    #[test]
    fn overrides_are_checked() {
        let bad = |item: &str| TrainConfig::load(None, &[item.to_string()]).unwrap_err();
        assert_eq!(bad("batch_size").key, "--set");
        assert_eq!(bad("batch_size=0").key, "batch_size");
        assert_eq!(bad("seed.x=1").key, "seed");
        assert_eq!(bad("optimizer.nme=sgd").key, "optimizer.nme");
        assert_eq!(bad("=3").key, "--set");
    }

    #[test]
    fn fp16_needs_cuda() {
        assert_eq!(check_amp_on_device(Amp::Fp16, false).unwrap_err().key, "amp");
        assert!(check_amp_on_device(Amp::Fp16, true).is_ok());
        assert!(check_amp_on_device(Amp::Bf16, false).is_ok());
    }

    #[test]
    fn devices_parse() {
        assert_eq!(parse_device("cuda:1"), Ok(DeviceChoice::Cuda(Some(1))));
        assert_eq!(parse_device("cpu"), Ok(DeviceChoice::Cpu));
        assert!(parse_device("cuda:x").is_err());
    }

    #[test]
    fn resolved_config_round_trips_through_json() {
        let config = TrainConfig::from_yaml("model: {hidden_dims: [3, 2]}\namp: bf16").unwrap();
        let json = serde_json::to_string(&config).unwrap();
        let back: TrainConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(back, config);
    }
}
