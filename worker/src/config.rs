//! Worker settings: `WorkerConfig` with its defaults, and `WorkerFile`, one layer of settings
//! (the config file's `[worker]` table, the environment or the flags) where every key is
//! optional. The `app` binary stacks the layers (`over`) and applies the result once.

use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

/// Everything the worker daemon can be told.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The server, e.g. `http://head:8000`.
    pub url: String,
    /// Unique per box: the server requeues jobs of a worker that re-registers without them.
    pub name: String,
    /// Only these GPU indices are used (`--gpus 0,1`); `None` means all.
    pub gpus: Option<Vec<u32>>,
    /// At most this many jobs at once; `None` means 4 per GPU, or one per core without GPUs.
    pub max_jobs: Option<u32>,
    /// Attempts run in fresh directories under this one.
    pub work_dir: PathBuf,
    /// `--fake-gpus 2x24GiB`: a simulated inventory, a testing aid.
    pub fake_gpus: Option<String>,
    /// How often GPU telemetry is sampled (sent with the next heartbeat), and how often the
    /// GPUs of running jobs are read for their accounting.
    pub telemetry_interval: Duration,
    /// Time between SIGTERM and SIGKILL when a job is cancelled or times out.
    pub kill_grace: Duration,
    /// The longest an idle claim waits on the server.
    pub claim_wait: Duration,
    /// How often logs and metrics are shipped while a job runs.
    pub ship_interval: Duration,
    /// Keep each attempt's directory after everything was delivered (default: remove it).
    pub keep_work_dirs: bool,
    /// How often a running job's `$APP_CHECKPOINT_DIR` is uploaded when it changed (and once
    /// more when the attempt ends).
    pub checkpoint_interval: Duration,
    /// A checkpoint directory larger than this is not uploaded (a warning goes to the job's log).
    pub checkpoint_max_bytes: u64,
    /// Code snapshots kept on this worker at most, least recently used removed first.
    pub code_cache_bytes: u64,
    /// The worker token and the CA to trust (its Debug output hides the token).
    pub connection: client::ClientOptions,
    /// What this worker's `app` binary can run (the trainer), told to the server with every
    /// capacity; the binary fills it in (the worker library cannot know its features).
    pub capabilities: shared::capabilities::Capabilities,
    /// Keep each job's processes in a cgroup of their own where the worker may make one
    /// (`containment`); false: the subreaper alone.
    pub cgroups: bool,
    /// Run jobs as this user (a name or uid; the worker must be root).
    pub run_as: Option<String>,
    /// How an attempt gets its copy of a cached code snapshot (`code_copy`).
    pub code_copy: crate::code_copy::CodeCopy,
}

impl WorkerConfig {
    pub fn new(url: impl Into<String>) -> WorkerConfig {
        WorkerConfig {
            url: url.into(),
            name: default_name(),
            gpus: None,
            max_jobs: None,
            work_dir: PathBuf::from("app-work"),
            fake_gpus: None,
            telemetry_interval: Duration::from_secs(5),
            kill_grace: Duration::from_secs(10),
            claim_wait: Duration::from_secs(20),
            ship_interval: Duration::from_millis(250),
            keep_work_dirs: false,
            checkpoint_interval: Duration::from_secs(300),
            checkpoint_max_bytes: 10 << 30,
            code_cache_bytes: 5 << 30,
            connection: client::ClientOptions::default(),
            capabilities: shared::capabilities::Capabilities::default(),
            cgroups: true,
            run_as: None,
            code_copy: crate::code_copy::CodeCopy::Auto,
        }
    }
}

/// The host name, which is what tells one box's worker from another's.
pub fn default_name() -> String {
    let host = nix::unistd::gethostname().ok().and_then(|name| name.into_string().ok()).unwrap_or_default();
    let name = shared::names::name_from_stem(&host);
    if name == "sweep" {
        "worker".to_string()
    } else {
        name
    }
}

/// One layer of worker settings: the `[worker]` table of a config file
/// (configs/worker.example.toml), the environment or the flags; every key optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerFile {
    pub url: Option<String>,
    pub name: Option<String>,
    pub gpus: Option<Vec<u32>>,
    pub max_jobs: Option<u32>,
    pub work_dir: Option<PathBuf>,
    pub fake_gpus: Option<String>,
    pub telemetry_secs: Option<f64>,
    pub kill_grace_secs: Option<f64>,
    pub keep_work_dirs: Option<bool>,
    /// Seconds between checkpoint uploads of a running job (300).
    pub checkpoint_secs: Option<f64>,
    /// The largest checkpoint uploaded, e.g. `10GiB` (the default).
    pub checkpoint_max_size: Option<String>,
    /// Code snapshots kept on this worker, e.g. `5GiB` (the default).
    pub code_cache_size: Option<String>,
    /// Keep each job's processes in a cgroup v2 of their own where possible (default true).
    pub cgroups: Option<bool>,
    /// Run jobs as this user (name or uid); the worker must run as root.
    pub run_as: Option<String>,
    /// `auto`, `overlay` or `copy`: how an attempt gets its copy of a cached code snapshot.
    pub code_copy: Option<String>,
    /// A file holding the worker token (first non-comment line).
    pub token_file: Option<PathBuf>,
    /// PEM certificate(s) of a private CA that signed the server's certificate.
    pub ca_file: Option<PathBuf>,
    /// The worker token as a value (APP_TOKEN); never read from a file's table. A token file
    /// of the same layer wins over it.
    #[serde(skip)]
    pub token: Option<String>,
}

