//! Code shipping for `app submit`: the project around the sweep file is packed into a snapshot
//! (see `archive`), uploaded unless the server holds it already, and named in the submission
//! with the git commit and state it came from, so every worker runs exactly that code.
//!
//! The snapshot's digest is computed first, without compressing anything: resubmitting
//! unchanged code costs reading and hashing its files and one small request. The job starts in
//! the directory `app submit` ran in, inside the snapshot (like pueue and task-spooler, which
//! run where you submitted), or in the sweep file's directory when `app submit` ran elsewhere.

pub mod left_out;
pub mod project;

use anyhow::Context;
use client::Client;
use project::Project;
use shared::api::CodeSnapshot;
use std::path::{Path, PathBuf};

/// Files named by the message that refuses a project over the cap.
const LARGEST_SHOWN: usize = 5;

/// What was shipped.
#[derive(Debug, Clone)]
pub struct Shipped {
    pub root: PathBuf,
    pub files: u64,
    pub bytes: u64,
    pub snapshot: CodeSnapshot,
    /// Compressed bytes uploaded, or `None`: the server had it.
    pub uploaded: Option<u64>,
    /// What the snapshot left out that the user did not name.
    pub left_out: left_out::LeftOut,
}

impl Shipped {
    /// One line for the terminal.
    pub fn describe(&self) -> String {
        let at = match &self.snapshot.commit {
            Some(commit) => {
                format!(" at {}{}", &commit[..commit.len().min(12)], if self.snapshot.dirty { " (dirty)" } else { "" })
            }
            None if self.snapshot.dirty => " (not committed)".to_string(),
            None => String::new(),
        };
        let sent = match self.uploaded {
            Some(bytes) => format!("uploaded {}", super::format::bytes(bytes)),
            None => "already on the server".to_string(),
        };
        format!(
            "code: {} files, {} from {}{at}: snapshot {} {sent}",
            self.files,
            super::format::bytes(self.bytes),
            self.root.display(),
            &self.snapshot.digest[..12]
        )
    }
}

/// Refuses a project over `cap`, naming its largest files.
pub fn check_cap(project: &Project, cap: u64) -> anyhow::Result<()> {
    let total = project.bytes();
    if total <= cap {
        return Ok(());
    }
    let largest: Vec<String> = project::largest(project, LARGEST_SHOWN)
        .iter()
        .map(|(path, size)| format!("{} ({})", path.display(), super::format::bytes(*size)))
        .collect();
    anyhow::bail!(
        "the code in {} is {}, over the {} cap of a code snapshot (--max-code-size); largest: {}; list what the jobs \
         do not need in {}, raise the cap, or pass --no-code",
        project.root.display(),
        super::format::bytes(total),
        super::format::bytes(cap),
        largest.join(", "),
        project::APPIGNORE
    )
}

/// Lists the project of `sweep_file` (leaving out `given`, the client's own files), checks it
/// against `cap`.
pub async fn survey(sweep_file: &Path, cap: u64, given: &[PathBuf]) -> anyhow::Result<Project> {
    let (file, given) = (sweep_file.to_path_buf(), given.to_vec());
    let project = tokio::task::spawn_blocking(move || project::find(&file, &given)).await??;
    check_cap(&project, cap)?;
    Ok(project)
}

/// Packs and uploads the project of `sweep_file` unless the server has it.
pub async fn ship(client: &Client, sweep_file: &Path, cap: u64, given: &[PathBuf]) -> anyhow::Result<Shipped> {
    let project = survey(sweep_file, cap, given).await?;
    let (root, paths) = (project.root.clone(), project.paths());
    let packed = tokio::task::spawn_blocking(move || archive::digest_of(&root, &paths))
        .await?
        .with_context(|| format!("reading the code in {}", project.root.display()))?;
    for skipped in &packed.skipped {
        // Deleted files git still lists, and submodules never checked out, are simply absent.
        if skipped.why != "it vanished" && skipped.why != "a directory" {
            eprintln!("warning: not shipped: {} ({})", skipped.path.display(), skipped.why);
        }
    }
    let mut digest = packed.digest.clone();
    let uploaded = match client.code_info(&digest).await {
        Ok(_) => None,
        Err(error) if error.status() == Some(404) => {
            let info = upload(client, &project).await?;
            digest = info.digest;
            Some(info.packed_bytes)
        }
        Err(error) => return Err(error).context("asking the server for the code snapshot"),
    };
    let snapshot = CodeSnapshot {
        digest,
        dir: start_dir(&project.root, sweep_file),
        commit: project.commit.clone(),
        dirty: project.dirty,
    };
    Ok(Shipped {
        root: project.root.clone(),
        files: packed.entries,
        bytes: packed.content_bytes,
        snapshot,
        uploaded,
        left_out: project.left_out.clone(),
    })
}

/// Packs the project into a temporary file and uploads it; the server names it.
async fn upload(client: &Client, project: &Project) -> anyhow::Result<shared::api::CodeInfo> {
    let (root, paths) = (project.root.clone(), project.paths());
    let file = tokio::task::spawn_blocking(move || -> std::io::Result<std::fs::File> {
        let (_, file) = archive::pack_to(&root, &paths, tempfile::tempfile()?)?;
        Ok(file)
    })
    .await?
    .with_context(|| format!("packing the code in {}", project.root.display()))?;
    let mut file = tokio::fs::File::from_std(file);
    use tokio::io::AsyncSeekExt;
    file.seek(std::io::SeekFrom::Start(0)).await?;
    client.upload_code(file).await.context("uploading the code snapshot")
}

/// Where the jobs start inside the snapshot: the directory `app submit` runs in, when it is
/// inside the project, else the sweep file's directory; `/`-separated, empty for the root.
pub fn start_dir(root: &Path, sweep_file: &Path) -> String {
    let here = std::env::current_dir().and_then(|dir| dir.canonicalize()).ok();
    let beside_file = sweep_file.canonicalize().ok().and_then(|file| file.parent().map(Path::to_path_buf));
    let inside = |dir: Option<PathBuf>| dir.and_then(|dir| dir.strip_prefix(root).ok().map(Path::to_path_buf));
    let relative = inside(here).or_else(|| inside(beside_file)).unwrap_or_default();
    relative.components().map(|part| part.as_os_str().to_string_lossy().into_owned()).collect::<Vec<_>>().join("/")
}
