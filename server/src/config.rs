//! Server settings: `ServerConfig` with its defaults, and `ServerFile`, one layer of settings
//! (the config file's `[server]` table, the environment or the flags) where every key is
//! optional. The `app` binary stacks the layers (`over`) and applies the result once.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Everything the server can be told. Durations are in seconds in the file.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Holds `queue.db` and `results/`.
    pub data_dir: PathBuf,
    /// A PostgreSQL database to keep the queue in instead of `<data_dir>/queue.db`
    /// (`postgres://user@host:5432/app`); results and logs stay in `data_dir`, which replicas
    /// on one database share.
    pub database_url: Option<String>,
    /// A running job whose worker has not heartbeated for this long goes back to the queue.
    pub lease: Duration,
    /// How often a worker should heartbeat (told to it at registration).
    pub heartbeat: Duration,
    /// How often the reaper looks for expired leases.
    pub reaper_interval: Duration,
    /// A job lost this many times fails with `worker_lost`.
    pub max_crashes: u32,
    /// The largest sweep accepted, in jobs.
    pub max_jobs_per_sweep: u64,
    /// The largest request body accepted, in bytes (this bounds a sweep file too).
    pub max_body_bytes: usize,
    /// The deepest nesting of lists and maps a sweep file may have (at most 100).
    pub max_yaml_depth: usize,
    /// The longest a claim or a log follower waits.
    pub max_long_poll: Duration,
    /// Log bytes kept per attempt; past this, the rest is dropped behind one marker line.
    pub max_log_bytes_per_job: u64,
    /// How long GPU telemetry is kept.
    pub telemetry_retention: Duration,
    /// Result versions set aside in `results/.unrecorded/` (the database had no record of them)
    /// are removed after this; `None`: kept for ever.
    pub unrecorded_retention: Option<Duration>,
    /// The largest result file accepted, in bytes (uploads only; other bodies keep
    /// `max_body_bytes`).
    pub max_upload_bytes: u64,
    /// The most bytes of result files one attempt may upload, all files together.
    pub max_attempt_upload_bytes: u64,
    /// Bearer tokens; none: no authentication (the server then listens on loopback only,
    /// unless told `--insecure-no-auth`).
    pub tokens: crate::auth::Tokens,
    /// Certificate and key (PEM) to serve HTTPS with.
    pub tls: Option<TlsFiles>,
    /// A request's headers must arrive within this, and an idle keep-alive connection is
    /// closed after it (hyper measures both with one timer).
    pub header_timeout: Duration,
    /// A request body that stops arriving for this long is cut (the request fails with 400).
    pub body_idle_timeout: Duration,
    /// Open connections at most (`None`: what the descriptor limit allows, less a reserve).
    pub max_connections: Option<usize>,
    /// Open connections per client address at most.
    pub max_connections_per_address: usize,
    /// `/metrics` answers without a token (for a Prometheus that scrapes without one).
    pub metrics_public: bool,
    /// Fair share between users: weights, quotas, the half-life of usage (issue 29).
    pub shares: shared::fair_share::Policy,
    /// A preempted job's processes get this long after SIGTERM before SIGKILL.
    pub preempt_grace: Duration,
    /// The scheduler never preempts a job that has run less than this.
    pub min_runtime: Duration,
    /// Which jobs the scheduler may preempt when their sweep does not say.
    pub preemptible: Preemptible,
    /// A job of several GPUs that waited this long holds a worker until it fits (backfill).
    pub backfill_after: Duration,
    /// Priority classes (`[server.priority_classes]`, NAME = value): across users, a job of a
    /// higher class is claimed first and may preempt lower ones; a sweep naming none is in 0.
    pub priority_classes: BTreeMap<String, i64>,
}

impl ServerConfig {
    /// What this server must agree on with the other replicas of its database: its lease, and
    /// its scheduler settings in three groups, each written out the same way by every build.
    pub fn replica_agreement(&self) -> crate::db::postgres::Agreement {
        let shares = &self.shares;
        let groups = [
            (
                "the shares: [server.shares], share_half_life_secs, [server.priority_classes]",
                format!("{:?} {} {:?}", shares.weights, shares.half_life_secs, self.priority_classes),
            ),
            (
                "the quotas: [server.quotas], [server.default_quota]",
                format!("{:?} {:?}", shares.quotas, shares.default_quota),
            ),
            (
                "preemption and backfill: min_runtime_secs, preempt_grace_secs, preemptible, backfill_after_secs",
                format!(
                    "{} {} {:?} {}",
                    self.min_runtime.as_millis(),
                    self.preempt_grace.as_millis(),
                    self.preemptible,
                    self.backfill_after.as_millis()
                ),
            ),
        ];
        crate::db::postgres::Agreement::with_scheduler(self.lease.as_millis() as u64, &groups)
    }
}

