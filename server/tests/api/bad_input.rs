//! Refused requests: each answers with a clear status and message, and leaves the queue as it
//! was; the server keeps serving.

use client::ClientError;
use shared::api::{JobQuery, ReportRequest, SubmitQuery};
use shared::job::Outcome;
use std::time::{Duration, Instant};
use testkit::{sweep_of, TestApp};

/// Submits `yaml`, expects a 400, and checks nothing was stored.
async fn refused(app: &TestApp, yaml: &str) -> String {
    let error = app.client.submit(yaml, &SubmitQuery::default()).await.unwrap_err();
    assert_eq!(error.status(), Some(400), "{error}");
    assert!(app.client.sweeps().await.unwrap().is_empty(), "a refused sweep left a row behind");
    assert_eq!(app.client.jobs(&JobQuery::default()).await.unwrap().total, 0);
    error.to_string()
}

#[tokio::test]
async fn malformed_yaml_is_a_400_with_line_and_column() {
    let app = TestApp::spawn().await;
    let message = refused(&app, "name: x\ncommand: \"true\"\ngrid:\n  lr: [0.1, 0.2\n  bs: 3\n").await;
    assert!(message.contains("line") && message.contains("column"), "{message}");
}

#[tokio::test]
async fn sweep_errors_name_the_key_path() {
    let app = TestApp::spawn().await;
    let cases = [
        ("command: \"true\"\ngird:\n  lr: [1]\n", "gird"),
        ("command: \"true\"\ngrid:\n  lr: []\n", "grid.lr"),
        ("command: \"true\"\ngrid:\n  lr: 0.1\n", "grid.lr"),
        (
            "method: random\nrun_cap: 3\nprogram: t.py\nparameters:\n  lr: {distribution: uniform, min: 1, max: 0}\n",
            "parameters.lr",
        ),
        ("method: grid\nprogram: t.py\nparameters:\n  lr: {distribution: uniform, min: 0, max: 1}\n", "parameters.lr"),
        ("name: ../../etc\ncommand: \"true\"\n", "../../etc"),
    ];
    for (yaml, path) in cases {
        let message = refused(&app, yaml).await;
        assert!(message.contains(path), "error for {yaml:?} should name `{path}`: {message}");
    }
}

#[tokio::test]
async fn an_over_large_grid_is_refused_at_once_with_the_count_and_the_limit() {
    let app = TestApp::spawn().await;
    let axis = (0..100).map(|i| i.to_string()).collect::<Vec<_>>().join(", ");
    let yaml = format!(
        "command: \"true\"\ngrid:\n  a: [{axis}]\n  b: [{axis}]\n  c: [{axis}]\n  d: [{axis}]\n  e: [{axis}]\n"
    );
    let started = Instant::now();
    let message = refused(&app, &yaml).await;
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    assert!(message.contains("10000000000") && message.contains("100000"), "{message}");
}

#[tokio::test]
async fn a_body_over_the_limit_is_a_413() {
    let app = TestApp::spawn_with(|config| config.max_body_bytes = 1024).await;
    let error = app.client.submit(&sweep_of("big", 400), &SubmitQuery::default()).await.unwrap_err();
    assert_eq!(error.status(), Some(413), "{error}");
    assert!(app.client.sweeps().await.unwrap().is_empty());
}

#[tokio::test]
async fn unknown_ids_are_404_and_illegal_transitions_are_409() {
    let app = TestApp::spawn().await;
    assert_eq!(app.client.job(4242.into()).await.unwrap_err().status(), Some(404));
    assert_eq!(app.client.sweep("nope").await.unwrap_err().status(), Some(404));
    assert_eq!(app.client.cancel_job(4242.into()).await.unwrap_err().status(), Some(404));
    assert_eq!(app.client.cancel_sweep("nope").await.unwrap_err().status(), Some(404));
    app.submit(&sweep_of("t", 2)).await;
    let worker = app.register("w", 1).await;
    let job = app.claim(worker, 1).await.pop().unwrap();
    let done = ReportRequest { worker_id: worker, attempt: job.attempt, outcome: Outcome::Exited { code: 0 } };
    app.client.report(job.id, &done).await.unwrap();
    let cancel_done = app.client.cancel_job(job.id).await.unwrap_err();
    assert_eq!(cancel_done.status(), Some(409));
    assert!(cancel_done.to_string().contains("succeeded"), "{cancel_done}");
    assert_eq!(app.client.retry_job(job.id).await.unwrap_err().status(), Some(409));
    // Report on a cancelled job.
    let other = app.claim(worker, 1).await.pop().unwrap();
    app.client.cancel_job(other.id).await.unwrap();
    let killed =
        ReportRequest { worker_id: worker, attempt: other.attempt, outcome: Outcome::Killed { reason: "x".into() } };
    app.client.report(other.id, &killed).await.unwrap();
    let after_cancel = app.client.report(other.id, &done).await.unwrap_err();
    assert_eq!(after_cancel.status(), Some(409));
    assert_eq!(app.client.job(other.id).await.unwrap().status, shared::job::JobStatus::Cancelled);
}

