//! One attempt from start to finish: prepare its directory (code, checkpoint: `workspace`), run
//! it while shipping its log and metrics and uploading its checkpoints, then (after the process
//! ended and its GPUs were released) upload its last checkpoint and end it with one finish
//! request: the log tail, the last metric points, the result (small files inline, large ones
//! streamed first) and the outcome, retried while the server is unreachable.

use crate::accounting::Accounted;
use crate::attempt_dirs::AttemptDirs;
use crate::checkpoints::{self, CheckpointSync};
use crate::collect::{Collector, Sources};
use crate::config::WorkerConfig;
use crate::executor::{self, Ended, Launch, Stop};
use crate::guard::Guard;
use crate::now_ms;
use crate::results::{self, OutputFile};
use crate::shipper::{append_local, ShipError, Shipper};
use crate::workspace;
use client::{Client, ClientError, ClientResult};
use shared::api::{AttemptRecord, ClaimedJob, FinishRequest, FinishResponse, InlineResult, JobAttempt, WorkerId};
use shared::job::Outcome;
use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Notify};

/// Output bytes sent inline with the finish at most; more are streamed file by file first.
const INLINE_OUTPUT_BYTES: u64 = 512 << 10;
/// Log and metrics bytes not shipped yet that the finish carries at most; more are shipped by
/// the streaming endpoints first.
const INLINE_TAIL_BYTES: u64 = 512 << 10;

/// What an attempt tells the daemon.
#[derive(Debug)]
pub enum AttemptEvent {
    /// The process is gone: its slot and GPUs are free again. The daemon answers with what the
    /// attempt used of its GPUs (`None` for a CPU job).
    ProcessEnded(JobAttempt, oneshot::Sender<Option<Accounted>>),
    /// The attempt is ready to end: the daemon sends the request (with a claim for the next
    /// jobs when it can) and gives the answer back on `reply`.
    Finishing { request: Box<FinishRequest>, reply: oneshot::Sender<ClientResult<FinishResponse>> },
    /// Reported (or given up): forget the attempt.
    Done(JobAttempt),
}

/// What every attempt of this worker shares.
#[derive(Clone)]
pub struct AttemptContext {
    /// The client of the registration the attempt started under: should the worker register
    /// again (a new server instance), this attempt's reports are refused, never misfiled.
    pub client: Client,
    pub worker_id: WorkerId,
    pub worker_name: String,
    pub hostname: String,
    pub config: Arc<WorkerConfig>,
    /// Whether the work directory sits inside a git working tree (checked once: asking git
    /// for every attempt would cost a process per job for nothing).
    pub in_git_tree: bool,
    /// Kills the jobs should the worker die.
    pub guard: Arc<Guard>,
    /// Ends what leaves a job's process group.
    pub containment: Arc<crate::containment::Containment>,
    /// The user jobs run as, when not the worker's.
    pub run_as: Option<Arc<crate::run_as::RunAs>>,
    /// The worker's environment without `APP_*`, read once.
    pub inherited: Arc<Vec<(OsString, OsString)>>,
    /// The attempt directories to use again.
    pub slots: Arc<crate::slots::Slots>,
    /// Code snapshots downloaded by this worker.
    pub code: Arc<crate::code::CodeCache>,
    /// `OMP_NUM_THREADS` for CPU jobs sharing the box (see `reservations::cpu_threads_per_job`).
    pub cpu_threads: Option<u32>,
    /// The Python files that capture `wandb.log` (`collect::python`), when they could be written.
    pub capture_dir: Option<Arc<std::path::PathBuf>>,
}

/// Backoff for delivering something about an attempt: retried while the server is
/// unreachable, given up when the server says the attempt is no longer ours.
struct Delivery {
    what: &'static str,
    attempt: JobAttempt,
    delay: Duration,
    warned: bool,
}

impl Delivery {
    fn new(what: &'static str, attempt: JobAttempt) -> Delivery {
        Delivery { what, attempt, delay: Duration::from_millis(250), warned: false }
    }

