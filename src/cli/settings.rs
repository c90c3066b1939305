//! The settings of the serving modes (`app`, `app --server-only`, `app --client-only`), in
//! one place: defaults, then the config file, then `APP_*` variables, then flags.
//!
//! Each source is read into one [`Layer`] (every key optional) and the layers are stacked, the
//! higher winning key by key; the result is applied to the defaults once. The config file is
//! read once and holds a `[server]` and a `[worker]` table; unknown keys are refused by name.

use anyhow::Context;
use clap::Args;
use serde::Deserialize;
use server::config::ServerFile;
use server::ServerConfig;
use std::path::{Path, PathBuf};
use worker::config::WorkerFile;
use worker::WorkerConfig;

pub const DEFAULT_BIND: &str = "127.0.0.1:8000";

/// Flags of the serving modes; without a verb, `app` runs these.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Run only the head node: HTTP API, queue (SQLite, or PostgreSQL with --database-url) and web page, no local worker.
    #[arg(long, conflicts_with_all = ["client_only", "WorkerFlags"])]
    pub server_only: bool,
    /// Run only a worker daemon against --url.
    #[arg(long, conflicts_with = "ServerFlags")]
    pub client_only: bool,
    /// A TOML file with a [server] and a [worker] table (configs/server.example.toml,
    /// configs/worker.example.toml); APP_* variables and flags win over it [env: APP_CONFIG_FILE]
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub server: ServerFlags,
    #[command(flatten)]
    pub worker: WorkerFlags,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "Server (app, app --server-only)")]
pub struct ServerFlags {
    /// Address to listen on (default 127.0.0.1:8000; 0.0.0.0:8000 accepts workers on other
    /// machines, with tokens) [env: APP_BIND]
    #[arg(long, value_name = "ADDRESS")]
    pub bind: Option<String>,
    /// Where the queue database and results live (default ./app-data) [env: APP_DATA_DIR]
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Keep the queue in this PostgreSQL database instead of <data-dir>/queue.db
    /// (postgres://user@host:5432/app); several servers may share one, with one shared
    /// --data-dir for results and logs [env: APP_DATABASE_URL]
    #[arg(long, value_name = "URL")]
    pub database_url: Option<String>,
    /// File of user tokens, one per line: `TOKEN` (the user `default`), `NAME:TOKEN` or
    /// `admin:NAME:TOKEN`; users submit, read, and change their own sweeps [env:
    /// APP_USER_TOKEN_FILE; the tokens themselves: APP_USER_TOKEN, comma-separated]
    #[arg(long, value_name = "FILE")]
    pub user_token_file: Option<PathBuf>,
    /// File of worker tokens, one per line: register, claim, report [env:
    /// APP_WORKER_TOKEN_FILE; a token itself: APP_WORKER_TOKEN]
    #[arg(long, value_name = "FILE")]
    pub worker_token_file: Option<PathBuf>,
    /// Serve HTTPS with this PEM certificate chain, with --tls-key [env: APP_TLS_CERT]
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert [env: APP_TLS_KEY]
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Serve /metrics (Prometheus) without a token; other endpoints keep theirs
    #[arg(long)]
    pub metrics_public: bool,
    /// Fair share between users: their usage counts half as much after this many seconds
    /// (default 604800, 7 days); weights and quotas are the config's [server.shares] and
    /// [server.quotas]
    #[arg(long, value_name = "SECONDS")]
    pub share_half_life_secs: Option<f64>,
    /// A preempted job gets this long after SIGTERM to save its checkpoint and exit, before
    /// SIGKILL (default 120)
    #[arg(long, value_name = "SECONDS")]
    pub preempt_grace_secs: Option<f64>,
    /// The scheduler never preempts a job that has run less than this (default 600)
    #[arg(long, value_name = "SECONDS")]
    pub min_runtime_secs: Option<f64>,
    /// Which jobs the scheduler may preempt for a user below their share when their sweep
    /// has no `preemptible` key: true, false, or checkpointing (default: those that have
    /// stored a checkpoint)
    #[arg(long, value_name = "true|false|checkpointing")]
    pub preemptible: Option<String>,
    /// A job of several GPUs that waited this long holds a worker as its GPUs free up; others
    /// use them meanwhile only if their timeout ends first (default 900)
    #[arg(long, value_name = "SECONDS")]
    pub backfill_after_secs: Option<f64>,
    /// Allow listening beyond loopback without tokens (anyone who reaches the port can then
    /// run commands on every worker)
    #[arg(long)]
    pub insecure_no_auth: bool,
}

