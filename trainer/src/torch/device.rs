//! Which devices a run uses: CUDA when libtorch_cuda loads and a GPU is visible, else the CPU;
//! one replica per device for data parallelism.

use crate::config::{check_amp_on_device, config_error, parse_device, ConfigError, DeviceChoice, TrainConfig};
use tch::Device;

#[derive(Debug, Clone)]
pub struct Devices {
    /// One entry per replica; the first holds the master copy of the weights.
    pub replicas: Vec<Device>,
    pub cuda: bool,
}

impl Devices {
    pub fn master(&self) -> Device {
        self.replicas[0]
    }

    pub fn describe(&self) -> String {
        if self.cuda {
            let names: Vec<String> = self.replicas.iter().map(|device| format!("{device:?}")).collect();
            format!("CUDA x{} ({})", self.replicas.len(), names.join(", "))
        } else if self.replicas.len() > 1 {
            format!("CPU ({} replicas)", self.replicas.len())
        } else {
            "CPU".to_string()
        }
    }
}

/// Whether CUDA is usable here, and why not when it is not.
pub fn cuda_status() -> Result<usize, String> {
    super::ffi::load_cuda().map_err(|error| format!("libtorch_cuda.so did not load ({error})"))?;
    if !tch::Cuda::is_available() {
        return Err("no CUDA device is visible".into());
    }
    Ok(tch::Cuda::device_count().max(0) as usize)
}

pub fn resolve(config: &TrainConfig) -> Result<Devices, ConfigError> {
    let choice = parse_device(&config.device)?;
    let cuda = match choice {
        DeviceChoice::Cpu => Err("device: cpu".to_string()),
        _ => cuda_status(),
    };
    let devices = match (choice, cuda) {
        (DeviceChoice::Cpu, _) | (DeviceChoice::Auto, Err(_)) => {
            Devices { replicas: vec![Device::Cpu; config.replicas.max(1)], cuda: false }
        }
        (DeviceChoice::Cuda(_), Err(why)) => {
            let visible = std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into());
            return Err(config_error(
                "device",
                format!("CUDA was asked for but {why} (CUDA_VISIBLE_DEVICES={visible})"),
            ));
        }
        (DeviceChoice::Cuda(Some(index)), Ok(count)) => {
            if index >= count {
                return Err(config_error("device", format!("cuda:{index} does not exist ({count} visible)")));
            }
            if config.replicas > 1 {
                return Err(config_error("replicas", "a single device (cuda:N) takes one replica; use device: cuda"));
            }
            Devices { replicas: vec![Device::Cuda(index)], cuda: true }
        }
        (DeviceChoice::Auto | DeviceChoice::Cuda(None), Ok(count)) => {
            let wanted = if config.replicas == 0 { count } else { config.replicas };
            if wanted > count {
                return Err(config_error("replicas", format!("{wanted} replicas need {wanted} GPUs, {count} visible")));
            }
            Devices { replicas: (0..wanted).map(Device::Cuda).collect(), cuda: true }
        }
    };
    check_amp_on_device(config.amp, devices.cuda)?;
    Ok(devices)
}

/// Waits for the device's queued work (timing); a no-op on the CPU.
pub fn synchronize(device: Device) {
    if let Device::Cuda(index) = device {
        tch::Cuda::synchronize(index as i64);
    }
}