/// Which jobs the scheduler may preempt when their sweep has no `preemptible` key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Preemptible {
    /// Jobs that have stored a checkpoint (so that they resume from it).
    #[default]
    Checkpointing,
    /// Every job.
    All,
    /// None.
    Never,
}

impl Preemptible {
    /// `true`, `false` or `checkpointing`, as the config, a flag or the environment say it.
    fn parse(value: &PreemptibleFile) -> anyhow::Result<Preemptible> {
        match value {
            PreemptibleFile::Flag(true) => Ok(Preemptible::All),
            PreemptibleFile::Flag(false) => Ok(Preemptible::Never),
            PreemptibleFile::Text(text) => match text.as_str() {
                "true" => Ok(Preemptible::All),
                "false" => Ok(Preemptible::Never),
                "checkpointing" => Ok(Preemptible::Checkpointing),
                other => anyhow::bail!("`preemptible` must be true, false or \"checkpointing\", not {other:?}"),
            },
        }
    }
}

/// `preemptible` as the config gives it: a boolean, or a word.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PreemptibleFile {
    Flag(bool),
    Text(String),
}

/// PEM files of the server's certificate chain and private key.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("app-data"),
            database_url: None,
            lease: Duration::from_secs(30),
            heartbeat: Duration::from_secs(5),
            reaper_interval: Duration::from_secs(1),
            max_crashes: 3,
            max_jobs_per_sweep: 100_000,
            max_body_bytes: 4 << 20,
            max_yaml_depth: 64,
            max_long_poll: Duration::from_secs(25),
            max_log_bytes_per_job: 64 << 20,
            telemetry_retention: Duration::from_secs(3600),
            unrecorded_retention: Some(Duration::from_secs(7 * 86_400)),
            max_upload_bytes: 10 << 30,
            max_attempt_upload_bytes: 50 << 30,
            tokens: crate::auth::Tokens::default(),
            tls: None,
            header_timeout: Duration::from_secs(20),
            body_idle_timeout: Duration::from_secs(30),
            max_connections: None,
            max_connections_per_address: 256,
            metrics_public: false,
            shares: shared::fair_share::Policy::default(),
            preempt_grace: Duration::from_secs(120),
            min_runtime: Duration::from_secs(600),
            preemptible: Preemptible::Checkpointing,
            backfill_after: Duration::from_secs(900),
            priority_classes: BTreeMap::new(),
        }
    }
}

/// One layer of server settings: the `[server]` table of a config file
/// (configs/server.example.toml), the environment or the flags; every key optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerFile {
    pub bind: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub database_url: Option<String>,
    pub lease_secs: Option<f64>,
    pub heartbeat_secs: Option<f64>,
    pub max_crashes: Option<u32>,
    pub max_jobs_per_sweep: Option<u64>,
    pub max_body_bytes: Option<usize>,
    pub max_yaml_depth: Option<usize>,
    pub max_long_poll_secs: Option<f64>,
    pub max_log_bytes_per_job: Option<u64>,
    pub telemetry_retention_secs: Option<f64>,
    pub unrecorded_retention_secs: Option<f64>,
    pub max_upload_bytes: Option<u64>,
    pub max_attempt_upload_bytes: Option<u64>,
    /// Files with one token per line (see `auth`); a user token's line may name its user
    /// (`NAME:TOKEN`, `admin:NAME:TOKEN`).
    pub user_token_file: Option<PathBuf>,
    pub worker_token_file: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub header_timeout_secs: Option<f64>,
    pub body_idle_secs: Option<f64>,
    pub max_connections: Option<usize>,
    pub max_connections_per_address: Option<usize>,
    pub metrics_public: Option<bool>,
    /// Users who may change anyone's sweeps, besides those whose tokens say `admin:`.
    pub admins: Option<Vec<String>>,
    /// Usage counts half as much after this many seconds (fair share; 7 days by default).
    pub share_half_life_secs: Option<f64>,
    /// Users' weights in the fair share (`[server.shares]`, NAME = weight; 1 if not listed).
    pub shares: Option<BTreeMap<String, Weight>>,
    /// Users' quotas (`[server.quotas]`, NAME = { max_gpus, max_running }).
    pub quotas: Option<BTreeMap<String, QuotaFile>>,
    /// The quota of a user `quotas` does not list (none by default).
    pub default_quota: Option<QuotaFile>,
    /// A preempted job's processes get this long after SIGTERM before SIGKILL (120 s).
    pub preempt_grace_secs: Option<f64>,
    /// The scheduler never preempts a job younger than this (600 s).
    pub min_runtime_secs: Option<f64>,
    /// Which jobs the scheduler may preempt when their sweep does not say: `true`, `false`
    /// or `"checkpointing"` (the default: jobs that have stored a checkpoint).
    pub preemptible: Option<PreemptibleFile>,
    /// A job of several GPUs that waited this long holds a worker as its GPUs free up (900 s).
    pub backfill_after_secs: Option<f64>,
    /// Priority classes (`[server.priority_classes]`, NAME = integer).
    pub priority_classes: Option<BTreeMap<String, ClassValue>>,
    /// User tokens given as a value (APP_USER_TOKEN, comma-separated `[admin:][NAME:]TOKEN`);
    /// never read from a file's table.
    #[serde(skip)]
    pub user_token: Option<String>,
    /// A worker token given as a value (APP_WORKER_TOKEN); never read from a file's table.
    #[serde(skip)]
    pub worker_token: Option<String>,
}

