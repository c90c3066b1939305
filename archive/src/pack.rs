//! Writing archives. The tar stream is deterministic: entries in byte order of their paths,
//! owner 0, time 0, mode 0644 or 0755 (only the executable bit survives) and links 0777, so its
//! SHA-256 names the content alone. Regular files and symlinks that stay inside the root are
//! stored; directories are implied by the files in them (as in git); a file that cannot be
//! read, a link leading out of the root and anything else (a socket, a device) is left out and
//! named in [`Packed::skipped`].

use crate::links;
use sha2::{Digest, Sha256};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Something under the root that is not in the archive, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub path: PathBuf,
    pub why: String,
}

/// What was written.
#[derive(Debug, Clone)]
pub struct Packed {
    /// Lower-case hex SHA-256 of the uncompressed tar stream.
    pub digest: String,
    /// Length of the uncompressed tar stream.
    pub tar_bytes: u64,
    /// Files and links stored.
    pub entries: u64,
    /// Bytes of file content stored.
    pub content_bytes: u64,
    pub skipped: Vec<Skipped>,
}

/// Every file and symlink under `root`, relative to it, without following links (the listing of
/// a checkpoint directory, or of a project that is not a git work tree).
pub fn list_tree(root: &Path) -> io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in walkdir::WalkDir::new(root).follow_links(false).min_depth(1) {
        let entry = entry.map_err(io::Error::other)?;
        if !entry.file_type().is_dir() {
            found.push(entry.path().strip_prefix(root).map_err(io::Error::other)?.to_path_buf());
        }
    }
    Ok(found)
}

/// The digest of the archive of `entries` (relative to `root`), computed without compressing:
/// what decides whether a snapshot must be uploaded at all.
pub fn digest_of(root: &Path, entries: &[PathBuf]) -> io::Result<Packed> {
    let (packed, _) = write_tar(root, entries, io::sink())?;
    Ok(packed)
}

/// The archive of `entries` (relative to `root`), compressed with zstd into `out`; returns what
/// was written and `out`.
pub fn pack_to<W: Write>(root: &Path, entries: &[PathBuf], out: W) -> io::Result<(Packed, W)> {
    let mut encoder = zstd::Encoder::new(io::BufWriter::with_capacity(1 << 20, out), crate::ZSTD_LEVEL)?;
    // A damaged archive then fails to decompress, before its digest is even compared.
    encoder.include_checksum(true)?;
    let (packed, encoder) = write_tar(root, entries, encoder)?;
    let out = encoder.finish()?.into_inner().map_err(|error| error.into_error())?;
    Ok((packed, out))
}

fn write_tar<W: Write>(root: &Path, entries: &[PathBuf], out: W) -> io::Result<(Packed, W)> {
    let mut sorted: Vec<&PathBuf> = entries.iter().collect();
    sorted.sort_by(|a, b| a.as_os_str().as_bytes().cmp(b.as_os_str().as_bytes()));
    sorted.dedup();
    let mut builder = tar::Builder::new(HashWriter::new(out));
    let mut packed = Packed { digest: String::new(), tar_bytes: 0, entries: 0, content_bytes: 0, skipped: Vec::new() };
    for relative in sorted {
        match append(&mut builder, root, relative)? {
            Ok(size) => {
                packed.entries += 1;
                packed.content_bytes += size;
            }
            Err(why) => packed.skipped.push(Skipped { path: relative.clone(), why }),
        }
    }
    let hashing = builder.into_inner()?;
    packed.tar_bytes = hashing.written;
    packed.digest = crate::hex(&hashing.hasher.finalize());
    Ok((packed, hashing.inner))
}

