//! The worker's main loop: register, then claim what fits, start attempts, heartbeat (with
//! telemetry, bringing back cancels), finish attempts (claiming the next jobs in the same
//! request; after a short CPU job also a reserve that starts as slots free), and drain on the
//! first stop request, abort on the second. While jobs hold GPUs it also reads the GPUs for
//! their accounting (`accounting`) and hands each attempt its account when its process ends.
//!
//! The loop waits on one `select!`; each arm calls one step (`daemon_steps.rs`: `on_claim_answer`,
//! `on_attempt_event`, `on_heartbeat_due`, `on_heartbeat_answer`, `on_stop`), whose state lives
//! in small structs ([`Session`], [`Claims`], [`Beats`]); what the steps do is `daemon_ops.rs`.

use crate::accounting::Accounting;
use crate::attempt::{self, AttemptContext, AttemptEvent};
use crate::config::WorkerConfig;
use crate::containment::Containment;
use crate::executor::Stop;
use crate::guard::Guard;
use crate::inventory::GpuInventory;
use crate::now_ms;
use crate::reservations::{cpu_threads_per_job, default_max_jobs, Reservations};
use crate::run_as::RunAs;
use anyhow::Context;
use client::{Client, ClientError, ClientResult};
use shared::api::{
    ClaimRequest, ClaimResponse, ClaimedJob, FinishRequest, FinishResponse, HeartbeatRequest, HeartbeatResponse,
    JobAttempt, RegisterRequest, ReportRequest, WorkerId, MAX_RESERVE,
};
use shared::job::Outcome;
use shared::placement::keep_or_place;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// How long the box's free slots wait for a finishing attempt's request to claim for them.
/// A short job's finish follows its end within milliseconds; one that streams large outputs
/// first, or whose server refuses them (a full disk), can take minutes.
const PIGGYBACK_WAIT: Duration = Duration::from_millis(500);

/// A job whose process ran shorter than this lets a CPU box's finish claim a reserve: jobs
/// held, leased, until a slot frees, so the next job starts the moment a process ends instead
/// of one round trip later. Longer jobs gain nothing from it worth a job held from other workers.
const RESERVE_SHORT: Duration = Duration::from_millis(250);
/// How long a reserved job waits for a slot before it is handed back to the queue (a short
/// job followed by a long one must not keep the reserve from idle workers); shorter when the
/// server's heartbeat interval is, so that a reserved job starts well within its lease.
const RESERVE_HOLD: Duration = Duration::from_secs(1);

/// Requests that can hand out jobs, in flight: each with the job slots it asked for and the
/// registration it was sent under.
type ClaimTasks = JoinSet<(Claimed, u32, Generation)>;

/// Counts registrations: a 401 answering a request sent under an earlier one says nothing
/// about the current one (the worker registered again meanwhile) and is ignored; acting on it
/// would stop the attempts the new registration just started.
type Generation = u64;

/// What a request that can hand out jobs brought back.
enum Claimed {
    Claim(ClientResult<ClaimResponse>),
    /// A finish that carried a claim: its answer also goes back to the attempt.
    Finish(ClientResult<FinishResponse>, oneshot::Sender<ClientResult<FinishResponse>>),
}

struct Daemon {
    /// The client as configured, without a session.
    base: Client,
    config: Arc<WorkerConfig>,
    inventory: Arc<dyn GpuInventory>,
    max_jobs: u32,
    /// The current registration.
    session: Session,
    key: String,
    reservations: Reservations,
    /// The attempts this worker runs (or is still reporting), each with the channel that stops
    /// it. Keyed by attempt: after a lease expiry the same job can come back to this worker
    /// while its earlier attempt is still being torn down.
    running: HashMap<JobAttempt, Held>,
    /// Jobs claimed ahead on a CPU box running short jobs, oldest first, with when each came:
    /// started as slots free (see `RESERVE_SHORT`), handed back after `RESERVE_HOLD`.
    reserve: VecDeque<(ClaimedJob, Instant)>,
    events: mpsc::Sender<AttemptEvent>,
    hostname: String,
    in_git_tree: bool,
    guard: Arc<Guard>,
    containment: Arc<Containment>,
    run_as: Option<Arc<RunAs>>,
    inherited: Arc<Vec<(std::ffi::OsString, std::ffi::OsString)>>,
    slots: Arc<crate::slots::Slots>,
    code: Arc<crate::code::CodeCache>,
    capture_dir: Option<Arc<std::path::PathBuf>>,
    draining: bool,
    /// Attempts whose process ended and whose finish request is still being built, with when
    /// their process ended: the finish will claim the next jobs, so no claim of its own is
    /// started meanwhile (that would cost a second request and a second transaction per job),
    /// for `PIGGYBACK_WAIT` at most: a finish that takes longer (large outputs streaming, a
    /// server refusing them) must not keep the box's other slots idle. With each, whether its
    /// process was short (its finish may claim a reserve).
    finishing: HashMap<JobAttempt, (Instant, bool)>,
    /// Job slots asked for by claims not answered yet.
    slots_in_flight: u32,
    /// What the attempts holding GPUs have used of them so far.
    accounting: Accounting,
    /// `OMP_NUM_THREADS` for CPU jobs: the share of the cores each of `max_jobs` jobs gets
    /// (`None` when jobs do not share the box or the worker's own environment sets it).
    cpu_threads: Option<u32>,
    claims: Claims,
    beats: Beats,
    /// After a second stop: when the worker exits whether or not its abandoned jobs reported.
    abort_deadline: Option<Instant>,
}

