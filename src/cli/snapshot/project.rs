//! What `app submit` ships: the project around a sweep file and the files it holds.
//!
//! The project's root is the git work tree holding the sweep file, else the sweep file's own
//! directory. In a work tree the files are git's own list, tracked plus untracked-not-ignored
//! (`git ls-files -co --exclude-standard`, submodules listed the same way inside them), so the
//! snapshot is what `git status` shows, never the ignored build outputs and data; outside git,
//! every file under the root (without descending into `.git`). Either way, app's own state is
//! left out (a server's data directory, a worker's work directory, the client's token and
//! config files), and outside git so are generated outputs (see `left_out`); patterns in the
//! root's `.appignore` (gitignore syntax) leave more out (or, with `!`, put generated outputs
//! back); symlinks are never followed: a link leading out of the root is left out with a
//! warning (see `archive::links`).

use super::left_out::{self, LeftOut};
use anyhow::Context;
use ignore::gitignore::Gitignore;
use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The name of the file of patterns the snapshot leaves out.
pub const APPIGNORE: &str = ".appignore";
/// A project walked without git stops here: a sweep file in a home directory or a data disk
/// would otherwise be listed for minutes before the size cap refuses it.
const MAX_WALKED_ENTRIES: usize = 200_000;

/// A project about to be packed.
#[derive(Debug, Clone)]
pub struct Project {
    /// Absolute, without symlinks.
    pub root: PathBuf,
    /// `HEAD` of the work tree, when it has a commit.
    pub commit: Option<String>,
    /// The work tree differs from `commit` (changed, deleted or untracked files).
    pub dirty: bool,
    /// Files and links to pack, relative to `root`, with their sizes (links count 0).
    pub files: Vec<(PathBuf, u64)>,
    /// What was left out that the user did not name (app's state, generated outputs).
    pub left_out: LeftOut,
}

impl Project {
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|(_, size)| size).sum()
    }

    pub fn paths(&self) -> Vec<PathBuf> {
        self.files.iter().map(|(path, _)| path.clone()).collect()
    }
}

/// Finds the project of `sweep_file` and lists what it ships; `given` are the files the client
/// was handed (its token file), left out wherever they are.
pub fn find(sweep_file: &Path, given: &[PathBuf]) -> anyhow::Result<Project> {
    let file = sweep_file.canonicalize().with_context(|| format!("resolving {}", sweep_file.display()))?;
    let dir = file.parent().unwrap_or(Path::new("/")).to_path_buf();
    std::fs::read_dir(&dir).with_context(|| {
        format!(
            "cannot read {}, the sweep file's directory, to pack its code (pass --no-code to ship none)",
            dir.display()
        )
    })?;
    let git_root = git_root(&dir);
    let root = git_root.clone().unwrap_or(dir);
    if root == Path::new("/") {
        anyhow::bail!(
            "refusing to pack / as the project's code: keep the sweep file in its project, or pass --no-code"
        );
    }
    if let Some(what) = left_out::app_state(&root) {
        anyhow::bail!(
            "{} holds {what}, not a project's code: keep the sweep file in your project's directory, or pass --no-code",
            root.display()
        );
    }
    let user = appignore(&root);
    let mut left_out = LeftOut::default();
    let listed = match git_root {
        Some(_) => leave_out_state(&root, list_git(&root, Path::new(""))?, &mut left_out),
        None => list_walking(&root, &user, &mut left_out)?,
    };
    let mut given: Vec<PathBuf> = given.iter().filter_map(|path| path.canonicalize().ok()).collect();
    given.extend(left_out::client_files());
    // App configs in the project, and the secret files they name.
    let mut configs = Vec::new();
    for path in listed.iter().filter(|path| path.extension().is_some_and(|extension| extension == "toml")) {
        if let Some(named) = left_out::app_config(&root.join(path)) {
            configs.push(path.clone());
            given.extend(named.iter().filter_map(|file| file.canonicalize().ok()));
        }
    }
    let mut files = Vec::with_capacity(listed.len());
    for path in listed {
        if user.matched_path_or_any_parents(&path, false).is_ignore() {
            continue;
        }
        let full = root.join(&path);
        if given.contains(&full) {
            left_out.add(&path, false, "app's token or config");
            continue;
        }
        if configs.contains(&path) {
            left_out.add(&path, false, "app's config");
            continue;
        }
        let size = std::fs::symlink_metadata(&full).map(|metadata| if metadata.is_file() { metadata.len() } else { 0 });
        let size = size.unwrap_or(0);
        let put_back = || user.matched_path_or_any_parents(&path, false).is_whitelist();
        if git_root.is_none() && left_out::large_weights(&path, size) && !put_back() {
            left_out.add(&path, false, format!("{} of weights", crate::cli::format::bytes(size)));
            continue;
        }
        files.push((path, size));
    }
    let (commit, dirty) = if git_root.is_some() { git_state(&root) } else { (None, false) };
    Ok(Project { root, commit, dirty, files, left_out })
}