/// Appends one entry: `Ok(Ok(content bytes))`, `Ok(Err(why it was left out))`, or an error of
/// the output (which ends the whole archive).
fn append<W: Write>(builder: &mut tar::Builder<W>, root: &Path, relative: &Path) -> io::Result<Result<u64, String>> {
    let path = root.join(relative);
    let metadata = match std::fs::symlink_metadata(&path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Err("it vanished".into())),
        Err(error) => return Ok(Err(format!("unreadable: {error}"))),
    };
    let mut header = tar::Header::new_gnu();
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    if metadata.file_type().is_symlink() {
        let target = match links::inside_target(root, relative) {
            Ok(target) => target,
            Err(why) => return Ok(Err(why)),
        };
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_mode(0o777);
        header.set_size(0);
        builder.append_link(&mut header, relative, target)?;
        return Ok(Ok(0));
    }
    if !metadata.is_file() {
        use std::os::unix::fs::FileTypeExt;
        let kind = metadata.file_type();
        let kind = if kind.is_dir() {
            "a directory"
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_socket() {
            "a socket"
        } else if kind.is_block_device() || kind.is_char_device() {
            "a device file"
        } else {
            "not a regular file"
        };
        return Ok(Err(kind.into()));
    }
    let file = match std::fs::File::open(&path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Err("it vanished".into())),
        Err(error) => return Ok(Err(format!("unreadable: {error}"))),
    };
    // The size of the file as opened: one that changes while it is read is cut or padded to it,
    // so the archive stays well-formed whatever the file does.
    let size = file.metadata()?.len();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(if metadata.permissions().mode() & 0o111 != 0 { 0o755 } else { 0o644 });
    header.set_size(size);
    let content = file.take(size).chain(io::repeat(0).take(size)).take(size);
    builder.append_data(&mut header, relative, content)?;
    Ok(Ok(size))
}

/// Forwards writes to `inner`, hashing and counting them.
struct HashWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W> HashWriter<W> {
    fn new(inner: W) -> HashWriter<W> {
        HashWriter { inner, hasher: Sha256::new(), written: 0 }
    }
}

impl<W: Write> Write for HashWriter<W> {
    fn write(&mut self, buffer: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(buffer)?;
        self.hasher.update(&buffer[..written]);
        self.written += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn project() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(root.join("train.py"), "print('hi')\n").unwrap();
        std::fs::write(root.join("src/model.py"), vec![b'x'; 10_000]).unwrap();
        std::fs::write(root.join("run.sh"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o750)).unwrap();
        dir
    }

    #[test]
    fn the_digest_names_the_content_not_the_order_times_or_owners() {
        let dir = project();
        let root = dir.path().canonicalize().unwrap();
        let entries = list_tree(&root).unwrap();
        let first = digest_of(&root, &entries).unwrap();
        assert_eq!(first.entries, 3);
        assert_eq!(first.content_bytes, 12 + 10_000 + 10);
        let mut reversed = entries.clone();
        reversed.reverse();
        // Touching a file (a fresh checkout) changes nothing; changing a byte changes the digest.
        std::fs::write(root.join("train.py"), "print('hi')\n").unwrap();
        assert_eq!(digest_of(&root, &reversed).unwrap().digest, first.digest);
        std::fs::write(root.join("train.py"), "print('ho')\n").unwrap();
        assert_ne!(digest_of(&root, &entries).unwrap().digest, first.digest);
        // The executable bit is content.
        std::fs::write(root.join("train.py"), "print('hi')\n").unwrap();
        std::fs::set_permissions(root.join("train.py"), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_ne!(digest_of(&root, &entries).unwrap().digest, first.digest);
    }

    #[test]
    fn packing_compresses_the_same_stream_the_digest_names() {
        let dir = project();
        let root = dir.path().canonicalize().unwrap();
        let entries = list_tree(&root).unwrap();
        let (packed, compressed) = pack_to(&root, &entries, Vec::new()).unwrap();
        assert_eq!(packed.digest, digest_of(&root, &entries).unwrap().digest);
        assert!((compressed.len() as u64) < packed.tar_bytes / 4, "{} of {}", compressed.len(), packed.tar_bytes);
        let tar = zstd::decode_all(&compressed[..]).unwrap();
        assert_eq!(crate::hex(&Sha256::digest(&tar)), packed.digest);
    }

    #[test]
    fn what_cannot_be_stored_is_named_and_left_out() {
        let dir = project();
        let root = dir.path().canonicalize().unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("passwd")).unwrap();
        std::os::unix::fs::symlink("train.py", root.join("alias.py")).unwrap();
        let mut entries = list_tree(&root).unwrap();
        entries.push(PathBuf::from("deleted.py"));
        let packed = digest_of(&root, &entries).unwrap();
        let skipped: Vec<(String, &str)> =
            packed.skipped.iter().map(|skip| (skip.path.display().to_string(), skip.why.as_str())).collect();
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert_eq!(skipped[0], ("deleted.py".to_string(), "it vanished"));
        assert_eq!(skipped[1].0, "passwd");
        assert!(skipped[1].1.contains("outside the project"), "{skipped:?}");
        assert_eq!(packed.entries, 4, "the three files and the link inside");
    }
}
