//! Code snapshots and the workspace of a sweep's jobs.
//!
//! A snapshot is stored once, as `<data_dir>/code/<digest>.tar.zst`, named by the SHA-256 of
//! its tar stream, which the server computes itself from what it received (so a snapshot on
//! disk is always the one its name says, and a second upload of the same code changes nothing).
//! The file system is the record: a snapshot exists when its file does, and appears complete or
//! not at all (received into `code/.incoming/`, checked, renamed into place). No write unit is
//! involved: nothing in the database changes until a sweep names the snapshot.
//!
//! The workspace (snapshot, `workdir`, `env`, `setup`) is set on the sweep's row with the sweep
//! and never changes, so every claimed job takes it from a cache, like the sweep's name.

use super::{Queue, Tx};
use crate::db;
use crate::error::{ApiError, ApiResult};
use crate::storage::{self, disk_error, ReceiveError};
use futures_util::Stream;
use shared::api::{CodeInfo, CodeSnapshot, SubmitQuery, SweepId, Workspace};
use shared::sweep::{Code, Sweep};
use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

/// The workspace of each sweep seen, by id.
pub(super) type Workspaces = Arc<RwLock<HashMap<SweepId, Arc<Workspace>>>>;

fn check_digest(digest: &str) -> ApiResult<()> {
    if archive::is_digest(digest) {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!(
            "`{}` is not a snapshot digest (64 lower-case hex digits)",
            digest.escape_debug()
        )))
    }
}

fn no_snapshot(digest: &str) -> ApiError {
    ApiError::NotFound(format!("no code snapshot {digest} on the server"))
}

impl Queue {
    fn code_dir(&self) -> PathBuf {
        self.config.data_dir.join("code")
    }

    fn code_path(&self, digest: &str) -> PathBuf {
        self.code_dir().join(format!("{digest}.tar.zst"))
    }

    /// The snapshot named `digest`, if the server holds it.
    pub async fn code_info(&self, digest: &str) -> ApiResult<CodeInfo> {
        check_digest(digest)?;
        match tokio::fs::metadata(self.code_path(digest)).await {
            Ok(metadata) => Ok(CodeInfo { digest: digest.to_string(), packed_bytes: metadata.len() }),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Err(no_snapshot(digest)),
            Err(error) => Err(anyhow::Error::new(error).context(format!("looking up code snapshot {digest}")).into()),
        }
    }

    /// Receives a compressed snapshot, names it by the digest of its tar stream and stores it
    /// (unless the same code is stored already). `declared` is the body's Content-Length.
    pub async fn store_code<S, B, E>(&self, declared: Option<u64>, body: S) -> ApiResult<CodeInfo>
    where
        S: Stream<Item = Result<B, E>> + Unpin,
        B: AsRef<[u8]>,
        E: std::fmt::Display,
    {
        let limit = self.config.max_upload_bytes;
        let too_large =
            || ApiError::PayloadTooLarge(format!("the code snapshot is larger than the upload limit of {limit} bytes"));
        if declared.is_some_and(|length| length > limit) {
            return Err(too_large());
        }
        let _room = storage::ensure_room(&self.layout.incoming(), declared, || "a code snapshot".into())?;
        // Beside the results' uploads, whose leftovers from a crash are removed at start-up.
        let received = storage::receive(&self.layout.incoming(), body, limit).await.map_err(|error| match error {
            ReceiveError::TooLarge(_) => too_large(),
            ReceiveError::Body(reason) => ApiError::BadRequest(format!("the code snapshot upload broke off: {reason}")),
            ReceiveError::Disk(error) => disk_error(error, "storing a code snapshot".into()),
        })?;
        let stored = self.place_code(&received.temp, received.size, limit).await;
        let _ = tokio::fs::remove_file(&received.temp).await;
        let info = stored?;
        tracing::info!(digest = %info.digest, bytes = info.packed_bytes, "code snapshot stored");
        Ok(info)
    }