/// A weight as the config gives it: read as any value, so that one that is not a number is
/// refused with the user's name rather than a type error.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Weight {
    Number(f64),
    Text(String),
    Other(serde::de::IgnoredAny),
}

/// A priority class's value as the config gives it: read as any value, so that one that is
/// not an integer is refused with the class's name rather than a type error.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ClassValue {
    Integer(i64),
    Other(serde::de::IgnoredAny),
}

/// The largest value of a priority class, either way.
pub const MAX_CLASS_VALUE: i64 = 1_000_000_000;

/// One user's quota as the config gives it; a key left out is no limit.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaFile {
    pub max_gpus: Option<u32>,
    pub max_running: Option<u32>,
}

impl From<QuotaFile> for shared::fair_share::Quota {
    fn from(file: QuotaFile) -> Self {
        shared::fair_share::Quota { max_gpus: file.max_gpus, max_running: file.max_running }
    }
}

impl ServerFile {
    /// This layer stacked on `lower`: every key set here wins. The TLS certificate and key go
    /// together, so a layer that sets either replaces both.
    pub fn over(self, lower: ServerFile) -> ServerFile {
        let (tls_cert, tls_key) = if self.tls_cert.is_some() || self.tls_key.is_some() {
            (self.tls_cert, self.tls_key)
        } else {
            (lower.tls_cert, lower.tls_key)
        };
        ServerFile {
            bind: self.bind.or(lower.bind),
            data_dir: self.data_dir.or(lower.data_dir),
            database_url: self.database_url.or(lower.database_url),
            lease_secs: self.lease_secs.or(lower.lease_secs),
            heartbeat_secs: self.heartbeat_secs.or(lower.heartbeat_secs),
            max_crashes: self.max_crashes.or(lower.max_crashes),
            max_jobs_per_sweep: self.max_jobs_per_sweep.or(lower.max_jobs_per_sweep),
            max_body_bytes: self.max_body_bytes.or(lower.max_body_bytes),
            max_yaml_depth: self.max_yaml_depth.or(lower.max_yaml_depth),
            max_long_poll_secs: self.max_long_poll_secs.or(lower.max_long_poll_secs),
            max_log_bytes_per_job: self.max_log_bytes_per_job.or(lower.max_log_bytes_per_job),
            telemetry_retention_secs: self.telemetry_retention_secs.or(lower.telemetry_retention_secs),
            unrecorded_retention_secs: self.unrecorded_retention_secs.or(lower.unrecorded_retention_secs),
            max_upload_bytes: self.max_upload_bytes.or(lower.max_upload_bytes),
            max_attempt_upload_bytes: self.max_attempt_upload_bytes.or(lower.max_attempt_upload_bytes),
            user_token_file: self.user_token_file.or(lower.user_token_file),
            worker_token_file: self.worker_token_file.or(lower.worker_token_file),
            tls_cert,
            tls_key,
            user_token: self.user_token.or(lower.user_token),
            worker_token: self.worker_token.or(lower.worker_token),
            header_timeout_secs: self.header_timeout_secs.or(lower.header_timeout_secs),
            body_idle_secs: self.body_idle_secs.or(lower.body_idle_secs),
            max_connections: self.max_connections.or(lower.max_connections),
            max_connections_per_address: self.max_connections_per_address.or(lower.max_connections_per_address),
            metrics_public: self.metrics_public.or(lower.metrics_public),
            admins: self.admins.or(lower.admins),
            share_half_life_secs: self.share_half_life_secs.or(lower.share_half_life_secs),
            shares: self.shares.or(lower.shares),
            quotas: self.quotas.or(lower.quotas),
            default_quota: self.default_quota.or(lower.default_quota),
            preempt_grace_secs: self.preempt_grace_secs.or(lower.preempt_grace_secs),
            min_runtime_secs: self.min_runtime_secs.or(lower.min_runtime_secs),
            preemptible: self.preemptible.or(lower.preemptible),
            backfill_after_secs: self.backfill_after_secs.or(lower.backfill_after_secs),
            priority_classes: self.priority_classes.or(lower.priority_classes),
        }
    }
}

