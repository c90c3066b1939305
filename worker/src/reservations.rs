//! What this worker has handed out: the placement of every job whose process is alive. Its
//! free capacity (what the claim asks the server for) follows from that and the latest GPU
//! reading. Pure bookkeeping, no I/O.

use shared::api::{GpuSample, JobAttempt};
use shared::capabilities::Capabilities;
use shared::placement::{is_exclusive, Capacity, GpuSlot, Placement};
use shared::sweep::Resources;
use std::collections::HashMap;

#[derive(Debug)]
pub struct Reservations {
    max_jobs: u32,
    /// What the worker can run, part of every capacity it reports.
    capabilities: Capabilities,
    held: HashMap<JobAttempt, (Resources, Placement)>,
}

impl Reservations {
    pub fn new(max_jobs: u32, capabilities: Capabilities) -> Reservations {
        Reservations { max_jobs, capabilities, held: HashMap::new() }
    }

    pub fn hold(&mut self, job: JobAttempt, resources: Resources, placement: Placement) {
        self.held.insert(job, (resources, placement));
    }

    pub fn release(&mut self, job: JobAttempt) {
        self.held.remove(&job);
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Free capacity: job slots left, and per GPU what may still be placed on it. Free memory
    /// is the smaller of what NVML sees free and what declarations leave, so neither another
    /// process's allocation nor a job that has not allocated yet is over-committed.
    pub fn capacity(&self, gpus: &[GpuSample]) -> Capacity {
        let slots = self.max_jobs.saturating_sub(self.held.len() as u32);
        let gpus = gpus
            .iter()
            .map(|gpu| {
                let mut slot = GpuSlot {
                    index: gpu.index,
                    memory_total: gpu.memory_total,
                    memory_free: 0,
                    exclusive_held: false,
                    shared_jobs: 0,
                };
                let mut declared: u64 = 0;
                for (resources, _) in self.held.values().filter(|(_, p)| p.gpus.contains(&gpu.index)) {
                    if is_exclusive(resources) {
                        slot.exclusive_held = true;
                    } else {
                        slot.shared_jobs += 1;
                        declared = declared.saturating_add(resources.gpu_memory.unwrap_or(0));
                    }
                }
                let seen_free = gpu.memory_total.saturating_sub(gpu.memory_used);
                slot.memory_free = gpu.memory_total.saturating_sub(declared).min(seen_free);
                if slot.exclusive_held {
                    slot.memory_free = 0;
                }
                slot
            })
            .collect();
        Capacity { job_slots: slots, gpus, capabilities: self.capabilities.clone() }
    }
}

/// Jobs at once by default: four per GPU (jobs that declare memory can share), or one per
/// core on a box without GPUs.
pub fn default_max_jobs(gpu_count: usize) -> u32 {
    if gpu_count > 0 {
        (gpu_count as u32).saturating_mul(4)
    } else {
        std::thread::available_parallelism().map(|cores| cores.get() as u32).unwrap_or(1)
    }
}

/// Threads a CPU job should use (`OMP_NUM_THREADS`) when several share the box: its share of
/// the cores, so that `max_jobs` jobs each starting one OpenMP thread per core (libtorch,
/// NumPy's BLAS) do not oversubscribe it. `None` when jobs do not share (one at a time).
pub fn cpu_threads_per_job(cores: usize, max_jobs: u32) -> Option<u32> {
    (max_jobs > 1).then(|| (cores as u32 / max_jobs).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::placement::place;

    const GIB: u64 = 1 << 30;

    fn attempt(job_id: i64) -> JobAttempt {
        JobAttempt { job_id: job_id.into(), attempt: 1 }
    }

    fn gpu(index: u32, total: u64, used: u64) -> GpuSample {
        GpuSample {
            index,
            uuid: String::new(),
            name: "g".into(),
            memory_total: total,
            memory_used: used,
            utilization: None,
            temperature: None,
            power_watts: None,
            at: 0,
        }
    }

    fn shared_job(memory: u64) -> Resources {
        Resources { gpus: Some(1), gpu_memory: Some(memory), ..Resources::default() }
    }

    #[test]
    fn an_exclusive_job_closes_its_gpu_even_before_it_allocates() {
        let mut reservations = Reservations::new(8, Capabilities::default());
        reservations.hold(attempt(1), Resources::default(), Placement { gpus: vec![0] });
        let capacity = reservations.capacity(&[gpu(0, 24 * GIB, 0), gpu(1, 24 * GIB, 0)]);
        assert!(capacity.gpus[0].exclusive_held);
        assert_eq!(capacity.job_slots, 7);
        assert_eq!(place(&Resources::default(), &capacity).unwrap().gpus, [1]);
        assert_eq!(place(&shared_job(GIB), &capacity).unwrap().gpus, [1]);
    }

    #[test]
    fn declared_and_seen_memory_both_limit_sharing() {
        let mut reservations = Reservations::new(8, Capabilities::default());
        reservations.hold(attempt(1), shared_job(8 * GIB), Placement { gpus: vec![0] });
        reservations.hold(attempt(2), shared_job(8 * GIB), Placement { gpus: vec![0] });
        // Nothing allocated yet: the declarations leave 8 GiB.
        let capacity = reservations.capacity(&[gpu(0, 24 * GIB, 0)]);
        assert_eq!((capacity.gpus[0].memory_free, capacity.gpus[0].shared_jobs), (8 * GIB, 2));
        // Another process took 20 GiB: only 4 GiB are really free.
        let capacity = reservations.capacity(&[gpu(0, 24 * GIB, 20 * GIB)]);
        assert_eq!(capacity.gpus[0].memory_free, 4 * GIB);
        assert_eq!(place(&shared_job(8 * GIB), &capacity), None);
        reservations.release(attempt(1));
        reservations.release(attempt(2));
        assert!(reservations.is_empty());
        assert_eq!(reservations.capacity(&[gpu(0, 24 * GIB, 0)]).gpus[0].memory_free, 24 * GIB);
    }

    #[test]
    fn the_capacity_carries_the_workers_capabilities() {
        let trainer = Capabilities { trainer: true, ..Capabilities::default() };
        let reservations = Reservations::new(1, trainer.clone());
        let capacity = reservations.capacity(&[gpu(0, 24 * GIB, 0)]);
        assert_eq!(capacity.capabilities, trainer);
        assert!(place(&Resources { trainer: true, ..Resources::default() }, &capacity).is_some());
    }

    #[test]
    fn cpu_jobs_sharing_a_box_share_its_cores() {
        assert_eq!(cpu_threads_per_job(16, 4), Some(4));
        assert_eq!(cpu_threads_per_job(2, 8), Some(1));
        assert_eq!(cpu_threads_per_job(16, 1), None);
    }

    #[test]
    fn slots_run_out_at_max_jobs() {
        let mut reservations = Reservations::new(2, Capabilities::default());
        reservations.hold(attempt(1), Resources::default(), Placement { gpus: vec![] });
        reservations.hold(attempt(2), Resources::default(), Placement { gpus: vec![] });
        assert_eq!(reservations.capacity(&[]).job_slots, 0);
        assert_eq!(place(&Resources::default(), &reservations.capacity(&[])), None);
    }
}
