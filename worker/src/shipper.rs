//! Ships an attempt's log and metrics to the server from the files the job writes.
//!
//! Metrics go through the attempt's stream file, which `collect` fills from every source (the
//! job's `APP_METRICS_FILE`, loggers' files, printed lines) before each pass. The files are
//! the buffer: while the server is unreachable nothing is lost, and shipping
//! resumes from the last acknowledged offset when it is back. Every upload names its offset,
//! so a retry after a lost answer is not stored twice.

use crate::collect::Collector;
use crate::metric_budget::Budget;
use client::{Client, ClientError};
use shared::api::{JobAttempt, LogAppend, LogTail, MetricPoint, MetricsBatch, MetricsTail, WorkerId};
use std::path::PathBuf;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

/// Log bytes per request.
const LOG_CHUNK: usize = 256 * 1024;
/// Metric points per request.
const METRICS_BATCH: usize = 5_000;

#[derive(Debug)]
pub enum ShipError {
    /// The server no longer takes reports for this attempt (409/404): drop them.
    Lost(String),
    /// The server is unreachable or failing: try again later.
    Retry(ClientError),
}

fn classify(error: ClientError) -> ShipError {
    match error.status() {
        Some(401 | 404 | 409) => ShipError::Lost(error.to_string()),
        _ => ShipError::Retry(error),
    }
}

pub struct Shipper {
    client: Client,
    worker_id: WorkerId,
    attempt: JobAttempt,
    log_path: PathBuf,
    metrics_path: PathBuf,
    log_offset: u64,
    metrics_offset: u64,
    metrics_lines: u64,
    /// Fills `metrics_path` from the attempt's sources; away only while a pass runs.
    collector: Option<Collector>,
    budget: Budget,
}

impl Shipper {
    pub fn new(client: Client, worker_id: WorkerId, attempt: JobAttempt, collector: Collector) -> Shipper {
        Shipper {
            client,
            worker_id,
            attempt,
            log_path: collector.log().to_path_buf(),
            metrics_path: collector.stream().to_path_buf(),
            log_offset: 0,
            metrics_offset: 0,
            metrics_lines: 0,
            collector: Some(collector),
            budget: Budget::default(),
        }
    }

    /// Reads the attempt's metrics from `collector` from now on (made just before the job
    /// starts, when its directory is known).
    pub fn collect_with(&mut self, collector: Collector) {
        self.collector = Some(collector);
    }

    /// Whether the collector reads loggers' files (see [`Collector::watching`]).
    pub fn watching(&self) -> bool {
        self.collector.as_ref().is_some_and(Collector::watching)
    }

    /// One pass of the collector: in place when it is light, else on a blocking thread.
    async fn collect(&mut self, final_pass: bool) {
        let Some(mut collector) = self.collector.take() else { return };
        if collector.light(final_pass) {
            collector.collect(final_pass);
            self.collector = Some(collector);
            return;
        }
        let pass = tokio::task::spawn_blocking(move || {
            collector.collect(final_pass);
            collector
        });
        self.collector = pass.await.ok();
    }

    /// Sends everything new. On the final pass a last metrics line without a newline counts.
    pub async fn ship(&mut self, final_pass: bool) -> Result<(), ShipError> {
        self.collect(final_pass).await;
        // Metrics first: a skipped line adds a warning to the log, which then ships too.
        self.ship_metrics(final_pass).await?;
        self.ship_log().await
    }

    async fn ship_log(&mut self) -> Result<(), ShipError> {
        // One pass ships what the file held when it began: a job that writes faster than the
        // server takes it cannot keep a pass going forever.
        let end = file_length(&self.log_path).await;
        while self.log_offset < end {
            let limit = LOG_CHUNK.min((end - self.log_offset) as usize);
            let chunk = read_from(&self.log_path, self.log_offset, limit).await;
            if chunk.is_empty() {
                return Ok(());
            }
            let append =
                LogAppend { worker_id: self.worker_id, attempt: self.attempt.attempt, offset: self.log_offset };
            let sent = chunk.len() as u64;
            match self.client.append_log(self.attempt.job_id, &append, chunk).await {
                Ok(_) => self.log_offset += sent,
                Err(error) => return Err(classify(error)),
            }
        }
        Ok(())
    }

