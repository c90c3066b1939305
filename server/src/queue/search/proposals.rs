//! Runs made when workers claim. Before a claim batch picks its jobs, each open adaptive sweep
//! is topped up to as many queued runs as the batch's claims have room for (never past its
//! `run_cap`), so every free slot that fits the sweep gets a run, and each proposal is made
//! as late as possible, knowing every result in so far.
//!
//! Bayes proposals come from a `shared::search::Proposer` (a GP or TPE, by the sweep's
//! sampler and space; one per sweep and batch, so the GP's kernel is fitted once) over the
//! finished runs (their best value of the sweep metric by its goal; failures, and values that
//! are not finite numbers, count as failures) with the queued and running runs as pending
//! (TPE's constant liar, the GP's Kriging believer).
//! Random search without a cap takes its seeded draw `index`.

use super::Controller;
use crate::db::{self, now_ms};
use crate::error::ApiResult;
use crate::queue::{Change, Tx};
use shared::api::WorkerId;
use shared::placement::{place, Capacity};
use shared::search::{Proposer, Sampler, Search, Space, Trial};
use shared::sweep::{Goal, JobSpec, Resources, Sweep};

impl Controller {
    /// Tops up every open adaptive sweep for the claims of `requests` (in the batch's unit).
    pub(in crate::queue) async fn top_up(&self, tx: &mut Tx, requests: &[(WorkerId, Capacity)]) -> ApiResult<()> {
        if !self.may_be_open() || requests.iter().all(|(_, capacity)| capacity.job_slots == 0) {
            return Ok(());
        }
        let generation = self.generation();
        let open = db::search::open_searches(tx.conn().await?).await?;
        if open.is_empty() {
            // A submission after this unit commits sets the hint again (on another replica:
            // its change, relayed here, does).
            self.clear_hint(generation);
            return Ok(());
        }
        for search in open {
            let Some(sweep) = self.sweep_in(tx, search.sweep_id).await? else {
                db::search::close(tx.conn().await?, search.sweep_id).await?;
                let note = "the stored sweep file no longer parses on this server: no more runs are made";
                db::search::add_note(tx.conn().await?, search.sweep_id, note).await?;
                continue;
            };
            let room = fitting_slots(&sweep.resources, requests);
            let want = wanted(room, search.queued, search.proposed, search.run_cap);
            if want > 0 {
                make_runs(tx, &sweep, &search, want).await?;
            }
        }
        Ok(())
    }
}

/// How many runs of a job needing `resources` the claims have room for.
fn fitting_slots(resources: &Resources, requests: &[(WorkerId, Capacity)]) -> u64 {
    let mut room = 0;
    for (_, capacity) in requests {
        let mut free = capacity.clone();
        while free.job_slots > 0 {
            let Some(placement) = place(resources, &free) else { break };
            free.reserve(resources, &placement);
            room += 1;
        }
    }
    room
}

/// Runs to make now: enough that the queued ones fill the room, within the cap.
fn wanted(room: u64, queued: u64, proposed: u64, run_cap: Option<u64>) -> u64 {
    let left = run_cap.map_or(u64::MAX, |cap| cap.saturating_sub(proposed));
    room.saturating_sub(queued).min(left)
}

/// The model's view of a sweep's runs: finished trials and the coordinates of pending ones.
pub(super) struct Trials {
    pub finished: Vec<Trial>,
    pub pending: Vec<Vec<f64>>,
}

/// Splits the sweep's runs: succeeded, failed and stopped-early runs are finished trials (a
/// stopped run with the best value it reached); queued and running ones are pending; runs
/// cancelled by hand are left out (they say nothing about their parameters). Runs whose
/// params do not fit the sweep's parameters are left out too.
pub(super) fn trials_of(sweep: &Sweep, rows: &[db::search::TrialRow], goal: Goal) -> Trials {
    let mut trials = Trials { finished: Vec::new(), pending: Vec::new() };
    for row in rows {
        let Some(values) = sweep.coordinates(&row.params) else { continue };
        let best = match goal {
            Goal::Minimize => row.min,
            Goal::Maximize => row.max,
        }
        .filter(|value| value.is_finite());
        match row.status.as_str() {
            "queued" | "running" => trials.pending.push(values),
            "succeeded" => trials.finished.push(Trial { values, metric: best }),
            "failed" => trials.finished.push(Trial { values, metric: None }),
            "cancelled" if row.stopped => trials.finished.push(Trial { values, metric: best }),
            _ => {}
        }
    }
    trials
}

