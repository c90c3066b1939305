//! Bodies of the queue's maintenance endpoints: retrying many jobs at once and removing a
//! finished sweep with everything stored about it.

use super::{JobId, SweepId};
use serde::{Deserialize, Serialize};

/// `POST /api/jobs/retry`: put the listed failed or cancelled jobs back in the queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BulkRetryRequest {
    pub ids: Vec<JobId>,
}

/// What a bulk retry did (`POST /api/jobs/retry`, `POST /api/sweeps/{sweep}/retry`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryResponse {
    /// Jobs queued again, in id order.
    pub retried: Vec<JobId>,
    /// Listed ids that were not failed or cancelled (or do not exist): left as they were.
    #[serde(default)]
    pub skipped: Vec<JobId>,
}

/// `DELETE /api/sweeps/{sweep}`: what was removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepRemoved {
    pub id: SweepId,
    pub name: String,
    /// Jobs removed, with their history, logs, metrics and result records.
    pub jobs: u64,
    /// Result versions whose files were removed from the server's disk.
    pub result_versions: u64,
}
