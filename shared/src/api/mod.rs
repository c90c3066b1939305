//! Request and response bodies of the HTTP API, shared by the server and its typed client.
//!
//! Times are Unix milliseconds. Ids are SQLite row ids. Every error answer is an
//! [`ErrorBody`] with a status code that says what went wrong (400, 404, 409, 413).

use crate::job::{JobStatus, Outcome};
use crate::placement::{Capacity, Placement};
use crate::sweep::{Metric, Resources, SweepForm};
use serde::{Deserialize, Serialize};
use serde_json::Value;

mod ids;
pub use ids::{JobId, SweepId, WorkerId};

fn default_user() -> String {
    crate::names::DEFAULT_USER.to_string()
}

/// The body of every error answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Health {
    pub status: String,
    pub version: String,
    pub protocol: u32,
}

/// Query of `POST /api/sweeps`; the body is the sweep YAML itself.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SubmitQuery {
    /// Validate and count only; nothing is stored.
    #[serde(default)]
    pub dry_run: bool,
    /// The command of a CVLab-Kit config sweep (default `python main.py --config {config}`).
    pub command: Option<String>,
    /// The sweep's name when the file has none (the CLI sends the file's stem).
    pub name: Option<String>,
    /// The code snapshot the jobs run in (its digest, uploaded before; see `code`), where in it
    /// they start, and the git commit and state it was packed from.
    pub code: Option<String>,
    pub code_dir: Option<String>,
    pub code_commit: Option<String>,
    #[serde(default)]
    pub code_dirty: bool,
}

/// One job as a dry run shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobPreview {
    pub index: u64,
    pub params: Value,
    pub command: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubmitResponse {
    /// `None` for a dry run.
    pub sweep_id: Option<SweepId>,
    /// The stored name: the file's `name`, made unique with a `-2`, `-3` suffix if taken.
    pub name: String,
    pub form: SweepForm,
    pub count: u64,
    pub dry_run: bool,
    /// The first few jobs (a dry run) or none.
    pub preview: Vec<JobPreview>,
    /// Keys the file sets that have no effect here (W&B's `project`, `entity`, ...), one
    /// sentence each: accepted, never silently dropped.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Runs proposed one at a time, or stopped early: what the search does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<SearchPlan>,
}

/// Jobs of a sweep or of the whole queue, by status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusCounts {
    pub queued: u64,
    pub running: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub cancelled: u64,
}

impl StatusCounts {
    pub fn add(&mut self, status: JobStatus, count: u64) {
        match status {
            JobStatus::Queued => self.queued += count,
            JobStatus::Running => self.running += count,
            JobStatus::Succeeded => self.succeeded += count,
            JobStatus::Failed => self.failed += count,
            JobStatus::Cancelled => self.cancelled += count,
        }
    }

    pub fn total(&self) -> u64 {
        self.queued + self.running + self.succeeded + self.failed + self.cancelled
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepInfo {
    pub id: SweepId,
    pub name: String,
    /// The user whose token submitted it (`default` for a token without a name, a server
    /// without tokens, and sweeps submitted before owners were kept).
    #[serde(default = "default_user")]
    pub owner: String,
    pub form: SweepForm,
    pub metric: Option<Metric>,
    pub created_at: i64,
    pub counts: StatusCounts,
    /// Set while its failing runs hold it: nothing of it is claimed or proposed until
    /// `POST /api/sweeps/{key}/resume` (`app sweeps resume`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<Paused>,
    /// Why its queued jobs wait for its owner's quota, while they do (`user-a holds 8 of 8
    /// allowed GPUs`): set by `GET /api/sweeps` and `GET /api/sweeps/{key}` when quotas are set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_back: Option<String>,
    /// How many times its jobs were preempted (stopped to resume later, no retry spent).
    #[serde(default)]
    pub preempted: u64,
    /// A worker held for one of its queued jobs of several GPUs (backfill), while one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved: Option<Reserved>,
    /// The priority class it named (`[server.priority_classes]`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class: Option<String>,
}

/// A worker held for a queued job of several GPUs: its GPUs go to that job once enough are
/// free, and meanwhile only to jobs whose timeout ends before it could start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reserved {
    pub job: JobId,
    /// The worker's name.
    pub worker: String,
    /// When the job could start there at the latest, by the running jobs' timeouts (Unix ms);
    /// absent when a job without a timeout is in the way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starts_at: Option<i64>,
}

/// Why and since when a sweep is paused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Paused {
    /// Milliseconds since the epoch.
    pub at: i64,
    /// The failed runs that paused it, and the last lines of the last one's log.
    pub reason: String,
}

