//! The end of an attempt in one request (`shared::api::FinishRequest`): the log tail, the last
//! metric points, the result version (inline files and the record) and the outcome are applied
//! in one write unit, fenced once, so a stale attempt changes nothing at all; then, if asked,
//! the worker's next jobs are claimed.

use super::meters::FinishPath;
use super::results::{check_upload_path, set_aside_unrecorded};
use super::{Change, Queue, StepRun, Tx, WorkerAttempt};
use crate::db::{self, now_ms};
use crate::error::{ApiError, ApiResult};
use crate::storage::{self, disk_error, Layout, SealError};
use sha2::{Digest, Sha256};
use shared::api::{ClaimedJob, WorkerId};
use shared::api::{
    FinishRequest, FinishResponse, InlineResult, JobAttempt, ManifestEntry, ResultVersion, MAX_INLINE_BYTES,
};
use shared::fair_share::Charge;
use shared::job::{Finish, JobStatus};
use shared::placement::Capacity;
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

/// Checks what can be checked before touching anything: inline files within the cap, with
/// plain paths listed once and the hashes they claim.
fn check_inline(request: &FinishRequest) -> ApiResult<()> {
    let Some(result) = &request.result else { return Ok(()) };
    let total: u64 = result.files.iter().map(|file| file.data.len() as u64).sum();
    if total > MAX_INLINE_BYTES {
        return Err(ApiError::PayloadTooLarge(format!(
            "{total} bytes of inline files in one finish; at most {MAX_INLINE_BYTES}: upload them with \
             PUT /api/jobs/{}/attempts/{}/files/PATH and finish without them",
            request.job_id, request.attempt
        )));
    }
    let mut seen = HashSet::new();
    for file in result.files.iter().map(|file| &file.path).chain(result.streamed.iter().map(|entry| &entry.path)) {
        check_upload_path(file)?;
        if !seen.insert(file.as_str()) {
            return Err(ApiError::BadRequest(format!("`{file}` is listed twice in the result")));
        }
    }
    for file in &result.files {
        let digest = hex::encode(Sha256::digest(&file.data));
        if !digest.eq_ignore_ascii_case(&file.sha256) {
            return Err(ApiError::BadRequest(format!(
                "inline file `{}` has SHA-256 {digest}, not the {} its request says",
                file.path, file.sha256
            )));
        }
    }
    Ok(())
}

/// Writes the inline files into the attempt's staging directory (blocking).
fn stage_inline(staging: &std::path::Path, result: &InlineResult) -> std::io::Result<()> {
    for file in &result.files {
        let path = file.path.split('/').fold(staging.to_path_buf(), |path, segment| path.join(segment));
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, &file.data)?;
    }
    Ok(())
}

