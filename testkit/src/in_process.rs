//! [`TestApp`]: the real server (the `server` library) on a loopback port in the test's own
//! runtime, reached through the typed client the worker uses.

use client::{Client, ClientOptions};
use server::ServerConfig;
use shared::api::{ClaimRequest, ClaimedJob, RegisterRequest, SubmitQuery, SubmitResponse, WorkerId};
use std::sync::Arc;
use std::time::Duration;
use tempfile::TempDir;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::{cpu, sweep_of, test_database, wait_until};

pub struct TestApp {
    pub client: Client,
    pub url: String,
    pub config: ServerConfig,
    /// Every registration made through `register`, so a restart keeps speaking for them.
    pub registered: std::sync::Mutex<Vec<shared::api::RegisterResponse>>,
    data_dir: Arc<TempDir>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

impl TestApp {
    pub async fn spawn() -> TestApp {
        Self::spawn_with(|_| {}).await
    }

    /// A server with test-friendly timings, adjusted by `tweak`.
    pub async fn spawn_with(tweak: impl FnOnce(&mut ServerConfig)) -> TestApp {
        // Server logs show up in a failing test's output (RUST_LOG=debug for more).
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
        let data_dir = Arc::new(tempfile::tempdir().expect("temp dir"));
        let mut config = ServerConfig {
            data_dir: data_dir.path().to_path_buf(),
            database_url: test_database(),
            reaper_interval: Duration::from_millis(100),
            ..ServerConfig::default()
        };
        tweak(&mut config);
        Self::start(config, data_dir, ClientOptions::default()).await
    }

    /// A server set up by `tweak` (tokens, TLS), reached by a client with `options`.
    pub async fn spawn_secure(tweak: impl FnOnce(&mut ServerConfig), options: ClientOptions) -> TestApp {
        let data_dir = Arc::new(tempfile::tempdir().expect("temp dir"));
        let mut config = ServerConfig {
            data_dir: data_dir.path().to_path_buf(),
            database_url: test_database(),
            ..ServerConfig::default()
        };
        tweak(&mut config);
        Self::start(config, data_dir, options).await
    }

    async fn start(config: ServerConfig, data_dir: Arc<TempDir>, options: ClientOptions) -> TestApp {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
        let scheme = if config.tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server::run(listener, config.clone(), async move {
            let _ = stopped.await;
        }));
        let client = Client::with_options(&url, &options).unwrap();
        let app = TestApp {
            client,
            url,
            config,
            registered: Default::default(),
            data_dir,
            stop: Some(stop),
            task: Some(task),
        };
        wait_until("the server answers /api/health", Duration::from_secs(10), || async {
            app.client.health().await.ok()
        })
        .await;
        app
    }

    /// Stops the server (as on SIGTERM) and waits until it has closed its database.
    pub async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("server task").expect("server ran cleanly");
        }
    }

    /// Stops the server and starts a new one on the same data directory (a new port).
    pub async fn restart(mut self) -> TestApp {
        self.stop().await;
        let config = self.config.clone();
        let app = Self::start(config, self.data_dir.clone(), ClientOptions::default()).await;
        let registered = std::mem::take(&mut *self.registered.lock().unwrap());
        for response in &registered {
            app.client.remember_session(response).unwrap();
        }
        *app.registered.lock().unwrap() = registered;
        app
    }

    /// The session header of a worker registered through `register`, for raw requests.
    pub fn session_of(&self, worker: WorkerId) -> String {
        let registered = self.registered.lock().unwrap();
        registered.iter().rev().find(|response| response.worker_id == worker).expect("registered here").session.clone()
    }

    /// The server's data directory.
    pub fn data_path(&self) -> &std::path::Path {
        self.data_dir.path()
    }

    pub async fn submit(&self, yaml: &str) -> SubmitResponse {
        self.client.submit(yaml, &SubmitQuery::default()).await.expect("submit")
    }

    pub async fn register(&self, name: &str, job_slots: u32) -> WorkerId {
        let request = RegisterRequest {
            name: name.into(),
            protocol: shared::PROTOCOL_VERSION,
            key: None,
            capacity: cpu(job_slots),
            holding: Vec::new(),
        };
        let response = self.client.register(&request).await.expect("register");
        self.registered.lock().unwrap().push(response.clone());
        response.worker_id
    }

    /// Submits a one-job sweep called `name` and claims it on a new worker `name-w`.
    pub async fn start_one(&self, name: &str) -> (WorkerId, ClaimedJob) {
        self.submit(&sweep_of(name, 1)).await;
        let worker = self.register(&format!("{name}-w"), 1).await;
        let job = self.claim(worker, 1).await.pop().expect("the job is claimed");
        (worker, job)
    }

    /// Claims without waiting.
    pub async fn claim(&self, worker: WorkerId, job_slots: u32) -> Vec<ClaimedJob> {
        let request = ClaimRequest { capacity: cpu(job_slots), wait_ms: 0, reserve: 0 };
        self.client.claim(worker, &request).await.expect("claim").jobs
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
