//! The code and environment of a sweep's jobs (`sweeps.code_*`, `sweeps.workspace`; see
//! migrations/0005_code.sql).

use super::backend::{on_conn, Conn};
use super::sql;
use serde::{Deserialize, Serialize};
use shared::api::{CodeSnapshot, SweepId, Workspace};

/// The part of a [`Workspace`] kept as JSON in `sweeps.workspace`.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Stored {
    #[serde(default)]
    workdir: Option<String>,
    #[serde(default)]
    env: Vec<(String, String)>,
    #[serde(default)]
    setup: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    capture_off: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    metrics_regex: Vec<String>,
}

/// Records where and how the jobs of `sweep_id` run (in the transaction that inserts it).
pub async fn set_workspace(conn: impl Into<Conn<'_>>, sweep_id: SweepId, workspace: &Workspace) -> sql::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let stored = Stored {
            workdir: workspace.workdir.clone(),
            env: workspace.env.clone(),
            setup: workspace.setup.clone(),
            capture_off: workspace.capture_off,
            metrics_regex: workspace.metrics_regex.clone(),
        };
        let json = serde_json::to_string(&stored).map_err(|error| sql::Error::Encode(error.to_string()))?;
        let code = workspace.code.as_ref();
        sql::query(
            "UPDATE sweeps SET code_digest = $1, code_dir = $2, code_commit = $3, code_dirty = $4, workspace = $5
         WHERE id = $6",
        )
        .bind(code.map(|code| code.digest.as_str()))
        .bind(code.map(|code| code.dir.as_str()))
        .bind(code.and_then(|code| code.commit.as_deref()))
        .bind(code.map(|code| i64::from(code.dirty)))
        .bind(json)
        .bind(sweep_id.get())
        .execute(&mut *conn)
        .await?;
        Ok(())
    })
}

/// Where and how the jobs of `sweep_id` run; the default for a sweep stored before this
/// existed, or none.
pub async fn workspace_of(conn: impl Into<Conn<'_>>, sweep_id: SweepId) -> anyhow::Result<Workspace> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        type Row = (Option<String>, Option<String>, Option<String>, Option<i64>, Option<String>);
        let row: Option<Row> =
            sql::query_as("SELECT code_digest, code_dir, code_commit, code_dirty, workspace FROM sweeps WHERE id = $1")
                .bind(sweep_id.get())
                .fetch_optional(&mut *conn)
                .await?;
        let Some((digest, dir, commit, dirty, json)) = row else { return Ok(Workspace::default()) };
        let stored: Stored = match json {
            Some(json) => serde_json::from_str(&json)?,
            None => Stored::default(),
        };
        Ok(Workspace {
            code: digest.map(|digest| CodeSnapshot {
                digest,
                dir: dir.unwrap_or_default(),
                commit,
                dirty: dirty.is_some_and(|dirty| dirty != 0),
            }),
            workdir: stored.workdir,
            env: stored.env,
            setup: stored.setup,
            capture_off: stored.capture_off,
            metrics_regex: stored.metrics_regex,
        })
    })
}
