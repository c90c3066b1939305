//! Everything that touches libtorch (feature `torch`).

pub mod amp;
pub mod bench;
pub mod checkpoint;
pub mod data;
pub mod device;
mod ffi;
pub mod launch;
pub mod loader;
pub mod model;
pub mod saver;
pub mod step;
pub mod train;

pub use ffi::ddp::ProcessGroup;
pub use ffi::load_cuda;

/// A failure while training or benchmarking, as one line.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("{0}")]
    Torch(String),
    /// A collective between the ranks failed: a peer died, or did not answer in time.
    #[error("data-parallel collective failed (a rank died or timed out): {0}")]
    Ddp(String),
    /// A rank's process ended badly: with its own error line, or killed (`how` says by what).
    #[error("{}", match error {
        Some(error) => format!("rank {rank} failed ({how}): {error}"),
        None => format!("rank {rank} died ({how})"),
    })]
    RankDied { rank: usize, how: String, error: Option<String> },
    #[error("{what}: {error}")]
    Io { what: String, error: std::io::Error },
    /// SIGTERM stopped the run after an epoch (`crate::stop`); the text says which.
    #[error("{0}")]
    Stopped(String),
}

impl From<tch::TchError> for TrainError {
    fn from(error: tch::TchError) -> Self {
        TrainError::Torch(first_line(&error.to_string()))
    }
}

/// libtorch errors carry a C++ backtrace after the first line.
pub fn first_line(text: &str) -> String {
    text.lines().find(|line| !line.trim().is_empty()).unwrap_or(text).trim().to_string()
}

pub fn io_error(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> TrainError {
    let what = what.into();
    move |error| TrainError::Io { what, error }
}

/// How this `app train` process runs: alone, as the launcher of this machine's ranks, or as
/// one rank (see `crate::ranks`). Asks CUDA how many GPUs are visible unless on the CPU.
pub fn role(config: &crate::TrainConfig) -> Result<crate::ranks::Role, TrainError> {
    let gpus = device::visible_gpus(config)?;
    Ok(crate::ranks::role(&crate::ranks::RankEnv::from_env(), config.ddp, gpus)?)
}
