//! The worker's own `CUDA_VISIBLE_DEVICES`, as Slurm (`--gres=gpu`) and Kubernetes' device
//! plugin hand a process its GPUs: the set of GPUs this worker may use, mapped to NVML devices.
//!
//! CUDA reads each entry as a device index or a GPU UUID (`GPU-8d2c...`, or a unique prefix of
//! one). Indices count GPUs in PCI bus order here: the order NVML numbers them, and the order
//! CUDA uses with `CUDA_DEVICE_ORDER=PCI_BUS_ID`, which the worker sets for its jobs. Unlike
//! CUDA, which silently stops at an entry it cannot resolve, an entry naming a GPU NVML does
//! not see is an error: a worker started on the wrong GPUs must say so rather than run there.
//! As in CUDA, a negative index ends the list (`-1` hides every GPU).

/// The NVML indices of the GPUs `spec` names, given the UUIDs of the GPUs NVML sees (in NVML
/// order), sorted; an empty list hides every GPU.
pub fn visible_indices(spec: &str, uuids: &[String]) -> Result<Vec<u32>, String> {
    let mut chosen: Vec<u32> = Vec::new();
    for entry in spec.split(',').map(str::trim) {
        if entry.is_empty() {
            continue;
        }
        let index = if let Ok(number) = entry.parse::<i64>() {
            if number < 0 {
                break;
            }
            match u32::try_from(number).ok().filter(|index| (*index as usize) < uuids.len()) {
                Some(index) => index,
                None => return Err(missing_index(number, uuids.len())),
            }
        } else if entry.len() >= 4 && entry[..4].eq_ignore_ascii_case("MIG-") {
            return Err(format!(
                "CUDA_VISIBLE_DEVICES names the MIG instance {entry}; MIG instances are not supported, name whole GPUs"
            ));
        } else if entry.len() >= 4 && entry[..4].eq_ignore_ascii_case("GPU-") {
            by_uuid(entry, uuids)?
        } else {
            return Err(format!(
                "CUDA_VISIBLE_DEVICES entry `{entry}` is neither a GPU index nor a GPU UUID (GPU-...)"
            ));
        };
        if chosen.contains(&index) {
            return Err(format!("CUDA_VISIBLE_DEVICES names GPU {index} ({}) twice", uuids[index as usize]));
        }
        chosen.push(index);
    }
    chosen.sort_unstable();
    Ok(chosen)
}

fn missing_index(number: i64, count: usize) -> String {
    match count {
        0 => format!("CUDA_VISIBLE_DEVICES names GPU {number}, but NVML sees no GPU on this box"),
        _ => format!("CUDA_VISIBLE_DEVICES names GPU {number}, but NVML sees {count} (0..{})", count - 1),
    }
}

/// The GPU whose UUID is `entry`, or starts with it when only one does (as CUDA accepts).
fn by_uuid(entry: &str, uuids: &[String]) -> Result<u32, String> {
    let lower = entry.to_ascii_lowercase();
    if let Some(index) = uuids.iter().position(|uuid| uuid.to_ascii_lowercase() == lower) {
        return Ok(index as u32);
    }
    let matches: Vec<usize> =
        (0..uuids.len()).filter(|index| uuids[*index].to_ascii_lowercase().starts_with(&lower)).collect();
    match matches.as_slice() {
        [index] => Ok(*index as u32),
        [] => {
            let seen = if uuids.is_empty() { "none".to_string() } else { uuids.join(", ") };
            Err(format!("CUDA_VISIBLE_DEVICES names {entry}, which NVML does not see (it sees {seen})"))
        }
        several => Err(format!(
            "CUDA_VISIBLE_DEVICES entry {entry} matches {} GPUs ({}); give more of the UUID",
            several.len(),
            several.iter().map(|index| uuids[*index].as_str()).collect::<Vec<_>>().join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uuids() -> Vec<String> {
        ["GPU-8d2c1a5e-0000-4000-8000-000000000001", "GPU-8d2c9f00-0000-4000-8000-000000000002", "GPU-77aa0000-1111"]
            .map(String::from)
            .to_vec()
    }

    #[test]
    fn indices_and_uuids_map_to_nvml_devices() {
        assert_eq!(visible_indices("0,2", &uuids()), Ok(vec![0, 2]));
        assert_eq!(visible_indices(" 2 , 0 ", &uuids()), Ok(vec![0, 2]));
        assert_eq!(visible_indices("GPU-8d2c9f00-0000-4000-8000-000000000002", &uuids()), Ok(vec![1]));
        // A unique prefix, any case, as CUDA accepts it; mixed with an index.
        assert_eq!(visible_indices("gpu-77AA,0", &uuids()), Ok(vec![0, 2]));
        // Empty or a leading negative index: no GPU at all; a later one ends the list.
        assert_eq!(visible_indices("", &uuids()), Ok(vec![]));
        assert_eq!(visible_indices("-1", &uuids()), Ok(vec![]));
        assert_eq!(visible_indices("1,-1,0", &uuids()), Ok(vec![1]));
    }

    #[test]
    fn a_gpu_nvml_does_not_see_is_named() {
        let error = visible_indices("0,5", &uuids()).unwrap_err();
        assert_eq!(error, "CUDA_VISIBLE_DEVICES names GPU 5, but NVML sees 3 (0..2)");
        let error = visible_indices("GPU-deadbeef", &uuids()).unwrap_err();
        assert!(
            error.starts_with("CUDA_VISIBLE_DEVICES names GPU-deadbeef, which NVML does not see (it sees GPU-8d2c1a5e"),
            "{error}"
        );
        let error = visible_indices("GPU-8d2c", &uuids()).unwrap_err();
        assert!(error.contains("matches 2 GPUs"), "{error}");
        assert!(visible_indices("MIG-abc", &uuids()).unwrap_err().contains("MIG"));
        assert!(visible_indices("0,0", &uuids()).unwrap_err().contains("twice"));
        assert!(visible_indices("first", &uuids()).unwrap_err().contains("`first`"));
        assert!(visible_indices("0", &[]).unwrap_err().contains("sees no GPU"));
    }
}
