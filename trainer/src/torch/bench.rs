//! `app bench`: per (batch size, amp) setting, a fresh model trained for a few warm-up and
//! `steps` measured steps, timing data / forward / backward / optimizer (synchronising the
//! device between phases), with peak memory and GPU utilisation. A setting that runs out of
//! memory (or over `memory_limit`) is marked OOM, its memory is freed, and the next one runs.

use super::data::{self, Data};
use super::device::{self, Devices};
use super::loader::{Loader, LoaderOptions};
use super::step::Engine;
use super::{first_line, TrainError};
use crate::bench::{largest_fitting_batch, median, BenchRow, BenchStatus};
use crate::config::{check_amp_on_device, Amp, TrainConfig};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub steps: usize,
    pub warmup: usize,
    /// A setting whose peak memory passes this is treated as out of memory.
    pub memory_limit: Option<u64>,
}

/// What the bench knows about where it runs.
#[derive(Debug, Clone)]
pub struct Machine {
    pub devices: Devices,
    /// The GPU's name (NVML), when on a GPU.
    pub gpu_name: Option<String>,
    /// Device memory (GPU), or the memory limit / the machine's memory (CPU).
    pub capacity_bytes: Option<u64>,
    pub threads: i32,
}

pub struct Bench {
    config: TrainConfig,
    data: Data,
    pub machine: Machine,
    options: BenchOptions,
    nvml: Option<nvml_wrapper::Nvml>,
}

impl Bench {
    pub fn new(config: &TrainConfig, options: BenchOptions) -> Result<Bench, TrainError> {
        let mut config = config.clone();
        // amp is chosen per setting; fp16 on a CPU is refused per setting, not up front.
        config.amp = Amp::Off;
        let devices = device::resolve(&config)?;
        if config.threads > 0 {
            tch::set_num_threads(config.threads as i32);
        }
        let data = data::load(&config.data, config.seed)?;
        let nvml = if devices.cuda { nvml_wrapper::Nvml::init().ok() } else { None };
        let (gpu_name, gpu_memory) = match (&nvml, devices.master()) {
            (Some(nvml), tch::Device::Cuda(index)) => match nvml.device_by_index(nvml_index(index)) {
                Ok(gpu) => (gpu.name().ok(), gpu.memory_info().ok().map(|memory| memory.total)),
                Err(_) => (None, None),
            },
            _ => (None, None),
        };
        let capacity_bytes = if devices.cuda { gpu_memory } else { options.memory_limit.or_else(machine_memory) };
        let machine = Machine { devices, gpu_name, capacity_bytes, threads: tch::get_num_threads() };
        Ok(Bench { config, data, machine, options, nvml })
    }

    /// One setting; OOM is a row, any other failure an error.
    pub fn measure(&self, batch_size: usize, amp: Amp) -> Result<BenchRow, TrainError> {
        if let Err(error) = check_amp_on_device(amp, self.machine.devices.cuda) {
            return Ok(BenchRow::oom(batch_size, amp.name(), error.to_string()).unsupported());
        }
        let outcome = quietly(|| self.measure_inner(batch_size, amp));
        free_device_memory(&self.machine.devices);
        match outcome {
            Ok(row) => Ok(row),
            Err(message) if is_out_of_memory(&message) => {
                Ok(BenchRow::oom(batch_size, amp.name(), first_line(&message)))
            }
            Err(message) => Err(TrainError::Torch(first_line(&message))),
        }
    }

    fn measure_inner(&self, batch_size: usize, amp: Amp) -> BenchRow {
        let mut config = self.config.clone();
        config.batch_size = batch_size;
        config.amp = amp;
        config.grad_accum = 1;
        let devices = &self.machine.devices;
        reset_peak(devices);
        let mut engine = Engine::new(&config, &self.data, devices).expect("building the model");
        let options = LoaderOptions {
            batch_size,
            threads: config.data.loader_threads,
            prefetch: config.data.prefetch,
            pin_for: (config.data.pin_memory && devices.cuda).then(|| devices.master()),
        };
        let total = self.options.warmup + self.options.steps;
        let mut loader = Loader::random(&self.data.train, total, options);
        let sync = || {
            for &device in &devices.replicas {
                device::synchronize(device);
            }
        };
        let mut phases: [Vec<f64>; 5] = Default::default();
        let sampling = AtomicBool::new(false);
        let stop = AtomicBool::new(false);
        let (nvml, gpu) = (self.nvml.as_ref(), devices.master());
        let (sampling_ref, stop_ref) = (&sampling, &stop);
        let utilization = std::thread::scope(|scope| {
            let sampler = scope.spawn(move || sample_utilization(nvml, gpu, sampling_ref, stop_ref));
            for step in 0..total {
                if step == self.options.warmup {
                    sync();
                    sampling.store(true, Ordering::Relaxed);
                }
                let start = Instant::now();
                let batch = loader.next().expect("the loader has a batch for every step");
                let fetched = Instant::now();
                let losses = engine.forward(&batch, batch.len());
                sync();
                let forwarded = Instant::now();
                engine.backward(&losses);
                engine.reduce_gradients();
                sync();
                let backwarded = Instant::now();
                engine.apply();
                sync();
                let done = Instant::now();
                if step >= self.options.warmup {
                    let ms = |from: Instant, to: Instant| (to - from).as_secs_f64() * 1e3;
                    phases[0].push(ms(start, fetched));
                    phases[1].push(ms(fetched, forwarded));
                    phases[2].push(ms(forwarded, backwarded));
                    phases[3].push(ms(backwarded, done));
                    phases[4].push(ms(start, done));
                }
            }
            stop.store(true, Ordering::Relaxed);
            sampler.join().ok().flatten()
        });
        let total_ms: f64 = phases[4].iter().sum();
        let samples_per_s = (batch_size * self.options.steps) as f64 / (total_ms / 1e3);
        let peak = peak_memory(devices);
        drop(engine);
        let [data_ms, forward_ms, backward_ms, optimizer_ms, step_ms] = phases.map(|mut times| median(&mut times));
        let row = BenchRow {
            batch_size,
            amp: amp.name().to_string(),
            status: BenchStatus::Ok,
            error: None,
            data_ms,
            forward_ms,
            backward_ms,
            optimizer_ms,
            step_ms,
            samples_per_s,
            peak_memory_bytes: peak,
            gpu_utilization: utilization,
        };
        match (peak, self.options.memory_limit) {
            (Some(peak), Some(limit)) if peak > limit => {
                let message = format!(
                    "out of memory: peak {} over the limit of {}",
                    crate::bench::format_bytes(peak),
                    crate::bench::format_bytes(limit)
                );
                BenchRow { error: Some(message), ..BenchRow::oom(batch_size, amp.name(), String::new()) }
            }
            _ => row,
        }
    }

