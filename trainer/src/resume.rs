//! Resuming under a worker: when `$APP_CHECKPOINT_DIR` is set (app's worker sets it for every
//! attempt, restoring the job's last uploaded checkpoint into it), the trainer keeps its latest
//! state there (`last.pt` or `last.safetensors`, with its `.json` sidecar) after every epoch, and
//! a run without an explicit `resume:` continues from it. So a job requeued after its worker
//! died picks up at the epoch after the last one uploaded, with no change to its config.

use crate::config::CheckpointFormat;
use std::path::{Path, PathBuf};

/// The variable the worker sets.
pub const CHECKPOINT_DIR_VARIABLE: &str = "APP_CHECKPOINT_DIR";

/// The directory to keep the latest state in, if the worker gave one.
pub fn checkpoint_dir() -> Option<PathBuf> {
    std::env::var_os(CHECKPOINT_DIR_VARIABLE).filter(|dir| !dir.is_empty()).map(PathBuf::from)
}

/// The latest state's file in `dir`.
pub fn latest_path(dir: &Path, format: CheckpointFormat) -> PathBuf {
    dir.join(format!("last.{}", format.extension()))
}

/// The checkpoint to resume from: the config's `resume`, else the latest state in the
/// checkpoint directory when one is there (in either format).
pub fn resume_from(configured: Option<&Path>, dir: Option<&Path>) -> Option<PathBuf> {
    if let Some(path) = configured {
        return Some(path.to_path_buf());
    }
    let dir = dir?;
    [CheckpointFormat::Pt, CheckpointFormat::Safetensors]
        .into_iter()
        .map(|format| latest_path(dir, format))
        .find(|path| path.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_resume_wins_and_otherwise_the_latest_state_is_found_in_either_format() {
        let dir = tempfile::tempdir().unwrap();
        let explicit = Path::new("/runs/model_epoch_004.pt");
        assert_eq!(resume_from(Some(explicit), Some(dir.path())), Some(explicit.to_path_buf()));
        assert_eq!(resume_from(None, Some(dir.path())), None, "an empty directory: a fresh start");
        assert_eq!(resume_from(None, None), None);
        std::fs::write(dir.path().join("last.safetensors"), b"x").unwrap();
        assert_eq!(resume_from(None, Some(dir.path())), Some(dir.path().join("last.safetensors")));
        std::fs::write(dir.path().join("last.pt"), b"x").unwrap();
        assert_eq!(resume_from(None, Some(dir.path())), Some(dir.path().join("last.pt")));
    }
}
