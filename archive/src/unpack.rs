//! Reading archives: decompress, hash the tar stream on the way, and either only check it (the
//! server, receiving a snapshot) or unpack it (a worker, making an attempt's directory). Every
//! path is unpacked inside the destination (the `tar` crate refuses `..`, absolute paths and
//! writes through links); times are the unpacking time, modes the archive's.

use crate::entries::{self, UnsafeEntry};
use sha2::{Digest, Sha256};
use std::io::{self, Read};
use std::path::Path;

#[derive(Debug)]
pub enum UnpackError {
    /// The bytes are not the snapshot they claim to be (corrupted on disk or in transit).
    Mismatch {
        expected: String,
        found: String,
    },
    /// The tar stream is longer than allowed (a decompression bomb, or a snapshot over the cap).
    TooLarge {
        limit: u64,
    },
    /// An entry no snapshot may hold: a path leaving the root, a link out, a device, ...
    Unsafe(UnsafeEntry),
    Io(io::Error),
}

impl std::fmt::Display for UnpackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnpackError::Mismatch { expected, found } => {
                write!(f, "the archive's digest is {found}, not {expected}: it is corrupted")
            }
            UnpackError::TooLarge { limit } => write!(f, "the archive unpacks to more than {limit} bytes"),
            UnpackError::Unsafe(entry) => write!(f, "the archive has an unsafe {entry}"),
            UnpackError::Io(error) => write!(f, "{error}"),
        }
    }
}

impl std::error::Error for UnpackError {}

/// What was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Lower-case hex SHA-256 of the uncompressed tar stream.
    pub digest: String,
    pub tar_bytes: u64,
}

/// Decompresses `compressed`, checks every entry and hashes its tar stream (at most `limit`
/// bytes of it) without writing anything.
pub fn verify<R: Read>(compressed: R, limit: u64) -> Result<Verified, UnpackError> {
    let reader = HashReader::new(zstd::Decoder::new(compressed).map_err(UnpackError::Io)?, limit);
    let mut archive = tar::Archive::new(reader);
    let walked = walk(&mut archive, |_| Ok(()));
    finish(archive, walked)
}

/// Unpacks `compressed` into `destination` and checks that the tar stream it read has the
/// digest `expected` (when given). On any error, what was unpacked is left for the caller to
/// remove: nothing from a mismatched or refused archive may be run.
pub fn unpack_verified<R: Read>(
    compressed: R,
    expected: Option<&str>,
    destination: &Path,
    limit: u64,
) -> Result<Verified, UnpackError> {
    let reader = HashReader::new(zstd::Decoder::new(compressed).map_err(UnpackError::Io)?, limit);
    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_permissions(true);
    archive.set_preserve_mtime(false);
    archive.set_overwrite(true);
    archive.set_unpack_xattrs(false);
    let walked = walk(&mut archive, |entry| {
        // Checked first, so `unpack_in` never meets a path it would skip or re-root.
        if !entry.unpack_in(destination)? {
            return Err(io::Error::other(format!("`{}` was not unpacked", entry.path_bytes().escape_ascii())));
        }
        Ok(())
    });
    let verified = finish(archive, walked)?;
    match expected {
        Some(expected) if expected != verified.digest => {
            Err(UnpackError::Mismatch { expected: expected.to_string(), found: verified.digest })
        }
        _ => Ok(verified),
    }
}

