//! Jobs run as another user (`run_as` in the worker's config): the strong form of keeping the
//! worker's credentials from its jobs, as labs run it. The worker runs as root; each job's
//! processes get the user's uid and gid (and no supplementary groups), its `HOME`, `USER` and
//! `LOGNAME`, and own only what the job writes: its working copy, outputs, checkpoint
//! directory, metrics file and the setup mark. The attempt's root, its log and everything the
//! worker reads back by path stay the worker's, so a job cannot swap them for links.

use crate::executor::AttemptDirs;
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
    /// code copy, a restored checkpoint), and lets it read its config files. A working copy that
    /// is an overlay of a tree the user owns already (`code_overlay`) is given its top only: a
    /// change of owner would copy every file up into the overlay.
    pub fn hand_over(&self, dirs: &AttemptDirs, code_overlay: bool) -> std::io::Result<()> {
        let (uid, gid) = (self.uid.as_raw(), self.gid.as_raw());
        for dir in [&dirs.output, &dirs.checkpoint, &dirs.state] {
            own_tree(dir, uid, gid)?;
        }
        match code_overlay {
            true => std::os::unix::fs::lchown(&dirs.cwd, Some(uid), Some(gid))?,
            false => own_tree(&dirs.cwd, uid, gid)?,
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
/// to).
pub fn own_tree(path: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    for entry in walkdir::WalkDir::new(path).follow_links(false) {
        let entry = entry.map_err(std::io::Error::other)?;
        std::os::unix::fs::lchown(entry.path(), Some(uid), Some(gid))?;
    }
    Ok(())
}
