//! `app-bench code`: measures code shipping on this machine. Prints figures (medians over
//! the rounds); asserts nothing beyond the work being done.
//!
//! A synthetic project (5,000 files, 50 MB by default; a git repository unless `--no-git`) is
//! shipped to a server started in this process through `app submit`'s own path
//! (`snapshot::ship`: list, digest, ask, pack, upload). Every round first changes one file, so:
//! (a) a first submit of that code (it is uploaded), with its parts measured separately with the
//! same functions (list, digest, pack, upload); (b) the re-submit of unchanged code (list,
//! digest, one small request); (c) a worker's preparation of an attempt's working copy through
//! its real `CodeCache`, uncached (download, unpack into the cache's tree, lay out the copy) and
//! cached (lay out the copy), with each mechanism that works here (`code_copy`: overlay, copy).

use anyhow::Context;
use app::cli::snapshot;
use clap::Args;
use client::Client;
use std::path::Path;
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct BenchCodeArgs {
    /// Files in the synthetic project.
    #[arg(long, default_value_t = 5_000)]
    pub files: u64,
    /// Bytes in the synthetic project.
    #[arg(long, default_value_t = 50_000_000)]
    pub bytes: u64,
    /// Rounds measured (medians are printed).
    #[arg(long, default_value_t = 5)]
    pub rounds: u32,
    /// A plain directory instead of a git repository.
    #[arg(long)]
    pub no_git: bool,
    /// Where the worker's cache and attempt directories go (default: beside the project), e.g.
    /// on another disk or a tmpfs: creating thousands of files is what unpacking costs most.
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<std::path::PathBuf>,
}

/// The snapshot cap used: far above the project, so it never decides anything here.
const CAP: u64 = 1 << 40;

fn median(mut samples: Vec<Duration>) -> String {
    samples.sort();
    match samples.get(samples.len() / 2) {
        Some(middle) => format!("{:.0} ms", middle.as_secs_f64() * 1e3),
        None => "-".into(),
    }
}

fn git(root: &Path, args: &[&str]) -> anyhow::Result<()> {
    let status = std::process::Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["-c", "user.email=bench@example.com", "-c", "user.name=bench", "-c", "commit.gpgsign=false"])
        .args(args)
        .stdout(std::process::Stdio::null())
        .status()
        .context("running git")?;
    anyhow::ensure!(status.success(), "git {args:?} failed");
    Ok(())
}

#[derive(Default)]
struct Samples {
    first: Vec<Duration>,
    unchanged: Vec<Duration>,
    list: Vec<Duration>,
    digest: Vec<Duration>,
    pack: Vec<Duration>,
    upload: Vec<Duration>,
    /// Per mechanism (overlay, copy): uncached and cached preparations.
    uncached: std::collections::BTreeMap<&'static str, Vec<Duration>>,
    cached: std::collections::BTreeMap<&'static str, Vec<Duration>>,
}

