//! Integration tests of the server: each starts the real server on 127.0.0.1:0 with a
//! temporary data directory and drives it through the same typed client the worker uses.

mod analysis;
mod auth;
mod bad_input;
mod claims;
mod code;
mod data_dir;
mod fail_fast;
mod finish;
mod lifecycle;
mod logs;
mod maintenance;
mod metric_missing;
mod metrics;
mod names;
mod owners;
mod page;
mod preemption;
mod results;
mod search;
mod sessions;
mod shares;
mod submit;
mod summary;
mod upkeep;