    /// Checks a received archive and renames it to its digest's name.
    async fn place_code(&self, temp: &std::path::Path, size: u64, limit: u64) -> ApiResult<CodeInfo> {
        let source = temp.to_path_buf();
        let verified = tokio::task::spawn_blocking(move || {
            let file = std::fs::File::open(&source).map_err(archive::UnpackError::Io)?;
            archive::verify(io::BufReader::with_capacity(1 << 20, file), limit)
        })
        .await
        .map_err(|error| anyhow::anyhow!("checking a code snapshot: {error}"))?;
        let digest = match verified {
            Ok(verified) => verified.digest,
            Err(archive::UnpackError::TooLarge { limit }) => {
                return Err(ApiError::PayloadTooLarge(format!("the code snapshot unpacks to more than {limit} bytes")))
            }
            Err(archive::UnpackError::Unsafe(entry)) => {
                return Err(ApiError::BadRequest(format!("the code snapshot was refused, nothing stored: {entry}")))
            }
            Err(error) => {
                return Err(ApiError::BadRequest(format!("the upload is not a zstd-compressed code snapshot: {error}")))
            }
        };
        let target = self.code_path(&digest);
        // The same code again: the stored copy stays as it is.
        if tokio::fs::metadata(&target).await.is_err() {
            let placed = async {
                tokio::fs::create_dir_all(self.code_dir()).await?;
                tokio::fs::rename(temp, &target).await
            };
            placed.await.map_err(|error| disk_error(error, format!("storing code snapshot {digest}")))?;
        }
        Ok(CodeInfo { digest, packed_bytes: size })
    }

    /// The stored archive of snapshot `digest`, opened, and its length.
    pub async fn open_code(&self, digest: &str) -> ApiResult<(tokio::fs::File, u64)> {
        check_digest(digest)?;
        let path = self.code_path(digest);
        let file = tokio::fs::File::open(&path).await.map_err(|error| match error.kind() {
            io::ErrorKind::NotFound => no_snapshot(digest),
            _ => ApiError::Internal(anyhow::Error::new(error).context(format!("opening {}", path.display()))),
        })?;
        let length = file.metadata().await.map_err(anyhow::Error::from)?.len();
        Ok((file, length))
    }

    /// Where and how the jobs of a sweep about to be stored run: its file's `code`, `workdir`,
    /// `env` and `setup`, with the snapshot the submission names (which must be stored).
    pub async fn workspace_for(&self, sweep: &Sweep, query: &SubmitQuery) -> ApiResult<Workspace> {
        let environment = &sweep.environment;
        let ships_code = environment.code == Code::Project && environment.workdir.is_none();
        let code = match query.code.as_deref().filter(|_| ships_code) {
            None => None,
            Some(digest) => {
                self.code_info(digest).await.map_err(|error| match error {
                    ApiError::NotFound(_) => ApiError::BadRequest(format!(
                        "code snapshot {digest} is not on the server: upload it first (POST /api/code; app submit does)"
                    )),
                    other => other,
                })?;
                let dir = query.code_dir.clone().unwrap_or_default();
                if !dir.is_empty() {
                    storage::check_relative_path(&dir)
                        .map_err(|why| ApiError::BadRequest(format!("code_dir: {why}")))?;
                }
                let commit = query.code_commit.clone().filter(|commit| !commit.is_empty());
                Some(CodeSnapshot { digest: digest.to_string(), dir, commit, dirty: query.code_dirty })
            }
        };
        Ok(Workspace {
            code,
            workdir: environment.workdir.clone(),
            env: environment.env.clone(),
            setup: environment.setup.clone(),
            capture_off: environment.capture_off,
            metrics_regex: environment.metrics_regex.clone(),
        })
    }
}

/// Records a new sweep's workspace (in the write unit that inserts the sweep).
pub(super) async fn set_workspace(tx: &mut Tx, sweep_id: SweepId, workspace: &Workspace) -> ApiResult<()> {
    db::code::set_workspace(tx.conn().await?, sweep_id, workspace).await?;
    Ok(())
}

/// The workspace of a sweep's jobs if it is cached.
pub(super) fn cached_workspace(sweep_id: SweepId, cache: &Workspaces) -> Option<Workspace> {
    cache.read().ok().and_then(|cache| cache.get(&sweep_id).map(|known| (**known).clone()))
}

/// The workspace of a sweep's jobs, from the cache or its row.
pub(super) async fn workspace_of(tx: &mut Tx, sweep_id: SweepId, cache: &Workspaces) -> ApiResult<Workspace> {
    if let Some(known) = cached_workspace(sweep_id, cache) {
        return Ok(known);
    }
    let known = Arc::new(db::code::workspace_of(tx.conn().await?, sweep_id).await?);
    if let Ok(mut cache) = cache.write() {
        cache.insert(sweep_id, known.clone());
    }
    Ok((*known).clone())
}
