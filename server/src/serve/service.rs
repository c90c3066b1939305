//! The router as one connection's hyper service: each request is counted on the connection's
//! [`Tracker`] until its answer is done, and its body must keep arriving.
//!
//! A request body that stops arriving for `body_idle` is cut with an error (the handler then
//! answers 400), so a client that sends `Content-Length: 100` and nothing else does not hold
//! a handler for ever. Each piece that arrives starts the time again, so a streamed upload
//! goes on at any speed that moves at all.

use super::tracker::{BodyGuard, RequestGuard, Tracker};
use axum::body::Bytes;
use axum::Router;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::{Request, Response};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The router serving one connection.
#[derive(Clone)]
pub struct Tracked {
    pub router: Router,
    pub tracker: Arc<Tracker>,
    pub body_idle: Duration,
}

impl hyper::service::Service<Request<Incoming>> for Tracked {
    type Response = Response<Answer>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Answer>, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let mut request_guard = self.tracker.begin_request();
        let body_guard = (!request.body().is_end_stream()).then(|| self.tracker.body_opened());
        let body_idle = self.body_idle;
        let request = request.map(|inner| Arriving { inner, body_idle, stall: None, guard: body_guard, failed: false });
        let answered = tower_service::Service::call(&mut self.router.clone(), request);
        Box::pin(async move {
            let response = answered.await?;
            let ok = response.status().is_success() || response.status().is_redirection();
            if ok && response.extensions().get::<Authenticated>().is_some() {
                request_guard.authenticated();
            }
            let waiting = request_guard.tracker().answering();
            Ok(response.map(|body| Answer { body, waiting, request: request_guard }))
        })
    }
}

/// A request body that must keep arriving.
pub struct Arriving {
    inner: Incoming,
    body_idle: Duration,
    stall: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Held until the body has fully arrived.
    guard: Option<BodyGuard>,
    failed: bool,
}

/// Why a request body was cut.
#[derive(Debug)]
pub struct BodyStalled(Duration);

impl std::fmt::Display for BodyStalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the request body stopped arriving for {} s", self.0.as_secs_f64())
    }
}

impl std::error::Error for BodyStalled {}

impl Body for Arriving {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.failed {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            this.stall = None;
            if frame.is_none() || this.inner.is_end_stream() {
                this.guard = None;
            } else if let Some(guard) = &this.guard {
                guard.progress();
            }
            return Poll::Ready(frame.map(|frame| frame.map_err(BoxError::from)));
        }
        let limit = this.body_idle;
        let stall = this.stall.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match stall.as_mut().poll(cx) {
            Poll::Ready(()) => {
                this.failed = true;
                this.guard = None;
                Poll::Ready(Some(Err(Box::new(BodyStalled(limit)))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Set on a response by the auth layer when its request was one of a known client (a valid
/// token, or a server without tokens): its connection then counts as used (see `tracker`).
#[derive(Debug, Clone, Copy)]
pub struct Authenticated;

/// A response body that keeps its request counted as in flight until it is done or dropped,
/// and says since when hyper has not come back for its next piece (`waiting`, ms; 0 while the
/// body itself has nothing to give, as an event stream between events).
pub struct Answer {
    body: axum::body::Body,
    waiting: Arc<AtomicU64>,
    request: RequestGuard,
}

impl Body for Answer {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        self.waiting.store(0, Ordering::Release);
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = &polled {
            // Handed a piece to hyper: until it asks for the next, the client holds us up.
            let now = self.request.tracker().now().max(1);
            self.waiting.store(now, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
