//! Loggers' files: found by a walk of the job's directories (`$TENSORBOARD_LOGDIR`, its output
//! directory, where it starts), each read from where the last pass stopped.
//!
//! A file that was there before the job started, unchanged (same inode, time and length), is
//! not the job's: shipped with its code, or left in a shared `workdir` by earlier runs. One
//! that changed since (Hugging Face writes `checkpoint-N/trainer_state.json` at the same paths
//! every run) is read whole. A walk looks at [`MAX_WALK_ENTRIES`] entries per directory at
//! most, skipping hidden directories and tools' (`__pycache__`, `node_modules`, environments,
//! W&B's own `wandb/` run files, which repeat what `wandb.log` gave); a file the first walk
//! did not reach is the job's only if it was written after the job started.
//!
//! For a job run as another user every walk and read is done with that user's rights
//! (`run_as::with_file_identity`): the tree is the user's, and could lead the worker's own
//! rights elsewhere through a directory swapped for a link.

use super::{csv_logger, for_chunks, hf_state, mlflow, open_plain, tfevents, Sink, Source, FINAL_CHUNKS};
use shared::api::MetricPoint;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// Entries one walk of one directory looks at, at most.
pub const MAX_WALK_ENTRIES: usize = 20_000;
/// How deep a walk goes below each root.
const MAX_DEPTH: usize = 8;
/// The least time between two walks while the job runs (reading known files is every pass).
const WALK_EVERY: Duration = Duration::from_secs(1);
/// Bytes of one event file read per chunk.
const EVENTS_BUDGET: u64 = 16 << 20;
/// Directories never walked into.
const SKIPPED_DIRS: [&str; 5] = ["__pycache__", "node_modules", "site-packages", "wandb", "dist-packages"];
/// How long before the first look a file the job wrote may claim to have been written (file
/// times are coarse).
const CLOCK_MARGIN: Duration = Duration::from_secs(2);

/// What kind of logger wrote a file, by its name and place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Events,
    Csv,
    HfState,
    Mlflow,
}

fn kind_of(path: &Path) -> Option<Kind> {
    let name = path.file_name()?.to_str()?;
    if tfevents::is_event_file(name) {
        Some(Kind::Events)
    } else if name == "metrics.csv" {
        Some(Kind::Csv)
    } else if name == "trainer_state.json" {
        Some(Kind::HfState)
    } else if mlflow::metric_name(path).is_some() {
        Some(Kind::Mlflow)
    } else {
        None
    }
}

/// A logger's file being read: where it is, and whether its log line was said.
#[derive(Debug)]
struct Reader {
    state: Position,
    /// Said something about it in the log already (said once per file).
    warned: bool,
    /// Read no more of it (damage, or a file that is not what its name says).
    stopped: bool,
}

#[derive(Debug)]
enum Position {
    Events { offset: u64, prefix: Option<String> },
    Csv(csv_logger::CsvState),
    HfState { seen: Option<(u64, SystemTime)> },
    Mlflow { offset: u64, name: String },
}

/// What marks a file as the one that was there: inode, modification time, length.
type Stamp = (u64, SystemTime, u64);

pub(super) struct Files {
    roots: Vec<PathBuf>,
    identity: Option<(u32, u32)>,
    before: HashMap<PathBuf, Stamp>,
    readers: BTreeMap<PathBuf, Reader>,
    /// `log_history` rows taken, per Hugging Face output directory (each state file holds the
    /// whole history up to its save; a second `Trainer` in the job has its own).
    hf_taken: HashMap<PathBuf, usize>,
    /// Files older than this that the first look did not see are not the job's.
    since: SystemTime,
    last_walk: Option<Instant>,
    /// Entries the last walk looked at: a small tree is walked in place.
    walked: usize,
    warned_walk: bool,
}

impl Files {
    pub fn new(roots: Vec<PathBuf>, identity: Option<(u32, u32)>) -> Files {
        let mut unique = HashSet::new();
        let roots = roots.into_iter().filter(|root| unique.insert(root.clone())).collect();
        Files {
            roots,
            identity,
            before: HashMap::new(),
            readers: BTreeMap::new(),
            hf_taken: HashMap::new(),
            since: SystemTime::now() - CLOCK_MARGIN,
            last_walk: None,
            walked: 0,
            warned_walk: false,
        }
    }

    /// Whether any directory to look through holds anything yet.
    pub fn has_trees(&self) -> bool {
        crate::run_as::with_file_identity(self.identity, || {
            self.roots.iter().any(|root| std::fs::read_dir(root).is_ok_and(|mut entries| entries.next().is_some()))
        })
    }

