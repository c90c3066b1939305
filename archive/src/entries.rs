//! What an archive may hold: regular files, directories and symlinks, each at a relative path
//! inside the root, links pointing inside it. Anything else (a `..` or absolute path, a link
//! leading out, a hard link, a device, a FIFO) is refused by name, both by the server receiving
//! a snapshot and by a worker unpacking one, so nothing unsafe is stored or unpacked quietly.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

/// Why one entry of an archive is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsafeEntry {
    /// The entry's path as the archive names it.
    pub path: String,
    pub reason: String,
}

impl std::fmt::Display for UnsafeEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "entry `{}`: {}", self.path, self.reason)
    }
}

/// Checks one entry; `Ok(false)` for an entry that carries nothing to unpack (a pax global
/// header).
pub fn check<R: Read>(entry: &tar::Entry<'_, R>) -> Result<bool, UnsafeEntry> {
    let path = entry.path_bytes();
    let name = String::from_utf8_lossy(&path).into_owned();
    let refuse = |reason: &str| UnsafeEntry { path: name.clone(), reason: reason.to_string() };
    let kind = entry.header().entry_type();
    if kind == tar::EntryType::XGlobalHeader {
        return Ok(false);
    }
    let relative = Path::new(std::str::from_utf8(&path).map_err(|_| refuse("a path that is not UTF-8"))?);
    inside(relative).map_err(|reason| refuse(&reason))?;
    match kind {
        tar::EntryType::Regular | tar::EntryType::Directory => Ok(true),
        tar::EntryType::Symlink => {
            let target = entry.link_name_bytes().ok_or_else(|| refuse("a symlink without a target"))?.into_owned();
            let target = std::str::from_utf8(&target).map_err(|_| refuse("a symlink target that is not UTF-8"))?;
            link_inside(relative, Path::new(target)).map_err(|reason| refuse(&reason))?;
            Ok(true)
        }
        tar::EntryType::Link => Err(refuse("a hard link (snapshots hold files and symlinks only)")),
        tar::EntryType::Char | tar::EntryType::Block => Err(refuse("a device file")),
        tar::EntryType::Fifo => Err(refuse("a FIFO")),
        other => Err(refuse(&format!("an entry of tar type {:?}", other.as_byte() as char))),
    }
}

/// A path is inside the root: relative, with no `..`, not empty.
fn inside(path: &Path) -> Result<(), String> {
    if path.as_os_str().is_empty() {
        return Err("an empty path".into());
    }
    for component in path.components() {
        match component {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => return Err("a path with `..` (it would leave the project)".into()),
            Component::RootDir | Component::Prefix(_) => return Err("an absolute path".into()),
        }
    }
    Ok(())
}

/// A symlink at `link` (inside the root) whose `target` resolves inside the root, by name.
fn link_inside(link: &Path, target: &Path) -> Result<(), String> {
    if target.is_absolute() {
        return Err(format!("a symlink to an absolute path ({})", target.display()));
    }
    let mut resolved = PathBuf::new();
    for component in link.parent().unwrap_or(Path::new("")).components().chain(target.components()) {
        match component {
            Component::Normal(part) => resolved.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                if !resolved.pop() {
                    return Err(format!("a symlink leading outside the project (-> {})", target.display()));
                }
            }
            Component::RootDir | Component::Prefix(_) => return Err("a symlink to an absolute path".into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_links_inside_pass_and_the_others_are_named() {
        assert!(inside(Path::new("pkg/a.py")).is_ok());
        assert!(inside(Path::new("./a")).is_ok());
        assert!(inside(Path::new("../a")).unwrap_err().contains(".."));
        assert!(inside(Path::new("a/../../b")).is_err());
        assert!(inside(Path::new("/etc/passwd")).unwrap_err().contains("absolute"));
        assert!(inside(Path::new("")).is_err());
        assert!(link_inside(Path::new("src/data"), Path::new("../data.csv")).is_ok());
        assert!(link_inside(Path::new("a/b/c"), Path::new("../../x")).is_ok());
        assert!(link_inside(Path::new("link"), Path::new("../secret")).is_err());
        assert!(link_inside(Path::new("a/link"), Path::new("../../secret")).is_err());
        assert!(link_inside(Path::new("link"), Path::new("/etc/passwd")).unwrap_err().contains("absolute"));
        // Down and back up past the root on the way: refused even where it would end inside.
        assert!(link_inside(Path::new("link"), Path::new("../project/x")).is_err());
    }
}
