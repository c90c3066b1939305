//! Job logs: append-only files per attempt under `<data_dir>/logs/<sweep id>/`, with the
//! lengths in the database (`job_attempts`). Workers append by offset (fenced, idempotent, capped
//! per attempt); readers page through a log or follow it with a long poll.
//!
//! The bytes live in files rather than in the queue database: a job printing 100 MB would
//! otherwise put 100 MB into `queue.db` and as much again into its write-ahead log, and a few
//! thousand long training logs would make the database a multi-GB file to back up. The file
//! is written first, then its length is committed: a crash in between leaves bytes past the
//! recorded length, which readers never see and the retried append overwrites.

use super::{Change, Queue, WorkerAttempt};
use crate::db::{self, logs::LogLength};
use crate::error::{ApiError, ApiResult};
use shared::api::{JobId, LogChunk, LogQuery, SweepId, WorkerId};
use shared::job::JobStatus;
use std::io::{self, Read, Seek};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::time::Instant;

/// Most bytes one read returns; a follower simply asks again.
const MAX_CHUNK: u64 = 1 << 20;

/// Where the log files are.
#[derive(Debug, Clone)]
pub struct LogStore {
    root: PathBuf,
}

impl LogStore {
    pub fn new(data_dir: &Path) -> LogStore {
        LogStore { root: data_dir.join("logs") }
    }

    /// The directory of a sweep's logs (removed with the sweep).
    pub fn sweep_dir(&self, sweep: SweepId) -> PathBuf {
        self.root.join(sweep.to_string())
    }

    pub fn path(&self, sweep: SweepId, job: JobId, attempt: u32) -> PathBuf {
        self.sweep_dir(sweep).join(format!("{job}.{attempt}.log"))
    }

    /// Writes `bytes` at `offset` of the attempt's log file, creating it.
    fn write_at(&self, sweep: SweepId, job: JobId, attempt: u32, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let path = self.path(sweep, job, attempt);
        let open = || std::fs::OpenOptions::new().create(true).write(true).truncate(false).open(&path);
        let file = match open() {
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir_all(self.sweep_dir(sweep))?;
                open()?
            }
            other => other?,
        };
        file.write_all_at(bytes, offset)
    }

    /// The last `lines` lines of an attempt's log, from at most its last 4 KiB (for messages;
    /// empty when there is none).
    pub fn tail(&self, sweep: SweepId, job: JobId, attempt: u32, lines: usize) -> String {
        let Ok(file) = std::fs::File::open(self.path(sweep, job, attempt)) else { return String::new() };
        let length = file.metadata().map(|meta| meta.len()).unwrap_or(0);
        let start = length.saturating_sub(4096);
        let mut bytes = vec![0; (length - start) as usize];
        if file.read_exact_at(&mut bytes, start).is_err() {
            return String::new();
        }
        let text = String::from_utf8_lossy(&bytes);
        let all: Vec<&str> = text.lines().filter(|line| !line.trim().is_empty()).collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Up to `max` bytes from `offset`, never past `end` (the committed length).
    fn read(&self, sweep: SweepId, job: JobId, attempt: u32, offset: u64, end: u64) -> io::Result<Vec<u8>> {
        if offset >= end {
            return Ok(Vec::new());
        }
        let mut file = match std::fs::File::open(self.path(sweep, job, attempt)) {
            Ok(file) => file,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(error),
        };
        file.seek(io::SeekFrom::Start(offset))?;
        let mut bytes = Vec::new();
        file.take((end - offset).min(MAX_CHUNK)).read_to_end(&mut bytes)?;
        Ok(bytes)
    }
}

/// What to store of an append.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct AppendPlan {
    /// The part of the body that is new and fits under the cap.
    pub keep: Range<usize>,
    /// Stored after `keep` when the cap is reached.
    pub marker: Option<String>,
    pub after: LogLength,
}

