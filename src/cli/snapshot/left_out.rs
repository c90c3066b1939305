//! What a snapshot leaves out before any pattern of the user's: app's own state, wherever it
//! sits in the project, and (outside git, which has its own ignore rules) what research
//! projects generate and never import.
//!
//! - **App's own state**, always: a directory holding a server's data (its instance marker
//!   `.app-instance`) or a worker's work directory (`.app-worker.lock` or `.app-worker.key`),
//!   whatever its name; the token and config files the client was given (`APP_TOKEN_FILE`,
//!   `--token-file`, `APP_CONFIG_FILE`); any TOML file that is an app config (only `[server]`
//!   and `[worker]` tables, with keys of app's), and the token and key files it names. A
//!   project that *is* such a directory ships nothing. None of this can be put back: it is
//!   never code, and a token must never travel.
//! - **Generated outputs**, outside git only: [`GENERATED`] (W&B, MLflow, Lightning, TensorBoard
//!   and Hydra runs, Python caches, notebook checkpoints), virtual environments (a directory
//!   with `pyvenv.cfg`) and weights over [`LARGE_WEIGHTS`] (`*.ckpt`, `*.pt`, `*.pth`,
//!   `*.safetensors`). A `!pattern` in `.appignore` puts any of them back.

use std::path::{Path, PathBuf};

/// Files whose presence makes their directory app's own, with what that directory is. (Not
/// `queue.db`: a project may well have a file of that name; a server always writes its marker.)
const STATE_MARKERS: [(&str, &str); 3] = [
    (".app-instance", "app's data"),
    (".app-worker.lock", "attempt directories"),
    (".app-worker.key", "attempt directories"),
];

/// Keys only app's config files have (`configs/*.example.toml`); one of them makes a TOML file
/// of `[server]` and `[worker]` tables an app config.
const APP_KEYS: [&str; 14] = [
    "data_dir",
    "database_url",
    "lease_secs",
    "heartbeat_secs",
    "max_long_poll_secs",
    "user_token_file",
    "worker_token_file",
    "tls_key",
    "work_dir",
    "max_jobs",
    "token_file",
    "kill_grace_secs",
    "code_cache_size",
    "telemetry_secs",
];

/// The keys of an app config that name files holding secrets.
const SECRET_FILE_KEYS: [&str; 4] = ["user_token_file", "worker_token_file", "token_file", "tls_key"];

/// Directories research projects generate, left out outside git (gitignore patterns, with what
/// they hold).
pub const GENERATED: [(&str, &str); 8] = [
    ("wandb/", "W&B run files"),
    ("mlruns/", "MLflow runs"),
    ("lightning_logs/", "Lightning logs"),
    ("runs/", "TensorBoard runs"),
    ("outputs/", "Hydra outputs"),
    ("multirun/", "Hydra multiruns"),
    ("__pycache__/", "Python caches"),
    (".ipynb_checkpoints/", "notebook checkpoints"),
];

/// Weight files larger than this are left out outside git.
pub const LARGE_WEIGHTS: u64 = 10 << 20;
const WEIGHT_EXTENSIONS: [&str; 4] = ["ckpt", "pt", "pth", "safetensors"];

/// Why a directory of the project is app's own state, if it is.
pub fn app_state(dir: &Path) -> Option<&'static str> {
    STATE_MARKERS.iter().find(|(marker, _)| std::fs::symlink_metadata(dir.join(marker)).is_ok()).map(|(_, what)| *what)
}

/// Whether `dir` is a Python virtual environment.
pub fn virtual_environment(dir: &Path) -> bool {
    dir.join("pyvenv.cfg").is_file()
}

/// Whether a file of `size` bytes at `path` is weights too large to ship by default.
pub fn large_weights(path: &Path, size: u64) -> bool {
    size > LARGE_WEIGHTS
        && path
            .extension()
            .and_then(|extension| extension.to_str())
            .is_some_and(|extension| WEIGHT_EXTENSIONS.iter().any(|known| known.eq_ignore_ascii_case(extension)))
}

/// When the file at `path` is an app config (a TOML file whose tables are only `[server]` and
/// `[worker]`, with keys only app uses; it may hold a database URL with a password), the files
/// holding secrets it names (token files, the TLS key), resolved beside it.
pub fn app_config(path: &Path) -> Option<Vec<PathBuf>> {
    if path.extension().is_none_or(|extension| extension != "toml") {
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    let table = text.parse::<toml::Table>().ok()?;
    let tables: Vec<&toml::Table> = table.values().filter_map(toml::Value::as_table).collect();
    let only_ours = !table.is_empty() && table.keys().all(|key| key == "server" || key == "worker");
    let known = tables.iter().any(|table| table.keys().any(|key| APP_KEYS.contains(&key.as_str())));
    if !(only_ours && known && tables.len() == table.len()) {
        return None;
    }
    let beside = path.parent().unwrap_or(Path::new("."));
    let named = tables
        .iter()
        .flat_map(|table| SECRET_FILE_KEYS.iter().filter_map(|key| table.get(*key)?.as_str()))
        .map(|named| beside.join(named))
        .collect();
    Some(named)
}

/// The files the client was given that the project may hold: its token and config files.
pub fn client_files() -> Vec<PathBuf> {
    ["APP_TOKEN_FILE", "APP_CONFIG_FILE"]
        .iter()
        .filter_map(std::env::var_os)
        .filter(|value| !value.is_empty())
        .filter_map(|value| PathBuf::from(value).canonicalize().ok())
        .collect()
}

/// What was left out, for the one line `app submit` prints.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LeftOut {
    /// Paths relative to the root (directories end with `/`), each with why.
    pub entries: Vec<(String, String)>,
}

/// How many entries the line names before "and N more".
const NAMED: usize = 8;

impl LeftOut {
    pub fn add(&mut self, path: &Path, is_dir: bool, why: impl Into<String>) {
        let mut shown = path.display().to_string();
        if is_dir {
            shown.push('/');
        }
        self.entries.push((shown, why.into()));
    }

    /// `left out: app-data/ (app's data), wandb/ (W&B run files)`.
    pub fn describe(&self) -> Option<String> {
        if self.entries.is_empty() {
            return None;
        }
        let mut named: Vec<String> =
            self.entries.iter().take(NAMED).map(|(path, why)| format!("{path} ({why})")).collect();
        if self.entries.len() > NAMED {
            named.push(format!("and {} more", self.entries.len() - NAMED));
        }
        Some(format!("left out: {}", named.join(", ")))
    }
}
