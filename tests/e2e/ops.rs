//! Operations, end to end with the real `app` binary: `/metrics` after a real sweep (its
//! values, Debian's `promtool`, the token rule, the Grafana dashboard's expressions), several
//! server URLs with one of them dead (the client, the CLI and a worker process fail over and
//! name every URL when none answers), and the files of `deploy/` (systemd-analyze,
//! kubernetes-validate, the sbatch script under a stand-in `srun`).
//!
//! Needs promtool, systemd-analyze and .venv-deploy (kubernetes-validate):
//! `scripts/install-test-deps.sh` installs them. Without them these tests fail rather than skip.

mod exposition;

use exposition::{metrics_in, names, value};
use shared::api::{GpuSample, HeartbeatRequest, Job, JobQuery, SubmitQuery};
use shared::job::JobStatus;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;
use testkit::{app, free_port, repo, wait_until, ServerProcess, WorkerProcess};

const LONG: Duration = Duration::from_secs(90);
const USER_TOKEN: &str = "ops-test-user-token-0123456789";
const WORKER_TOKEN: &str = "ops-test-worker-token-0123456789";

/// `GET url/metrics`: status, content type and body.
async fn scrape(url: &str, token: Option<&str>, accept: Option<&str>) -> (u16, String, String) {
    let mut request = reqwest::Client::new().get(format!("{url}/metrics"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(accept) = accept {
        request = request.header(reqwest::header::ACCEPT, accept);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let content_type = response.headers().get("content-type").map(|v| v.to_str().unwrap().to_string());
    (status, content_type.unwrap_or_default(), response.text().await.unwrap())
}

async fn finished(client: &client::Client, sweep: &str) -> Vec<Job> {
    let query = JobQuery { sweep: Some(sweep.into()), limit: Some(1000), ..JobQuery::default() };
    wait_until(&format!("every job of {sweep} finished"), LONG, || async {
        let jobs = client.jobs(&query).await.ok()?.jobs;
        (!jobs.is_empty() && jobs.iter().all(|job| job.status.is_terminal())).then_some(jobs)
    })
    .await
}

/// Runs `program` with `input` on its standard input.
fn run_with_input(program: &mut Command, input: &str) -> Output {
    let mut child = program.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

fn tool(name: &str) -> PathBuf {
    let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join(name))
        .find(|path| path.exists());
    found.unwrap_or_else(|| panic!("`{name}` is not installed: run scripts/install-test-deps.sh"))
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

// ---------------------------------------------------------------------------------------------
// /metrics

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_describe_the_queue_after_a_sweep_and_pass_promtool() {
    let server = ServerProcess::start();
    let mut worker = WorkerProcess::start(&server.url, "gpubox", &["--fake-gpus", "2x24GiB"]);
    let client = server.client();
    // Job 3 exits 1: three succeed, one fails.
    let sweep = server.submit("name: scrape\ncommand: test {n} -ne 3\ngrid:\n  n: [1, 2, 3, 4]\n").await;
    finished(&client, &sweep).await;
    let (status, content_type, body) = wait_until("the worker's GPUs are in the scrape", LONG, || async {
        let scraped = scrape(&server.url, None, None).await;
        value(&scraped.2, "app_gpu_memory_total_bytes", &[("gpu", "1")]).is_some().then_some(scraped)
    })
    .await;
    assert_eq!(status, 200);
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    let of = |name: &str, labels: &[(&str, &str)]| value(&body, name, labels);
    let sweep_status = |status| [("sweep", sweep.as_str()), ("status", status)];
    assert_eq!(of("app_queue_jobs", &sweep_status("succeeded")), Some(3.0), "{body}");
    assert_eq!(of("app_queue_jobs", &sweep_status("failed")), Some(1.0));
    assert_eq!(of("app_queue_jobs", &sweep_status("queued")), Some(0.0));
    assert_eq!(of("app_sweeps_submitted_total", &[]), Some(1.0));
    assert_eq!(of("app_jobs_submitted_total", &[]), Some(4.0));
    assert_eq!(of("app_jobs_claimed_total", &[]), Some(4.0));
    assert_eq!(of("app_attempt_reports_total", &[("status", "succeeded")]), Some(3.0));
    assert_eq!(of("app_attempt_reports_total", &[("status", "failed")]), Some(1.0));
    assert_eq!(of("app_lease_expiries_total", &[]), Some(0.0));
    assert_eq!(of("app_workers", &[("state", "healthy")]), Some(1.0));
    assert_eq!(of("app_workers", &[("state", "lost")]), Some(0.0));
    let gpu = [("worker", "gpubox"), ("gpu", "0"), ("uuid", "GPU-fa4e0000-0000-4000-8000-000000000000")];
    assert_eq!(of("app_gpu_memory_total_bytes", &gpu), Some(24.0 * (1u64 << 30) as f64));
    assert_eq!(of("app_gpu_utilization_ratio", &gpu), Some(0.0));
    assert_eq!(of("app_build_info", &[("version", env!("CARGO_PKG_VERSION"))]), Some(1.0));
    assert_eq!(of("app_gpu_temperature_celsius", &gpu), None, "a fake GPU has no sensor: no series, not 0");
    // Latency by route template: the sweep's submission, the heartbeats, and no raw ids.
    let requests = exposition::samples(&body)
        .into_iter()
        .filter(|sample| sample.name == "app_http_request_duration_seconds_count")
        .collect::<Vec<_>>();
    let route_count = |route: &str, method: &str| -> f64 {
        let label = |sample: &exposition::Sample, key: &str| sample.labels.get(key).cloned().unwrap_or_default();
        requests.iter().filter(|s| label(s, "route") == route && label(s, "method") == method).map(|s| s.value).sum()
    };
    assert_eq!(route_count("/api/sweeps", "POST"), 1.0, "{requests:?}");
    assert!(route_count("/api/workers/{id}/heartbeat", "POST") >= 1.0, "{requests:?}");
    for sample in &requests {
        let route = &sample.labels["route"];
        assert!(!route.split('/').any(|segment| segment.parse::<u64>().is_ok()), "a raw path as a route: {route}");
    }

    let promtool = run_with_input(Command::new(tool("promtool")).args(["check", "metrics"]), &body);
    assert!(promtool.status.success() && text(&promtool).trim().is_empty(), "promtool: {}\n{body}", text(&promtool));

    // Prometheus asks for OpenMetrics and gets it.
    let (_, content_type, openmetrics) =
        scrape(&server.url, None, Some("application/openmetrics-text;version=1.0.0,text/plain;q=0.5")).await;
    assert!(content_type.starts_with("application/openmetrics-text; version=1.0.0"), "{content_type}");
    assert!(openmetrics.ends_with("# EOF\n") && openmetrics.contains("# TYPE app_jobs_claimed counter"));

    // A box with sensors (its heartbeat sent through the client, as a worker sends it): every
    // reading in base units, labelled like DCGM's.
    let sensors = client.register(&testkit::cpu_worker("sensors")).await.unwrap();
    let reading = GpuSample {
        index: 3,
        uuid: "GPU-5e1f0a2b".into(),
        name: "NVIDIA A100-SXM4-80GB".into(),
        memory_total: 80 << 30,
        memory_used: 20 << 30,
        utilization: Some(37),
        temperature: Some(61),
        power_watts: Some(215.5),
        at: 0,
    };
    let beat = HeartbeatRequest { running: Vec::new(), gpus: vec![reading], saves: Vec::new() };
    client.heartbeat(sensors.worker_id, &beat).await.unwrap();
    let (_, _, body) = scrape(&server.url, None, None).await;
    let a100 = [("worker", "sensors"), ("gpu", "3"), ("uuid", "GPU-5e1f0a2b"), ("model", "NVIDIA A100-SXM4-80GB")];
    assert_eq!(value(&body, "app_gpu_utilization_ratio", &a100), Some(0.37), "{body}");
    assert_eq!(value(&body, "app_gpu_memory_used_bytes", &a100), Some((20u64 << 30) as f64));
    assert_eq!(value(&body, "app_gpu_temperature_celsius", &a100), Some(61.0));
    assert_eq!(value(&body, "app_gpu_power_watts", &a100), Some(215.5));
    assert_eq!(value(&body, "app_workers", &[("state", "healthy")]), Some(2.0));
    let promtool = run_with_input(Command::new(tool("promtool")).args(["check", "metrics"]), &body);
    assert!(promtool.status.success() && text(&promtool).trim().is_empty(), "promtool: {}\n{body}", text(&promtool));
    check_dashboard(&body);

    // The worker dies with a job running: its lease runs out, the job is a crash, the worker
    // is lost and its GPUs leave the scrape.
    let slow = server.submit("name: slow\ncommand: sleep 20\n").await;
    wait_until("the slow job runs", LONG, || async {
        server.jobs_of(&slow).await.iter().any(|job| job.status == JobStatus::Running).then_some(())
    })
    .await;
    testkit::signal(&worker.child, "KILL");
    worker.wait_exit(Duration::from_secs(10));
    // The box with sensors went silent before: it is lost by then too. The counters are the
    // writer's, the job counts a read of the database: the requeued job may show a scrape later.
    let requeued = [("sweep", slow.as_str()), ("status", "queued")];
    let body = wait_until("the lease expiry is counted, the job requeued, both workers lost", LONG, || async {
        let (_, _, body) = scrape(&server.url, None, None).await;
        let expired = value(&body, "app_lease_expiries_total", &[]) == Some(1.0);
        let queued = value(&body, "app_queue_jobs", &requeued) == Some(1.0);
        (expired && queued && value(&body, "app_workers", &[("state", "lost")]) == Some(2.0)).then_some(body)
    })
    .await;
    assert_eq!(value(&body, "app_job_crashes_total", &[("cause", "lease_expired")]), Some(1.0), "{body}");
    assert_eq!(value(&body, "app_gpu_memory_total_bytes", &[("worker", "gpubox"), ("gpu", "0")]), None);
}

/// The dashboard parses, every metric its expressions use is in the scrape, and every
/// expression is valid PromQL (`promtool check rules` on them as recording rules, with
/// Grafana's variables filled in).
fn check_dashboard(scrape: &str) {
    let path = repo("deploy/grafana/app-dashboard.json");
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut expressions = Vec::new();
    collect_expressions(&dashboard, &mut expressions);
    assert!(expressions.len() >= 10, "only {} expressions in {}", expressions.len(), path.display());
    let known = names(scrape);
    for expression in &expressions {
        let used = metrics_in(expression);
        assert!(!used.is_empty(), "`{expression}` uses no app metric");
        for metric in used {
            assert!(known.contains(&metric), "the dashboard uses {metric}, which the scrape lacks: `{expression}`");
        }
    }
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (index, expression) in expressions.iter().enumerate() {
        let filled = expression.replace("$__rate_interval", "5m").replace("$sweep", ".*").replace("$worker", ".*");
        assert!(!filled.contains('$'), "an unknown Grafana variable in `{expression}`");
        let quoted = serde_json::to_string(&filled).unwrap();
        rules.push_str(&format!("      - record: dashboard:panel_{index}\n        expr: {quoted}\n"));
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.yml"), &rules).unwrap();
    let checked = Command::new(tool("promtool")).args(["check", "rules"]).arg(dir.path().join("rules.yml")).output();
    let checked = checked.unwrap();
    assert!(checked.status.success(), "promtool check rules: {}\n{rules}", text(&checked));
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(query) = variable["query"]["query"].as_str() {
            assert!(metrics_in(query).iter().all(|metric| known.contains(metric)), "variable query `{query}`");
        }
    }
}

fn collect_expressions(value: &serde_json::Value, into: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", serde_json::Value::String(expression)) => into.push(expression.clone()),
                    _ => collect_expressions(value, into),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|item| collect_expressions(item, into)),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_a_user_token_unless_the_server_makes_them_public() {
    let tokens = tempfile::tempdir().unwrap();
    let (user, worker) = (tokens.path().join("user"), tokens.path().join("worker"));
    std::fs::write(&user, USER_TOKEN).unwrap();
    std::fs::write(&worker, WORKER_TOKEN).unwrap();
    let files = format!("user_token_file = {:?}\nworker_token_file = {:?}\n", user, worker);
    let guarded = ServerProcess::start_with(&files);
    assert_eq!(scrape(&guarded.url, None, None).await.0, 401);
    assert_eq!(scrape(&guarded.url, Some(WORKER_TOKEN), None).await.0, 403);
    let (status, _, body) = scrape(&guarded.url, Some(USER_TOKEN), None).await;
    assert_eq!((status, value(&body, "app_workers", &[("state", "healthy")])), (200, Some(0.0)), "{body}");

    let public = ServerProcess::start_with(&format!("{files}metrics_public = true\n"));
    assert_eq!(scrape(&public.url, None, None).await.0, 200);
    // Only /metrics: everything else keeps its token.
    let jobs = reqwest::get(format!("{}/api/jobs", public.url)).await.unwrap();
    assert_eq!(jobs.status().as_u16(), 401);
}

// ---------------------------------------------------------------------------------------------
// Several server URLs

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_and_the_cli_fail_over_past_a_dead_url_and_name_every_url_when_none_answers() {
    let dead = format!("http://127.0.0.1:{}", free_port());
    let mut server = ServerProcess::start();
    let urls = format!("{dead},{}", server.url);
    let client = client::Client::new(&urls).unwrap();
    let yaml = "name: listed\ncommand: 'true'\n";
    let submitted = client.submit(yaml, &SubmitQuery::default()).await.unwrap();
    assert_eq!(client.base_url(), server.url, "the client sticks to the server that answered");
    let status = app().args(["status", "--url", &urls]).output().unwrap();
    assert!(status.status.success(), "{}", text(&status));
    assert!(String::from_utf8_lossy(&status.stdout).contains(&submitted.name), "{}", text(&status));

    server.stop();
    let error = client.sweeps().await.unwrap_err();
    assert!(error.is_retryable(), "{error}");
    let message = error.to_string();
    assert!(message.contains(&dead) && message.contains(&server.url), "{message}");
    assert_eq!(message.matches("connection refused").count() + message.matches("Connection refused").count(), 2);
    // The CLI, with the list in APP_URL, says the same in one line.
    let refused = app().arg("status").env("APP_URL", &urls).output().unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(stderr.contains(&dead) && stderr.contains(&server.url) && stderr.trim().lines().count() == 1, "{stderr}");

    server.restart();
    let sweeps = wait_until("the restarted server answers", LONG, || async { client.sweeps().await.ok() }).await;
    assert!(sweeps.iter().any(|sweep| sweep.name == submitted.name));
    let bad = client::Client::new(&format!("{},ftp://x", server.url)).unwrap_err().to_string();
    assert_eq!(bad, "server URL `ftp://x` must start with http:// or https://");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_fails_over_past_a_dead_url_and_keeps_its_session_across_an_outage() {
    let dead = format!("http://127.0.0.1:{}", free_port());
    let mut server = ServerProcess::start();
    let worker = WorkerProcess::start(&format!("{dead},{}", server.url), "replicated", &[]);
    let client = server.client();
    let first = server.submit("name: before\ncommand: 'true'\ngrid:\n  i: [1, 2]\n").await;
    let jobs = finished(&client, &first).await;
    assert!(jobs.iter().all(|job| job.status == JobStatus::Succeeded && job.worker.as_deref() == Some("replicated")));

    server.stop();
    let live = server.url.clone();
    wait_until("the worker says no URL answered, naming both", LONG, || async {
        worker
            .log()
            .lines()
            .any(|line| line.contains("WARN") && line.contains(&dead) && line.contains(&live))
            .then_some(())
    })
    .await;
    server.restart();
    let second = server.submit("name: after\ncommand: 'true'\ngrid:\n  i: [1, 2]\n").await;
    let jobs = finished(&server.client(), &second).await;
    assert!(jobs.iter().all(|job| job.status == JobStatus::Succeeded && job.worker.as_deref() == Some("replicated")));
    let log = worker.log();
    assert_eq!(log.matches("registered with the server").count(), 1, "one session throughout:\n{log}");
    assert!(!log.contains("no longer knows this worker's session"), "{log}");
}

// ---------------------------------------------------------------------------------------------
// deploy/

#[test]
fn systemd_units_verify_and_are_hardened() {
    let analyze = tool("systemd-analyze");
    let dir = tempfile::tempdir().unwrap();
    // Exposure on systemd's 0-100 scale (`security` shows it divided by 10): the server is
    // locked down; the worker keeps what jobs need (GPUs, network, JIT memory).
    for (unit, threshold) in [("app-server.service", 20), ("app-worker.service", 40)] {
        let source = std::fs::read_to_string(repo("deploy/systemd").join(unit)).unwrap();
        for line in ["User=app", "Restart=on-failure", "KillMode=control-group", "NoNewPrivileges=yes"] {
            assert!(source.lines().any(|got| got == line), "{unit} lacks `{line}`");
        }
        assert!(source.contains("ExecStart=/usr/local/bin/app "), "{unit}");
        // verify checks that ExecStart's program exists: here, the binary just built.
        let copy = dir.path().join(unit);
        std::fs::write(&copy, source.replace("/usr/local/bin/app", env!("CARGO_BIN_EXE_app"))).unwrap();
        let verified = Command::new(&analyze).arg("verify").arg(&copy).output().unwrap();
        assert!(verified.status.success() && verified.stderr.is_empty(), "{unit}: {}", text(&verified));
        let security = Command::new(&analyze)
            .args(["security", "--offline=yes", &format!("--threshold={threshold}")])
            .arg(&copy)
            .output()
            .unwrap();
        assert!(security.status.success(), "{unit} is exposed past {threshold}: {}", text(&security));
    }
    // The dedicated user: systemd-sysusers creates it from the file, here in a scratch root.
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("etc")).unwrap();
    let created = Command::new(tool("systemd-sysusers"))
        .arg(format!("--root={}", root.path().display()))
        .arg(repo("deploy/systemd/app.sysusers.conf"))
        .output()
        .unwrap();
    assert!(created.status.success(), "{}", text(&created));
    let passwd = std::fs::read_to_string(root.path().join("etc/passwd")).unwrap();
    assert!(
        passwd.lines().any(|line| line.starts_with("app:") && line.ends_with(":/var/lib/app:/usr/sbin/nologin")),
        "{passwd}"
    );
}

#[test]
fn kubernetes_manifests_validate_against_the_kubernetes_schemas() {
    let validator = repo(".venv-deploy/bin/kubernetes-validate");
    assert!(validator.exists(), "no {}: run scripts/install-test-deps.sh", validator.display());
    let dir = repo("deploy/kubernetes");
    let kustomization = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    let listed: Vec<&str> = kustomization.lines().filter_map(|line| line.trim().strip_prefix("- ")).collect();
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".yaml") && name != "kustomization.yaml")
        .collect();
    on_disk.sort();
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(sorted, on_disk, "kustomization.yaml lists every manifest");
    for version in ["1.28.0", "1.33.0"] {
        let checked = Command::new(&validator)
            .args(["--strict", "-k", version])
            .args(listed.iter().map(|file| dir.join(file)))
            .output();
        let checked = checked.unwrap();
        assert!(checked.status.success(), "kubernetes {version}: {}", text(&checked));
        assert_eq!(text(&checked).matches(" passed for resource ").count(), listed.len(), "{}", text(&checked));
    }
    let manifest = |file: &str| -> serde_json::Value {
        serde_norway::from_str(&std::fs::read_to_string(dir.join(file)).unwrap()).unwrap()
    };
    let server = manifest("server-statefulset.yaml");
    assert_eq!(server["kind"], "StatefulSet");
    assert_eq!(server["spec"]["replicas"], 1, "one SQLite queue, one replica");
    assert_eq!(server["spec"]["volumeClaimTemplates"][0]["metadata"]["name"], "data");
    let mounts = &server["spec"]["template"]["spec"]["containers"][0]["volumeMounts"];
    assert!(mounts.as_array().unwrap().iter().any(|mount| mount["name"] == "data" && mount["mountPath"] == "/data"));
    let service = manifest("server-service.yaml");
    assert_eq!((service["kind"].as_str(), service["spec"]["ports"][0]["port"].as_u64()), (Some("Service"), Some(8000)));
    let workers = manifest("worker-daemonset.yaml");
    assert_eq!(workers["kind"], "DaemonSet");
    let container = &workers["spec"]["template"]["spec"]["containers"][0];
    assert!(container["resources"]["limits"]["nvidia.com/gpu"].as_u64().is_some_and(|gpus| gpus >= 1));
    let args: Vec<&str> = container["args"].as_array().unwrap().iter().map(|arg| arg.as_str().unwrap()).collect();
    let url = format!("http://{}:8000", service["metadata"]["name"].as_str().unwrap());
    assert!(args.windows(2).any(|pair| pair == ["--url", url.as_str()]), "{args:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sbatch_script_starts_one_worker_per_node_with_the_nodes_gpus() {
    let server = ServerProcess::start();
    let dir = tempfile::tempdir().unwrap();
    // A stand-in for Slurm's srun on a one-node allocation: it records its options and its
    // task's pid, and runs the task, as srun does on each node.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let srun = bin.join("srun");
    std::fs::write(
        &srun,
        "#!/bin/bash\nprintf '%s\\n' \"$@\" > \"$SRUN_ARGS\"\nwhile [[ $1 == --* ]]; do shift; done\n\
         \"$@\" &\necho $! > \"$SRUN_TASK\"\nwait $!\n",
    )
    .unwrap();
    std::fs::set_permissions(&srun, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let script = repo("deploy/slurm/app-workers.sbatch");
    assert!(Command::new("bash").arg("-n").arg(&script).status().unwrap().success());
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut batch = Command::new("bash");
    batch
        .arg(&script)
        .env_clear()
        .env("PATH", path)
        .env("HOME", dir.path())
        .env("SRUN_ARGS", dir.path().join("srun-args"))
        .env("SRUN_TASK", dir.path().join("srun-task"))
        .env("SLURM_JOB_ID", "4242")
        .env("SLURM_JOB_NUM_NODES", "1")
        .env("SLURM_GPUS_ON_NODE", "2")
        .env("APP_URL", &server.url)
        .env("APP_BIN", env!("CARGO_BIN_EXE_app"))
        .env("APP_WORK_ROOT", dir.path())
        .env("APP_FAKE_GPUS", "2x16GiB")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("batch.log")).unwrap());
    let mut child = batch.spawn().unwrap();
    let host = String::from_utf8(Command::new("hostname").arg("-s").output().unwrap().stdout).unwrap();
    let name = format!("slurm-4242-{}", host.trim());
    let client = server.client();
    let sweep = server.submit("name: slurm\ncommand: 'true'\ngrid:\n  i: [1, 2]\n").await;
    let jobs = finished(&client, &sweep).await;
    let log = std::fs::read_to_string(dir.path().join("batch.log")).unwrap_or_default();
    assert!(jobs.iter().all(|job| job.worker.as_deref() == Some(name.as_str())), "{jobs:#?}\n{log}");
    let workers = client.workers().await.unwrap();
    assert_eq!(workers.len(), 1);
    assert_eq!(workers[0].capacity.gpus.len(), 2, "the node's GPUs");
    let args = std::fs::read_to_string(dir.path().join("srun-args")).unwrap();
    for expected in ["--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--gres=gpu:2"] {
        assert!(args.lines().any(|line| line == expected), "srun got no {expected}: {args}");
    }
    assert!(Path::new(&dir.path().join("app-4242").join(host.trim())).is_dir(), "the node's work directory");
    // scancel: SIGTERM to the step's task drains the worker, which exits, and so does the
    // batch script. (The task's own pid: a negative pid given to procps' kill can reach every
    // process.)
    let task = std::fs::read_to_string(dir.path().join("srun-task")).unwrap();
    let task: u32 = task.trim().parse().unwrap();
    assert!(task > 1);
    assert!(Command::new("kill").args(["-TERM", &task.to_string()]).status().unwrap().success());
    testkit::wait_exit(&mut child, Duration::from_secs(30));
}
