//! Simulated GPUs for tests and machines without any (`--fake-gpus 2x24GiB`), optionally
//! scripted: `--fake-gpus 2x24GiB@readings.txt` reads that file at every sample, so a test (or
//! the job itself) can say how busy each GPU is and which processes hold how much memory.
//!
//! The script has one reading per line, `key=value` words, `#` comments:
//!
//! ```text
//! gpu=0 utilization=85 memory_used=10GiB     # a GPU's own reading
//! gpu=0 pid=4242 memory=3GiB                 # a process using GPU 0, as NVML lists them
//! ```
//!
//! A later line for the same GPU (or the same process on a GPU) wins, so a job can append
//! readings as it goes. Processes that have exited are not listed, as with NVML. A GPU's
//! memory in use is its scripted `memory_used`, else what its processes hold.

use crate::inventory::{GpuInventory, GpuProcess};
use shared::api::GpuSample;
use shared::size::parse_bytes;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

/// One simulated GPU.
#[derive(Debug, Clone)]
pub struct FakeGpu {
    pub index: u32,
    pub uuid: String,
    pub memory_total: u64,
}

#[derive(Debug)]
pub struct FakeGpus {
    pub(crate) gpus: Vec<FakeGpu>,
    script: Option<PathBuf>,
    /// A broken script line is said once, not at every sample.
    warned: AtomicBool,
}

/// What the script says now.
#[derive(Debug, Default, PartialEq)]
struct Scripted {
    /// Per GPU: utilisation percent and memory in use.
    gpus: BTreeMap<u32, (Option<u32>, Option<u64>)>,
    /// Per (GPU, pid): memory held.
    processes: BTreeMap<(u32, u32), Option<u64>>,
}

/// The UUID of simulated GPU `index`, shaped like NVML's.
pub fn fake_uuid(index: u32) -> String {
    format!("GPU-fa4e0000-0000-4000-8000-{index:012x}")
}

impl FakeGpus {
    /// `2x24GiB` (two GPUs of 24 GiB), `24GiB,80GiB` (one of each), or `3` (three of 24 GiB),
    /// each optionally followed by `@FILE`, the script of readings.
    pub fn parse(spec: &str) -> Result<FakeGpus, String> {
        let (sizes, script) = match spec.split_once('@') {
            Some((sizes, script)) if !script.trim().is_empty() => (sizes, Some(PathBuf::from(script.trim()))),
            Some(_) => return Err(format!("--fake-gpus `{spec}`: `@` must be followed by the readings file")),
            None => (spec, None),
        };
        let mut memory = Vec::new();
        for part in sizes.split(',').map(str::trim).filter(|part| !part.is_empty()) {
            let (count, size) = match part.split_once(['x', 'X']) {
                Some((count, size)) => (count.trim(), size.trim()),
                None if part.chars().all(|c| c.is_ascii_digit()) => (part, "24GiB"),
                None => ("1", part),
            };
            let count: u32 =
                count.parse().map_err(|_| format!("`{part}` in --fake-gpus: expected N or NxSIZE, e.g. 2x24GiB"))?;
            let bytes = parse_bytes(size).map_err(|error| format!("--fake-gpus: {error}"))?;
            memory.extend((0..count).map(|_| bytes));
        }
        if memory.is_empty() {
            return Err(format!("--fake-gpus `{spec}` describes no GPU (expected e.g. 2x24GiB)"));
        }
        let gpus = memory
            .into_iter()
            .enumerate()
            .map(|(index, memory_total)| FakeGpu { index: index as u32, uuid: fake_uuid(index as u32), memory_total })
            .collect();
        Ok(FakeGpus { gpus, script, warned: AtomicBool::new(false) })
    }

    /// Keeps only these indices.
    pub fn restrict(mut self, indices: &[u32]) -> FakeGpus {
        self.gpus.retain(|gpu| indices.contains(&gpu.index));
        self
    }

    /// The script's readings now; a missing file scripts nothing.
    fn scripted(&self) -> Scripted {
        let Some(path) = &self.script else { return Scripted::default() };
        let Ok(text) = std::fs::read_to_string(path) else { return Scripted::default() };
        let (scripted, errors) = parse_script(&text);
        if let Some(error) = errors.first() {
            if !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(script = %path.display(), %error, "skipping lines of the fake GPU readings");
            }
        }
        scripted
    }
}

fn parse_script(text: &str) -> (Scripted, Vec<String>) {
    let mut scripted = Scripted::default();
    let mut errors = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        if let Err(error) = parse_line(line, &mut scripted) {
            errors.push(format!("line {}: {error}", number + 1));
        }
    }
    (scripted, errors)
}

