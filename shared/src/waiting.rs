//! Why a queued job waits: whether any connected worker could ever place it (on an idle box,
//! everything free), and if none could, a sentence saying what it asks that nobody has. A job
//! that some worker could place waits only for room, and shows its place in the queue instead.
//!
//! Pure: the server and the CLI pass the capacities the workers registered with.

use crate::placement::{gpus_wanted, place, Capacity};
use crate::sweep::Resources;

/// Why no connected worker can ever run a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unplaceable {
    /// No worker is connected at all.
    NoWorkers,
    /// It runs the built-in trainer and no worker has it built in.
    NoTrainer,
    /// It asks for more GPUs than any (suitable) worker has.
    TooManyGpus { asked: u32, largest: u32 },
    /// It asks for more memory per GPU than any GPU of a (suitable) worker has.
    TooMuchMemory { asked: u64, largest: u64 },
    /// GPUs that large exist, but no worker has as many of them as it asks for.
    TooFewLargeGpus { asked: u32, memory: u64, most: u32 },
    /// Each need alone is met somewhere, but no worker meets them all at once.
    NoSingleWorker,
}

impl std::fmt::Display for Unplaceable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unplaceable::NoWorkers => write!(f, "no worker is connected"),
            Unplaceable::NoTrainer => write!(
                f,
                "it runs the built-in trainer (app train) and no connected worker has it built in \
                 (build app with --features torch)"
            ),
            Unplaceable::TooManyGpus { asked, largest } => {
                let have = match largest {
                    0 => "no connected worker has a GPU".to_string(),
                    1 => "the largest connected worker has 1".to_string(),
                    n => format!("the largest connected worker has {n}"),
                };
                write!(f, "it asks for {asked} GPU{}; {have}", if *asked == 1 { "" } else { "s" })
            }
            Unplaceable::TooMuchMemory { asked, largest } => write!(
                f,
                "it asks for {} of GPU memory per GPU; the largest GPU of a connected worker has {}",
                size(*asked),
                size(*largest)
            ),
            Unplaceable::TooFewLargeGpus { asked, memory, most } => write!(
                f,
                "it asks for {asked} GPUs of {} or more; the most a connected worker has is {most}",
                size(*memory)
            ),
            Unplaceable::NoSingleWorker => {
                write!(f, "no connected worker has everything it asks for at once (GPUs, their memory, the trainer)")
            }
        }
    }
}

/// `40 GiB`, `12.5 GiB`, `512 MiB`: sizes as the sweep file would write them.
fn size(bytes: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    if bytes >= 1 << 30 {
        let gib = bytes as f64 / GIB;
        let text = format!("{gib:.1}");
        format!("{} GiB", text.strip_suffix(".0").unwrap_or(&text))
    } else {
        format!("{} MiB", bytes.div_ceil(1 << 20))
    }
}

/// The same capacity with nothing running: every GPU free, a job slot open.
fn idle(capacity: &Capacity) -> Capacity {
    let mut idle = capacity.clone();
    idle.job_slots = idle.job_slots.max(1);
    for gpu in &mut idle.gpus {
        gpu.memory_free = gpu.memory_total;
        gpu.exclusive_held = false;
        gpu.shared_jobs = 0;
    }
    idle
}