#[derive(Debug, Args)]
#[command(next_help_heading = "Worker (app, app --client-only)")]
pub struct WorkerFlags {
    /// The server a worker (--client-only) connects to, e.g. http://head:8000; several,
    /// comma-separated, are replicas tried in order, the one that answers kept [env: APP_URL]
    #[arg(long)]
    pub url: Option<String>,
    /// This worker's name, unique per box (default: the host name; `local` when embedded)
    /// [env: APP_WORKER_NAME]
    #[arg(long)]
    pub name: Option<String>,
    /// Use only these GPUs, e.g. --gpus 0,1
    #[arg(long, value_delimiter = ',')]
    pub gpus: Option<Vec<u32>>,
    /// Run at most this many jobs at once (default: 4 per GPU, or one per core; a CPU box running
    /// jobs shorter than 0.25 s also holds the next ones, listed running, for up to 1 s)
    #[arg(long, value_name = "N")]
    pub max_jobs: Option<u32>,
    /// Where attempts get their fresh directories (default ./app-work) [env: APP_WORK_DIR]
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Testing aid: simulate GPUs, e.g. --fake-gpus 2x24GiB; 2x24GiB@FILE scripts their readings
    /// (docs/gpu.md) [env: APP_FAKE_GPUS]
    #[arg(long, value_name = "N[xMEM]")]
    pub fake_gpus: Option<String>,
    /// Seconds between SIGTERM and SIGKILL when a job is cancelled or times out (default 10)
    #[arg(long, value_name = "SECS")]
    pub kill_grace_secs: Option<f64>,
    /// Keep each attempt's directory after its log, metrics, results and outcome reached the
    /// server (by default it is removed then)
    #[arg(long)]
    pub keep_work_dirs: bool,
    /// A file holding the worker token [env: APP_TOKEN_FILE; the token itself: APP_TOKEN]
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// PEM certificate of a private CA that signed the server's HTTPS certificate [env: APP_CA]
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
}

/// Which daemons this process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The server and one local worker (`app`).
    Embedded,
    ServerOnly,
    ClientOnly,
}

impl Mode {
    pub fn of(args: &ServeArgs) -> Mode {
        match (args.server_only, args.client_only) {
            (true, _) => Mode::ServerOnly,
            (_, true) => Mode::ClientOnly,
            _ => Mode::Embedded,
        }
    }
}

/// One source of settings; every key optional.
#[derive(Debug, Default)]
pub struct Layer {
    pub server: ServerFile,
    pub worker: WorkerFile,
}

/// The config file: both tables, nothing else.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    server: ServerFile,
    #[serde(default)]
    worker: WorkerFile,
}

impl Layer {
    /// The config file's tables; `path` names the file in errors.
    pub fn from_toml(text: &str, path: &Path) -> anyhow::Result<Layer> {
        let file: ConfigFile = toml::from_str(text).map_err(|error| {
            // toml's message spans several lines (a snippet of the file); one line is kept.
            let mut message = error.message().trim().to_string();
            let start = error.span().map(|span| span.start);
            let place = start.map(|start| line_and_column(text, start)).unwrap_or_default();
            // A bad value's message names the type, not the key: add the key of its line.
            if let Some(key) = start.and_then(|start| key_at(text, start)) {
                if !message.contains(&format!("`{key}`")) {
                    message = format!("`{key}`: {message}");
                }
            }
            anyhow::anyhow!("config file {}{place}: {message}", path.display())
        })?;
        Ok(Layer { server: file.server, worker: file.worker })
    }

    /// The `APP_*` variables `variable` gives (blank ones count as unset).
    pub fn from_env(variable: impl Fn(&str) -> Option<String>) -> Layer {
        let text = |name: &str| variable(name).filter(|value| !value.trim().is_empty());
        let path = |name: &str| text(name).map(PathBuf::from);
        Layer {
            server: ServerFile {
                bind: text("APP_BIND"),
                data_dir: path("APP_DATA_DIR"),
                database_url: text("APP_DATABASE_URL"),
                user_token_file: path("APP_USER_TOKEN_FILE"),
                worker_token_file: path("APP_WORKER_TOKEN_FILE"),
                tls_cert: path("APP_TLS_CERT"),
                tls_key: path("APP_TLS_KEY"),
                user_token: text("APP_USER_TOKEN"),
                worker_token: text("APP_WORKER_TOKEN"),
                ..ServerFile::default()
            },
            worker: WorkerFile {
                url: text("APP_URL"),
                name: text("APP_WORKER_NAME"),
                work_dir: path("APP_WORK_DIR"),
                fake_gpus: text("APP_FAKE_GPUS"),
                token_file: path("APP_TOKEN_FILE"),
                token: text("APP_TOKEN"),
                ca_file: path("APP_CA"),
                ..WorkerFile::default()
            },
        }
    }

    /// The flags given on the command line.
    pub fn from_flags(args: &ServeArgs) -> Layer {
        let (server, worker) = (&args.server, &args.worker);
        Layer {
            server: ServerFile {
                bind: server.bind.clone(),
                data_dir: server.data_dir.clone(),
                database_url: server.database_url.clone(),
                user_token_file: server.user_token_file.clone(),
                worker_token_file: server.worker_token_file.clone(),
                tls_cert: server.tls_cert.clone(),
                tls_key: server.tls_key.clone(),
                metrics_public: server.metrics_public.then_some(true),
                share_half_life_secs: server.share_half_life_secs,
                preempt_grace_secs: server.preempt_grace_secs,
                min_runtime_secs: server.min_runtime_secs,
                preemptible: server.preemptible.clone().map(server::config::PreemptibleFile::Text),
                backfill_after_secs: server.backfill_after_secs,
                ..ServerFile::default()
            },
            worker: WorkerFile {
                url: worker.url.clone(),
                name: worker.name.clone(),
                gpus: worker.gpus.clone(),
                max_jobs: worker.max_jobs,
                work_dir: worker.work_dir.clone(),
                fake_gpus: worker.fake_gpus.clone(),
                kill_grace_secs: worker.kill_grace_secs,
                keep_work_dirs: worker.keep_work_dirs.then_some(true),
                token_file: worker.token_file.clone(),
                ca_file: worker.ca.clone(),
                ..WorkerFile::default()
            },
        }
    }

