//! An attempt's metrics from wherever its script reports them, gathered into the one stream
//! the shipper ships (`metrics.stream.jsonl` in the attempt's directory, JSON lines like the
//! job's own `APP_METRICS_FILE`).
//!
//! The sources, read on each shipping pass (every `ship_interval` while the job runs, and once
//! more when it has ended):
//! - the job's `APP_METRICS_FILE`, and `APP_CAPTURE_FILE` where the Python hook (`python`)
//!   writes each committed `wandb.log` row: their complete lines, copied as they are;
//! - `metrics_regex:`: the job's printed lines that match a pattern;
//! - unless the sweep says `capture: none`, the files the loggers researchers use write by
//!   default (`files`): TensorBoard event files, Lightning's `metrics.csv`, Hugging Face's
//!   `trainer_state.json` and MLflow's `mlruns/<experiment>/<run>/metrics/<name>`.
//!
//! A metric name is taken from the first source that reports it: Hugging Face's `Trainer`
//! reports `train/loss` to W&B and to TensorBoard at once, with steps of different meanings,
//! and one series must have one. The job's own files come first in every pass.
//!
//! Every read is bounded: one chunk of each file per pass while the job runs, the rest (still
//! by chunks, written as they are read) when it has ended.

pub mod csv_logger;
mod files;
pub mod hf_state;
pub mod mlflow;
pub mod python;
pub mod tfevents;

use shared::api::MetricPoint;
use shared::metric_pattern::MetricPattern;
use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

pub use files::MAX_WALK_ENTRIES;

/// Bytes of the job's metrics file or log read per chunk; one chunk per pass while the job
/// runs, every chunk (up to [`FINAL_CHUNKS`]) when it has ended.
const TAIL_BUDGET: u64 = 4 << 20;
const FINAL_CHUNKS: usize = 256;
/// Bytes waiting in the job's files above which a pass goes to a blocking thread.
const LIGHT_BYTES: u64 = 1 << 20;

/// Where an attempt's metrics come from, besides `APP_METRICS_FILE`.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// Read loggers' files (not `capture: none`).
    pub capture: bool,
    /// Directories to look in: `$TENSORBOARD_LOGDIR`, the output directory, where the job
    /// starts.
    pub roots: Vec<PathBuf>,
    /// `metrics_regex:`, compiled.
    pub patterns: Vec<MetricPattern>,
    /// What to tell the job's log at the first pass.
    pub notes: Vec<String>,
    /// The user a `run_as` job runs as: loggers' files are found and read with that user's
    /// rights, never the worker's (`run_as::with_file_identity`).
    pub identity: Option<(u32, u32)>,
}

impl Sources {
    /// The sources of a job of `workspace` that starts in `cwd` and writes results to
    /// `output`, with `variable` its environment's values, run as `identity` when another user.
    pub fn of(
        workspace: &shared::api::Workspace,
        (cwd, output): (&Path, &Path),
        identity: Option<(u32, u32)>,
        variable: impl Fn(&str) -> Option<String>,
    ) -> Sources {
        let capture = !workspace.capture_off;
        let mut sources = Sources { capture, identity, ..Sources::default() };
        if let Some(logdir) = variable("TENSORBOARD_LOGDIR").filter(|dir| !dir.is_empty() && capture) {
            sources.roots.push(files::normalize(&cwd.join(logdir)));
        }
        sources.roots.extend([output.to_path_buf(), cwd.to_path_buf()]);
        for pattern in &workspace.metrics_regex {
            match MetricPattern::new(pattern) {
                Ok(pattern) => sources.patterns.push(pattern),
                Err(why) => sources.notes.push(format!("metrics_regex: {why}")),
            }
        }
        sources
    }
}

/// Which kind of source a metric name was first taken from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// `APP_METRICS_FILE` and the W&B capture: copied as written, never left out.
    Job,
    Printed,
    Events,
    Csv,
    HfState,
    Mlflow,
}

/// A file read from where the last pass stopped.
#[derive(Debug)]
struct Tail {
    path: PathBuf,
    offset: u64,
}

impl Tail {
    fn new(path: PathBuf) -> Tail {
        Tail { path, offset: 0 }
    }

    fn pending(&self) -> u64 {
        std::fs::metadata(&self.path).map(|meta| meta.len().saturating_sub(self.offset)).unwrap_or(0)
    }
}

/// Where a pass writes: the stream, keeping each name to its first source.
struct Sink<'a> {
    stream: &'a mut std::fs::File,
    owners: &'a mut HashMap<String, Source>,
    /// Record the names of copied lines (only needed when other sources may report them).
    track: bool,
    failed: Option<std::io::Error>,
}

