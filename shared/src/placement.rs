//! GPU placement: which of a worker's GPUs a job may use, as a pure function.
//!
//! The worker calls [`place`] to choose the GPUs of a job it claimed, and the server calls the
//! same function on the capacity the worker reported, so it hands out only jobs the worker can
//! place. Rules: never over-commit declared memory; never give a GPU that already holds one of
//! this worker's jobs to an exclusive job, even if its memory still looks free (new jobs have
//! not allocated yet); N distinct GPUs, the least loaded first; a job that runs the built-in
//! trainer only where it is built in. Whether a job could *ever* be placed anywhere, and why
//! not, is [`crate::waiting`]'s.

use crate::capabilities::Capabilities;
use crate::sweep::Resources;
use serde::{Deserialize, Serialize};

/// What one GPU can still take, as seen by its worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSlot {
    pub index: u32,
    pub memory_total: u64,
    /// Free memory: total minus the larger of what NVML sees used and what jobs declared.
    pub memory_free: u64,
    /// An exclusive job holds this GPU.
    pub exclusive_held: bool,
    /// How many of this worker's jobs share it.
    pub shared_jobs: u32,
}

/// What a worker can still run: job slots and its GPUs. A capacity is checked as it is read
/// (each GPU listed once), so no handler can forget to: one that lists a GPU twice could place
/// an exclusive job on a GPU it shares.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "UncheckedCapacity")]
pub struct Capacity {
    /// How many more jobs of any kind the worker will run (`--max-jobs` minus running).
    pub job_slots: u32,
    pub gpus: Vec<GpuSlot>,
    /// What the worker's binary can run (the trainer); the same in every capacity it reports.
    #[serde(default)]
    pub capabilities: Capabilities,
}

/// A capacity as it arrives, before [`Capacity::check`].
#[derive(Deserialize)]
struct UncheckedCapacity {
    job_slots: u32,
    gpus: Vec<GpuSlot>,
    #[serde(default)]
    capabilities: Capabilities,
}

impl TryFrom<UncheckedCapacity> for Capacity {
    type Error = String;

    fn try_from(unchecked: UncheckedCapacity) -> Result<Capacity, String> {
        let UncheckedCapacity { job_slots, gpus, capabilities } = unchecked;
        let capacity = Capacity { job_slots, gpus, capabilities };
        capacity.check()?;
        Ok(capacity)
    }
}

/// The GPUs chosen for a job (empty for a CPU job).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub gpus: Vec<u32>,
}

/// How many GPUs a job gets: what it asked for, or one on a box that has GPUs.
pub fn gpus_wanted(request: &Resources, capacity: &Capacity) -> u32 {
    request.gpus.unwrap_or(if capacity.gpus.is_empty() { 0 } else { 1 })
}

/// A job is exclusive unless it declared its GPU memory.
pub fn is_exclusive(request: &Resources) -> bool {
    request.exclusive.unwrap_or(request.gpu_memory.is_none())
}

/// Chooses GPUs for `request`, or `None` when it does not fit now.
pub fn place(request: &Resources, capacity: &Capacity) -> Option<Placement> {
    if capacity.job_slots == 0 || (request.trainer && !capacity.capabilities.trainer) {
        return None;
    }
    let wanted = gpus_wanted(request, capacity) as usize;
    if wanted == 0 {
        return Some(Placement { gpus: Vec::new() });
    }
    let exclusive = is_exclusive(request);
    let memory = request.gpu_memory.unwrap_or(0);
    let mut candidates: Vec<&GpuSlot> = capacity
        .gpus
        .iter()
        .filter(|gpu| !gpu.exclusive_held && gpu.memory_free >= memory)
        .filter(|gpu| !exclusive || gpu.shared_jobs == 0)
        .collect();
    if candidates.len() < wanted {
        return None;
    }
    candidates.sort_by_key(|gpu| (gpu.shared_jobs, std::cmp::Reverse(gpu.memory_free), gpu.index));
    Some(Placement { gpus: candidates[..wanted].iter().map(|gpu| gpu.index).collect() })
}

/// `proposed` (the server's choice at claim time) when it still fits `capacity`, so the job
/// gets the GPUs the queue recorded; otherwise a fresh [`place`]. Jobs ending between the
/// claim and its answer only free room, so the proposal nearly always holds.
pub fn keep_or_place(request: &Resources, proposed: &Placement, capacity: &Capacity) -> Option<Placement> {
    if gpus_wanted(request, capacity) as usize == proposed.gpus.len() {
        let mut only = capacity.clone();
        only.gpus.retain(|gpu| proposed.gpus.contains(&gpu.index));
        if let Some(kept) = place(request, &only).filter(|kept| kept.gpus.len() == proposed.gpus.len()) {
            return Some(kept);
        }
    }
    place(request, capacity)
}

impl Capacity {
    /// A worker with `slots` job slots and `gpus` idle GPUs of `memory` bytes each (GPU 0 to
    /// `gpus - 1`): what tests, benchmarks and simulations stand in for a box with.
    pub fn idle_gpus(slots: u32, gpus: u32, memory: u64) -> Capacity {
        let gpu =
            |index| GpuSlot { index, memory_total: memory, memory_free: memory, exclusive_held: false, shared_jobs: 0 };
        Capacity { job_slots: slots, gpus: (0..gpus).map(gpu).collect(), ..Capacity::default() }
    }

