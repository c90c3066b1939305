//! The worker daemon of `app` (`app --client-only --url URL`): registers with the server,
//! claims the jobs it can place on its GPUs, runs each in a fresh directory and its own
//! process group, streams logs, metrics and GPU telemetry, uploads versioned results and
//! reports outcomes, riding out server outages.
//!
//! [`run`] takes its settings, the GPU inventory and a stop channel (one message: drain;
//! two: kill and hand back), so tests drive it with fake GPUs and no signals.

pub mod accounting;
mod attempt;
pub mod attempt_dirs;
mod checkpoints;
pub mod code;
pub mod code_copy;
pub mod collect;
pub mod config;
pub mod containment;
mod daemon;
pub mod executor;
mod fake_gpus;
pub mod guard;
pub mod hardening;
mod identity;
pub mod inventory;
pub mod job_env;
mod job_processes;
mod launch;
pub mod metric_budget;
pub mod reservations;
pub mod results;
pub mod run_as;
pub mod saves;
pub mod shipper;
mod slots;
pub mod visible;
mod workspace;

pub use config::WorkerConfig;
pub use daemon::run;
pub use inventory::{detect, GpuInventory};

/// The time now, Unix ms (0 before 1970).
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_millis() as i64)
}