    /// `Some(true)`: delivered; `Some(false)`: drop it; `None`: waited, try again.
    async fn settle(&mut self, result: Result<(), ShipError>) -> Option<bool> {
        let (what, job) = (self.what, self.attempt.job_id);
        match result {
            Ok(()) => {
                if self.warned {
                    tracing::info!(%job, "{what} delivered after the server came back");
                }
                Some(true)
            }
            Err(ShipError::Lost(reason)) => {
                tracing::warn!(%job, attempt = self.attempt.attempt, %reason, "{what} dropped: the attempt is no longer ours");
                Some(false)
            }
            Err(ShipError::Retry(error)) => {
                if !self.warned {
                    tracing::warn!(%job, %error, "{what} failed; retrying with backoff");
                    self.warned = true;
                }
                tokio::time::sleep(self.delay).await;
                self.delay = (self.delay * 2).min(Duration::from_secs(15));
                None
            }
        }
    }
}

fn classify(error: ClientError) -> ShipError {
    if error.is_retryable() {
        ShipError::Retry(error)
    } else {
        ShipError::Lost(error.to_string())
    }
}

/// Runs `job` on `gpus` to its finish.
pub async fn run(
    context: AttemptContext,
    job: ClaimedJob,
    gpus: Vec<(u32, String)>,
    (stop, stop_self): (mpsc::Receiver<Stop>, mpsc::Sender<Stop>),
    saved: crate::saves::Latest,
    events: mpsc::Sender<AttemptEvent>,
) {
    let attempt = JobAttempt { job_id: job.id, attempt: job.attempt };
    let config = &context.config;
    let slot = context.slots.take();
    let dirs = AttemptDirs::for_slot(&config.work_dir, slot);
    let indices: Vec<u32> = gpus.iter().map(|(index, _)| *index).collect();
    let started_at = now_ms();
    let own_files = (dirs.metrics.clone(), dirs.capture.clone());
    let collector = Collector::new(dirs.stream.clone(), own_files, dirs.log.clone(), Sources::default());
    let mut shipper = Shipper::new(context.client.clone(), context.worker_id, attempt, collector);
    let mut lost = false;
    // Jobs of another user get directories made afresh (see `run_as`).
    let prepared = match dirs.prepare(&job, context.run_as.is_some()).await {
        Err(error) => Err(format!("preparing {}: {error}", dirs.root.display())),
        Ok(log) => workspace::prepare(&context, &job, &dirs).await.map(|prepared| (log, prepared)),
    };
    let mut prepared = prepared;
    let code = prepared.as_mut().ok().and_then(|(_, prepared)| prepared.code.take());
    let prepared = match (prepared, context.run_as.clone()) {
        (Ok(prepared), Some(user)) => {
            let handed = dirs.clone();
            match tokio::task::spawn_blocking(move || user.hand_over(&handed)).await {
                Ok(Ok(())) => Ok(prepared),
                Ok(Err(error)) => Err(format!("giving the attempt's files to the run_as user: {error}")),
                Err(error) => Err(format!("giving the attempt's files to the run_as user: {error}")),
            }
        }
        (prepared, _) => prepared,
    };
    let resumed_from = prepared.as_ref().ok().and_then(|(_, prepared)| prepared.resumed_from);
    let mut checkpoints = None;
    let ended = match prepared {
        Err(reason) => Ended { outcome: Outcome::Error { reason }, killed: None, forced: false, notes: Vec::new() },
        Ok((log, prepared)) => {
            let port = if indices.len() > 1 { crate::job_env::free_port() } else { None };
            let mut env = crate::job_env::environment(&job, &dirs, &indices, port);
            env.push(context.containment.variable());
            // First, so that whatever the job's own environment sets later wins.
            if let Some(threads) = context.cpu_threads.filter(|_| indices.is_empty()) {
                env.insert(0, ("OMP_NUM_THREADS".to_string(), threads.to_string()));
            }
            let own = std::env::current_exe().ok();
            env.extend(own.and_then(|exe| crate::job_env::path_with(&exe, std::env::var_os("PATH").as_deref())));
            env.extend(prepared.env);
            let variable = |name: &str| {
                let set = env.iter().rev().find(|(key, _)| key == name).map(|(_, value)| value.clone());
                set.or_else(|| {
                    let inherited = context.inherited.iter().find(|(key, _)| key == name);
                    inherited.map(|(_, value)| value.to_string_lossy().into_owned())
                })
            };
            let identity = context.run_as.as_ref().map(|user| user.ids());
            let sources = Sources::of(&job.workspace, (&prepared.cwd, &dirs.output), identity, variable);
            if let Some(dir) = context.capture_dir.as_deref().filter(|_| sources.capture) {
                let pythonpath = crate::collect::python::pythonpath(dir, variable("PYTHONPATH").as_deref());
                env.push(pythonpath);
            }
            // Before the job starts: the loggers' files already there are not its own. An
            // empty directory (the usual short job's) needs no look, nor a blocking thread.
            let own_files = (dirs.metrics.clone(), dirs.capture.clone());
            let mut collector = Collector::new(dirs.stream.clone(), own_files, dirs.log.clone(), sources);
            if collector.has_trees() {
                let looked = tokio::task::spawn_blocking(move || {
                    collector.look_before();
                    collector
                });
                collector = match looked.await {
                    Ok(collector) => collector,
                    Err(error) => {
                        tracing::warn!(job = %job.id, %error, "looking for loggers' files failed; reading none");
                        let own_files = (dirs.metrics.clone(), dirs.capture.clone());
                        Collector::new(dirs.stream.clone(), own_files, dirs.log.clone(), Sources::default())
                    }
                };
            }
            shipper.collect_with(collector);
            let written = Arc::new(Notify::new());
            let timeout = job.timeout_secs.map(Duration::from_secs);
            let sync = CheckpointSync::new(
                context.client.clone(),
                context.worker_id,
                attempt,
                dirs.checkpoint.clone(),
                dirs.checkpoint_archive.clone(),
                dirs.log.clone(),
                (config.checkpoint_max_bytes, context.run_as.as_ref().map(|user| user.ids())),
            );
            let (stop_sync, stopped_sync) = oneshot::channel();
            let syncing = tokio::spawn(checkpoints::sync_in_background(sync, config.checkpoint_interval, stopped_sync));
            checkpoints = Some((stop_sync, syncing));
            // Its own task: a slow or long shipping pass must never delay a timeout, a cancel
            // or the end of the process.
            let process = tokio::spawn({
                let (command, dirs, grace, written) =
                    (job.command.clone(), dirs.clone(), config.kill_grace, written.clone());
                let (guard, inherited) = (context.guard.clone(), context.inherited.clone());
                let (containment, run_as) = (context.containment.clone(), context.run_as.clone());
                let (setup, cwd) = (job.workspace.setup.clone(), prepared.cwd);
                async move {
                    let launch = Launch {
                        command: &command,
                        setup: setup.as_deref(),
                        dirs: &dirs,
                        cwd: &cwd,
                        inherited: &inherited,
                        env: &env,
                        timeout,
                        grace,
                        guard: &guard,
                        containment: &containment,
                        attempt,
                        slot,
                        run_as: run_as.as_deref(),
                        saved: &saved,
                    };
                    executor::run(launch, log, stop, written).await
                }
            });
            tokio::pin!(process);
            loop {
                tokio::select! {
                    ended = &mut process => {
                        break ended.unwrap_or_else(|error| Ended {
                            outcome: Outcome::Error { reason: format!("the job's task failed: {error}") },
                            killed: None,
                            forced: false,
                            notes: Vec::new(),
                        });
                    }
                    _ = tick(&written, config.ship_interval, shipper.watching()) => {
                        if lost { continue; }
                        if let Err(ShipError::Lost(reason)) = shipper.ship(false).await {
                            tracing::warn!(job = %job.id, %reason, "the server no longer holds this attempt for us; stopping it");
                            lost = true;
                            let _ = stop_self.try_send(Stop::Lost);
                        }
                    }
                }
            }
        }
    };
    let (account, accounted) = oneshot::channel();
    let _ = events.send(AttemptEvent::ProcessEnded(attempt, account)).await;
    let accounted = accounted.await.ok().flatten();
    let finished_at = now_ms();
    tracing::debug!(job = %job.id, attempt = job.attempt, outcome = ?ended.outcome, "process ended");
    let lease_lost = ended.killed == Some(executor::KillReason::LeaseLost);
    if let Some((stop_sync, syncing)) = checkpoints {
        let _ = stop_sync.send(());
        // The last state of the directory, for the next attempt should this one not be the last.
        if let Ok(mut sync) = syncing.await {
            // Not after a preemption that needed SIGKILL: the directory may hold a file cut off
            // mid-write, and the last checkpoint uploaded while it ran is whole.
            let cut_off = ended.killed == Some(executor::KillReason::Preempted) && ended.forced;
            if !lost && !lease_lost && !cut_off {
                sync.sync().await;
            }
        }
    }
    let mut delivered = false;
    if !lost && !lease_lost {
        let ran = Ran { ended, accounted, gpus: &gpus, started_at, finished_at, resumed_from };
        delivered = finish(&context, &job, &dirs, &mut shipper, ran, &events).await;
    }
    release_slot(&context, &job, &dirs, (slot, code), delivered).await;
    let _ = events.send(AttemptEvent::Done(attempt)).await;
}

