//! An attempt's private, writable view of a cached snapshot tree, at a cost that does not grow
//! with the project where the machine allows it.
//!
//! - **overlay**: the tree is the read-only lower layer of an overlayfs mounted on the
//!   attempt's `work/`; the attempt's writes go to an upper directory of its slot and are
//!   thrown away with it. One `mount` per attempt (about a millisecond, whatever the size).
//!   Needs the right to mount (root, `CAP_SYS_ADMIN`); the worker probes it at start.
//! - **copy**: the tree is copied file by file (`copy_file_range`, so in the kernel), links as
//!   links. Costs what the project weighs, but no decompression or digest per attempt.
//!
//! Neither lets a job reach the cache: overlayfs never writes its lower layer, a copy shares
//! nothing. (Hard links would cost little too, but a job running as the worker's user, or as
//! root, can write through one into the cache whatever its mode says: not offered. Reflinks
//! need btrfs or XFS, which the machines this was measured on do not have: not offered yet.)
//! An overlay that fails at run time falls back to a copy for that attempt, with one warning.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// What the worker's configuration asks for (`code_copy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CodeCopy {
    /// The cheapest that works here.
    #[default]
    Auto,
    Overlay,
    Copy,
}

impl std::str::FromStr for CodeCopy {
    type Err = String;
    fn from_str(text: &str) -> Result<CodeCopy, String> {
        match text {
            "auto" => Ok(CodeCopy::Auto),
            "overlay" => Ok(CodeCopy::Overlay),
            "copy" => Ok(CodeCopy::Copy),
            other => Err(format!("`code_copy` is auto, overlay or copy, not `{other}`")),
        }
    }
}

/// How attempts get their copies on this worker.
#[derive(Debug)]
pub struct Copier {
    overlay: bool,
    /// Said once: an overlay failed and attempts fell back to copies.
    warned: AtomicBool,
}

/// One attempt's copy, to be taken down when the attempt's slot is released.
#[derive(Debug)]
pub enum LaidOut {
    /// Mounted on `at`, with its upper and work directories under `scratch`.
    Overlay {
        at: PathBuf,
        scratch: PathBuf,
    },
    Copied,
}

impl Copier {
    /// Probes what works under `work_dir` (an overlay mounted and taken down there), as
    /// `wanted` allows; removes overlays a killed worker left mounted under it.
    pub fn start(work_dir: &Path, wanted: CodeCopy) -> Copier {
        take_down_stale(work_dir);
        let overlay = match wanted {
            CodeCopy::Copy => false,
            CodeCopy::Auto | CodeCopy::Overlay => match probe_overlay(work_dir) {
                Ok(()) => true,
                Err(error) => {
                    if wanted == CodeCopy::Overlay {
                        tracing::warn!(%error, "code_copy = \"overlay\", but overlays cannot be mounted here: attempts get copies");
                    }
                    false
                }
            },
        };
        Copier { overlay, warned: AtomicBool::new(false) }
    }

    /// The mechanism, for the start-up log and `app workers`.
    pub fn describe(&self) -> &'static str {
        match self.overlay && !self.warned.load(Ordering::Relaxed) {
            true => "overlay",
            false => "copy",
        }
    }

    /// Makes `cwd` (an empty directory) a private, writable view of `tree`; `scratch` is a
    /// directory of the attempt's slot the overlay may keep its layers in.
    pub fn lay_out(&self, tree: &Path, cwd: &Path, scratch: &Path) -> std::io::Result<LaidOut> {
        if self.overlay {
            match mount_overlay(tree, cwd, scratch) {
                Ok(()) => return Ok(LaidOut::Overlay { at: cwd.to_path_buf(), scratch: scratch.to_path_buf() }),
                Err(error) => {
                    if !self.warned.swap(true, Ordering::Relaxed) {
                        tracing::warn!(%error, cwd = %cwd.display(), "mounting an attempt's code overlay failed; copying instead");
                    }
                }
            }
        }
        copy_tree(tree, cwd)?;
        Ok(LaidOut::Copied)
    }
}