impl ServerConfig {
    /// Applies the keys a layer (or the stack of all layers) sets.
    pub fn apply_file(&mut self, file: &ServerFile) -> anyhow::Result<()> {
        // Positive, and at most a day: a zero lease would reap every job at once, and a huge
        // long poll would overflow the clock arithmetic.
        let seconds = |value: f64, key: &str| -> anyhow::Result<Duration> {
            match Duration::try_from_secs_f64(value) {
                Ok(duration) if !duration.is_zero() && duration <= Duration::from_secs(86_400) => Ok(duration),
                _ => anyhow::bail!("`{key}` must be a number of seconds above 0 and at most 86400, not {value}"),
            }
        };
        if let Some(dir) = &file.data_dir {
            self.data_dir = dir.clone();
        }
        if let Some(url) = &file.database_url {
            self.database_url = Some(url.clone());
        }
        if let Some(value) = file.lease_secs {
            self.lease = seconds(value, "lease_secs")?;
        }
        if let Some(value) = file.heartbeat_secs {
            self.heartbeat = seconds(value, "heartbeat_secs")?;
        }
        if let Some(value) = file.max_long_poll_secs {
            self.max_long_poll = seconds(value, "max_long_poll_secs")?;
        }
        if let Some(value) = file.max_crashes {
            self.max_crashes = value.max(1);
        }
        if let Some(value) = file.max_jobs_per_sweep {
            self.max_jobs_per_sweep = value;
        }
        if let Some(value) = file.max_body_bytes {
            self.max_body_bytes = value;
        }
        if let Some(value) = file.max_yaml_depth {
            let limit = shared::sweep::MAX_YAML_DEPTH;
            anyhow::ensure!((1..=limit).contains(&value), "`max_yaml_depth` must be 1 to {limit}, not {value}");
            self.max_yaml_depth = value;
        }
        if let Some(value) = file.preempt_grace_secs {
            // Up to an hour: a job holding GPUs another user is owed should not keep them longer.
            self.preempt_grace = match Duration::try_from_secs_f64(value) {
                Ok(duration) if duration <= Duration::from_secs(3_600) => duration,
                _ => anyhow::bail!("`preempt_grace_secs` must be a number of seconds from 0 to 3600, not {value}"),
            };
        }
        if let Some(value) = file.min_runtime_secs {
            // Up to a week; 0 lets any job be preempted at once.
            self.min_runtime = match Duration::try_from_secs_f64(value) {
                Ok(duration) if duration <= Duration::from_secs(7 * 86_400) => duration,
                _ => anyhow::bail!("`min_runtime_secs` must be a number of seconds from 0 to 604800, not {value}"),
            };
        }
        if let Some(value) = &file.preemptible {
            self.preemptible = Preemptible::parse(value)?;
        }
        if let Some(value) = file.backfill_after_secs {
            // 0 holds a worker for a large job as soon as one waits.
            self.backfill_after = match Duration::try_from_secs_f64(value) {
                Ok(duration) if duration <= Duration::from_secs(7 * 86_400) => duration,
                _ => anyhow::bail!("`backfill_after_secs` must be a number of seconds from 0 to 604800, not {value}"),
            };
        }
        if let Some(value) = file.header_timeout_secs {
            self.header_timeout = seconds(value, "header_timeout_secs")?;
        }
        if let Some(value) = file.body_idle_secs {
            self.body_idle_timeout = seconds(value, "body_idle_secs")?;
        }
        if let Some(value) = file.max_connections {
            anyhow::ensure!(value >= 1, "`max_connections` must be at least 1");
            self.max_connections = Some(value);
        }
        if let Some(value) = file.max_connections_per_address {
            anyhow::ensure!(value >= 1, "`max_connections_per_address` must be at least 1");
            self.max_connections_per_address = value;
        }
        if let Some(public) = file.metrics_public {
            self.metrics_public = public;
        }
        if let Some(value) = file.max_log_bytes_per_job {
            self.max_log_bytes_per_job = value;
        }
        if let Some(value) = file.telemetry_retention_secs {
            self.telemetry_retention = match Duration::try_from_secs_f64(value) {
                Ok(duration) if !duration.is_zero() && duration <= Duration::from_secs(366 * 86_400) => duration,
                _ => anyhow::bail!("`telemetry_retention_secs` must be above 0 and at most a year, not {value}"),
            };
        }
        if let Some(value) = file.unrecorded_retention_secs {
            self.unrecorded_retention = match Duration::try_from_secs_f64(value) {
                Ok(duration) if duration.is_zero() => None,
                Ok(duration) => Some(duration),
                Err(_) => anyhow::bail!(
                    "`unrecorded_retention_secs` must be a number of seconds (0: keep for ever), not {value}"
                ),
            };
        }
        if let Some(value) = file.max_upload_bytes {
            self.max_upload_bytes = value;
        }
        if let Some(value) = file.max_attempt_upload_bytes {
            self.max_attempt_upload_bytes = value;
        }
        // A token value and a token file may both be given: every token listed is accepted.
        if let Some(tokens) = &file.user_token {
            self.tokens.add_users(tokens, "APP_USER_TOKEN")?;
        }
        if let Some(token) = &file.worker_token {
            self.tokens.add(crate::auth::Role::Worker, token, "APP_WORKER_TOKEN")?;
        }
        if let Some(path) = &file.user_token_file {
            self.tokens.add_file(crate::auth::Role::User, path)?;
        }
        if let Some(path) = &file.worker_token_file {
            self.tokens.add_file(crate::auth::Role::Worker, path)?;
        }
        if let Some(admins) = &file.admins {
            self.tokens.make_admins(admins)?;
        }
        self.apply_shares(file)?;
        match (&file.tls_cert, &file.tls_key) {
            (Some(cert), Some(key)) => self.tls = Some(TlsFiles { cert: cert.clone(), key: key.clone() }),
            (None, None) => {}
            _ => anyhow::bail!("`tls_cert` and `tls_key` go together: set both or neither"),
        }
        Ok(())
    }
}

