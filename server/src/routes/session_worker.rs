//! The worker a request comes from, as its session header proves it (see `queue::sessions`).
//! Every endpoint a worker calls after registering takes this, and checks that whatever
//! worker the request names is that one.

use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use shared::api::{WorkerId, INSTANCE_HEADER, SESSION_HEADER};

pub struct SessionWorker(pub WorkerId);

impl SessionWorker {
    /// Refuses a request that speaks for another worker than its session's.
    pub fn check(&self, named: WorkerId) -> Result<WorkerId, ApiError> {
        crate::queue::same_worker(self.0, named).map(|()| self.0)
    }
}

impl FromRequestParts<AppState> for SessionWorker {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let header = |name: &str| parts.headers.get(name).and_then(|value| value.to_str().ok());
        state.queue.authenticate(header(SESSION_HEADER), header(INSTANCE_HEADER)).await.map(SessionWorker)
    }
}
