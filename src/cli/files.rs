//! `app files JOB [--download DIR] [--attempt N] [--json]`: a job's stored result versions and
//! their files, sizes in binary units; `--download` fetches one version's files.

use super::{format, table, UrlArg};
use anyhow::Context;
use clap::Args;
use shared::api::ResultVersion;
use std::io::Write;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct FilesArgs {
    /// The job id.
    pub job: shared::api::JobId,
    /// Download the files of the latest version (or --attempt) into this directory.
    #[arg(long, value_name = "DIR")]
    pub download: Option<PathBuf>,
    /// The result version (attempt) to show or download.
    #[arg(long)]
    pub attempt: Option<u32>,
    /// Print the versions with their manifests as JSON (sizes in bytes).
    #[arg(long, conflicts_with = "download")]
    pub json: bool,
    #[command(flatten)]
    pub url: UrlArg,
}

pub async fn run(args: FilesArgs) -> anyhow::Result<()> {
    let client = super::client(&args.url)?;
    let mut versions =
        client.results(args.job).await.with_context(|| format!("listing results of job {}", args.job))?;
    if let Some(attempt) = args.attempt {
        versions.retain(|version| version.attempt == attempt);
        anyhow::ensure!(!versions.is_empty(), "job {} has no result v{attempt}", args.job);
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&versions)?)?;
        return Ok(());
    }
    let Some(latest) = versions.last() else {
        writeln!(out, "job {} has no stored results yet", args.job)?;
        return Ok(());
    };
    let Some(directory) = &args.download else {
        writeln!(out, "{}", listing(&versions, format::now_ms(), table::terminal_width()))?;
        return Ok(());
    };
    for file in &latest.files {
        let destination = directory.join(&file.path);
        if let Some(parent) = destination.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        client
            .download_file(args.job, latest.attempt, &file.path, &destination)
            .await
            .with_context(|| format!("downloading {}", file.path))?;
        writeln!(out, "{}", destination.display())?;
    }
    Ok(())
}

/// Each version's line (how the attempt ended, where, when) and a table of its files.
pub fn listing(versions: &[ResultVersion], now: i64, width: Option<u16>) -> String {
    let mut text = Vec::new();
    for version in versions {
        let total: u64 = version.files.iter().map(|file| file.size).sum();
        text.push(format!("v{}: {}", version.attempt, version.path));
        text.push(format!(
            "  {} on {}, stored {}: {} files, {}",
            version.record.outcome,
            version.record.worker,
            format::age(version.stored_at, now),
            version.files.len(),
            format::bytes(total)
        ));
        if version.files.is_empty() {
            continue;
        }
        let mut files = table::Layout::new(["size", "sha256", "path"]);
        for file in &version.files {
            files.rows.push(vec![format::bytes(file.size), short_digest(&file.sha256), file.path.clone()]);
        }
        files.right = vec![0];
        files.fixed = vec![0, 1];
        text.push(table::render(&files.into_table(width)));
    }
    text.join("\n")
}

/// The first 12 hex digits, as git shortens commits (`--json` has the whole digest).
fn short_digest(sha256: &str) -> String {
    sha256.chars().take(12).collect()
}
