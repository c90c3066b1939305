//! Property tests of `shared::placement`: whatever the GPUs and the stream of requests, placing
//! and reserving one job after another never breaks the placement rules.

use proptest::prelude::*;
use shared::placement::{is_exclusive, place, Capacity, GpuSlot};
use shared::sweep::Resources;
use std::collections::{HashMap, HashSet};

const GIB: u64 = 1 << 30;

fn gpus() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(prop::sample::select(vec![8 * GIB, 24 * GIB, 80 * GIB]), 0..5)
}

fn request() -> impl Strategy<Value = Resources> {
    (
        prop::option::of(0u32..4),
        prop::option::of(prop::sample::select(vec![2 * GIB, 8 * GIB, 20 * GIB])),
        prop::option::of(any::<bool>()),
    )
        .prop_map(|(gpus, gpu_memory, exclusive)| Resources { gpus, gpu_memory, exclusive, trainer: false })
}

proptest! {
    #[test]
    fn placing_jobs_one_after_another_keeps_every_rule(
        memory in gpus(),
        requests in prop::collection::vec(request(), 1..30),
        slots in 1u32..20,
        allowed_mask in any::<u8>(),
    ) {
        // `--gpus` restricts the inventory before capacity is computed: model it by dropping GPUs.
        let inventory: Vec<GpuSlot> = memory
            .iter()
            .enumerate()
            .filter(|(index, _)| allowed_mask & (1 << index) != 0)
            .map(|(index, total)| GpuSlot {
                index: index as u32,
                memory_total: *total,
                memory_free: *total,
                exclusive_held: false,
                shared_jobs: 0,
            })
            .collect();
        let allowed: HashSet<u32> = inventory.iter().map(|gpu| gpu.index).collect();
        let mut capacity = Capacity { job_slots: slots, gpus: inventory.clone(), ..Capacity::default() };
        let mut declared: HashMap<u32, u64> = HashMap::new();
        let mut exclusive_on: HashSet<u32> = HashSet::new();
        let mut shared_on: HashSet<u32> = HashSet::new();
        let mut placed = 0u32;
        for request in &requests {
            let Some(placement) = place(request, &capacity) else { continue };
            placed += 1;
            let wanted = request.gpus.unwrap_or(if inventory.is_empty() { 0 } else { 1 }) as usize;
            // N distinct GPUs, all of this worker's allowed ones.
            prop_assert_eq!(placement.gpus.len(), wanted);
            prop_assert_eq!(placement.gpus.iter().collect::<HashSet<_>>().len(), wanted);
            prop_assert!(placement.gpus.iter().all(|gpu| allowed.contains(gpu)));
            for gpu in &placement.gpus {
                // Never a GPU an exclusive job holds; never an exclusive job on a used GPU.
                prop_assert!(!exclusive_on.contains(gpu));
                if is_exclusive(request) {
                    prop_assert!(!shared_on.contains(gpu));
                    exclusive_on.insert(*gpu);
                } else {
                    shared_on.insert(*gpu);
                    let total = inventory.iter().find(|slot| slot.index == *gpu).unwrap().memory_total;
                    let used = declared.entry(*gpu).or_default();
                    *used += request.gpu_memory.unwrap_or(0);
                    // Declared memory is never over-committed.
                    prop_assert!(*used <= total, "GPU {} holds {} of {}", gpu, used, total);
                }
            }
            capacity.reserve(request, &placement);
        }
        prop_assert!(placed <= slots, "placed {} jobs with {} slots", placed, slots);
    }

    #[test]
    fn placement_is_deterministic(memory in gpus(), request in request()) {
        let capacity = Capacity {
            job_slots: 4,
            gpus: memory
                .iter()
                .enumerate()
                .map(|(index, total)| GpuSlot { index: index as u32, memory_total: *total, memory_free: *total, exclusive_held: false, shared_jobs: 0 })
                .collect(),
            ..Capacity::default()
        };
        prop_assert_eq!(place(&request, &capacity), place(&request, &capacity));
    }
}
