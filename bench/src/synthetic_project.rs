//! A synthetic research project for `app-bench code`: thousands of small source-like text
//! files (compressible) and a few large data files, half of them random bytes (like weights,
//! incompressible) and half CSV-like text, in package directories of a hundred files each.
//! The content is drawn from a fixed seed, so every run of the benchmark packs the same bytes.

use std::path::Path;

/// Share of the bytes in the large files.
const LARGE_SHARE: f64 = 0.6;
/// Files that are large (the rest are small).
const LARGE_FILES: u64 = 50;
/// Small files per package directory.
const FILES_PER_DIR: u64 = 100;

/// What was written.
pub struct Synthetic {
    pub files: u64,
    pub bytes: u64,
}

/// A small, fast generator (xorshift64*): the content needs no cryptographic quality.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound.max(1)
    }
}

/// The words of the source-like text, space-separated.
const WORDS: &str = "def return self model loss batch import torch for in range if else lr optimizer step config data \
                     x y = ( ) :";

/// Source-like text of about `size` bytes.
fn text(draw: &mut Draw, size: usize) -> Vec<u8> {
    let words: Vec<&str> = WORDS.split_whitespace().collect();
    let mut out = Vec::with_capacity(size + 80);
    while out.len() < size {
        let indent = draw.below(3) as usize * 4;
        out.extend(std::iter::repeat_n(b' ', indent));
        for _ in 0..3 + draw.below(8) {
            out.extend_from_slice(words[draw.below(words.len() as u64) as usize].as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(format!("{}\n", draw.below(10_000)).as_bytes());
    }
    out.truncate(size);
    out
}

/// CSV-like rows of numbers, about `size` bytes.
fn table(draw: &mut Draw, size: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(size + 80);
    while out.len() < size {
        let row: Vec<String> = (0..6).map(|_| format!("{:.4}", draw.below(1_000_000) as f64 / 1e4)).collect();
        out.extend_from_slice(row.join(",").as_bytes());
        out.push(b'\n');
    }
    out.truncate(size);
    out
}

fn random_bytes(draw: &mut Draw, size: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(size + 8);
    while out.len() < size {
        out.extend_from_slice(&draw.next().to_le_bytes());
    }
    out.truncate(size);
    out
}

/// Writes `files` files of `bytes` bytes in all under `root`.
pub fn write(root: &Path, files: u64, bytes: u64) -> std::io::Result<Synthetic> {
    let mut draw = Draw(0x9e37_79b9_7f4a_7c15);
    let large = LARGE_FILES.min(files / 10);
    let small = files - large;
    let large_bytes = if large == 0 { 0 } else { (bytes as f64 * LARGE_SHARE) as u64 };
    let small_bytes = bytes - large_bytes;
    let mut written = Synthetic { files: 0, bytes: 0 };
    let mut put = |path: &Path, content: Vec<u8>| -> std::io::Result<()> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        written.files += 1;
        written.bytes += content.len() as u64;
        std::fs::write(path, content)
    };
    // Small files between half and one and a half times their mean size; the last takes the rest.
    let mean = small_bytes / small.max(1);
    let mut left = small_bytes;
    for index in 0..small {
        let size = if index + 1 == small { left } else { (mean / 2 + draw.below(mean.max(1))).min(left) };
        left -= size;
        let path = root.join(format!("src/package_{:03}/module_{index:05}.py", index / FILES_PER_DIR));
        put(&path, text(&mut draw, size as usize))?;
    }
    let mut left = large_bytes;
    for index in 0..large {
        let mean = left / (large - index);
        let size = if index + 1 == large { left } else { (mean / 2 + draw.below(mean.max(1))).min(left) };
        left -= size;
        let (path, content) = if index % 2 == 0 {
            (root.join(format!("weights/layer_{index:02}.bin")), random_bytes(&mut draw, size as usize))
        } else {
            (root.join(format!("data/split_{index:02}.csv")), table(&mut draw, size as usize))
        };
        put(&path, content)?;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_asked_count_and_size_the_same_each_time() {
        let first = tempfile::tempdir().unwrap();
        let written = write(first.path(), 300, 3_000_000).unwrap();
        assert_eq!((written.files, written.bytes), (300, 3_000_000));
        let listed = archive::list_tree(first.path()).unwrap();
        assert_eq!(listed.len(), 300);
        let second = tempfile::tempdir().unwrap();
        write(second.path(), 300, 3_000_000).unwrap();
        let digest = |root: &Path| archive::digest_of(root, &archive::list_tree(root).unwrap()).unwrap().digest;
        assert_eq!(digest(first.path()), digest(second.path()), "the same seed, the same project");
    }
}