    /// Refuses a capacity that lists a GPU index twice. Placement tells GPUs apart by index,
    /// so a repeated one could give a job the same GPU twice, or an exclusive job a GPU that
    /// is shared under its other entry (found by fuzzing the claim body).
    pub fn check(&self) -> Result<(), String> {
        let mut seen = std::collections::HashSet::new();
        match self.gpus.iter().find(|gpu| !seen.insert(gpu.index)) {
            Some(gpu) => Err(format!("GPU {} is listed twice in the capacity", gpu.index)),
            None => Ok(()),
        }
    }

    /// Books a placed job, so the next [`place`] sees it.
    pub fn reserve(&mut self, request: &Resources, placement: &Placement) {
        self.job_slots = self.job_slots.saturating_sub(1);
        let exclusive = is_exclusive(request);
        for gpu in self.gpus.iter_mut().filter(|gpu| placement.gpus.contains(&gpu.index)) {
            if exclusive {
                gpu.exclusive_held = true;
                gpu.memory_free = gpu.memory_free.saturating_sub(request.gpu_memory.unwrap_or(gpu.memory_free));
            } else {
                gpu.shared_jobs += 1;
                gpu.memory_free = gpu.memory_free.saturating_sub(request.gpu_memory.unwrap_or(0));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn gpus(count: u32, memory: u64, slots: u32) -> Capacity {
        Capacity {
            job_slots: slots,
            gpus: (0..count)
                .map(|index| GpuSlot {
                    index,
                    memory_total: memory,
                    memory_free: memory,
                    exclusive_held: false,
                    shared_jobs: 0,
                })
                .collect(),
            capabilities: Capabilities::default(),
        }
    }

    fn shared(memory: u64) -> Resources {
        Resources { gpus: Some(1), gpu_memory: Some(memory), ..Resources::default() }
    }

    #[test]
    fn cpu_box_runs_default_jobs_on_cpu() {
        let placement = place(&Resources::default(), &gpus(0, 0, 1)).unwrap();
        assert!(placement.gpus.is_empty());
        assert_eq!(place(&Resources::default(), &gpus(0, 0, 0)), None);
    }

    #[test]
    fn exclusive_jobs_spread_over_gpus_and_never_share() {
        let mut capacity = gpus(2, 24 * GIB, 8);
        let request = Resources::default();
        let first = place(&request, &capacity).unwrap();
        capacity.reserve(&request, &first);
        let second = place(&request, &capacity).unwrap();
        capacity.reserve(&request, &second);
        assert_ne!(first.gpus, second.gpus);
        assert_eq!(place(&request, &capacity), None);
    }

    #[test]
    fn declared_memory_packs_without_over_commit() {
        let mut capacity = gpus(1, 24 * GIB, 8);
        for _ in 0..3 {
            let placement = place(&shared(8 * GIB), &capacity).unwrap();
            capacity.reserve(&shared(8 * GIB), &placement);
        }
        assert_eq!(place(&shared(8 * GIB), &capacity), None);
    }

    #[test]
    fn exclusive_job_skips_a_gpu_already_shared() {
        let mut capacity = gpus(1, 80 * GIB, 8);
        let small = shared(GIB);
        let placement = place(&small, &capacity).unwrap();
        capacity.reserve(&small, &placement);
        assert_eq!(place(&Resources::default(), &capacity), None);
    }

    #[test]
    fn multi_gpu_job_gets_distinct_least_loaded_gpus() {
        let mut capacity = gpus(3, 24 * GIB, 8);
        capacity.gpus[0].shared_jobs = 1;
        capacity.gpus[0].memory_free = 20 * GIB;
        let request = Resources { gpus: Some(2), gpu_memory: Some(4 * GIB), ..Resources::default() };
        let placement = place(&request, &capacity).unwrap();
        assert_eq!(placement.gpus, vec![1, 2]);
    }

    #[test]
    fn a_trainer_job_goes_only_where_the_trainer_is_built_in() {
        let train = Resources { trainer: true, ..Resources::default() };
        let mut capacity = gpus(1, 24 * GIB, 1);
        assert_eq!(place(&train, &capacity), None);
        assert!(place(&Resources::default(), &capacity).is_some());
        capacity.capabilities.trainer = true;
        assert_eq!(place(&train, &capacity), Some(Placement { gpus: vec![0] }));
    }

    #[test]
    fn a_proposal_that_still_fits_is_kept_and_one_that_does_not_is_replaced() {
        let request = Resources::default();
        // A fresh place would pick GPU 0; the server proposed GPU 1, which is still free.
        let capacity = gpus(2, 24 * GIB, 8);
        let proposed = Placement { gpus: vec![1] };
        assert_eq!(keep_or_place(&request, &proposed, &capacity), Some(proposed.clone()));
        // GPU 1 got taken meanwhile: the job goes where it fits.
        let mut busy = capacity.clone();
        busy.gpus[1].exclusive_held = true;
        assert_eq!(keep_or_place(&request, &proposed, &busy), Some(Placement { gpus: vec![0] }));
        // A CPU job stays a CPU job.
        let cpu = gpus(0, 0, 1);
        assert_eq!(keep_or_place(&request, &Placement { gpus: vec![] }, &cpu), Some(Placement { gpus: vec![] }));
    }
}
