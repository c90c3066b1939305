//! The JSON bodies workers send (`register`, `claim`, `heartbeat`, `report`), deserialized as
//! the server does, then put through the pure logic the server runs on them: placement of
//! jobs on the reported capacity (as the dispatcher does, reserving as it goes), the job state
//! machine for reported outcomes, worker name checks. Nothing may panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde::Serialize;
use shared::api::{ClaimRequest, HeartbeatRequest, RegisterRequest, ReportRequest};
use shared::job::{self, JobStatus, Outcome};
use shared::placement::{gpus_wanted, is_exclusive, keep_or_place, place, Capacity};
use shared::sweep::Resources;

const GIB: u64 = 1 << 30;

/// The kinds of requests sweeps make: CPU, one whole GPU, shared GPUs, several GPUs.
fn requests() -> Vec<Resources> {
    vec![
        Resources::default(),
        Resources { gpus: Some(0), ..Resources::default() },
        Resources { gpus: Some(1), ..Resources::default() },
        Resources { gpus: Some(1), gpu_memory: Some(8 * GIB), exclusive: None },
        Resources { gpus: Some(2), gpu_memory: Some(GIB), exclusive: Some(true) },
        Resources { gpus: Some(4), gpu_memory: None, exclusive: Some(false) },
        Resources { gpus: Some(1), gpu_memory: Some(u64::MAX), exclusive: Some(false) },
        Resources { gpus: Some(u32::MAX), gpu_memory: Some(0), exclusive: None },
    ]
}

/// Deserializes, and checks that what serializes back reads back the same.
fn decode<T: DeserializeOwned + Serialize>(bytes: &[u8]) -> Option<T> {
    let value: T = serde_json::from_slice(bytes).ok()?;
    let json = serde_json::to_value(&value).expect("a decoded body serializes");
    let again: T = serde_json::from_value(json.clone()).expect("a serialized body decodes");
    assert_eq!(serde_json::to_value(&again).unwrap(), json, "a body changed through a round trip");
    Some(value)
}

/// Hands jobs to `capacity` as the dispatcher does, checking every placement; a capacity the
/// server refuses (a GPU listed twice) goes no further.
fn dispatch(capacity: &Capacity) {
    if capacity.check().is_err() {
        return;
    }
    let mut free = capacity.clone();
    for request in requests().iter().cycle().take(64) {
        if free.job_slots == 0 {
            break;
        }
        let Some(placement) = place(request, &free) else { continue };
        assert_eq!(placement.gpus.len() as u64, u64::from(gpus_wanted(request, &free)), "{request:?} on {free:?}");
        let mut seen = std::collections::HashSet::new();
        for index in &placement.gpus {
            assert!(seen.insert(index), "GPU {index} given twice: {placement:?}");
            let gpu = free.gpus.iter().find(|gpu| gpu.index == *index).expect("a placed GPU is one of the worker's");
            assert!(!gpu.exclusive_held, "GPU {index} is held exclusively: {free:?}");
            assert!(gpu.memory_free >= request.gpu_memory.unwrap_or(0), "GPU {index} over-committed: {free:?}");
            assert!(!is_exclusive(request) || gpu.shared_jobs == 0, "exclusive job on a shared GPU {index}");
        }
        // The worker keeps the server's choice while it still fits.
        assert!(keep_or_place(request, &placement, &free).is_some(), "{request:?} placed but not kept on {free:?}");
        let slots = free.job_slots;
        free.reserve(request, &placement);
        assert_eq!(free.job_slots, slots - 1);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, body)) = data.split_first() else { return };
    match kind % 4 {
        0 => {
            let Some(request) = decode::<RegisterRequest>(body) else { return };
            let _ = shared::names::check_name("worker", &request.name);
            dispatch(&request.capacity);
        }
        1 => {
            let Some(request) = decode::<ClaimRequest>(body) else { return };
            dispatch(&request.capacity);
        }
        2 => {
            let _ = decode::<HeartbeatRequest>(body);
        }
        _ => {
            let Some(request) = decode::<ReportRequest>(body) else { return };
            for (retries_left, cancel_requested) in [(0, false), (1, false), (u32::MAX, false), (0, true)] {
                let finish = job::finish(&request.outcome, retries_left, cancel_requested);
                match (&request.outcome, cancel_requested) {
                    (_, true) => assert_eq!(finish.status, JobStatus::Cancelled),
                    (Outcome::Exited { code: 0 }, false) => assert_eq!(finish.status, JobStatus::Succeeded),
                    (Outcome::Abandoned | Outcome::Preempted, false) => {
                        assert_eq!((finish.status, finish.retries_left), (JobStatus::Queued, retries_left))
                    }
                    _ => assert!(matches!(finish.status, JobStatus::Queued | JobStatus::Failed), "{finish:?}"),
                }
                assert!(finish.retries_left <= retries_left);
            }
            if let Outcome::Exited { code } = request.outcome {
                assert!(!job::exit_reason(code).is_empty());
            }
        }
    }
});
