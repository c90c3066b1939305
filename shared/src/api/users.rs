//! Who a request comes from, and what each user's jobs used of the GPUs (issue 29, item 1).

use serde::{Deserialize, Serialize};

/// `GET /api/whoami`: the user a token names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Whoami {
    pub name: String,
    /// May cancel, retry, reprioritise, resume and remove anyone's sweeps.
    pub admin: bool,
    /// False on a server without tokens, where every request is the user `default`.
    pub auth_required: bool,
}

/// `GET /api/usage`: GPU time per user over rolling windows.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Unix ms the windows end at.
    pub at: i64,
    /// Every user with a token, and every owner whose jobs held GPUs in the last 7 days, by name.
    pub users: Vec<UserUsage>,
}

/// What one user's attempts held of the GPUs: wall time times GPUs, as their workers measured
/// it ([`super::GpuUsage::gpu_hours`]), counted when each attempt ended.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UserUsage {
    pub user: String,
    /// Over the last 24 hours.
    pub gpu_hours_24h: f64,
    /// Over the last 7 days.
    pub gpu_hours_7d: f64,
}
