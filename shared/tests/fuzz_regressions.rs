//! Inputs found by fuzzing (scripts/fuzz.sh, targets in fuzz/), each kept as a test of what
//! the code now does with it.

use shared::api::RegisterRequest;
use shared::placement::{place, Capacity};
use shared::sweep::Resources;

/// Crash b14e4bb8 of the `api_bodies` target: a worker capacity naming GPU 0 twice, once
/// shared by five jobs and once free. Placement told GPUs apart by index only, so an exclusive
/// job went to "GPU 0", which was shared under its other entry. Such a capacity is now refused
/// as it is read (so the server answers 400 at registration and claim), with this message.
#[test]
fn a_capacity_that_lists_a_gpu_twice_is_refused() {
    let body = r#"{"name":"box-a","protocol":2,"capacity":{"job_slots":8,"gpus":[{"index":0,"memory_total":25769803776,"memory_free":25769803776,"exclusive_held":false,"shared_jobs":5},{"index":0,"memory_total":25769803776,"memory_free":8589934592,"exclusive_held":false,"shared_jobs":0}]},"holding":[{"job_id":3,"attempt":1}]}"#;
    let refused = serde_json::from_str::<RegisterRequest>(body).unwrap_err();
    assert!(refused.to_string().contains("GPU 0 is listed twice in the capacity"), "{refused}");
    // The same GPUs under distinct indices are fine, and an exclusive job avoids the shared one.
    let distinct: RegisterRequest = serde_json::from_str(
        &body.replacen(r#"{"index":0,"#, r#"{"index":1,"#, 2).replacen(r#"{"index":1,"#, r#"{"index":0,"#, 1),
    )
    .unwrap();
    let distinct: Capacity = distinct.capacity;
    assert_eq!(distinct.check(), Ok(()));
    let exclusive = Resources { gpus: Some(1), ..Resources::default() };
    assert_eq!(place(&exclusive, &distinct).map(|placement| placement.gpus), Some(vec![1]));
}
