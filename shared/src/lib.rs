//! Wire contract and pure domain logic of `app`.
//!
//! Everything here is deterministic and free of I/O: sweep expansion ([`sweep`]), the job
//! state machine ([`job`]), the request and response types of the HTTP API ([`api`]) and
//! small value types ([`size`]). The server, the worker and the CLI all depend on this crate,
//! so a change to the protocol shows up as a compile error on both sides.

pub mod api;
pub mod backfill;
pub mod capabilities;
pub mod checkpoint_wait;
pub mod dotted;
pub mod drain;
pub mod fair_share;
pub mod history;
pub mod job;
pub mod metric_check;
pub mod metric_pattern;
pub mod names;
pub mod placement;
pub mod preemption;
pub mod search;
pub mod size;
pub mod sweep;
pub mod waiting;

/// Bumped whenever a request or response type changes incompatibly.
pub const PROTOCOL_VERSION: u32 = 3;