/// Decides an append of `body` at `offset` of the worker's log: the part the server already
/// has is skipped (a retry after a lost ack), bytes past `cap` are dropped behind one marker
/// line but still counted as received, so the worker moves on. A gap is refused.
pub(super) fn plan_append(current: LogLength, offset: u64, body: &[u8], cap: u64) -> Result<AppendPlan, String> {
    let len = body.len();
    if offset > current.received {
        return Err(format!(
            "log append starts at byte {offset} but the server has {} bytes of this attempt; resend from byte {}",
            current.received, current.received
        ));
    }
    let skip = usize::try_from(current.received - offset).unwrap_or(usize::MAX).min(len);
    let fresh = (len - skip) as u64;
    let mut after = LogLength { received: current.received + fresh, ..current };
    if current.truncated || fresh == 0 {
        return Ok(AppendPlan { keep: skip..skip, marker: None, after });
    }
    let taken = fresh.min(cap.saturating_sub(current.stored));
    after.stored += taken;
    let keep = skip..skip + taken as usize;
    if taken == fresh {
        return Ok(AppendPlan { keep, marker: None, after });
    }
    // On a line of its own: after a newline if the kept part ends mid-line.
    let mid_line = body[keep.clone()].last().is_some_and(|byte| *byte != b'\n');
    let marker = format!("{}[app: log truncated at {cap} bytes]\n", if mid_line { "\n" } else { "" });
    after.stored += marker.len() as u64;
    after.truncated = true;
    Ok(AppendPlan { keep, marker: Some(marker), after })
}

/// The note a job gets when its log was cut at the server's cap.
pub(super) fn truncation_note(cap: u64) -> String {
    format!("log truncated at {cap} bytes (the server's max_log_bytes_per_job)")
}

/// Stores an append in `tx`: checks the fence, writes the new bytes to the file and commits
/// the new length. Returns the bytes of the worker's log now accounted for.
pub(super) async fn append(
    tx: &mut super::Tx,
    (logs, cap): (&LogStore, u64),
    WorkerAttempt { job, attempt, worker }: WorkerAttempt,
    offset: u64,
    body: &[u8],
) -> ApiResult<u64> {
    let state = super::fence::holder(tx.conn().await?, job, attempt, worker, "log append").await?;
    let current = db::logs::length(tx.conn().await?, job, attempt).await?;
    let plan = plan_append(current, offset, body, cap)
        .map_err(|gap| ApiError::Conflict(format!("job {job} attempt {attempt}: {gap}")))?;
    if plan.after == current {
        return Ok(current.received);
    }
    let mut stored = body[plan.keep.clone()].to_vec();
    if let Some(marker) = &plan.marker {
        stored.extend_from_slice(marker.as_bytes());
        tracing::warn!(job = %job, attempt, "log truncated at the per-attempt cap");
        db::jobs::add_note(tx.conn().await?, job, attempt, &truncation_note(cap)).await?;
    }
    if !stored.is_empty() {
        logs.write_at(state.sweep_id, job, attempt, current.stored, &stored).map_err(|error| {
            crate::storage::disk_error(error, format!("storing the log of job {job} attempt {attempt}"))
        })?;
    }
    db::logs::set_length(tx.conn().await?, job, attempt, plan.after).await?;
    if plan.after.stored > current.stored {
        tx.note(Change::Log(job));
    }
    Ok(plan.after.received)
}

/// Adds a line of the server's own to an attempt's log (a note about the attempt), after what
/// the worker sent; it counts as stored, not as received from the worker.
pub(super) async fn append_server_line(
    tx: &mut super::Tx,
    logs: &LogStore,
    WorkerAttempt { job, attempt, .. }: WorkerAttempt,
    line: &str,
) -> ApiResult<()> {
    let state = db::jobs::state(tx.conn().await?, job).await?.ok_or_else(|| super::no_job(job))?;
    let mut length = db::logs::length(tx.conn().await?, job, attempt).await?;
    logs.write_at(state.sweep_id, job, attempt, length.stored, line.as_bytes()).map_err(|error| {
        crate::storage::disk_error(error, format!("storing the log of job {job} attempt {attempt}"))
    })?;
    length.stored += line.len() as u64;
    db::logs::set_length(tx.conn().await?, job, attempt, length).await?;
    tx.note(Change::Log(job));
    Ok(())
}

impl Queue {
    /// A worker's append to an attempt's log.
    pub async fn append_log(
        &self,
        job: JobId,
        attempt: u32,
        worker: WorkerId,
        offset: u64,
        body: axum::body::Bytes,
    ) -> ApiResult<u64> {
        let (logs, cap) = (self.logs.clone(), self.config.max_log_bytes_per_job);
        self.write(move |tx| {
            let at = WorkerAttempt { job, attempt, worker };
            Box::pin(async move { append(tx, (&logs, cap), at, offset, &body).await })
        })
        .await
    }

