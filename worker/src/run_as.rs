//! Jobs run as another user (`run_as` in the worker's config): the strong form of keeping the
//! worker's credentials from its jobs, as labs run it. The worker runs as root; each job's
//! processes get the user's uid and gid (and no supplementary groups), its `HOME`, `USER` and
//! `LOGNAME`, and own only what the job writes: its working copy, outputs, checkpoint
//! directory, metrics file and the setup mark.
//!
//! Root must never be tricked into reading or writing through a link the user planted. So the
//! attempt's directories are made afresh by root for each attempt (under the slot, which only
//! root may write), filled by root while they are still root's, and given to the user last,
//! deepest first, so no directory is the user's before everything under it was handed over;
//! the attempt's root, log and config stay root's. What the worker reads back from trees the
//! user can write (outputs, checkpoints) it reads with the user's file identity
//! ([`with_file_identity`]): a link to a file the user may not read is refused to the worker too.

use crate::attempt_dirs::AttemptDirs;
use nix::unistd::{Gid, Uid, User};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub struct RunAs {
    pub name: String,
    pub uid: Uid,
    pub gid: Gid,
    pub home: PathBuf,
}

impl RunAs {
    /// The user `spec` names (a name, or a uid with an entry in the user database). The worker
    /// must be root to hand its jobs to another user.
    pub fn resolve(spec: &str) -> anyhow::Result<RunAs> {
        let spec = spec.trim();
        let user = match spec.parse::<u32>() {
            Ok(uid) => User::from_uid(Uid::from_raw(uid)),
            Err(_) => User::from_name(spec),
        }
        .map_err(|error| anyhow::anyhow!("looking up run_as user `{spec}`: {error}"))?
        .ok_or_else(|| anyhow::anyhow!("run_as: there is no user `{spec}` on this machine"))?;
        anyhow::ensure!(
            Uid::effective().is_root(),
            "run_as = \"{spec}\" needs the worker to run as root (it runs as uid {}), to start jobs as another user",
            Uid::effective()
        );
        anyhow::ensure!(
            !user.uid.is_root(),
            "run_as names root (`{spec}`): jobs would run with the worker's own rights"
        );
        Ok(RunAs { name: user.name, uid: user.uid, gid: user.gid, home: user.dir })
    }

    /// The job's variables naming its user.
    pub fn environment(&self) -> Vec<(String, String)> {
        vec![
            ("HOME".into(), self.home.to_string_lossy().into_owned()),
            ("USER".into(), self.name.clone()),
            ("LOGNAME".into(), self.name.clone()),
        ]
    }

    /// Gives the user what the job writes in `dirs` (and what is inside those directories: the
    /// code copy, a restored checkpoint), and lets it read its config files. The directories
    /// must be the attempt's fresh ones ([`AttemptDirs::prepare`] with `fresh`), still root's.
    pub fn hand_over(&self, dirs: &AttemptDirs) -> std::io::Result<()> {
        let (uid, gid) = (self.uid.as_raw(), self.gid.as_raw());
        for dir in [&dirs.output, &dirs.checkpoint, &dirs.state, &dirs.cwd] {
            own_tree(dir, uid, gid)?;
        }
        for file in [&dirs.metrics, &dirs.config, &dirs.wandb_params] {
            match std::os::unix::fs::lchown(file, Some(self.uid.as_raw()), Some(self.gid.as_raw())) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
                _ => {}
            }
        }
        Ok(())
    }

    /// The uid and gid, raw.
    pub fn ids(&self) -> (u32, u32) {
        (self.uid.as_raw(), self.gid.as_raw())
    }
}

/// Gives `path` and everything under it to `uid`:`gid`, links themselves (never what they point
/// to), deepest first: a directory becomes the user's only once everything in it is, so the user
/// cannot swap an entry for a link before root is done with it.
pub fn own_tree(path: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    for entry in walkdir::WalkDir::new(path).follow_links(false).contents_first(true) {
        let entry = entry.map_err(std::io::Error::other)?;
        std::os::unix::fs::lchown(entry.path(), Some(uid), Some(gid))?;
    }
    Ok(())
}

/// Runs `f` on this thread with the file identity `ids` (uid, gid) when given: every path it
/// opens is checked as that user's, links included, and root's rights over files are set
/// aside meanwhile (the kernel drops them with a non-zero fsuid). For reading trees a job may
/// write; `f` must not yield to other work on the thread.
pub fn with_file_identity<T>(ids: Option<(u32, u32)>, f: impl FnOnce() -> T) -> T {
    let Some((uid, gid)) = ids else { return f() };
    struct Restore(Uid, Gid);
    impl Drop for Restore {
        fn drop(&mut self) {
            nix::unistd::setfsuid(self.0);
            nix::unistd::setfsgid(self.1);
        }
    }
    let previous_gid = nix::unistd::setfsgid(Gid::from_raw(gid));
    let previous_uid = nix::unistd::setfsuid(Uid::from_raw(uid));
    let _restore = Restore(previous_uid, previous_gid);
    f()
}
