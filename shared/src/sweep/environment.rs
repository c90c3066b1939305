//! Where and how a sweep's jobs run: `code` (ship the project, the default, or `none`),
//! `workdir` (a fixed absolute directory on a shared filesystem, instead of shipped code),
//! `env` (extra variables) and `setup` (a shell line run before the command, in its shell).
//!
//! `env` refuses names the job cannot be given: not a valid variable name, `APP_*` (ours, set
//! by the worker), the variables the worker sets for placement and distributed runs, and
//! names that look like credentials: a sweep file is stored on the server and shown on the
//! page, so a secret belongs in the worker's environment, not here.

use serde_norway::{Mapping, Value};

use super::error::{invalid, SweepError};
use super::read::{self, describe, get, key_text};

/// What the job's working directory holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Code {
    /// A fresh copy of the project snapshot submitted with the sweep.
    #[default]
    Project,
    /// An empty directory (`code: none`).
    None,
}

/// The sweep's `code`, `workdir`, `env`, `setup`, `capture` and `metrics_regex`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Environment {
    pub code: Code,
    /// An absolute path on the worker to run in, instead of a fresh directory.
    pub workdir: Option<String>,
    /// Extra variables in file order, values as text.
    pub env: Vec<(String, String)>,
    /// A shell line run before the command in the same shell.
    pub setup: Option<String>,
    /// `capture: none`: the worker reads metrics only from `APP_METRICS_FILE` (and
    /// `metrics_regex`), not from the loggers a script calls (W&B, TensorBoard, ...).
    pub capture_off: bool,
    /// `metrics_regex`: patterns over the job's printed lines that give metric points.
    pub metrics_regex: Vec<String>,
}

/// Variables the worker sets for every job; a sweep may not replace them.
const WORKER_SET: [&str; 8] = [
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WANDB_SWEEP_PARAM_PATH",
];
/// Parts of a name that say it holds a secret.
const CREDENTIAL_WORDS: [&str; 8] =
    ["TOKEN", "SECRET", "PASSWORD", "PASSWD", "API_KEY", "ACCESS_KEY", "PRIVATE_KEY", "CREDENTIAL"];

pub(crate) fn parse_environment(root: &Mapping) -> Result<Environment, SweepError> {
    let mut environment = Environment::default();
    let code = get(root, "code").map(|code| read::string(code, "code")).transpose()?;
    environment.code = match code.as_deref() {
        None | Some("project") => Code::Project,
        Some("none") => Code::None,
        Some(other) => return Err(invalid("code", format!("expected `none` or `project`, found `{other}`"))),
    };
    if let Some(workdir) = get(root, "workdir") {
        let path = read::string(workdir, "workdir")?;
        if !path.starts_with('/') || path.contains('\0') {
            return Err(invalid("workdir", format!("expected an absolute path on the workers, found `{path}`")));
        }
        if code.as_deref() == Some("project") {
            return Err(invalid("code", "`workdir` runs in a fixed directory: it cannot take `code: project` too"));
        }
        environment.code = Code::None;
        environment.workdir = Some(path);
    }
    if let Some(env) = get(root, "env") {
        environment.env = parse_env(read::mapping(env, "env")?)?;
    }
    if let Some(capture) = get(root, "capture") {
        environment.capture_off = match read::string(capture, "capture")?.as_str() {
            "none" => true,
            "auto" => false,
            other => {
                return Err(invalid("capture", format!("expected `auto` (the default) or `none`, found `{other}`")))
            }
        };
    }
    if let Some(patterns) = get(root, "metrics_regex") {
        environment.metrics_regex = parse_metrics_regex(patterns)?;
    }
    if let Some(setup) = get(root, "setup") {
        let line = read::string(setup, "setup")?;
        if line.contains('\0') {
            return Err(invalid("setup", "a shell line cannot contain a NUL byte"));
        }
        environment.setup = Some(line);
    }
    Ok(environment)
}

fn parse_env(map: &Mapping) -> Result<Vec<(String, String)>, SweepError> {
    let mut variables = Vec::with_capacity(map.len());
    for (key, value) in map {
        let name = key_text(key);
        let path = format!("env.{name}");
        check_name(key, &name, &path)?;
        let text = match value {
            Value::String(text) => text.clone(),
            Value::Bool(flag) => flag.to_string(),
            Value::Number(number) => number.to_string(),
            other => {
                let message = format!("expected a string, number or boolean, found {}", describe(other));
                return Err(invalid(path, message));
            }
        };
        if text.contains('\0') {
            return Err(invalid(path, "a variable's value cannot contain a NUL byte"));
        }
        variables.push((name, text));
    }
    Ok(variables)
}