/// `POST /api/sweeps/{key}/class`: moves a sweep to another priority class.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetClassRequest {
    /// The class's name; none: the default class (value 0).
    #[serde(default)]
    pub priority_class: Option<String>,
}

/// The class a sweep is in now, and its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetClassResponse {
    pub priority_class: Option<String>,
    pub value: i64,
}

/// `POST /api/sweeps/{key}/resume`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResumeResponse {
    /// False when it was not paused (nothing changed).
    pub resumed: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepDetail {
    #[serde(flatten)]
    pub info: SweepInfo,
    /// The submitted YAML, as sent.
    pub source: String,
    /// Where its controller stands, for a sweep whose runs are proposed or stopped early.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<SearchState>,
    /// Why its queued jobs cannot run on any connected worker, when they cannot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unplaceable: Option<String>,
    /// Its `metric.name`, when runs have finished and none reported it (and what they did).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric_missing: Option<crate::metric_check::MetricMissing>,
}

/// Query of `GET /api/sweeps`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SweepQuery {
    /// Only the sweeps of this user.
    pub owner: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    pub id: JobId,
    pub sweep_id: SweepId,
    pub sweep: String,
    /// Its sweep's owner.
    #[serde(default = "default_user")]
    pub owner: String,
    pub index: u64,
    pub params: Value,
    pub command: String,
    pub status: JobStatus,
    pub priority: i64,
    pub attempt: u32,
    pub crash_count: u32,
    pub retries_left: u32,
    pub resources: Resources,
    pub timeout_secs: Option<u64>,
    /// The worker of the latest attempt.
    pub worker_id: Option<WorkerId>,
    pub worker: Option<String>,
    pub lease_expires_at: Option<i64>,
    pub cancel_requested: bool,
    pub exit_code: Option<i32>,
    /// Why the job is in its status: the failure, the requeue, the cancel.
    pub reason: Option<String>,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    /// The GPU indices of the latest attempt (empty for a CPU job or before the first claim).
    #[serde(default)]
    pub gpus: Vec<u32>,
    /// What is worth knowing about the latest attempt beyond its status, as sentences (its log
    /// was cut at the server's cap, the worker's disk filled up).
    #[serde(default)]
    pub notes: Vec<String>,
    /// Last, min and max of each metric of the latest attempt.
    #[serde(default)]
    pub metrics: std::collections::BTreeMap<String, MetricSummary>,
    /// Set when the latest attempt was stopped early (its status is then `cancelled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_early: Option<StoppedEarly>,
    /// What the latest attempt used of its GPUs, once it has ended (see [`GpuUsage`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_usage: Option<GpuUsage>,
    /// Why a queued job waits: its place in the queue, or why no worker can run it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<Waiting>,
}

/// Filters and paging of `GET /api/jobs`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct JobQuery {
    pub status: Option<JobStatus>,
    /// Sweep id or name.
    pub sweep: Option<String>,
    /// Worker name.
    pub worker: Option<String>,
    /// Only the jobs of this user's sweeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    pub limit: Option<u32>,
    pub offset: Option<u64>,
    /// The column to order by (default: id).
    pub sort: Option<JobSort>,
    /// Ascending unless `desc`.
    pub order: Option<SortOrder>,
    /// Also give each queued job of the page its place in the queue (costs a pass over the
    /// queue; a single job's page always has it).
    #[serde(default)]
    pub positions: bool,
}

