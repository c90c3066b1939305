//! Fencing of what workers send about an attempt (logs, metrics, files, seals): only the
//! worker holding the job's current, running attempt may write, so a stale attempt whose
//! lease was lost can never write over, or into, the attempt that replaced it.

use crate::db;
use crate::db::backend::Conn;
use crate::db::jobs::JobState;
use crate::error::{ApiError, ApiResult};
use shared::api::{JobId, WorkerId};
use shared::job::JobStatus;

/// The job's state, if `worker` holds its running `attempt`; 404 for no job, 409 otherwise.
/// Inside a write unit on PostgreSQL the job's row stays locked until the unit's group ends
/// (`db::jobs::state_for_update`): what the unit decides on it (an offset, a seal) holds
/// against the same request sent to another replica meanwhile.
pub async fn holder(conn: Conn<'_>, job: JobId, attempt: u32, worker: WorkerId, what: &str) -> ApiResult<JobState> {
    let current =
        db::jobs::state_for_update(conn, job).await?.ok_or_else(|| ApiError::NotFound(format!("no job {job}")))?;
    check(&current, attempt, worker, what)?;
    Ok(current)
}

/// The same check on a state already read.
pub fn check(current: &JobState, attempt: u32, worker: WorkerId, what: &str) -> ApiResult<()> {
    let job = current.id;
    if current.status != JobStatus::Running || current.attempt != attempt {
        return Err(ApiError::Conflict(format!(
            "stale {what} for job {job} attempt {attempt}: the job is {} at attempt {}",
            current.status, current.attempt
        )));
    }
    if current.worker_id != Some(worker) {
        return Err(ApiError::Conflict(format!(
            "stale {what} for job {job} attempt {attempt}: the attempt is held by another worker"
        )));
    }
    Ok(())
}