/// What proposes a bayes sweep's runs over its `finished` trials (`space` the sweep's); the
/// GP's kernel is fitted once for all the runs one batch makes.
fn proposer<'a>(sweep: &Sweep, space: &'a Space, finished: &'a [Trial]) -> Proposer<'a> {
    let maximize = sweep.metric.as_ref().is_some_and(|metric| metric.goal == Goal::Maximize);
    let (seed, sampler) = match sweep.search {
        Search::Bayes { seed, sampler, .. } => (seed, sampler),
        _ => (0, Sampler::Tpe),
    };
    Proposer::new(sampler, space, maximize, finished, seed)
}

/// Proposal `number` of an adaptive sweep, with the runs at `pending` queued or running; with
/// why it is random, if it is.
pub(super) fn propose_run(
    sweep: &Sweep,
    proposer: &Proposer,
    pending: &[Vec<f64>],
    number: u64,
) -> Option<(JobSpec, Option<String>)> {
    match sweep.search {
        Search::Bayes { .. } => {
            let proposal = proposer.propose(pending, number);
            Some((sweep.job_from(number, &proposal.values)?, proposal.random_because))
        }
        _ => Some((sweep.job(number)?, None)),
    }
}

/// The first runs an adaptive sweep will make (for a dry run): the proposals made before any
/// result is in, which no result changes (the model waits for its start-up runs).
pub fn preview(sweep: &Sweep, count: u64) -> Vec<JobSpec> {
    let count = sweep.search.run_cap().map_or(count, |cap| cap.min(count));
    let space = sweep.space();
    let proposer = proposer(sweep, &space, &[]);
    let (mut pending, mut jobs) = (Vec::new(), Vec::new());
    for number in 0..count {
        let Some((job, _)) = propose_run(sweep, &proposer, &pending, number) else { break };
        if let Some(values) = sweep.coordinates(&serde_json::from_str(&job.params).unwrap_or_default()) {
            pending.push(values);
        }
        jobs.push(job);
    }
    jobs
}

/// Whether a finished run reached the sweep's `metric.target`.
fn target_reached(sweep: &Sweep, trials: &Trials) -> Option<f64> {
    let (target, goal) = (sweep.metric_target?, sweep.metric.as_ref()?.goal);
    trials.finished.iter().filter_map(|trial| trial.metric).find(|value| match goal {
        Goal::Minimize => *value <= target,
        Goal::Maximize => *value >= target,
    })
}