/// The orders of a job listing; every one ends with the id, so paging is stable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobSort {
    #[default]
    Id,
    Priority,
    Status,
    Sweep,
    Worker,
    StartedAt,
    /// Run time: finished minus started, or now minus started while running.
    Duration,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SortOrder {
    #[default]
    Asc,
    Desc,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobPage {
    /// Jobs matching the filters, over all pages.
    pub total: u64,
    pub jobs: Vec<Job>,
}

/// One line of a job's append-only history.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobEvent {
    pub at: i64,
    pub from: Option<JobStatus>,
    pub to: JobStatus,
    pub attempt: u32,
    pub worker: Option<String>,
    pub reason: Option<String>,
    /// The GPU indices of the attempt, as the job held them at this transition.
    #[serde(default)]
    pub gpus: Vec<u32>,
    #[serde(default)]
    pub exit_code: Option<i32>,
}

/// One attempt of a job, folded from its history: where it ran and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptInfo {
    pub attempt: u32,
    pub worker: Option<String>,
    pub gpus: Vec<u32>,
    pub started_at: i64,
    pub ended_at: Option<i64>,
    /// `running` while it runs, else the status it ended in (`queued` when requeued).
    pub status: JobStatus,
    pub exit_code: Option<i32>,
    pub reason: Option<String>,
}

/// `POST /api/jobs/cancel`: cancel many jobs at once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BulkCancelRequest {
    pub ids: Vec<JobId>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkCancelResponse {
    pub cancelled: u64,
    pub cancel_requested: u64,
    /// Ids that were not queued or running (or do not exist): left as they were.
    pub skipped: Vec<JobId>,
}

/// `GET /api/overview`: the whole queue at a glance.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Overview {
    pub counts: StatusCounts,
    pub workers: WorkerCounts,
    pub sweeps: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerCounts {
    pub healthy: u64,
    pub stale: u64,
    pub lost: u64,
    /// Stopped cleanly (they said so).
    #[serde(default)]
    pub left: u64,
}

/// How recently a worker was heard from: `healthy` within two heartbeats, `stale` within its
/// lease, `lost` after (its jobs are requeued by then); `left` once it said it stopped cleanly
/// (until it registers again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerState {
    Healthy,
    Stale,
    Lost,
    Left,
}

impl WorkerState {
    pub fn of(last_seen_at: i64, now: i64, heartbeat_ms: u64, lease_ms: u64) -> WorkerState {
        let silent = now.saturating_sub(last_seen_at).max(0) as u64;
        if silent <= heartbeat_ms.saturating_mul(2) {
            WorkerState::Healthy
        } else if silent <= lease_ms {
            WorkerState::Stale
        } else {
            WorkerState::Lost
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PriorityRequest {
    pub priority: i64,
}

/// What a cancel did: queued jobs are cancelled at once, running ones at their worker's next
/// heartbeat.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelResponse {
    pub cancelled: u64,
    pub cancel_requested: u64,
}

/// `POST /api/jobs/{id}/preempt`: the attempt whose worker is told to stop it (SIGTERM, then
/// SIGKILL after `preempt_grace_secs`); it goes back to the queue and resumes from its
/// checkpoint, no retry spent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreemptResponse {
    pub attempt: JobAttempt,
    /// What the attempt's history will say: `preempted by NAME`.
    pub reason: String,
}

/// A job attempt, the unit every worker report is fenced by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct JobAttempt {
    pub job_id: JobId,
    pub attempt: u32,
}

