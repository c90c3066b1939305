//! Checkpoints: the model's weights as a state dict with PyTorch's keys (`fc0.weight`,
//! `bn0.running_mean`, ...) in torch.save's format (`.pt`, which `torch.load` reads with its
//! default `weights_only=True`) or as safetensors, plus a `.json` sidecar saying where training
//! stood. Resume reads either format, also a state dict PyTorch wrote (a `module.` prefix from
//! a DDP-wrapped model is dropped), and names the tensor when the shapes do not match.

use super::ffi;
use super::step::Engine;
use super::{io_error, TrainError};
use crate::config::{config_error, CheckpointFormat};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use tch::{Device, Kind, Tensor};

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

/// The model's state dict, in module order, as tensors of its own that later training steps
/// do not change: copies on the model's device (on a GPU a copy takes well under a
/// millisecond, where a host copy of a large model stalls training) when the device has room
/// for it beside what training needs, else on the host. The writer moves them to the host
/// (`on_host`).
pub fn snapshot(engine: &Engine) -> Vec<(String, Tensor)> {
    let on_device = room_for_a_copy(engine)
        .then(|| {
            state(engine, |variable| {
                let mut copy = variable.f_empty_like().ok()?;
                copy.f_copy_(variable).ok()?;
                Some(copy)
            })
        })
        .flatten();
    on_device.unwrap_or_else(|| state_dict(engine))
}

/// Free memory a GPU must keep beyond a snapshot's own size for the snapshot to stay there.
const SNAPSHOT_HEADROOM: u64 = 256 << 20;

/// Whether a copy of the weights can stay on their device while the next epoch trains: on a
/// GPU, when the driver has twice their size free and some (memory the caching allocator
/// holds is not counted, so this errs towards the host). Only rank 0 snapshots, so a copy that
/// crowded out the next step would fail that rank alone.
fn room_for_a_copy(engine: &Engine) -> bool {
    let variables = engine.vs.variables();
    let Some(Device::Cuda(index)) = variables.values().next().map(Tensor::device) else { return true };
    let bytes: u64 =
        variables.values().map(|variable| variable.numel() as u64 * variable.kind().elt_size_in_bytes() as u64).sum();
    super::ffi::cuda_memory_info(index).is_some_and(|(free, _)| free >= 2 * bytes + SNAPSHOT_HEADROOM)
}

/// The model's state dict as host tensors of its own (copied even when the model is on the
/// CPU, so the snapshot does not move with it).
pub fn state_dict(engine: &Engine) -> Vec<(String, Tensor)> {
    state(engine, |variable| Some(host_copy(variable))).unwrap_or_default()
}

/// A state dict's tensors on the host, contiguous (a no-op for host tensors). GPU tensors are
/// copied on a side stream, so the writer thread calling this does not stall training.
pub fn on_host(state: Vec<(String, Tensor)>) -> Result<Vec<(String, Tensor)>, TrainError> {
    let (names, tensors): (Vec<String>, Vec<Tensor>) = state.into_iter().unzip();
    let host = ffi::copy_to_host(&tensors).map_err(TrainError::Torch)?;
    Ok(names.into_iter().zip(host).collect())
}

fn host_copy(variable: &Tensor) -> Tensor {
    variable.to_device_(Device::Cpu, variable.kind(), false, true).contiguous()
}

/// The state dict with each variable taken by `take` (None if any `take` fails).
fn state(engine: &Engine, take: impl Fn(&Tensor) -> Option<Tensor>) -> Option<Vec<(String, Tensor)>> {
    let variables = engine.vs.variables();
    let mut state = Vec::with_capacity(engine.model.state_names.len());
    for name in &engine.model.state_names {
        let tensor = if name.ends_with(".num_batches_tracked") {
            Tensor::scalar_tensor(engine.forward_passes as f64, (Kind::Int64, Device::Cpu))
        } else {
            match variables.get(name) {
                Some(variable) => take(&variable.detach())?,
                None => continue,
            }
        };
        state.push((name.clone(), tensor));
    }
    Some(state)
}

