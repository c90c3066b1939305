//! `app bench`: per (batch size, precision) setting, a fresh model trained for a few warm-up and
//! `steps` measured steps, timing data / forward / backward / optimizer (synchronising the
//! device between phases), with peak memory, utilisation (GPU by NVML, or the process's CPU
//! use) and model FLOP/s. A setting that runs out of memory (or over `memory_limit`) is marked
//! OOM, its memory is freed, and the next one runs.
//!
//! The utilisation sampler runs beside the steps in a scoped thread; a guard stops it however
//! the steps end, so a panic inside a step (CUDA running out of memory is one) cannot leave the
//! scope waiting on it forever.

use super::data::{self, Data};
use super::device::{self, nvml_index, Placement};
use super::loader::{Loader, LoaderOptions};
use super::step::Engine;
use super::{first_line, TrainError};
use crate::bench::{largest_fitting_batch, median, train_flops_per_sample, BenchRow, BenchStatus, Precision};
use crate::config::{check_amp_on_device, Amp, TrainConfig};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

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
    pub placement: Placement,
    /// Device memory (GPU), or the memory limit / the machine's memory (CPU).
    pub capacity_bytes: Option<u64>,
    pub threads: i32,
    /// Model FLOPs of one training step per sample.
    pub flops_per_sample: f64,
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
        // Precision is chosen per setting; fp16 on a CPU is refused per setting, not up front.
        config.amp = Amp::Off;
        let placement = device::resolve(&config, None)?;
        let threads = device::set_threads(&config, 1);
        let mut data = data::load(&config.data, config.seed)?;
        let nvml = if placement.cuda() { nvml_wrapper::Nvml::init().ok() } else { None };
        let gpu_memory = match (&nvml, placement.cuda_index()) {
            (Some(nvml), Some(index)) => nvml
                .device_by_index(nvml_index(index))
                .ok()
                .and_then(|gpu| gpu.memory_info().ok())
                .map(|memory| memory.total),
            _ => None,
        };
        if let Some(index) = placement.cuda_index() {
            if data::fits_on_device(config.data.on_device, index, data.train.bytes()) {
                data.train = data.train.to_device(placement.device);
            }
        }
        let capacity_bytes = if placement.cuda() { gpu_memory } else { options.memory_limit.or_else(machine_memory) };
        let flops_per_sample = train_flops_per_sample(&config.model, &data.sample_shape, data.outputs);
        let machine = Machine { placement, capacity_bytes, threads, flops_per_sample };
        Ok(Bench { config, data, machine, options, nvml })
    }

    /// One setting; OOM (and a precision this device lacks) is a row, any other failure an error.
    pub fn measure(&self, batch_size: usize, precision: Precision) -> Result<BenchRow, TrainError> {
        let cuda = self.machine.placement.cuda();
        let unsupported = |error: String| {
            Ok(BenchRow { status: BenchStatus::Unsupported, ..BenchRow::oom(batch_size, precision.name(), error) })
        };
        if let Err(error) = check_amp_on_device(precision.amp(), cuda) {
            return unsupported(error.to_string());
        }
        if precision == Precision::Tf32 && !cuda {
            return unsupported("at --amp: tf32 needs a CUDA device".into());
        }
        if let Err(error) = crate::batches::check_step_rows(batch_size, 1, 1, self.config.model.batch_norm) {
            return unsupported(error.to_string());
        }
        let outcome = quietly(|| self.measure_inner(batch_size, precision));
        free_device_memory(&self.machine.placement);
        match outcome.and_then(|inner| inner) {
            Ok(row) => Ok(row),
            Err(message) if is_out_of_memory(&message) => {
                Ok(BenchRow::oom(batch_size, precision.name(), first_line(&message)))
            }
            Err(message) => Err(TrainError::Torch(first_line(&message))),
        }
    }

    fn measure_inner(&self, batch_size: usize, precision: Precision) -> Result<BenchRow, String> {
        let mut config = self.config.clone();
        config.batch_size = batch_size;
        config.amp = precision.amp();
        config.grad_accum = 1;
        let tf32 = precision.tf32(self.config.tf32);
        let placement = &self.machine.placement;
        super::ffi::set_tf32(tf32 && placement.cuda());
        reset_peak(placement);
        let mut engine = Engine::new(&config, &self.data, placement.device).map_err(|error| error.to_string())?;
        let options = LoaderOptions {
            batch_size,
            threads: config.data.loader_threads,
            prefetch: config.data.prefetch,
            device: placement.device,
            pin_memory: config.data.pin_memory,
            rank: 0,
            ranks: 1,
            min_step_rows: 1,
        };
        let total = self.options.warmup + self.options.steps;
        let sync = || device::synchronize(placement.device);
        let mut phases: [Vec<f64>; 5] = Default::default();
        let sampling = AtomicBool::new(false);
        let stop = AtomicBool::new(false);
        let meter = self.meter();
        let (sampling_ref, stop_ref) = (&sampling, &stop);
        let (outcome, utilization) = std::thread::scope(|scope| {
            let sampler = scope.spawn(move || meter.and_then(|meter| meter.sample(sampling_ref, stop_ref)));
            // Stops the sampler when this closure ends, returning or unwinding.
            let guard = StopOnDrop(&stop);
            let outcome = (|| -> Result<(), String> {
                let mut loader = Loader::random(&self.data.train, total, options);
                for step in 0..total {
                    if step == self.options.warmup {
                        sync();
                        sampling.store(true, Ordering::Relaxed);
                    }
                    let start = Instant::now();
                    let batch = loader.next().ok_or("the loader ran out of batches")?;
                    let fetched = Instant::now();
                    let (mean, weight) = engine.forward(&batch);
                    sync();
                    let forwarded = Instant::now();
                    engine.backward(&mean, weight).map_err(|error| error.to_string())?;
                    sync();
                    let backwarded = Instant::now();
                    engine.apply().map_err(|error| error.to_string())?;
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
                Ok(())
            })();
            drop(guard);
            (outcome, sampler.join().ok().flatten())
        });
        outcome?;
        let total_ms: f64 = phases[4].iter().sum();
        let samples_per_s = (batch_size * self.options.steps) as f64 / (total_ms / 1e3);
        let peak = peak_memory(placement);
        drop(engine);
        let [data_ms, forward_ms, backward_ms, optimizer_ms, step_ms] = phases.map(|mut times| median(&mut times));
        let (gpu_utilization, cpu_utilization) =
            if placement.cuda() { (utilization, None) } else { (None, utilization) };
        let row = BenchRow {
            batch_size,
            amp: precision.name().to_string(),
            tf32,
            status: BenchStatus::Ok,
            error: None,
            data_ms,
            forward_ms,
            backward_ms,
            optimizer_ms,
            step_ms,
            samples_per_s,
            peak_memory_bytes: peak,
            gpu_utilization,
            cpu_utilization,
            tflops: Some(self.machine.flops_per_sample * samples_per_s / 1e12),
        };
        Ok(match (peak, self.options.memory_limit) {
            (Some(peak), Some(limit)) if peak > limit => {
                let message = format!(
                    "out of memory: peak {} over the limit of {}",
                    crate::bench::format_bytes(peak),
                    crate::bench::format_bytes(limit)
                );
                BenchRow { error: Some(message), tf32, ..BenchRow::oom(batch_size, precision.name(), String::new()) }
            }
            _ => row,
        })
    }

    fn meter(&self) -> Option<Meter<'_>> {
        match self.machine.placement.cuda_index() {
            Some(index) => self.nvml.as_ref()?.device_by_index(nvml_index(index)).ok().map(Meter::Gpu),
            None => Some(Meter::Cpu { threads: self.machine.threads.max(1) as f64 }),
        }
    }

    /// The largest batch that trains without running out of memory and stays within
    /// `safety` of the capacity: doubling from the config's batch size, then binary search.
    pub fn auto_batch_size(
        &self,
        precision: Precision,
        max: usize,
        safety: f64,
    ) -> Result<(Option<usize>, Vec<BenchRow>), TrainError> {
        let mut probes = Vec::new();
        let mut failure = None;
        let found = largest_fitting_batch(self.config.batch_size, max, 8, |batch_size| {
            if failure.is_some() {
                return false;
            }
            match self.measure(batch_size, precision) {
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

/// Sets the flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// What the sampler reads: a GPU's utilisation (NVML), or this process's CPU time.
enum Meter<'a> {
    Gpu(nvml_wrapper::Device<'a>),
    Cpu { threads: f64 },
}

impl Meter<'_> {
    /// Mean utilisation (percent) while `sampling`, until `stop`.
    fn sample(&self, sampling: &AtomicBool, stop: &AtomicBool) -> Option<f64> {
        let mut samples = Vec::new();
        let mut last = (Instant::now(), process_cpu_seconds());
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
            let now = (Instant::now(), process_cpu_seconds());
            if sampling.load(Ordering::Relaxed) {
                match self {
                    Meter::Gpu(gpu) => {
                        if let Ok(rates) = gpu.utilization_rates() {
                            samples.push(f64::from(rates.gpu));
                        }
                    }
                    Meter::Cpu { threads } => {
                        if let (Some(before), Some(after)) = (last.1, now.1) {
                            let wall = (now.0 - last.0).as_secs_f64();
                            samples.push((after - before) / wall / threads * 100.0);
                        }
                    }
                }
            }
            last = now;
        }
        (!samples.is_empty()).then(|| samples.iter().sum::<f64>() / samples.len() as f64)
    }
}

/// User plus system CPU time of this process so far, in seconds.
fn process_cpu_seconds() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    let (user, system): (f64, f64) = (fields.get(11)?.parse().ok()?, fields.get(12)?.parse().ok()?);
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten()? as f64;
    Some((user + system) / ticks)
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

/// A panic's message; for tch's `unwrap` of a libtorch error, libtorch's own message.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    let text = if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else if let Some(text) = payload.downcast_ref::<&str>() {
        text.to_string()
    } else {
        return "unknown panic".to_string();
    };
    match text.split_once("on an `Err` value: Torch(\"") {
        Some((_, inner)) => inner.trim_end_matches("\")").replace("\\n", "\n").replace("\\\"", "\""),
        None => text,
    }
}