/// Each entry of `archive`, checked, handed to `each`; the first refusal or error ends it.
fn walk<R: Read>(
    archive: &mut tar::Archive<R>,
    mut each: impl FnMut(&mut tar::Entry<'_, R>) -> io::Result<()>,
) -> Result<(), UnpackError> {
    for entry in archive.entries().map_err(UnpackError::Io)? {
        let mut entry = entry.map_err(UnpackError::Io)?;
        if entries::check(&entry).map_err(UnpackError::Unsafe)? {
            each(&mut entry).map_err(UnpackError::Io)?;
        }
    }
    Ok(())
}

/// The digest of the whole tar stream once the entries were walked: the end-of-archive blocks
/// (and anything after them) are part of what the digest names. Past the limit is `TooLarge`
/// whatever else failed on the way.
fn finish<R: Read>(
    archive: tar::Archive<HashReader<R>>,
    walked: Result<(), UnpackError>,
) -> Result<Verified, UnpackError> {
    let mut reader = archive.into_inner();
    let rest = match walked {
        Ok(()) => io::copy(&mut reader, &mut io::sink()).map(|_| ()),
        Err(UnpackError::Io(error)) => Err(error),
        Err(refused) => {
            return match reader.finish(Ok(())) {
                Err(too_large @ UnpackError::TooLarge { .. }) => Err(too_large),
                _ => Err(refused),
            }
        }
    };
    reader.finish(rest)
}

/// Hashes and counts what is read through it, refusing to read past `limit` bytes.
struct HashReader<R> {
    inner: R,
    hasher: Sha256,
    read: u64,
    limit: u64,
    over: bool,
}

impl<R: Read> HashReader<R> {
    fn new(inner: R, limit: u64) -> HashReader<R> {
        HashReader { inner, hasher: Sha256::new(), read: 0, limit, over: false }
    }

    fn finish(self, outcome: io::Result<()>) -> Result<Verified, UnpackError> {
        if self.over {
            return Err(UnpackError::TooLarge { limit: self.limit });
        }
        outcome.map_err(UnpackError::Io)?;
        Ok(Verified { digest: crate::hex(&self.hasher.finalize()), tar_bytes: self.read })
    }
}

impl<R: Read> Read for HashReader<R> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let read = self.inner.read(buffer)?;
        self.read += read as u64;
        if self.read > self.limit {
            self.over = true;
            return Err(io::Error::other("the archive is larger than allowed"));
        }
        self.hasher.update(&buffer[..read]);
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pack::{list_tree, pack_to};
    use std::path::PathBuf;

    fn packed_project() -> (tempfile::TempDir, Vec<u8>, String) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("pkg")).unwrap();
        std::fs::write(root.join("pkg/a.py"), "a = 1\n").unwrap();
        std::fs::write(root.join("b.txt"), vec![b'b'; 50_000]).unwrap();
        std::os::unix::fs::symlink("pkg/a.py", root.join("link.py")).unwrap();
        let entries: Vec<PathBuf> = list_tree(&root).unwrap();
        let (packed, bytes) = pack_to(&root, &entries, Vec::new()).unwrap();
        (dir, bytes, packed.digest)
    }

    #[test]
    fn unpacking_gives_back_the_files_and_checks_the_digest() {
        let (_project, bytes, digest) = packed_project();
        let out = tempfile::tempdir().unwrap();
        let verified = unpack_verified(&bytes[..], Some(&digest), out.path(), u64::MAX).unwrap();
        assert_eq!(verified.digest, digest);
        assert_eq!(std::fs::read_to_string(out.path().join("pkg/a.py")).unwrap(), "a = 1\n");
        assert_eq!(std::fs::read(out.path().join("b.txt")).unwrap().len(), 50_000);
        assert_eq!(std::fs::read_link(out.path().join("link.py")).unwrap(), Path::new("pkg/a.py"));
        assert_eq!(verify(&bytes[..], u64::MAX).unwrap(), verified);
    }

    #[test]
    fn a_corrupted_archive_is_a_mismatch_or_an_error_never_a_success() {
        let (_project, bytes, digest) = packed_project();
        let other = "0".repeat(64);
        let out = tempfile::tempdir().unwrap();
        let wrong = unpack_verified(&bytes[..], Some(&other), out.path(), u64::MAX).unwrap_err();
        assert!(matches!(wrong, UnpackError::Mismatch { .. }), "{wrong}");
        // Flip bytes all along the compressed stream: zstd's checksum or the digest catches each.
        for position in (0..bytes.len()).step_by(bytes.len() / 7 + 1) {
            let mut corrupted = bytes.clone();
            corrupted[position] ^= 0x5a;
            let out = tempfile::tempdir().unwrap();
            assert!(unpack_verified(&corrupted[..], Some(&digest), out.path(), u64::MAX).is_err(), "at {position}");
        }
        let cut = &bytes[..bytes.len() / 2];
        assert!(unpack_verified(cut, Some(&digest), out.path(), u64::MAX).is_err());
    }

    #[test]
    fn an_archive_past_the_limit_is_refused() {
        let (_project, bytes, _) = packed_project();
        assert!(matches!(verify(&bytes[..], 10_000), Err(UnpackError::TooLarge { limit: 10_000 })));
        let out = tempfile::tempdir().unwrap();
        let refused = unpack_verified(&bytes[..], None, out.path(), 10_000).unwrap_err();
        assert!(matches!(refused, UnpackError::TooLarge { .. }), "{refused}");
    }
}
