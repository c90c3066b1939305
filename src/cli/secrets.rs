//! The credentials a serving `app` takes from its environment, kept out of it.
//!
//! `/proc/<pid>/environ` is the environment the process was started with, and on the kernels
//! we run on it stays readable by every process of the same user even once the process is
//! non-dumpable (its memory does not). A job of a worker started as `APP_TOKEN=... app
//! --client-only` printed the token with `cat /proc/$PPID/environ`. So a serving `app` that
//! finds a credential in its environment starts itself again (same program, arguments and
//! environment, less the credentials), handing them over in an anonymous in-memory file;
//! the new image reads them back from there and never has them in its environment.

use std::sync::OnceLock;

/// The variables that may carry a credential (a database URL may hold a password).
const SECRET_VARIABLES: [&str; 4] = ["APP_TOKEN", "APP_USER_TOKEN", "APP_WORKER_TOKEN", "APP_DATABASE_URL"];
/// Names the inherited descriptor the credentials were handed over in.
const HANDOVER: &str = "APP_SECRETS_FD";

/// The credentials handed over by the image before, or left in the environment.
static HANDED: OnceLock<Vec<(String, String)>> = OnceLock::new();

/// A serving process's credentials out of its environment: in the process a user started,
/// starts the binary again without them (this returns only if that fails); in the one started
/// again, reads them back. Call before any thread starts and before anything reads them.
pub fn take_out_of_environment() {
    if let Some(fd) = std::env::var(HANDOVER).ok().and_then(|fd| fd.parse::<i32>().ok()) {
        let _ = HANDED.set(read_handover(fd));
        return;
    }
    let secrets: Vec<(String, String)> =
        SECRET_VARIABLES.iter().filter_map(|name| Some((name.to_string(), std::env::var(name).ok()?))).collect();
    if !secrets.is_empty() {
        let error = start_again_without(&secrets);
        tracing::warn!(%error, "cannot start again without the credentials in the environment: jobs of this user can read them from /proc");
    }
    let _ = HANDED.set(Vec::new());
}

/// The value of variable `name`: handed over, or from the environment.
pub fn variable(name: &str) -> Option<String> {
    let handed = HANDED.get().and_then(|handed| handed.iter().find(|(key, _)| key == name));
    handed.map(|(_, value)| value.clone()).or_else(|| std::env::var(name).ok())
}

/// Writes `secrets` into a memory file the next image inherits and replaces this process with
/// it; returns only on failure.
fn start_again_without(secrets: &[(String, String)]) -> std::io::Error {
    use std::io::{Seek, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    // No close-on-exec: the next image inherits it.
    let memory = match nix::sys::memfd::memfd_create(c"app-secrets", nix::sys::memfd::MemFdCreateFlag::empty()) {
        Ok(memory) => memory,
        Err(error) => return error.into(),
    };
    let number = memory.as_raw_fd();
    let mut file = std::fs::File::from(memory);
    let mut bytes = Vec::new();
    for (name, value) in secrets {
        bytes.extend_from_slice(name.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(value.as_bytes());
        bytes.push(0);
    }
    if let Err(error) = file.write_all(&bytes).and_then(|()| file.rewind()) {
        return error;
    }
    let mut arguments = std::env::args_os();
    let mut again = std::process::Command::new("/proc/self/exe");
    if let Some(name) = arguments.next() {
        again.arg0(name);
    }
    again.args(arguments).env(HANDOVER, number.to_string());
    for (name, _) in secrets {
        again.env_remove(name);
    }
    let error = again.exec();
    drop(file);
    error
}

/// The credentials in the inherited memory file `fd` (opened by its /proc name, then closed).
fn read_handover(fd: i32) -> Vec<(String, String)> {
    let bytes = std::fs::read(format!("/proc/self/fd/{fd}")).unwrap_or_default();
    let _ = nix::unistd::close(fd);
    let mut fields = bytes.split(|byte| *byte == 0).map(|field| String::from_utf8_lossy(field).into_owned());
    let mut handed = Vec::new();
    while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
        if SECRET_VARIABLES.contains(&name.as_str()) {
            handed.push((name, value));
        }
    }
    handed
}
