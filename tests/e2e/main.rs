//! The end-to-end suites in one test binary: the real `app` binary as server and worker
//! processes on loopback (testkit::process), one module per subject.

mod auth;
mod browser;
mod capture;
mod checkpoints;
mod cli;
mod cli_queue;
mod code;
mod confinement;
mod environment;
mod fail_fast;
mod faults;
mod gpu;
mod integrity;
mod ops;
mod preemption;
mod quickstart;
mod replicas;
mod scheduler;
mod search;
mod shares;
mod train;
mod train_resume;
mod worker;