impl Sink<'_> {
    fn write(&mut self, bytes: &[u8]) {
        if !bytes.is_empty() && self.failed.is_none() {
            if let Err(error) = self.stream.write_all(bytes) {
                self.failed = Some(error);
            }
        }
    }

    /// Whole lines of the job's own files, as they are.
    fn lines(&mut self, lines: &[u8]) {
        if self.track {
            for line in lines.split(|byte| *byte == b'\n') {
                if let Ok(object) = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(line) {
                    for name in object.keys().filter(|name| name.as_str() != "step") {
                        self.owners.entry(name.clone()).or_insert(Source::Job);
                    }
                }
            }
        }
        self.write(lines);
        if lines.last().is_some_and(|last| *last != b'\n') {
            self.write(b"\n");
        }
    }

    /// Points of `source`, but those of names another source reported first.
    fn points(&mut self, source: Source, mut points: Vec<MetricPoint>) {
        points.retain(|point| *self.owners.entry(point.name.clone()).or_insert(source) == source);
        let mut out = Vec::new();
        write_points(&points, &mut out);
        self.write(&out);
    }
}

pub struct Collector {
    stream: PathBuf,
    job_file: Tail,
    capture_file: Tail,
    log: Tail,
    patterns: Vec<MetricPattern>,
    files: Option<files::Files>,
    owners: HashMap<String, Source>,
    warned_write: bool,
    notes: Vec<String>,
}

impl Collector {
    /// A collector for an attempt whose stream is `stream`, with the job's metrics file
    /// `job_file`, the W&B capture's `capture_file` and its log `log`. Call
    /// [`Collector::look_before`] before the job starts.
    pub fn new(
        stream: PathBuf,
        (job_file, capture_file): (PathBuf, PathBuf),
        log: PathBuf,
        sources: Sources,
    ) -> Collector {
        Collector {
            stream,
            job_file: Tail::new(job_file),
            capture_file: Tail::new(capture_file),
            log: Tail::new(log),
            patterns: sources.patterns,
            files: sources.capture.then(|| files::Files::new(sources.roots, sources.identity)),
            owners: HashMap::new(),
            warned_write: false,
            notes: sources.notes,
        }
    }

    /// Notes the loggers' files already there (shipped with the code, or left in a shared
    /// `workdir`), which are not the job's: before the job starts. Nothing to do (and no trip
    /// to a blocking thread needed) when there are no such files to look through.
    pub fn look_before(&mut self) {
        if let Some(files) = &mut self.files {
            files.look_before();
        }
    }

    /// Whether [`Collector::look_before`] has anything to look through.
    pub fn has_trees(&self) -> bool {
        self.files.as_ref().is_some_and(files::Files::has_trees)
    }

    /// The file the shipper ships.
    pub fn stream(&self) -> &Path {
        &self.stream
    }

    /// The job's log (printed lines, and the collector's notes).
    pub fn log(&self) -> &Path {
        &self.log.path
    }

    /// Whether it reads files the job writes without printing (loggers' files): then passes
    /// come every shipping interval, not only when the job prints.
    pub fn watching(&self) -> bool {
        self.files.as_ref().is_some_and(files::Files::watching)
    }

    /// Whether a pass is cheap enough to run in place: a small tree to walk (or none), and
    /// little waiting in the job's files on the final pass.
    pub fn light(&self, final_pass: bool) -> bool {
        let walk = self.files.as_ref().is_none_or(files::Files::light);
        let waiting = || {
            let log = if self.patterns.is_empty() { 0 } else { self.log.pending() };
            self.job_file.pending() + self.capture_file.pending() + log
        };
        walk && (!final_pass || waiting() < LIGHT_BYTES)
    }