/// `listed` without what lies in app's own state directories (each said once in `left_out`).
fn leave_out_state(root: &Path, listed: Vec<PathBuf>, left_out: &mut LeftOut) -> Vec<PathBuf> {
    let mut state: HashMap<PathBuf, Option<&'static str>> = HashMap::new();
    let mut kept = Vec::with_capacity(listed.len());
    'files: for path in listed {
        // From the top down, so that the outermost state directory is the one named.
        let ancestors: Vec<&Path> = path.ancestors().skip(1).filter(|dir| !dir.as_os_str().is_empty()).collect();
        for dir in ancestors.into_iter().rev() {
            let known = state.contains_key(dir);
            let what = *state.entry(dir.to_path_buf()).or_insert_with(|| left_out::app_state(&root.join(dir)));
            if let Some(what) = what {
                if !known {
                    left_out.add(dir, true, what);
                }
                continue 'files;
            }
        }
        kept.push(path);
    }
    kept
}

/// The root's `.appignore`, as a matcher of paths relative to the root.
fn appignore(root: &Path) -> Gitignore {
    let (matcher, error) = Gitignore::new(root.join(APPIGNORE));
    if let Some(error) = error.filter(|_| root.join(APPIGNORE).exists()) {
        eprintln!("warning: {APPIGNORE}: {error}");
    }
    matcher
}

/// [`left_out::GENERATED`] followed by the root's `.appignore`: a `!pattern` of the user's puts
/// a generated directory back.
fn generated_then_user(root: &Path) -> Gitignore {
    let mut builder = ignore::gitignore::GitignoreBuilder::new(root);
    for (pattern, _) in left_out::GENERATED {
        let _ = builder.add_line(None, pattern);
    }
    let _ = builder.add(root.join(APPIGNORE));
    builder.build().unwrap_or_else(|_| Gitignore::empty())
}

/// Git's list of the work tree at `root/prefix`: tracked and untracked-not-ignored files,
/// the files of its submodules in turn.
fn list_git(root: &Path, prefix: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let dir = root.join(prefix);
    let output = Command::new("git")
        .arg("-C")
        .arg(&dir)
        .args(["ls-files", "-z", "--cached", "--others", "--exclude-standard"])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("listing the files of {} with git", dir.display()))?;
    if !output.status.success() {
        let error = String::from_utf8_lossy(&output.stderr);
        anyhow::bail!("git could not list the files of {}: {}", dir.display(), error.trim());
    }
    let mut files = Vec::new();
    for name in output.stdout.split(|byte| *byte == 0).filter(|name| !name.is_empty()) {
        let path = prefix.join(std::ffi::OsStr::from_bytes(name));
        let full = root.join(&path);
        // A submodule is listed as its directory: its own files go in instead.
        let is_dir = std::fs::symlink_metadata(&full).is_ok_and(|metadata| metadata.is_dir());
        if is_dir {
            if full.join(".git").exists() {
                files.extend(list_git(root, &path)?);
            }
            continue;
        }
        files.push(path);
    }
    files.sort();
    files.dedup();
    Ok(files)
}

