//! The archives `app` moves between machines: a project's code snapshot and a job's
//! checkpoint directory, both a tar stream compressed with zstd.
//!
//! A code snapshot is content-addressed by the SHA-256 of its *uncompressed* tar stream, which
//! is written deterministically (paths in byte order, fixed owner, time and modes, only the
//! executable bit kept). So the same files give the same digest on any machine, the digest can
//! be computed without compressing anything (an unchanged resubmission costs one read and hash
//! of the files), and whoever unpacks a snapshot checks the digest on the bytes it unpacked.
//!
//! - [`pack`]: a list of files under a root → the tar stream, hashed, optionally compressed;
//! - [`unpack`]: a compressed stream → files in a directory, hashed on the way;
//! - [`entries`]: what an archive may hold (checked on receipt and at every unpack);
//! - [`links`]: which symlinks stay inside a root (the others are never followed or stored).

pub mod entries;
pub mod links;
pub mod pack;
pub mod unpack;

pub use entries::UnsafeEntry;
pub use pack::{digest_of, list_tree, pack_to, Packed, Skipped};
pub use unpack::{unpack_verified, verify, UnpackError, Verified};

/// Lower-case hex of a SHA-256 digest.
pub fn hex(digest: &[u8]) -> String {
    digest.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Whether `text` is a SHA-256 digest as this crate writes it: 64 lower-case hex digits.
pub fn is_digest(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte))
}

/// The zstd level snapshots and checkpoints are compressed at: fast (hundreds of MB/s on one
/// core) and still a third or less of typical source and weights.
pub const ZSTD_LEVEL: i32 = 3;