/// Gives the attempt's slot back. Everything a delivered attempt left is on the server now
/// (log, metrics, outputs): its files would only fill the worker's disk, so they go. An
/// undelivered attempt (or any, with `--keep-work-dirs`) stays for a look, moved out of the slot.
async fn release_slot(
    context: &AttemptContext,
    job: &ClaimedJob,
    dirs: &AttemptDirs,
    (slot, code): (usize, Option<crate::code::LaidOutCode>),
    delivered: bool,
) {
    let keep = !delivered || context.config.keep_work_dirs;
    if let Some(code) = code {
        if keep && code.is_overlay() {
            // A kept attempt keeps what its job saw: the overlay's view, copied out of it.
            let (cwd, copy) = (dirs.cwd.clone(), dirs.root.join("work.kept"));
            let copied = tokio::task::spawn_blocking(move || crate::code_copy::copy_tree(&cwd, &copy)).await;
            if !matches!(copied, Ok(Ok(()))) {
                tracing::warn!(job = %job.id, "copying a kept attempt's working copy out of its overlay failed");
            }
        }
        context.code.release(code).await;
        let kept_copy = dirs.root.join("work.kept");
        if kept_copy.exists() {
            let _ = tokio::fs::remove_dir(&dirs.cwd).await;
            let _ = tokio::fs::rename(&kept_copy, &dirs.cwd).await;
        }
    }
    let (owned, kept) = (dirs.clone(), AttemptDirs::kept(&context.config.work_dir, job));
    let released = tokio::task::spawn_blocking(move || {
        if keep {
            std::fs::create_dir_all(kept.parent().unwrap_or(&kept))?;
            // A directory kept from an earlier run of this worker makes way.
            let _ = std::fs::remove_dir_all(&kept);
            std::fs::rename(&owned.root, &kept)
        } else {
            owned.clear()
        }
    })
    .await;
    match released {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::warn!(job = %job.id, %error, path = %dirs.root.display(), "releasing the attempt directory")
        }
        Err(error) => tracing::warn!(job = %job.id, %error, "releasing the attempt directory"),
    }
    context.slots.give(slot);
}