impl Queue {
    /// Applies a finishing attempt's last report, then claims its worker's next jobs if asked.
    pub async fn finish(&self, worker: WorkerId, request: FinishRequest) -> ApiResult<FinishResponse> {
        check_inline(&request)?;
        let at = WorkerAttempt { job: request.job_id, attempt: request.attempt, worker };
        let staging = self.layout.staging(at.job, at.attempt);
        if let Some(result) = request.result.as_ref().filter(|result| !result.files.is_empty()) {
            // Staged before the write unit, so the writer does no large file writes itself. A
            // stale attempt's files are removed by the reaper with the rest of its staging.
            super::fence::holder(self.reader().acquire().await?.conn(), at.job, at.attempt, worker, "finish").await?;
            let (dir, result) = (staging.clone(), result.clone());
            tokio::task::spawn_blocking(move || stage_inline(&dir, &result))
                .await
                .map_err(|error| anyhow::anyhow!("staging inline files: {error}"))?
                .map_err(|error| {
                    disk_error(error, format!("storing the results of job {} attempt {}", at.job, at.attempt))
                })?;
        }
        let claim = request.claim.clone().filter(|_| !self.is_draining(worker));
        let charge = request.result.as_ref().and_then(|result| shared::fair_share::charge(&result.record));
        let preempted = request.outcome == shared::job::Outcome::Preempted;
        // Taken whichever path the finish goes: the attempt ends here.
        let viewed = self.views.take(at.job, at.attempt);
        // A finish that brings nothing but its outcome (and a result record) is decided on the
        // state a reader sees (the claim's view, else a read), off the writer's path, and applied
        // as a step with the others waiting (`quick`); the guarded UPDATE checks that state, and
        // the full path below takes over if it changed in between.
        let may_be_quick = is_bare(&request)
            && request.outcome != shared::job::Outcome::Preempted
            && !self.search.may_be_open()
            && (claim.is_none() || !self.shares.engaged())
            && claim.as_ref().is_none_or(|claim| claim.capacity.gpus.is_empty());
        let snapshot = match may_be_quick {
            true if viewed.is_some() => viewed,
            // A reader that fails leaves it to the full path.
            true => match self.reader().acquire().await {
                Ok(mut conn) => db::jobs::state_for_result(conn.conn(), at.job, at.attempt).await.ok().flatten(),
                Err(_) => None,
            },
            false => None,
        };
        if claim.is_some() && self.shares.engaged() {
            self.shares.refresh_usage(self.reader(), now_ms()).await;
        }
        let capacity = claim.as_ref().map(|claim| self.granted(claim));
        let requests: Vec<(WorkerId, Capacity)> = capacity.map(|capacity| (worker, capacity)).into_iter().collect();
        // Only for a sweep cached as having no `metric.target` (the first finish of a sweep
        // looks it up on the general path). What the step would refuse on the view alone is
        // not sent to it: such a finish goes the general path at once, decided again there
        // on the writer's reading.
        let snapshot = snapshot.filter(|(seen, _)| {
            let attempt = JobAttempt { job_id: at.job, attempt: at.attempt };
            self.search.cached_target(seen.sweep_id) == Some(false)
                && super::fence::check(seen, at.attempt, worker, "finish").is_ok()
                // A failure may pause its sweep (`fail_fast`): the general path looks.
                && super::reports::decide(seen, attempt, worker, &request.outcome)
                    .is_ok_and(|finish| finish.status != JobStatus::Failed)
                && (requests.is_empty() || super::claims::plain_claim(&requests, 0, 0).is_some())
        });
        let tried = snapshot.is_some();
        let quick = match snapshot {
            Some(snapshot) => {
                let sweep = snapshot.0.sweep_id;
                let record = request.result.as_ref().map(|result| result.record.clone());
                let done = self.quick(at, (&request.outcome, record), snapshot, &requests).await?;
                // Its record was stored without its slot time: that is added every few seconds.
                if let (Some((_, _, true)), Some(Charge::Slot(seconds))) = (&done, charge) {
                    self.shares.slot_held(sweep, now_ms(), seconds);
                }
                done.map(|(status, jobs, _)| (status, jobs))
            }
            None => None,
        };
        let path = match (&quick, tried) {
            (Some(_), _) => FinishPath::Fast,
            (None, true) => FinishPath::Fallback,
            (None, false) => FinishPath::General,
        };
        let (status, mut jobs) = match quick {
            Some(done) => done,
            None => {
                let context = Context {
                    logs: (self.logs.clone(), self.config.max_log_bytes_per_job),
                    layout: self.layout.clone(),
                    lane: self.lane(),
                };
                self.write(move |tx| Box::pin(async move { full(tx, &context, at, request, staging, &requests).await }))
                    .await?
            }
        };
        // Counted here at once when the general path stored it; the next read of what is
        // stored (`Shares::refresh_usage`) replaces it, so a retried finish's second count
        // lasts until then at most.
        if let (FinishPath::General | FinishPath::Fallback, Some(charge)) = (path, charge) {
            self.usage_recorded(at.job, charge.seconds()).await;
        }
        if preempted {
            // The time it held was charged in the database (`db::usage::add_held`).
            self.shares.usage_changed();
        }
        self.quota_room();
        self.meters.finished(status, jobs.len(), path);
        if let Some(claim) = claim.filter(|claim| jobs.is_empty() && claim.wait_ms > 0) {
            jobs = self.claim(worker, claim.capacity, Duration::from_millis(claim.wait_ms)).await?;
        }
        Ok(FinishResponse { status, jobs })
    }
}

impl Queue {
    /// What a finish's write unit needs of the queue's caches and settings.
    fn lane(&self) -> Lane {
        Lane {
            lease: self.config.lease,
            names: self.sweep_names.clone(),
            workspaces: self.workspaces.clone(),
            views: self.views.clone(),
            search: self.search.clone(),
            shares: self.shares.clone(),
        }
    }

