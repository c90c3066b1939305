//! What every handler shares: the queue service and the settings.

use crate::config::ServerConfig;
use crate::queue::Queue;
use std::sync::Arc;
use tokio::sync::watch;

#[derive(Clone)]
pub struct AppState {
    pub queue: Arc<Queue>,
    pub config: Arc<ServerConfig>,
    /// Turns true when the server shuts down, so streams end instead of holding it open.
    pub shutting_down: watch::Receiver<bool>,
}
