//! Everything that touches libtorch (feature `torch`).

pub mod amp;
pub mod bench;
pub mod data;
pub mod device;
mod ffi;
pub mod loader;
pub mod model;
pub mod step;
pub mod train;

pub use ffi::load_cuda;

/// A failure while training or benchmarking, as one line.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("{0}")]
    Torch(String),
    #[error("{what}: {error}")]
    Io { what: String, error: std::io::Error },
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
