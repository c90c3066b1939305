//! When a running job saves its checkpoints, and a preemption's wait for the next one
//! ([`SaveWait`], decision 0088): the executor looks at
//! `$APP_CHECKPOINT_DIR` every [`LOOK_EVERY`] and notes when the newest modification time of
//! the directory and its top-level entries moves on (a file created in a top-level directory,
//! as Hugging Face's `checkpoint-N/`, moves that directory's time too). A save is the changes
//! seen until the directory has been quiet for [`QUIET_LOOKS`] looks (a second), dated by the
//! newest time at its end. A preemption then waits for the next save when the ones before it
//! say it is due soon (`shared::checkpoint_wait`), and stops the job once the save has
//! settled: quiet for a second, and no process of the job holding a file under the directory
//! open for writing (`job_processes::writes_under`, which sees a large file written in place
//! deeper down).
//!
//! Only the top level's times are looked at, at most [`MOST_ENTRIES`] entries: a save that
//! only rewrites a file deeper in place is not seen as a save (the job is then stopped at
//! once, as before). What was restored before the job started is the starting point, not a
//! save.

use nix::unistd::Pid;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// An attempt's latest save (Unix ms) and the interval before it, put here by its executor as
/// each save settles and taken by the worker's next heartbeat (the server's preemption pass
/// prefers the jobs whose next save is due: decision 0089). A note lost with a failed
/// heartbeat is replaced by the next save's.
pub type Latest = Arc<Mutex<Option<(i64, Option<i64>)>>>;

/// How often the directory is looked at.
pub const LOOK_EVERY: Duration = Duration::from_millis(250);
/// The most top-level entries looked at in one look.
pub const MOST_ENTRIES: usize = 64;
/// Looks without a change after which a save has ended.
pub const QUIET_LOOKS: u32 = 4;
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
    /// Looks without a change since the last change.
    quiet: u32,
}

impl Saves {
    /// Takes in one look's newest modification time (`None`: the directory could not be read
    /// or holds nothing); `writing` says whether a file under it is open for writing, asked
    /// only when this look would end a save (which it then does not).
    pub fn observe(&mut self, newest: Option<i64>, writing: impl FnOnce() -> bool) {
        if !self.looked {
            // The first look: what was there before (a restored checkpoint) is no save.
            (self.looked, self.newest, self.quiet) = (true, newest, QUIET_LOOKS);
            return;
        }
        match newest {
            Some(newest) if self.newest.is_none_or(|seen| newest > seen) => {
                self.newest = Some(newest);
                if self.under_way() {
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
                self.quiet = 0;
            }
            _ if self.quiet.saturating_add(1) == QUIET_LOOKS && self.count > 0 && writing() => {}
            _ => self.quiet = self.quiet.saturating_add(1),
        }
    }

    /// Whether a save is under way: a change seen less than [`QUIET_LOOKS`] looks ago.
    pub fn under_way(&self) -> bool {
        self.count > 0 && self.quiet < QUIET_LOOKS
    }

    /// Looks at `dir` once (`writing` as in [`Saves::observe`]).
    pub fn look(&mut self, dir: &Path, writing: impl FnOnce() -> bool) {
        self.observe(newest_time(dir), writing);
    }

    /// The saves' times, oldest first.
    pub fn times(&self) -> &[i64] {
        &self.times
    }

    /// How many saves have been seen.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The latest save, and the time since the one before (once there are two).
    pub fn latest(&self) -> Option<(i64, Option<i64>)> {
        match self.times[..] {
            [.., previous, last] => Some((last, Some(last - previous))),
            [last] => Some((last, None)),
            [] => None,
        }
    }

    /// Whether a save beyond the first `count` has been seen and the directory is quiet since.
    pub fn settled_after(&self, count: u64) -> bool {
        self.count > count && !self.under_way()
    }
}

/// A preemption waiting for the job's next checkpoint (decision 0088): at most half its grace,
/// and SIGKILL still a grace after the order.
pub struct SaveWait {
    grace: Duration,
    ordered: tokio::time::Instant,
    /// When the next save is due, with a little slack; a save under way then stretches the
    /// wait to `most`.
    pub until: tokio::time::Instant,
    /// Half the grace after the order.
    pub most: tokio::time::Instant,
    /// Saves seen before the order.
    seen: u64,
    /// A save was under way at the order: its end is what the wait is for.
    under_way: bool,
}

/// Whether one of the job's processes holds a file under `dir` open for writing.
pub fn writes_under(group: Option<Pid>, dir: &Path) -> bool {
    group.is_some_and(|group| crate::job_processes::writes_under(group.as_raw(), dir))
}

/// Whether the job is saving a checkpoint: its directory changed less than a second ago, or
/// one of its processes holds a file under it open for writing.
pub fn saving(saves: &Saves, group: Option<Pid>, dir: &Path) -> bool {
    saves.under_way() || writes_under(group, dir)
}

impl SaveWait {
    /// A wait, when the job's saves say its next is due within half the grace or (once it has
    /// saved twice: a job that writes there all the time shows one endless save) a save is under
    /// way, and none of its processes handles SIGTERM (one that does acts on it at once: the
    /// built-in trainer and the quick start's script save the epoch under way, and waiting
    /// would start another).
    pub fn start(saves: &Saves, grace: Duration, group: Option<Pid>, dir: &Path) -> Option<SaveWait> {
        let now = crate::now_ms();
        let ordered = tokio::time::Instant::now();
        let most = ordered + grace / 2;
        if grace / 2 < LOOK_EVERY {
            return None;
        }
        let under_way = saves.count() >= 2 && saving(saves, group, dir);
        let until = if under_way {
            most
        } else {
            let deadline = shared::checkpoint_wait::wait_until(saves.times(), now, (grace / 2).as_millis() as i64)?;
            ordered + Duration::from_millis(deadline.saturating_sub(now).max(0) as u64)
        };
        if crate::job_processes::group_catches(group?.as_raw(), nix::sys::signal::Signal::SIGTERM as i32) {
            return None;
        }
        Some(SaveWait { grace, ordered, until: until.min(most), most, seen: saves.count(), under_way })
    }

