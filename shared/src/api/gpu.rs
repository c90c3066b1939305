//! Per-job GPU accounting and why a queued job waits, as the API carries them.
//!
//! The worker attributes its NVML readings to the jobs on each GPU while they run and sends an
//! attempt's [`GpuUsage`] (and a short [`GpuPoint`] timeline) in the attempt's record, so the
//! result's `result.json`, the job and the leaderboard show them.

use serde::{Deserialize, Serialize};

/// Below this mean utilisation a GPU a job held counts as mostly idle.
pub const IDLE_UTILIZATION: f64 = 30.0;

/// The note an attempt gets when a GPU it held was mostly idle.
pub const IDLE_NOTE: &str = "GPU mostly idle: input-bound?";

/// What one attempt used of the GPUs it held, measured by its worker.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuUsage {
    /// The GPUs it held (NVML indices on its worker).
    pub gpus: Vec<u32>,
    /// Readings taken while it ran.
    pub samples: u32,
    /// Mean of its utilisation, percent: each reading is the mean over its GPUs of each GPU's
    /// utilisation divided equally among the jobs this worker ran on that GPU at the time.
    pub utilization_mean: Option<f64>,
    /// 95th percentile of the same readings (nearest rank).
    pub utilization_p95: Option<f64>,
    /// The most GPU memory its processes held at once, all its GPUs together, bytes (NVML's
    /// per-process figures; the GPU's own figure for a GPU it held alone when NVML lists no
    /// process, as in a container).
    pub memory_peak: Option<u64>,
    /// GPU time held: wall time times GPUs, a GPU shared with other jobs counted in equal parts.
    pub gpu_hours: f64,
    /// GPUs whose own mean utilisation stayed under [`IDLE_UTILIZATION`] while it held them.
    #[serde(default)]
    pub idle_gpus: Vec<u32>,
}

/// One point of an attempt's GPU timeline (a few hundred at most over its run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuPoint {
    /// Unix ms.
    pub at: i64,
    /// Its share of utilisation, percent (as in [`GpuUsage::utilization_mean`]).
    pub utilization: Option<f64>,
    /// GPU memory its processes held, bytes.
    pub memory: Option<u64>,
}

/// Why a queued job has not started.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiting {
    /// Queued jobs dispatched before it (priority, then age): 0 means it is next. Set when some
    /// connected worker could run it and it only waits for room.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
    /// Why no connected worker can ever run it, as a sentence (`it asks for 4 GPUs; the largest
    /// connected worker has 2`); it stays queued until such a worker registers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}