    /// The largest batch that trains without running out of memory and stays within
    /// `safety` of the capacity: doubling from the config's batch size, then binary search.
    pub fn auto_batch_size(
        &self,
        amp: Amp,
        max: usize,
        safety: f64,
    ) -> Result<(Option<usize>, Vec<BenchRow>), TrainError> {
        let mut probes = Vec::new();
        let mut failure = None;
        let found = largest_fitting_batch(self.config.batch_size, max, 8, |batch_size| {
            if failure.is_some() {
                return false;
            }
            match self.measure(batch_size, amp) {
                Ok(row) => {
                    let within = match (row.peak_memory_bytes, self.machine.capacity_bytes) {
                        (Some(peak), Some(capacity)) => peak as f64 <= safety * capacity as f64,
                        _ => true,
                    };
                    let fits = row.status == BenchStatus::Ok && within;
                    probes.push(row);
                    fits
                }
                Err(error) => {
                    failure = Some(error);
                    false
                }
            }
        });
        match failure {
            Some(error) => Err(error),
            None => Ok((found, probes)),
        }
    }
}

/// Mean GPU utilisation (percent) of `device`'s GPU while `sampling`, every 50 ms.
fn sample_utilization(
    nvml: Option<&nvml_wrapper::Nvml>,
    device: tch::Device,
    sampling: &AtomicBool,
    stop: &AtomicBool,
) -> Option<f64> {
    let nvml = nvml?;
    let tch::Device::Cuda(index) = device else { return None };
    let gpu = nvml.device_by_index(nvml_index(index)).ok()?;
    let mut samples = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(std::time::Duration::from_millis(50));
        if sampling.load(Ordering::Relaxed) {
            if let Ok(rates) = gpu.utilization_rates() {
                samples.push(f64::from(rates.gpu));
            }
        }
    }
    (!samples.is_empty()).then(|| samples.iter().sum::<f64>() / samples.len() as f64)
}

impl BenchRow {
    fn unsupported(mut self) -> BenchRow {
        self.status = BenchStatus::Oom;
        self
    }
}

/// Runs `work`, turning a panic (tch panics on libtorch errors) into its message, without
/// the default hook printing it.
fn quietly<T>(work: impl FnOnce() -> T) -> Result<T, String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let outcome = catch_unwind(AssertUnwindSafe(work));
    std::panic::set_hook(hook);
    outcome.map_err(|payload| panic_message(payload.as_ref()))
}

pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else if let Some(text) = payload.downcast_ref::<&str>() {
        text.to_string()
    } else {
        "unknown panic".to_string()
    }
}

pub fn is_out_of_memory(message: &str) -> bool {
    let message = message.to_lowercase();
    ["out of memory", "not enough memory", "can't allocate memory", "cannot allocate memory", "std::bad_alloc"]
        .iter()
        .any(|needle| message.contains(needle))
}

/// NVML numbers GPUs by PCI bus (as the worker sets CUDA_DEVICE_ORDER): CUDA device `index`
/// is the `index`-th entry of CUDA_VISIBLE_DEVICES when that lists numbers.
fn nvml_index(index: usize) -> u32 {
    std::env::var("CUDA_VISIBLE_DEVICES")
        .ok()
        .and_then(|visible| visible.split(',').nth(index).and_then(|entry| entry.trim().parse().ok()))
        .unwrap_or(index as u32)
}

fn reset_peak(devices: &Devices) {
    if devices.cuda {
        for device in &devices.replicas {
            if let tch::Device::Cuda(index) = device {
                super::ffi::cuda_reset_peak(*index);
            }
        }
    } else {
        // Writing 5 to clear_refs resets the process's peak resident set (VmHWM).
        super::ffi::release_free_host_memory();
        let _ = std::fs::write("/proc/self/clear_refs", "5");
    }
}

fn peak_memory(devices: &Devices) -> Option<u64> {
    if devices.cuda {
        return devices
            .replicas
            .iter()
            .filter_map(|device| match device {
                tch::Device::Cuda(index) => super::ffi::cuda_peak_allocated(*index),
                _ => None,
            })
            .max();
    }
    proc_status_kib("VmHWM:").map(|kib| kib * 1024)
}

fn free_device_memory(devices: &Devices) {
    if devices.cuda {
        super::ffi::cuda_empty_cache();
    } else {
        super::ffi::release_free_host_memory();
    }
}

fn machine_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|line| line.starts_with("MemTotal:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
}

fn proc_status_kib(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|line| line.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
