//! The environment a job runs in: the worker's own without its `APP_*` settings and
//! credentials, and the `APP_*`, `CUDA_*` and rendezvous variables the worker sets for it.

use crate::attempt_dirs::AttemptDirs;
use shared::api::ClaimedJob;
use std::path::Path;

/// `APP_PARAM_<NAME>`: upper case, anything but letters and digits becomes `_`.
pub fn param_variable(name: &str) -> String {
    let mut variable = String::from("APP_PARAM_");
    variable.extend(name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }));
    variable
}

/// The longest `APP_PARAMS` set (each `APP_PARAM_<NAME>` is set whatever its length).
const MAX_PARAMS_VARIABLE: usize = 32 * 1024;

/// The environment a job sees, besides the worker's own.
pub fn environment(
    job: &ClaimedJob,
    dirs: &AttemptDirs,
    gpus: &[u32],
    master_port: Option<u16>,
) -> Vec<(String, String)> {
    let path = |path: &Path| path.to_string_lossy().to_string();
    let mut env = vec![
        ("APP_JOB_ID".to_string(), job.id.to_string()),
        ("APP_SWEEP".to_string(), job.sweep.clone()),
        ("APP_INDEX".to_string(), job.index.to_string()),
        ("APP_ATTEMPT".to_string(), job.attempt.to_string()),
        ("APP_CONFIG".to_string(), path(&dirs.config)),
        ("APP_OUTPUT_DIR".to_string(), path(&dirs.output)),
        ("APP_METRICS_FILE".to_string(), path(&dirs.metrics)),
        ("APP_CAPTURE_FILE".to_string(), path(&dirs.capture)),
        ("APP_CHECKPOINT_DIR".to_string(), path(&dirs.checkpoint)),
        // CUDA numbers GPUs by speed unless told otherwise; NVML (and --gpus) by PCI bus.
        ("CUDA_DEVICE_ORDER".to_string(), "PCI_BUS_ID".to_string()),
        // Empty for CPU jobs: they must not wander onto GPU 0.
        ("CUDA_VISIBLE_DEVICES".to_string(), gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(",")),
    ];
    if let Some(params) = job.params.as_object() {
        for (name, value) in params {
            let text = match value {
                serde_json::Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            env.push((param_variable(name), text));
        }
    }
    // The run's parameters as one JSON object: what `wandb.config` holds (collect::python).
    // Left out when large: Linux refuses a command whose one variable is over 128 KiB.
    let params = job.params.to_string();
    if params.len() <= MAX_PARAMS_VARIABLE {
        env.push(("APP_PARAMS".to_string(), params));
    }
    if job.form == shared::sweep::SweepForm::Wandb {
        env.push(("WANDB_SWEEP_PARAM_PATH".to_string(), path(&dirs.wandb_params)));
    }
    if gpus.len() > 1 {
        env.push(("WORLD_SIZE".to_string(), gpus.len().to_string()));
        env.push(("MASTER_ADDR".to_string(), "127.0.0.1".to_string()));
        env.push(("MASTER_PORT".to_string(), master_port.unwrap_or(29500).to_string()));
    }
    env
}

/// `PATH` with the directory of this worker's own binary first, so `app` in a job's command
/// (the `app train` of a `train:` sweep) is the same build as the worker running it.
pub fn path_with(own_binary: &Path, path: Option<&std::ffi::OsStr>) -> Option<(String, String)> {
    let dir = own_binary.parent()?.to_str()?.to_string();
    let rest = path.map(|path| path.to_string_lossy().into_owned()).unwrap_or_default();
    Some(("PATH".to_string(), if rest.is_empty() { dir } else { format!("{dir}:{rest}") }))
}

/// A free TCP port on loopback for `torchrun`'s rendezvous.
pub fn free_port() -> Option<u16> {
    std::net::TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok().map(|address| address.port())
}

/// The worker's own environment as jobs inherit it: without any `APP_*` variable. The worker
/// and the server read their credentials and settings from those (`APP_TOKEN`,
/// `APP_WORKER_TOKEN`, `APP_USER_TOKEN`, the `*_TOKEN_FILE`s, `APP_TLS_KEY`, `APP_URL`, ...), and
/// a job runs user code whose output ends up in a log: it gets only the `APP_*` variables the
/// worker sets for it (see `environment`).
pub fn inherited_environment() -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    std::env::vars_os().filter(|(key, _)| !key.as_encoded_bytes().starts_with(b"APP_")).collect()
}
