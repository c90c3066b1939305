//! Code shipped with a sweep, the environment its jobs run in, and job checkpoints.
//!
//! `app submit` packs the project into a snapshot named by its digest (see the `archive`
//! crate), uploads it unless the server has it (`GET /api/code/{digest}`, `POST /api/code`) and
//! names it in the submission; every job of the sweep then carries a [`Workspace`] to its worker.
//! Checkpoints go the other way: a running attempt's `$APP_CHECKPOINT_DIR` is uploaded now and
//! then (`PUT /api/jobs/{id}/attempts/{n}/checkpoint`), and the next attempt gets it back.

use serde::{Deserialize, Serialize};

use super::JobId;

/// A code snapshot the server holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeInfo {
    /// SHA-256 (hex) of the snapshot's uncompressed tar stream.
    pub digest: String,
    /// Size of the compressed archive as stored.
    pub packed_bytes: u64,
}

/// The code a sweep's jobs run: which snapshot, where in it they start, and what it was packed
/// from (recorded for reproducibility, as ClearML records a run's commit and diff).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeSnapshot {
    pub digest: String,
    /// The job's working directory inside the snapshot, `/`-separated (empty: its root): the
    /// directory `app submit` ran in, so `python train.py` means what it meant there.
    #[serde(default)]
    pub dir: String,
    /// The project's git commit (`HEAD`) when it was packed; none outside git or before the
    /// first commit.
    #[serde(default)]
    pub commit: Option<String>,
    /// The work tree differed from `commit`: changed or untracked files were packed.
    #[serde(default)]
    pub dirty: bool,
}

/// Where and how a sweep's jobs run: the sweep file's `code`, `workdir`, `env` and `setup`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workspace {
    /// Unpacked fresh for every attempt as its working directory; none: an empty directory.
    #[serde(default)]
    pub code: Option<CodeSnapshot>,
    /// A fixed directory on the worker to run in instead (a shared filesystem).
    #[serde(default)]
    pub workdir: Option<String>,
    /// Extra variables, set after the worker's own (never `APP_*`).
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// A shell line run before the command, in the same shell.
    #[serde(default)]
    pub setup: Option<String>,
    /// `capture: none`: metrics only from `APP_METRICS_FILE` and `metrics_regex`, not from the
    /// loggers a script calls (W&B's API, TensorBoard, Lightning, Hugging Face, MLflow).
    #[serde(default)]
    pub capture_off: bool,
    /// `metrics_regex`: patterns over the job's printed lines (see `shared::metric_pattern`).
    #[serde(default)]
    pub metrics_regex: Vec<String>,
}

/// A job's stored checkpoint: the newest one an attempt of it uploaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointInfo {
    pub job_id: JobId,
    /// The attempt that uploaded it.
    pub attempt: u32,
    /// Size of the compressed archive.
    pub size: u64,
    /// SHA-256 (hex) of the compressed archive.
    pub sha256: String,
    pub uploaded_at: i64,
}

/// Query of the worker's checkpoint upload and download.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointQuery {
    pub worker_id: super::WorkerId,
}

/// Headers of a checkpoint download: the attempt that uploaded it and its SHA-256.
pub const CHECKPOINT_ATTEMPT_HEADER: &str = "x-app-checkpoint-attempt";
pub const CHECKPOINT_SHA256_HEADER: &str = "x-app-checkpoint-sha256";
