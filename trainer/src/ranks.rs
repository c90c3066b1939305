//! Who this `app train` process is in a data-parallel run, decided from the variables torchrun
//! sets (`WORLD_SIZE`, `RANK`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`)
//! and, for several machines, `NNODES` and `NODE_RANK`:
//!
//! - `RANK` set: a rank (started by our launcher, by torchrun, or by hand);
//! - otherwise, with more than one rank wanted here (`ddp: N`, one per visible GPU, or the
//!   `WORLD_SIZE` a worker sets for a multi-GPU job): the launcher, which starts the ranks of
//!   this machine as children and watches them;
//! - otherwise a single process.
//!
//! Pure: the environment comes in as a value, so every combination is tested without one.

use crate::config::{config_error, ConfigError};

/// The torchrun variables, as found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RankEnv {
    pub world_size: Option<String>,
    pub rank: Option<String>,
    pub local_rank: Option<String>,
    pub local_world_size: Option<String>,
    pub master_addr: Option<String>,
    pub master_port: Option<String>,
    pub nnodes: Option<String>,
    pub node_rank: Option<String>,
}

impl RankEnv {
    pub fn from_env() -> RankEnv {
        let read = |name: &str| std::env::var(name).ok().filter(|value| !value.trim().is_empty());
        RankEnv {
            world_size: read("WORLD_SIZE"),
            rank: read("RANK"),
            local_rank: read("LOCAL_RANK"),
            local_world_size: read("LOCAL_WORLD_SIZE"),
            master_addr: read("MASTER_ADDR"),
            master_port: read("MASTER_PORT"),
            nnodes: read("NNODES"),
            node_rank: read("NODE_RANK"),
        }
    }
}

/// One rank's place in the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankInfo {
    pub rank: usize,
    pub local_rank: usize,
    pub world: usize,
    pub local_world: usize,
    pub master_addr: String,
    pub master_port: u16,
}

impl RankInfo {
    pub fn is_main(&self) -> bool {
        self.rank == 0
    }
}

/// What the launcher starts on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchPlan {
    pub local_ranks: usize,
    pub node_rank: usize,
    pub world: usize,
    pub master_addr: String,
    /// `None`: pick a free port (one machine only).
    pub master_port: Option<u16>,
}

