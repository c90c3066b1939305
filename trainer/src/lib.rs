//! The built-in trainer behind `app train` and `app bench`: an MLP or a small CNN on CSV,
//! `.npy`, `.safetensors` or synthetic data, with mixed precision, dynamic loss scaling,
//! background data loading and data parallelism (one process per GPU, gradients all-reduced
//! over libtorch's c10d).
//!
//! The pure parts (config parsing and validation, LR schedules, the loss-scaler state machine,
//! early stopping, the bench recommendation and batch-size search, batch planning, the rank
//! decision) build and are tested without
//! libtorch. Everything that touches tensors is in `torch`, behind the cargo feature `torch`.

pub mod batches;
pub mod bench;
pub mod config;
pub mod early;
pub mod ranks;
pub mod resume;
pub mod scaler;
pub mod schedule;
pub mod stop;

#[cfg(feature = "torch")]
pub mod torch;

pub use config::{ConfigError, TrainConfig};

/// The line `app train` and `app bench` print when built without the feature.
pub const NOT_BUILT: &str = "this app was built without the trainer: run scripts/setup-torch.sh, \
then build with `cargo build --release --features torch`";
