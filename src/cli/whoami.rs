//! `app whoami [--json]`: the user your token names (`NAME:TOKEN` in the server's token file;
//! `default` for a token without a name, or on a server without tokens), and whether that user
//! is an admin (may change anyone's sweeps).

use super::UrlArg;
use anyhow::Context;
use clap::Args;
use std::io::Write;

#[derive(Debug, Args)]
pub struct WhoamiArgs {
    /// Print JSON: {"name": ..., "admin": ..., "auth_required": ...}.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub url: UrlArg,
}

pub async fn run(args: WhoamiArgs) -> anyhow::Result<()> {
    let client = super::client(&args.url)?;
    let at = client.base_url().to_string();
    let me = client.whoami().await.with_context(|| format!("asking {at} who your token names"))?;
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&me)?)?;
    } else if me.admin && me.auth_required {
        writeln!(out, "{} (admin)", me.name)?;
    } else {
        writeln!(out, "{}", me.name)?;
    }
    Ok(())
}