/// Who this worker is to the server, as its registration answered.
struct Session {
    /// The client of this registration.
    client: Client,
    worker_id: WorkerId,
    /// The server instance that registered it.
    instance: String,
    /// This registration's number (see [`Generation`]).
    generation: Generation,
    name: String,
    heartbeat: Duration,
}

/// Requests that can hand out jobs. One at a time on a box with GPUs (placement needs the
/// answer of one before the next); on a CPU-only box the finishes of several attempts may each
/// claim, for the slots nobody asked for yet.
struct Claims {
    tasks: ClaimTasks,
    /// No claim starts before this (a backoff after failures).
    not_before: Instant,
    /// Failed claims in a row.
    failures: u32,
}

/// The heartbeat in flight, with the registration it was sent under.
struct Beats {
    in_flight: Option<(Generation, JoinHandle<ClientResult<HeartbeatResponse>>)>,
    /// When telemetry last went with a heartbeat.
    last_telemetry: Option<Instant>,
    /// Failed heartbeats in a row.
    failures: u32,
}

/// An attempt this worker runs: how to stop it, and when it started.
struct Held {
    stop: mpsc::Sender<Stop>,
    started: Instant,
    /// Its latest checkpoint save, for the next heartbeat.
    saved: crate::saves::Latest,
}

