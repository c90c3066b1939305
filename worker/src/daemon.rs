//! The worker's main loop: register, then claim what fits, start attempts, heartbeat (with
//! telemetry, bringing back cancels), finish attempts (claiming the next jobs in the same
//! request; after a short CPU job also a reserve that starts as slots free), and drain on the
//! first stop request, abort on the second. While jobs hold GPUs it also reads the GPUs for
//! their accounting (`accounting`) and hands each attempt its account when its process ends.

use crate::accounting::Accounting;
use crate::attempt::{self, AttemptContext, AttemptEvent};
use crate::config::WorkerConfig;
use crate::containment::Containment;
use crate::executor::Stop;
use crate::guard::Guard;
use crate::inventory::GpuInventory;
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
    /// The client of the current registration.
    client: Client,
    config: Arc<WorkerConfig>,
    inventory: Arc<dyn GpuInventory>,
    max_jobs: u32,
    worker_id: WorkerId,
    /// The server instance of the current registration.
    instance: String,
    /// The current registration's number (see [`Generation`]).
    generation: Generation,
    name: String,
    key: String,
    heartbeat: Duration,
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
}

/// An attempt this worker runs: how to stop it, and when it started.
struct Held {
    stop: mpsc::Sender<Stop>,
    started: Instant,
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
    let (config_work_dir, config_code_cache) = (config.work_dir.clone(), config.code_cache_bytes);

