//! The `app` command line as a library: the binary (src/main.rs) is a thin `main` around it,
//! and the maintainers' benchmarks (bench/, the `app-bench` binary, not shipped) link it to
//! measure the same code paths (code shipping's `cli::snapshot`).

pub mod cli;
