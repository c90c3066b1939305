//! The connection loop: accepts connections (plain or TLS), serves each with hyper, and bounds
//! what a client can hold.
//!
//! axum's own `serve` holds an idle or half-sent connection for ever, before any token is
//! checked: a few hundred of them exhausted a 256-descriptor limit and took health checks and
//! result seals down with them. Here every connection has a header-read timeout (hyper's timer,
//! which also bounds how long an idle keep-alive connection waits for its next request), the
//! number of open connections is capped in total and per client address, and the process
//! raises its descriptor limit to the hard limit at start-up. Long polls and event streams are
//! unaffected: their headers were read long before they wait.

use axum::serve::Listener;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;

/// What one client may hold.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// A request's headers must arrive within this; an idle keep-alive connection is closed
    /// after it.
    pub header_timeout: Duration,
    /// Open connections at most; past it, new ones wait in the listen backlog.
    pub max_connections: usize,
    /// Open connections per client address at most; past it, new ones are closed at once.
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

/// Open connections per address, for the per-address cap.
#[derive(Default)]
struct PerAddress {
    open: Mutex<HashMap<IpAddr, usize>>,
}

struct AddressSlot {
    table: Arc<PerAddress>,
    address: IpAddr,
}

impl PerAddress {
    fn take(self: &Arc<Self>, address: IpAddr, limit: usize) -> Option<AddressSlot> {
        let mut open = self.open.lock().ok()?;
        let count = open.entry(address).or_insert(0);
        if *count >= limit {
            return None;
        }
        *count += 1;
        Some(AddressSlot { table: self.clone(), address })
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        if let Ok(mut open) = self.table.open.lock() {
            if let Some(count) = open.get_mut(&self.address) {
                *count -= 1;
                if *count == 0 {
                    open.remove(&self.address);
                }
            }
        }
    }
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
    let connections = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let per_address = Arc::new(PerAddress::default());
    let service = TowerToHyperService::new(router);
    tokio::pin!(shutdown);
    let mut warned_full = false;
    loop {
        let permit = tokio::select! {
            permit = connections.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            _ = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = &mut shutdown => break,
        };
        let slot = match peer.ip() {
            Some(address) => match per_address.take(address, limits.max_per_address) {
                Some(slot) => Some(slot),
                None => {
                    if !warned_full {
                        tracing::warn!(%address, limit = limits.max_per_address, "a client holds too many connections; closing new ones");
                        warned_full = true;
                    }
                    continue;
                }
            },
            None => None,
        };
        if connections.available_permits() == 0 && !warned_full {
            tracing::warn!(limit = limits.max_connections, "the server holds its most connections; new ones wait");
            warned_full = true;
        }
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service.clone()).into_owned();
        let watched = graceful.watch(connection);
        tokio::spawn(async move {
            // Errors here are a client's broken or timed-out connection: nothing to report.
            let _ = watched.await;
            drop((permit, slot));
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
