//! What this binary can run, as its worker tells the server: the built-in trainer when it was
//! built with the `torch` feature, and then whether libtorch finds CUDA here and which torch it
//! loads. Those two are asked of a child process (`app probe-trainer`, hidden), so the worker
//! daemon itself never loads libtorch or initialises CUDA (see the design: the trainer is
//! always a separate process).

use shared::capabilities::Capabilities;
use std::time::Duration;

/// How long the probe may take (loading libtorch and its CUDA libraries takes a few seconds).
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);

/// This binary's capabilities; the CUDA and torch details only with the trainer built in.
pub async fn detect() -> Capabilities {
    if !cfg!(feature = "torch") {
        return Capabilities::default();
    }
    let mut capabilities = Capabilities { trainer: true, ..Capabilities::default() };
    match probe_child().await {
        Ok(found) => {
            capabilities.cuda = found.cuda;
            capabilities.cuda_error = found.cuda_error;
            capabilities.torch = found.torch;
        }
        Err(error) => {
            tracing::warn!(%error, "could not ask the trainer what it finds here; advertising it without details")
        }
    }
    tracing::info!(
        cuda = ?capabilities.cuda, torch = ?capabilities.torch, why = ?capabilities.cuda_error,
        "the built-in trainer is available"
    );
    capabilities
}

async fn probe_child() -> anyhow::Result<Capabilities> {
    let exe = std::env::current_exe()?;
    let mut command = tokio::process::Command::new(exe);
    command.arg("probe-trainer").stdin(std::process::Stdio::null()).kill_on_drop(true);
    // Not the worker's credentials (see worker::hardening).
    command.env_clear().envs(worker::job_env::inherited_environment());
    let output = tokio::time::timeout(PROBE_TIMEOUT, command.output())
        .await
        .map_err(|_| anyhow::anyhow!("`app probe-trainer` took longer than {PROBE_TIMEOUT:?}"))??;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        anyhow::bail!("`app probe-trainer` failed ({}): {}", output.status, stderr.trim());
    }
    Ok(serde_json::from_slice(&output.stdout)?)
}

/// `app probe-trainer`: prints what the trainer finds here as JSON (the fields of
/// [`Capabilities`]).
#[cfg(feature = "torch")]
pub fn probe() -> anyhow::Result<()> {
    let (cuda, cuda_error) = match trainer::torch::device::cuda_status() {
        Ok(count) => (Some(count > 0), None),
        Err(why) => (Some(false), Some(why)),
    };
    let found = Capabilities { trainer: true, cuda, cuda_error, torch: torch_version(), code_copy: None };
    println!("{}", serde_json::to_string(&found)?);
    Ok(())
}

#[cfg(not(feature = "torch"))]
pub fn probe() -> anyhow::Result<()> {
    anyhow::bail!(trainer::NOT_BUILT)
}

/// The version of the libtorch this process loaded: `version.py` of the torch wheel it comes
/// from (`__version__ = '2.11.0+cu128'`), or `build-version` of a libtorch archive.
#[cfg(feature = "torch")]
fn torch_version() -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let library = maps.lines().filter_map(|line| line.split_whitespace().nth(5)).find(|path| {
        std::path::Path::new(path).file_name().is_some_and(|name| name.to_string_lossy().starts_with("libtorch_cpu"))
    })?;
    let root = std::path::Path::new(library).parent()?.parent()?;
    if let Ok(text) = std::fs::read_to_string(root.join("version.py")) {
        return version_of_wheel(&text);
    }
    let text = std::fs::read_to_string(root.join("build-version")).ok()?;
    Some(text.trim().to_string()).filter(|version| !version.is_empty())
}

/// `2.11.0+cu128` from a torch wheel's `version.py`.
#[cfg_attr(not(feature = "torch"), allow(dead_code))]
fn version_of_wheel(text: &str) -> Option<String> {
    let line = text.lines().find(|line| line.trim_start().starts_with("__version__"))?;
    let value = line.split_once('=')?.1.trim();
    let value = value.trim_matches(|c| c == '\'' || c == '"');
    Some(value.to_string()).filter(|version| !version.is_empty())
}

#[cfg(test)]
mod tests {
    use super::version_of_wheel;

    #[test]
    fn the_wheel_version_is_read_from_its_version_file() {
        let text = "from typing import Optional\n__all__ = ['__version__']\n__version__ = '2.11.0+cu128'\ngit_version = 'abc'\n";
        assert_eq!(version_of_wheel(text).as_deref(), Some("2.11.0+cu128"));
        let typed = "__version__: str = \"2.11.0\"\n";
        assert_eq!(version_of_wheel(typed).as_deref(), Some("2.11.0"));
        assert_eq!(version_of_wheel("nothing here"), None);
    }
}
