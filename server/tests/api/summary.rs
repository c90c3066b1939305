//! A sweep's leaderboard, as JSON and CSV: sorted by the sweep metric, top-k, quoting.

use shared::api::{MetricPoint, MetricsBatch};
use shared::job::JobStatus;
use testkit::TestApp;

/// Submits a 4-job sweep ranked by `val_loss` with `goal`, claims every job and sends the
/// given `val_loss` values (None: the job sends no metrics).
async fn scored_sweep(app: &TestApp, name: &str, goal: &str, losses: [Option<f64>; 4]) {
    let yaml = format!(
        "name: {name}\ncommand: \"train {{tag}}\"\nmetric: {{name: val_loss, goal: {goal}}}\n\
         grid:\n  tag: [\"a,b\", 'say \"hi\"', plain, \"two\\nlines\"]\n"
    );
    app.submit(&yaml).await;
    let worker = app.register(&format!("{name}-w"), 4).await;
    let mut jobs = app.claim(worker, 4).await;
    jobs.sort_by_key(|job| job.index);
    for (job, loss) in jobs.iter().zip(losses) {
        let Some(loss) = loss else { continue };
        let points = vec![
            MetricPoint { step: Some(1), name: "val_loss".into(), value: loss + 1.0 },
            MetricPoint { step: Some(2), name: "val_loss".into(), value: loss },
            MetricPoint { step: Some(2), name: "acc".into(), value: 1.0 - loss },
        ];
        let batch = MetricsBatch { worker_id: worker, attempt: job.attempt, offset: 10, points };
        app.client.send_metrics(job.id, &batch).await.unwrap();
    }
}

fn indexes(summary: &shared::api::SweepSummary) -> Vec<(u64, Option<u64>)> {
    summary.rows.iter().map(|row| (row.index, row.rank)).collect()
}

#[tokio::test]
async fn a_minimized_metric_ranks_lowest_first_with_silent_runs_last() {
    let app = TestApp::spawn().await;
    scored_sweep(&app, "low", "minimize", [Some(0.3), None, Some(0.1), Some(0.2)]).await;
    let summary = app.client.summary("low", None).await.unwrap();
    assert_eq!(summary.metric.as_ref().unwrap().name, "val_loss");
    assert_eq!(indexes(&summary), [(2, Some(1)), (3, Some(2)), (0, Some(3)), (1, None)]);
    let best = &summary.rows[0];
    assert_eq!((best.score, best.status, best.metrics["val_loss"].max), (Some(0.1), JobStatus::Running, 1.1));
    assert_eq!(best.params["tag"], "plain");
    let top = app.client.summary("low", Some(2)).await.unwrap();
    assert_eq!(indexes(&top), [(2, Some(1)), (3, Some(2))]);
}

#[tokio::test]
async fn a_maximized_metric_ranks_highest_first() {
    let app = TestApp::spawn().await;
    scored_sweep(&app, "high", "maximize", [Some(0.3), Some(0.5), None, Some(0.4)]).await;
    let summary = app.client.summary("high", None).await.unwrap();
    // Scored by each run's best (max) value, which is `loss + 1` at step 1.
    assert_eq!(indexes(&summary), [(1, Some(1)), (3, Some(2)), (0, Some(3)), (2, None)]);
    assert_eq!(summary.rows[0].score, Some(1.5));
}

#[tokio::test]
async fn the_csv_has_one_quoted_row_per_run_in_rank_order() {
    let app = TestApp::spawn().await;
    scored_sweep(&app, "table", "minimize", [Some(0.25), Some(0.5), None, Some(0.125)]).await;
    let csv = app.client.summary_csv("table", None).await.unwrap();
    let expected = "rank,index,job_id,status,score,param.tag,acc.last,acc.min,acc.max,acc.best,\
        val_loss.last,val_loss.min,val_loss.max,val_loss.best\n\
        1,3,4,running,0.125,\"two\nlines\",0.875,0.875,0.875,0.875,0.125,0.125,1.125,0.125\n\
        2,0,1,running,0.25,\"a,b\",0.75,0.75,0.75,0.75,0.25,0.25,1.25,0.25\n\
        3,1,2,running,0.5,\"say \"\"hi\"\"\",0.5,0.5,0.5,0.5,0.5,0.5,1.5,0.5\n\
        ,2,3,running,,plain,,,,,,,,\n";
    assert_eq!(csv, expected);
    let top = app.client.summary_csv("table", Some(1)).await.unwrap();
    let best_only = expected.split_inclusive("1.125,0.125\n").next().unwrap();
    assert_eq!(top, best_only);
}

