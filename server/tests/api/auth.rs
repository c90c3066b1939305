//! Bearer tokens with two roles, the page's cookie session, and HTTPS with a private CA.

use client::{Client, ClientOptions};
use server::auth::Role;
use server::config::TlsFiles;
use shared::api::{ClaimRequest, JobQuery, RegisterRequest, SubmitQuery};
use shared::placement::Capacity;
use testkit::{sweep_of, TestApp};

const USER: &str = "user-token-for-tests-0001";
const WORKER: &str = "worker-token-for-tests-0001";

async fn secured() -> TestApp {
    TestApp::spawn_secure(
        |config| {
            config.tokens.add(Role::User, USER, "test").unwrap();
            config.tokens.add(Role::Worker, WORKER, "test").unwrap();
        },
        ClientOptions { token: Some(USER.into()), ca_pem: None },
    )
    .await
}

fn with_token(app: &TestApp, token: Option<&str>) -> Client {
    Client::with_options(&app.url, &ClientOptions { token: token.map(Into::into), ca_pem: None }).unwrap()
}

fn register(name: &str) -> RegisterRequest {
    RegisterRequest {
        name: name.into(),
        protocol: shared::PROTOCOL_VERSION,
        key: None,
        capacity: Capacity { job_slots: 1, gpus: Vec::new(), ..Capacity::default() },
        holding: Vec::new(),
    }
}

#[tokio::test]
async fn a_missing_or_unknown_token_is_401_and_a_wrong_role_is_403() {
    let app = secured().await;
    let anonymous = with_token(&app, None);
    let error = anonymous.jobs(&JobQuery::default()).await.unwrap_err();
    assert_eq!(error.status(), Some(401), "{error}");
    assert!(error.to_string().contains("token"), "{error}");
    let raw = reqwest::get(format!("{}/api/jobs", app.url)).await.unwrap();
    assert_eq!(raw.headers()["www-authenticate"], "Bearer");
    let stranger = with_token(&app, Some("a-token-nobody-configured"));
    assert_eq!(stranger.sweeps().await.unwrap_err().status(), Some(401));

    // The user submits; the worker may not, nor cancel, nor read.
    let worker = with_token(&app, Some(WORKER));
    let refused = worker.submit(&sweep_of("nope", 1), &SubmitQuery::default()).await.unwrap_err();
    assert_eq!(refused.status(), Some(403), "{refused}");
    app.submit(&sweep_of("mine", 2)).await;
    assert_eq!(worker.cancel_sweep("mine").await.unwrap_err().status(), Some(403));
    assert_eq!(worker.jobs(&JobQuery::default()).await.unwrap_err().status(), Some(403));

    // The worker registers and claims; the user may not.
    let id = worker.register(&register("w")).await.unwrap().worker_id;
    let claim = ClaimRequest {
        capacity: Capacity { job_slots: 1, gpus: Vec::new(), ..Capacity::default() },
        wait_ms: 0,
        reserve: 0,
    };
    assert_eq!(app.client.register(&register("u")).await.unwrap_err().status(), Some(403));
    assert_eq!(app.client.claim(id, &claim).await.unwrap_err().status(), Some(403));
    assert_eq!(worker.claim(id, &claim).await.unwrap().jobs.len(), 1);
    // Refusals changed nothing.
    let counts = app.client.overview().await.unwrap().counts;
    assert_eq!((counts.queued, counts.running, app.client.sweeps().await.unwrap().len()), (1, 1, 1));
    // Health and the page stay public (load balancers, the sign-in form).
    assert!(anonymous.health().await.is_ok());
    assert_eq!(reqwest::get(format!("{}/", app.url)).await.unwrap().status(), 200);
}