pub async fn run(args: BenchCodeArgs) -> anyhow::Result<()> {
    let bench = crate::server::BenchServer::start(|_| {}).await?;
    let scratch = bench.scratch().to_path_buf();
    let root = scratch.join("project");
    let made = Instant::now();
    let (files, bytes) = (args.files, args.bytes);
    let root_for_writing = root.clone();
    let written =
        tokio::task::spawn_blocking(move || crate::synthetic_project::write(&root_for_writing, files, bytes)).await??;
    let sweep_file = root.join("sweep.yaml");
    std::fs::write(&sweep_file, "command: python3 src/package_000/module_00000.py\n")?;
    if !args.no_git {
        git(&root, &["init", "-q"])?;
        git(&root, &["add", "-A"])?;
        git(&root, &["commit", "-q", "-m", "synthetic project"])?;
    }
    println!(
        "code shipping benchmark on {} cores: a project of {} files, {} ({}), written in {:.1} s; server at {}",
        crate::queue::num_cpus(),
        written.files + 1,
        app::cli::format::bytes(written.bytes),
        if args.no_git { "no git" } else { "a git repository" },
        made.elapsed().as_secs_f64(),
        bench.url
    );

    let client = Client::new(&bench.url)?;
    let worker = client.register(&crate::queue::cpu_worker("bench-code".into())).await?.worker_id;
    let mut samples = Samples::default();
    let (mut packed_bytes, mut shipped_files, mut shipped_bytes) = (0, 0, 0);
    for round in 0..args.rounds {
        // A changed file: this round's code is new to the server.
        std::fs::write(root.join("round.txt"), format!("round {round} at {:?}\n", std::time::SystemTime::now()))?;

        let started = Instant::now();
        let shipped = snapshot::ship(&client, &sweep_file, CAP, &[]).await?;
        samples.first.push(started.elapsed());
        packed_bytes = shipped.uploaded.context("a changed project was not uploaded")?;
        (shipped_files, shipped_bytes) = (shipped.files, shipped.bytes);

        let started = Instant::now();
        let again = snapshot::ship(&client, &sweep_file, CAP, &[]).await?;
        samples.unchanged.push(started.elapsed());
        anyhow::ensure!(again.uploaded.is_none(), "unchanged code was uploaded again");

        // The parts of a first submit, one by one with the same functions.
        let started = Instant::now();
        let project = snapshot::survey(&sweep_file, CAP, &[]).await?;
        samples.list.push(started.elapsed());
        let (project_root, paths) = (project.root.clone(), project.paths());
        let started = Instant::now();
        let digest = tokio::task::spawn_blocking(move || archive::digest_of(&project_root, &paths)).await??.digest;
        samples.digest.push(started.elapsed());
        anyhow::ensure!(digest == shipped.snapshot.digest, "the digest changed between two reads of the project");
        let (project_root, paths) = (project.root.clone(), project.paths());
        let archive_path = scratch.join("packed.tar.zst");
        let destination = std::fs::File::create(&archive_path)?;
        let started = Instant::now();
        tokio::task::spawn_blocking(move || archive::pack_to(&project_root, &paths, destination)).await??;
        samples.pack.push(started.elapsed());
        let started = Instant::now();
        client.upload_code(tokio::fs::File::open(&archive_path).await?).await?;
        samples.upload.push(started.elapsed());

        // A worker's attempt: uncached (a cache of its own), then cached, per mechanism.
        for wanted in [worker::code_copy::CodeCopy::Overlay, worker::code_copy::CodeCopy::Copy] {
            let work_dir = args.work_dir.as_deref().unwrap_or(&scratch).join(format!("bench-code-worker-{round}"));
            std::fs::create_dir_all(&work_dir)?;
            let copier = std::sync::Arc::new(worker::code_copy::Copier::start(&work_dir, wanted));
            let mechanism = copier.describe();
            if (wanted == worker::code_copy::CodeCopy::Overlay) != (mechanism == "overlay") {
                std::fs::remove_dir_all(&work_dir)?;
                continue;
            }
            let cache = worker::code::CodeCache::new(&work_dir, 5 << 30, copier);
            for cached in [false, true, true, true] {
                let slot = work_dir.join("slot");
                let (cwd, layers) = (slot.join("work"), slot.join("code-layers"));
                std::fs::create_dir_all(&cwd)?;
                let started = Instant::now();
                let mut unpacked = cache
                    .unpack_into(&client, worker, &digest, &cwd, &layers)
                    .await
                    .map_err(|reason| anyhow::anyhow!("laying out the snapshot: {reason}"))?;
                let took = started.elapsed();
                anyhow::ensure!(unpacked.downloaded != cached, "round {round}: the cache did not behave as expected");
                let kept = if cached { &mut samples.cached } else { &mut samples.uncached };
                kept.entry(mechanism).or_default().push(took);
                if let Some(laid_out) = unpacked.laid_out.take() {
                    cache.release(laid_out).await;
                }
                std::fs::remove_dir_all(&slot)?;
            }
            std::fs::remove_dir_all(&work_dir)?;
        }
    }

    println!(
        "(a) first submit (list, digest, ask, pack, upload) of {shipped_files} files, {}, {} rounds: median {} -> {} \
         compressed",
        app::cli::format::bytes(shipped_bytes),
        args.rounds,
        median(samples.first),
        app::cli::format::bytes(packed_bytes)
    );
    println!(
        "    its parts: list {}, digest {}, pack {}, upload {}",
        median(samples.list),
        median(samples.digest),
        median(samples.pack),
        median(samples.upload)
    );
    println!(
        "(b) re-submit, unchanged (list, digest, one request): median {} (target < 200 ms)",
        median(samples.unchanged)
    );
    for (mechanism, cached) in samples.cached {
        let uncached = samples.uncached.remove(mechanism).unwrap_or_default();
        println!(
            "(c) worker, an attempt's working copy by {mechanism} (in {}): uncached median {}, cached median {} \
             (target < 100 ms cached)",
            args.work_dir.as_deref().unwrap_or(&scratch).display(),
            median(uncached),
            median(cached)
        );
    }
    bench.stop().await?;
    Ok(())
}
