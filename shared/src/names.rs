//! Names that end up in paths (`results/<sweep>/...`) and URLs, so they are kept plain.

/// A sweep or worker name: 1 to 100 of `A-Z a-z 0-9 . _ -`, not starting with `.` or `-`.
pub fn check_name(kind: &str, name: &str) -> Result<(), String> {
    let plain = name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if name.is_empty() || name.len() > 100 || !plain || name.starts_with(['.', '-']) {
        return Err(format!(
            "{kind} name `{name}` is not allowed: use 1 to 100 letters, digits, `.`, `_` or `-`, not starting with `.` or `-`"
        ));
    }
    Ok(())
}

/// Turns a file stem such as `my sweep (v2)` into an allowed name (`my-sweep-v2`).
pub fn name_from_stem(stem: &str) -> String {
    let mut name = String::new();
    for c in stem.chars() {
        if c.is_ascii_alphanumeric() || matches!(c, '.' | '_') {
            name.push(c);
        } else if !name.ends_with('-') {
            name.push('-');
        }
    }
    let name = name.trim_matches(['-', '.']).chars().take(100).collect::<String>();
    if name.is_empty() {
        "sweep".to_string()
    } else {
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_pass_and_path_like_names_do_not() {
        assert!(check_name("sweep", "vaep-grid_v2.1").is_ok());
        for bad in ["", "../etc", "a/b", ".hidden", "-x", "with space", &"x".repeat(101)] {
            assert!(check_name("sweep", bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn stems_become_allowed_names() {
        assert_eq!(name_from_stem("my sweep (v2)"), "my-sweep-v2");
        assert_eq!(name_from_stem("..."), "sweep");
        assert!(check_name("sweep", &name_from_stem("weird/../name")).is_ok());
    }
}
