//! Datasets: CSV, `.npy` pairs, `.safetensors`, or synthetic (seeded); the train/val split and
//! standardisation. Everything ends as two CPU tensors per split: features (f32) and labels
//! (i64 classes or f32 targets).

use super::TrainError;
use crate::config::{config_error, DataConfig, DataSource, Task};
use tch::{Device, Kind, Tensor};

#[derive(Debug)]
pub struct Dataset {
    pub x: Tensor,
    pub y: Tensor,
}

impl Dataset {
    pub fn len(&self) -> usize {
        self.x.size()[0] as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Shares the storage (tensors are reference counted).
    pub fn share(&self) -> Dataset {
        Dataset { x: self.x.shallow_clone(), y: self.y.shallow_clone() }
    }

    /// Rows `range`, sharing the storage.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Dataset {
        let (start, len) = (range.start as i64, range.len() as i64);
        Dataset { x: self.x.narrow(0, start, len), y: self.y.narrow(0, start, len) }
    }

    /// A copy on `device`.
    pub fn to_device(&self, device: Device) -> Dataset {
        Dataset { x: self.x.to_device(device), y: self.y.to_device(device) }
    }

    pub fn bytes(&self) -> u64 {
        let size = |tensor: &Tensor| tensor.numel() as u64 * tensor.kind().elt_size_in_bytes() as u64;
        size(&self.x) + size(&self.y)
    }
}

#[derive(Debug)]
pub struct Data {
    pub train: Dataset,
    pub val: Dataset,
    /// The shape of one sample's features (`[features]` or `[c, h, w]`).
    pub sample_shape: Vec<i64>,
    pub task: Task,
    /// Classification: the number of classes; regression: 1.
    pub outputs: i64,
}

/// Whether a dataset of `bytes` lives on CUDA device `index` while training: as the config
/// says, or (`auto`) when it takes under a quarter of the device's free memory.
pub fn fits_on_device(on_device: crate::config::OnDevice, index: usize, bytes: u64) -> bool {
    use crate::config::OnDevice;
    match on_device {
        OnDevice::Never => false,
        OnDevice::Always => true,
        OnDevice::Auto => super::ffi::cuda_memory_info(index).is_some_and(|(free, _)| bytes.saturating_mul(4) <= free),
    }
}

pub fn load(config: &DataConfig, seed: u64) -> Result<Data, TrainError> {
    let (x, y) = match config.source {
        DataSource::Synthetic => synthetic(config, seed),
        DataSource::Csv => csv(config)?,
        DataSource::Npy => npy(config)?,
        DataSource::Safetensors => safetensors(config)?,
    };
    let x = x.to_kind(Kind::Float);
    check_rows(&x, &y, config)?;
    let (y, outputs) = match config.task {
        Task::Classification => classes(&y, config)?,
        Task::Regression => (y.to_kind(Kind::Float).reshape([-1]), 1),
    };
    let sample_shape = x.size()[1..].to_vec();
    let (train, val) = split(x, y, config.val_fraction, config.split_seed);
    let (train, val) = if config.normalize { standardize(train, val) } else { (train, val) };
    Ok(Data { train, val, sample_shape, task: config.task, outputs })
}

