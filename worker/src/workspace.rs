//! Where an attempt starts and what it finds there, from its job's [`Workspace`]: the sweep's
//! `workdir` (checked to exist), or its code snapshot unpacked into the attempt's fresh `work/`
//! (the job starts in the directory `app submit` ran in, inside the snapshot), or an empty
//! `work/`; the job's newest checkpoint restored into `$APP_CHECKPOINT_DIR`; and the sweep's
//! `env:` variables, set after the worker's own.

use crate::attempt::AttemptContext;
use crate::attempt_dirs::AttemptDirs;
use crate::shipper::append_local;
use shared::api::{ClaimedJob, JobAttempt};
use std::path::PathBuf;

/// What the attempt gets beyond its directories.
#[derive(Debug)]
pub struct Prepared {
    /// Where the job starts.
    pub cwd: PathBuf,
    /// The attempt whose checkpoint was restored (`APP_RESUMED_FROM`).
    pub resumed_from: Option<u32>,
    /// Variables for the job after the worker's: `APP_RESUMED_FROM` and the sweep's `env:`.
    pub env: Vec<(String, String)>,
    /// The attempt's view of its code snapshot, taken down with its slot.
    pub code: Option<crate::code::LaidOutCode>,
}

/// Makes the attempt's starting directory and restores its checkpoint; the reason the attempt
/// cannot start otherwise (said in its log too).
pub async fn prepare(context: &AttemptContext, job: &ClaimedJob, dirs: &AttemptDirs) -> Result<Prepared, String> {
    let prepared = prepare_quietly(context, job, dirs).await;
    if let Err(reason) = &prepared {
        append_local(&dirs.log, &format!("[app] {reason}\n")).await;
    }
    prepared
}

async fn prepare_quietly(context: &AttemptContext, job: &ClaimedJob, dirs: &AttemptDirs) -> Result<Prepared, String> {
    let workspace = &job.workspace;
    let mut laid_out = None;
    let cwd = if let Some(workdir) = &workspace.workdir {
        match tokio::fs::metadata(workdir).await {
            Ok(metadata) if metadata.is_dir() => PathBuf::from(workdir),
            Ok(_) => return Err(format!("workdir `{workdir}` on worker {} is not a directory", context.worker_name)),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Err(format!("workdir `{workdir}` does not exist on worker {}", context.worker_name))
            }
            Err(error) => return Err(format!("workdir `{workdir}` on worker {}: {error}", context.worker_name)),
        }
    } else if let Some(code) = &workspace.code {
        let mut unpacked = context
            .code
            .unpack_into(&context.client, context.worker_id, &code.digest, &dirs.cwd, &dirs.code_layers)
            .await?;
        laid_out = unpacked.laid_out.take();
        if unpacked.replaced_damaged {
            let line =
                format!("[app] the cached copy of code snapshot {} was damaged; downloaded it again\n", code.digest);
            append_local(&dirs.log, &line).await;
        }
        let start =
            code.dir.split('/').filter(|part| !part.is_empty()).fold(dirs.cwd.clone(), |path, part| path.join(part));
        // The directory `app submit` ran in may hold no file of its own.
        if let Err(error) = tokio::fs::create_dir_all(&start).await {
            if let Some(laid_out) = laid_out {
                context.code.release(laid_out).await;
            }
            return Err(format!("creating {}: {error}", start.display()));
        }
        start
    } else {
        dirs.cwd.clone()
    };
    let attempt = JobAttempt { job_id: job.id, attempt: job.attempt };
    let mut resumed_from = None;
    if job.attempt > 1 {
        let restored = crate::checkpoints::restore(
            &context.client,
            context.worker_id,
            attempt,
            &dirs.checkpoint,
            &dirs.checkpoint_archive,
        )
        .await;
        match restored {
            Ok(Some((from, bytes))) => {
                resumed_from = Some(from);
                let line = format!(
                    "[app] resuming from the checkpoint of attempt {from} ({bytes} bytes, in $APP_CHECKPOINT_DIR)\n"
                );
                append_local(&dirs.log, &line).await;
            }
            Ok(None) => {
                // Requeued (lost, preempted, retried) before any checkpoint was stored.
                let line =
                    format!("[app] no earlier attempt stored a checkpoint; attempt {} starts from zero\n", job.attempt);
                append_local(&dirs.log, &line).await;
            }
            Err(reason) => {
                // The run can still start over; that beats not running at all.
                let emptied = dirs.checkpoint.clone();
                let _ = tokio::task::spawn_blocking(move || crate::slots::empty(&emptied)).await;
                append_local(
                    &dirs.log,
                    &format!("[app] the checkpoint could not be restored ({reason}); starting afresh\n"),
                )
                .await;
            }
        }
    }
    let mut env: Vec<(String, String)> =
        resumed_from.map(|from| ("APP_RESUMED_FROM".to_string(), from.to_string())).into_iter().collect();
    // The sweep file's parser refuses APP_* names; a job must never replace the worker's own.
    env.extend(workspace.env.iter().filter(|(name, _)| !name.to_ascii_uppercase().starts_with("APP_")).cloned());
    Ok(Prepared { cwd, resumed_from, env, code: laid_out })
}