impl ServerConfig {
    /// The fair-share keys: each name a user name, each weight a number above 0, the
    /// half-life a positive number of seconds.
    fn apply_shares(&mut self, file: &ServerFile) -> anyhow::Result<()> {
        let name = |table: &str, user: &str| {
            shared::names::check_user_name(user)
                .map_err(|why| anyhow::anyhow!("`[server.{table}]` lists a bad name, {user:?}: {why}"))
        };
        if let Some(value) = file.share_half_life_secs {
            anyhow::ensure!(
                value.is_finite() && value > 0.0,
                "`share_half_life_secs` must be a number of seconds above 0, not {value}"
            );
            self.shares.half_life_secs = value;
        }
        if let Some(shares) = &file.shares {
            for (user, weight) in shares {
                name("shares", user)?;
                let weight = match weight {
                    Weight::Number(number) => shared::fair_share::check_weight(user, *number),
                    Weight::Text(text) => Err(format!("the share of `{user}` must be a number above 0, not {text:?}")),
                    Weight::Other(_) => Err(format!("the share of `{user}` must be a number above 0")),
                };
                let weight = weight.map_err(|why| anyhow::anyhow!("`[server.shares]`: {why}"))?;
                self.shares.weights.insert(user.clone(), weight);
            }
        }
        if let Some(classes) = &file.priority_classes {
            for (class, value) in classes {
                shared::names::check_user_name(class).map_err(|_| {
                    anyhow::anyhow!(
                        "`[server.priority_classes]` lists a bad name, {class:?}: 1 to 32 of a-z, 0-9, `_`, `.` and `-`"
                    )
                })?;
                match value {
                    ClassValue::Integer(value) if (-MAX_CLASS_VALUE..=MAX_CLASS_VALUE).contains(value) => {
                        self.priority_classes.insert(class.clone(), *value);
                    }
                    _ => anyhow::bail!(
                        "`[server.priority_classes]`: the class `{class}` must be an integer from \
                         -{MAX_CLASS_VALUE} to {MAX_CLASS_VALUE}"
                    ),
                }
            }
        }
        if let Some(quotas) = &file.quotas {
            for (user, quota) in quotas {
                name("quotas", user)?;
                self.shares.quotas.insert(user.clone(), (*quota).into());
            }
        }
        if let Some(quota) = file.default_quota {
            self.shares.default_quota = quota.into();
        }
        Ok(())
    }
}