    /// The capacity a finish's claim is served for: its free slots, and its reserve when the
    /// worker has no GPUs and no adaptive sweep is open (whose runs are proposed one per slot
    /// that runs them, each with what the finished ones taught).
    fn granted(&self, claim: &shared::api::ClaimRequest) -> Capacity {
        let mut capacity = claim.capacity.clone();
        if capacity.gpus.is_empty() && !self.search.may_be_open() {
            let reserve = claim.reserve.min(shared::api::MAX_RESERVE);
            capacity.job_slots = capacity.job_slots.saturating_add(reserve);
        }
        capacity
    }
}

/// What a finish's write unit works with, besides the request.
struct Context {
    logs: (super::LogStore, u64),
    layout: Layout,
    lane: Lane,
}

/// A finish with no log, metrics, notes or files: its outcome and at most a result record, one
/// without GPU time (that is counted as its owner's on the general path, by
/// `db::results::insert`: the step lane's owners store records without it; a job slot's time
/// is summed in memory instead, `Shares::slot_held`).
fn is_bare(request: &FinishRequest) -> bool {
    request.log.is_none()
        && request.metrics.is_none()
        && request.notes.is_empty()
        && request.result.as_ref().is_none_or(|result| {
            result.files.is_empty()
                && result.streamed.is_empty()
                && !matches!(shared::fair_share::charge(&result.record), Some(Charge::Gpu(_)))
        })
}

/// What a finish's unit works with of the queue, on either path.
struct Lane {
    lease: Duration,
    names: super::claims::SweepNames,
    workspaces: super::code::Workspaces,
    views: std::sync::Arc<super::views::Views>,
    search: std::sync::Arc<super::search::Controller>,
    shares: std::sync::Arc<super::shares::Shares>,
}

/// What a bare finish decided on a reader's view writes when it goes quickly.
struct QuickStep {
    decision: Finish,
    now: i64,
    /// The worker's next claim, made only if the finish applies.
    claim: Option<db::claims::PlainClaim>,
    /// The record, as a version without files or metric summaries.
    version: Option<ResultVersion>,
}

/// The step of a bare finish decided on `seen` (a reader's view); `None` when it cannot go
/// that way: the attempt is not held as the view says, the
/// attempt has metric summaries its record would miss, or the claim is not a plain one.
fn quick_step(
    lease: Duration,
    at: WorkerAttempt,
    (outcome, record): (&shared::job::Outcome, Option<shared::api::AttemptRecord>),
    (seen, source): (&db::jobs::JobState, db::jobs::ResultSource),
    requests: &[(WorkerId, Capacity)],
) -> ApiResult<Option<QuickStep>> {
    let attempt = JobAttempt { job_id: at.job, attempt: at.attempt };
    if super::fence::check(seen, at.attempt, at.worker, "finish").is_err() {
        return Ok(None);
    }
    let Ok(decision) = super::reports::decide(seen, attempt, at.worker, outcome) else { return Ok(None) };
    if record.is_some() && source.has_metrics {
        return Ok(None);
    }
    let now = now_ms();
    let claim = match requests.is_empty() {
        true => None,
        false => match super::claims::plain_claim(requests, now + lease.as_millis() as i64, now) {
            Some(claim) => Some(claim),
            None => return Ok(None),
        },
    };
    let version = match record {
        Some(record) => Some(version(at, source, Vec::new(), record, Default::default())?),
        None => None,
    };
    Ok(Some(QuickStep { decision, now, claim, version }))
}

impl Queue {
    /// A bare finish decided on `snapshot` (a reader's view) and applied with the worker's next
    /// plain claim as a step of the writer's step lane, with the other steps waiting (the
    /// backend's owner of the hot path). `None` (and nothing written) when it does not apply
    /// as it is: the attempt is not (or no longer) held as the snapshot says, an adaptive sweep
    /// may be open (looked at again right before the step runs), the worker has GPUs, or the
    /// version needs metric summaries; the caller then takes the general path ([`full`]), on
    /// the writer's own reading.
    async fn quick(
        &self,
        at: WorkerAttempt,
        (outcome, record): (&shared::job::Outcome, Option<shared::api::AttemptRecord>),
        (seen, source): (db::jobs::JobState, db::jobs::ResultSource),
        requests: &[(WorkerId, Capacity)],
    ) -> ApiResult<Option<(JobStatus, Vec<ClaimedJob>, bool)>> {
        let attempt = JobAttempt { job_id: at.job, attempt: at.attempt };
        let Some(QuickStep { decision, now, claim, version }) =
            quick_step(self.config.lease, at, (outcome, record), (&seen, source), requests)?
        else {
            return Ok(None);
        };
        let step = db::claims::Step { seen, worker_id: at.worker, decision: decision.clone(), now, version, claim };
        let lane = self.lane();
        let (search, shares) = (self.search.clone(), self.shares.clone());
        // A claim made plainly only while no fair share applies (as last seen).
        let asks = !requests.is_empty();
        let still = move || !search.may_be_open() && (!asks || !shares.engaged());
        self.writer
            .step(step, still, move |run| {
                Box::pin(async move {
                    let (tx, done) = match run {
                        StepRun::Done(tx, done) => (tx, done),
                        StepRun::Declined => return Ok(None),
                        StepRun::Failed(error) => return Err(error),
                    };
                    if !done.applied {
                        return Ok(None);
                    }
                    let caches = (&lane.names, &lane.workspaces, &*lane.views);
                    let jobs = super::claims::claimed_plain(tx, done.claimed, caches).await?;
                    if done.stored {
                        tx.note(Change::Page);
                    }
                    // The sweep has no `metric.target` (the caller checked): nothing follows.
                    super::reports::settle(tx, attempt, &decision, true)?;
                    Ok(Some((decision.status, jobs, done.stored)))
                })
            })
            .await
    }
}

