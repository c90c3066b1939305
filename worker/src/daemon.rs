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

impl Daemon {
    /// Registers (again), telling the server which attempts are still alive here; retries
    /// while the server is unreachable, saying so once per interval.
    async fn register(&mut self) -> anyhow::Result<()> {
        let mut failures = 0u32;
        loop {
            let request = RegisterRequest {
                name: self.config.name.clone(),
                protocol: shared::PROTOCOL_VERSION,
                key: Some(self.key.clone()),
                capacity: Reservations::new(self.max_jobs, self.config.capabilities.clone())
                    .capacity(&self.inventory.sample()),
                holding: self.held(),
            };
            match self.base.register(&request).await {
                Ok(response) => {
                    self.client = self.base.with_session(&response).context("registering with the server")?;
                    self.generation += 1;
                    self.worker_id = response.worker_id;
                    self.instance = response.instance.clone();
                    self.name = response.name.clone();
                    self.heartbeat = Duration::from_millis(response.heartbeat_ms.max(100));
                    if response.name != self.config.name {
                        tracing::warn!(
                            asked = %self.config.name, registered = %response.name,
                            "a live worker on another box uses this name; registered under another (set --name)"
                        );
                    }
                    tracing::info!(
                        worker = %response.name, id = %response.worker_id, url = %self.client.base_url(),
                        max_jobs = self.max_jobs, trainer = self.config.capabilities.trainer,
                        "registered with the server"
                    );
                    return Ok(());
                }
                Err(error) if error.is_retryable() => {
                    failures += 1;
                    let delay = backoff(failures);
                    if failures == 1 || failures.is_multiple_of(10) {
                        tracing::warn!(%error, retry_in = ?delay, "cannot register with the server; retrying with backoff");
                    }
                    tokio::time::sleep(delay).await;
                }
                Err(error) => return Err(error).context("registering with the server"),
            }
        }
    }

    /// Tells the server this worker stops cleanly (shown as `left`, not `lost`); a server that
    /// does not answer within two seconds is not waited for.
    async fn leave(&self) {
        let said = tokio::time::timeout(Duration::from_secs(2), self.client.leave(self.worker_id)).await;
        if let Ok(Err(error)) = said {
            tracing::debug!(%error, "telling the server this worker left");
        }
    }

    /// A request sent under registration `sent_under` was refused as unknown: registers again
    /// when that is the current registration; an earlier one's refusal is stale.
    async fn unknown_session(&mut self, error: &ClientError, sent_under: Generation) -> anyhow::Result<()> {
        if sent_under != self.generation {
            tracing::debug!(%error, "a refusal answering an earlier registration; this one stands");
            return Ok(());
        }
        self.register_again(error).await
    }

    /// The server no longer knows this registration (it is another instance, on a new
    /// database, or the worker registered again elsewhere): what runs here was handed out by
    /// the old one, so it is stopped (and reports nothing), and the worker registers afresh.
    async fn register_again(&mut self, error: &ClientError) -> anyhow::Result<()> {
        tracing::warn!(%error, jobs = self.running.len(), "the server no longer knows this worker's session; stopping its jobs and registering again");
        for held in self.running.values() {
            let _ = held.stop.try_send(Stop::Lost);
        }
        self.running.clear();
        // The reserved jobs never ran: the new registration names them as held (the same
        // server instance keeps them, without counting a crash), and they go back to the queue.
        // Another instance (a new database) never handed them out: they are dropped.
        let instance = self.instance.clone();
        self.register().await?;
        if self.instance == instance {
            self.give_back_reserve();
        } else {
            self.reserve.clear();
        }
        Ok(())
    }