impl LaunchPlan {
    /// The environment of local rank `local` (the variables torchrun gives its children).
    pub fn child_env(&self, local: usize, port: u16) -> Vec<(&'static str, String)> {
        vec![
            ("RANK", (self.node_rank * self.local_ranks + local).to_string()),
            ("LOCAL_RANK", local.to_string()),
            ("WORLD_SIZE", self.world.to_string()),
            ("LOCAL_WORLD_SIZE", self.local_ranks.to_string()),
            ("GROUP_RANK", self.node_rank.to_string()),
            ("NODE_RANK", self.node_rank.to_string()),
            ("MASTER_ADDR", self.master_addr.clone()),
            ("MASTER_PORT", port.to_string()),
        ]
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Single,
    Launcher(LaunchPlan),
    Rank(RankInfo),
}

/// `ddp` is the config's (0 = automatic); `gpus` the CUDA devices this process sees, `None`
/// when it trains on the CPU.
pub fn role(env: &RankEnv, ddp: usize, gpus: Option<usize>) -> Result<Role, ConfigError> {
    let number = |value: &Option<String>, name: &str| -> Result<Option<usize>, ConfigError> {
        value
            .as_deref()
            .map(|text| {
                text.trim().parse::<usize>().map_err(|_| config_error(name, format!("`{text}` is not a number")))
            })
            .transpose()
    };
    let world = number(&env.world_size, "WORLD_SIZE")?;
    let master_addr = env.master_addr.clone().unwrap_or_else(|| "127.0.0.1".to_string());
    let port = |value: &Option<String>| -> Result<Option<u16>, ConfigError> {
        value
            .as_deref()
            .map(|text| {
                text.trim()
                    .parse::<u16>()
                    .ok()
                    .filter(|port| *port > 0)
                    .ok_or_else(|| config_error("MASTER_PORT", format!("`{text}` is not a port")))
            })
            .transpose()
    };
    if world == Some(0) {
        return Err(config_error("WORLD_SIZE", "must be at least 1"));
    }

    if let Some(rank) = number(&env.rank, "RANK")? {
        let world = world.ok_or_else(|| config_error("WORLD_SIZE", "RANK is set, so WORLD_SIZE must be too"))?;
        if rank >= world {
            return Err(config_error("RANK", format!("{rank} is not below WORLD_SIZE {world}")));
        }
        // A world of one is still a rank (torchrun with one process): it joins a one-rank
        // group, so that path can be checked on a machine with a single GPU.
        let local_rank = number(&env.local_rank, "LOCAL_RANK")?.unwrap_or(rank);
        let local_world = number(&env.local_world_size, "LOCAL_WORLD_SIZE")?.unwrap_or(world);
        if let Some(gpus) = gpus {
            if local_rank >= gpus {
                return Err(config_error("LOCAL_RANK", format!("{local_rank} needs GPU {local_rank}, {gpus} visible")));
            }
        }
        return Ok(Role::Rank(RankInfo {
            rank,
            local_rank,
            world,
            local_world: local_world.max(1),
            master_addr,
            master_port: port(&env.master_port)?.unwrap_or(29500),
        }));
    }

    let nodes = number(&env.nnodes, "NNODES")?.unwrap_or(1).max(1);
    let node_rank = number(&env.node_rank, "NODE_RANK")?.unwrap_or(0);
    if node_rank >= nodes {
        return Err(config_error("NODE_RANK", format!("{node_rank} is not below NNODES {nodes}")));
    }
    let wanted_here = match (ddp, world) {
        (0, Some(world)) => {
            if world % nodes != 0 {
                return Err(config_error("WORLD_SIZE", format!("{world} ranks do not divide over {nodes} machines")));
            }
            world / nodes
        }
        (0, None) => gpus.unwrap_or(1).max(1),
        (ddp, Some(world)) if ddp * nodes != world => {
            return Err(config_error(
                "ddp",
                format!("{ddp} rank(s) per machine x {nodes} machine(s) but WORLD_SIZE is {world} (the GPUs this job was given)"),
            ));
        }
        (ddp, _) => ddp,
    };
    if let Some(gpus) = gpus {
        if wanted_here > gpus {
            return Err(config_error("ddp", format!("{wanted_here} ranks need {wanted_here} GPUs, {gpus} visible")));
        }
    }
    if wanted_here == 1 && nodes == 1 {
        return Ok(Role::Single);
    }
    if nodes > 1 && (env.master_addr.is_none() || env.master_port.is_none()) {
        return Err(config_error("MASTER_ADDR", "several machines (NNODES > 1) need MASTER_ADDR and MASTER_PORT"));
    }
    Ok(Role::Launcher(LaunchPlan {
        local_ranks: wanted_here,
        node_rank,
        world: wanted_here * nodes,
        master_addr,
        master_port: port(&env.master_port)?,
    }))
}

/// Intra-op threads for one rank: the cores this process may use, shared among the ranks of
/// this machine (at least one each).
pub fn share_of_cores(cores: usize, local_ranks: usize) -> usize {
    (cores / local_ranks.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> RankEnv {
        let get = |name: &str| pairs.iter().find(|(key, _)| *key == name).map(|(_, value)| value.to_string());
        RankEnv {
            world_size: get("WORLD_SIZE"),
            rank: get("RANK"),
            local_rank: get("LOCAL_RANK"),
            local_world_size: get("LOCAL_WORLD_SIZE"),
            master_addr: get("MASTER_ADDR"),
            master_port: get("MASTER_PORT"),
            nnodes: get("NNODES"),
            node_rank: get("NODE_RANK"),
        }
    }

    #[test]
    fn one_process_unless_more_ranks_are_wanted() {
        assert_eq!(role(&env(&[]), 0, None), Ok(Role::Single));
        assert_eq!(role(&env(&[]), 1, Some(4)), Ok(Role::Single));
        assert_eq!(role(&env(&[]), 0, Some(1)), Ok(Role::Single));
        assert_eq!(role(&env(&[("WORLD_SIZE", "1")]), 0, Some(1)), Ok(Role::Single));
    }

    #[test]
    fn the_launcher_starts_one_rank_per_gpu_or_per_ddp() {
        let Ok(Role::Launcher(plan)) = role(&env(&[]), 0, Some(4)) else { panic!() };
        assert_eq!((plan.local_ranks, plan.world, plan.master_port), (4, 4, None));
        let Ok(Role::Launcher(plan)) = role(&env(&[]), 2, None) else { panic!() };
        assert_eq!((plan.local_ranks, plan.world, plan.master_addr.as_str()), (2, 2, "127.0.0.1"));
        // A worker's two-GPU job: WORLD_SIZE and a port, no RANK.
        let worker = env(&[("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "41234")]);
        let Ok(Role::Launcher(plan)) = role(&worker, 0, Some(2)) else { panic!() };
        assert_eq!((plan.local_ranks, plan.master_port), (2, Some(41234)));
        let child = plan.child_env(1, 41234);
        assert!(child.contains(&("RANK", "1".into())) && child.contains(&("LOCAL_RANK", "1".into())));
        assert!(child.contains(&("WORLD_SIZE", "2".into())) && child.contains(&("MASTER_PORT", "41234".into())));
    }

    #[test]
    fn several_machines_number_their_ranks_by_node() {
        let node = env(&[
            ("WORLD_SIZE", "8"),
            ("NNODES", "2"),
            ("NODE_RANK", "1"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
        ]);
        let Ok(Role::Launcher(plan)) = role(&node, 0, Some(4)) else { panic!() };
        assert_eq!((plan.local_ranks, plan.world, plan.node_rank), (4, 8, 1));
        assert!(plan.child_env(2, 29500).contains(&("RANK", "6".into())));
        let no_address = env(&[("WORLD_SIZE", "8"), ("NNODES", "2")]);
        assert_eq!(role(&no_address, 0, Some(4)).unwrap_err().key, "MASTER_ADDR");
    }

    #[test]
    fn a_rank_reads_its_place() {
        let rank = env(&[("WORLD_SIZE", "2"), ("RANK", "1"), ("LOCAL_RANK", "1"), ("MASTER_PORT", "1234")]);
        let Ok(Role::Rank(info)) = role(&rank, 0, Some(2)) else { panic!() };
        assert_eq!((info.rank, info.local_rank, info.world, info.master_port), (1, 1, 2, 1234));
        assert!(!info.is_main());
        let alone = env(&[("WORLD_SIZE", "1"), ("RANK", "0")]);
        let Ok(Role::Rank(info)) = role(&alone, 0, Some(1)) else { panic!() };
        assert_eq!((info.world, info.master_addr.as_str(), info.master_port), (1, "127.0.0.1", 29500));
    }

    #[test]
    fn each_rank_gets_its_share_of_the_cores() {
        assert_eq!(share_of_cores(16, 1), 16);
        assert_eq!(share_of_cores(16, 4), 4);
        assert_eq!(share_of_cores(2, 4), 1);
        assert_eq!(share_of_cores(1, 0), 1);
    }

    #[test]
    fn mistakes_name_the_variable_or_key() {
        let key = |pairs: &[(&str, &str)], ddp, gpus| role(&env(pairs), ddp, gpus).unwrap_err().key;
        assert_eq!(key(&[("RANK", "0")], 0, None), "WORLD_SIZE");
        assert_eq!(key(&[("RANK", "2"), ("WORLD_SIZE", "2")], 0, None), "RANK");
        assert_eq!(key(&[("WORLD_SIZE", "two")], 0, None), "WORLD_SIZE");
        assert_eq!(key(&[("WORLD_SIZE", "2"), ("RANK", "1"), ("MASTER_PORT", "http")], 0, None), "MASTER_PORT");
        assert_eq!(key(&[("WORLD_SIZE", "2")], 4, Some(4)), "ddp");
        assert_eq!(key(&[], 4, Some(2)), "ddp");
        assert_eq!(key(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1")], 0, Some(1)), "LOCAL_RANK");
    }
}