/// The header every request of a registered worker carries: `<worker id>:<session secret>`,
/// the secret its registration returned. It proves the request comes from that registration.
pub const SESSION_HEADER: &str = "x-app-session";
/// The header naming the server instance a worker registered with: a server on a new database
/// is another instance, and refuses what was meant for the old one.
pub const INSTANCE_HEADER: &str = "x-app-instance";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RegisterRequest {
    pub name: String,
    pub protocol: u32,
    /// A random key the worker keeps in its work directory: the same worker restarted sends it
    /// again, so it is told apart from a second live worker using the same name elsewhere.
    #[serde(default)]
    pub key: Option<String>,
    /// Total capacity of the box (all slots and GPUs, nothing reserved).
    pub capacity: Capacity,
    /// Attempts this worker is still running (after a server restart or a reconnect). Any other
    /// job the server believes this worker holds is requeued at once: the box rebooted.
    #[serde(default)]
    pub holding: Vec<JobAttempt>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RegisterResponse {
    pub worker_id: WorkerId,
    /// The name registered: the one asked for, or a variant (`gpu-box-2`) when a live worker on
    /// another box already uses it.
    pub name: String,
    /// The secret of this registration; send it as `SESSION_HEADER` with every request.
    pub session: String,
    /// The server instance; send it as `INSTANCE_HEADER` with every request.
    pub instance: String,
    pub lease_ms: u64,
    pub heartbeat_ms: u64,
    /// Jobs that were held by an earlier run of this worker and went back to the queue.
    pub requeued: Vec<JobId>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClaimRequest {
    /// What the worker can run now.
    pub capacity: Capacity,
    /// Wait up to this long for a job when none fits now (long-poll); the server caps it.
    #[serde(default)]
    pub wait_ms: u64,
    /// Jobs to hand out beyond `capacity`'s free slots, held by the worker until a slot frees
    /// (its reserve for short CPU jobs). Honoured on a finish's claim; the server grants them
    /// only to a worker without GPUs while no adaptive sweep is open (whose runs are proposed
    /// for the slots that run them), [`MAX_RESERVE`] at most.
    #[serde(default)]
    pub reserve: u32,
}

/// The most a [`ClaimRequest::reserve`] is granted.
pub const MAX_RESERVE: u32 = 16;

/// A job handed to a worker, with everything needed to run it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClaimedJob {
    pub id: JobId,
    pub attempt: u32,
    pub sweep_id: SweepId,
    pub sweep: String,
    /// The form of the sweep file (a W&B job also gets the params file W&B's agent writes).
    pub form: SweepForm,
    pub index: u64,
    pub params: Value,
    pub command: String,
    pub config: Option<String>,
    pub resources: Resources,
    pub timeout_secs: Option<u64>,
    /// The GPUs the server placed it on, from the capacity the worker reported.
    pub placement: Placement,
    pub lease_expires_at: i64,
    /// Its code, directory, variables and setup line (the sweep's).
    #[serde(default)]
    pub workspace: Workspace,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClaimResponse {
    pub jobs: Vec<ClaimedJob>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct HeartbeatRequest {
    pub running: Vec<JobAttempt>,
    /// NVML readings of the worker's GPUs since the last heartbeat (stored as telemetry).
    #[serde(default)]
    pub gpus: Vec<GpuSample>,
    /// Checkpoint saves its running jobs made since the last heartbeat (the latest of each),
    /// as its executor saw them in `$APP_CHECKPOINT_DIR` (decision 0089).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub saves: Vec<SaveNote>,
}

/// A running attempt's latest checkpoint save, seen by its worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SaveNote {
    pub attempt: JobAttempt,
    /// When it saved (Unix ms: the newest modification time in its checkpoint directory).
    pub at: i64,
    /// The time between its last two saves (ms), once it has saved twice in this attempt.
    pub every_ms: Option<i64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct HeartbeatResponse {
    /// Attempts to kill: a user cancelled them.
    pub cancel: Vec<JobAttempt>,
    /// Attempts this worker no longer holds (lease lost, requeued elsewhere): stop reporting.
    pub unknown: Vec<JobAttempt>,
    pub lease_expires_at: i64,
    /// Attempts the server preempted: SIGTERM to each, SIGKILL after `preempt_grace_ms`, then
    /// report `Outcome::Preempted` (they go back to the queue and resume from their checkpoints).
    #[serde(default)]
    pub preempt: Vec<JobAttempt>,
    #[serde(default)]
    pub preempt_grace_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReportRequest {
    pub worker_id: WorkerId,
    pub attempt: u32,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReportResponse {
    pub status: JobStatus,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerInfo {
    pub id: WorkerId,
    pub name: String,
    pub capacity: Capacity,
    pub registered_at: i64,
    pub last_seen_at: i64,
    pub running: u64,
    pub state: WorkerState,
    /// Ids of the jobs running there.
    #[serde(default)]
    pub running_jobs: Vec<JobId>,
}

mod code;
mod finish;
mod maintenance;
mod outputs;
pub use code::*;
pub use finish::*;
pub use maintenance::*;
pub use outputs::*;

mod analysis;
pub use analysis::*;
mod search;
pub use search::*;
mod gpu;
pub use gpu::*;
mod users;
pub use users::*;
