//! Per-job GPU accounting: the worker's NVML readings attributed to the attempts holding each
//! GPU, summed up per attempt when its process ends. Pure bookkeeping: the daemon takes the
//! readings (`GpuInventory`) and finds whose each process is (`job_processes`).
//!
//! Utilisation is per GPU in NVML, so a GPU's utilisation is divided equally among this
//! worker's attempts on it; memory is per process, so an attempt's memory is what its own
//! processes hold (or, for a GPU it holds alone where NVML lists no process, the GPU's). GPU
//! time is wall time times GPUs held, a shared GPU counted in equal parts. A GPU whose own
//! utilisation averaged under [`IDLE_UTILIZATION`] while the attempt held it is flagged.

use shared::api::{GpuPoint, GpuSample, GpuUsage, JobAttempt, IDLE_NOTE, IDLE_UTILIZATION};
use std::collections::{BTreeMap, HashMap};

/// Timeline points kept per attempt: older points are merged in pairs past twice this.
pub const MAX_POINTS: usize = 240;
/// Readings needed before a GPU can be called idle: a short job is mostly start-up.
pub const MIN_READINGS_FOR_IDLE: u32 = 5;

/// A process on a GPU, with the attempt it belongs to when it is one of this worker's jobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributed {
    pub gpu: u32,
    pub memory: Option<u64>,
    pub attempt: Option<JobAttempt>,
}

/// An attempt's account once it ended: what goes into its record and its notes.
#[derive(Debug, Clone, PartialEq)]
pub struct Accounted {
    pub usage: GpuUsage,
    pub timeline: Vec<GpuPoint>,
    /// The "GPU mostly idle" note, when a GPU it held was.
    pub note: Option<String>,
}

#[derive(Debug, Default)]
struct Account {
    gpus: Vec<u32>,
    /// When its last reading was taken (its start before the first).
    last_at: i64,
    /// GPUs it held at its last reading, a shared one counted in part.
    last_share: f64,
    gpu_ms: f64,
    readings: u32,
    utilization: Vec<f64>,
    /// Per GPU: sum and count of the GPU's own utilisation readings.
    busy: BTreeMap<u32, (f64, u32)>,
    memory_peak: Option<u64>,
    timeline: Vec<GpuPoint>,
}

/// The accounts of the attempts that hold GPUs on this worker.
#[derive(Debug, Default)]
pub struct Accounting {
    accounts: HashMap<JobAttempt, Account>,
}

impl Accounting {
    /// Starts accounting for an attempt placed on `gpus` at `at` (Unix ms); a CPU job has none.
    pub fn begin(&mut self, attempt: JobAttempt, gpus: &[u32], at: i64) {
        if gpus.is_empty() {
            return;
        }
        let account = Account { gpus: gpus.to_vec(), last_at: at, last_share: gpus.len() as f64, ..Account::default() };
        self.accounts.insert(attempt, account);
    }

    /// Whether any attempt holds a GPU (readings are worth taking).
    pub fn is_active(&self) -> bool {
        !self.accounts.is_empty()
    }

