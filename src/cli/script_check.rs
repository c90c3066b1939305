//! A dry run's check of the script a sweep runs: the first word of its first job's command that
//! names a script (`train.py`, `./run.sh`), when it is missing from the code that would be
//! shipped, is a warning naming the closest file that is there (`python3 trian.py`: did you
//! mean `train.py`?). Only the first: later ones are often outputs. A command that changes
//! directory (`cd`) is not checked. Pure: the caller lists the files.

use std::path::{Component, Path, PathBuf};

/// What looks like a script a command runs (an interpreter's argument, or `./x` itself).
const SCRIPT_EXTENSIONS: [&str; 11] = ["py", "sh", "bash", "r", "R", "jl", "lua", "rb", "pl", "js", "ipynb"];

/// A warning when the script `command` runs is not among `files` (paths relative to the
/// shipped root), resolved from `start_dir` (where jobs start, relative to the root).
pub fn missing_scripts(command: &str, start_dir: &str, files: &[PathBuf]) -> Vec<String> {
    let Some(words) = shlex::split(command) else { return Vec::new() };
    if words.iter().any(|word| word == "cd" || word == "pushd") {
        return Vec::new();
    }
    let Some(word) = words.iter().find(|word| names_a_script(word)) else { return Vec::new() };
    let Some(wanted) = resolve(start_dir, word) else { return Vec::new() };
    if files.contains(&wanted) {
        return Vec::new();
    }
    let mut warning = format!("`{word}` is not in the code that would be shipped");
    if let Some(closest) = closest(&wanted, files) {
        match closest.strip_prefix(start_dir) {
            Ok(shown) => warning.push_str(&format!("; did you mean `{}`?", shown.display())),
            Err(_) => warning.push_str(&format!("; did you mean `{}` (from the project's root)?", closest.display())),
        }
    }
    vec![warning]
}

fn names_a_script(word: &str) -> bool {
    // Options, absolute or home paths, expansions, and quoted scripts (`bash -c "..."`).
    if word.starts_with(['-', '/', '~']) || word.contains(['=', '$', '{', '*']) || word.contains(char::is_whitespace) {
        return false;
    }
    let extension = Path::new(word).extension().and_then(|extension| extension.to_str());
    word.starts_with("./") || extension.is_some_and(|extension| SCRIPT_EXTENSIONS.contains(&extension))
}

/// `start_dir/word` without `.` and `..`; `None` when it climbs out of the root.
fn resolve(start_dir: &str, word: &str) -> Option<PathBuf> {
    let mut path = PathBuf::new();
    for component in Path::new(start_dir).join(word).components() {
        match component {
            Component::Normal(part) => path.push(part),
            // Climbing above the root: `None`.
            Component::ParentDir => path.pop().then_some(())?,
            _ => {}
        }
    }
    Some(path)
}

/// The shipped file most like `wanted`: same extension, file names within a few edits.
fn closest(wanted: &Path, files: &[PathBuf]) -> Option<PathBuf> {
    let name = wanted.file_name()?.to_str()?;
    let budget = (name.chars().count() / 3).max(2);
    files
        .iter()
        .filter(|file| file.extension() == wanted.extension())
        .filter_map(|file| {
            let distance = strsim::levenshtein(file.file_name()?.to_str()?, name);
            // Nearer the wanted directory first, then by edits.
            let elsewhere = usize::from(file.parent() != wanted.parent());
            (distance <= budget).then_some(((distance, elsewhere), file))
        })
        .min_by_key(|(key, _)| *key)
        .map(|(_, file)| file.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(paths: &[&str]) -> Vec<PathBuf> {
        paths.iter().map(PathBuf::from).collect()
    }

    #[test]
    fn a_misspelt_script_is_named_with_the_closest_shipped_file() {
        let shipped = files(&["train.py", "eval.py", "src/model.py", "README.md"]);
        let warnings = missing_scripts("python3 trian.py --lr 0.1", "", &shipped);
        assert_eq!(warnings, ["`trian.py` is not in the code that would be shipped; did you mean `train.py`?"]);
        assert!(missing_scripts("python3 train.py --lr 0.1 --out results.py", "", &shipped).is_empty(), "outputs");
        assert!(missing_scripts("cd exp && python3 trian.py", "", &shipped).is_empty(), "after cd: not ours to say");
        assert!(missing_scripts("python3 train.py --config=conf.py", "", &shipped).is_empty());
        assert!(missing_scripts("python3 -m pkg.train --lr {lr}", "", &shipped).is_empty(), "modules are not files");
        assert_eq!(
            missing_scripts("./nothing_like_it.sh", "", &shipped),
            ["`./nothing_like_it.sh` is not in the code that would be shipped"]
        );
    }

    #[test]
    fn scripts_are_looked_up_from_where_jobs_start() {
        let shipped = files(&["exp/train.py", "exp/run.sh", "common/util.py"]);
        assert!(missing_scripts("bash ./run.sh", "exp", &shipped).is_empty());
        assert!(missing_scripts("python train.py", "exp", &shipped).is_empty());
        assert!(missing_scripts("python ../common/util.py", "exp", &shipped).is_empty());
        let warnings = missing_scripts("python trains.py", "exp", &shipped);
        assert_eq!(warnings, ["`trains.py` is not in the code that would be shipped; did you mean `train.py`?"]);
        assert!(
            missing_scripts("python ../../outside.py", "exp", &shipped).is_empty(),
            "outside the root: not ours to say"
        );
        assert!(missing_scripts("python 'unterminated", "", &shipped).is_empty());
        assert!(missing_scripts("bash -c \"python trian.py\"", "", &shipped).is_empty(), "a quoted script: not ours");
        assert!(missing_scripts("python ~/elsewhere.py", "", &shipped).is_empty());
        let outside = missing_scripts("python utils.py", "exp", &shipped);
        assert_eq!(outside, ["`utils.py` is not in the code that would be shipped; did you mean `common/util.py` (from the project's root)?"]);
    }
}