async fn make_runs(tx: &mut Tx, sweep: &Sweep, search: &db::search::OpenSearch, want: u64) -> ApiResult<()> {
    let id = search.sweep_id;
    let bayes = matches!(sweep.search, Search::Bayes { .. });
    let metric = sweep.metric.as_ref();
    let mut trials = Trials { finished: Vec::new(), pending: Vec::new() };
    if let (true, Some(metric)) = (bayes || sweep.metric_target.is_some(), metric) {
        let rows = db::search::trials(tx.conn().await?, id, &metric.name).await?;
        trials = trials_of(sweep, &rows, metric.goal);
    }
    if let Some(value) = target_reached(sweep, &trials) {
        db::search::close(tx.conn().await?, id).await?;
        let target = sweep.metric_target.unwrap_or(value);
        let note = format!("a finished run reached metric.target {target} ({value}): no more runs are made");
        db::search::add_note(tx.conn().await?, id, &note).await?;
        tx.note(Change::Page);
        return Ok(());
    }
    let scored = trials.finished.iter().filter(|trial| trial.metric.is_some()).count();
    let fallback = bayes && !trials.finished.is_empty() && scored == 0;
    let Trials { finished, mut pending } = trials;
    let space = sweep.space();
    let proposer = proposer(sweep, &space, &finished);
    let mut jobs = Vec::new();
    for number in search.proposed..search.proposed + want {
        let Some((job, _)) = propose_run(sweep, &proposer, &pending, number) else { break };
        if let Some(values) = sweep.coordinates(&serde_json::from_str(&job.params).unwrap_or_default()) {
            pending.push(values);
        }
        jobs.push(job);
    }
    let made = jobs.len() as u64;
    if made == 0 {
        return Ok(());
    }
    db::sweep_jobs::insert_proposed(tx.conn().await?, id, sweep, &jobs, now_ms()).await?;
    let after = search.proposed + made;
    if !db::search::advance(tx.conn().await?, id, search.proposed, after, fallback).await? {
        // Another pass moved it first (it cannot inside the single writer, but the guard is
        // what keeps an index from being made twice): undo this one.
        return Err(anyhow::anyhow!("the controller of sweep {id} moved while it proposed; claim again").into());
    }
    let metric_name = metric.map(|metric| metric.name.as_str()).unwrap_or("the metric");
    if fallback && !search.fallback {
        let note = format!(
            "run {}: no finished run has reported `{metric_name}` ({} finished), so runs are proposed at random until one does",
            search.proposed,
            finished.len()
        );
        tracing::warn!(sweep = %id, "{note}");
        db::search::add_note(tx.conn().await?, id, &note).await?;
    } else if !fallback && search.fallback {
        let note = format!("run {}: `{metric_name}` arrived; proposals come from the model again", search.proposed);
        db::search::add_note(tx.conn().await?, id, &note).await?;
    }
    if let Some(cap) = search.run_cap.filter(|cap| after >= *cap) {
        db::search::add_note(tx.conn().await?, id, &format!("all {cap} runs of run_cap are made")).await?;
    }
    tracing::debug!(sweep = %id, from = search.proposed, runs = made, "runs proposed");
    tx.note(Change::Page);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::placement::GpuSlot;
    use shared::sweep::ExpandOptions;

    fn sweep(yaml: &str) -> Sweep {
        Sweep::parse(yaml, &ExpandOptions::default()).unwrap()
    }

    fn row(status: &str, x: f64, min: Option<f64>, stopped: bool) -> db::search::TrialRow {
        db::search::TrialRow { status: status.into(), params: serde_json::json!({"x": x}), min, max: min, stopped }
    }

    const BAYES: &str = "method: bayes\nmetric: {name: loss}\nparameters: {x: {min: 0.0, max: 1.0}}\ncommand: [echo]\n";

    #[test]
    fn runs_wanted_fill_the_room_within_the_cap() {
        assert_eq!(wanted(4, 1, 0, None), 3);
        assert_eq!(wanted(4, 1, 9, Some(10)), 1);
        assert_eq!(wanted(4, 6, 0, None), 0, "queued runs already fill the room");
        assert_eq!(wanted(4, 0, 10, Some(10)), 0);
    }

    #[test]
    fn room_counts_only_claims_the_sweep_fits() {
        let gpu = |index| GpuSlot {
            index,
            memory_total: 8 << 30,
            memory_free: 8 << 30,
            exclusive_held: false,
            shared_jobs: 0,
        };
        let gpu_box = Capacity { job_slots: 8, gpus: vec![gpu(0), gpu(1)], ..Capacity::default() };
        let cpu_box = Capacity { job_slots: 3, gpus: Vec::new(), ..Capacity::default() };
        let requests = [(WorkerId::new(1), gpu_box), (WorkerId::new(2), cpu_box)];
        assert_eq!(fitting_slots(&Resources { gpus: Some(1), ..Resources::default() }, &requests), 2);
        assert_eq!(fitting_slots(&Resources { gpus: Some(0), ..Resources::default() }, &requests), 11);
    }

    #[test]
    fn trials_count_stopped_runs_and_failures_and_leave_out_cancelled_ones() {
        let sweep = sweep(BAYES);
        let rows = [
            row("succeeded", 0.1, Some(0.5), false),
            row("failed", 0.2, Some(0.1), false),
            row("cancelled", 0.3, Some(0.9), true),
            row("cancelled", 0.4, Some(0.0), false),
            row("running", 0.5, None, false),
            row("queued", 0.6, None, false),
            row("succeeded", 0.7, Some(f64::NAN), false),
        ];
        let trials = trials_of(&sweep, &rows, Goal::Minimize);
        let finished: Vec<(f64, Option<f64>)> =
            trials.finished.iter().map(|trial| (trial.values[0], trial.metric)).collect();
        assert_eq!(finished, [(0.1, Some(0.5)), (0.2, None), (0.3, Some(0.9)), (0.7, None)]);
        assert_eq!(trials.pending, [vec![0.5], vec![0.6]]);
    }

    #[test]
    fn previews_are_the_first_proposals_and_respect_the_cap() {
        let capped = sweep(&format!("{BAYES}run_cap: 3\n"));
        let jobs = preview(&capped, 10);
        assert_eq!(jobs.iter().map(|job| job.index).collect::<Vec<_>>(), [0, 1, 2]);
        let space = capped.space();
        assert_eq!(propose_run(&capped, &proposer(&capped, &space, &[]), &[], 0).unwrap().0, jobs[0]);
        let random = sweep("method: random\nparameters: {x: {values: [1, 2, 3]}}\ncommand: [echo]\n");
        assert_eq!(preview(&random, 4)[3], random.job(3).unwrap());
    }

    #[test]
    fn a_finished_run_at_the_target_is_found() {
        let sweep = sweep("method: bayes\nmetric: {name: acc, goal: maximize, target: 0.9}\nparameters: {x: {min: 0.0, max: 1.0}}\ncommand: [echo]\n");
        let trials = trials_of(&sweep, &[row("succeeded", 0.1, Some(0.95), false)], Goal::Maximize);
        assert_eq!(target_reached(&sweep, &trials), Some(0.95));
        let trials = trials_of(&sweep, &[row("succeeded", 0.1, Some(0.5), false)], Goal::Maximize);
        assert_eq!(target_reached(&sweep, &trials), None);
    }
}
