//! Uploads an attempt's output directory as its versioned result: every regular file streamed
//! with its SHA-256, then a manifest that seals them. Symlinks are followed only when they stay
//! inside the output directory.

use crate::shipper::ShipError;
use client::Client;
use sha2::{Digest, Sha256};
use shared::api::{InlineFile, JobAttempt, ManifestEntry, WorkerId};
use std::io::Read;
use std::path::{Path, PathBuf};

/// A file to upload: where it is, and what the manifest says of it.
#[derive(Debug, Clone)]
pub struct OutputFile {
    pub source: PathBuf,
    pub entry: ManifestEntry,
}

/// Walks the output directory. Returns the files in path order and a note for each thing
/// skipped (a symlink leading outside, a special file).
/// `output` must be absolute and free of symlinks (the worker's work directory is made so at
/// start-up), so that a link's target can be checked against it.
pub fn collect(output: &Path) -> std::io::Result<(Vec<OutputFile>, Vec<String>)> {
    let root = output.to_path_buf();
    let mut files = Vec::new();
    let mut skipped = Vec::new();
    for entry in walkdir::WalkDir::new(&root).follow_links(false).sort_by_file_name() {
        let entry = entry.map_err(std::io::Error::other)?;
        let relative = entry.path().strip_prefix(&root).map_err(std::io::Error::other)?;
        let relative_text = relative.to_string_lossy().replace('\\', "/");
        let kind = entry.file_type();
        let source = if kind.is_file() {
            entry.path().to_path_buf()
        } else if kind.is_symlink() {
            match entry.path().canonicalize() {
                Ok(target) if target.starts_with(&root) && target.is_file() => target,
                Ok(target) => {
                    skipped.push(format!(
                        "{relative_text} -> {} (outside the output directory, or not a file)",
                        target.display()
                    ));
                    continue;
                }
                Err(_) => {
                    skipped.push(format!("{relative_text} (a dangling symlink)"));
                    continue;
                }
            }
        } else {
            if !kind.is_dir() {
                skipped.push(format!("{relative_text} (not a regular file)"));
            }
            continue;
        };
        let (size, sha256) = hash_file(&source)?;
        files.push(OutputFile { source, entry: ManifestEntry { path: relative_text, size, sha256 } });
    }
    Ok((files, skipped))
}

fn hash_file(path: &Path) -> std::io::Result<(u64, String)> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 256 * 1024];
    let mut size = 0u64;
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
        size += read as u64;
    }
    let digest = hasher.finalize();
    Ok((size, digest.iter().map(|byte| format!("{byte:02x}")).collect()))
}

/// The files as inline files of a finish request (read whole: callers keep this for small
/// outputs, see `shared::api::MAX_INLINE_BYTES`). A file that vanished is left out.
/// Read with the file identity `reader` (a `run_as` user's), see `run_as`.
pub async fn read_inline(files: &[OutputFile], reader: Option<(u32, u32)>) -> Vec<InlineFile> {
    if files.is_empty() {
        return Vec::new();
    }
    let files = files.to_vec();
    let read = move || {
        let mut inline = Vec::with_capacity(files.len());
        for file in files {
            match std::fs::read(&file.source) {
                Ok(data) => {
                    let sha256 = hex_digest(&data);
                    inline.push(InlineFile { path: file.entry.path.clone(), sha256, data });
                }
                Err(error) => {
                    tracing::warn!(path = %file.source.display(), %error, "an output file could not be read; left out")
                }
            }
        }
        inline
    };
    tokio::task::spawn_blocking(move || crate::run_as::with_file_identity(reader, read)).await.unwrap_or_default()
}