/// Runs the worker until `stop` has been signalled and its jobs are done (first signal:
/// drain) or killed and handed back (second signal).
pub async fn run(
    mut config: WorkerConfig,
    inventory: Arc<dyn GpuInventory>,
    mut stop: mpsc::UnboundedReceiver<()>,
) -> anyhow::Result<()> {
    let base = Client::with_options(&config.url, &config.connection)
        .with_context(|| format!("worker server URL {}", config.url))?;
    tokio::fs::create_dir_all(&config.work_dir)
        .await
        .with_context(|| format!("creating the work directory {}", config.work_dir.display()))?;
    // Jobs run in their own directories: every path they are given must be absolute.
    config.work_dir = tokio::fs::canonicalize(&config.work_dir)
        .await
        .with_context(|| format!("resolving the work directory {}", config.work_dir.display()))?;
    let identity = crate::identity::take(&config.work_dir)?;
    let run_as = config.run_as.as_deref().map(RunAs::resolve).transpose()?.map(Arc::new);
    let containment = Containment::start(config.cgroups);
    // A kept attempt directory is a plain copy: an overlay's view would not survive it. A
    // `run_as` job owns its copy whole (an overlay's files would stay root's, see `run_as`).
    let wanted_copy = match config.keep_work_dirs || run_as.is_some() {
        true => crate::code_copy::CodeCopy::Copy,
        false => config.code_copy,
    };
    let copier = Arc::new(crate::code_copy::Copier::start(&config.work_dir, wanted_copy));
    config.capabilities.code_copy = Some(copier.describe().to_string());
    let guard = Guard::start(containment.cgroup_dir(), Some(&config.work_dir))
        .context("starting the guard that ends jobs with their worker")?;
    if let Some(pid) = guard.pid() {
        containment.started(pid);
    }
    tracing::info!(
        processes = %containment.describe(),
        run_as = run_as.as_ref().map_or("the worker's user", |user| user.name.as_str()),
        code_copy = copier.describe(),
        jobs_may_trace = crate::hardening::jobs_may_trace(),
        "jobs are kept"
    );
    let max_jobs = config.max_jobs.unwrap_or_else(|| default_max_jobs(inventory.sample().len())).max(1);
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let cpu_threads = cpu_threads_per_job(cores, max_jobs).filter(|_| std::env::var_os("OMP_NUM_THREADS").is_none());
    let (events, mut received) = mpsc::channel(256);
    // Before registering, as ever: the code cache clears what an earlier run left half made.
    let code = Arc::new(crate::code::CodeCache::new(&config.work_dir, config.code_cache_bytes, copier));
    let inherited = Arc::new(crate::job_env::inherited_environment());
    let in_git_tree = crate::results::inside_git_tree(&config.work_dir);
    let capture_dir = match crate::collect::python::install(&config.work_dir) {
        Ok(dir) => Some(Arc::new(dir)),
        Err(error) => {
            tracing::warn!(%error, "writing the Python files that capture wandb.log failed: jobs' W&B calls are not captured");
            None
        }
    };
    let session = tokio::select! {
        registered = register(&base, &config, &identity.key, &*inventory, max_jobs, Vec::new(), 1) => registered?,
        _ = stop.recv() => return Ok(()),
    };
    let reservations = Reservations::new(max_jobs, config.capabilities.clone());
    let mut daemon = Daemon {
        base,
        session,
        key: identity.key.clone(),
        config: Arc::new(config),
        inventory,
        max_jobs,
        reservations,
        running: HashMap::new(),
        reserve: VecDeque::new(),
        events,
        hostname: crate::config::default_name(),
        in_git_tree,
        guard: Arc::new(guard),
        containment: Arc::new(containment),
        run_as,
        inherited,
        slots: Arc::default(),
        code,
        capture_dir,
        draining: false,
        finishing: Default::default(),
        slots_in_flight: 0,
        accounting: Accounting::default(),
        cpu_threads,
        claims: Claims { tasks: JoinSet::new(), not_before: Instant::now(), failures: 0 },
        beats: Beats { in_flight: None, last_telemetry: None, failures: 0 },
        abort_deadline: None,
    };
    let mut beat_tick = tokio::time::interval(daemon.session.heartbeat);
    beat_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut account_tick = tokio::time::interval(daemon.config.telemetry_interval.max(Duration::from_millis(100)));
    account_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if daemon.ended().await {
            return Ok(());
        }
        let piggyback_until =
            daemon.finishing.values().map(|(ended, _)| *ended).min().map(|ended| ended + PIGGYBACK_WAIT);
        let reserve_until = daemon.reserve.front().map(|(_, since)| *since + daemon.reserve_hold());
        let no_finish_due = piggyback_until.is_none_or(|until| Instant::now() >= until);
        if daemon.claims.tasks.is_empty()
            && !daemon.draining
            && no_finish_due
            && Instant::now() >= daemon.claims.not_before
        {
            daemon.start_claim();
        }
        let idle = daemon.claims.tasks.is_empty() && !daemon.draining;
        let claim_not_before = daemon.claims.not_before;
        tokio::select! {
            Some(finished) = daemon.claims.tasks.join_next(), if !daemon.claims.tasks.is_empty() => {
                daemon.on_claim_answer(finished).await?;
            }
            Some(event) = received.recv() => daemon.on_attempt_event(event),
            _ = account_tick.tick(), if daemon.accounting.is_active() => daemon.read_gpus(),
            _ = beat_tick.tick(), if daemon.beats.in_flight.is_none() => daemon.on_heartbeat_due(),
            answered = beat_answer(&mut daemon.beats.in_flight), if daemon.beats.in_flight.is_some() => {
                daemon.on_heartbeat_answer(answered).await?;
            }
            signal = stop.recv() => daemon.on_stop(signal),
            // Only while a backoff is pending: a full worker (no claim to start) must not spin.
            _ = tokio::time::sleep_until(claim_not_before), if idle && claim_not_before > Instant::now() => {}
            // A finish that did not come in time: the other slots claim on their own.
            _ = tokio::time::sleep_until(piggyback_until.unwrap_or_else(Instant::now)), if idle && !no_finish_due => {}
            _ = tokio::time::sleep(Duration::from_millis(500)), if daemon.abort_deadline.is_some() => {}
            // The oldest reserved job waited for a slot long enough: back to the queue.
            _ = tokio::time::sleep_until(reserve_until.unwrap_or_else(Instant::now)), if reserve_until.is_some() => {
                daemon.expire_reserve();
            }
        }
    }
}

/// The answer of the heartbeat in flight (the loop polls this only while there is one).
async fn beat_answer(
    in_flight: &mut Option<(Generation, JoinHandle<ClientResult<HeartbeatResponse>>)>,
) -> Result<ClientResult<HeartbeatResponse>, tokio::task::JoinError> {
    match in_flight {
        Some((_, handle)) => handle.await,
        None => std::future::pending().await,
    }
}

fn backoff(failures: u32) -> Duration {
    Duration::from_millis(250u64.saturating_mul(1 << failures.min(7))).min(Duration::from_secs(30))
}

/// The same failure for a second reader (the claim branch and the attempt both look at it).
fn copy_error(error: &ClientError) -> ClientError {
    match error {
        ClientError::Unreachable { url, reason } => {
            ClientError::Unreachable { url: url.clone(), reason: reason.clone() }
        }
        ClientError::Server { url, status, message } => {
            ClientError::Server { url: url.clone(), status: *status, message: message.clone() }
        }
        ClientError::Rejected { status, message } => {
            ClientError::Rejected { status: *status, message: message.clone() }
        }
        ClientError::Decode { url, reason } => ClientError::Decode { url: url.clone(), reason: reason.clone() },
    }
}

use ops::register;

#[path = "daemon_ops.rs"]
mod ops;
#[path = "daemon_steps.rs"]
mod steps;