/// The finish on the writer's own reading: fence, log tail, metrics, notes, result, outcome,
/// then the worker's next claim.
async fn full(
    tx: &mut Tx,
    context: &Context,
    at: WorkerAttempt,
    request: FinishRequest,
    staging: PathBuf,
    requests: &[(WorkerId, Capacity)],
) -> ApiResult<(JobStatus, Vec<ClaimedJob>)> {
    let logs = (&context.logs.0, context.logs.1);
    let outcome = request.outcome.clone();
    let (current, mut decision) = prepare(tx, at, request, logs, &context.layout, staging).await?;
    let attempt = JobAttempt { job_id: at.job, attempt: at.attempt };
    let now = now_ms();
    let requeued = super::reports::on_preempted(tx, attempt, &outcome, &mut decision, now).await?;
    let search = &context.lane.search;
    // Looked up (and cached) here, so that the sweep's next bare finishes may go quickly: they
    // need to know it has no `metric.target` (`Controller::cached_target`).
    search.has_target(tx, current.sweep_id).await?;
    let applied = db::jobs::finish(tx.conn().await?, &current, at.worker, &decision, now, false).await?;
    super::reports::settle(tx, attempt, &decision, applied)?;
    if let Some(owner) = requeued {
        // Before the claim below: its owner waits again.
        context.lane.shares.submitted(&owner);
    }
    super::reports::after_settled(tx, (search, logs.0), &current, attempt, &decision).await?;
    let jobs = match requests.is_empty() {
        true => Vec::new(),
        false => {
            search.top_up(tx, requests).await?;
            let lane = &context.lane;
            let caches = (&lane.names, &lane.workspaces, &*lane.views, &*lane.shares);
            super::claims::claim_batch(tx, requests, context.lane.lease, caches).await?.remove(0)
        }
    };
    Ok((decision.status, jobs))
}

/// The version `at` records, checked to stay inside the results directory.
fn version(
    at: WorkerAttempt,
    source: db::jobs::ResultSource,
    files: Vec<ManifestEntry>,
    record: shared::api::AttemptRecord,
    metrics: std::collections::BTreeMap<String, shared::api::MetricSummary>,
) -> ApiResult<ResultVersion> {
    let relative = Layout::version_path(&source.sweep, source.index, at.attempt);
    storage::check_relative_path(&relative).map_err(|why| anyhow::anyhow!("result path of job {}: {why}", at.job))?;
    Ok(ResultVersion {
        job_id: at.job,
        attempt: at.attempt,
        path: relative,
        files,
        record,
        params: source.params,
        metrics,
        stored_at: now_ms(),
    })
}

