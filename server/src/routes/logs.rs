//! `/api/jobs/{id}/log`: workers append an attempt's log bytes (fenced, idempotent by
//! offset, capped per attempt); readers page through it or follow it with a long poll.

use super::fence;
use crate::db::{self, logs::LogLength};
use crate::error::{ApiError, ApiPath, ApiQuery, ApiResult};
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use shared::api::{JobId, LogAck, LogAppend, LogChunk, LogQuery};
use shared::job::JobStatus;
use std::ops::Range;
use std::time::Duration;
use tokio::time::Instant;

/// Most bytes one read returns; a follower simply asks again.
const MAX_CHUNK: u64 = 1 << 20;

pub fn router() -> Router<AppState> {
    Router::new().route("/api/jobs/{id}/log", get(read).post(append))
}

/// What to store of an append.
#[derive(Debug, PartialEq, Eq)]
struct AppendPlan {
    /// The part of the body that is new and fits under the cap.
    keep: Range<usize>,
    /// Stored after `keep` when the cap is reached.
    marker: Option<String>,
    after: LogLength,
}

/// Decides an append of `body` at `offset` of the worker's log: the part the server already
/// has is skipped (a retry after a lost ack), bytes past `cap` are dropped behind one marker
/// line but still counted as received, so the worker moves on. A gap is refused.
fn plan_append(current: LogLength, offset: u64, body: &[u8], cap: u64) -> Result<AppendPlan, String> {
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

async fn append(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<JobId>,
    ApiQuery(query): ApiQuery<LogAppend>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<LogAck>> {
    let body = body?;
    // The check, the length and the insert are one short transaction on the single writer, so
    // no state change or other append can come in between.
    let mut tx = state.db.writer.begin().await?;
    fence::holder(&mut tx, id, query.attempt, query.worker_id, "log append").await?;
    let current = db::logs::length(&mut tx, id, query.attempt).await?;
    let plan = plan_append(current, query.offset, &body, state.config.max_log_bytes_per_job)
        .map_err(|gap| ApiError::Conflict(format!("job {id} attempt {}: {gap}", query.attempt)))?;
    if plan.after == current {
        return Ok(Json(LogAck { length: current.received }));
    }
    let mut stored = body[plan.keep.clone()].to_vec();
    if let Some(marker) = &plan.marker {
        stored.extend_from_slice(marker.as_bytes());
        tracing::warn!(job = %id, attempt = query.attempt, "log truncated at the per-attempt cap");
    }
    if !stored.is_empty() {
        db::logs::append(&mut tx, id, query.attempt, current.stored, &stored).await?;
    }
    db::logs::set_length(&mut tx, id, query.attempt, plan.after).await?;
    tx.commit().await?;
    if plan.after.stored > current.stored {
        state.job_signals.wake(id);
    }
    Ok(Json(LogAck { length: plan.after.received }))
}

async fn read(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<JobId>,
    ApiQuery(query): ApiQuery<LogQuery>,
) -> ApiResult<Json<LogChunk>> {
    let wait = Duration::from_millis(query.wait_ms).min(state.config.max_long_poll);
    let deadline = Instant::now() + wait;
    let signal = state.job_signals.listen(id);
    let mut shutting_down = state.shutting_down.clone();
    loop {
        // Listen before looking, so an append between the look and the wait still wakes us.
        let notified = signal.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let chunk = read_now(&state, id, &query).await?;
        if chunk.next_offset > query.offset || chunk.finished || Instant::now() >= deadline {
            return Ok(Json(chunk));
        }
        tokio::select! {
            _ = &mut notified => {}
            _ = tokio::time::sleep_until(deadline) => {}
            _ = shutting_down.wait_for(|stop| *stop) => return Err(ApiError::ShuttingDown),
        }
    }
}

async fn read_now(state: &AppState, id: JobId, query: &LogQuery) -> ApiResult<LogChunk> {
    // The job first, the bytes second: an attempt seen ended takes no more appends, so the
    // bytes read after it are all there will be.
    let job = db::jobs::state(&mut *state.db.reader.acquire().await?, id)
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
    let stored = db::logs::stored_length(&state.db.reader, id, attempt).await?;
    let mut bytes = db::logs::read(&state.db.reader, id, attempt, query.offset, MAX_CHUNK).await?;
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
mod tests {
    use super::*;

    const CAP: u64 = 100;

    fn length(received: u64, stored: u64, truncated: bool) -> LogLength {
        LogLength { received, stored, truncated }
    }

    #[test]
    fn an_append_at_the_end_is_stored_whole() {
        let plan = plan_append(length(10, 10, false), 10, &[b'x'; 5], CAP).unwrap();
        assert_eq!(plan, AppendPlan { keep: 0..5, marker: None, after: length(15, 15, false) });
    }

    #[test]
    fn a_retried_append_stores_only_what_is_new() {
        let plan = plan_append(length(10, 10, false), 6, &[b'x'; 8], CAP).unwrap();
        assert_eq!((plan.keep, plan.after), (4..8, length(14, 14, false)));
        let duplicate = plan_append(length(10, 10, false), 2, &[b'x'; 8], CAP).unwrap();
        assert_eq!((duplicate.keep.len(), duplicate.after), (0, length(10, 10, false)));
    }

    #[test]
    fn a_gap_is_refused_with_where_to_resume() {
        let gap = plan_append(length(10, 10, false), 12, b"x", CAP).unwrap_err();
        assert!(gap.contains("resend from byte 10"), "{gap}");
    }

    #[test]
    fn bytes_past_the_cap_are_dropped_behind_one_marker_and_still_acked() {
        let plan = plan_append(length(90, 90, false), 90, &[b'x'; 30], CAP).unwrap();
        let marker = plan.marker.clone().unwrap();
        assert_eq!(marker, "\n[app: log truncated at 100 bytes]\n");
        assert_eq!(plan.keep, 0..10);
        assert_eq!(plan.after, length(120, 100 + marker.len() as u64, true));
        let later = plan_append(plan.after, 120, &[b'x'; 50], CAP).unwrap();
        assert_eq!((later.keep.len(), later.marker, later.after.received), (0, None, 170));
        // A kept part that ends a line needs no extra newline before the marker.
        let lines = plan_append(length(90, 90, false), 90, b"123456789\nmore", CAP).unwrap();
        assert_eq!(lines.marker.as_deref(), Some("[app: log truncated at 100 bytes]\n"));
    }

    #[test]
    fn a_character_cut_at_the_end_waits_for_its_other_bytes() {
        let text = "añ€😀".as_bytes();
        assert_eq!(complete_utf8_len(text), text.len());
        for cut in 1..text.len() {
            let kept = complete_utf8_len(&text[..cut]);
            assert!(std::str::from_utf8(&text[..kept]).is_ok(), "cut at {cut} kept {kept}");
            assert!(cut - kept < 4);
        }
    }
}