    /// This layer stacked on `lower`: every key set here wins.
    pub fn over(self, lower: Layer) -> Layer {
        Layer { server: self.server.over(lower.server), worker: self.worker.over(lower.worker) }
    }
}

/// Whether a URL (`postgres://user:password@host/db`) holds a password.
fn url_has_password(url: &str) -> bool {
    let Some((_, rest)) = url.split_once("://") else { return false };
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    authority.rsplit_once('@').is_some_and(|(credentials, _)| credentials.contains(':'))
}

/// The key of the `key = value` line holding `offset`, if it is one.
fn key_at(text: &str, offset: usize) -> Option<String> {
    let offset = offset.min(text.len());
    let line_start = text[..offset].rfind('\n').map_or(0, |newline| newline + 1);
    let line = text[line_start..].lines().next()?;
    let (key, _) = line.split_once('=')?;
    let key = key.trim();
    let bare = !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    bare.then(|| key.to_string())
}

fn line_and_column(text: &str, offset: usize) -> String {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |last| last.chars().count()) + 1;
    format!(" at line {line}, column {column}")
}

/// Everything the serving modes need, assembled.
#[derive(Debug)]
pub struct Settings {
    pub mode: Mode,
    pub server: ServerConfig,
    pub bind: String,
    pub insecure_no_auth: bool,
    /// The worker of `--client-only`, or the local worker of the embedded mode (whose URL is
    /// the server's own, set once it listens).
    pub worker: WorkerConfig,
}

/// Reads the config file (once) and the environment, and assembles the settings.
pub fn load(args: &ServeArgs) -> anyhow::Result<Settings> {
    let variable = super::secrets::variable;
    let path =
        args.config.clone().or_else(|| variable("APP_CONFIG_FILE").filter(|path| !path.is_empty()).map(PathBuf::from));
    let file = match &path {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("reading config file {}", path.display()))?;
            Layer::from_toml(&text, path)?
        }
        None => Layer::default(),
    };
    if args.server.database_url.as_deref().is_some_and(url_has_password) {
        tracing::warn!(
            "--database-url carries a password: every process on this machine can read it (ps, /proc/<pid>/cmdline); \
             give the URL in APP_DATABASE_URL or the config file instead"
        );
    }
    assemble(Mode::of(args), file, Layer::from_env(variable), Layer::from_flags(args), args.server.insecure_no_auth)
}

/// Defaults, then `file`, then `env`, then `flags`.
pub fn assemble(mode: Mode, file: Layer, env: Layer, flags: Layer, insecure_no_auth: bool) -> anyhow::Result<Settings> {
    let stacked = flags.over(env.over(file));
    let mut server = ServerConfig::default();
    let bind = stacked.server.bind.clone().unwrap_or_else(|| DEFAULT_BIND.to_string());
    if mode != Mode::ClientOnly {
        server.apply_file(&stacked.server)?;
    }
    let worker = match mode {
        Mode::ServerOnly => WorkerConfig::new(String::new()),
        Mode::ClientOnly => {
            let url = stacked.worker.url.clone().context(
                "--client-only needs the server's URL: --url http://HEAD:8000, APP_URL, or `url` in the [worker] table",
            )?;
            let mut worker = WorkerConfig::new(url);
            stacked.worker.apply(&mut worker)?;
            worker
        }
        Mode::Embedded => local_worker(&stacked)?,
    };
    if mode != Mode::ServerOnly {
        shared::names::check_name("worker", &worker.name).map_err(anyhow::Error::msg)?;
    }
    Ok(Settings { mode, server, bind, insecure_no_auth, worker })
}

/// The embedded mode's worker: the `[worker]` settings, named `local` unless named, and
/// holding the server's first worker token rather than one of its own (it must be accepted).
fn local_worker(stacked: &Layer) -> anyhow::Result<WorkerConfig> {
    let mut worker = WorkerConfig::new(String::new());
    let own = WorkerFile { url: None, token: None, token_file: None, ..stacked.worker.clone() };
    own.apply(&mut worker)?;
    if stacked.worker.name.is_none() {
        worker.name = "local".into();
    }
    worker.connection.token = match (&stacked.server.worker_token, &stacked.server.worker_token_file) {
        (Some(token), _) => Some(token.trim().to_string()),
        (None, Some(path)) => client::ClientOptions::load(None, Some(path), None).map_err(anyhow::Error::msg)?.token,
        (None, None) => None,
    };
    Ok(worker)
}

#[cfg(test)]
#[path = "settings_tests.rs"]
mod tests;