fn hex_digest(data: &[u8]) -> String {
    Sha256::digest(data).iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Uploads the files one by one (streamed) into the attempt's staging; returns what the server
/// stored of each, for the finish request to seal. A 409 means the attempt is stale.
pub async fn upload_streamed(
    client: &Client,
    worker_id: WorkerId,
    (attempt, reader): (JobAttempt, Option<(u32, u32)>),
    files: &[OutputFile],
) -> Result<Vec<ManifestEntry>, ShipError> {
    let mut manifest = Vec::with_capacity(files.len());
    for file in files {
        // Opened with the file identity `reader` (a `run_as` user's), see `run_as`.
        let source = file.source.clone();
        let opened = tokio::task::spawn_blocking(move || {
            crate::run_as::with_file_identity(reader, || std::fs::File::open(source))
        })
        .await;
        let Ok(Ok(handle)) = opened.map(|opened| opened.map(tokio::fs::File::from_std)) else {
            tracing::warn!(path = %file.source.display(), "an output file vanished before its upload; left out");
            continue;
        };
        let uploaded = client.upload_file(attempt.job_id, attempt.attempt, &file.entry.path, worker_id, handle).await;
        let stored = match uploaded {
            Ok(stored) => stored,
            // The server refuses this one file (its name, its size): keep the others.
            Err(error) if matches!(error.status(), Some(400 | 413)) => {
                tracing::warn!(path = %file.entry.path, %error, "output file refused by the server; left out");
                continue;
            }
            Err(error) => return Err(classify_upload(error)),
        };
        // What the server received is what the version holds; a file the job was still writing
        // when it was hashed here is taken as uploaded rather than retried forever.
        if stored.sha256 != file.entry.sha256 {
            tracing::warn!(path = %file.entry.path, "an output file changed while it was uploaded; storing what was sent");
        }
        manifest.push(stored);
    }
    Ok(manifest)
}

fn classify_upload(error: client::ClientError) -> ShipError {
    match error.status() {
        Some(401 | 404 | 409) => ShipError::Lost(error.to_string()),
        // A 4xx other than those (bad path, too large) will not get better by retrying.
        Some(status) if (400..500).contains(&status) => ShipError::Lost(error.to_string()),
        _ => ShipError::Retry(error),
    }
}

/// Whether `dir` or one of its parents holds a `.git` (a working tree or a worktree file).
pub fn inside_git_tree(dir: &Path) -> bool {
    let Ok(dir) = dir.canonicalize() else { return false };
    dir.ancestors().any(|ancestor| ancestor.join(".git").exists())
}

/// The commit checked out around `dir`, if it is inside a git working tree.
pub async fn git_commit(dir: &Path) -> Option<String> {
    let output = tokio::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["rev-parse", "HEAD"])
        // Not the worker's credentials: a job may read a same-user process's environment.
        .env_clear()
        .envs(crate::job_env::inherited_environment())
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .await
        .ok()?;
    let commit = String::from_utf8_lossy(&output.stdout).trim().to_string();
    (output.status.success() && !commit.is_empty()).then_some(commit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collects_files_with_hashes_and_skips_links_leading_outside() {
        let dir = tempfile::tempdir().unwrap();
        let output = dir.path().join("output");
        std::fs::create_dir_all(output.join("sub")).unwrap();
        std::fs::write(output.join("a.txt"), b"hello").unwrap();
        std::fs::write(output.join("sub/b.bin"), vec![7u8; 1000]).unwrap();
        std::fs::write(dir.path().join("secret"), b"outside").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), output.join("leak")).unwrap();
        std::os::unix::fs::symlink(output.join("a.txt"), output.join("alias")).unwrap();
        let (files, skipped) = collect(&output).unwrap();
        let paths: Vec<&str> = files.iter().map(|file| file.entry.path.as_str()).collect();
        assert_eq!(paths, ["a.txt", "alias", "sub/b.bin"]);
        assert_eq!(files[0].entry.size, 5);
        assert_eq!(files[0].entry.sha256, "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824");
        assert_eq!(skipped.len(), 1);
        assert!(skipped[0].starts_with("leak"), "{skipped:?}");
    }
}