#[tokio::test]
async fn a_sweep_without_metric_lists_runs_in_index_order_and_bad_requests_are_refused() {
    let app = TestApp::spawn().await;
    app.submit(&testkit::sweep_of("plain", 3)).await;
    let summary = app.client.summary("plain", None).await.unwrap();
    assert_eq!(indexes(&summary), [(0, None), (1, None), (2, None)]);
    assert!(summary.metric.is_none());
    assert_eq!(app.client.summary("nope", None).await.unwrap_err().status(), Some(404));
    let url = format!("{}/api/sweeps/plain/summary?format=xml", app.url);
    assert_eq!(reqwest::get(url).await.unwrap().status().as_u16(), 400);
}

#[tokio::test]
async fn every_top_k_is_the_head_of_the_full_leaderboard() {
    let app = TestApp::spawn().await;
    // Ties (two 0.2s), unscored runs, both goals: the top-k query and the full ranking agree.
    for (name, goal) in [("tied-low", "minimize"), ("tied-high", "maximize")] {
        scored_sweep(&app, name, goal, [Some(0.2), None, Some(0.2), Some(0.1)]).await;
        let full = app.client.summary(name, None).await.unwrap();
        for top in 0..=5 {
            let head = app.client.summary(name, Some(top)).await.unwrap();
            let expected: Vec<_> =
                full.rows.iter().take(top as usize).map(|row| (row.job_id, row.rank, row.score)).collect();
            let got: Vec<_> = head.rows.iter().map(|row| (row.job_id, row.rank, row.score)).collect();
            assert_eq!(got, expected, "{name} top {top}");
        }
    }
    // Without a metric, the head is in index order.
    app.submit(&testkit::sweep_of("plain", 5)).await;
    let head = app.client.summary("plain", Some(3)).await.unwrap();
    assert_eq!(indexes(&head), [(0, None), (1, None), (2, None)]);
}

/// Issue 28 item 6: a run cancelled by hand mid-run keeps its partial value out of the
/// ranking, in the full leaderboard and in a top-k alike; it is listed after the ranked runs.
#[tokio::test]
async fn a_run_cancelled_by_hand_is_not_ranked_with_its_partial_value() {
    let app = TestApp::spawn().await;
    scored_sweep(&app, "cut", "minimize", [Some(0.3), Some(0.05), Some(0.1), None]).await;
    // Job index 1 has the best value so far; then it is cancelled and its worker ends it.
    let jobs =
        app.client.jobs(&shared::api::JobQuery { sweep: Some("cut".into()), ..Default::default() }).await.unwrap();
    let best = jobs.jobs.iter().find(|job| job.index == 1).unwrap();
    app.client.cancel_job(best.id).await.unwrap();
    let worker = best.worker_id.unwrap();
    let killed = shared::api::ReportRequest {
        worker_id: worker,
        attempt: best.attempt,
        outcome: shared::job::Outcome::Killed { reason: "cancelled".into() },
    };
    assert_eq!(app.client.report(best.id, &killed).await.unwrap().status, JobStatus::Cancelled);
    let summary = app.client.summary("cut", None).await.unwrap();
    assert_eq!(indexes(&summary), [(2, Some(1)), (0, Some(2)), (1, None), (3, None)]);
    let top = app.client.summary("cut", Some(2)).await.unwrap();
    assert_eq!(indexes(&top), [(2, Some(1)), (0, Some(2))], "a cancelled run takes no place in the top");
    let three = app.client.summary("cut", Some(3)).await.unwrap();
    assert_eq!(indexes(&three), [(2, Some(1)), (0, Some(2)), (1, None)], "then it follows the ranked runs");
}