    /// Takes one reading of the GPUs and their processes at `at` into every account.
    pub fn record(&mut self, at: i64, gpus: &[GpuSample], processes: &[Attributed]) {
        let mut holders: HashMap<u32, u32> = HashMap::new();
        for account in self.accounts.values() {
            for gpu in &account.gpus {
                *holders.entry(*gpu).or_default() += 1;
            }
        }
        for (attempt, account) in &mut self.accounts {
            let mut shares = Vec::new();
            let mut memory: Option<u64> = None;
            let mut held = 0.0;
            for index in &account.gpus {
                let sharers = f64::from(holders.get(index).copied().unwrap_or(1).max(1));
                held += 1.0 / sharers;
                let Some(sample) = gpus.iter().find(|sample| sample.index == *index) else { continue };
                if let Some(percent) = sample.utilization {
                    shares.push(f64::from(percent) / sharers);
                    let busy = account.busy.entry(*index).or_default();
                    busy.0 += f64::from(percent);
                    busy.1 += 1;
                }
                let on_gpu: Vec<&Attributed> = processes.iter().filter(|process| process.gpu == *index).collect();
                let own: Option<u64> = on_gpu
                    .iter()
                    .filter(|process| process.attempt == Some(*attempt))
                    .filter_map(|process| process.memory)
                    .reduce(|a, b| a.saturating_add(b));
                // Where NVML lists no process at all (a container) a GPU held alone is all its own.
                let alone = on_gpu.is_empty() && sharers == 1.0;
                if let Some(bytes) = own.or(alone.then_some(sample.memory_used)) {
                    memory = Some(memory.unwrap_or(0).saturating_add(bytes));
                }
            }
            let utilization = (!shares.is_empty()).then(|| shares.iter().sum::<f64>() / shares.len() as f64);
            if let Some(percent) = utilization {
                account.utilization.push(percent);
            }
            if let Some(bytes) = memory {
                account.memory_peak = Some(account.memory_peak.map_or(bytes, |peak| peak.max(bytes)));
            }
            account.gpu_ms += (at - account.last_at).max(0) as f64 * held;
            account.last_at = at;
            account.last_share = held;
            account.readings += 1;
            account.timeline.push(GpuPoint { at, utilization, memory });
            if account.timeline.len() >= 2 * MAX_POINTS {
                account.timeline = halve(&account.timeline);
            }
        }
    }

    /// Ends an attempt's account at `at` (`None` for an attempt without GPUs).
    pub fn end(&mut self, attempt: JobAttempt, at: i64) -> Option<Accounted> {
        let account = self.accounts.remove(&attempt)?;
        let gpu_ms = account.gpu_ms + (at - account.last_at).max(0) as f64 * account.last_share;
        let mut sorted = account.utilization.clone();
        sorted.sort_by(f64::total_cmp);
        let mean = (!sorted.is_empty()).then(|| sorted.iter().sum::<f64>() / sorted.len() as f64);
        let idle: Vec<(u32, f64)> = account
            .busy
            .iter()
            .filter(|(_, (_, count))| *count >= MIN_READINGS_FOR_IDLE)
            .map(|(index, (sum, count))| (*index, sum / f64::from(*count)))
            .filter(|(_, mean)| *mean < IDLE_UTILIZATION)
            .collect();
        let note = (!idle.is_empty()).then(|| {
            let gpus: Vec<String> =
                idle.iter().map(|(index, mean)| format!("GPU {index} averaged {mean:.0}% busy")).collect();
            format!("{IDLE_NOTE} {} over the run (under {IDLE_UTILIZATION:.0}%)", gpus.join(", "))
        });
        let usage = GpuUsage {
            gpus: account.gpus,
            samples: account.readings,
            utilization_mean: mean.map(round),
            utilization_p95: percentile(&sorted, 0.95).map(round),
            memory_peak: account.memory_peak,
            gpu_hours: gpu_ms / 3_600_000.0,
            idle_gpus: idle.iter().map(|(index, _)| *index).collect(),
        };
        let mut timeline = account.timeline;
        while timeline.len() > MAX_POINTS {
            timeline = halve(&timeline);
        }
        Some(Accounted { usage, timeline, note })
    }
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], fraction: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (fraction * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

fn round(value: f64) -> f64 {
    (value * 10.0).round() / 10.0
}

/// Merges neighbouring points in pairs: the first time, the mean utilisation, the most memory.
fn halve(points: &[GpuPoint]) -> Vec<GpuPoint> {
    points
        .chunks(2)
        .map(|pair| {
            let known: Vec<f64> = pair.iter().filter_map(|point| point.utilization).collect();
            GpuPoint {
                at: pair[0].at,
                utilization: (!known.is_empty()).then(|| known.iter().sum::<f64>() / known.len() as f64),
                memory: pair.iter().filter_map(|point| point.memory).max(),
            }
        })
        .collect()
}

#[cfg(test)]
#[path = "accounting_tests.rs"]
mod tests;
