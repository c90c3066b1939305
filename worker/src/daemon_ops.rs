//! What the worker's loop does, one method per step: registering (again) and leaving, the
//! slots it may claim for, starting, reserving and handing back jobs, finishing with a claim,
//! reading the GPUs for accounting, and applying a heartbeat's answer.

use super::*;

impl Daemon {
    /// Tells the server this worker stops cleanly (shown as `left`, not `lost`); a server that
    /// does not answer within two seconds is not waited for.
    pub(super) async fn leave(&self) {
        let said =
            tokio::time::timeout(Duration::from_secs(2), self.session.client.leave(self.session.worker_id)).await;
        if let Ok(Err(error)) = said {
            tracing::debug!(%error, "telling the server this worker left");
        }
    }

    /// A request sent under registration `sent_under` was refused as unknown: registers again
    /// when that is the current registration; an earlier one's refusal is stale.
    pub(super) async fn unknown_session(&mut self, error: &ClientError, sent_under: Generation) -> anyhow::Result<()> {
        if sent_under != self.session.generation {
            tracing::debug!(%error, "a refusal answering an earlier registration; this one stands");
            return Ok(());
        }
        self.register_again(error).await
    }

    /// The server no longer knows this registration (it is another instance, on a new
    /// database, or the worker registered again elsewhere): what runs here was handed out by
    /// the old one, so it is stopped (and reports nothing), and the worker registers afresh.
    pub(super) async fn register_again(&mut self, error: &ClientError) -> anyhow::Result<()> {
        tracing::warn!(%error, jobs = self.running.len(), "the server no longer knows this worker's session; stopping its jobs and registering again");
        for held in self.running.values() {
            let _ = held.stop.try_send(Stop::Lost);
        }
        self.running.clear();
        // The reserved jobs never ran: the new registration names them as held (the same
        // server instance keeps them, without counting a crash), and they go back to the queue.
        // Another instance (a new database) never handed them out: they are dropped.
        let generation = self.session.generation + 1;
        let holding = self.held();
        let session =
            register(&self.base, &self.config, &self.key, &*self.inventory, self.max_jobs, holding, generation).await?;
        let same_instance = session.instance == self.session.instance;
        self.session = session;
        if same_instance {
            self.give_back_reserve();
        } else {
            self.reserve.clear();
        }
        Ok(())
    }

    /// What this worker can take now, less the slots claims in flight asked for and the jobs
    /// already reserved; with `reserve`, also how many more it may hold until a slot frees.
    pub(super) fn free_capacity(&self, reserve: bool) -> (shared::placement::Capacity, u32) {
        let gpus = self.inventory.sample();
        let mut capacity = self.reservations.capacity(&gpus);
        let extra = if reserve && gpus.is_empty() && !self.draining { self.max_jobs.min(MAX_RESERVE) } else { 0 };
        let taken = self.slots_in_flight + self.reserve.len() as u32;
        let total = (capacity.job_slots + extra).saturating_sub(taken);
        capacity.job_slots = capacity.job_slots.saturating_sub(taken);
        let reserve = total - capacity.job_slots;
        (capacity, reserve)
    }

    /// The saves its running attempts made since the last heartbeat (each one's latest).
    pub(super) fn saves(&self) -> Vec<shared::api::SaveNote> {
        let latest = |held: &Held| held.saved.lock().ok().and_then(|mut latest| latest.take());
        let saves = self.running.iter().filter_map(|(attempt, held)| Some((*attempt, latest(held)?)));
        saves.map(|(attempt, (at, every_ms))| shared::api::SaveNote { attempt, at, every_ms }).collect()
    }

    /// The attempts the server should keep leased to this worker: running and reserved.
    pub(super) fn held(&self) -> Vec<JobAttempt> {
        let reserved = self.reserve.iter().map(|(job, _)| JobAttempt { job_id: job.id, attempt: job.attempt });
        self.running.keys().copied().chain(reserved).collect()
    }

    /// Starts reserved jobs while slots are free.
    pub(super) fn start_reserved(&mut self) {
        while !self.reserve.is_empty() && self.reservations.capacity(&self.inventory.sample()).job_slots > 0 {
            if let Some((job, _)) = self.reserve.pop_front() {
                self.start(job);
            }
        }
    }

    pub(super) fn reserve_hold(&self) -> Duration {
        RESERVE_HOLD.min(self.session.heartbeat)
    }

    /// Hands back the reserved jobs that waited their hold for a slot.
    pub(super) fn expire_reserve(&mut self) {
        let (now, hold) = (Instant::now(), self.reserve_hold());
        while self.reserve.front().is_some_and(|(_, since)| now >= *since + hold) {
            if let Some((job, _)) = self.reserve.pop_front() {
                tracing::debug!(job = %job.id, "a reserved job found no free slot in time; handing it back");
                self.give_back(job);
            }
        }
    }

    /// Hands back every reserved job (draining, stopping).
    pub(super) fn give_back_reserve(&mut self) {
        for (job, _) in std::mem::take(&mut self.reserve) {
            self.give_back(job);
        }
    }

    pub(super) fn start_claim(&mut self) {
        let (capacity, _) = self.free_capacity(false);
        if capacity.job_slots == 0 {
            return;
        }
        // While jobs run, come back soon: one ending may make room for a job that did not fit.
        let wait = if self.reservations.is_empty() { self.config.claim_wait } else { Duration::from_secs(1) };
        let asked = capacity.job_slots;
        self.slots_in_flight += asked;
        let request = ClaimRequest { capacity, wait_ms: wait.as_millis() as u64, reserve: 0 };
        let (client, worker_id) = (self.session.client.clone(), self.session.worker_id);
        let generation = self.session.generation;
        self.claims
            .tasks
            .spawn(async move { (Claimed::Claim(client.claim(worker_id, &request).await), asked, generation) });
    }

