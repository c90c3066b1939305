//! The GPUs of this box: NVML when a driver is there, a simulated set with `--fake-gpus`, or
//! none (CPU jobs only). NVML is initialised once; its absence is not an error. Which of them
//! the worker may use follows its own `CUDA_VISIBLE_DEVICES` (see `visible`), then `--gpus`.

pub use crate::fake_gpus::FakeGpus;
use shared::api::GpuSample;

/// A process using a GPU, as NVML lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuProcess {
    pub gpu: u32,
    pub pid: u32,
    /// GPU memory it holds on that GPU, bytes (`None`: NVML cannot tell).
    pub memory: Option<u64>,
}

/// Fresh readings of the GPUs this worker may use.
pub trait GpuInventory: Send + Sync {
    fn sample(&self) -> Vec<GpuSample>;

    /// The processes using those GPUs now (empty where NVML cannot list them).
    fn processes(&self) -> Vec<GpuProcess> {
        Vec::new()
    }
}

/// A box without GPUs (or without a driver).
pub struct NoGpus;

impl GpuInventory for NoGpus {
    fn sample(&self) -> Vec<GpuSample> {
        Vec::new()
    }
}

/// Real GPUs through NVML.
pub struct NvmlGpus {
    nvml: nvml_wrapper::Nvml,
    indices: Vec<u32>,
}

impl NvmlGpus {
    /// Loads NVML (`libnvidia-ml.so.1`, as drivers install it, or `libnvidia-ml.so`).
    pub fn init() -> Result<NvmlGpus, String> {
        let nvml = nvml_wrapper::Nvml::builder()
            .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
            .init()
            .or_else(|_| nvml_wrapper::Nvml::init())
            .map_err(|error| error.to_string())?;
        let count = nvml.device_count().map_err(|error| error.to_string())?;
        Ok(NvmlGpus { nvml, indices: (0..count).collect() })
    }

    /// The UUID of every GPU NVML sees, in NVML's order.
    fn uuids(&self) -> Vec<String> {
        self.indices
            .iter()
            .map(|index| self.nvml.device_by_index(*index).and_then(|device| device.uuid()).unwrap_or_default())
            .collect()
    }
}

impl GpuInventory for NvmlGpus {
    fn sample(&self) -> Vec<GpuSample> {
        use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
        let mut samples = Vec::new();
        for &index in &self.indices {
            let Ok(device) = self.nvml.device_by_index(index) else { continue };
            let Ok(memory) = device.memory_info() else { continue };
            samples.push(GpuSample {
                index,
                uuid: device.uuid().unwrap_or_default(),
                name: device.name().unwrap_or_else(|_| "GPU".into()),
                memory_total: memory.total,
                memory_used: memory.used,
                utilization: device.utilization_rates().ok().map(|rates| rates.gpu),
                temperature: device.temperature(TemperatureSensor::Gpu).ok(),
                power_watts: device.power_usage().ok().map(|milliwatts| f64::from(milliwatts) / 1000.0),
                at: 0,
            });
        }
        samples
    }

    fn processes(&self) -> Vec<GpuProcess> {
        use nvml_wrapper::enums::device::UsedGpuMemory;
        let mut processes: Vec<GpuProcess> = Vec::new();
        for &index in &self.indices {
            let Ok(device) = self.nvml.device_by_index(index) else { continue };
            let compute = device.running_compute_processes();
            let listed = compute.into_iter().chain(device.running_graphics_processes()).flatten();
            for info in listed {
                let memory = match info.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => Some(bytes),
                    UsedGpuMemory::Unavailable => None,
                };
                // A process with compute and graphics contexts is listed twice: once is enough.
                if !processes.iter().any(|known| known.gpu == index && known.pid == info.pid) {
                    processes.push(GpuProcess { gpu: index, pid: info.pid, memory });
                }
            }
        }
        processes
    }
}

