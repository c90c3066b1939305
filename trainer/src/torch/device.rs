//! Which device this process trains on, and why not CUDA when it falls back to the CPU: CUDA
//! when libtorch_cuda loads, a driver is there and a GPU is visible; with `device: auto`
//! otherwise the CPU, with the reason logged; with `device: cuda` the reason is the error.
//! Also the intra-op threads: the job's share of the cores.

use crate::config::{check_amp_on_device, config_error, parse_device, ConfigError, DeviceChoice, TrainConfig};
use tch::Device;

/// The device of this process (one per rank).
#[derive(Debug, Clone)]
pub struct Placement {
    pub device: Device,
    /// Why CUDA is not used, when `device: auto` fell back to the CPU.
    pub fallback: Option<String>,
    /// The GPU's name (NVML), when on one.
    pub gpu_name: Option<String>,
}

impl Placement {
    pub fn cpu() -> Placement {
        Placement { device: Device::Cpu, fallback: None, gpu_name: None }
    }

    pub fn cuda(&self) -> bool {
        self.device.is_cuda()
    }

    pub fn cuda_index(&self) -> Option<usize> {
        match self.device {
            Device::Cuda(index) => Some(index),
            _ => None,
        }
    }

    /// `cuda:0 (NVIDIA H100 80GB HBM3)`, `CPU`, or `CPU (CUDA unavailable: ...)`.
    pub fn describe(&self) -> String {
        match &self.fallback {
            Some(why) => format!("CPU ({why})"),
            None => self.short(),
        }
    }

    /// `cuda:0 (NVIDIA H100 80GB HBM3)` or `CPU`.
    pub fn short(&self) -> String {
        match (self.cuda_index(), &self.gpu_name) {
            (Some(index), Some(name)) => format!("cuda:{index} ({name})"),
            (Some(index), None) => format!("cuda:{index}"),
            (None, _) => "CPU".to_string(),
        }
    }
}

/// Turns the dynamic loader's message into what to do about it.
pub fn explain_load_failure(message: &str) -> String {
    // "libcusparse.so.12: cannot open shared object file: No such file or directory"
    let missing = message
        .split(';')
        .filter_map(|part| part.split(": cannot open shared object file").next())
        .map(|part| part.trim().rsplit(' ').next().unwrap_or(part).trim())
        .find(|library| library.contains(".so") && !library.starts_with("libtorch_cuda"));
    match missing {
        Some(library) => format!("{library} not found; run scripts/setup-torch.sh --full"),
        None => format!("libtorch_cuda.so did not load ({message}); run scripts/setup-torch.sh --full"),
    }
}

/// The number of visible CUDA devices, or why there are none.
pub fn cuda_status() -> Result<usize, String> {
    if std::env::var("CUDA_VISIBLE_DEVICES").is_ok_and(|visible| visible.trim().is_empty()) {
        return Err("CUDA_VISIBLE_DEVICES is empty (a CPU job)".into());
    }
    super::ffi::load_cuda().map_err(|error| explain_load_failure(&error))?;
    if !tch::Cuda::is_available() {
        if let Err(error) = super::ffi::driver_present() {
            let library = error.split(':').next().unwrap_or("libcuda.so.1").trim().to_string();
            return Err(format!("no NVIDIA driver ({library} not found)"));
        }
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into());
        return Err(format!("no CUDA device is visible (CUDA_VISIBLE_DEVICES={visible})"));
    }
    Ok(tch::Cuda::device_count().max(0) as usize)
}

/// The visible GPUs this run would use (`None`: it trains on the CPU), for the rank decision.
pub fn visible_gpus(config: &TrainConfig) -> Result<Option<usize>, ConfigError> {
    match parse_device(&config.device)? {
        DeviceChoice::Cpu => Ok(None),
        DeviceChoice::Auto => Ok(cuda_status().ok()),
        DeviceChoice::Cuda(_) => cuda_status().map(Some).map_err(|why| unavailable(&why)),
    }
}

