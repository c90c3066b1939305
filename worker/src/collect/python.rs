//! The Python side of capture: a `sitecustomize` and the package `_app_capture`, written once
//! by the worker into `<work_dir>/capture/python/` and put first on a job's `PYTHONPATH`.
//! `import wandb` in a job then mirrors every `wandb.log` row into `APP_METRICS_FILE` (the real
//! package when it is installed, offline unless W&B credentials are there; else a small
//! built-in one). The Python files say how; this module only ships them.

use std::path::{Path, PathBuf};

/// The files, by path relative to the capture directory, as built into the binary.
const FILES: [(&str, &str); 10] = [
    ("sitecustomize.py", include_str!("../../python/sitecustomize.py")),
    ("_app_capture/__init__.py", include_str!("../../python/_app_capture/__init__.py")),
    ("_app_capture/builtin_config.py", include_str!("../../python/_app_capture/builtin_config.py")),
    ("_app_capture/hooks.py", include_str!("../../python/_app_capture/hooks.py")),
    ("_app_capture/metrics_file.py", include_str!("../../python/_app_capture/metrics_file.py")),
    ("_app_capture/noop.py", include_str!("../../python/_app_capture/noop.py")),
    ("_app_capture/params.py", include_str!("../../python/_app_capture/params.py")),
    ("_app_capture/real_wandb.py", include_str!("../../python/_app_capture/real_wandb.py")),
    ("_app_capture/steps.py", include_str!("../../python/_app_capture/steps.py")),
    ("_app_capture/wandb_builtin.py", include_str!("../../python/_app_capture/wandb_builtin.py")),
];

/// Writes the files under `work_dir` (where they differ from what is there) and returns the
/// directory to put on `PYTHONPATH`.
pub fn install(work_dir: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let dir = work_dir.join("capture").join("python");
    for (name, text) in FILES {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
            // A `run_as` job's user reads them too.
            std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755))?;
        }
        if std::fs::read(&path).ok().as_deref() != Some(text.as_bytes()) {
            let staged = path.with_extension("tmp");
            std::fs::write(&staged, text)?;
            std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o644))?;
            std::fs::rename(&staged, &path)?;
        }
    }
    for dir in [work_dir.join("capture"), dir.clone()] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(dir)
}

/// `PYTHONPATH` for a job: the capture directory first, then what the job would have had
/// (its sweep's `env:` value, else the worker's own).
pub fn pythonpath(dir: &Path, own: Option<&str>) -> (String, String) {
    let dir = dir.to_string_lossy();
    let value = match own.filter(|own| !own.is_empty()) {
        Some(own) => format!("{dir}:{own}"),
        None => dir.into_owned(),
    };
    ("PYTHONPATH".to_string(), value)
}

#[cfg(test)]
mod tests {
    /// The Python side's own suite (`worker/python/test_capture.py`): W&B's step rules, the
    /// built-in module, the chained `sitecustomize`, capture failing safely, and the real
    /// `wandb` package (offline) from `.venv-torch` when it is there.
    #[test]
    fn the_python_capture_passes_its_own_suite() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut command = std::process::Command::new("python3");
        command.arg(root.join("python/test_capture.py"));
        let real = root.join("../.venv-torch/bin/python");
        if real.exists() {
            command.env("APP_TEST_REAL_WANDB_PYTHON", real);
        }
        let output = command.output().expect("python3 runs");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    }

    #[test]
    fn the_files_are_written_once_readable_by_everyone_and_put_first_on_the_path() {
        use std::os::unix::fs::PermissionsExt;
        let work = tempfile::tempdir().unwrap();
        let dir = super::install(work.path()).unwrap();
        let site = dir.join("sitecustomize.py");
        assert_eq!(std::fs::metadata(&site).unwrap().permissions().mode() & 0o777, 0o644);
        let written = std::fs::metadata(&site).unwrap().modified().unwrap();
        super::install(work.path()).unwrap();
        assert_eq!(std::fs::metadata(&site).unwrap().modified().unwrap(), written, "unchanged files are left alone");
        let (name, value) = super::pythonpath(&dir, Some("/opt/lib"));
        assert_eq!((name.as_str(), value), ("PYTHONPATH", format!("{}:/opt/lib", dir.display())));
        assert_eq!(super::pythonpath(&dir, Some("")).1, dir.display().to_string());
    }
}
