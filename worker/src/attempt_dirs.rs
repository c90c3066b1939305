//! An attempt's directory and the files the worker puts in it: made fresh for each attempt in a
//! reused slot directory, with the job's config, parameters and metrics files, none of which a
//! job's links or a stray writer of the last attempt can redirect.

use shared::api::ClaimedJob;
use std::path::{Path, PathBuf};

/// Where an attempt's files live: a reused slot directory, `<work_dir>/slots/<n>/` (see
/// `slots`), or `<work_dir>/<sweep>/<index>/attempt-<n>/` once kept.
#[derive(Debug, Clone)]
pub struct AttemptDirs {
    pub root: PathBuf,
    /// The job's fresh directory: empty, or its code snapshot unpacked (the job starts here or
    /// in a directory inside it, or in the sweep's `workdir`).
    pub cwd: PathBuf,
    /// `APP_CHECKPOINT_DIR`: empty, or the job's newest checkpoint restored.
    pub checkpoint: PathBuf,
    /// Where a checkpoint is packed before its upload, and downloaded before it is restored.
    pub checkpoint_archive: PathBuf,
    /// The job's own marks: a directory it may write (its `run_as` user owns it).
    pub state: PathBuf,
    /// The layers of an overlay the job's code view is mounted from (`code_copy`).
    pub code_layers: PathBuf,
    /// Written by the job's shell, in `state`, once its `setup:` line succeeded.
    pub setup_done: PathBuf,
    /// `APP_OUTPUT_DIR`: uploaded as the attempt's results.
    pub output: PathBuf,
    /// `APP_CONFIG`.
    pub config: PathBuf,
    /// `APP_METRICS_FILE`.
    pub metrics: PathBuf,
    /// What the shipper ships: the metrics of every source, gathered by `collect`.
    pub stream: PathBuf,
    /// `APP_CAPTURE_FILE`: the rows the Python hook mirrors from `wandb.log`, kept apart from
    /// the job's own `APP_METRICS_FILE` (a script may open that one with "w").
    pub capture: PathBuf,
    /// stdout and stderr, as shipped to the server.
    pub log: PathBuf,
    /// `WANDB_SWEEP_PARAM_PATH` of a W&B-form job: its parameters as W&B's agent writes them,
    /// read by `wandb.init()` into `wandb.config`.
    pub wandb_params: PathBuf,
}

impl AttemptDirs {
    /// The directories of slot `slot`.
    pub fn for_slot(work_dir: &Path, slot: usize) -> AttemptDirs {
        Self::at(crate::slots::root(work_dir, slot))
    }

    /// Where an attempt is kept for a look: `<work_dir>/<sweep>/<index>/attempt-<n>`.
    pub fn kept(work_dir: &Path, job: &ClaimedJob) -> PathBuf {
        work_dir
            .join(shared::names::sweep_dir_name(&job.sweep))
            .join(job.index.to_string())
            .join(format!("attempt-{}", job.attempt))
    }

    pub(crate) fn at(root: PathBuf) -> AttemptDirs {
        AttemptDirs {
            cwd: root.join("work"),
            checkpoint: root.join("checkpoint"),
            checkpoint_archive: root.join("checkpoint.tar.zst"),
            state: root.join("state"),
            code_layers: root.join("code-layers"),
            setup_done: root.join("state").join("setup-done"),
            output: root.join("output"),
            config: root.join("config.yaml"),
            metrics: root.join("metrics.jsonl"),
            stream: root.join("metrics.stream.jsonl"),
            capture: root.join("capture.jsonl"),
            log: root.join("job.log"),
            wandb_params: root.join("wandb-params.yaml"),
            root,
        }
    }

    /// Empties the attempt's directories and files, keeping them for the next attempt in the
    /// slot. The files keep their inodes (see [`reuse_file`]): a new inode per file per job
    /// made every short job pay ext4's inode allocator, which skips every inode freed in the last
    /// minutes, and with thousands of jobs those were thousands.
    pub fn clear(&self) -> std::io::Result<()> {
        crate::slots::empty(&self.cwd)?;
        crate::slots::empty(&self.output)?;
        crate::slots::empty(&self.checkpoint)?;
        for file in [&self.wandb_params, &self.setup_done, &self.checkpoint_archive] {
            remove_if_there(file)?;
        }
        for file in [&self.config, &self.metrics, &self.stream, &self.capture, &self.log] {
            if std::fs::symlink_metadata(file).is_ok() {
                reuse_file(file, b"", false, file != &self.config && file != &self.log)?;
            }
        }
        Ok(())
    }

