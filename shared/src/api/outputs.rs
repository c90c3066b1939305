//! What running jobs send back: log bytes, metric points, GPU telemetry and versioned result
//! files; and how they are read.
//!
//! Logs and metrics are shipped from files the worker keeps on disk (the job's log and its
//! `APP_METRICS_FILE`), so every upload names the byte offset it starts (logs) or ends
//! (metrics) at: a retried upload after a lost answer is recognised and not stored twice.

use super::{JobId, WorkerId};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// Query of `POST /api/jobs/{id}/log`; the body is raw log bytes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogAppend {
    pub worker_id: WorkerId,
    pub attempt: u32,
    /// Where in the attempt's log the body starts.
    pub offset: u64,
}

/// How many bytes of the worker's log file the server has accepted for the attempt. Past the
/// per-job log cap this keeps growing while storage stops (the worker moves on either way).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct LogAck {
    pub length: u64,
}

/// Query of `GET /api/jobs/{id}/log`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LogQuery {
    /// Default: the latest attempt.
    pub attempt: Option<u32>,
    #[serde(default)]
    pub offset: u64,
    /// Wait up to this long for bytes past `offset` while the attempt runs (follow mode).
    #[serde(default)]
    pub wait_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogChunk {
    pub attempt: u32,
    pub offset: u64,
    /// The bytes from `offset` on, as text (invalid UTF-8 replaced).
    pub text: String,
    /// Offset after `text`: pass it as the next `offset`.
    pub next_offset: u64,
    /// The attempt has ended: no more bytes will come.
    pub finished: bool,
}

/// One value a job wrote to its metrics file (`{"step": 3, "val_loss": 0.12}` gives one point
/// per numeric key other than `step`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricPoint {
    pub step: Option<i64>,
    pub name: String,
    pub value: f64,
}

/// Body of `POST /api/jobs/{id}/metrics`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MetricsBatch {
    pub worker_id: WorkerId,
    pub attempt: u32,
    /// Byte offset in the metrics file just after the lines these points came from.
    pub offset: u64,
    pub points: Vec<MetricPoint>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct MetricsAck {
    /// The metrics-file offset the server has stored up to.
    pub offset: u64,
}

/// Last, lowest and highest value of one metric over a job's latest attempt.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MetricSummary {
    pub last: f64,
    pub min: f64,
    pub max: f64,
    /// Step of the last value, if the job gave steps.
    pub step: Option<i64>,
    pub count: u64,
}

/// All points of one metric of a job's latest attempt, in the order written.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MetricSeries {
    pub name: String,
    pub steps: Vec<Option<i64>>,
    pub values: Vec<f64>,
}

/// One NVML reading of one GPU, carried by heartbeats.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuSample {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total: u64,
    pub memory_used: u64,
    /// Percent, 0-100.
    pub utilization: Option<u32>,
    /// Degrees Celsius.
    pub temperature: Option<u32>,
    pub power_watts: Option<f64>,
    /// Unix ms; set by the server when stored.
    #[serde(default)]
    pub at: i64,
}

/// A file of a result version: relative path (with `/`), size and SHA-256 (hex).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

/// What the worker knows about a finished attempt.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub exit_code: Option<i32>,
    /// How the attempt ended, in words (`exited with code 0`, `killed: timeout`, ...).
    pub outcome: String,
    pub started_at: i64,
    pub finished_at: i64,
    pub worker: String,
    pub hostname: String,
    /// Names of the GPUs it ran on (empty for CPU jobs).
    pub gpus: Vec<String>,
    /// `CUDA_VISIBLE_DEVICES` as set for the job.
    pub cuda_visible_devices: Option<String>,
    /// The git commit of the code it ran: the shipped snapshot's, or `git rev-parse HEAD` of
    /// the job's working directory when that is a git checkout.
    pub git_commit: Option<String>,
    /// The code snapshot it ran (digest, directory, commit, dirty), when code was shipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<super::CodeSnapshot>,
    /// The attempt whose checkpoint it started from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_from: Option<u32>,
    /// What it used of its GPUs (none for a CPU job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_usage: Option<super::GpuUsage>,
    /// Its GPU use over its run, a few hundred points at most.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_timeline: Vec<super::GpuPoint>,
}

/// Query of `PUT /api/jobs/{id}/attempts/{attempt}/files/{path}`; the body is the file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileUploadQuery {
    pub worker_id: WorkerId,
}

/// Body of `POST /api/jobs/{id}/attempts/{attempt}/result`: seals the uploaded files as
/// result version `v<attempt>`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResultUpload {
    pub worker_id: WorkerId,
    pub manifest: Vec<ManifestEntry>,
    pub record: AttemptRecord,
}

/// A stored, immutable result version of a job (`results/<sweep>/<index>/v<attempt>/`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResultVersion {
    pub job_id: JobId,
    pub attempt: u32,
    /// Path relative to the server's data dir.
    pub path: String,
    pub files: Vec<ManifestEntry>,
    pub record: AttemptRecord,
    pub params: Value,
    pub metrics: BTreeMap<String, MetricSummary>,
    pub stored_at: i64,
}

/// Query of `GET /api/sweeps/{sweep}/summary`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SummaryQuery {
    /// Keep only the best `top` runs.
    pub top: Option<u32>,
    /// `json` (default) or `csv`.
    pub format: Option<String>,
}

/// One run in a sweep's leaderboard.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SummaryRow {
    pub rank: Option<u64>,
    pub job_id: JobId,
    pub index: u64,
    pub status: crate::job::JobStatus,
    pub params: Value,
    /// Final (last) and best value of each metric.
    pub metrics: BTreeMap<String, MetricSummary>,
    /// The sweep metric's best value (min or max by its goal), the sort key.
    pub score: Option<f64>,
    /// Set for a run stopped early: it is listed after the ranked runs, without a rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_early: Option<super::StoppedEarly>,
    /// What its latest attempt used of its GPUs, once ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_usage: Option<super::GpuUsage>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepSummary {
    pub sweep: String,
    pub metric: Option<crate::sweep::Metric>,
    pub rows: Vec<SummaryRow>,
}
