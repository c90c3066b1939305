//! The connection loop: accepts connections (plain or TLS), serves each with hyper, and bounds
//! what a client can hold.
//!
//! A client can hold a connection without using it: send nothing, half a request head, an
//! HTTP/2 preface, or a request whose body never comes. axum's own `serve` holds those for
//! ever, before any token is checked, and hyper's header timer starts only once the protocol
//! is known, so a few hundred silent sockets once took health checks down. Here every
//! connection is tracked ([`tracker`]): one with no request in flight is closed after the
//! header timeout, whatever it sent; a body that stops arriving is cut after the body-idle
//! timeout ([`service`]); and when the server, or one client address, is at its cap, the
//! connection that has held without use the longest is evicted, so the new one is served.
//! Connections answering a request (long polls, event streams, downloads) are never cut.
//! The process raises its descriptor limit to the hard limit at start-up.

mod service;
mod tracker;

pub use service::Authenticated;

use axum::serve::Listener;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracker::Registry;

/// What one client may hold.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// A connection with no request in flight (none sent yet, half a head, a keep-alive
    /// pause) is closed after this.
    pub header_timeout: Duration,
    /// A request body that stops arriving is cut after this.
    pub body_idle_timeout: Duration,
    /// Open connections at most; past it, the one holding without use the longest is evicted
    /// (when every one is answering a request, new ones wait in the listen backlog).
    pub max_connections: usize,
    /// Connections per client address that may hold without ever having completed a request;
    /// past it, that address's oldest such connection is evicted. Connections that answered a
    /// request, or are answering one, do not count against it (hundreds of workers may share
    /// one address behind NAT or a load balancer).
    pub max_per_address: usize,
}

/// Descriptors kept for everything but connections (database, result files, logs).
const RESERVED_DESCRIPTORS: u64 = 128;

/// Raises the soft descriptor limit to the hard one; returns the limit now in force.
pub fn raise_descriptor_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else { return 1024 };
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return hard;
    }
    soft
}

/// The default cap on connections: what the descriptor limit leaves after the reserve.
pub fn default_max_connections(descriptors: u64) -> usize {
    descriptors.saturating_sub(RESERVED_DESCRIPTORS).clamp(16, 65_536) as usize
}

/// The client address of an accepted connection, when the listener knows it.
pub trait PeerAddress {
    fn ip(&self) -> Option<IpAddr>;
}

impl PeerAddress for SocketAddr {
    fn ip(&self) -> Option<IpAddr> {
        Some(SocketAddr::ip(self))
    }
}

/// Serves `router` on `listener` until `shutdown` completes, then lets the requests in flight
/// finish (graceful shutdown) and returns.
pub async fn serve<L>(mut listener: L, router: Router, limits: ConnectionLimits, shutdown: impl Future<Output = ()>)
where
    L: Listener,
    L::Addr: PeerAddress,
{
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let registry = Arc::new(Registry::default());
    let max_connections = limits.max_connections.max(1);
    let mut warnings = Warnings::default();
    tokio::pin!(shutdown);
    loop {
        // Over the cap with nothing evicted yet (every connection answering a request, or
        // holding for less than the grace): evict as soon as one may be, or wait for one to
        // close, before taking more.
        while registry.len() > max_connections {
            let closed = registry.closed.notified();
            tokio::pin!(closed);
            closed.as_mut().enable();
            if registry.len() <= max_connections {
                break;
            }
            if registry.evict_oldest(None) {
                warnings.server_at_cap(max_connections, true);
            }
            tokio::select! {
                () = closed => {}
                () = tokio::time::sleep(tracker::EVICTION_GRACE / 2) => {}
                () = &mut shutdown => return finish(listener, graceful).await,
            }
        }
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let address = peer.ip();
        if let Some(address) = address {
            if registry.count(address) >= limits.max_per_address && registry.evict_oldest(Some(address)) {
                warnings.address_at_cap(address, limits.max_per_address);
            }
        }
        if registry.len() >= max_connections {
            let evicted = registry.evict_oldest(None);
            warnings.server_at_cap(max_connections, evicted);
        }
        let tracker = registry.open(address);
        let service =
            service::Tracked { router: router.clone(), tracker: tracker.clone(), body_idle: limits.body_idle_timeout };
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned();
        let watched = graceful.watch(connection);
        let (idle_limit, stall_limit) = (limits.header_timeout, limits.body_idle_timeout);
        let closing = Closing(registry.clone(), tracker.clone());
        tokio::spawn(async move {
            // Errors here are a client's broken or timed-out connection: nothing to report.
            tokio::select! {
                _ = watched => {}
                () = tracker.expired(idle_limit, stall_limit) => {}
            }
            // The connection's entry goes when `closing` is dropped, also if a handler panicked.
            drop(closing);
        });
    }
    finish(listener, graceful).await;
}

/// Closes a connection's entry in the registry when its task ends, however it ends.
struct Closing(Arc<Registry>, Arc<tracker::Tracker>);

impl Drop for Closing {
    fn drop(&mut self) {
        self.0.close(&self.1);
    }
}

async fn finish<L>(listener: L, graceful: hyper_util::server::graceful::GracefulShutdown) {
    drop(listener);
    graceful.shutdown().await;
}

/// How often the same cap warning may be logged: once a minute per address, and once a
/// minute for the server's total.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// The caps' warnings, rate-limited per address, with what was evicted since the last one.
#[derive(Default)]
struct Warnings {
    per_address: HashMap<IpAddr, Warned>,
    total: Warned,
}

/// When a warning was last logged, and how many evictions it has not told of yet.
#[derive(Default)]
struct Warned {
    at: Option<Instant>,
    untold: u64,
}

impl Warned {
    /// Counts an eviction (when `evicted`); the evictions to tell of when a warning is due.
    fn due(&mut self, evicted: bool) -> Option<u64> {
        self.untold += u64::from(evicted);
        if self.at.is_some_and(|at| at.elapsed() < WARN_EVERY) {
            return None;
        }
        self.at = Some(Instant::now());
        Some(std::mem::take(&mut self.untold))
    }
}

impl Warnings {
    fn address_at_cap(&mut self, address: IpAddr, limit: usize) {
        if self.per_address.len() > 4096 {
            self.per_address.retain(|_, warned| warned.at.is_some_and(|at| at.elapsed() < WARN_EVERY));
        }
        if let Some(evicted) = self.per_address.entry(address).or_default().due(true) {
            tracing::warn!(%address, limit, evicted, "a client address holds its most unused connections; closing its oldest (said once a minute per address)");
        }
    }

    fn server_at_cap(&mut self, limit: usize, evicted: bool) {
        let Some(count) = self.total.due(evicted) else { return };
        if evicted {
            tracing::warn!(
                limit,
                evicted = count,
                "the server holds its most connections; closing the oldest unused ones (said once a minute)"
            );
        } else {
            tracing::warn!(
                limit,
                "the server holds its most connections, all answering requests; new ones wait (said once a minute)"
            );
        }
    }
}