    /// What this worker can take now, less the slots claims in flight asked for and the jobs
    /// already reserved; with `reserve`, also how many more it may hold until a slot frees.
    fn free_capacity(&self, reserve: bool) -> (shared::placement::Capacity, u32) {
        let gpus = self.inventory.sample();
        let mut capacity = self.reservations.capacity(&gpus);
        let extra = if reserve && gpus.is_empty() && !self.draining { self.max_jobs.min(MAX_RESERVE) } else { 0 };
        let taken = self.slots_in_flight + self.reserve.len() as u32;
        let total = (capacity.job_slots + extra).saturating_sub(taken);
        capacity.job_slots = capacity.job_slots.saturating_sub(taken);
        let reserve = total - capacity.job_slots;
        (capacity, reserve)
    }

    /// The attempts the server should keep leased to this worker: running and reserved.
    fn held(&self) -> Vec<JobAttempt> {
        let reserved = self.reserve.iter().map(|(job, _)| JobAttempt { job_id: job.id, attempt: job.attempt });
        self.running.keys().copied().chain(reserved).collect()
    }

    /// Starts reserved jobs while slots are free.
    fn start_reserved(&mut self) {
        while !self.reserve.is_empty() && self.reservations.capacity(&self.inventory.sample()).job_slots > 0 {
            if let Some((job, _)) = self.reserve.pop_front() {
                self.start(job);
            }
        }
    }

    fn reserve_hold(&self) -> Duration {
        RESERVE_HOLD.min(self.heartbeat)
    }

    /// Hands back the reserved jobs that waited their hold for a slot.
    fn expire_reserve(&mut self) {
        let (now, hold) = (Instant::now(), self.reserve_hold());
        while self.reserve.front().is_some_and(|(_, since)| now >= *since + hold) {
            if let Some((job, _)) = self.reserve.pop_front() {
                tracing::debug!(job = %job.id, "a reserved job found no free slot in time; handing it back");
                self.give_back(job);
            }
        }
    }

    /// Hands back every reserved job (draining, stopping).
    fn give_back_reserve(&mut self) {
        for (job, _) in std::mem::take(&mut self.reserve) {
            self.give_back(job);
        }
    }

    fn start_claim(&mut self, claims: &mut ClaimTasks) {
        let (capacity, _) = self.free_capacity(false);
        if capacity.job_slots == 0 {
            return;
        }
        // While jobs run, come back soon: one ending may make room for a job that did not fit.
        let wait = if self.reservations.is_empty() { self.config.claim_wait } else { Duration::from_secs(1) };
        let asked = capacity.job_slots;
        self.slots_in_flight += asked;
        let request = ClaimRequest { capacity, wait_ms: wait.as_millis() as u64, reserve: 0 };
        let (client, worker_id) = (self.client.clone(), self.worker_id);
        let generation = self.generation;
        claims.spawn(async move { (Claimed::Claim(client.claim(worker_id, &request).await), asked, generation) });
    }

    /// Sends an attempt's finish with a claim of what fits now (without waiting for new work),
    /// and a reserve when the attempt's process was `short`.
    fn finish_and_claim(
        &mut self,
        mut request: FinishRequest,
        reply: oneshot::Sender<ClientResult<FinishResponse>>,
        short: bool,
        claims: &mut ClaimTasks,
    ) {
        let (capacity, reserve) = self.free_capacity(short);
        let asked = capacity.job_slots + reserve;
        if asked > 0 {
            request.claim = Some(ClaimRequest { capacity, wait_ms: 0, reserve });
        }
        self.slots_in_flight += asked;
        let (client, worker_id) = (self.client.clone(), self.worker_id);
        let generation = self.generation;
        claims.spawn(
            async move { (Claimed::Finish(client.finish(worker_id, &request).await, reply), asked, generation) },
        );
    }

