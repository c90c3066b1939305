//! `app submit FILE`: send a sweep to the server, or count and show it with `--dry-run`
//! (which needs no server: the expansion is the same pure code the server runs; when the
//! server is known, it also says whether its workers could ever run the jobs); `--wait`
//! follows it to the end as `app wait` does. The project's code goes with it (`snapshot`)
//! unless the file says `code: none` or `workdir:`, or `--no-code` is given.

use super::UrlArg;
use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use shared::api::{SearchPlan, SubmitQuery};
use shared::names::default_sweep_name;
use shared::sweep::{Code, ExpandOptions, JobSpec, Sweep};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// Parameter sets a human-readable dry run prints.
const SHOWN_JOBS: usize = 5;

#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// The sweep file (YAML).
    pub file: PathBuf,
    #[command(flatten)]
    pub url: UrlArg,
    /// Count and show the jobs without submitting; needs no server.
    #[arg(long)]
    pub dry_run: bool,
    /// Print JSON (with --dry-run: {"count": N, "jobs": [...]} with every job).
    #[arg(long)]
    pub json: bool,
    /// The command of a CVLab-Kit config sweep (default: python main.py --config {config}).
    #[arg(long)]
    pub command: Option<String>,
    /// Wait until every job has finished, with a progress bar; exit non-zero if any failed,
    /// showing the failed jobs and the end of their logs (as `app wait`).
    #[arg(long)]
    pub wait: bool,
    /// The largest sweep a dry run accepts (the server has its own limit).
    #[arg(long, default_value_t = 100_000)]
    pub max_jobs: u64,
    /// Ship no code: jobs start in an empty directory (as `code: none` in the file).
    #[arg(long)]
    pub no_code: bool,
    /// The largest project shipped, uncompressed (e.g. 500MiB).
    #[arg(long, env = "APP_MAX_CODE_SIZE", value_name = "SIZE", default_value = "100MiB")]
    pub max_code_size: String,
}

impl SubmitArgs {
    /// Whether the project's code goes with the sweep.
    fn ships_code(&self, sweep: &Sweep) -> bool {
        !self.no_code && sweep.environment.code == Code::Project && sweep.environment.workdir.is_none()
    }

    fn code_cap(&self) -> anyhow::Result<u64> {
        shared::size::parse_bytes(&self.max_code_size).map_err(|error| anyhow::anyhow!("--max-code-size: {error}"))
    }
}

pub async fn run(args: SubmitArgs) -> anyhow::Result<()> {
    let source =
        std::fs::read_to_string(&args.file).with_context(|| format!("reading sweep file {}", args.file.display()))?;
    let stem = args.file.file_stem().map(|stem| stem.to_string_lossy().to_string()).unwrap_or_default();
    let project = super::snapshot::project::directory_name(&args.file);
    let default_name = default_sweep_name(project.as_deref(), &stem);
    if args.dry_run {
        return dry_run(&args, &source, &default_name).await;
    }
    // Check the file here first: a syntax error needs no server to be reported.
    let local = ExpandOptions { max_jobs: u64::MAX, command: args.command.clone(), ..ExpandOptions::default() };
    let sweep = Sweep::parse(&source, &local).with_context(|| format!("in {}", args.file.display()))?;
    let cap = args.code_cap()?;
    let client = super::client(&args.url)?;
    let mut query = SubmitQuery { command: args.command.clone(), name: Some(default_name), ..SubmitQuery::default() };
    let shipped = if args.ships_code(&sweep) {
        let shipped = super::snapshot::ship(&client, &args.file, cap, &args.url.given_files())
            .await
            .with_context(|| format!("shipping the code of {} (--no-code ships none)", args.file.display()))?;
        query.code = Some(shipped.snapshot.digest.clone());
        query.code_dir = Some(shipped.snapshot.dir.clone());
        query.code_commit = shipped.snapshot.commit.clone();
        query.code_dirty = shipped.snapshot.dirty;
        Some(shipped)
    } else {
        None
    };
    // Named before the request: a failover moves the client on to the next URL.
    let target = client.base_url().to_string();
    let request = client.submit(&source, &query);
    tokio::pin!(request);
    // A spinner only when the server takes more than a moment (a large grid).
    let response = tokio::select! {
        response = &mut request => response,
        _ = tokio::time::sleep(Duration::from_millis(300)) => {
            let spinner = ProgressBar::new_spinner().with_message(format!("submitting {}", args.file.display()));
            spinner.set_style(ProgressStyle::with_template("{spinner} {msg} {elapsed}").unwrap_or_else(|_| ProgressStyle::default_spinner()));
            spinner.enable_steady_tick(Duration::from_millis(100));
            let response = request.await;
            spinner.finish_and_clear();
            response
        }
    }
    .with_context(|| format!("submitting {} to {target}", args.file.display()))?;
    let mut out = std::io::stdout().lock();
    if args.json {
        let mut answer = serde_json::to_value(&response)?;
        answer["code"] = match &shipped {
            Some(shipped) => json!({
                "root": shipped.root, "files": shipped.files, "bytes": shipped.bytes,
                "snapshot": shipped.snapshot, "uploaded_bytes": shipped.uploaded,
                "left_out": shipped.left_out.entries.iter().map(|(path, why)| json!({"path": path, "why": why})).collect::<Vec<_>>(),
            }),
            None => Value::Null,
        };
        writeln!(out, "{}", serde_json::to_string_pretty(&answer)?)?;
    } else {
        warn(&response.warnings);
        if let Some(shipped) = &shipped {
            writeln!(out, "{}", shipped.describe())?;
            if let Some(line) = shipped.left_out.describe() {
                writeln!(out, "{line}")?;
            }
        }
        let id = response.sweep_id.map(|id| format!(" (id {id})")).unwrap_or_default();
        let runs = match response.search.as_ref().and_then(|search| search.adaptive.clone()) {
            Some(adaptive) => adaptive,
            None => format!("{} jobs", response.count),
        };
        writeln!(out, "submitted sweep {}{id}: {runs} ({} form)", response.name, response.form)?;
        if let Some(early_stop) = response.search.as_ref().and_then(|search| search.early_stop.as_deref()) {
            writeln!(out, "  {early_stop}")?;
        }
        if !args.wait {
            writeln!(out, "watch it with: app status {}", response.name)?;
        }
    }
    drop(out);
    if args.wait {
        super::wait::wait(&client, &super::wait::Target::Sweep(response.name.clone()), None).await?;
    }
    Ok(())
}

