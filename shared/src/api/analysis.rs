//! What the sweep page analyses: which way each metric improves, how much each parameter
//! matters, the best result over time, when the sweep will finish, and a job's GPUs over its
//! attempt. The server computes all of it; the page only draws.

use super::{GpuSample, JobId, SweepSummary};
use crate::sweep::Goal;
use serde::{Deserialize, Serialize};

/// Why a metric is taken to improve in one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DirectionBasis {
    /// It is the sweep's metric, whose goal the sweep file declares.
    SweepGoal,
    /// Its name says so (`val_acc` is maximised, `train_loss` minimised).
    Name,
    /// Neither: the page shows its min and max, not a "best".
    Unknown,
}

/// Which way one metric of a sweep improves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetricDirection {
    pub name: String,
    /// `None` when unknown.
    pub goal: Option<Goal>,
    pub basis: DirectionBasis,
}

/// `GET /api/sweeps/{sweep}/summary` as JSON: the leaderboard and the direction of every
/// metric in it, so each metric's "best" column is its max or its min as it should be.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Leaderboard {
    #[serde(flatten)]
    pub summary: SweepSummary,
    /// One entry per metric any row has, by name.
    pub directions: Vec<MetricDirection>,
}

/// Query of `GET /api/sweeps/{sweep}/analysis`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AnalysisQuery {
    /// The metric to analyse (default: the sweep's).
    pub metric: Option<String>,
}

/// How much one parameter alone explains of the metric's variation across runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParamImportance {
    /// Dotted name of a (possibly nested) parameter: `model.lr`.
    pub name: String,
    /// Share of the metric's variance explained by this parameter alone, 0 to 1, corrected
    /// for chance (a parameter that does not matter scores near 0).
    pub importance: f64,
    /// Spearman rank correlation of a numeric parameter with the metric (-1 to 1); `None`
    /// for a categorical one.
    pub correlation: Option<f64>,
    /// How many distinct values (or bins, for a continuous parameter) the runs took.
    pub groups: u32,
}

/// One finished run on the best-so-far curve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BestSoFarPoint {
    /// When the run finished (Unix ms).
    pub at: i64,
    pub job_id: JobId,
    /// The run's best value of the metric.
    pub value: f64,
    /// The best value of every run finished by then.
    pub best: f64,
}

/// When a sweep's remaining jobs will have run, from how long its runs take and how many run
/// at once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepEta {
    pub queued: u64,
    pub running: u64,
    /// Runs that ran and ended (succeeded, failed, or cancelled while running).
    pub finished: u64,
    /// Mean run time of the finished runs, ms.
    pub mean_run_ms: Option<u64>,
    /// Estimated time from now until no job is queued or running, ms; `None` when it cannot be
    /// estimated (nothing has finished yet, or nothing runs while jobs wait).
    pub remaining_ms: Option<u64>,
    /// Why there is no estimate, or what it assumes, in words.
    pub note: String,
}

/// `GET /api/sweeps/{sweep}/analysis`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepAnalysis {
    pub sweep: String,
    /// The metric analysed and which way it improves; `None` when no run reported a metric.
    pub metric: Option<MetricDirection>,
    /// How importance is computed, in words, for the page to name.
    pub importance_method: String,
    /// Parameters that vary across the runs, most important first.
    pub importance: Vec<ParamImportance>,
    /// Runs whose value went into the importance.
    pub runs_used: u64,
    /// Finished runs in order of finishing, with the best value so far (empty when the
    /// metric's direction is unknown).
    pub best_so_far: Vec<BestSoFarPoint>,
    pub eta: SweepEta,
}

/// Query of `GET /api/jobs/{id}/gpu`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct JobGpuQuery {
    /// Default: the latest attempt that started.
    pub attempt: Option<u32>,
}

/// The GPU readings of the GPUs one attempt held, while it held them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobGpuUsage {
    pub job_id: JobId,
    pub attempt: u32,
    pub worker: Option<String>,
    pub gpus: Vec<u32>,
    /// The attempt's window (Unix ms); `to` is `None` while it runs.
    pub from: i64,
    pub to: Option<i64>,
    /// GPU memory the job declared per GPU (bytes), when it shares GPUs.
    pub gpu_memory: Option<u64>,
    /// Readings of the attempt's GPUs within its window, oldest first. They describe the whole
    /// GPU, not the job's share of it.
    pub samples: Vec<GpuSample>,
    /// Other jobs that held one of these GPUs during the window (their readings are mixed in).
    pub shared_with: Vec<JobId>,
    /// How long the server keeps readings, ms: older attempts have none left.
    pub retention_ms: u64,
    /// The attempt's own share, as its worker measured it (per-job accounting), once it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<super::GpuUsage>,
    /// The attempt's own utilisation and memory over its run, from the same accounting; when
    /// empty, `samples` (whole-GPU readings) are all there is.
    #[serde(default)]
    pub timeline: Vec<super::GpuPoint>,
}
