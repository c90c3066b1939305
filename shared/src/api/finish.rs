//! `POST /api/workers/{id}/finish`: the end of an attempt in one request.
//!
//! Most attempts end with a short log tail, a few metric points and few or no output files.
//! Sending those, the outcome and the result record together (and, in the same request,
//! claiming the worker's next jobs) turns the six or seven round trips of an attempt's end into
//! one, and its writes into one transaction: a stale attempt gets 409 for the whole request and
//! nothing of it is applied. Larger outputs still go by the streamed endpoints first; the
//! finish then carries only what is left.

use super::{AttemptRecord, ClaimRequest, ClaimedJob, JobId, MetricPoint};
use crate::job::{JobStatus, Outcome};
use serde::{Deserialize, Serialize};

/// Inline file bytes one finish may carry at most, all files together; past this the worker
/// streams them (`PUT .../files/...`) and the server answers 413 to a finish that tries.
pub const MAX_INLINE_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FinishRequest {
    pub job_id: JobId,
    pub attempt: u32,
    pub outcome: Outcome,
    /// Log bytes from `offset` on that the server does not have yet.
    #[serde(default)]
    pub log: Option<LogTail>,
    /// Metric points the server does not have yet, ending at `offset` of the metrics file.
    #[serde(default)]
    pub metrics: Option<MetricsTail>,
    /// The attempt's result version, sealed with this request (`None`: nothing to seal here,
    /// an abandoned attempt or one sealed by the streamed endpoints already).
    #[serde(default)]
    pub result: Option<InlineResult>,
    /// What is worth knowing about the attempt beyond its outcome (the worker's disk filled up
    /// and its log was cut), kept as notes on the attempt.
    #[serde(default)]
    pub notes: Vec<String>,
    /// Claim the next jobs in the same request (never for a draining worker).
    #[serde(default)]
    pub claim: Option<ClaimRequest>,
}

impl FinishRequest {
    /// The finish of `attempt` of `job_id` that brings its outcome alone: no log, metrics,
    /// result, notes or claim (set those with struct update syntax).
    pub fn outcome(job_id: JobId, attempt: u32, outcome: Outcome) -> FinishRequest {
        FinishRequest {
            job_id,
            attempt,
            outcome,
            log: None,
            metrics: None,
            result: None,
            notes: Vec::new(),
            claim: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogTail {
    pub offset: u64,
    #[serde(with = "base64_bytes")]
    pub data: Vec<u8>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MetricsTail {
    /// Where these points end in the metrics file (as in `MetricsBatch`).
    pub offset: u64,
    pub points: Vec<MetricPoint>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InlineResult {
    /// Files sent inline, in addition to any uploaded by streaming before.
    pub files: Vec<InlineFile>,
    /// Files uploaded by streaming before this request (their manifest entries).
    #[serde(default)]
    pub streamed: Vec<super::ManifestEntry>,
    pub record: AttemptRecord,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InlineFile {
    pub path: String,
    /// Lower-case hex SHA-256 of `data`, checked by the server.
    pub sha256: String,
    #[serde(with = "base64_bytes")]
    pub data: Vec<u8>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FinishResponse {
    /// The job's status after the outcome was applied.
    pub status: JobStatus,
    /// Jobs claimed with the finish (empty when none was asked for or none fits).
    pub jobs: Vec<ClaimedJob>,
}

/// Bytes as standard base64 in JSON.
mod base64_bytes {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map_err(|error| serde::de::Error::custom(format!("not base64: {error}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_travel_as_base64_and_come_back_equal() {
        let tail = LogTail { offset: 3, data: vec![0, 255, b'\n', 0xC3] };
        let json = serde_json::to_string(&tail).unwrap();
        assert_eq!(json, r#"{"offset":3,"data":"AP8Kww=="}"#);
        assert_eq!(serde_json::from_str::<LogTail>(&json).unwrap().data, tail.data);
        assert!(serde_json::from_str::<LogTail>(r#"{"offset":0,"data":"%%%"}"#).is_err());
    }
}
