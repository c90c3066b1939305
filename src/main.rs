//! `app`: a distributed experiment queue for GPU sweeps. This file only parses the command
//! line, sets up logging and hands over to `cli`.

use app::cli;
use clap::Parser;
use std::process::ExitCode;

/// mimalloc rather than glibc's malloc: the server's writer thread allocates and frees on every
/// statement, and its memory is freed on the runtime's threads (and theirs on it). glibc then
/// makes the writer wait on its arena's lock: 3,450 sleeps in malloc and free in 3 s of claims,
/// and SQLite's claim+finish 15% slower (docs/decisions/0070).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    cli::init_tracing(&args);
    if args.command.is_none() {
        // Before any thread: what keeps the tokens out of the jobs' reach (cli::secrets, which
        // may start the binary again, and worker::hardening).
        cli::secrets::take_out_of_environment();
        worker::hardening::keep_credentials_from_jobs(!args.serve.server_only);
    }
    // The worker daemon alone waits on its jobs, the server and a few files: one thread does
    // that, and a short job's cost on a worker was mostly hand-offs between the runtime's
    // threads (2,000 `true` jobs: CPU per job 0.94 -> 0.72 ms). Its blocking work (hashing,
    // packing, unpacking) runs on the blocking pool either way.
    let mut builder = match args.command.is_none() && args.serve.client_only {
        true => tokio::runtime::Builder::new_current_thread(),
        false => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: starting the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        // `app status | head` closed our stdout: not an error worth a message.
        Err(error) if is_broken_pipe(&error) => ExitCode::SUCCESS,
        Err(error) => {
            // One line, the whole chain of causes, no backtrace.
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
