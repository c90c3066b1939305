//! Names that end up in paths (`results/<sweep>/...`) and URLs, so they are kept plain.
//!
//! A plain name is 1 to 100 of `A-Z a-z 0-9 . _ -`, not starting with `.` or `-`. A sweep's
//! name may be two plain names joined by one `/` (`myproj/sweep`, as `app submit` names a file
//! without `name:` after its project): URLs carry it percent-encoded as one segment, and on disk
//! it is one directory, [`sweep_dir_name`].
//!
//! A user's name (what a user token carries, a sweep's owner) is stricter: 1 to 32 of
//! `a-z 0-9 _ . -`, so it fits a Prometheus label and a table column as it is.

/// Longest name, `/` included.
pub const MAX_NAME_BYTES: usize = 100;

/// What stands for a sweep name's `/` in a directory name. No name holds it, so the mapping
/// cannot make two names one directory, and a name without `/` is its own directory.
const DIR_SEPARATOR: char = '+';

/// The user of a token that names none, and of every request to a server without tokens.
pub const DEFAULT_USER: &str = "default";

/// Longest user name.
pub const MAX_USER_NAME_BYTES: usize = 32;

/// A user's name: 1 to 32 of `a-z`, `0-9`, `_`, `.`, `-`. The error does not repeat the name:
/// in a token file, text before a `:` that is no name may be part of a token.
pub fn check_user_name(name: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '.' | '-');
    if name.is_empty() || name.len() > MAX_USER_NAME_BYTES || !name.chars().all(allowed) {
        return Err(format!(
            "a user name is 1 to {MAX_USER_NAME_BYTES} of a-z, 0-9, `_`, `.` and `-` (lower case, no spaces)"
        ));
    }
    Ok(())
}

/// A worker's name (or one part of a sweep's): a plain name.
pub fn check_name(kind: &str, name: &str) -> Result<(), String> {
    if !is_plain(name) || name.len() > MAX_NAME_BYTES {
        return Err(format!(
            "{kind} name `{name}` is not allowed: use 1 to 100 letters, digits, `.`, `_` or `-`, not starting with `.` or `-`"
        ));
    }
    Ok(())
}

/// A sweep's name: a plain name, or two joined by one `/` (`myproj/sweep`), 100 bytes at most.
pub fn check_sweep_name(name: &str) -> Result<(), String> {
    let plain_parts = match name.split_once('/') {
        Some((project, sweep)) => is_plain(project) && is_plain(sweep),
        None => is_plain(name),
    };
    if !plain_parts || name.len() > MAX_NAME_BYTES {
        return Err(format!(
            "sweep name `{name}` is not allowed: use 1 to 100 letters, digits, `.`, `_` or `-`, not starting with \
             `.` or `-`, with at most one `/` between two such parts (`project/sweep`)"
        ));
    }
    Ok(())
}

