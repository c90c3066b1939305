//! Which database the data directory's files belong to.
//!
//! Results, logs and checkpoints are filed under sweep and job ids, and a new database hands
//! those out again from 1. A server started on a removed or replaced `queue.db` beside the old
//! files would append new jobs' logs to old ones, restore another run's checkpoint into a new
//! job, and delete old result versions as leftovers of a crash. So the directory carries a
//! marker, `.app-instance`, naming the database instance (`server_instance`) its files belong
//! to, and a start whose database does not match it is refused before anything is touched.
//! Replicas on one database share one directory: the marker also tells a replica that its
//! directory is not the shared one.

use anyhow::Context;
use std::io;
use std::path::Path;

/// The marker's file name, in the data directory.
pub const MARKER: &str = ".app-instance";
/// The directories whose files are named by ids the database hands out.
const ID_NAMED: [&str; 3] = ["results", "logs", "checkpoints"];

/// What a start does about the marker.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The files are this database's.
    Matches,
    /// Write the marker: no files yet, or files from before markers existed beside the
    /// database that has always been there.
    Mark,
    /// The files belong to another database: the one the marker names (`None`: an unmarked
    /// directory's files, beside a new database).
    Refuse { marked: Option<String> },
}

/// The decision, from the marker's content (if any), this database's instance id, whether the
/// database is new (made by this start, or holding no sweep), and whether the id-named
/// directories hold anything.
pub fn decide(marked: Option<&str>, instance: &str, database_new: bool, has_files: bool) -> Verdict {
    match marked {
        Some(marked) if marked == instance => Verdict::Matches,
        Some(marked) => Verdict::Refuse { marked: Some(marked.to_string()) },
        None if has_files && database_new => Verdict::Refuse { marked: None },
        None => Verdict::Mark,
    }
}

/// Checks the data directory against the database (`database` names it in messages) and marks
/// it if it is unmarked; an error says why the server must not start and what to do.
pub fn check(data_dir: &Path, database: &str, instance: &str, database_new: bool) -> anyhow::Result<()> {
    let marker = data_dir.join(MARKER);
    let marked = match std::fs::read_to_string(&marker) {
        Ok(text) => Some(text.trim().to_string()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => None,
        Err(error) => return Err(error).with_context(|| format!("reading {}", marker.display())),
    };
    let has_files = has_files(data_dir).with_context(|| format!("reading {}", data_dir.display()))?;
    match decide(marked.as_deref(), instance, database_new, has_files) {
        Verdict::Matches => Ok(()),
        Verdict::Mark => write_marker(&marker, instance).with_context(|| format!("writing {}", marker.display())),
        Verdict::Refuse { marked } => {
            let dir = data_dir.display();
            let owner = match (&marked, has_files) {
                (Some(marked), true) => format!("the files (results, logs, checkpoints) of database instance {marked}"),
                (Some(marked), false) => format!("the marker {MARKER} of database instance {marked}"),
                (None, _) => "results, logs or checkpoints of an earlier database".to_string(),
            };
            let this = match database_new {
                true => format!("is new (instance {instance}; was it removed or replaced?)"),
                false => format!("is instance {instance}"),
            };
            anyhow::bail!(
                "the data directory {dir} holds {owner}, but the database {database} {this}: starting would file its \
                 jobs among those files (job and sweep ids are reused) and delete results it has no record of. Start \
                 with the database those files belong to, or move results/, logs/, checkpoints/ and {MARKER} out of \
                 {dir} to begin afresh"
            )
        }
    }
}

/// [`check`] for a database several servers share (PostgreSQL): the directory must be the one
/// the server that made the database marked; an unmarked one is marked only by that server.
/// A replica started on a directory of its own is refused, naming both.
pub fn check_shared(data_dir: &Path, database: &str, instance: &str, created: bool) -> anyhow::Result<()> {
    let marker = data_dir.join(MARKER);
    match std::fs::read_to_string(&marker) {
        Ok(text) if text.trim() == instance => Ok(()),
        Ok(_) => check(data_dir, database, instance, false),
        Err(error) if error.kind() == io::ErrorKind::NotFound && created => check(data_dir, database, instance, true),
        Err(error) if error.kind() == io::ErrorKind::NotFound => anyhow::bail!(
            "the data directory {dir} is not the one the servers of {database} (instance {instance}) share: it has \
             no {MARKER} marker, which the server that made the database wrote into the shared directory. Give every \
             server the same --data-dir (a shared file system), or, if this is that directory and its marker was \
             lost, write the instance id into {marker}",
            dir = data_dir.display(),
            marker = marker.display()
        ),
        Err(error) => Err(error).with_context(|| format!("reading {}", marker.display())),
    }
}

/// Whether any id-named directory holds an entry (names starting with `.` are the server's
/// own scratch space, such as `results/.staging`).
fn has_files(data_dir: &Path) -> io::Result<bool> {
    for name in ID_NAMED {
        let entries = match std::fs::read_dir(data_dir.join(name)) {
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            entries => entries?,
        };
        for entry in entries {
            if !entry?.file_name().to_string_lossy().starts_with('.') {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Written aside and renamed into place: a crash leaves the old state or the new one.
fn write_marker(marker: &Path, instance: &str) -> io::Result<()> {
    let partial = marker.with_extension("partial");
    let file = std::fs::File::create(&partial)?;
    io::Write::write_all(&mut &file, format!("{instance}\n").as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&partial, marker)?;
    // The rename itself made durable: a power cut must not bring back an unmarked directory.
    match marker.parent() {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_is_refused_when_the_files_belong_to_another_or_an_earlier_database() {
        use Verdict::*;
        let other = || Refuse { marked: Some("b".into()) };
        // (marker, database new, files there) -> verdict, for instance "a".
        assert_eq!(decide(Some("a"), "a", false, true), Matches);
        assert_eq!(decide(Some("a"), "a", true, false), Matches, "a marked, emptied directory");
        assert_eq!(decide(Some("b"), "a", false, true), other(), "another instance's database put in place");
        assert_eq!(decide(Some("b"), "a", true, true), other(), "queue.db removed beside its files");
        assert_eq!(decide(Some("b"), "a", true, false), other(), "the marker stays until it is moved too");
        assert_eq!(decide(None, "a", true, true), Refuse { marked: None }, "an unmarked directory's database removed");
        assert_eq!(decide(None, "a", false, true), Mark, "files from before markers, with their database");
        assert_eq!(decide(None, "a", true, false), Mark, "a first start");
        assert_eq!(decide(None, "a", false, false), Mark);
    }

    #[test]
    fn only_entries_of_the_id_named_directories_count_as_files() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!has_files(dir.path()).unwrap());
        for scratch in ["results/.staging/.incoming", "code/ab"] {
            std::fs::create_dir_all(dir.path().join(scratch)).unwrap();
        }
        std::fs::write(dir.path().join("queue.db"), b"").unwrap();
        assert!(!has_files(dir.path()).unwrap(), "staging, code snapshots and the database are not id-named");
        for named in ["results/sweep", "logs/1", "checkpoints/7"] {
            let other = tempfile::tempdir().unwrap();
            std::fs::create_dir_all(other.path().join(named)).unwrap();
            assert!(has_files(other.path()).unwrap(), "{named}");
        }
    }
}