async fn dry_run(args: &SubmitArgs, source: &str, default_name: &str) -> anyhow::Result<()> {
    let options = ExpandOptions { max_jobs: args.max_jobs, command: args.command.clone(), ..ExpandOptions::default() };
    let sweep = Sweep::parse(source, &options).with_context(|| format!("in {}", args.file.display()))?;
    let name = sweep.name.clone().unwrap_or_else(|| default_name.to_string());
    // What would be shipped, listed and checked against the cap (nothing is read or sent).
    let project = match args.ships_code(&sweep) {
        true => Some(super::snapshot::survey(&args.file, args.code_cap()?, &args.url.given_files()).await?),
        false => None,
    };
    let code = project.as_ref().map(|project| {
        let dir = super::snapshot::start_dir(&project.root, &args.file);
        (project.root.clone(), project.files.len(), project.bytes(), dir, project.left_out.clone())
    });
    let plan = SearchPlan::of(&sweep);
    // An adaptive sweep's first runs are drawn before any result is in: they can be shown.
    let shown: Vec<JobSpec> = if sweep.search.is_adaptive() {
        server::queue::search_preview(&sweep, SHOWN_JOBS as u64)
    } else {
        sweep.jobs().take(SHOWN_JOBS).collect()
    };
    // A script the command names that would not be shipped (`python3 trian.py`).
    let mut warnings = sweep.warnings.clone();
    if let (Some(project), Some((_, _, _, dir, _)), Some(first)) = (&project, &code, shown.first()) {
        let files: Vec<std::path::PathBuf> = project.files.iter().map(|(path, _)| path.clone()).collect();
        warnings.extend(super::script_check::missing_scripts(&first.command, dir, &files));
    }
    let placeable = placeable_on_server(&args.url, &sweep).await;
    let mut out = std::io::stdout().lock();
    if args.json {
        let jobs = sweep
            .jobs()
            .map(|job| -> anyhow::Result<Value> {
                let params: Value = serde_json::from_str(&job.params)?;
                let mut entry = json!({"index": job.index, "params": params, "command": job.command});
                if let Some(config) = job.config {
                    entry["config"] = Value::String(config);
                }
                Ok(entry)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let code = code.map(|(root, files, bytes, dir, left_out)| {
            let left_out: Vec<Value> =
                left_out.entries.iter().map(|(path, why)| json!({"path": path, "why": why})).collect();
            json!({"root": root, "files": files, "bytes": bytes, "dir": dir, "left_out": left_out})
        });
        let sources = sweep.metric.as_ref().map(|metric| metric_sources(&metric.name, &sweep.environment));
        let mut output = json!({
            "name": name, "form": sweep.form, "count": sweep.count(), "warnings": warnings, "jobs": jobs,
            "metric_sources": sources,
            "code": code,
            "search": plan
        });
        if let Some(Ok(unplaceable)) = &placeable {
            output["unplaceable"] = json!(unplaceable);
        }
        writeln!(out, "{}", serde_json::to_string(&output)?)?;
        return Ok(());
    }
    warn(&warnings);
    match plan.as_ref().and_then(|plan| plan.adaptive.as_deref()) {
        Some(adaptive) => writeln!(out, "sweep {name} ({} form): {adaptive}", sweep.form)?,
        None => writeln!(out, "sweep {name} ({} form): {} jobs", sweep.form, sweep.count())?,
    }
    if let Some(early_stop) = plan.as_ref().and_then(|plan| plan.early_stop.as_deref()) {
        writeln!(out, "  {early_stop}")?;
    }
    if let Some(metric) = &sweep.metric {
        writeln!(out, "  metric {}: {}", metric.name, metric_sources(&metric.name, &sweep.environment))?;
    }
    if sweep.search.is_adaptive() && !shown.is_empty() {
        writeln!(out, "  first runs (drawn before any result is in):")?;
    }
    for job in &shown {
        writeln!(out, "  #{:<4} {}", job.index, job.params)?;
        writeln!(out, "        $ {}", job.command)?;
    }
    if sweep.count() > SHOWN_JOBS as u64 {
        writeln!(out, "  ... and {} more", sweep.count() - SHOWN_JOBS as u64)?;
    }
    if let Some((root, files, bytes, dir, left_out)) = code {
        let start = if dir.is_empty() { String::new() } else { format!(", jobs start in {dir}/") };
        writeln!(
            out,
            "code: {files} files, {} from {} would be shipped{start}",
            super::format::bytes(bytes),
            root.display()
        )?;
        if let Some(line) = left_out.describe() {
            writeln!(out, "{line}")?;
        }
    }
    match placeable {
        Some(Ok(None)) => writeln!(out, "the workers connected to {} can run these jobs", args.url.url)?,
        Some(Ok(Some(reason))) => {
            writeln!(out, "no worker connected to {} can run these jobs: {reason}", args.url.url)?
        }
        Some(Err(error)) => eprintln!("warning: could not ask {} about its workers: {error:#}", args.url.url),
        None => {}
    }
    Ok(())
}

/// Whether the workers connected to the server could ever run the sweep's jobs (`Ok(None)`:
/// they could; `Ok(Some(why))`: none can), decided by the same pure function the server uses.
/// `None` when no server was named (`--url` or `APP_URL`) and none answers at the default
/// address: a dry run needs no server.
async fn placeable_on_server(url: &super::UrlArg, sweep: &Sweep) -> Option<anyhow::Result<Option<String>>> {
    let named = std::env::var_os("APP_URL").is_some() || url.url != super::DEFAULT_URL;
    let asked = async {
        let client = super::client(url)?;
        let workers = tokio::time::timeout(Duration::from_secs(5), client.workers())
            .await
            .map_err(|_| anyhow::anyhow!("no answer within 5 s"))??;
        let connected: Vec<_> = workers
            .into_iter()
            .filter(|worker| worker.state != shared::api::WorkerState::Lost)
            .map(|worker| worker.capacity)
            .collect();
        anyhow::Ok(shared::waiting::could_ever_place(&sweep.resources, &connected).err().map(|why| why.to_string()))
    };
    match asked.await {
        Err(_) if !named => None,
        answer => Some(answer),
    }
}

/// Where a job's metric `name` can come from, for the dry run: a metric nobody reports leaves
/// the leaderboard empty and bayes and early stopping blind.
fn metric_sources(name: &str, environment: &shared::sweep::Environment) -> String {
    let example = serde_json::to_string(&json!({"step": 3, name: 0.12})).unwrap_or_default();
    let mut sources = Vec::new();
    if !environment.capture_off {
        sources.push(format!("wandb.log({{\"{name}\": ...}})"));
        sources.push("TensorBoard scalars, Lightning's CSVLogger, Hugging Face's trainer_state.json or MLflow's mlruns/ under the job's directory".to_string());
    }
    if !environment.metrics_regex.is_empty() {
        sources.push("printed lines matching metrics_regex".to_string());
    }
    sources.push(format!("JSON lines appended to $APP_METRICS_FILE ({example})"));
    let last = sources.pop().unwrap_or_default();
    match sources.is_empty() {
        true => format!("each job reports it through {last}"),
        false => format!("each job reports it through {}, or {last}", sources.join(", ")),
    }
}

fn warn(warnings: &[String]) {
    for warning in warnings {
        eprintln!("warning: {warning}");
    }
}