    pub fn look_before(&mut self) {
        let (found, walked, _) = crate::run_as::with_file_identity(self.identity, || walk(&self.roots));
        self.before = found.into_iter().map(|(path, _, stamp)| (path, stamp)).collect();
        self.walked = walked;
        self.since = SystemTime::now() - CLOCK_MARGIN;
    }

    pub fn watching(&self) -> bool {
        !self.readers.is_empty()
    }

    pub fn light(&self) -> bool {
        self.walked < 256
    }

    /// Finds new files when a walk is due (always on the final pass), reads every file's news
    /// into `sink`.
    pub(super) fn pass(&mut self, final_pass: bool, sink: &mut Sink, notes: &mut Vec<String>) {
        crate::run_as::with_file_identity(self.identity, || {
            if final_pass || self.last_walk.is_none_or(|last| last.elapsed() >= WALK_EVERY) {
                self.find(notes);
            }
            self.read(final_pass, sink, notes);
        });
    }

    fn find(&mut self, notes: &mut Vec<String>) {
        self.last_walk = Some(Instant::now());
        let (found, walked, cut) = walk(&self.roots);
        self.walked = walked;
        if cut && !self.warned_walk {
            self.warned_walk = true;
            notes.push(format!(
                "more than {MAX_WALK_ENTRIES} files under the job's directory: loggers' files beyond them are not read \
                 (set TENSORBOARD_LOGDIR, or write to APP_METRICS_FILE)"
            ));
        }
        let event_dirs: HashSet<PathBuf> = found
            .iter()
            .filter(|(_, kind, _)| *kind == Kind::Events)
            .filter_map(|(path, _, _)| path.parent().map(Path::to_path_buf))
            .chain(
                self.readers
                    .iter()
                    .filter(|(_, reader)| matches!(reader.state, Position::Events { .. }))
                    .filter_map(|(path, _)| path.parent().map(Path::to_path_buf)),
            )
            .collect();
        for (path, kind, stamp) in found {
            if self.readers.contains_key(&path) {
                continue;
            }
            match self.before.get(&path) {
                Some(before) if *before == stamp => continue,
                Some(_) => {}
                None if stamp.1 < self.since => continue,
                None => {}
            }
            let state = match kind {
                Kind::Events => Position::Events { offset: 0, prefix: tfevents_prefix(&path, &event_dirs) },
                Kind::Csv => Position::Csv(csv_logger::CsvState::default()),
                Kind::HfState => Position::HfState { seen: None },
                Kind::Mlflow => Position::Mlflow { offset: 0, name: mlflow::metric_name(&path).unwrap_or_default() },
            };
            self.readers.insert(path, Reader { state, warned: false, stopped: false });
        }
    }

    fn read(&mut self, final_pass: bool, sink: &mut Sink, notes: &mut Vec<String>) {
        let roots = &self.roots;
        let shown = |path: &Path| {
            roots.iter().find_map(|root| path.strip_prefix(root).ok()).unwrap_or(path).display().to_string()
        };
        let chunks = if final_pass { FINAL_CHUNKS } else { 1 };
        let mut gone = Vec::new();
        for (path, reader) in self.readers.iter_mut() {
            if reader.stopped {
                continue;
            }
            // Removed (a checkpoint rotated away): forget it.
            if std::fs::symlink_metadata(path).is_err_and(|error| error.kind() == std::io::ErrorKind::NotFound) {
                gone.push(path.clone());
                continue;
            }
            let mut note = None;
            match &mut reader.state {
                Position::Events { offset, prefix } => {
                    let Ok(mut file) = open_plain(path) else { continue };
                    for _ in 0..chunks {
                        let Ok(read) = tfevents::read_from(&mut file, *offset, EVENTS_BUDGET) else { break };
                        let moved = read.offset > *offset;
                        *offset = read.offset;
                        let points = read.points.into_iter().map(|point| match prefix {
                            Some(prefix) => MetricPoint { name: format!("{prefix}/{}", point.name), ..point },
                            None => point,
                        });
                        sink.points(Source::Events, points.collect());
                        if let Some(damage) = read.damage {
                            reader.stopped = true;
                            note =
                                Some(format!("TensorBoard file {}: {damage}; the rest of it is not read", shown(path)));
                        } else if read.torn && final_pass {
                            note = Some(format!(
                                "TensorBoard file {} ends in an incomplete record, not read",
                                shown(path)
                            ));
                        }
                        if !moved || note.is_some() || read.torn {
                            break;
                        }
                    }
                }
                Position::Csv(state) => {
                    for _ in 0..chunks {
                        let mut points = Vec::new();
                        let read = state.read(path, final_pass, &mut points);
                        sink.points(Source::Csv, points);
                        match read {
                            Ok(true) => {}
                            Ok(false) => break,
                            Err(why) => {
                                reader.stopped = true;
                                note = Some(format!("{}: {why}", shown(path)));
                                break;
                            }
                        }
                    }
                }
                Position::HfState { seen } => {
                    let Ok(meta) = open_plain(path).and_then(|file| file.metadata()) else { continue };
                    let now = (meta.len(), meta.modified().unwrap_or(SystemTime::UNIX_EPOCH));
                    if *seen == Some(now) {
                        continue;
                    }
                    let run = hf_run(path);
                    let taken = self.hf_taken.get(&run).copied().unwrap_or(0);
                    match hf_state::read(path, taken) {
                        Ok((points, rows)) => {
                            *seen = Some(now);
                            sink.points(Source::HfState, points);
                            self.hf_taken.insert(run, taken.max(rows));
                        }
                        // Caught mid-write: the next pass reads it whole. At the end, say so.
                        Err(why) if final_pass => note = Some(format!("{}: {why}", shown(path))),
                        Err(_) => {}
                    }
                }
                Position::Mlflow { offset, name } => {
                    for_chunks(path, offset, final_pass, |lines| {
                        sink.points(Source::Mlflow, mlflow::points(name, lines))
                    });
                }
            }
            if let Some(note) = note.filter(|_| !reader.warned) {
                reader.warned = true;
                notes.push(note);
            }
        }
        for path in gone {
            self.readers.remove(&path);
        }
    }
}