pub fn is_out_of_memory(message: &str) -> bool {
    let message = message.to_lowercase();
    ["out of memory", "not enough memory", "can't allocate memory", "cannot allocate memory", "std::bad_alloc"]
        .iter()
        .any(|needle| message.contains(needle))
}

fn reset_peak(placement: &Placement) {
    match placement.cuda_index() {
        Some(index) => super::ffi::cuda_reset_peak(index),
        None => {
            // Writing 5 to clear_refs resets the process's peak resident set (VmHWM).
            super::ffi::release_free_host_memory();
            let _ = std::fs::write("/proc/self/clear_refs", "5");
        }
    }
}

fn peak_memory(placement: &Placement) -> Option<u64> {
    match placement.cuda_index() {
        Some(index) => super::ffi::cuda_peak_allocated(index),
        None => proc_status_kib("VmHWM:").map(|kib| kib * 1024),
    }
}

fn free_device_memory(placement: &Placement) {
    if placement.cuda() {
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

#[cfg(test)]
mod tests {
    #[test]
    fn a_tch_unwrap_panic_reads_as_the_libtorch_error() {
        let payload: Box<dyn std::any::Any + Send> = Box::new(String::from(
            "called `Result::unwrap()` on an `Err` value: Torch(\"[enforce fail at alloc_cpu.cpp:127] err == 0. \\\"x\\\"\\nbacktrace\")",
        ));
        assert_eq!(
            super::panic_message(payload.as_ref()),
            "[enforce fail at alloc_cpu.cpp:127] err == 0. \"x\"\nbacktrace"
        );
    }
}
