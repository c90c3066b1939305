//! One attempt from start to report: prepare its directory, run it while shipping its log and
//! metrics, then (after the process ended and its GPUs were released) ship the rest, upload
//! its results and report its outcome, retrying while the server is unreachable.

use crate::config::WorkerConfig;
use crate::executor::{self, AttemptDirs, Stop};
use crate::results;
use crate::shipper::{append_local, ShipError, Shipper};
use client::Client;
use shared::api::{AttemptRecord, ClaimedJob, JobAttempt, ReportRequest, WorkerId};
use shared::job::Outcome;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Notify};

/// What an attempt tells the daemon.
#[derive(Debug)]
pub enum AttemptEvent {
    /// The process is gone: its slot and GPUs are free again.
    ProcessEnded(JobAttempt),
    /// Reported (or given up): forget the attempt.
    Done(JobAttempt),
}

/// What every attempt of this worker shares.
#[derive(Clone)]
pub struct AttemptContext {
    pub client: Client,
    pub worker_id: WorkerId,
    pub worker_name: String,
    pub hostname: String,
    pub config: Arc<WorkerConfig>,
    /// Whether the work directory sits inside a git working tree (checked once: asking git
    /// for every attempt would cost a process per job for nothing).
    pub in_git_tree: bool,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|t| t.as_millis() as i64).unwrap_or(0)
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

