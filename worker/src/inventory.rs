//! The GPUs of this box: NVML when a driver is there, a simulated set with `--fake-gpus`, or
//! none (CPU jobs only). NVML is initialised once; its absence is not an error.

use shared::api::GpuSample;
use shared::size::parse_bytes;

/// Fresh readings of the GPUs this worker may use.
pub trait GpuInventory: Send + Sync {
    fn sample(&self) -> Vec<GpuSample>;
}

/// A box without GPUs (or without a driver).
pub struct NoGpus;

impl GpuInventory for NoGpus {
    fn sample(&self) -> Vec<GpuSample> {
        Vec::new()
    }
}

/// Simulated GPUs for testing placement on machines without any (`--fake-gpus 2x24GiB`).
pub struct FakeGpus {
    memory: Vec<(u32, u64)>,
}

impl FakeGpus {
    /// `2x24GiB` (two GPUs of 24 GiB), `24GiB,80GiB` (one of each), or `3` (three of 24 GiB).
    pub fn parse(spec: &str) -> Result<FakeGpus, String> {
        let mut memory = Vec::new();
        for part in spec.split(',').map(str::trim).filter(|part| !part.is_empty()) {
            let (count, size) = match part.split_once(['x', 'X']) {
                Some((count, size)) => (count.trim(), size.trim()),
                None if part.chars().all(|c| c.is_ascii_digit()) => (part, "24GiB"),
                None => ("1", part),
            };
            let count: u32 =
                count.parse().map_err(|_| format!("`{part}` in --fake-gpus: expected N or NxSIZE, e.g. 2x24GiB"))?;
            let bytes = parse_bytes(size).map_err(|error| format!("--fake-gpus: {error}"))?;
            memory.extend((0..count).map(|_| bytes));
        }
        if memory.is_empty() {
            return Err(format!("--fake-gpus `{spec}` describes no GPU (expected e.g. 2x24GiB)"));
        }
        Ok(FakeGpus { memory: memory.into_iter().enumerate().map(|(index, bytes)| (index as u32, bytes)).collect() })
    }

    fn restrict(mut self, indices: &[u32]) -> FakeGpus {
        self.memory.retain(|(index, _)| indices.contains(index));
        self
    }
}

impl GpuInventory for FakeGpus {
    fn sample(&self) -> Vec<GpuSample> {
        self.memory
            .iter()
            .map(|(index, total)| GpuSample {
                index: *index,
                uuid: format!("GPU-fake-{index}"),
                name: "Fake GPU".into(),
                memory_total: *total,
                memory_used: 0,
                utilization: Some(0),
                temperature: None,
                power_watts: None,
                at: 0,
            })
            .collect()
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
}

/// The inventory for these settings: fake GPUs if asked, else NVML if a driver answers, else
/// none. `only` restricts the GPUs to those indices (`--gpus 0,1`).
pub fn detect(fake: Option<&str>, only: Option<&[u32]>) -> anyhow::Result<Box<dyn GpuInventory>> {
    if let Some(spec) = fake {
        let mut gpus = FakeGpus::parse(spec).map_err(anyhow::Error::msg)?;
        if let Some(only) = only {
            check_indices(only, gpus.memory.len() as u32)?;
            gpus = gpus.restrict(only);
        }
        tracing::info!(gpus = gpus.memory.len(), "using a simulated GPU inventory (--fake-gpus)");
        return Ok(Box::new(gpus));
    }
    match NvmlGpus::init() {
        Ok(mut gpus) => {
            if let Some(only) = only {
                check_indices(only, gpus.indices.len() as u32)?;
                gpus.indices.retain(|index| only.contains(index));
            }
            let names: Vec<String> =
                gpus.sample().into_iter().map(|gpu| format!("{}: {}", gpu.index, gpu.name)).collect();
            tracing::info!(gpus = ?names, "NVML inventory");
            Ok(Box::new(gpus))
        }
        Err(reason) => {
            tracing::info!(%reason, "no NVIDIA driver found; running CPU jobs only");
            if only.is_some_and(|only| !only.is_empty()) {
                anyhow::bail!("--gpus was given but no GPU can be seen (NVML: {reason})");
            }
            Ok(Box::new(NoGpus))
        }
    }
}

fn check_indices(only: &[u32], count: u32) -> anyhow::Result<()> {
    if let Some(missing) = only.iter().find(|index| **index >= count) {
        anyhow::bail!("--gpus names GPU {missing}, but this box has {count} (0..{})", count.saturating_sub(1));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_specs_parse() {
        let gpus = FakeGpus::parse("2x24GiB").unwrap().sample();
        assert_eq!(gpus.len(), 2);
        assert_eq!((gpus[1].index, gpus[1].memory_total), (1, 24 << 30));
        let mixed = FakeGpus::parse("24GiB, 80GiB").unwrap().sample();
        assert_eq!(mixed.iter().map(|gpu| gpu.memory_total).collect::<Vec<_>>(), [24 << 30, 80 << 30]);
        assert_eq!(FakeGpus::parse("3").unwrap().sample().len(), 3);
        assert!(FakeGpus::parse("twox24").is_err());
        assert!(FakeGpus::parse("").is_err());
    }

    #[test]
    fn gpus_flag_restricts_and_checks_indices() {
        let inventory = detect(Some("4x8GiB"), Some(&[1, 3])).unwrap();
        assert_eq!(inventory.sample().iter().map(|gpu| gpu.index).collect::<Vec<_>>(), [1, 3]);
        let error = detect(Some("2x8GiB"), Some(&[5])).err().unwrap().to_string();
        assert!(error.contains("GPU 5"), "{error}");
    }
}