fn is_plain(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(['.', '-'])
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Turns a file stem such as `my sweep (v2)` into an allowed name (`my-sweep-v2`).
pub fn name_from_stem(stem: &str) -> String {
    let name = plain_from(stem);
    if name.is_empty() {
        "sweep".to_string()
    } else {
        name
    }
}

/// The name of a sweep file without `name:`: `<project>/<stem>` (`myproj/sweep`), each made
/// plain as [`name_from_stem`] does; the project's part is shortened to fit 100 bytes, and
/// left out when nothing of it is allowed (or there is no project).
pub fn default_sweep_name(project: Option<&str>, stem: &str) -> String {
    let stem = name_from_stem(stem);
    let room = MAX_NAME_BYTES.saturating_sub(stem.len() + 1);
    let project: String = plain_from(project.unwrap_or_default()).chars().take(room).collect();
    if project.is_empty() {
        stem
    } else {
        format!("{project}/{stem}")
    }
}

/// The directory a sweep's files are kept in, under `results/`: its name, with `/` as `+`
/// (`myproj/sweep` → `myproj+sweep`). Flat, not nested: a nested `myproj/sweep/` would sit
/// among the index directories of a sweep called `myproj` (and go with it when it is removed).
pub fn sweep_dir_name(sweep: &str) -> String {
    sweep.replace('/', &DIR_SEPARATOR.to_string())
}

/// `text` with every run of characters a name cannot hold made one `-`, trimmed of `-` and
/// `.` at both ends, at most 100 bytes; empty when nothing is left.
fn plain_from(text: &str) -> String {
    let mut name = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() || matches!(c, '.' | '_') {
            name.push(c);
        } else if !name.ends_with('-') {
            name.push('-');
        }
    }
    name.trim_matches(['-', '.']).chars().take(MAX_NAME_BYTES).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_pass_and_path_like_names_do_not() {
        assert!(check_name("sweep", "vaep-grid_v2.1").is_ok());
        assert!(check_name("worker", &"x".repeat(100)).is_ok());
        for bad in ["", "../etc", "a/b", ".hidden", "-x", "with space", "a+b", &"x".repeat(101)] {
            assert!(check_name("worker", bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn user_names_are_short_lower_case_and_plain() {
        for good in ["default", "user-a", "j.doe_2", "0", &"x".repeat(32)] {
            assert!(check_user_name(good).is_ok(), "{good:?} refused");
        }
        for bad in ["", "Alice", "a b", "a:b", "a/b", "é", &"x".repeat(33)] {
            let error = check_user_name(bad).unwrap_err();
            assert!(bad.is_empty() || !error.contains(bad), "the error repeats {bad:?}: {error}");
        }
    }

    #[test]
    fn a_sweep_name_may_join_two_plain_names_with_one_slash() {
        for good in [
            "vaep-grid",
            "myproj/sweep",
            "myproj/sweep-2",
            "a.b_c/d",
            &format!("{}/{}", "p".repeat(49), "s".repeat(50)),
        ] {
            assert!(check_sweep_name(good).is_ok(), "{good:?} refused");
        }
        let too_long = format!("{}/{}", "p".repeat(50), "s".repeat(50));
        for bad in [
            "",
            "/",
            "a/",
            "/b",
            "a//b",
            "a/b/c",
            "../etc",
            "a/..",
            "a/.hidden",
            ".a/b",
            "a/-x",
            "-a/b",
            "a b/c",
            "a\\b",
            "a+b",
            "a/b+c",
            &too_long,
            &"x".repeat(101),
        ] {
            assert!(check_sweep_name(bad).is_err(), "{bad:?} accepted");
        }
        let error = check_sweep_name("a/b/c").unwrap_err();
        assert!(error.contains("at most one `/`"), "{error}");
    }

    #[test]
    fn stems_become_allowed_names() {
        assert_eq!(name_from_stem("my sweep (v2)"), "my-sweep-v2");
        assert_eq!(name_from_stem("..."), "sweep");
        assert!(check_name("sweep", &name_from_stem("weird/../name")).is_ok());
    }

    #[test]
    fn a_nameless_sweep_is_named_after_its_project_and_file() {
        assert_eq!(default_sweep_name(Some("myproj"), "sweep"), "myproj/sweep");
        assert_eq!(default_sweep_name(Some("My Project (old)"), "grid v2"), "My-Project-old/grid-v2");
        assert_eq!(default_sweep_name(None, "sweep"), "sweep");
        // Nothing of the directory's name is allowed (`/`, or letters outside ASCII): the stem alone.
        assert_eq!(default_sweep_name(Some("…"), "sweep"), "sweep");
        assert_eq!(default_sweep_name(Some(""), "..."), "sweep");
        let long = default_sweep_name(Some(&"p".repeat(300)), &"s".repeat(60));
        assert_eq!(long, format!("{}/{}", "p".repeat(39), "s".repeat(60)));
        assert_eq!(default_sweep_name(Some("p"), &"s".repeat(200)), "s".repeat(100), "no room for the project");
        for (project, stem) in [("myproj", "sweep"), (".git", "-x-"), ("a/b", "c d"), ("p", &"s".repeat(99))] {
            let name = default_sweep_name(Some(project), stem);
            assert!(check_sweep_name(&name).is_ok(), "{project:?} + {stem:?} gave {name:?}");
        }
    }

    #[test]
    fn sweep_directories_are_the_names_themselves_or_flat_and_distinct() {
        assert_eq!(sweep_dir_name("vaep-grid"), "vaep-grid", "stored sweeps keep their directories");
        assert_eq!(sweep_dir_name("myproj/sweep"), "myproj+sweep");
        let names = ["myproj", "myproj/sweep", "myproj-sweep", "myproj/sweep-2", "myproj.sweep", "sweep"];
        let dirs: std::collections::BTreeSet<String> = names.iter().map(|name| sweep_dir_name(name)).collect();
        assert_eq!(dirs.len(), names.len());
        assert!(dirs.iter().all(|dir| !dir.contains('/') && !dir.starts_with('.')));
    }
}