    /// Makes the directories fresh (empty; whatever a crashed worker or an earlier attempt left
    /// is removed, the directories themselves are kept), writes the config file and opens the
    /// log. Done in place when the slot's directories are empty (as its last attempt left
    /// them), else in one trip to a blocking thread for all of it: each `tokio::fs` call would
    /// be a trip of its own, and a short job's cost is mostly trips.
    /// With `fresh`, the attempt's own directories are removed and made again rather than
    /// emptied (a `run_as` job's directories must start as root's, see `run_as`).
    pub async fn prepare(&self, job: &ClaimedJob, fresh: bool) -> std::io::Result<std::fs::File> {
        // YAML is a superset of JSON, so the params object is a valid config file as is.
        let config = job.config.clone().unwrap_or_else(|| format!("{}\n", job.params));
        let wandb = match job.form {
            shared::sweep::SweepForm::Wandb => {
                Some(shared::sweep::wandb_params_file(&job.params.to_string()).map_err(std::io::Error::other)?)
            }
            _ => None,
        };
        let dirs = self.clone();
        let work = move || {
            if fresh {
                for dir in [&dirs.cwd, &dirs.output, &dirs.checkpoint, &dirs.state] {
                    match std::fs::remove_dir_all(dir) {
                        Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
                        _ => {}
                    }
                }
            }
            for dir in [&dirs.cwd, &dirs.output, &dirs.checkpoint] {
                crate::slots::empty(dir)?;
                std::fs::create_dir_all(dir)?;
            }
            std::fs::create_dir_all(&dirs.state)?;
            remove_if_there(&dirs.setup_done)?;
            remove_if_there(&dirs.wandb_params)?;
            reuse_file(&dirs.config, config.as_bytes(), false, false)?;
            if let Some(wandb) = wandb {
                std::fs::write(&dirs.wandb_params, wandb)?;
            }
            reuse_file(&dirs.metrics, b"", false, true)?;
            reuse_file(&dirs.stream, b"", false, true)?;
            reuse_file(&dirs.capture, b"", false, true)?;
            reuse_file(&dirs.log, b"", true, false)
        };
        // A slot emptied by its last attempt (the usual case) needs a handful of small calls:
        // done in place, without waking a blocking thread and waiting for it.
        let empty = |dir: &Path| std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_none());
        if !fresh && [&self.cwd, &self.output, &self.checkpoint].into_iter().all(|dir| empty(dir)) {
            return work();
        }
        tokio::task::spawn_blocking(work).await.map_err(std::io::Error::other)?
    }
}