fn synthetic(config: &DataConfig, seed: u64) -> (Tensor, Tensor) {
    tch::manual_seed(seed as i64 ^ 0x5eed_da7a);
    let n = config.samples as i64;
    let options = (Kind::Float, Device::Cpu);
    if let Some([c, h, w]) = config.image {
        // One random template per class plus noise: learnable by a small CNN.
        let classes = config.classes.max(2) as i64;
        let templates = Tensor::randn([classes, c as i64, h as i64, w as i64], options);
        let y = Tensor::randint(classes, [n], (Kind::Int64, Device::Cpu));
        let x = templates.index_select(0, &y) + Tensor::randn([n, c as i64, h as i64, w as i64], options);
        return (x, y);
    }
    let features = config.features as i64;
    let x = Tensor::randn([n, features], options);
    match config.task {
        Task::Classification => {
            // argmax of a linear map: linearly separable by construction.
            let classes = config.classes as i64;
            let weights = Tensor::randn([features, classes], options);
            let mut y = x.matmul(&weights).argmax(1, false);
            if config.noise > 0.0 {
                let flip = Tensor::rand([n], options).lt(config.noise);
                let random = Tensor::randint(classes, [n], (Kind::Int64, Device::Cpu));
                y = random.where_self(&flip, &y);
            }
            (x, y)
        }
        Task::Regression => {
            let weights = Tensor::randn([features, 1], options) / (features as f64).sqrt();
            let y = x.matmul(&weights).reshape([-1]) + Tensor::randn([n], options) * config.noise;
            (x, y)
        }
    }
}

fn csv(config: &DataConfig) -> Result<(Tensor, Tensor), TrainError> {
    let path = config.path.as_deref().ok_or_else(|| config_error("data.path", "required for data.source csv"))?;
    let bad = |message: String| TrainError::Config(config_error("data.path", message));
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_path(path)
        .map_err(|error| bad(format!("reading {}: {error}", path.display())))?;
    let headers: Vec<String> = reader
        .headers()
        .map_err(|error| bad(format!("reading the header of {}: {error}", path.display())))?
        .iter()
        .map(str::to_string)
        .collect();
    let column = |name: &str, key: &str| {
        headers.iter().position(|header| header == name).ok_or_else(|| {
            config_error(key, format!("no column `{name}` in {} (columns: {})", path.display(), headers.join(", ")))
        })
    };
    let label = column(&config.label, "data.label")?;
    let features: Vec<usize> = match &config.feature_columns {
        Some(names) => names.iter().map(|name| column(name, "data.feature_columns")).collect::<Result<_, _>>()?,
        None => (0..headers.len()).filter(|&index| index != label).collect(),
    };
    if features.is_empty() {
        return Err(config_error("data.feature_columns", "no feature columns besides the label").into());
    }
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for (row, record) in reader.records().enumerate() {
        let row = row + 1;
        let record = record.map_err(|error| bad(format!("{}: row {row}: {error}", path.display())))?;
        let number = |index: usize| -> Result<f32, TrainError> {
            let text = record.get(index).unwrap_or("");
            let value: f32 = text
                .parse()
                .map_err(|_| bad(format!("row {row}, column `{}`: `{text}` is not a number", headers[index])))?;
            if value.is_nan() {
                return Err(bad(format!("NaN in row {row}, column `{}`", headers[index])));
            }
            Ok(value)
        };
        for &index in &features {
            xs.push(number(index)?);
        }
        ys.push(number(label)?);
    }
    if ys.is_empty() {
        return Err(bad(format!("{} has no data rows", path.display())));
    }
    let x = Tensor::from_slice(&xs).reshape([ys.len() as i64, features.len() as i64]);
    Ok((x, Tensor::from_slice(&ys)))
}

fn npy(config: &DataConfig) -> Result<(Tensor, Tensor), TrainError> {
    let read = |path: &Option<std::path::PathBuf>, key: &str| -> Result<Tensor, TrainError> {
        let path = path.as_deref().ok_or_else(|| config_error(key, "required for data.source npy"))?;
        Tensor::read_npy(path).map_err(|error| {
            config_error(key, format!("reading {}: {}", path.display(), super::first_line(&error.to_string()))).into()
        })
    };
    Ok((read(&config.path, "data.path")?, read(&config.labels, "data.labels")?))
}

