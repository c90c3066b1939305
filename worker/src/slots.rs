//! Attempt directories that are used again. Each running attempt takes a slot, a directory
//! under `<work_dir>/slots/`, emptied when its attempt is done: creating and removing three
//! directories per attempt cost short jobs more than anything else the worker did for them.
//! An attempt that must stay for a look (`--keep-work-dirs`, or its delivery failed) takes its
//! slot's directory with it, renamed to `<work_dir>/<sweep>/<index>/attempt-<n>`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The slots of one worker: the free ones, and how many there are.
#[derive(Debug, Default)]
pub struct Slots {
    state: Mutex<(BTreeSet<usize>, usize)>,
}

impl Slots {
    /// The lowest free slot, or a new one.
    pub fn take(&self) -> usize {
        let Ok(mut state) = self.state.lock() else { return usize::MAX };
        let (free, count) = &mut *state;
        match free.pop_first() {
            Some(slot) => slot,
            None => {
                *count += 1;
                *count - 1
            }
        }
    }

    pub fn give(&self, slot: usize) {
        if let Ok(mut state) = self.state.lock() {
            state.0.insert(slot);
        }
    }
}

/// Where slot `slot` lives.
pub fn root(work_dir: &Path, slot: usize) -> PathBuf {
    work_dir.join("slots").join(slot.to_string())
}

/// Removes everything inside `dir` (not `dir` itself); a missing `dir` is empty.
pub fn empty(dir: &Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    for entry in entries {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(entry.path())?;
        } else {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_lowest_first_and_grow_when_all_are_taken() {
        let slots = Slots::default();
        assert_eq!((slots.take(), slots.take(), slots.take()), (0, 1, 2));
        slots.give(1);
        slots.give(0);
        assert_eq!((slots.take(), slots.take(), slots.take()), (0, 1, 3));
    }

    #[test]
    fn emptying_keeps_the_directory_and_removes_what_is_inside() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/c.txt"), "x").unwrap();
        std::fs::write(dir.path().join("d.txt"), "y").unwrap();
        empty(dir.path()).unwrap();
        assert!(dir.path().is_dir());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        empty(&dir.path().join("missing")).unwrap();
    }
}