/// Removes `file`; one that is not there is fine.
fn remove_if_there(file: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(file) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

/// `file` holding exactly `contents`, opened for writing (appending with `append`), in the
/// inode the slot's last attempt used where there is one.
///
/// Why not a new file each time: ext4 skips every inode freed in the last minutes when it
/// hands out a new one (`recently_deleted`), so a worker that removed and made its three files
/// per job spent ever longer in the allocator as jobs went by, and after any large removal
/// (an earlier run's directories): 2,000 `true` jobs ran at 460-1,000 jobs/s depending on what
/// had been deleted before. Why not a truncation to zero either, where it can be helped: ext4's
/// `auto_da_alloc` writes a file truncated to zero back to disk when it is closed, so the
/// config is overwritten and cut to its new length instead, and the log and metrics are
/// truncated only when the last attempt wrote to them.
///
/// Whatever a job left at the path that is not a plain file of its own (a symlink, a
/// directory, a file with a second name elsewhere) is removed and a new file made: nothing is
/// written through a job's symlink or into a copy it kept by hard link.
fn reuse_file(file: &Path, contents: &[u8], append: bool, fresh_if_written: bool) -> std::io::Result<std::fs::File> {
    use std::io::Write;
    use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
    let open = |new: bool| {
        let mut options = std::fs::OpenOptions::new();
        if append {
            options.append(true);
        } else {
            options.write(true);
        }
        if new {
            options.create_new(true);
        } else {
            options.create(true);
        }
        // O_NONBLOCK: a FIFO a job left there fails to open at once (ENXIO) and is replaced,
        // where a plain open would wait for a reader forever (regular files ignore the flag).
        options.custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY).open(file)
    };
    let reused = open(false).and_then(|handle| match handle.metadata() {
        // A second name (a hard link a job made to keep its config) keeps what it holds.
        Ok(metadata) if metadata.is_file() && metadata.nlink() == 1 => Ok((handle, metadata.len())),
        Ok(_) => Err(std::io::Error::other("not a plain file of its own")),
        Err(error) => Err(error),
    });
    // A file the last attempt wrote may still be open in a process that left the job's group
    // and outlived it (the metrics file of a daemonized logger): it gets a new inode, so such
    // a stray writes into the old one, never into the next attempt's.
    let reused = reused.and_then(|(handle, length)| match fresh_if_written && length > 0 {
        true => Err(std::io::Error::other("written by the last attempt")),
        false => Ok((handle, length)),
    });
    let (handle, length) = match reused {
        Ok(reused) => reused,
        Err(_) => {
            match std::fs::symlink_metadata(file) {
                Ok(metadata) if metadata.is_dir() => std::fs::remove_dir_all(file)?,
                _ => remove_if_there(file)?,
            }
            (open(true)?, 0)
        }
    };
    if append {
        if length > 0 {
            handle.set_len(0)?;
        }
        (&handle).write_all(contents)?;
    } else {
        handle.write_all_at(contents, 0)?;
        if length > contents.len() as u64 {
            handle.set_len(contents.len() as u64)?;
        }
    }
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A claimed job with one parameter, as the server hands it out.
    fn claimed() -> ClaimedJob {
        serde_json::from_value(serde_json::json!({
            "id": 1, "attempt": 1, "sweep_id": 1, "sweep": "s", "form": "native", "index": 0,
            "params": {"lr": 0.1}, "command": "true", "config": null, "resources": {},
            "timeout_secs": null, "placement": {"gpus": []}, "lease_expires_at": 0
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn a_slot_is_made_fresh_for_each_attempt_whatever_the_last_one_left() {
        let job = claimed();
        let work = tempfile::tempdir().unwrap();
        let dirs = AttemptDirs::for_slot(work.path(), 0);
        // A new slot (nothing there yet: prepared on a blocking thread), one an earlier attempt
        // left files in (the same), and one left empty (prepared in place).
        for leftovers in [false, true, false] {
            if leftovers {
                std::fs::write(dirs.output.join("old.bin"), b"old").unwrap();
                std::fs::create_dir_all(dirs.cwd.join("deep/er")).unwrap();
                std::fs::write(&dirs.log, b"old log").unwrap();
            }
            let mut log = dirs.prepare(&job, false).await.unwrap();
            std::io::Write::write_all(&mut log, b"new\n").unwrap();
            for dir in [&dirs.cwd, &dirs.output, &dirs.checkpoint] {
                assert_eq!(std::fs::read_dir(dir).unwrap().count(), 0, "{} is empty", dir.display());
            }
            assert_eq!(std::fs::read_to_string(&dirs.config).unwrap(), "{\"lr\":0.1}\n");
            assert_eq!(std::fs::read_to_string(&dirs.log).unwrap(), "new\n", "the log starts empty");
        }
        // Released: the files are emptied and stay, inode and all, for the next attempt (a new
        // inode per file per job costs ever more in ext4's allocator).
        use std::os::unix::fs::MetadataExt;
        let inodes = |dirs: &AttemptDirs| {
            [&dirs.config, &dirs.metrics, &dirs.log].map(|file| std::fs::metadata(file).unwrap().ino())
        };
        let before = inodes(&dirs);
        std::fs::write(&dirs.log, b"output\n").unwrap();
        dirs.clear().unwrap();
        for file in [&dirs.config, &dirs.metrics, &dirs.log] {
            assert_eq!(std::fs::metadata(file).unwrap().len(), 0, "{} is emptied", file.display());
        }
        assert!(dirs.cwd.is_dir() && dirs.output.is_dir(), "the directories stay for the next attempt");
        drop(dirs.prepare(&job, false).await.unwrap());
        assert_eq!(inodes(&dirs), before, "the next attempt writes into the same files");
        assert_eq!(std::fs::read_to_string(&dirs.config).unwrap(), "{\"lr\":0.1}\n");
    }

    #[tokio::test]
    async fn a_job_s_symlink_directory_or_hard_link_in_place_of_a_slot_file_is_replaced_never_written_through() {
        let job = claimed();
        let work = tempfile::tempdir().unwrap();
        let outside = work.path().join("precious.txt");
        std::fs::write(&outside, "keep me, I am long enough to be cut").unwrap();
        let dirs = AttemptDirs::for_slot(work.path(), 0);
        drop(dirs.prepare(&job, false).await.unwrap());
        // What a job could leave behind: its config and log swapped for links to a file of the
        // worker's user, its metrics file for a directory.
        for file in [&dirs.config, &dirs.log] {
            std::fs::remove_file(file).unwrap();
            std::os::unix::fs::symlink(&outside, file).unwrap();
        }
        std::fs::remove_file(&dirs.metrics).unwrap();
        std::fs::create_dir_all(dirs.metrics.join("inside")).unwrap();
        dirs.clear().unwrap();
        let mut log = dirs.prepare(&job, false).await.unwrap();
        std::io::Write::write_all(&mut log, b"new\n").unwrap();
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep me, I am long enough to be cut");
        for file in [&dirs.config, &dirs.metrics, &dirs.log] {
            assert!(std::fs::symlink_metadata(file).unwrap().is_file(), "{} is a plain file again", file.display());
        }
        assert_eq!(std::fs::read_to_string(&dirs.config).unwrap(), "{\"lr\":0.1}\n");
        assert_eq!(std::fs::read_to_string(&dirs.metrics).unwrap(), "");
        assert_eq!(std::fs::read_to_string(&dirs.log).unwrap(), "new\n");
        drop(log);
        // A job that kept its log under a second name (a hard link) keeps it as it was.
        let kept = work.path().join("kept.log");
        std::fs::hard_link(&dirs.log, &kept).unwrap();
        dirs.clear().unwrap();
        drop(dirs.prepare(&job, false).await.unwrap());
        assert_eq!(std::fs::read_to_string(&kept).unwrap(), "new\n");
        assert_eq!(std::fs::read_to_string(&dirs.log).unwrap(), "");
        // A FIFO in a file's place (opening it for writing would wait for a reader forever)
        // is replaced at once.
        std::fs::remove_file(&dirs.metrics).unwrap();
        nix::unistd::mkfifo(&dirs.metrics, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let cleared = tokio::task::spawn_blocking({
            let dirs = dirs.clone();
            move || dirs.clear()
        });
        tokio::time::timeout(Duration::from_secs(10), cleared).await.expect("not stuck on the FIFO").unwrap().unwrap();
        assert!(std::fs::symlink_metadata(&dirs.metrics).unwrap().is_file());
    }

    #[tokio::test]
    async fn a_metrics_file_the_last_attempt_wrote_is_made_new_so_a_stray_writer_cannot_reach_the_next() {
        use std::os::unix::fs::MetadataExt;
        let job = claimed();
        let work = tempfile::tempdir().unwrap();
        let dirs = AttemptDirs::for_slot(work.path(), 0);
        drop(dirs.prepare(&job, false).await.unwrap());
        let unwritten = std::fs::metadata(&dirs.metrics).unwrap().ino();
        dirs.clear().unwrap();
        drop(dirs.prepare(&job, false).await.unwrap());
        assert_eq!(std::fs::metadata(&dirs.metrics).unwrap().ino(), unwritten, "an unwritten one is kept");
        // A process that outlived the job still holds the file open.
        let mut stray = std::fs::OpenOptions::new().append(true).open(&dirs.metrics).unwrap();
        std::io::Write::write_all(&mut stray, b"{\"loss\": 1}\n").unwrap();
        dirs.clear().unwrap();
        drop(dirs.prepare(&job, false).await.unwrap());
        std::io::Write::write_all(&mut stray, b"{\"loss\": 2}\n").unwrap();
        assert_eq!(std::fs::read_to_string(&dirs.metrics).unwrap(), "", "the next attempt's file is its own");
        assert_ne!(std::fs::metadata(&dirs.metrics).unwrap().ino(), unwritten);
    }
}
