//! A sweep's metric that its finished runs never reported is said where users look
//! (`GET /api/sweeps/{sweep}`: `metric_missing`), with what they did report.

use shared::api::{FinishRequest, MetricPoint, MetricsTail};
use shared::job::Outcome;
use testkit::TestApp;

/// Claims one job and finishes it, succeeded, having reported `names` (one point each).
async fn finish_reporting(app: &TestApp, worker: shared::api::WorkerId, names: &[&str]) {
    let job = app.claim(worker, 1).await.pop().expect("a job to claim");
    let points = names.iter().map(|name| MetricPoint { step: Some(1), name: name.to_string(), value: 0.5 }).collect();
    let finish = FinishRequest {
        job_id: job.id,
        attempt: job.attempt,
        outcome: Outcome::Exited { code: 0 },
        log: None,
        metrics: Some(MetricsTail { offset: 10, points }),
        notes: Vec::new(),
        result: None,
        claim: None,
    };
    app.client.finish(worker, &finish).await.unwrap();
}

#[tokio::test]
async fn a_metric_no_finished_run_reported_is_named_with_what_they_did_report() {
    let app = TestApp::spawn().await;
    let yaml = "name: typo\ncommand: echo {i}\nmetric: {name: val_loss, goal: minimize}\ngrid: {i: [1, 2, 3]}\n";
    app.submit(yaml).await;
    assert!(app.client.sweep("typo").await.unwrap().metric_missing.is_none(), "nothing finished: nothing to say");
    let worker = app.register("w", 1).await;
    finish_reporting(&app, worker, &["train/loss", "val/loss"]).await;
    let missing = app.client.sweep("typo").await.unwrap().metric_missing.expect("val_loss has not arrived");
    assert_eq!(
        (missing.finished, missing.arrived.clone()),
        (1, vec!["train/loss".to_string(), "val/loss".to_string()])
    );
    assert_eq!(missing.did_you_mean.as_deref(), Some("val/loss"));
    finish_reporting(&app, worker, &["val_loss"]).await;
    assert!(app.client.sweep("typo").await.unwrap().metric_missing.is_none(), "it arrived");
    // A sweep without a metric has nothing to miss.
    app.submit("name: plain\ncommand: echo {i}\ngrid: {i: [1]}\n").await;
    finish_reporting(&app, worker, &["loss"]).await;
    assert!(app.client.sweep("plain").await.unwrap().metric_missing.is_none());
}
