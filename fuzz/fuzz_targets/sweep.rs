//! Sweep files as the server receives them (`POST /api/sweeps`): parse, count, build the first
//! and last jobs (for adaptive sweeps, a proposed job). Nothing may panic or hang, and what
//! comes out must hold together.

#![no_main]

use libfuzzer_sys::fuzz_target;
use shared::sweep::{ExpandOptions, Sweep};

/// The server's default limit; a sweep over it must be refused, never built.
const MAX_JOBS: u64 = 100_000;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, text)) = data.split_first() else { return };
    let Ok(yaml) = std::str::from_utf8(text) else { return };
    // `app submit --command` for the CVLab-Kit form, or not.
    let command = (flags & 1 == 1).then(|| "python main.py --config {config} --seed {index}".to_string());
    let options = ExpandOptions { max_jobs: MAX_JOBS, command, ..ExpandOptions::default() };
    let Ok(sweep) = Sweep::parse(yaml, &options) else { return };
    let count = sweep.count();
    assert!(count <= MAX_JOBS, "a sweep of {count} jobs passed a limit of {MAX_JOBS}");
    let last = count.checked_sub(1);
    for index in (0..count.min(4)).chain(last) {
        let job = sweep.job(index).unwrap_or_else(|| panic!("job {index} of {count} is missing"));
        assert_eq!(job.index, index);
        let params: serde_json::Value = serde_json::from_str(&job.params)
            .unwrap_or_else(|error| panic!("job {index}: params are not JSON ({error}): {}", job.params));
        assert!(params.is_object(), "job {index}: params are not an object: {}", job.params);
        // The same file gives the same jobs (random search is seeded per index).
        assert_eq!(Some(&job), sweep.job(index).as_ref(), "job {index} differs when built again");
    }
    if sweep.search.is_adaptive() {
        // Adaptive: any index is a seeded draw, and a proposal builds a job.
        let proposal = shared::search::propose(&sweep.space(), false, &[], &[], 0, 0);
        let job = sweep.job_from(7, &proposal.values).expect("a proposal of the sweep's own space builds a job");
        let params: serde_json::Value = serde_json::from_str(&job.params).expect("proposed params are JSON");
        assert_eq!(sweep.coordinates(&params).map(|values| values.len()), Some(proposal.values.len()));
        assert!(sweep.job(1_000_000).is_some(), "an adaptive sweep's draw is missing");
    } else {
        assert!(sweep.job(count).is_none(), "a job past the end ({count}) was built");
    }
});
