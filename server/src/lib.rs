//! The head node of `app`: the HTTP API over the job queue, kept in SQLite or PostgreSQL.
//!
//! [`run`] serves on a listener the caller bound (port 0 works) until the shutdown future
//! completes. Only this crate touches the database, and only through [`db`].

pub mod auth;
pub mod config;
mod data_owner;
pub mod db;
mod error;
mod leaderboard;
pub mod queue;
mod reaper;
mod routes;
mod serve;
mod startup;
mod state;
mod storage;
mod tls;

pub use config::ServerConfig;
pub use startup::run;