fn safetensors(config: &DataConfig) -> Result<(Tensor, Tensor), TrainError> {
    let path =
        config.path.as_deref().ok_or_else(|| config_error("data.path", "required for data.source safetensors"))?;
    let tensors = Tensor::read_safetensors(path).map_err(|error| {
        config_error("data.path", format!("reading {}: {}", path.display(), super::first_line(&error.to_string())))
    })?;
    let names: Vec<&str> = tensors.iter().map(|(name, _)| name.as_str()).collect();
    let find = |name: &str, key: &str| {
        tensors.iter().find(|(found, _)| found == name).map(|(_, tensor)| tensor.shallow_clone()).ok_or_else(|| {
            config_error(key, format!("no tensor `{name}` in {} (tensors: {})", path.display(), names.join(", ")))
        })
    };
    Ok((find(&config.features_key, "data.features_key")?, find(&config.label, "data.label")?))
}

/// Same row count, at least one feature, no NaN (reported with its row).
fn check_rows(x: &Tensor, y: &Tensor, config: &DataConfig) -> Result<(), TrainError> {
    let (rows, labels) = (x.size().first().copied().unwrap_or(0), y.size().first().copied().unwrap_or(0));
    if x.dim() < 2 {
        return Err(config_error("data.path", format!("features need shape [rows, ...], found {:?}", x.size())).into());
    }
    if rows != labels {
        return Err(config_error("data", format!("{rows} feature rows but {labels} labels")).into());
    }
    if rows < 2 {
        return Err(config_error("data", "needs at least 2 rows").into());
    }
    for (tensor, key, what) in [(x, "data.path", "features"), (y, "data.label", "labels")] {
        let per_row = tensor.to_kind(Kind::Float).reshape([rows, -1]).isnan().any_dim(1, false);
        let bad_rows = per_row.nonzero();
        if bad_rows.size()[0] > 0 {
            let row = bad_rows.int64_value(&[0, 0]);
            let key = if config.source == DataSource::Npy && what == "labels" { "data.labels" } else { key };
            return Err(config_error(key, format!("NaN in the {what} at row {} (counting from 1)", row + 1)).into());
        }
    }
    Ok(())
}

fn classes(y: &Tensor, config: &DataConfig) -> Result<(Tensor, i64), TrainError> {
    let y = y.reshape([-1]);
    let as_int = y.to_kind(Kind::Int64);
    if !y.is_floating_point()
        || y.to_kind(Kind::Double).eq_tensor(&as_int.to_kind(Kind::Double)).all().int64_value(&[]) == 1
    {
        let min = as_int.min().int64_value(&[]);
        if min < 0 {
            return Err(config_error("data.label", "class labels must be 0, 1, 2, ... (found a negative one)").into());
        }
        let outputs = (as_int.max().int64_value(&[]) + 1).max(config.classes as i64).max(2);
        return Ok((as_int, outputs));
    }
    Err(config_error(
        "data.label",
        "class labels must be whole numbers 0, 1, 2, ... (use data.task: regression for targets)",
    )
    .into())
}

fn split(x: Tensor, y: Tensor, val_fraction: f64, seed: u64) -> (Dataset, Dataset) {
    let n = x.size()[0];
    let mut val = (n as f64 * val_fraction).round() as i64;
    if val_fraction > 0.0 {
        val = val.clamp(1, n - 1);
    }
    tch::manual_seed(seed as i64 ^ 0x0005_911e);
    let order = Tensor::randperm(n, (Kind::Int64, Device::Cpu));
    let (val_rows, train_rows) = (order.narrow(0, 0, val), order.narrow(0, val, n - val));
    let pick = |rows: &Tensor| Dataset { x: x.index_select(0, rows), y: y.index_select(0, rows) };
    (pick(&train_rows), pick(&val_rows))
}

fn standardize(train: Dataset, val: Dataset) -> (Dataset, Dataset) {
    let mean = train.x.mean_dim(0, true, Kind::Float);
    let std = train.x.std_dim(0, false, true).clamp_min(1e-6);
    let apply = |data: Dataset| Dataset { x: (&data.x - &mean) / &std, y: data.y };
    (apply(train), apply(val))
}