impl WorkerFile {
    /// This layer stacked on `lower`: every key set here wins. A token value and a token file
    /// are one choice, so a layer that sets either replaces both.
    pub fn over(self, lower: WorkerFile) -> WorkerFile {
        let (token, token_file) = if self.token.is_some() || self.token_file.is_some() {
            (self.token, self.token_file)
        } else {
            (lower.token, lower.token_file)
        };
        WorkerFile {
            url: self.url.or(lower.url),
            name: self.name.or(lower.name),
            gpus: self.gpus.or(lower.gpus),
            max_jobs: self.max_jobs.or(lower.max_jobs),
            work_dir: self.work_dir.or(lower.work_dir),
            fake_gpus: self.fake_gpus.or(lower.fake_gpus),
            telemetry_secs: self.telemetry_secs.or(lower.telemetry_secs),
            kill_grace_secs: self.kill_grace_secs.or(lower.kill_grace_secs),
            keep_work_dirs: self.keep_work_dirs.or(lower.keep_work_dirs),
            checkpoint_secs: self.checkpoint_secs.or(lower.checkpoint_secs),
            checkpoint_max_size: self.checkpoint_max_size.or(lower.checkpoint_max_size),
            code_cache_size: self.code_cache_size.or(lower.code_cache_size),
            cgroups: self.cgroups.or(lower.cgroups),
            run_as: self.run_as.or(lower.run_as),
            code_copy: self.code_copy.or(lower.code_copy),
            token_file,
            ca_file: self.ca_file.or(lower.ca_file),
            token,
        }
    }

    /// Applies the keys this layer (or the stack of all layers) sets.
    pub fn apply(&self, config: &mut WorkerConfig) -> anyhow::Result<()> {
        let seconds = |value: f64, key: &str| -> anyhow::Result<Duration> {
            Duration::try_from_secs_f64(value)
                .map_err(|_| anyhow::anyhow!("`{key}` must be a positive number of seconds"))
        };
        if let Some(url) = &self.url {
            config.url = url.clone();
        }
        if let Some(name) = &self.name {
            config.name = name.clone();
        }
        if let Some(gpus) = &self.gpus {
            config.gpus = Some(gpus.clone());
        }
        if let Some(max_jobs) = self.max_jobs {
            anyhow::ensure!(max_jobs >= 1, "`max_jobs` (--max-jobs) must be at least 1: a worker that may run no job");
            config.max_jobs = Some(max_jobs);
        }
        if let Some(dir) = &self.work_dir {
            config.work_dir = dir.clone();
        }
        if let Some(fake) = &self.fake_gpus {
            config.fake_gpus = Some(fake.clone());
        }
        if let Some(value) = self.telemetry_secs {
            config.telemetry_interval = seconds(value, "telemetry_secs")?;
        }
        if let Some(keep) = self.keep_work_dirs {
            config.keep_work_dirs = keep;
        }
        if let Some(cgroups) = self.cgroups {
            config.cgroups = cgroups;
        }
        if let Some(copy) = &self.code_copy {
            config.code_copy = copy.parse().map_err(anyhow::Error::msg)?;
        }
        if let Some(user) = &self.run_as {
            anyhow::ensure!(!user.trim().is_empty(), "`run_as` must name a user");
            config.run_as = Some(user.trim().to_string());
        }
        if let Some(value) = self.kill_grace_secs {
            config.kill_grace = seconds(value, "kill_grace_secs")?;
        }
        if let Some(value) = self.checkpoint_secs {
            config.checkpoint_interval = seconds(value, "checkpoint_secs")?;
        }
        let size = |text: &str, key: &str| -> anyhow::Result<u64> {
            shared::size::parse_bytes(text).map_err(|error| anyhow::anyhow!("`{key}`: {error}"))
        };
        if let Some(text) = &self.checkpoint_max_size {
            config.checkpoint_max_bytes = size(text, "checkpoint_max_size")?;
        }
        if let Some(text) = &self.code_cache_size {
            config.code_cache_bytes = size(text, "code_cache_size")?;
        }
        if self.token.is_some() || self.token_file.is_some() || self.ca_file.is_some() {
            let loaded =
                client::ClientOptions::load(self.token.clone(), self.token_file.as_deref(), self.ca_file.as_deref())
                    .map_err(anyhow::Error::msg)?;
            if loaded.token.is_some() {
                config.connection.token = loaded.token;
            }
            if loaded.ca_pem.is_some() {
                config.connection.ca_pem = loaded.ca_pem;
            }
        }
        Ok(())
    }
}
