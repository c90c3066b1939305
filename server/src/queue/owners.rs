//! Who may change a sweep or its jobs: the sweep's owner, or an admin (decision 0074). The queue
//! service checks it in the write unit that makes the change (a sweep's owner never changes,
//! so a sweep's owner read before the unit holds in it too); reading stays open to every user,
//! and worker requests never come here.

use super::Tx;
use crate::auth::Caller;
use crate::db;
use crate::error::ApiResult;
use shared::api::{JobId, SweepId, SweepInfo};

/// Refuses (403, naming the owner) a caller who may not change `sweep`.
pub fn sweep(caller: &Caller, sweep: &SweepInfo) -> ApiResult<()> {
    caller.may_change(&sweep.owner, || format!("sweep {}", sweep.name))
}

/// Refuses a caller who may not change job `id` of sweep `sweep_id`; an admin costs no read.
pub async fn job(tx: &mut Tx, caller: &Caller, id: JobId, sweep_id: SweepId) -> ApiResult<()> {
    if caller.admin {
        return Ok(());
    }
    let (name, owner) = db::sweeps::name_and_owner_of(tx.conn().await?, sweep_id).await?;
    caller.may_change(&owner, || format!("job {id}'s sweep {name}"))
}

/// Refuses a caller who may not change every one of `ids` (naming the first that is another's):
/// a bulk change applies to all of them or to none.
pub async fn jobs(tx: &mut Tx, caller: &Caller, ids: &[JobId]) -> ApiResult<()> {
    if caller.admin || ids.is_empty() {
        return Ok(());
    }
    match db::sweeps::first_job_not_owned(tx.conn().await?, ids, &caller.name).await? {
        Some((id, name, owner)) => caller.may_change(&owner, || format!("job {id}'s sweep {name}")),
        None => Ok(()),
    }
}