    async fn ship_metrics(&mut self, final_pass: bool) -> Result<(), ShipError> {
        let end = file_length(&self.metrics_path).await;
        while self.metrics_offset < end {
            let limit = (4usize << 20).min((end - self.metrics_offset) as usize);
            let bytes = read_from(&self.metrics_path, self.metrics_offset, limit).await;
            let complete = match bytes.iter().rposition(|byte| *byte == b'\n') {
                Some(last) => last + 1,
                None if final_pass => bytes.len(),
                None => 0,
            };
            if complete == 0 {
                return Ok(());
            }
            let mut points = Vec::new();
            let mut consumed = 0;
            let mut warnings = String::new();
            for line in bytes[..complete].split_inclusive(|byte| *byte == b'\n') {
                if points.len() >= METRICS_BATCH {
                    break;
                }
                consumed += line.len();
                self.metrics_lines += 1;
                let (parsed, problem) = parse_line(line);
                points.extend(parsed);
                if let Some(reason) = problem {
                    warnings.push_str(&format!("[app] metrics line {} skipped: {reason}\n", self.metrics_lines));
                }
            }
            let offset = self.metrics_offset + consumed as u64;
            let (points, note) = self.budget.admit(points);
            if let Some(note) = note {
                warnings.push_str(&format!("[app] {note}\n"));
            }
            if !points.is_empty() {
                let sent = points.len();
                let batch = MetricsBatch { worker_id: self.worker_id, attempt: self.attempt.attempt, offset, points };
                match self.client.send_metrics(self.attempt.job_id, &batch).await {
                    Ok(_) => {}
                    // Refused as such (too large, malformed): retrying will not help; go on.
                    Err(error)
                        if error
                            .status()
                            .is_some_and(|status| (400..500).contains(&status) && status != 404 && status != 409) =>
                    {
                        warnings.push_str(&format!("[app] metrics refused by the server: {error}\n"));
                    }
                    Err(error) => {
                        // Not consumed: these lines are read (and counted, and paid for) again
                        // next time.
                        self.budget.refund(sent);
                        self.metrics_lines -= bytes[..consumed].iter().filter(|b| **b == b'\n').count() as u64;
                        return Err(classify(error));
                    }
                }
            }
            if !warnings.is_empty() {
                append_local(&self.log_path, &warnings).await;
            }
            self.metrics_offset = offset;
        }
        Ok(())
    }
}

impl Shipper {
    /// What the server does not have yet, for the attempt's finish request, when both parts
    /// are at most `max` bytes: the log from the last shipped offset, and the metrics file's
    /// remaining lines as points (a last line without a newline counts; bad lines add a warning
    /// to the log first). `None`: too much, ship it with [`Shipper::ship`] instead. All file
    /// work is one trip to a blocking thread.
    pub async fn tail(&mut self, max: u64) -> Option<(Option<LogTail>, Option<MetricsTail>)> {
        self.collect(true).await;
        let (log_path, metrics_path) = (self.log_path.clone(), self.metrics_path.clone());
        let (log_offset, metrics_offset, lines) = (self.log_offset, self.metrics_offset, self.metrics_lines);
        // A job that printed nothing since the last shipment (the usual short job) needs no
        // trip to a blocking thread: two `stat`s say so.
        let grown =
            |path: &PathBuf, offset: u64| std::fs::metadata(path).map(|meta| meta.len() > offset).unwrap_or(false);
        if !grown(&log_path, log_offset) && !grown(&metrics_path, metrics_offset) {
            return Some((None, None));
        }
        let read = move || tail_of((&log_path, log_offset), (&metrics_path, metrics_offset), lines, max);
        let (log, metrics, lines) = tokio::task::spawn_blocking(read).await.ok()??;
        self.metrics_lines = lines;
        let mut log = log;
        let metrics = metrics.map(|tail| {
            let (points, note) = self.budget.admit(tail.points);
            if let Some(note) = note {
                // Into the log file too, so its bytes stay what the offsets say.
                let line = format!("[app] {note}\n");
                use std::io::Write;
                let appended = std::fs::OpenOptions::new().append(true).open(&self.log_path);
                if appended.and_then(|mut file| file.write_all(line.as_bytes())).is_ok() {
                    let tail = log.get_or_insert_with(|| LogTail { offset: self.log_offset, data: Vec::new() });
                    tail.data.extend_from_slice(line.as_bytes());
                }
            }
            MetricsTail { points, ..tail }
        });
        Some((log, metrics))
    }
}