/// The output directory a Hugging Face state file belongs to: `out` for both
/// `out/trainer_state.json` and `out/checkpoint-500/trainer_state.json`.
fn hf_run(path: &Path) -> PathBuf {
    let dir = path.parent().unwrap_or(path);
    match dir.file_name().and_then(|name| name.to_str()).is_some_and(|name| name.starts_with("checkpoint-")) {
        true => dir.parent().unwrap_or(dir).to_path_buf(),
        false => dir.to_path_buf(),
    }
}

/// TensorBoard names a run by its directory. One directory's tags are taken as they are; a
/// directory that sits in another with event files (`add_scalars` writes each series to
/// `<dir>/<tag>_<key>/`), or Keras's `train/` and `validation/`, prefixes its tags with its
/// name, so `validation/epoch_loss` and `train/epoch_loss` stay apart.
fn tfevents_prefix(path: &Path, event_dirs: &HashSet<PathBuf>) -> Option<String> {
    let dir = path.parent()?;
    let name = dir.file_name()?.to_str()?;
    let nested = dir.parent().is_some_and(|parent| event_dirs.contains(parent));
    (nested || name == "train" || name == "validation").then(|| name.to_string())
}

/// Loggers' files under `roots` (each root walked with its own budget, a file under two of
/// them listed once): `(path, kind, stamp)`, the entries looked at, and whether a walk stopped
/// at [`MAX_WALK_ENTRIES`].
fn walk(roots: &[PathBuf]) -> (Vec<(PathBuf, Kind, Stamp)>, usize, bool) {
    use std::os::unix::fs::MetadataExt;
    let (mut found, mut listed, mut seen, mut cut) = (Vec::new(), HashSet::new(), 0, false);
    for root in roots {
        let entries = walkdir::WalkDir::new(root).max_depth(MAX_DEPTH).into_iter().filter_entry(|entry| {
            let name = entry.file_name().to_string_lossy();
            entry.depth() == 0
                || !entry.file_type().is_dir()
                || !(name.starts_with('.') || SKIPPED_DIRS.contains(&name.as_ref()))
        });
        for (count, entry) in entries.flatten().enumerate() {
            seen += 1;
            if count >= MAX_WALK_ENTRIES {
                cut = true;
                break;
            }
            if !entry.file_type().is_file() {
                continue;
            }
            let Some(kind) = kind_of(entry.path()) else { continue };
            let Ok(meta) = entry.metadata() else { continue };
            let stamp = (meta.ino(), meta.modified().unwrap_or(SystemTime::UNIX_EPOCH), meta.len());
            if listed.insert(entry.path().to_path_buf()) {
                found.push((entry.into_path(), kind, stamp));
            }
        }
    }
    (found, seen, cut)
}

/// `path` with `.` and `..` taken out as written (`/w/work/../logs` is `/w/logs`).
pub(super) fn normalize(path: &Path) -> PathBuf {
    let mut normal = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                normal.pop();
            }
            Component::CurDir => {}
            other => normal.push(other),
        }
    }
    normal
}