/// Writes a state dict (`path`'s extension says the format) and the sidecar beside them.
pub fn write(state: &[(String, Tensor)], path: &Path, info: &CheckpointInfo) -> Result<(), TrainError> {
    let failed = |error: String| TrainError::Torch(format!("writing {}: {error}", path.display()));
    if path.extension().is_some_and(|extension| extension == CheckpointFormat::Safetensors.extension()) {
        let named: Vec<(&str, &Tensor)> = state.iter().map(|(name, tensor)| (name.as_str(), tensor)).collect();
        Tensor::write_safetensors(&named, path).map_err(|error| failed(super::first_line(&error.to_string())))?;
    } else {
        ffi::checkpoint::save_state_dict(path, state).map_err(failed)?;
    }
    let text = serde_json::to_string_pretty(info).unwrap_or_default() + "\n";
    let sidecar = path.with_extension("json");
    std::fs::write(&sidecar, text).map_err(io_error(format!("writing {}", sidecar.display())))
}

/// A checkpoint file's tensors by name: safetensors by extension, else torch.save's format,
/// else the TorchScript archive older versions of this trainer wrote.
pub fn read(path: &Path) -> Result<HashMap<String, Tensor>, String> {
    let entries = if path.extension().is_some_and(|extension| extension == "safetensors") {
        Tensor::read_safetensors(path).map_err(|error| super::first_line(&error.to_string()))?
    } else {
        match ffi::checkpoint::load_state_dict(path) {
            Ok(entries) => entries,
            Err(error) => match Tensor::load_multi(path) {
                Ok(entries) => entries.into_iter().map(|(name, tensor)| (name.replace('|', "."), tensor)).collect(),
                Err(_) => return Err(error),
            },
        }
    };
    Ok(entries
        .into_iter()
        .map(|(name, tensor)| (name.strip_prefix("module.").map(str::to_string).unwrap_or(name), tensor))
        .collect())
}

/// Loads a checkpoint's weights into the engine's model; its sidecar, if there, says where
/// training stopped.
pub fn resume(engine: &mut Engine, path: &Path) -> Result<Option<CheckpointInfo>, TrainError> {
    let bad = |message: String| TrainError::Config(config_error("resume", message));
    let shown = path.display();
    let saved = read(path).map_err(|error| bad(format!("reading {shown}: {error}")))?;
    let variables = engine.vs.variables();
    for name in &engine.model.state_names {
        let counter = name.ends_with(".num_batches_tracked");
        if counter && !saved.contains_key(name) {
            continue;
        }
        let source = saved
            .get(name)
            .ok_or_else(|| bad(format!("{shown} has no tensor `{name}`: a checkpoint of another model shape?")))?;
        if counter {
            engine.forward_passes = source.to_kind(Kind::Int64).int64_value(&[]);
            continue;
        }
        let mut variable = variables[name].shallow_clone();
        if source.size() != variable.size() {
            return Err(bad(format!(
                "`{name}` has shape {:?} in {shown} but {:?} in this model: a checkpoint of another model shape?",
                source.size(),
                variable.size()
            )));
        }
        tch::no_grad(|| variable.f_copy_(source)).map_err(|error| {
            bad(format!("loading `{name}` from {shown}: {}", super::first_line(&error.to_string())))
        })?;
    }
    if let Some(extra) = saved.keys().find(|name| !engine.model.state_names.contains(name)) {
        return Err(bad(format!("`{extra}` in {shown} is not in this model: a checkpoint of another model shape?")));
    }
    let sidecar = path.with_extension("json");
    match std::fs::read_to_string(&sidecar) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|error| bad(format!("reading {}: {error}", sidecar.display()))),
        Err(_) => Ok(None),
    }
}