/// The tails of the log (from `log.1`) and the metrics file (from `metrics.1`), or `None` when
/// either holds more than `max` new bytes; warnings about bad metric lines are appended to the
/// log before it is read. Returns the metric lines counted so far too.
fn tail_of(
    (log_path, log_offset): (&PathBuf, u64),
    (metrics_path, metrics_offset): (&PathBuf, u64),
    mut lines: u64,
    max: u64,
) -> Option<(Option<LogTail>, Option<MetricsTail>, u64)> {
    use std::io::{Read, Seek, Write};
    let length = |path: &PathBuf| std::fs::metadata(path).map(|meta| meta.len()).unwrap_or(0);
    let read = |path: &PathBuf, from: u64, to: u64| -> Vec<u8> {
        let mut bytes = Vec::new();
        if let Ok(mut file) = std::fs::File::open(path) {
            if file.seek(std::io::SeekFrom::Start(from)).is_ok() {
                let _ = file.take(to.saturating_sub(from)).read_to_end(&mut bytes);
            }
        }
        bytes
    };
    let metrics_end = length(metrics_path);
    if metrics_end.saturating_sub(metrics_offset) > max || length(log_path).saturating_sub(log_offset) > max {
        return None;
    }
    let mut metrics = None;
    if metrics_end > metrics_offset {
        let bytes = read(metrics_path, metrics_offset, metrics_end);
        let mut points = Vec::new();
        let mut warnings = String::new();
        for line in bytes.split_inclusive(|byte| *byte == b'\n') {
            lines += 1;
            let (parsed, problem) = parse_line(line);
            points.extend(parsed);
            if let Some(reason) = problem {
                warnings.push_str(&format!("[app] metrics line {lines} skipped: {reason}\n"));
            }
        }
        if !warnings.is_empty() {
            if let Ok(mut file) = std::fs::OpenOptions::new().append(true).open(log_path) {
                let _ = file.write_all(warnings.as_bytes());
            }
        }
        metrics = Some(MetricsTail { offset: metrics_offset + bytes.len() as u64, points });
    }
    let log_end = length(log_path);
    let log = (log_end > log_offset).then(|| LogTail { offset: log_offset, data: read(log_path, log_offset, log_end) });
    Some((log, metrics, lines))
}

/// `{"step": 3, "val_loss": 0.12, "lr": 1e-3}` gives one point per finite number but `step`;
/// empty lines give none. A line that is not a JSON object gives none and a reason; a name
/// that cannot be kept (too long, control characters) is left out, with a reason.
pub fn parse_line(line: &[u8]) -> (Vec<MetricPoint>, Option<String>) {
    let text = String::from_utf8_lossy(line);
    let text = text.trim();
    if text.is_empty() {
        return (Vec::new(), None);
    }
    let value: serde_json::Value = match serde_json::from_str(text) {
        Ok(value) => value,
        Err(error) => return (Vec::new(), Some(format!("not JSON ({error})"))),
    };
    let Some(object) = value.as_object() else { return (Vec::new(), Some("not a JSON object".to_string())) };
    let step = object.get("step").and_then(|step| step.as_i64().or_else(|| step.as_f64().map(|f| f as i64)));
    let mut problem = None;
    let points = object
        .iter()
        .filter(|(name, _)| name.as_str() != "step")
        .filter_map(|(name, value)| value.as_f64().filter(|v| v.is_finite()).map(|value| (name, value)))
        .filter(|(name, _)| match shared::metric_check::name_problem(name) {
            Some(why) => {
                problem.get_or_insert(format!("{why}, left out"));
                false
            }
            None => true,
        })
        .map(|(name, value)| MetricPoint { step, name: name.clone(), value })
        .collect();
    (points, problem)
}

async fn file_length(path: &PathBuf) -> u64 {
    tokio::fs::metadata(path).await.map(|meta| meta.len()).unwrap_or(0)
}

/// Up to `limit` bytes of `path` from `offset` (nothing if the file is missing).
async fn read_from(path: &PathBuf, offset: u64, limit: usize) -> Vec<u8> {
    let Ok(mut file) = tokio::fs::File::open(path).await else { return Vec::new() };
    if file.seek(std::io::SeekFrom::Start(offset)).await.is_err() {
        return Vec::new();
    }
    let mut buffer = Vec::new();
    let _ = (&mut file).take(limit as u64).read_to_end(&mut buffer).await;
    buffer
}

/// Adds a note of the worker's to the job's log.
pub async fn append_local(path: &PathBuf, text: &str) {
    if let Ok(mut file) = tokio::fs::OpenOptions::new().append(true).create(true).open(path).await {
        // tokio's write completes in the background unless flushed: the shipping pass that
        // follows must see these bytes in the file's length.
        let _ = file.write_all(text.as_bytes()).await;
        let _ = file.flush().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_lines_become_points_and_garbage_is_refused() {
        let (points, problem) = parse_line(br#"{"step": 3, "val_loss": 0.12, "lr": 1e-3, "tag": "x"}"#);
        assert_eq!((points.len(), problem), (2, None));
        assert_eq!(points[0], MetricPoint { step: Some(3), name: "val_loss".into(), value: 0.12 });
        assert_eq!(parse_line(b"\n"), (Vec::new(), None));
        assert!(parse_line(b"loss=0.3").1.unwrap().contains("not JSON"));
        assert!(parse_line(b"[1, 2]").1.unwrap().contains("object"));
        assert_eq!(parse_line(br#"{"acc": 0.5}"#).0[0].step, None);
        let long = format!(r#"{{"{}": 1, "ok": 2, "bell\u0007": 3}}"#, "x".repeat(10_000));
        let (points, problem) = parse_line(long.as_bytes());
        assert_eq!(points.iter().map(|point| point.name.as_str()).collect::<Vec<_>>(), ["ok"]);
        assert!(problem.unwrap().contains("10000 bytes"), "the first bad name is named");
    }
}
