//! The servers one client talks to: the URLs it was given (`--url a,b,c`, replicas of one
//! queue), and the one that answered last, where every request starts ("sticky").
//!
//! Whether a failed try goes on to the next server is decided here, from how it failed and
//! whether sending the request twice is harmless: a request that never left (connection
//! refused, DNS, TLS) or that a server answered with 5xx goes to the next one; a request that
//! left but got no answer is sent again only when its method is idempotent, since the first
//! server may have applied it (a sweep submitted twice is two sweeps). The caller's own retry
//! then starts at the next server, because the silent one is no longer the current one.

use reqwest::Method;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The URLs in the order given and the index of the one requests start at.
#[derive(Debug)]
pub struct Servers {
    urls: Vec<String>,
    current: AtomicUsize,
}

/// How one try at one server failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TryFailure {
    /// The request never left: connection refused, no route, DNS, TLS handshake.
    NotSent,
    /// The request left, but no (whole) answer came: reset, timeout.
    NoAnswer,
    /// The server answered with this 5xx status.
    ServerError(u16),
}

/// Whether a request may be sent to another server after one may have applied it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// Its body cannot be made twice (a streamed file): the caller's retry sends it again.
    Never,
    /// As its method says: GET, HEAD, PUT, DELETE and OPTIONS are idempotent.
    ByMethod,
    /// Fenced by the attempt it reports on: a second copy changes nothing (a worker's finish).
    Fenced,
}

/// Whether a request that failed this way should be sent to the next server now.
pub fn try_next(failure: TryFailure, method: &Method, replay: Replay) -> bool {
    let idempotent = match replay {
        Replay::Never => return false,
        Replay::Fenced => true,
        Replay::ByMethod => {
            matches!(*method, Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::OPTIONS)
        }
    };
    match failure {
        TryFailure::NotSent => true,
        // A gateway that timed out may have passed the request on: like no answer.
        TryFailure::ServerError(504) => idempotent,
        TryFailure::ServerError(_) => true,
        TryFailure::NoAnswer => idempotent,
    }
}

impl Servers {
    /// `list` is one URL or several separated by commas; each must be http:// or https://.
    /// Trailing slashes go; a URL listed twice is kept once.
    pub fn parse(list: &str) -> Result<Servers, String> {
        let mut urls: Vec<String> = Vec::new();
        for entry in list.split(',') {
            let url = entry.trim().trim_end_matches('/');
            if url.is_empty() {
                return Err(format!("the server URL list `{list}` has an empty entry"));
            }
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!("server URL `{}` must start with http:// or https://", entry.trim()));
            }
            if !urls.iter().any(|known| known == url) {
                urls.push(url.to_string());
            }
        }
        Ok(Servers { urls, current: AtomicUsize::new(0) })
    }

    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    pub fn url(&self, index: usize) -> &str {
        &self.urls[index]
    }

    /// The server requests start at: the one that answered last.
    pub fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed).min(self.urls.len() - 1)
    }

    /// The order of one request's tries: the current server, then the others as listed.
    pub fn order(&self) -> Vec<usize> {
        let first = self.current();
        std::iter::once(first).chain((0..self.urls.len()).filter(|index| *index != first)).collect()
    }

    /// Server `index` answered: later requests start there.
    pub fn answered(&self, index: usize) {
        self.current.store(index, Ordering::Relaxed);
    }

    /// Server `index` left a request unanswered: unless another request moved on already,
    /// later requests start at the next one.
    pub fn failed(&self, index: usize) {
        let next = (index + 1) % self.urls.len();
        let _ = self.current.compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_is_split_trimmed_and_checked() {
        let servers = Servers::parse(" http://a:8000/ ,https://b,http://a:8000").unwrap();
        assert_eq!(servers.urls(), ["http://a:8000", "https://b"]);
        assert_eq!(
            Servers::parse("http://a,,http://b").unwrap_err(),
            "the server URL list `http://a,,http://b` has an empty entry"
        );
        assert_eq!(
            Servers::parse("http://a,b:8000").unwrap_err(),
            "server URL `b:8000` must start with http:// or https://"
        );
        assert!(Servers::parse("").is_err());
    }

    #[test]
    fn requests_start_at_the_server_that_answered_then_go_in_the_order_given() {
        let servers = Servers::parse("http://a,http://b,http://c").unwrap();
        assert_eq!(servers.order(), [0, 1, 2]);
        servers.answered(2);
        assert_eq!(servers.order(), [2, 0, 1]);
        servers.failed(2);
        assert_eq!(servers.order(), [0, 1, 2]);
        // A failure seen late, after another request moved on, changes nothing.
        servers.answered(1);
        servers.failed(0);
        assert_eq!(servers.current(), 1);
    }

    #[test]
    fn only_requests_that_cannot_have_been_applied_are_sent_again() {
        for method in [Method::GET, Method::POST, Method::PUT] {
            assert!(try_next(TryFailure::NotSent, &method, Replay::ByMethod), "{method}");
            assert!(try_next(TryFailure::ServerError(503), &method, Replay::ByMethod), "{method}");
            assert!(try_next(TryFailure::ServerError(500), &method, Replay::ByMethod), "{method}");
        }
        assert!(try_next(TryFailure::NoAnswer, &Method::GET, Replay::ByMethod));
        assert!(!try_next(TryFailure::NoAnswer, &Method::POST, Replay::ByMethod));
        assert!(!try_next(TryFailure::ServerError(504), &Method::POST, Replay::ByMethod));
        assert!(try_next(TryFailure::ServerError(504), &Method::DELETE, Replay::ByMethod));
        // A fenced report goes on after no answer (a second copy changes nothing); a streamed
        // body never does.
        assert!(try_next(TryFailure::NoAnswer, &Method::POST, Replay::Fenced));
        assert!(!try_next(TryFailure::NotSent, &Method::GET, Replay::Never));
    }
}