fn parse_line(line: &str, scripted: &mut Scripted) -> Result<(), String> {
    let mut words: BTreeMap<&str, &str> = BTreeMap::new();
    for word in line.split_whitespace() {
        let (key, value) = word.split_once('=').ok_or_else(|| format!("`{word}` is not key=value"))?;
        if !matches!(key, "gpu" | "utilization" | "memory_used" | "pid" | "memory") {
            return Err(format!("unknown key `{key}` (gpu, utilization, memory_used, pid, memory)"));
        }
        words.insert(key, value);
    }
    let number = |key: &str| -> Result<Option<u32>, String> {
        words.get(key).map(|value| value.parse().map_err(|_| format!("`{key}={value}` is not a number"))).transpose()
    };
    let size =
        |key: &str| -> Result<Option<u64>, String> { words.get(key).map(|value| parse_bytes(value)).transpose() };
    let gpu = number("gpu")?.ok_or("a reading needs gpu=N")?;
    match number("pid")? {
        Some(pid) => {
            scripted.processes.insert((gpu, pid), size("memory")?);
        }
        None => {
            let utilization = number("utilization")?;
            if utilization.is_some_and(|percent| percent > 100) {
                return Err("utilization is a percentage, 0 to 100".into());
            }
            let entry = scripted.gpus.entry(gpu).or_default();
            entry.0 = utilization.or(entry.0);
            entry.1 = size("memory_used")?.or(entry.1);
        }
    }
    Ok(())
}

/// Whether a process exists (and is not a zombie), as NVML would still list it.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(')').is_some_and(|(_, rest)| rest.split_whitespace().next() != Some("Z")))
}

impl GpuInventory for FakeGpus {
    fn sample(&self) -> Vec<GpuSample> {
        let scripted = self.scripted();
        self.gpus
            .iter()
            .map(|gpu| {
                let (utilization, used) = scripted.gpus.get(&gpu.index).copied().unwrap_or_default();
                let held: u64 = scripted
                    .processes
                    .iter()
                    .filter(|((index, pid), _)| *index == gpu.index && alive(*pid))
                    .filter_map(|(_, memory)| *memory)
                    .sum();
                GpuSample {
                    index: gpu.index,
                    uuid: gpu.uuid.clone(),
                    name: "Fake GPU".into(),
                    memory_total: gpu.memory_total,
                    memory_used: used.unwrap_or(held).min(gpu.memory_total),
                    utilization: Some(utilization.unwrap_or(0)),
                    temperature: None,
                    power_watts: None,
                    at: 0,
                }
            })
            .collect()
    }

    fn processes(&self) -> Vec<GpuProcess> {
        let scripted = self.scripted();
        scripted
            .processes
            .into_iter()
            .filter(|((gpu, pid), _)| self.gpus.iter().any(|known| known.index == *gpu) && alive(*pid))
            .map(|((gpu, pid), memory)| GpuProcess { gpu, pid, memory })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_specs_parse() {
        let gpus = FakeGpus::parse("2x24GiB").unwrap().sample();
        assert_eq!(gpus.len(), 2);
        assert_eq!((gpus[1].index, gpus[1].memory_total), (1, 24 << 30));
        assert_eq!(gpus[1].uuid, "GPU-fa4e0000-0000-4000-8000-000000000001");
        let mixed = FakeGpus::parse("24GiB, 80GiB").unwrap().sample();
        assert_eq!(mixed.iter().map(|gpu| gpu.memory_total).collect::<Vec<_>>(), [24 << 30, 80 << 30]);
        assert_eq!(FakeGpus::parse("3").unwrap().sample().len(), 3);
        assert!(FakeGpus::parse("twox24").is_err());
        assert!(FakeGpus::parse("").is_err());
        assert!(FakeGpus::parse("2x8GiB@").unwrap_err().contains("readings file"));
    }

    #[test]
    fn a_script_sets_readings_and_later_lines_win() {
        let (scripted, errors) = parse_script(
            "# readings\ngpu=0 utilization=10\ngpu=0 utilization=85 memory_used=10GiB\n\
             gpu=1 pid=42 memory=3GiB\ngpu=1 pid=42 memory=5GiB\ngpu=1 temperature=80\nnonsense\n",
        );
        assert_eq!(scripted.gpus[&0], (Some(85), Some(10 << 30)));
        assert_eq!(scripted.processes[&(1, 42)], Some(5 << 30));
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].starts_with("line 6: unknown key `temperature`"), "{errors:?}");
        assert!(parse_script("gpu=0 utilization=150").1[0].contains("0 to 100"));
    }

    #[test]
    fn scripted_processes_that_are_alive_hold_memory() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("readings.txt");
        let me = std::process::id();
        // PID 0 never names a process of ours: it is left out, as NVML would.
        std::fs::write(&script, format!("gpu=0 utilization=40\ngpu=0 pid={me} memory=2GiB\ngpu=0 pid=0 memory=9GiB\n"))
            .unwrap();
        let gpus = FakeGpus::parse(&format!("2x24GiB@{}", script.display())).unwrap();
        let samples = gpus.sample();
        assert_eq!((samples[0].utilization, samples[0].memory_used), (Some(40), 2 << 30));
        assert_eq!((samples[1].utilization, samples[1].memory_used), (Some(0), 0));
        assert_eq!(gpus.processes(), vec![GpuProcess { gpu: 0, pid: me, memory: Some(2 << 30) }]);
    }
}