/// Everything of the finish but the outcome's guarded UPDATE: the fence, the log tail, the
/// metrics, the notes and the result version; returns the state read and the decision.
async fn prepare(
    tx: &mut Tx,
    at: WorkerAttempt,
    request: FinishRequest,
    logs: (&super::LogStore, u64),
    layout: &Layout,
    staging: PathBuf,
) -> ApiResult<(db::jobs::JobState, Finish)> {
    let (current, mut source) =
        db::jobs::state_for_result(tx.conn().await?, at.job, at.attempt).await?.ok_or_else(|| super::no_job(at.job))?;
    super::fence::check(&current, at.attempt, at.worker, "finish")?;
    let attempt = JobAttempt { job_id: at.job, attempt: at.attempt };
    let decision = super::reports::decide(&current, attempt, at.worker, &request.outcome)?;
    if let Some(log) = &request.log {
        super::logs::append(tx, logs, at, log.offset, &log.data).await?;
    }
    if let Some(metrics) = &request.metrics {
        super::metrics::record(tx, at.job, at.attempt, at.worker, metrics.offset, &metrics.points).await?;
        // The version's summaries are read again after these points.
        source.has_metrics = true;
    }
    for note in &request.notes {
        db::jobs::add_note(tx.conn().await?, at.job, at.attempt, note).await?;
        super::logs::append_server_line(tx, logs.0, at, &format!("[app] {note}\n")).await?;
    }
    if let Some(result) = request.result {
        seal(tx, at, result, source, layout, &staging).await?;
    }
    Ok((current, decision))
}

/// Seals the staged files (inline and streamed) as the attempt's result version, inside the
/// finish's write unit; a version already recorded (a retried finish) is left as it is.
async fn seal(
    tx: &mut Tx,
    at: WorkerAttempt,
    result: InlineResult,
    source: db::jobs::ResultSource,
    layout: &Layout,
    staging: &std::path::Path,
) -> ApiResult<()> {
    let (id, attempt) = (at.job, at.attempt);
    let streamed = !result.streamed.is_empty();
    // Looked up first only when files would be written; a bare record is an insert that
    // changes nothing when the version exists.
    if (streamed || !result.files.is_empty()) && db::results::exists(tx.conn().await?, id, attempt).await? {
        return Ok(());
    }
    let has_metrics = source.has_metrics;
    let mut files: Vec<ManifestEntry> = result
        .files
        .iter()
        .map(|file| ManifestEntry {
            path: file.path.clone(),
            size: file.data.len() as u64,
            sha256: file.sha256.to_ascii_lowercase(),
        })
        .collect();
    if !result.streamed.is_empty() {
        let staged = db::results::staged(tx.conn().await?, id, attempt).await?;
        for entry in &result.streamed {
            match staged.get(&entry.path) {
                Some(uploaded)
                    if uploaded.size == entry.size && uploaded.sha256.eq_ignore_ascii_case(&entry.sha256) =>
                {
                    files.push(uploaded.clone())
                }
                _ => {
                    return Err(ApiError::BadRequest(format!(
                        "`{}` is in the result but was not uploaded with that size and hash",
                        entry.path
                    )))
                }
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    // Read only when there are some: `has_metrics` is false only when the attempt had none
    // before this finish and the finish sent none (a short job's usual case).
    let metrics = match has_metrics {
        true => db::metrics::summaries_of_attempt(tx.conn().await?, id, attempt).await?,
        false => Default::default(),
    };
    let version = version(at, source, files, result.record, metrics)?;
    // A version without files is its record alone: no directory (three directory creations
    // were most of what the server spent on a short job).
    if !version.files.is_empty() {
        write_version(layout, staging, &version).await?;
    }
    if !db::results::insert(tx.conn().await?, &version).await? {
        // A retried finish whose first try was stored: nothing more to do.
        return Ok(());
    }
    if streamed {
        db::results::unstage_attempt(tx.conn().await?, id, attempt).await?;
    }
    tx.note(Change::Page);
    Ok(())
}

/// Turns the staged files into the version's directory, with its `.app/` record.
async fn write_version(layout: &Layout, staging: &std::path::Path, version: &ResultVersion) -> ApiResult<()> {
    let (id, attempt) = (version.job_id, version.attempt);
    let target = layout.absolute(&version.path);
    let what = format!("sealing result v{attempt} of job {id}");
    set_aside_unrecorded(layout, &target).await.map_err(|error| disk_error(error, what.clone()))?;
    let manifest_json = serde_json::to_vec_pretty(&version.files).map_err(anyhow::Error::from)?;
    let result_json = serde_json::to_vec_pretty(&version).map_err(anyhow::Error::from)?;
    std::fs::create_dir_all(staging).map_err(|error| disk_error(error, what.clone()))?;
    storage::seal(staging, &target, &version.files, &manifest_json, &result_json).map_err(|error| match error {
        SealError::Mismatch(why) => ApiError::BadRequest(format!("{what}: {why}")),
        SealError::AlreadyStored => ApiError::Conflict(format!("result v{attempt} of job {id} is already stored")),
        SealError::Disk(error) => disk_error(error, what.clone()),
    })
}

#[cfg(test)]
#[path = "finish_tests.rs"]
mod tests;