/// How an attempt ran, for its finish request's record.
struct Ran<'a> {
    ended: Ended,
    /// What it used of its GPUs (`None` for a CPU job).
    accounted: Option<Accounted>,
    /// Its GPUs: index and name.
    gpus: &'a [(u32, String)],
    started_at: i64,
    finished_at: i64,
    /// The attempt whose checkpoint it resumed from.
    resumed_from: Option<u32>,
}

/// Builds the attempt's finish request (streaming first what is too large to go inline) and
/// delivers it; true when all of it was delivered.
async fn finish(
    context: &AttemptContext,
    job: &ClaimedJob,
    dirs: &AttemptDirs,
    shipper: &mut Shipper,
    ran: Ran<'_>,
    events: &mpsc::Sender<AttemptEvent>,
) -> bool {
    let Ran { mut ended, accounted, gpus, started_at, finished_at, resumed_from } = ran;
    let attempt = JobAttempt { job_id: job.id, attempt: job.attempt };
    let mut result = None;
    ended.notes.extend(accounted.as_ref().and_then(|accounted| accounted.note.clone()));
    if ended.forced {
        ended.notes.push("it did not exit within its grace after SIGTERM and was killed with SIGKILL".into());
    }
    // A job given back or preempted has no result: it runs again.
    if !matches!(ended.outcome, Outcome::Abandoned | Outcome::Preempted) {
        let reader = context.run_as.as_ref().map(|user| user.ids());
        let files = collect_outputs(dirs, reader).await;
        let record = AttemptRecord {
            exit_code: match ended.outcome {
                Outcome::Exited { code } => Some(code),
                _ => None,
            },
            outcome: describe(&ended.outcome),
            started_at,
            finished_at,
            worker: context.worker_name.clone(),
            hostname: context.hostname.clone(),
            gpus: gpus.iter().map(|(_, name)| name.clone()).collect(),
            cuda_visible_devices: Some(gpus.iter().map(|(index, _)| index.to_string()).collect::<Vec<_>>().join(",")),
            git_commit: match &job.workspace.code {
                Some(code) => code.commit.clone(),
                None if context.in_git_tree => results::git_commit(&dirs.cwd).await,
                None => None,
            },
            code: job.workspace.code.clone(),
            resumed_from,
            gpu_usage: accounted.as_ref().map(|accounted| accounted.usage.clone()),
            gpu_timeline: accounted.map(|accounted| accounted.timeline).unwrap_or_default(),
        };
        let size: u64 = files.iter().map(|file| file.entry.size).sum();
        let (inline, streamed) = if size <= INLINE_OUTPUT_BYTES {
            (results::read_inline(&files, reader).await, Vec::new())
        } else {
            let mut delivery = Delivery::new("results", attempt);
            let streamed = loop {
                let uploaded =
                    results::upload_streamed(&context.client, context.worker_id, (attempt, reader), &files).await;
                let (settled, manifest) = match uploaded {
                    Ok(manifest) => (Ok(()), manifest),
                    Err(error) => (Err(error), Vec::new()),
                };
                match delivery.settle(settled).await {
                    Some(true) => break manifest,
                    Some(false) => return false,
                    None => {}
                }
            };
            (Vec::new(), streamed)
        };
        result = Some(InlineResult { files: inline, streamed, record });
    }
    let (log, metrics) = match shipper.tail(INLINE_TAIL_BYTES).await {
        Some(tail) => tail,
        None => {
            let mut delivery = Delivery::new("log and metrics", attempt);
            loop {
                match delivery.settle(shipper.ship(true).await).await {
                    Some(true) => break,
                    Some(false) => return false,
                    None => {}
                }
            }
            shipper.tail(INLINE_TAIL_BYTES).await.unwrap_or((None, None))
        }
    };
    let request = FinishRequest {
        job_id: job.id,
        attempt: job.attempt,
        outcome: ended.outcome,
        log,
        metrics,
        result,
        notes: ended.notes,
        claim: None,
    };
    // The first try goes through the daemon, which may claim the next jobs with it.
    let (reply, answer) = oneshot::channel();
    let mut sent = match events.send(AttemptEvent::Finishing { request: Box::new(request.clone()), reply }).await {
        Ok(()) => answer.await.ok(),
        Err(_) => None,
    };
    let mut delivery = Delivery::new("finish", attempt);
    loop {
        let answered = match sent.take() {
            Some(answered) => answered,
            None => context.client.finish(context.worker_id, &request).await,
        };
        let settled = answered.map(|response| {
            tracing::debug!(job = %job.id, attempt = job.attempt, status = %response.status, "finished");
        });
        if let Some(done) = delivery.settle(settled.map_err(classify)).await {
            return done;
        }
    }
}

