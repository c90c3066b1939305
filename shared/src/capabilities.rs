//! What a worker can run besides its GPUs: whether its `app` binary has the built-in trainer
//! (the cargo feature `torch`), whether that trainer can use CUDA there, and which libtorch it
//! loads. A worker says so in every capacity it reports; a job that runs the trainer is placed
//! only where it is built in (see [`crate::placement::place`]).

use serde::{Deserialize, Serialize};

/// What the worker's own `app` binary can run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// `app train` and `app bench` are built in (the `torch` feature).
    #[serde(default)]
    pub trainer: bool,
    /// Whether libtorch found a CUDA device there (`None`: not known, e.g. no trainer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<bool>,
    /// Why CUDA is not usable, as the trainer explains it (a missing library, no driver).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_error: Option<String>,
    /// The torch version of the libtorch the trainer loads (`2.11.0+cu128`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch: Option<String>,
    /// How an attempt gets its copy of a code snapshot there (`overlay` or `copy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_copy: Option<String>,
}

/// Whether a job's command runs the built-in trainer: the word `app` (or a path ending in
/// `/app`) followed by `train` or `bench`, anywhere in the command's words (a `train:` sweep's
/// `app train --config "$APP_CONFIG"`, or a command sweep that calls it). A command the shell
/// could not split runs nothing of ours as far as can be told.
pub fn runs_trainer(command: &str) -> bool {
    let Some(words) = shlex::split(command) else { return false };
    words.windows(2).any(|pair| {
        let program = pair[0].rsplit('/').next().unwrap_or_default();
        program == "app" && matches!(pair[1].as_str(), "train" | "bench")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trainer_is_recognised_in_commands_that_run_it() {
        assert!(runs_trainer("app train --config \"$APP_CONFIG\""));
        assert!(runs_trainer("cd /srv/x && /opt/bin/app bench --config b.yaml"));
        assert!(runs_trainer("OMP_NUM_THREADS=4 app train --set optimizer.lr=0.1"));
        assert!(!runs_trainer("python train.py --lr 0.1"));
        assert!(!runs_trainer("myapp train"));
        assert!(!runs_trainer("app status"));
        assert!(!runs_trainer("echo 'unbalanced"));
    }

    #[test]
    fn older_capacities_without_capabilities_read_as_none() {
        let read: Capabilities = serde_json::from_str("{}").unwrap();
        assert_eq!(read, Capabilities::default());
        assert!(!read.trainer);
    }
}
