//! Worker sessions: each registration gets a random secret, and every later request of that
//! worker proves itself with it (`SESSION_HEADER`), naming also the server instance it
//! registered with (`INSTANCE_HEADER`).
//!
//! This is what keeps a server restarted on a new, empty database (whose job ids start at 1
//! again) from taking an old worker's report for one of its own jobs, and what keeps a holder
//! of the shared worker token from acting as another worker. Secrets are kept as SHA-256
//! digests (in the database, cached in memory) and compared in constant time.

use super::Queue;
use crate::db;
use crate::error::{ApiError, ApiResult};
use sha2::{Digest, Sha256};
use shared::api::WorkerId;
use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;

/// How long a replica on a shared database (PostgreSQL) trusts a session digest it read or
/// made before reading it again: a registration on another replica replaces the secret there,
/// and the old one is refused here at most this long after. Reading it on every request was a
/// round trip to the database per request, a sixth of the claim+finish throughput.
pub const SHARED_SESSION_TTL: Duration = Duration::from_secs(1);

/// Digests of the current sessions, by worker, with when each was read.
#[derive(Default)]
pub struct Sessions {
    known: RwLock<HashMap<WorkerId, ([u8; 32], Instant)>>,
}

pub fn digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// 32 random bytes as hex: a session secret or an instance id.
pub fn random_hex() -> ApiResult<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|error| anyhow::anyhow!("no randomness for a session secret: {error}"))?;
    Ok(hex::encode(bytes))
}

/// A session as it arrives: `<worker id>:<secret>`.
pub fn parse_session(header: &str) -> Option<(WorkerId, &str)> {
    let (id, secret) = header.split_once(':')?;
    Some((id.trim().parse().ok()?, secret.trim()))
}

fn unknown_session(worker: WorkerId) -> ApiError {
    ApiError::Unauthorized(format!(
        "worker {worker} has no such session here (it registered again, or this server's database is new): \
         register again"
    ))
}

impl Sessions {
    pub fn remember(&self, worker: WorkerId, secret_digest: [u8; 32]) {
        if let Ok(mut known) = self.known.write() {
            known.insert(worker, (secret_digest, Instant::now()));
        }
    }

    /// The digest known for `worker`, if it was read less than `ttl` ago (`None`: forever).
    fn cached(&self, worker: WorkerId, ttl: Option<Duration>) -> Option<[u8; 32]> {
        let (digest, read_at) = self.known.read().ok()?.get(&worker).copied()?;
        ttl.is_none_or(|ttl| read_at.elapsed() < ttl).then_some(digest)
    }
}

impl Queue {
    /// The worker a request comes from, proven by its session header; 401 when the session is
    /// unknown here or the worker registered with another server instance.
    pub async fn authenticate(&self, session: Option<&str>, instance: Option<&str>) -> ApiResult<WorkerId> {
        let Some((worker, secret)) = session.and_then(parse_session) else {
            return Err(ApiError::Unauthorized(format!(
                "worker requests need the `{}` header from registration (`<worker id>:<secret>`); register first",
                shared::api::SESSION_HEADER
            )));
        };
        if let Some(instance) = instance.filter(|instance| *instance != self.instance) {
            return Err(ApiError::Unauthorized(format!(
                "this server is instance {}, not the instance {instance} worker {worker} registered with (the \
                 server's database was replaced): register again",
                self.instance
            )));
        }
        // Replicas do not see each other's registrations: on a shared database a digest is
        // trusted for `SHARED_SESSION_TTL`, then read again (so a secret a registration
        // elsewhere replaced is refused here too), and a secret that does not match it is
        // looked up before it is refused (it may be the new one). On SQLite every
        // registration goes through this server, and what it remembers is exact.
        let shared = self.db().engine() == crate::db::backend::Engine::Postgres;
        let proves = |expected: &[u8; 32]| bool::from(digest(secret).ct_eq(expected));
        match self.sessions.cached(worker, shared.then_some(SHARED_SESSION_TTL)) {
            Some(known) if proves(&known) => return Ok(worker),
            Some(_) if !shared => return Err(unknown_session(worker)),
            _ => {}
        }
        let stored = db::workers::session_hash(self.reader(), worker).await?.ok_or_else(|| unknown_session(worker))?;
        let mut known = [0u8; 32];
        hex::decode_to_slice(&stored, &mut known).map_err(|_| unknown_session(worker))?;
        self.sessions.remember(worker, known);
        match proves(&known) {
            true => Ok(worker),
            false => Err(unknown_session(worker)),
        }
    }

    /// This server's instance id.
    pub fn instance(&self) -> &str {
        &self.instance
    }
}

/// A request naming a worker other than the one its session proves: refused.
pub fn same_worker(session: WorkerId, named: WorkerId) -> ApiResult<()> {
    if session == named {
        Ok(())
    } else {
        Err(ApiError::Forbidden(format!(
            "this request speaks for worker {named}, but its session is worker {session}'s"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_parse_as_id_and_secret() {
        assert_eq!(parse_session("12:abc"), Some((WorkerId::new(12), "abc")));
        assert_eq!(parse_session("x:abc"), None);
        assert_eq!(parse_session("12abc"), None);
        assert_eq!(random_hex().unwrap().len(), 64);
        assert_ne!(random_hex().unwrap(), random_hex().unwrap());
    }

    #[test]
    fn a_digest_is_trusted_for_its_time_to_live_only() {
        let sessions = Sessions::default();
        let worker = WorkerId::new(3);
        assert_eq!(sessions.cached(worker, None), None);
        sessions.remember(worker, digest("a"));
        assert_eq!(sessions.cached(worker, None), Some(digest("a")));
        assert_eq!(sessions.cached(worker, Some(Duration::from_secs(60))), Some(digest("a")));
        assert_eq!(sessions.cached(worker, Some(Duration::ZERO)), None, "read again once its time is up");
    }
}
