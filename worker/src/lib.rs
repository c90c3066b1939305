//! The worker daemon of `app` (`app --client-only --url URL`): registers with the server,
//! claims jobs it can place on its GPUs, runs them, streams their logs and metrics and uploads
//! their results.
//!
//! Not built yet: this crate is a placeholder so the workspace has its final shape. The
//! protocol it will speak (register, claim, heartbeat, report) is already served and tested
//! through the shared `client` crate, and the placement it will use is
//! `shared::placement::place`.