/// The attempt's output files; what cannot be uploaded is said in its log.
async fn collect_outputs(dirs: &AttemptDirs, reader: Option<(u32, u32)>) -> Vec<OutputFile> {
    let output = dirs.output.clone();
    // An empty output directory (most short jobs) needs no trip to a blocking thread.
    if std::fs::read_dir(&output).is_ok_and(|mut entries| entries.next().is_none()) {
        return Vec::new();
    }
    // Read as the job's user (see `run_as`): a link it made to a file it may not read is not
    // read by the worker either.
    let collected =
        tokio::task::spawn_blocking(move || crate::run_as::with_file_identity(reader, || results::collect(&output)))
            .await;
    let (files, skipped) = match collected {
        Ok(Ok(found)) => found,
        Ok(Err(error)) => (Vec::new(), vec![format!("the output directory could not be read: {error}")]),
        Err(error) => (Vec::new(), vec![format!("listing outputs failed: {error}")]),
    };
    for note in &skipped {
        append_local(&dirs.log, &format!("[app] output not uploaded: {note}\n")).await;
    }
    files
}

async fn tick(written: &Notify, interval: Duration, watching: bool) {
    // Ship as output arrives, but at most every `interval`, and at least every 4 of them; every
    // one when loggers' files are read (they grow without a printed line to wake us).
    tokio::time::sleep(interval).await;
    if !watching {
        let _ = tokio::time::timeout(interval * 3, written.notified()).await;
    }
}

fn describe(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Exited { code } => format!("exited with code {code}"),
        Outcome::Error { reason } => format!("error: {reason}"),
        Outcome::Killed { reason } => format!("killed: {reason}"),
        Outcome::Abandoned => "abandoned".into(),
        Outcome::Preempted => "preempted".into(),
    }
}
