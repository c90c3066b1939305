//! The worker's hold on its box: a lock on its work directory, so two workers never share
//! attempt directories (nor one identity), and the key it registers with, kept in that
//! directory, so the same worker restarted is told apart from a second worker somewhere else
//! that was given the same name.

use anyhow::Context;
use nix::fcntl::{Flock, FlockArg};
use std::fs::File;
use std::io::Write;
use std::path::Path;

const LOCK_FILE: &str = ".app-worker.lock";
const KEY_FILE: &str = ".app-worker.key";

/// Held for the worker's life: dropping it releases the work directory.
pub struct Identity {
    pub key: String,
    _lock: Flock<File>,
}

/// Takes the work directory (refused while another worker holds it) and reads, or makes, the
/// worker's key.
pub fn take(work_dir: &Path) -> anyhow::Result<Identity> {
    let lock_path = work_dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("opening {}", lock_path.display()))?;
    let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
        anyhow::anyhow!(
            "another worker uses the work directory {} ({errno}); give each worker its own --work-dir",
            work_dir.display()
        )
    })?;
    Ok(Identity { key: key(work_dir)?, _lock: lock })
}

/// The key in the work directory, made on first use. Where it cannot be kept (a read-only
/// directory), a key for this run only: a restart then looks like another worker, whose
/// earlier jobs come back when their leases run out rather than at once.
fn key(work_dir: &Path) -> anyhow::Result<String> {
    let path = work_dir.join(KEY_FILE);
    if let Ok(text) = std::fs::read_to_string(&path) {
        let key = text.trim();
        if key.len() >= 32 && key.bytes().all(|byte| byte.is_ascii_hexdigit()) {
            return Ok(key.to_string());
        }
    }
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|error| anyhow::anyhow!("no randomness for the worker key: {error}"))?;
    let key: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    let temporary = work_dir.join(format!("{KEY_FILE}.{}", std::process::id()));
    let kept = (|| -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut file =
            std::fs::OpenOptions::new().create(true).truncate(true).write(true).mode(0o600).open(&temporary)?;
        file.write_all(key.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&temporary, &path)
    })();
    if let Err(error) = kept {
        let _ = std::fs::remove_file(&temporary);
        tracing::warn!(%error, path = %path.display(), "cannot keep the worker key; using one for this run only");
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_worker_per_directory_and_the_key_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let first = take(dir.path()).unwrap();
        let refused = take(dir.path()).err().expect("a second worker on the same directory is refused");
        assert!(refused.to_string().contains("another worker uses the work directory"), "{refused}");
        let key = first.key.clone();
        drop(first);
        let again = take(dir.path()).unwrap();
        assert_eq!(again.key, key, "the same worker, restarted, has the same key");
        let elsewhere = tempfile::tempdir().unwrap();
        assert_ne!(take(elsewhere.path()).unwrap().key, key);
    }
}
