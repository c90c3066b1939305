//! When a running job saves its checkpoints (decision 0088): the executor looks at
//! `$APP_CHECKPOINT_DIR` every [`LOOK_EVERY`] and notes when the newest modification time of
//! the directory and its top-level entries moves on. A save is a run of looks that each see a
//! change (a large file written over several looks is one save), dated by the newest time at
//! its end. A preemption then waits for the next save when the ones before it say it is due
//! soon (`shared::checkpoint_wait`), and stops the job once the save has settled (a look
//! that sees no further change).
//!
//! Only the top level is looked at, at most [`MOST_ENTRIES`] entries: a save that creates or
//! replaces a file or a directory there is seen; one that rewrites a file deeper in place is
//! not (the job is then stopped at once, as before). What was restored before the job started
//! is the starting point, not a save.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

/// How often the directory is looked at.
pub const LOOK_EVERY: Duration = Duration::from_millis(250);
/// The most top-level entries looked at in one look.
pub const MOST_ENTRIES: usize = 64;
/// The saves remembered (two give the interval).
const KEPT: usize = 4;

/// What the looks at one attempt's checkpoint directory have seen.
#[derive(Debug, Default)]
pub struct Saves {
    /// The first look was taken.
    looked: bool,
    /// The newest modification time seen (Unix ms), from the first look on.
    newest: Option<i64>,
    /// The last saves' times, oldest first.
    times: Vec<i64>,
    /// Saves seen so far (not capped).
    count: u64,
    /// The last look saw a change: a save may still be under way.
    changing: bool,
}

impl Saves {
    /// Takes in one look's newest modification time (`None`: the directory could not be read
    /// or holds nothing).
    pub fn observe(&mut self, newest: Option<i64>) {
        if !self.looked {
            // The first look: what was there before (a restored checkpoint) is no save.
            (self.looked, self.newest, self.changing) = (true, newest, false);
            return;
        }
        match newest {
            Some(newest) if self.newest.is_none_or(|seen| newest > seen) => {
                self.newest = Some(newest);
                if self.changing {
                    if let Some(last) = self.times.last_mut() {
                        *last = newest;
                    }
                } else {
                    if self.times.len() == KEPT {
                        self.times.remove(0);
                    }
                    self.times.push(newest);
                    self.count += 1;
                }
                self.changing = true;
            }
            _ => self.changing = false,
        }
    }

    /// Looks at `dir` once.
    pub fn look(&mut self, dir: &Path) {
        self.observe(newest_time(dir));
    }

    /// The saves' times, oldest first.
    pub fn times(&self) -> &[i64] {
        &self.times
    }

    /// How many saves have been seen.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Whether a save beyond the first `count` has been seen and has settled.
    pub fn settled_after(&self, count: u64) -> bool {
        self.count > count && !self.changing
    }
}

/// The newest modification time (Unix ms) of `dir` and its first [`MOST_ENTRIES`] entries;
/// `None` when it cannot be read or is empty.
fn newest_time(dir: &Path) -> Option<i64> {
    let millis = |metadata: &std::fs::Metadata| metadata.mtime() * 1_000 + metadata.mtime_nsec() / 1_000_000;
    let mut entries = std::fs::read_dir(dir).ok()?.peekable();
    entries.peek()?;
    let mut newest = millis(&std::fs::symlink_metadata(dir).ok()?);
    for entry in entries.take(MOST_ENTRIES).flatten() {
        if let Ok(metadata) = entry.metadata() {
            newest = newest.max(millis(&metadata));
        }
    }
    Some(newest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_save_is_a_run_of_changes_dated_by_its_end_and_the_first_look_is_no_save() {
        let mut empty = Saves::default();
        empty.observe(None); // an empty directory at the start
        empty.observe(Some(3_000));
        empty.observe(Some(3_000));
        assert_eq!(empty.times(), &[3_000], "the first file written is a save");
        let mut saves = Saves::default();
        saves.observe(Some(100)); // restored
        assert_eq!((saves.count(), saves.times()), (0, &[][..]));
        saves.observe(Some(100));
        saves.observe(Some(5_000)); // a save begins
        assert!(!saves.settled_after(0), "under way");
        saves.observe(Some(5_300)); // still writing
        saves.observe(Some(5_300)); // done
        assert!(saves.settled_after(0));
        assert_eq!((saves.count(), saves.times()), (1, &[5_300][..]));
        saves.observe(Some(9_000));
        saves.observe(Some(9_000));
        assert_eq!(saves.times(), &[5_300, 9_000]);
        assert!(!saves.settled_after(2));
        saves.observe(None); // unreadable for a moment: nothing changes
        assert_eq!(saves.count(), 2);
    }

    #[test]
    fn only_the_last_few_saves_are_kept() {
        let mut saves = Saves::default();
        saves.observe(Some(0));
        for time in 1..=10 {
            saves.observe(Some(time * 1_000));
            saves.observe(Some(time * 1_000));
        }
        assert_eq!((saves.count(), saves.times()), (10, &[7_000, 8_000, 9_000, 10_000][..]));
    }

    #[test]
    fn a_file_written_into_the_directory_moves_its_newest_time() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(newest_time(dir.path()), None, "empty: no checkpoint yet");
        std::fs::write(dir.path().join("a.pt"), "1").unwrap();
        let first = newest_time(dir.path()).expect("a file");
        let mut saves = Saves::default();
        saves.look(dir.path());
        let file = std::fs::File::options().write(true).open(dir.path().join("a.pt")).unwrap();
        let later = std::time::SystemTime::UNIX_EPOCH + Duration::from_millis(first as u64 + 60_000);
        file.set_modified(later).unwrap(); // rewritten in place a minute later
        saves.look(dir.path());
        saves.look(dir.path());
        assert_eq!(saves.times(), &[first + 60_000]);
        assert!(saves.settled_after(0));
    }
}