#[tokio::test]
async fn a_token_in_the_query_string_is_refused_even_with_a_good_header() {
    let app = secured().await;
    let http = reqwest::Client::new();
    let response = http.get(format!("{}/api/jobs?token={USER}", app.url)).bearer_auth(USER).send().await.unwrap();
    assert_eq!(response.status(), 401);
    assert!(response.text().await.unwrap().contains("not accepted in the URL"));
    let fine = http.get(format!("{}/api/jobs?status=queued", app.url)).bearer_auth(USER).send().await.unwrap();
    assert_eq!(fine.status(), 200);
}

#[tokio::test]
async fn the_page_signs_in_once_and_its_cookie_carries_the_user_token() {
    let app = secured().await;
    let http = reqwest::Client::new();
    let worker = http.post(format!("{}/api/session", app.url)).bearer_auth(WORKER).send().await.unwrap();
    assert_eq!(worker.status(), 403);
    let bad =
        http.post(format!("{}/api/session", app.url)).bearer_auth("wrong-token-wrong-token").send().await.unwrap();
    assert_eq!(bad.status(), 401);
    let signed = http.post(format!("{}/api/session", app.url)).bearer_auth(USER).send().await.unwrap();
    assert_eq!(signed.status(), 200);
    let cookie = signed.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"), "{cookie}");
    let pair = cookie.split(';').next().unwrap().to_string();
    // What a browser then sends: the cookie alone opens the event stream and downloads.
    let events = http.get(format!("{}/api/events", app.url)).header("cookie", &pair).send().await.unwrap();
    assert_eq!(events.status(), 200);
    let out = http.delete(format!("{}/api/session", app.url)).send().await.unwrap();
    assert!(out.headers()["set-cookie"].to_str().unwrap().contains("Max-Age=0"));
}

/// A CA and a certificate it signed for 127.0.0.1 and localhost, as PEM files in `dir`.
fn certificates(dir: &std::path::Path) -> (TlsFiles, Vec<u8>) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "app test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
    let files = TlsFiles { cert: dir.join("server.pem"), key: dir.join("server.key") };
    std::fs::write(&files.cert, cert.pem()).unwrap();
    std::fs::write(&files.key, key.serialize_pem()).unwrap();
    (files, ca.pem().into_bytes())
}

#[tokio::test]
async fn https_with_a_private_ca_works_and_is_refused_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let (files, ca) = certificates(dir.path());
    let app = TestApp::spawn_secure(
        |config| {
            config.tls = Some(files);
            config.tokens.add(Role::User, USER, "test").unwrap();
        },
        ClientOptions { token: Some(USER.into()), ca_pem: Some(ca) },
    )
    .await;
    assert!(app.url.starts_with("https://127.0.0.1:"));
    app.submit(&sweep_of("secure", 3)).await;
    assert_eq!(app.client.jobs(&JobQuery::default()).await.unwrap().total, 3);
    // Without the CA the certificate is not trusted; plain HTTP gets no answer from it.
    let untrusting = Client::with_options(&app.url, &ClientOptions { token: Some(USER.into()), ca_pem: None }).unwrap();
    let error = untrusting.health().await.unwrap_err();
    assert!(error.to_string().to_lowercase().contains("certificate"), "{error}");
    let plain = app.url.replace("https://", "http://");
    assert!(Client::new(&plain).unwrap().health().await.is_err());
    // A bad CA file is named as such.
    let garbage = ClientOptions { token: None, ca_pem: Some(b"not a certificate".to_vec()) };
    assert!(Client::with_options(&app.url, &garbage).is_err());
}

#[tokio::test]
async fn a_bad_certificate_or_key_stops_the_server_at_start_with_the_file_named() {
    let dir = tempfile::tempdir().unwrap();
    let (mut files, _) = certificates(dir.path());
    std::fs::write(dir.path().join("empty.pem"), "").unwrap();
    files.cert = dir.path().join("empty.pem");
    let config =
        server::ServerConfig { data_dir: dir.path().join("data"), tls: Some(files), ..server::ServerConfig::default() };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let error = server::run(listener, config, std::future::pending()).await.unwrap_err();
    assert!(format!("{error:#}").contains("empty.pem"), "{error:#}");
}