/// `Ok` when some worker of `capacities` (as registered: the whole box) could place `request`
/// once it is idle; otherwise why none can. The reason names the first need nobody meets, in
/// the order trainer, GPU count, GPU memory, so it says what to change.
pub fn could_ever_place(request: &Resources, capacities: &[Capacity]) -> Result<(), Unplaceable> {
    if capacities.is_empty() {
        return Err(Unplaceable::NoWorkers);
    }
    let idle: Vec<Capacity> = capacities.iter().map(idle).collect();
    if idle.iter().any(|capacity| place(request, capacity).is_some()) {
        return Ok(());
    }
    let mut suitable: Vec<&Capacity> = idle.iter().collect();
    if request.trainer {
        suitable.retain(|capacity| capacity.capabilities.trainer);
        if suitable.is_empty() {
            return Err(Unplaceable::NoTrainer);
        }
    }
    let enough_gpus = |capacity: &&Capacity| capacity.gpus.len() as u32 >= gpus_wanted(request, capacity);
    if !suitable.iter().any(enough_gpus) {
        let largest = suitable.iter().map(|capacity| capacity.gpus.len() as u32).max().unwrap_or(0);
        let asked = suitable.iter().map(|capacity| gpus_wanted(request, capacity)).min().unwrap_or(0);
        return Err(Unplaceable::TooManyGpus { asked, largest });
    }
    if let Some(memory) = request.gpu_memory {
        let largest = suitable.iter().flat_map(|capacity| &capacity.gpus).map(|gpu| gpu.memory_total).max();
        let largest = largest.unwrap_or(0);
        if largest < memory {
            return Err(Unplaceable::TooMuchMemory { asked: memory, largest });
        }
        let large = |capacity: &&Capacity| capacity.gpus.iter().filter(|gpu| gpu.memory_total >= memory).count() as u32;
        let asked = suitable.iter().map(|capacity| gpus_wanted(request, capacity)).min().unwrap_or(0);
        let most = suitable.iter().map(large).max().unwrap_or(0);
        if most < asked {
            return Err(Unplaceable::TooFewLargeGpus { asked, memory, most });
        }
    }
    Err(Unplaceable::NoSingleWorker)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capabilities::Capabilities;
    use crate::placement::GpuSlot;

    const GIB: u64 = 1 << 30;

    fn worker(gpus: &[u64], trainer: bool) -> Capacity {
        Capacity {
            job_slots: 4,
            gpus: gpus
                .iter()
                .enumerate()
                .map(|(index, memory)| GpuSlot {
                    index: index as u32,
                    memory_total: *memory,
                    memory_free: *memory / 2,
                    exclusive_held: index == 0,
                    shared_jobs: 1,
                })
                .collect(),
            capabilities: Capabilities { trainer, ..Capabilities::default() },
        }
    }

    fn asks(gpus: Option<u32>, memory: Option<u64>, trainer: bool) -> Resources {
        Resources { gpus, gpu_memory: memory, exclusive: None, trainer }
    }

    #[test]
    fn a_job_that_fits_an_idle_worker_is_placeable_even_while_it_is_busy() {
        // Both GPUs are taken at registration time; idle they fit a 2-GPU job.
        let workers = [worker(&[24 * GIB, 24 * GIB], false)];
        assert_eq!(could_ever_place(&asks(Some(2), None, false), &workers), Ok(()));
        // A default job runs on the CPU of a box without GPUs.
        assert_eq!(could_ever_place(&Resources::default(), &[worker(&[], false)]), Ok(()));
    }

    #[test]
    fn too_many_gpus_names_the_largest_worker() {
        let workers = [worker(&[24 * GIB], false), worker(&[24 * GIB, 24 * GIB], false)];
        let reason = could_ever_place(&asks(Some(4), None, false), &workers).unwrap_err();
        assert_eq!(reason, Unplaceable::TooManyGpus { asked: 4, largest: 2 });
        assert_eq!(reason.to_string(), "it asks for 4 GPUs; the largest connected worker has 2");
        let on_cpu_boxes = could_ever_place(&asks(Some(1), None, false), &[worker(&[], false)]).unwrap_err();
        assert_eq!(on_cpu_boxes.to_string(), "it asks for 1 GPU; no connected worker has a GPU");
    }

    #[test]
    fn too_much_memory_names_the_largest_gpu() {
        let workers = [worker(&[24 * GIB, 24 * GIB], false), worker(&[16 * GIB], false)];
        let reason = could_ever_place(&asks(Some(1), Some(40 * GIB), false), &workers).unwrap_err();
        assert_eq!(reason, Unplaceable::TooMuchMemory { asked: 40 * GIB, largest: 24 * GIB });
        assert_eq!(
            reason.to_string(),
            "it asks for 40 GiB of GPU memory per GPU; the largest GPU of a connected worker has 24 GiB"
        );
    }

    #[test]
    fn the_trainer_comes_first_then_what_trainer_workers_have() {
        let plain = [worker(&[80 * GIB; 8], false)];
        assert_eq!(could_ever_place(&asks(None, None, true), &plain), Err(Unplaceable::NoTrainer));
        // The 8-GPU box lacks the trainer; the box with it has one GPU.
        let mixed = [worker(&[80 * GIB; 8], false), worker(&[24 * GIB], true)];
        assert_eq!(
            could_ever_place(&asks(Some(2), None, true), &mixed),
            Err(Unplaceable::TooManyGpus { asked: 2, largest: 1 })
        );
        assert_eq!(could_ever_place(&asks(Some(1), None, true), &mixed), Ok(()));
    }

    #[test]
    fn needs_met_only_on_different_workers_are_said_together() {
        // Two GPUs on one box, 80 GiB on another: 2 x 40 GiB fits neither.
        let workers = [worker(&[24 * GIB, 24 * GIB], false), worker(&[80 * GIB], false)];
        let reason = could_ever_place(&asks(Some(2), Some(40 * GIB), false), &workers).unwrap_err();
        assert_eq!(reason, Unplaceable::TooFewLargeGpus { asked: 2, memory: 40 * GIB, most: 1 });
        // One large and one small GPU in the same box.
        let mixed = [worker(&[80 * GIB, 16 * GIB], false)];
        let reason = could_ever_place(&asks(Some(2), Some(40 * GIB), false), &mixed).unwrap_err();
        assert_eq!(reason.to_string(), "it asks for 2 GPUs of 40 GiB or more; the most a connected worker has is 1");
        assert_eq!(size(12 * GIB + GIB / 2), "12.5 GiB");
        assert_eq!(size(512 << 20), "512 MiB");
        let no_workers = could_ever_place(&Resources::default(), &[]).unwrap_err();
        assert_eq!(no_workers.to_string(), "no worker is connected");
    }
}