    let reservations = Reservations::new(max_jobs, config.capabilities.clone());
    let mut daemon = Daemon {
        client: base.clone(),
        base,
        name: config.name.clone(),
        key: identity.key.clone(),
        config: Arc::new(config),
        inventory,
        max_jobs,
        worker_id: WorkerId::new(0),
        instance: String::new(),
        generation: 0,
        heartbeat: Duration::from_secs(5),
        reservations,
        running: HashMap::new(),
        reserve: VecDeque::new(),
        events,
        hostname: crate::config::default_name(),
        in_git_tree: false,
        guard: Arc::new(guard),
        containment: Arc::new(containment),
        run_as,
        inherited: Arc::new(crate::job_env::inherited_environment()),
        slots: Arc::default(),
        code: Arc::new(crate::code::CodeCache::new(&config_work_dir, config_code_cache, copier)),
        draining: false,
        finishing: Default::default(),
        slots_in_flight: 0,
        accounting: Accounting::default(),
        cpu_threads,
    };
    daemon.in_git_tree = crate::results::inside_git_tree(&daemon.config.work_dir);
    tokio::select! {
        registered = daemon.register() => registered?,
        _ = stop.recv() => return Ok(()),
    }
    // Requests that can hand out jobs, with the job slots each asked for. One at a time on a
    // box with GPUs (placement needs the answer of one before the next); on a CPU-only box the
    // finishes of several attempts may each claim, for the slots nobody asked for yet.
    let mut claims: ClaimTasks = JoinSet::new();
    let mut claim_not_before = Instant::now();
    let mut claim_failures = 0u32;
    let mut beat: Option<(Generation, JoinHandle<ClientResult<HeartbeatResponse>>)> = None;
    let mut beat_tick = tokio::time::interval(daemon.heartbeat);
    beat_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_telemetry: Option<Instant> = None;
    let mut beat_failures = 0u32;
    let mut abort_deadline: Option<Instant> = None;
    let mut account_tick = tokio::time::interval(daemon.config.telemetry_interval.max(Duration::from_millis(100)));
    account_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if daemon.draining && daemon.running.is_empty() && claims.is_empty() && daemon.reserve.is_empty() {
            tracing::info!("drained: every job finished and reported");
            daemon.leave().await;
            return Ok(());
        }
        if abort_deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            tracing::warn!(jobs = daemon.running.len(), "exiting before every abandoned job was reported");
            return Ok(());
        }
        let piggyback_until =
            daemon.finishing.values().map(|(ended, _)| *ended).min().map(|ended| ended + PIGGYBACK_WAIT);
        let reserve_until = daemon.reserve.front().map(|(_, since)| *since + daemon.reserve_hold());
        let no_finish_due = piggyback_until.is_none_or(|until| Instant::now() >= until);
        if !daemon.draining && claims.is_empty() && no_finish_due && Instant::now() >= claim_not_before {
            daemon.start_claim(&mut claims);
        }
        tokio::select! {
            Some(finished) = claims.join_next(), if !claims.is_empty() => {
                let mut sent_under = daemon.generation;
                let finished = finished.map(|(claimed, asked, generation)| {
                    daemon.slots_in_flight = daemon.slots_in_flight.saturating_sub(asked);
                    sent_under = generation;
                    claimed
                });
                if claims.is_empty() {
                    // Nothing is in flight, whatever a task that failed had asked for.
                    daemon.slots_in_flight = 0;
                }
                let (claimed, reply) = match finished {
                    Ok(Claimed::Claim(answer)) => (answer.map(|response| response.jobs), None),
                    Ok(Claimed::Finish(answer, reply)) => {
                        let jobs = answer.as_ref().map(|response| response.jobs.clone()).map_err(copy_error);
                        (jobs, Some((reply, answer)))
                    }
                    Err(error) => {
                        tracing::error!(%error, "claim task failed");
                        continue;
                    }
                };
                if let Some((reply, answer)) = reply {
                    let _ = reply.send(answer);
                }
                match claimed {
                    Ok(jobs) => {
                        claim_failures = 0;
                        for job in jobs {
                            if daemon.draining { daemon.give_back(job) } else { daemon.start(job) }
                        }
                    }
                    Err(error) if error.status() == Some(401) => daemon.unknown_session(&error, sent_under).await?,
                    Err(error) => {
                        claim_failures += 1;
                        let delay = backoff(claim_failures);
                        claim_not_before = Instant::now() + delay;
                        if claim_failures == 1 || claim_failures.is_multiple_of(10) {
                            tracing::warn!(%error, retry_in = ?delay, "claiming work failed; retrying with backoff");
                        }
                    }
                }
            }
            Some(event) = received.recv() => match event {
                AttemptEvent::ProcessEnded(attempt, account) => {
                    daemon.reservations.release(attempt);
                    let now = Instant::now();
                    let short = daemon.running.get(&attempt).is_some_and(|held| now - held.started < RESERVE_SHORT);
                    daemon.finishing.insert(attempt, (now, short));
                    let _ = account.send(daemon.accounting.end(attempt, now_ms()));
                    daemon.start_reserved();
                }
                AttemptEvent::Finishing { request, reply } => {
                    let ended = daemon.finishing.remove(&JobAttempt { job_id: request.job_id, attempt: request.attempt });
                    // The finish asks for the next jobs itself when it may (see `claims`).
                    let may_claim = claims.is_empty() || daemon.inventory.sample().is_empty();
                    if may_claim && !daemon.draining && Instant::now() >= claim_not_before {
                        let short = ended.is_some_and(|(_, short)| short);
                        daemon.finish_and_claim(*request, reply, short, &mut claims);
                    } else {
                        let (client, worker_id) = (daemon.client.clone(), daemon.worker_id);
                        tokio::spawn(async move { let _ = reply.send(client.finish(worker_id, &request).await); });
                    }
                }
                AttemptEvent::Done(attempt) => {
                    daemon.running.remove(&attempt);
                    daemon.finishing.remove(&attempt);
                }
            },
            _ = account_tick.tick(), if daemon.accounting.is_active() => daemon.read_gpus(),
            _ = beat_tick.tick(), if beat.is_none() => {
                let telemetry_due = last_telemetry.is_none_or(|at| at.elapsed() >= daemon.config.telemetry_interval);
                let gpus = if telemetry_due { last_telemetry = Some(Instant::now()); daemon.inventory.sample() } else { Vec::new() };
                let request = HeartbeatRequest { running: daemon.held(), gpus };
                // Processes that left jobs which have ended: killed, their zombies reaped.
                let (containment, running) = (daemon.containment.clone(), daemon.running.keys().copied().collect());
                tokio::spawn(async move { containment.sweep(&running).await });
                let (client, worker_id) = (daemon.client.clone(), daemon.worker_id);
                beat = Some((daemon.generation, tokio::spawn(async move { client.heartbeat(worker_id, &request).await })));
            }
            answered = async { (&mut beat.as_mut().expect("guarded").1).await }, if beat.is_some() => {
                let sent_under = beat.take().map_or(daemon.generation, |(generation, _)| generation);
                match answered {
                    Ok(Ok(response)) => {
                        if beat_failures > 0 {
                            tracing::info!("the server is reachable again");
                        }
                        beat_failures = 0;
                        daemon.apply(&response);
                    }
                    Ok(Err(error)) if matches!(error.status(), Some(401 | 404)) => daemon.unknown_session(&error, sent_under).await?,
                    Ok(Err(error)) => {
                        beat_failures += 1;
                        if beat_failures == 1 || beat_failures.is_multiple_of(12) {
                            tracing::warn!(%error, "heartbeat failed; jobs keep running, reports wait for the server");
                        }
                    }
                    Err(error) => tracing::error!(%error, "heartbeat task failed"),
                }
            }
            signal = stop.recv() => {
                if signal.is_none() || daemon.draining {
                    tracing::warn!(jobs = daemon.running.len(), "second stop: killing jobs and handing them back");
                    for held in daemon.running.values() {
                        let _ = held.stop.try_send(Stop::Abandon);
                    }
                    daemon.give_back_reserve();
                    claims.abort_all();
                    abort_deadline = Some(Instant::now() + daemon.config.kill_grace + Duration::from_secs(10));
                    daemon.draining = true;
                } else {
                    tracing::info!(jobs = daemon.running.len(), "draining: no new jobs; running jobs finish (stop again to kill them)");
                    daemon.draining = true;
                    daemon.give_back_reserve();
                    // The server ends this worker's parked claim at once and hands it nothing
                    // more; a claim answered meanwhile is handed back (see the claim branch).
                    let (client, worker_id) = (daemon.client.clone(), daemon.worker_id);
                    tokio::spawn(async move {
                        if let Err(error) = client.drain(worker_id).await {
                            tracing::warn!(%error, "telling the server this worker drains failed");
                        }
                    });
                }
            }
            // Only while a backoff is pending: a full worker (no claim to start) must not spin.
            _ = tokio::time::sleep_until(claim_not_before), if claims.is_empty() && !daemon.draining && claim_not_before > Instant::now() => {}
            // A finish that did not come in time: the other slots claim on their own.
            _ = tokio::time::sleep_until(piggyback_until.unwrap_or_else(Instant::now)), if claims.is_empty() && !daemon.draining && !no_finish_due => {}
            _ = tokio::time::sleep(Duration::from_millis(500)), if abort_deadline.is_some() => {}
            // The oldest reserved job waited for a slot long enough: back to the queue.
            _ = tokio::time::sleep_until(reserve_until.unwrap_or_else(Instant::now)), if reserve_until.is_some() => {
                daemon.expire_reserve();
            }
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_millis() as i64)
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

#[path = "daemon_ops.rs"]
mod ops;