#[tokio::test]
async fn garbage_bodies_get_json_errors_and_the_server_keeps_serving() {
    let app = TestApp::spawn().await;
    let http = reqwest::Client::new();
    let response = http
        .post(format!("{}/api/jobs/cancel", app.url))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let body: shared::api::ErrorBody = response.json().await.unwrap();
    assert!(!body.error.is_empty());
    // A worker endpoint without a session is refused before its body is read, in the same shape.
    let response = http
        .post(format!("{}/api/jobs/1/report", app.url))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    let body: shared::api::ErrorBody = response.json().await.unwrap();
    assert!(!body.error.is_empty());
    let response = http.get(format!("{}/api/jobs?status=exploded", app.url)).send().await.unwrap();
    assert_eq!(response.status(), 400);
    let response = http.get(format!("{}/api/no-such-thing", app.url)).send().await.unwrap();
    assert_eq!(response.status(), 404);
    let bad_name = shared::api::RegisterRequest {
        name: "bad name!".into(),
        protocol: shared::PROTOCOL_VERSION,
        key: None,
        capacity: Default::default(),
        holding: Vec::new(),
    };
    let error = app.client.register(&bad_name).await;
    assert!(matches!(error, Err(ClientError::Rejected { status: 400, .. })));
    assert_eq!(app.client.health().await.unwrap().status, "ok");
}

#[tokio::test]
async fn hostile_yaml_is_refused_quickly_and_the_server_keeps_serving() {
    let app = TestApp::spawn().await;
    let deep = format!("name: deep\ncommand: x\ngrid:\n  a: {}{}\n", "[".repeat(10_000), "]".repeat(10_000));
    let mut laughs =
        String::from("name: laughs\ncommand: x\na0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for level in 1..10 {
        let previous = format!("*a{}", level - 1);
        laughs.push_str(&format!("a{level}: &a{level} [{}]\n", vec![previous; 10].join(", ")));
    }
    laughs.push_str("grid:\n  x: *a9\n");
    for (yaml, needle) in [(deep, "levels deep"), (laughs, "aliases")] {
        let started = std::time::Instant::now();
        let message = refused(&app, &yaml).await;
        assert!(message.contains(needle), "{message}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "refused in {:?}", started.elapsed());
    }
    assert!(app.client.sweeps().await.unwrap().is_empty());
    app.submit(&testkit::sweep_of("after", 2)).await;
}

#[tokio::test]
async fn claims_and_heartbeats_of_an_unregistered_worker_are_401_and_change_nothing() {
    let app = TestApp::spawn().await;
    app.submit(&sweep_of("waiting", 2)).await;
    let claim = shared::api::ClaimRequest { capacity: testkit::cpu(2), wait_ms: 0, reserve: 0 };
    let error = app.client.claim(424_242.into(), &claim).await.unwrap_err();
    assert_eq!(error.status(), Some(401), "{error}");
    assert!(error.to_string().contains("register"), "{error}");
    let beat = shared::api::HeartbeatRequest { running: Vec::new(), gpus: Vec::new(), saves: Vec::new() };
    assert_eq!(app.client.heartbeat(424_242.into(), &beat).await.unwrap_err().status(), Some(401));
    let queued = JobQuery { status: Some(shared::job::JobStatus::Queued), ..JobQuery::default() };
    assert_eq!(app.client.jobs(&queued).await.unwrap().total, 2);
}

#[tokio::test]
async fn the_nesting_limit_is_a_setting() {
    let app = TestApp::spawn_with(|config| config.max_yaml_depth = 4).await;
    let nested =
        |depth: usize| format!("name: n{depth}\ncommand: x\ngrid:\n  a: {}1{}\n", "[".repeat(depth), "]".repeat(depth));
    let message = refused(&app, &nested(6)).await;
    assert!(message.contains("more than 4 levels deep"), "{message}");
    app.submit(&nested(2)).await;
    let mut config = server::ServerConfig::default();
    for bad in [0, 101] {
        let file = server::config::ServerFile { max_yaml_depth: Some(bad), ..Default::default() };
        let error = config.apply_file(&file).unwrap_err().to_string();
        assert!(error.contains("max_yaml_depth"), "{error}");
    }
}

#[tokio::test]
async fn a_bad_id_in_a_path_and_an_offset_past_every_row_answer_like_the_api_documents() {
    let app = TestApp::spawn().await;
    app.submit(&sweep_of("few", 3)).await;
    let http = reqwest::Client::new();
    for path in ["/api/jobs/abc", "/api/jobs/abc/events", "/api/jobs/1.5/attempts", "/api/workers/x/heartbeat"] {
        let method = if path.ends_with("heartbeat") { reqwest::Method::POST } else { reqwest::Method::GET };
        let response = http.request(method, format!("{}{path}", app.url)).send().await.unwrap();
        assert!(response.status().is_client_error(), "{path}: {}", response.status());
        let body: shared::api::ErrorBody = response.json().await.unwrap_or_else(|_| panic!("{path} answered no JSON"));
        assert!(!body.error.is_empty());
    }
    for offset in [1u64 << 63, u64::MAX] {
        let query = JobQuery { offset: Some(offset), ..JobQuery::default() };
        let page = app.client.jobs(&query).await.unwrap();
        assert_eq!((page.total, page.jobs.len()), (3, 0), "offset {offset}");
    }
}