/// The most `metrics_regex` patterns a sweep takes, and the longest one.
const MAX_PATTERNS: usize = 16;
const MAX_PATTERN_LENGTH: usize = 1_000;

/// One pattern or a list of them, each compiled here so a bad one is refused at submit time.
/// A pattern gives points through its named groups: `name` and `value` (one point per match,
/// for `key=value` lines), or any other names (each a metric); a group `step` is the step.
fn parse_metrics_regex(value: &Value) -> Result<Vec<String>, SweepError> {
    let patterns = match value {
        Value::Sequence(items) => items
            .iter()
            .enumerate()
            .map(|(index, item)| read::string(item, &format!("metrics_regex[{index}]")))
            .collect::<Result<Vec<_>, _>>()?,
        other => vec![read::string(other, "metrics_regex")?],
    };
    if patterns.len() > MAX_PATTERNS {
        return Err(invalid("metrics_regex", format!("at most {MAX_PATTERNS} patterns, found {}", patterns.len())));
    }
    for (index, pattern) in patterns.iter().enumerate() {
        let path = if matches!(value, Value::Sequence(_)) {
            format!("metrics_regex[{index}]")
        } else {
            "metrics_regex".to_string()
        };
        crate::metric_pattern::MetricPattern::new(pattern).map_err(|why| invalid(path, why))?;
        if pattern.len() > MAX_PATTERN_LENGTH {
            return Err(invalid("metrics_regex", format!("a pattern is at most {MAX_PATTERN_LENGTH} characters")));
        }
    }
    Ok(patterns)
}

fn check_name(key: &Value, name: &str, path: &str) -> Result<(), SweepError> {
    let mut chars = name.chars();
    let valid = key.is_string()
        && chars.next().is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        let message =
            format!("`{name}` is not a valid variable name (letters, digits and _, not starting with a digit)");
        return Err(invalid(path, message));
    }
    let upper = name.to_ascii_uppercase();
    if upper.starts_with("APP_") {
        return Err(invalid(path, format!("`{name}`: APP_* variables are set by app itself")));
    }
    if WORKER_SET.contains(&upper.as_str()) {
        return Err(invalid(path, format!("`{name}` is set by the worker for each job")));
    }
    if CREDENTIAL_WORDS.iter().any(|word| upper.contains(word)) {
        let message = format!(
            "`{name}` looks like a credential; sweep files are stored and shown on the page, \
             so set it in the worker's environment instead"
        );
        return Err(invalid(path, message));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn environment(text: &str) -> Result<Environment, SweepError> {
        parse_environment(serde_norway::from_str::<Value>(text).unwrap().as_mapping().unwrap())
    }

    fn error_path(text: &str) -> String {
        match environment(text) {
            Err(SweepError::Invalid { path, .. }) => path,
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn reads_every_key() {
        let parsed =
            environment("env: {OMP_NUM_THREADS: 4, MODE: fast, DEBUG: false}\nsetup: source .venv/bin/activate")
                .unwrap();
        assert_eq!(parsed.code, Code::Project);
        assert_eq!(
            parsed.env,
            [("OMP_NUM_THREADS", "4"), ("MODE", "fast"), ("DEBUG", "false")].map(|(a, b)| (a.into(), b.into()))
        );
        assert_eq!(parsed.setup.as_deref(), Some("source .venv/bin/activate"));
        assert_eq!(environment("code: none").unwrap().code, Code::None);
        let shared = environment("workdir: /mnt/lab/project").unwrap();
        assert_eq!((shared.code, shared.workdir.as_deref()), (Code::None, Some("/mnt/lab/project")));
    }

    #[test]
    fn refuses_with_the_key_path() {
        assert_eq!(error_path("code: git"), "code");
        assert_eq!(error_path("workdir: relative/dir"), "workdir");
        assert_eq!(error_path("workdir: /x\ncode: project"), "code");
        assert_eq!(error_path("env: {1ABC: x}"), "env.1ABC");
        assert_eq!(error_path("env: {A-B: x}"), "env.A-B");
        assert_eq!(error_path("env: {APP_TOKEN: x}"), "env.APP_TOKEN");
        assert_eq!(error_path("env: {CUDA_VISIBLE_DEVICES: '0'}"), "env.CUDA_VISIBLE_DEVICES");
        assert_eq!(error_path("env: {WANDB_API_KEY: abc}"), "env.WANDB_API_KEY");
        assert_eq!(error_path("env: {HF_TOKEN: abc}"), "env.HF_TOKEN");
        assert_eq!(error_path("env: {X: [1]}"), "env.X");
        assert_eq!(error_path("env: [X]"), "env");
        assert_eq!(error_path("setup: ''"), "setup");
    }
}