    /// Reads a log from `query.offset`, waiting up to `query.wait_ms` for bytes to arrive.
    pub async fn read_log(&self, id: JobId, query: &LogQuery) -> ApiResult<LogChunk> {
        let wait = Duration::from_millis(query.wait_ms).min(self.config.max_long_poll);
        let deadline = Instant::now() + wait;
        let signal = self.events.job(id);
        let mut shutting_down = self.shutting_down();
        loop {
            // Listen before looking, so an append between the look and the wait still wakes us.
            let notified = signal.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let chunk = self.read_log_now(id, query).await?;
            if chunk.next_offset > query.offset || chunk.finished || Instant::now() >= deadline {
                return Ok(chunk);
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(deadline) => {}
                _ = shutting_down.wait_for(|stop| *stop) => return Err(ApiError::ShuttingDown),
            }
        }
    }

    async fn read_log_now(&self, id: JobId, query: &LogQuery) -> ApiResult<LogChunk> {
        // The job first, the bytes second: an attempt seen ended takes no more appends, so the
        // bytes read after it are all there will be.
        let job = db::jobs::state(self.reader().acquire().await?.conn(), id)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("no job {id}")))?;
        // Attempts count from 1: attempt 0 is "not started yet", so a follower that asked while
        // the job was queued moves on to the attempt that started since.
        let attempt = query.attempt.filter(|attempt| *attempt > 0).unwrap_or(job.attempt);
        let ended = match attempt.cmp(&job.attempt) {
            std::cmp::Ordering::Less => true,
            std::cmp::Ordering::Equal => match job.status {
                JobStatus::Running => false,
                // Queued before its first claim: the log is still to come.
                JobStatus::Queued => attempt > 0,
                _ => true,
            },
            std::cmp::Ordering::Greater => job.status.is_terminal(),
        };
        let stored = db::logs::stored_length(self.reader(), id, attempt).await?;
        let mut bytes = self
            .logs
            .read(job.sweep_id, id, attempt, query.offset, stored)
            .map_err(|error| anyhow::Error::new(error).context(format!("reading the log of job {id}")))?;
        let end = query.offset + bytes.len() as u64;
        // Never split a character between two reads: keep a cut-off sequence for the next one,
        // unless these are the last bytes the attempt will ever have.
        if end < stored || !ended {
            bytes.truncate(complete_utf8_len(&bytes));
        }
        let next_offset = query.offset + bytes.len() as u64;
        Ok(LogChunk {
            attempt,
            offset: query.offset,
            text: String::from_utf8_lossy(&bytes).into_owned(),
            next_offset,
            finished: ended && next_offset >= stored,
        })
    }
}

/// Moves the log bytes that older versions kept in the database (`job_logs`) into files, once,
/// at start-up; the table is emptied as each attempt is written out.
pub async fn export_database_logs(db: &crate::db::Db, logs: &LogStore) -> anyhow::Result<u64> {
    // Only SQLite databases are old enough to hold them.
    let Some(mut writer) = db.sqlite_connection()? else { return Ok(0) };
    let mut exported = 0;
    while let Some((sweep, job, attempt)) = db::logs::first_stored_attempt(&db.reader).await? {
        let mut offset = 0u64;
        loop {
            let bytes = db::logs::read_blobs(&db.reader, job, attempt, offset, 4 << 20).await?;
            if bytes.is_empty() {
                break;
            }
            logs.write_at(sweep, job, attempt, offset, &bytes)?;
            offset += bytes.len() as u64;
        }
        db::logs::forget_blobs(&mut writer, job, attempt).await?;
        exported += 1;
    }
    Ok(exported)
}

/// The length of `bytes` without a UTF-8 sequence cut off at its end.
fn complete_utf8_len(bytes: &[u8]) -> usize {
    for back in 1..=bytes.len().min(3) {
        let byte = bytes[bytes.len() - back];
        if byte & 0b1100_0000 == 0b1000_0000 {
            continue; // a continuation byte: look further back for the sequence's start
        }
        let width = match byte {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if width > back { bytes.len() - back } else { bytes.len() };
    }
    bytes.len()
}

#[cfg(test)]
#[path = "logs_tests.rs"]
mod tests;