    /// One pass: whatever is new in every source, appended to the stream. On the final pass
    /// (the job has ended) a last line without a newline counts, and every file is read to
    /// its end whatever the time since the last walk.
    pub fn collect(&mut self, final_pass: bool) {
        let Ok(mut stream) = std::fs::OpenOptions::new().append(true).create(true).open(&self.stream) else { return };
        let track = self.files.is_some() || !self.patterns.is_empty();
        let mut sink = Sink { stream: &mut stream, owners: &mut self.owners, track, failed: None };
        for tail in [&mut self.job_file, &mut self.capture_file] {
            for_chunks(&tail.path, &mut tail.offset, final_pass, |lines| sink.lines(lines));
        }
        if !self.patterns.is_empty() {
            let patterns = &self.patterns;
            for_chunks(&self.log.path, &mut self.log.offset, final_pass, |lines| {
                let mut points = Vec::new();
                for line in lines.split(|byte| *byte == b'\n') {
                    let line = String::from_utf8_lossy(line);
                    // The worker's own notes are not the job's output.
                    if line.starts_with("[app] ") {
                        continue;
                    }
                    for pattern in patterns {
                        let matched = pattern.points(&line).into_iter();
                        points.extend(matched.map(|(step, name, value)| MetricPoint { step, name, value }));
                    }
                }
                sink.points(Source::Printed, points);
            });
        }
        if let Some(files) = &mut self.files {
            files.pass(final_pass, &mut sink, &mut self.notes);
        }
        if let Some(error) = sink.failed.take() {
            if !self.warned_write {
                self.warned_write = true;
                self.notes.push(format!("writing the metrics stream failed ({error}): points of this pass are lost"));
            }
        }
        if !self.notes.is_empty() {
            if let Ok(mut file) = std::fs::OpenOptions::new().append(true).create(true).open(&self.log.path) {
                let notes: String = self.notes.drain(..).map(|note| format!("[app] {note}\n")).collect();
                let _ = file.write_all(notes.as_bytes());
            }
        }
    }
}

/// Passes the whole lines of `path` past `*offset` to `take`, a chunk of at most
/// [`TAIL_BUDGET`] bytes at a time, and moves `*offset` past them: one chunk while the job runs
/// (a later pass goes on), every chunk to the end on the final pass (at most [`FINAL_CHUNKS`]),
/// where a last line without a newline counts. A line longer than a chunk is cut there (its
/// pieces are refused as lines, never block the file).
fn for_chunks(path: &Path, offset: &mut u64, final_pass: bool, mut take: impl FnMut(&[u8])) {
    for _ in 0..if final_pass { FINAL_CHUNKS } else { 1 } {
        let bytes = read_range(path, *offset, TAIL_BUDGET);
        let at_end = (bytes.len() as u64) < TAIL_BUDGET;
        let complete = match complete_lines(&bytes, final_pass && at_end) {
            0 if !at_end => bytes.len(),
            complete => complete,
        };
        take(&bytes[..complete]);
        *offset += complete as u64;
        if at_end || complete == 0 {
            break;
        }
    }
}

/// `path` opened for reading when it is a plain file: never through a symlink a job put in its
/// place since it was found (it could point at a file only the worker may read), and never
/// waiting on a FIFO.
pub(crate) fn open_plain(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
        .open(path)?;
    match file.metadata()?.is_file() {
        true => Ok(file),
        false => Err(std::io::Error::other("not a plain file")),
    }
}

/// Up to `limit` bytes of `path` from `offset` (nothing if it is missing, shorter, or not a
/// plain file).
pub(crate) fn read_range(path: &Path, offset: u64, limit: u64) -> Vec<u8> {
    let mut bytes = Vec::new();
    let Ok(mut file) = open_plain(path) else { return bytes };
    if file.metadata().map(|meta| meta.len() <= offset).unwrap_or(true) || file.seek(SeekFrom::Start(offset)).is_err() {
        return bytes;
    }
    let _ = file.take(limit).read_to_end(&mut bytes);
    bytes
}

/// How many bytes of `bytes` are whole lines; on the final pass, all of them.
pub(crate) fn complete_lines(bytes: &[u8], final_pass: bool) -> usize {
    match bytes.iter().rposition(|byte| *byte == b'\n') {
        _ if final_pass => bytes.len(),
        Some(last) => last + 1,
        None => 0,
    }
}

/// Points as JSON lines, one per step run: consecutive points of one step with distinct names
/// share a line.
fn write_points(points: &[MetricPoint], out: &mut Vec<u8>) {
    let mut line = serde_json::Map::new();
    let mut step = None;
    let flush = |line: &mut serde_json::Map<String, serde_json::Value>, step: Option<i64>, out: &mut Vec<u8>| {
        if line.is_empty() {
            return;
        }
        if let Some(step) = step {
            line.insert("step".to_string(), step.into());
        }
        if let Ok(text) = serde_json::to_vec(&*line) {
            out.extend_from_slice(&text);
            out.push(b'\n');
        }
        line.clear();
    };
    for point in points {
        let Some(value) = serde_json::Number::from_f64(point.value) else { continue };
        // `step` is the line's step, not a metric: a metric of that name goes on a line of
        // its own under a name that cannot clash.
        let name = if point.name == "step" { "step_" } else { point.name.as_str() };
        if step != point.step || line.contains_key(name) {
            flush(&mut line, step, out);
            step = point.step;
        }
        line.insert(name.to_string(), value.into());
    }
    flush(&mut line, step, out);
}

#[cfg(test)]
mod tests;