/// Runs `job` on `gpus` to its report.
pub async fn run(
    context: AttemptContext,
    job: ClaimedJob,
    gpus: Vec<(u32, String)>,
    stop: mpsc::Receiver<Stop>,
    stop_self: mpsc::Sender<Stop>,
    events: mpsc::Sender<AttemptEvent>,
) {
    let attempt = JobAttempt { job_id: job.id, attempt: job.attempt };
    let config = &context.config;
    let dirs = AttemptDirs::for_job(&config.work_dir, &job);
    let indices: Vec<u32> = gpus.iter().map(|(index, _)| *index).collect();
    let started_at = now_ms();
    let mut shipper =
        Shipper::new(context.client.clone(), context.worker_id, attempt, dirs.log.clone(), dirs.metrics.clone());
    let mut lost = false;
    let outcome = match dirs.prepare(&job).await {
        Err(error) => Outcome::Error { reason: format!("preparing {}: {error}", dirs.root.display()) },
        Ok(()) => {
            let port = if indices.len() > 1 { executor::free_port() } else { None };
            let mut env = executor::environment(&job, &dirs, &indices, port);
            let own = std::env::current_exe().ok();
            env.extend(own.and_then(|exe| executor::path_with(&exe, std::env::var_os("PATH").as_deref())));
            let written = Arc::new(Notify::new());
            let timeout = job.timeout_secs.map(Duration::from_secs);
            // Its own task: a slow or long shipping pass must never delay a timeout, a cancel
            // or the end of the process.
            let process = tokio::spawn({
                let (command, dirs, grace, written) =
                    (job.command.clone(), dirs.clone(), config.kill_grace, written.clone());
                async move { executor::run(&command, &dirs, &env, timeout, grace, stop, written).await }
            });
            tokio::pin!(process);
            loop {
                tokio::select! {
                    outcome = &mut process => {
                        break outcome.unwrap_or_else(|error| Outcome::Error { reason: format!("the job's task failed: {error}") });
                    }
                    _ = tick(&written, config.ship_interval) => {
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
    let _ = events.send(AttemptEvent::ProcessEnded(attempt)).await;
    let finished_at = now_ms();
    tracing::info!(job = %job.id, attempt = job.attempt, outcome = ?outcome, "process ended");
    if !lost && !matches!(outcome, Outcome::Killed { ref reason } if reason == "lease lost") {
        let delivered =
            finish(&context, &job, attempt, &dirs, &mut shipper, &outcome, &gpus, started_at, finished_at).await;
        // Everything the attempt left is on the server now (log, metrics, outputs): its
        // directory would only fill the worker's disk. Undelivered attempts stay for a look.
        if delivered && !context.config.keep_work_dirs {
            if let Err(error) = tokio::fs::remove_dir_all(&dirs.root).await {
                tracing::warn!(job = %job.id, %error, path = %dirs.root.display(), "removing the attempt directory");
            }
        }
    }
    let _ = events.send(AttemptEvent::Done(attempt)).await;
}

/// Ships the rest, uploads the results, reports; true when all of it was delivered.
#[allow(clippy::too_many_arguments)]
async fn finish(
    context: &AttemptContext,
    job: &ClaimedJob,
    attempt: JobAttempt,
    dirs: &AttemptDirs,
    shipper: &mut Shipper,
    outcome: &Outcome,
    gpus: &[(u32, String)],
    started_at: i64,
    finished_at: i64,
) -> bool {
    let mut complete = true;
    if outcome != &Outcome::Abandoned {
        let output = dirs.output.clone();
        let collected = tokio::task::spawn_blocking(move || results::collect(&output)).await;
        let (files, skipped) = match collected {
            Ok(Ok(found)) => found,
            Ok(Err(error)) => (Vec::new(), vec![format!("the output directory could not be read: {error}")]),
            Err(error) => (Vec::new(), vec![format!("listing outputs failed: {error}")]),
        };
        for note in &skipped {
            append_local(&dirs.log, &format!("[app] output not uploaded: {note}\n")).await;
        }
        let mut delivery = Delivery::new("log and metrics", attempt);
        let shipped = loop {
            if let Some(done) = delivery.settle(shipper.ship(true).await).await {
                break done;
            }
        };
        if !shipped {
            return false;
        }
        let record = AttemptRecord {
            exit_code: match outcome {
                Outcome::Exited { code } => Some(*code),
                _ => None,
            },
            outcome: describe(outcome),
            started_at,
            finished_at,
            worker: context.worker_name.clone(),
            hostname: context.hostname.clone(),
            gpus: gpus.iter().map(|(_, name)| name.clone()).collect(),
            cuda_visible_devices: Some(gpus.iter().map(|(index, _)| index.to_string()).collect::<Vec<_>>().join(",")),
            git_commit: if context.in_git_tree { results::git_commit(&dirs.cwd).await } else { None },
        };
        let mut delivery = Delivery::new("results", attempt);
        let uploaded = loop {
            let result = results::upload(&context.client, context.worker_id, attempt, &files, &record).await;
            if let Some(done) = delivery.settle(result).await {
                break done;
            }
        };
        complete &= uploaded;
        if !uploaded {
            // Refused results are no reason to leave the outcome unknown: the report below is
            // fenced on its own (a stale attempt gets 409 there too).
            append_local(&dirs.log, "[app] results not stored; reporting the outcome anyway\n").await;
        }
    }
    let report = ReportRequest { worker_id: context.worker_id, attempt: job.attempt, outcome: outcome.clone() };
    let mut delivery = Delivery::new("report", attempt);
    let reported = loop {
        let result = match context.client.report(job.id, &report).await {
            Ok(response) => {
                tracing::info!(job = %job.id, attempt = job.attempt, status = %response.status, "reported");
                Ok(())
            }
            Err(error) if error.is_retryable() => Err(ShipError::Retry(error)),
            Err(error) => Err(ShipError::Lost(error.to_string())),
        };
        if let Some(done) = delivery.settle(result).await {
            break done;
        }
    };
    complete && reported
}

async fn tick(written: &Notify, interval: Duration) {
    // Ship as output arrives, but at most every `interval`, and at least that often.
    tokio::time::sleep(interval).await;
    let _ = tokio::time::timeout(interval * 3, written.notified()).await;
}

fn describe(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Exited { code } => format!("exited with code {code}"),
        Outcome::Error { reason } => format!("error: {reason}"),
        Outcome::Killed { reason } => format!("killed: {reason}"),
        Outcome::Abandoned => "abandoned".into(),
    }
}