    /// Places a claimed job on this worker's GPUs and starts it.
    fn start(&mut self, job: ClaimedJob) {
        let gpus = self.inventory.sample();
        let capacity = self.reservations.capacity(&gpus);
        let Some(placement) = keep_or_place(&job.resources, &job.placement, &capacity) else {
            // A reserve asked for (a CPU box, every slot taken): it starts when one frees.
            if gpus.is_empty() && capacity.job_slots == 0 && !self.draining {
                self.reserve.push_back((job, Instant::now()));
                return;
            }
            tracing::warn!(job = %job.id, "claimed a job that no longer fits; handing it back");
            return self.give_back(job);
        };
        let names: Vec<(u32, String)> = placement
            .gpus
            .iter()
            .map(|index| {
                let name = gpus.iter().find(|gpu| gpu.index == *index).map(|gpu| gpu.name.clone()).unwrap_or_default();
                (*index, name)
            })
            .collect();
        let attempt = JobAttempt { job_id: job.id, attempt: job.attempt };
        self.accounting.begin(attempt, &placement.gpus, now_ms());
        self.reservations.hold(attempt, job.resources.clone(), placement);
        let (stop, stopped) = mpsc::channel(4);
        self.running.insert(attempt, Held { stop: stop.clone(), started: Instant::now() });
        tracing::debug!(job = %job.id, attempt = job.attempt, sweep = %job.sweep, index = job.index, gpus = ?names, "starting");
        let context = AttemptContext {
            client: self.client.clone(),
            worker_id: self.worker_id,
            worker_name: self.name.clone(),
            hostname: self.hostname.clone(),
            config: self.config.clone(),
            in_git_tree: self.in_git_tree,
            guard: self.guard.clone(),
            containment: self.containment.clone(),
            run_as: self.run_as.clone(),
            inherited: self.inherited.clone(),
            slots: self.slots.clone(),
            code: self.code.clone(),
            cpu_threads: self.cpu_threads,
        };
        tokio::spawn(attempt::run(context, job, names, stopped, stop, self.events.clone()));
    }

    /// Reads the GPUs and whose processes use them, for the accounts of the running attempts.
    fn read_gpus(&mut self) {
        let gpus = self.inventory.sample();
        let processes = crate::job_processes::attribute(self.inventory.processes());
        self.accounting.record(now_ms(), &gpus, &processes);
    }

    /// Returns a job this worker will not run; the server requeues it without counting a crash.
    /// Tried a few times while the server is unreachable (a few seconds, well within a lease).
    fn give_back(&self, job: ClaimedJob) {
        let report = ReportRequest { worker_id: self.worker_id, attempt: job.attempt, outcome: Outcome::Abandoned };
        let client = self.client.clone();
        tokio::spawn(async move {
            let mut delay = Duration::from_millis(250);
            for tries_left in (0..4).rev() {
                match client.report(job.id, &report).await {
                    Ok(_) => return,
                    Err(error) if error.is_retryable() && tries_left > 0 => tokio::time::sleep(delay).await,
                    Err(error) => {
                        tracing::warn!(job = %job.id, %error, "handing a job back failed; it returns to the queue when its lease ends");
                        return;
                    }
                }
                delay *= 2;
            }
        });
    }

    /// Acts on a heartbeat's answer: kill cancelled attempts and attempts no longer ours.
    /// A cancelled reserved job is handed back (the server records it cancelled); one no
    /// longer ours is dropped.
    fn apply(&mut self, response: &HeartbeatResponse) {
        for (attempts, reason) in [(&response.cancel, Stop::Cancel), (&response.unknown, Stop::Lost)] {
            for attempt in attempts {
                if let Some(held) = self.running.get(attempt) {
                    tracing::info!(job = %attempt.job_id, ?reason, "stopping an attempt at the server's word");
                    let _ = held.stop.try_send(reason);
                }
                let reserved =
                    self.reserve.iter().position(|(job, _)| job.id == attempt.job_id && job.attempt == attempt.attempt);
                if let Some((job, _)) = reserved.and_then(|at| self.reserve.remove(at)) {
                    tracing::info!(job = %attempt.job_id, ?reason, "dropping a reserved job at the server's word");
                    if reason == Stop::Cancel {
                        self.give_back(job);
                    }
                }
            }
        }
    }
}
