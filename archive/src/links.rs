//! Symlinks in a tree that is shipped to other machines. A link that resolves inside the root
//! is stored as a link (made relative, so it works wherever the tree is unpacked); a link that
//! leads outside the root, directly or through other links, is never followed nor stored: it
//! would ship, or point at, files the project does not hold.

use std::path::{Component, Path, PathBuf};

/// The target to store for the symlink at `root/relative`, or why it is left out. `root` must
/// be absolute and free of symlinks (canonical).
pub fn inside_target(root: &Path, relative: &Path) -> Result<PathBuf, String> {
    let link = root.join(relative);
    let target = std::fs::read_link(&link).map_err(|error| format!("unreadable symlink: {error}"))?;
    let parent = normalize(link.parent().unwrap_or(root));
    let resolved = normalize(&parent.join(&target));
    if !resolved.starts_with(root) {
        return Err(format!("a symlink leading outside the project (-> {})", target.display()));
    }
    // A chain of links may still leave the root where the first step stays inside.
    if let Ok(canonical) = link.canonicalize() {
        if !canonical.starts_with(root) {
            return Err(format!("a symlink leading outside the project (-> {})", canonical.display()));
        }
    }
    // Always the shortest relative path: a target written as `../project/file` from inside the
    // project leaves it by name on its way, which unpacking (`entries`) refuses.
    Ok(relative_path(&parent, &resolved))
}

/// `path` with `.` and `..` resolved by name (a `..` above the root stays at the root).
pub fn normalize(path: &Path) -> PathBuf {
    let mut normal = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                normal.pop();
            }
            other => normal.push(other),
        }
    }
    normal
}

/// The relative path from directory `from` to `to` (both absolute and normalized).
fn relative_path(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<Component> = from.components().collect();
    let to: Vec<Component> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut relative: PathBuf = from[common..].iter().map(|_| Component::ParentDir).collect();
    relative.extend(&to[common..]);
    if relative.as_os_str().is_empty() {
        relative.push(".");
    }
    relative
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn links_inside_are_kept_relative_and_links_outside_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().canonicalize().unwrap();
        let root = outside.join("project");
        std::fs::create_dir_all(root.join("src/deep")).unwrap();
        std::fs::write(root.join("data.csv"), "x").unwrap();
        std::fs::write(outside.join("secret"), "s").unwrap();
        symlink("../data.csv", root.join("src/data")).unwrap();
        symlink(root.join("data.csv"), root.join("src/deep/absolute")).unwrap();
        symlink("../secret", root.join("escape")).unwrap();
        symlink(outside.join("secret"), root.join("escape-absolute")).unwrap();
        // Inside by name, outside through the second link.
        symlink("escape", root.join("chain")).unwrap();
        symlink("missing-file", root.join("dangling")).unwrap();

        assert_eq!(inside_target(&root, Path::new("src/data")).unwrap(), Path::new("../data.csv"));
        assert_eq!(inside_target(&root, Path::new("src/deep/absolute")).unwrap(), Path::new("../../data.csv"));
        assert_eq!(inside_target(&root, Path::new("dangling")).unwrap(), Path::new("missing-file"));
        // Out of the project by name and back in: stored the short way, which unpacking takes.
        symlink("../project/data.csv", root.join("roundabout")).unwrap();
        assert_eq!(inside_target(&root, Path::new("roundabout")).unwrap(), Path::new("data.csv"));
        for outside in ["escape", "escape-absolute", "chain"] {
            let refused = inside_target(&root, Path::new(outside)).unwrap_err();
            assert!(refused.contains("outside the project"), "{outside}: {refused}");
        }
    }

    #[test]
    fn normalizing_resolves_dots_by_name() {
        assert_eq!(normalize(Path::new("/a/b/../c/./d")), Path::new("/a/c/d"));
        assert_eq!(normalize(Path::new("/../x")), Path::new("/x"));
    }
}