    /// Whether the save it waits for has been written: a new one (or the one under way at the
    /// order) has ended, and nothing is being written now.
    pub fn written(&self, saves: &Saves, group: Option<Pid>, dir: &Path) -> bool {
        (self.under_way || saves.count() > self.seen) && !saving(saves, group, dir)
    }

    /// What is left of the grace for SIGTERM.
    pub fn grace_left(&self) -> Duration {
        self.grace.saturating_sub(self.ordered.elapsed())
    }

    pub fn note(&self, saved: bool) -> String {
        let waited = self.ordered.elapsed().as_secs_f64();
        if saved {
            format!("preempted {waited:.1} s after the order, once the job's checkpoint was written")
        } else {
            format!("preempted after waiting {waited:.1} s for the job's next checkpoint, which did not come or end")
        }
    }
}

/// The newest modification time (Unix ms) of `dir` and its first [`MOST_ENTRIES`] entries;
/// `None` when it cannot be read or is empty.
fn newest_time(dir: &Path) -> Option<i64> {
    let millis = |metadata: &std::fs::Metadata| {
        metadata.mtime().saturating_mul(1_000).saturating_add(metadata.mtime_nsec() / 1_000_000)
    };
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

    /// Takes in `newest` and then enough quiet looks for the save to end.
    fn saved(saves: &mut Saves, newest: i64) {
        saves.observe(Some(newest), || false);
        for _ in 0..QUIET_LOOKS {
            saves.observe(Some(newest), || false);
        }
    }

    #[test]
    fn a_save_is_the_changes_until_a_quiet_second_dated_by_its_end_and_the_first_look_is_no_save() {
        let mut empty = Saves::default();
        empty.observe(None, || false); // an empty directory at the start
        saved(&mut empty, 3_000);
        assert_eq!(empty.times(), &[3_000], "the first file written is a save");
        let mut saves = Saves::default();
        saves.observe(Some(100), || false); // restored
        assert_eq!((saves.count(), saves.times()), (0, &[][..]));
        saves.observe(Some(100), || false);
        saves.observe(Some(5_000), || false); // a save begins
        assert!(!saves.settled_after(0) && saves.under_way(), "under way");
        saves.observe(Some(5_000), || false); // a pause while it writes
        saves.observe(Some(5_300), || false); // still writing: the same save
        for _ in 1..QUIET_LOOKS {
            saves.observe(Some(5_300), || false);
            assert!(!saves.settled_after(0), "quiet for less than a second");
        }
        saves.observe(Some(5_300), || false);
        assert!(saves.settled_after(0));
        assert_eq!((saves.count(), saves.times(), saves.latest()), (1, &[5_300][..], Some((5_300, None))));
        saved(&mut saves, 9_000);
        assert_eq!(saves.times(), &[5_300, 9_000]);
        assert_eq!(saves.latest(), Some((9_000, Some(3_700))));
        assert!(!saves.settled_after(2));
        saves.observe(None, || false); // unreadable for a moment: nothing changes
        assert_eq!(saves.count(), 2);
    }

    #[test]
    fn only_the_last_few_saves_are_kept() {
        let mut saves = Saves::default();
        saves.observe(Some(0), || false);
        for time in 1..=10 {
            saved(&mut saves, time * 1_000);
        }
        assert_eq!((saves.count(), saves.times()), (10, &[7_000, 8_000, 9_000, 10_000][..]));
    }

    #[test]
    fn a_save_with_a_file_still_open_for_writing_has_not_ended() {
        let mut saves = Saves::default();
        saves.observe(Some(0), || false);
        saves.observe(Some(1_000), || panic!("asked only when a save would end"));
        for _ in 1..QUIET_LOOKS {
            saves.observe(Some(1_000), || panic!("not yet"));
        }
        for _ in 0..10 {
            saves.observe(Some(1_000), || true); // a large file still being written
            assert!(saves.under_way());
        }
        saves.observe(Some(1_000), || false);
        assert!(!saves.under_way() && saves.settled_after(0));
        saves.observe(Some(1_000), || panic!("a quiet directory after the save: not asked again"));
    }

    #[test]
    fn a_file_written_into_the_directory_moves_its_newest_time() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(newest_time(dir.path()), None, "empty: no checkpoint yet");
        std::fs::write(dir.path().join("a.pt"), "1").unwrap();
        let first = newest_time(dir.path()).expect("a file");
        let mut saves = Saves::default();
        saves.look(dir.path(), || false);
        let file = std::fs::File::options().write(true).open(dir.path().join("a.pt")).unwrap();
        let later = std::time::SystemTime::UNIX_EPOCH + Duration::from_millis(first as u64 + 60_000);
        file.set_modified(later).unwrap(); // rewritten in place a minute later
        for _ in 0..=QUIET_LOOKS {
            saves.look(dir.path(), || false);
        }
        assert_eq!(saves.times(), &[first + 60_000]);
        assert!(saves.settled_after(0));
    }
}
