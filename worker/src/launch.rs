//! How a job's command is started: directly when it is a plain command line, through `sh -c`
//! otherwise.
//!
//! `python train.py --lr 0.1` needs no shell: its words are its argv. Starting it directly
//! saves a process per job (the shell), which is most of the cost of a short job. Anything a
//! shell would interpret (variables, quotes around spaces are fine but `$`, globs, pipes,
//! redirections, `;`, `&&`, assignments, comments, a builtin such as `cd`) goes to `sh -c` as
//! before, so the command means exactly what it would mean typed at a shell.

use std::path::{Path, PathBuf};

/// Characters that make a command line shell syntax rather than a list of words.
const SHELL_SYNTAX: &[char] =
    &['$', '`', '|', '&', ';', '<', '>', '(', ')', '*', '?', '[', ']', '{', '}', '~', '#', '!', '=', '\n', '\r', '\\'];

/// The command's words, when it is a plain command line a shell would split the same way and
/// run without interpreting anything; `None` when a shell is needed.
pub fn plain_words(command: &str) -> Option<Vec<String>> {
    if command.contains(SHELL_SYNTAX) {
        return None;
    }
    let words = shlex::split(command)?;
    (!words.is_empty() && words.iter().all(|word| !word.is_empty())).then_some(words)
}

/// Where `program` is on `path` (a `PATH` value): an executable file, by absolute path. A word
/// with a slash is taken as it is (relative to the job's directory), as a shell would.
pub fn find_program(program: &str, path: &str, cwd: &Path) -> Option<PathBuf> {
    if program.contains('/') {
        let candidate = cwd.join(program);
        return is_executable(&candidate).then_some(candidate);
    }
    path.split(':')
        .filter(|dir| !dir.is_empty())
        .map(|dir| Path::new(dir).join(program))
        .find(|candidate| candidate.is_absolute() && is_executable(candidate))
}

/// [`find_program`], remembering what it found: each lookup walks `PATH` with a `stat` per
/// directory, for every job. A program removed since is not found at spawn, and the job then
/// goes to the shell (see `executor::run`).
pub fn find_program_cached(program: &str, path: &str, cwd: &Path) -> Option<PathBuf> {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static FOUND: Mutex<Option<HashMap<(String, String), PathBuf>>> = Mutex::new(None);
    if program.contains('/') {
        return find_program(program, path, cwd);
    }
    let key = (program.to_string(), path.to_string());
    if let Some(found) = FOUND.lock().ok().and_then(|found| found.as_ref()?.get(&key).cloned()) {
        return Some(found);
    }
    let found = find_program(program, path, cwd)?;
    if let Ok(mut cache) = FOUND.lock() {
        let cache = cache.get_or_insert_with(HashMap::new);
        if cache.len() < 4096 {
            cache.insert(key, found.clone());
        }
    }
    Some(found)
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_command_lines_are_their_words_and_anything_else_needs_a_shell() {
        assert_eq!(plain_words("true"), Some(vec!["true".to_string()]));
        assert_eq!(
            plain_words("python train.py --lr 0.001 --name 'my run'"),
            Some(["python", "train.py", "--lr", "0.001", "--name", "my run"].map(String::from).to_vec())
        );
        for shell in [
            "echo $HOME",
            "a | b",
            "a && b",
            "a; b",
            "a > out",
            "ls *.py",
            "X=1 run",
            "cd dir",
            "echo ~",
            "run # comment",
            "echo `date`",
            "(sub)",
            "a\nb",
            "",
            "'unclosed",
            "echo \\n",
        ] {
            let words = plain_words(shell);
            // `cd dir` is plain words; it is the program lookup that sends it to the shell.
            if shell != "cd dir" {
                assert_eq!(words, None, "{shell:?} needs a shell");
            }
        }
    }

    #[test]
    fn programs_are_found_on_the_path_as_executable_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let tool = dir.path().join("tool");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        let data = dir.path().join("data");
        std::fs::write(&data, "").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = format!("relative/dir:{}", dir.path().display());
        assert_eq!(find_program("tool", &path, dir.path()), Some(tool.clone()));
        assert_eq!(find_program("data", &path, dir.path()), None, "not executable");
        assert_eq!(find_program("cd", "/nonexistent", dir.path()), None, "a builtin stays with the shell");
        assert_eq!(find_program("./tool", "", dir.path()), Some(dir.path().join("./tool")));
    }
}