fn unavailable(why: &str) -> ConfigError {
    config_error("device", format!("CUDA unavailable: {why}"))
}

/// This process's device: `local_rank` picks the GPU of a rank (`cuda:LOCAL_RANK`).
pub fn resolve(config: &TrainConfig, local_rank: Option<usize>) -> Result<Placement, ConfigError> {
    let choice = parse_device(&config.device)?;
    let placement = match choice {
        DeviceChoice::Cpu => Placement::cpu(),
        DeviceChoice::Auto | DeviceChoice::Cuda(_) => match (cuda_status(), choice) {
            (Err(why), DeviceChoice::Auto) => {
                Placement { device: Device::Cpu, fallback: Some(format!("CUDA unavailable: {why}")), gpu_name: None }
            }
            (Err(why), _) => return Err(unavailable(&why)),
            (Ok(count), _) => {
                let index = match choice {
                    DeviceChoice::Cuda(Some(index)) => index,
                    _ => local_rank.unwrap_or(0),
                };
                if index >= count {
                    return Err(config_error("device", format!("cuda:{index} does not exist ({count} visible)")));
                }
                super::ffi::cuda_set_device(index).map_err(|error| config_error("device", error))?;
                Placement { device: Device::Cuda(index), fallback: None, gpu_name: gpu_name(index) }
            }
        },
    };
    check_amp_on_device(config.amp, placement.cuda())?;
    super::ffi::set_tf32(config.tf32 && placement.cuda());
    Ok(placement)
}

fn gpu_name(index: usize) -> Option<String> {
    let nvml = nvml_wrapper::Nvml::init().ok()?;
    let name = nvml.device_by_index(nvml_index(index)).ok()?.name().ok();
    name
}

/// NVML numbers GPUs by PCI bus (as the worker sets CUDA_DEVICE_ORDER): CUDA device `index`
/// is the `index`-th entry of CUDA_VISIBLE_DEVICES when that lists numbers.
pub fn nvml_index(index: usize) -> u32 {
    std::env::var("CUDA_VISIBLE_DEVICES")
        .ok()
        .and_then(|visible| visible.split(',').nth(index).and_then(|entry| entry.trim().parse().ok()))
        .unwrap_or(index as u32)
}

/// Sets libtorch's intra-op threads: the config's, else `OMP_NUM_THREADS` (libtorch reads
/// it), else the cores this process may run on (affinity and cgroup quota) divided among the
/// `local_ranks` ranks of this machine. Returns the count in use.
pub fn set_threads(config: &TrainConfig, local_ranks: usize) -> i32 {
    let from_env = std::env::var("OMP_NUM_THREADS").ok().and_then(|text| text.trim().parse::<usize>().ok());
    let threads = match (config.threads, from_env) {
        (0, Some(_)) => None,
        (0, None) => {
            let cores = std::thread::available_parallelism().map_or(1, usize::from);
            Some(crate::ranks::share_of_cores(cores, local_ranks))
        }
        (threads, _) => Some(threads),
    };
    if let Some(threads) = threads {
        tch::set_num_threads(threads as i32);
    }
    tch::get_num_threads()
}

/// Waits for the device's queued work (timing); a no-op on the CPU.
pub fn synchronize(device: Device) {
    if let Device::Cuda(index) = device {
        tch::Cuda::synchronize(index as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::explain_load_failure;

    #[test]
    fn a_missing_cuda_library_is_named_with_the_fix() {
        let message = "libcusparse.so.12: cannot open shared object file: No such file or directory; \
            /x/lib/libtorch_cuda.so: libcusparse.so.12: cannot open shared object file: No such file or directory";
        assert_eq!(explain_load_failure(message), "libcusparse.so.12 not found; run scripts/setup-torch.sh --full");
        let absent = "libtorch_cuda.so: cannot open shared object file: No such file or directory";
        assert!(explain_load_failure(absent).starts_with("libtorch_cuda.so did not load"));
    }
}