/// The inventory for these settings: fake GPUs if asked, else NVML if a driver answers, else
/// none. `cuda_visible` is the worker's own `CUDA_VISIBLE_DEVICES`: only the GPUs it names are
/// used, and one that NVML does not see stops the worker. `only` (`--gpus 0,1`, NVML indices)
/// then restricts them further.
pub fn detect(
    fake: Option<&str>,
    only: Option<&[u32]>,
    cuda_visible: Option<&str>,
) -> anyhow::Result<Box<dyn GpuInventory>> {
    if let Some(spec) = fake {
        let mut gpus = FakeGpus::parse(spec).map_err(anyhow::Error::msg)?;
        let uuids: Vec<String> = gpus.gpus.iter().map(|gpu| gpu.uuid.clone()).collect();
        let allowed = allowed(&uuids, only, cuda_visible)?;
        gpus = gpus.restrict(&allowed);
        tracing::info!(gpus = gpus.gpus.len(), "using a simulated GPU inventory (--fake-gpus)");
        return Ok(Box::new(gpus));
    }
    match NvmlGpus::init() {
        Ok(mut gpus) => {
            let allowed = allowed(&gpus.uuids(), only, cuda_visible)?;
            gpus.indices.retain(|index| allowed.contains(index));
            let names: Vec<String> =
                gpus.sample().into_iter().map(|gpu| format!("{}: {} {}", gpu.index, gpu.name, gpu.uuid)).collect();
            tracing::info!(gpus = ?names, "NVML inventory");
            Ok(Box::new(gpus))
        }
        Err(reason) => {
            tracing::info!(%reason, "no NVIDIA driver found; running CPU jobs only");
            if only.is_some_and(|only| !only.is_empty()) {
                anyhow::bail!("--gpus was given but no GPU can be seen (NVML: {reason})");
            }
            // An empty list (or `-1`) hides every GPU, which is all a box without any can do.
            if let Some(visible) = cuda_visible.filter(|visible| super::visible::visible_indices(visible, &[]).is_err())
            {
                anyhow::bail!(
                    "CUDA_VISIBLE_DEVICES={visible} names GPUs, but NVML sees none ({reason}); unset it to run CPU jobs only"
                );
            }
            Ok(Box::new(NoGpus))
        }
    }
}

/// The NVML indices this worker may use among GPUs with these `uuids` (in NVML order).
fn allowed(uuids: &[String], only: Option<&[u32]>, cuda_visible: Option<&str>) -> anyhow::Result<Vec<u32>> {
    let count = uuids.len() as u32;
    let visible = match cuda_visible {
        Some(spec) => {
            let visible = super::visible::visible_indices(spec, uuids).map_err(anyhow::Error::msg)?;
            tracing::info!(cuda_visible_devices = spec, gpus = ?visible, "using the GPUs CUDA_VISIBLE_DEVICES names");
            visible
        }
        None => (0..count).collect(),
    };
    let Some(only) = only else { return Ok(visible) };
    if let Some(missing) = only.iter().find(|index| **index >= count) {
        anyhow::bail!("--gpus names GPU {missing}, but this box has {count} (0..{})", count.saturating_sub(1));
    }
    if let Some(hidden) = only.iter().find(|index| !visible.contains(index)) {
        let visible = cuda_visible.unwrap_or_default();
        anyhow::bail!("--gpus names GPU {hidden}, which CUDA_VISIBLE_DEVICES={visible} leaves out");
    }
    Ok(only.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn indices(inventory: &dyn GpuInventory) -> Vec<u32> {
        inventory.sample().iter().map(|gpu| gpu.index).collect()
    }

    #[test]
    fn gpus_flag_restricts_and_checks_indices() {
        let inventory = detect(Some("4x8GiB"), Some(&[1, 3]), None).unwrap();
        assert_eq!(indices(inventory.as_ref()), [1, 3]);
        let error = detect(Some("2x8GiB"), Some(&[5]), None).err().unwrap().to_string();
        assert!(error.contains("GPU 5"), "{error}");
    }

    #[test]
    fn cuda_visible_devices_chooses_the_gpus_by_index_or_uuid() {
        let uuid = crate::fake_gpus::fake_uuid(2);
        let inventory = detect(Some("4x8GiB"), None, Some(&format!("{uuid},0"))).unwrap();
        assert_eq!(indices(inventory.as_ref()), [0, 2]);
        assert!(indices(detect(Some("4x8GiB"), None, Some("")).unwrap().as_ref()).is_empty());
        let error = detect(Some("2x8GiB"), None, Some("GPU-0123")).err().unwrap().to_string();
        assert!(error.contains("names GPU-0123, which NVML does not see"), "{error}");
        // --gpus restricts within what CUDA_VISIBLE_DEVICES allows.
        assert_eq!(indices(detect(Some("4x8GiB"), Some(&[2]), Some("1,2")).unwrap().as_ref()), [2]);
        let error = detect(Some("4x8GiB"), Some(&[3]), Some("1,2")).err().unwrap().to_string();
        assert_eq!(error, "--gpus names GPU 3, which CUDA_VISIBLE_DEVICES=1,2 leaves out");
    }
}