/// Every file under `root` (links not followed; `.git`, app's state, generated outputs and
/// what `.appignore` names not entered).
fn list_walking(root: &Path, user: &Gitignore, left_out: &mut LeftOut) -> anyhow::Result<Vec<PathBuf>> {
    let generated = generated_then_user(root);
    let mut files = Vec::new();
    let mut walk = walkdir::WalkDir::new(root).follow_links(false).min_depth(1).sort_by_file_name().into_iter();
    loop {
        let entry = match walk.next() {
            None => break,
            Some(Ok(entry)) => entry,
            Some(Err(error)) => {
                // An unreadable directory is left out, as an unreadable file is.
                let path = error.path().map(|path| path.display().to_string()).unwrap_or_default();
                eprintln!("warning: not shipped: {path} ({error})");
                continue;
            }
        };
        let relative = entry.path().strip_prefix(root).context("walking the project")?.to_path_buf();
        if entry.file_type().is_dir() {
            let skipped = if entry.file_name() == ".git" || user.matched(&relative, true).is_ignore() {
                Some(None)
            } else if let Some(what) = left_out::app_state(entry.path()) {
                Some(Some(what.to_string()))
            } else if let ignore::Match::Ignore(glob) = generated.matched(&relative, true) {
                let what = left_out::GENERATED.iter().find(|(pattern, _)| *pattern == glob.original());
                Some(Some(what.map_or("generated", |(_, what)| *what).to_string()))
            } else if left_out::virtual_environment(entry.path()) && !user.matched(&relative, true).is_whitelist() {
                Some(Some("a virtual environment".to_string()))
            } else {
                None
            };
            if let Some(why) = skipped {
                if let Some(why) = why {
                    left_out.add(&relative, true, why);
                }
                walk.skip_current_dir();
            }
            continue;
        }
        if files.len() >= MAX_WALKED_ENTRIES {
            anyhow::bail!(
                "{} holds more than {MAX_WALKED_ENTRIES} files: is it really the project? keep the sweep file in its \
                 project's directory, list what to leave out in {APPIGNORE}, or pass --no-code",
                root.display()
            );
        }
        files.push(relative);
    }
    Ok(files)
}

/// `HEAD` of the work tree, and whether anything differs from it (`git status` lists changes,
/// deletions and untracked files that are not ignored).
fn git_state(root: &Path) -> (Option<String>, bool) {
    let commit = git_text(root, &["rev-parse", "--verify", "--quiet", "HEAD"]);
    let status = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["status", "--porcelain", "-z", "--ignore-submodules=none"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    let dirty = match status {
        Ok(output) if output.status.success() => !output.stdout.is_empty(),
        _ => true,
    };
    (commit, dirty)
}

/// The name of the project's directory (see [`find`] for which one that is), or `None` when
/// the file cannot be resolved or its project is `/`: a sweep file without `name:` is named
/// after it (`myproj/sweep`).
pub fn directory_name(sweep_file: &Path) -> Option<String> {
    let file = sweep_file.canonicalize().ok()?;
    let dir = file.parent()?;
    let root = git_root(dir).unwrap_or_else(|| dir.to_path_buf());
    Some(root.file_name()?.to_string_lossy().into_owned())
}

/// The top of the git work tree holding `dir`, without symlinks.
fn git_root(dir: &Path) -> Option<PathBuf> {
    git_text(dir, &["rev-parse", "--show-toplevel"]).and_then(|top| PathBuf::from(top).canonicalize().ok())
}

/// The trimmed output of a git command in `dir`, when it succeeds.
fn git_text(dir: &Path, args: &[&str]) -> Option<String> {
    let output =
        Command::new("git").arg("-C").arg(dir).args(args).stdin(Stdio::null()).stderr(Stdio::null()).output().ok()?;
    let text = String::from_utf8(output.stdout).ok()?.trim().to_string();
    (output.status.success() && !text.is_empty()).then_some(text)
}

/// The largest files of a project, for the message that refuses it.
pub fn largest(project: &Project, count: usize) -> Vec<(PathBuf, u64)> {
    let mut files = project.files.clone();
    files.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    files.truncate(count);
    files
}