    /// Sends an attempt's finish with a claim of what fits now (without waiting for new work),
    /// and a reserve when the attempt's process was `short`.
    pub(super) fn finish_and_claim(
        &mut self,
        mut request: FinishRequest,
        reply: oneshot::Sender<ClientResult<FinishResponse>>,
        short: bool,
    ) {
        let (capacity, reserve) = self.free_capacity(short);
        let asked = capacity.job_slots + reserve;
        if asked > 0 {
            request.claim = Some(ClaimRequest { capacity, wait_ms: 0, reserve });
        }
        self.slots_in_flight += asked;
        let (client, worker_id) = (self.session.client.clone(), self.session.worker_id);
        let generation = self.session.generation;
        self.claims.tasks.spawn(async move {
            (Claimed::Finish(client.finish(worker_id, &request).await, reply), asked, generation)
        });
    }

    /// Places a claimed job on this worker's GPUs and starts it.
    pub(super) fn start(&mut self, job: ClaimedJob) {
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
        let saved = crate::saves::Latest::default();
        self.running.insert(attempt, Held { stop: stop.clone(), started: Instant::now(), saved: saved.clone() });
        tracing::debug!(job = %job.id, attempt = job.attempt, sweep = %job.sweep, index = job.index, gpus = ?names, "starting");
        let context = AttemptContext {
            client: self.session.client.clone(),
            worker_id: self.session.worker_id,
            worker_name: self.session.name.clone(),
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
            capture_dir: self.capture_dir.clone(),
        };
        tokio::spawn(attempt::run(context, job, names, (stopped, stop), saved, self.events.clone()));
    }

    /// Reads the GPUs and whose processes use them, for the accounts of the running attempts.
    pub(super) fn read_gpus(&mut self) {
        let gpus = self.inventory.sample();
        let processes = crate::job_processes::attribute(self.inventory.processes());
        self.accounting.record(now_ms(), &gpus, &processes);
    }

    /// Returns a job this worker will not run; the server requeues it without counting a crash.
    /// Tried a few times while the server is unreachable (a few seconds, well within a lease).
    pub(super) fn give_back(&self, job: ClaimedJob) {
        self.give_back_as(job, Outcome::Abandoned);
    }

    /// [`Self::give_back`] with the outcome to report (`Preempted` for a preempted reserved job,
    /// so that its requeue says why).
    fn give_back_as(&self, job: ClaimedJob, outcome: Outcome) {
        let report = ReportRequest { worker_id: self.session.worker_id, attempt: job.attempt, outcome };
        let client = self.session.client.clone();
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

    /// Acts on a heartbeat's answer: kill cancelled and preempted attempts and attempts no
    /// longer ours. A cancelled or preempted reserved job is handed back (the server records
    /// it cancelled, or requeues it); one no longer ours is dropped.
    pub(super) fn apply(&mut self, response: &HeartbeatResponse) {
        let preempt = Stop::Preempt(Duration::from_millis(response.preempt_grace_ms));
        for (attempts, reason) in
            [(&response.cancel, Stop::Cancel), (&response.unknown, Stop::Lost), (&response.preempt, preempt)]
        {
            for attempt in attempts {
                if let Some(held) = self.running.get(attempt) {
                    tracing::info!(job = %attempt.job_id, ?reason, "stopping an attempt at the server's word");
                    let _ = held.stop.try_send(reason);
                }
                let reserved =
                    self.reserve.iter().position(|(job, _)| job.id == attempt.job_id && job.attempt == attempt.attempt);
                if let Some((job, _)) = reserved.and_then(|at| self.reserve.remove(at)) {
                    tracing::info!(job = %attempt.job_id, ?reason, "dropping a reserved job at the server's word");
                    match reason {
                        Stop::Lost => {}
                        Stop::Preempt(_) => self.give_back_as(job, Outcome::Preempted),
                        _ => self.give_back(job),
                    }
                }
            }
        }
    }
}

/// Registers with the server under registration number `generation`, telling it which
/// attempts are still alive here (`holding`); retries while the server is unreachable, saying
/// so once per interval.
pub(super) async fn register(
    base: &Client,
    config: &WorkerConfig,
    key: &str,
    inventory: &dyn GpuInventory,
    max_jobs: u32,
    holding: Vec<JobAttempt>,
    generation: Generation,
) -> anyhow::Result<Session> {
    let mut failures = 0u32;
    loop {
        let request = RegisterRequest {
            name: config.name.clone(),
            protocol: shared::PROTOCOL_VERSION,
            key: Some(key.to_string()),
            capacity: Reservations::new(max_jobs, config.capabilities.clone()).capacity(&inventory.sample()),
            holding: holding.clone(),
        };
        match base.register(&request).await {
            Ok(response) => {
                let client = base.with_session(&response).context("registering with the server")?;
                if response.name != config.name {
                    tracing::warn!(
                        asked = %config.name, registered = %response.name,
                        "a live worker on another box uses this name; registered under another (set --name)"
                    );
                }
                tracing::info!(
                    worker = %response.name, id = %response.worker_id, url = %client.base_url(),
                    max_jobs, trainer = config.capabilities.trainer,
                    "registered with the server"
                );
                return Ok(Session {
                    client,
                    worker_id: response.worker_id,
                    instance: response.instance,
                    generation,
                    name: response.name,
                    heartbeat: Duration::from_millis(response.heartbeat_ms.max(100)),
                });
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