impl LaidOut {
    /// Unmounts an overlay and removes its layers; a copy goes with the slot's directories.
    pub fn take_down(&self) {
        if let LaidOut::Overlay { at, scratch } = self {
            if let Err(error) = nix::mount::umount2(at.as_path(), nix::mount::MntFlags::MNT_DETACH) {
                tracing::warn!(%error, path = %at.display(), "unmounting an attempt's code overlay");
            }
            let _ = std::fs::remove_dir_all(scratch);
        }
    }

    pub fn is_overlay(&self) -> bool {
        matches!(self, LaidOut::Overlay { .. })
    }
}

fn mount_overlay(lower: &Path, at: &Path, scratch: &Path) -> std::io::Result<()> {
    let (upper, work) = (scratch.join("upper"), scratch.join("work"));
    if scratch.exists() {
        std::fs::remove_dir_all(scratch)?;
    }
    std::fs::create_dir_all(&upper)?;
    std::fs::create_dir_all(&work)?;
    let options = format!("lowerdir={},upperdir={},workdir={}", escaped(lower)?, escaped(&upper)?, escaped(&work)?);
    nix::mount::mount(Some("app-code"), at, Some("overlay"), nix::mount::MsFlags::empty(), Some(options.as_str()))?;
    Ok(())
}

/// A path as overlayfs options take it: `,` and `:` (separators there) and `\` escaped.
fn escaped(path: &Path) -> std::io::Result<String> {
    let text = path.to_str().ok_or_else(|| std::io::Error::other("a path that is not UTF-8"))?;
    Ok(text.replace('\\', "\\\\").replace(',', "\\,").replace(':', "\\:"))
}

/// Mounts and takes down an overlay in a scratch directory of `work_dir`.
fn probe_overlay(work_dir: &Path) -> std::io::Result<()> {
    let probe = work_dir.join(".overlay-probe");
    let _ = std::fs::remove_dir_all(&probe);
    let (lower, at, scratch) = (probe.join("lower"), probe.join("at"), probe.join("scratch"));
    std::fs::create_dir_all(&lower)?;
    std::fs::create_dir_all(&at)?;
    std::fs::write(lower.join("probe"), "lower")?;
    let mounted = mount_overlay(&lower, &at, &scratch);
    let seen = mounted.as_ref().ok().map(|()| std::fs::read_to_string(at.join("probe")));
    if mounted.is_ok() {
        let _ = nix::mount::umount2(at.as_path(), nix::mount::MntFlags::MNT_DETACH);
    }
    let _ = std::fs::remove_dir_all(&probe);
    mounted?;
    match seen {
        Some(Ok(text)) if text == "lower" => Ok(()),
        _ => Err(std::io::Error::other("the overlay did not show its lower layer")),
    }
}

/// Unmounts the overlays a killed worker left under `work_dir` (read from this process's
/// mount table).
fn take_down_stale(work_dir: &Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else { return };
    for line in mounts.lines() {
        let Some((before, after)) = line.split_once(" - ") else { continue };
        // Only ours: an overlay whose source is `app-code`, never another mount of the box.
        let mut fields = after.split_whitespace();
        if fields.next() != Some("overlay") || fields.next() != Some("app-code") {
            continue;
        }
        let Some(point) = before.split_whitespace().nth(4) else { continue };
        let point = PathBuf::from(point.replace("\\040", " "));
        if point.starts_with(work_dir) {
            match nix::mount::umount2(point.as_path(), nix::mount::MntFlags::MNT_DETACH) {
                Ok(()) => tracing::info!(path = %point.display(), "unmounted a code overlay a killed worker left"),
                Err(error) => {
                    tracing::warn!(%error, path = %point.display(), "unmounting a code overlay a killed worker left")
                }
            }
        }
    }
}

/// Copies the tree at `from` into the directory `to`: directories, files (modes kept) and
/// links (as links).
pub fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    for entry in walkdir::WalkDir::new(from).min_depth(1).follow_links(false) {
        let entry = entry.map_err(std::io::Error::other)?;
        let relative = entry.path().strip_prefix(from).map_err(std::io::Error::other)?;
        let target = to.join(relative);
        let kind = entry.file_type();
        if kind.is_dir() {
            std::fs::create_dir_all(&target)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}
