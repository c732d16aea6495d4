//! The memory planner: the window is the model's or the user's (never shrunk to fit), the batch
//! is chosen under a budget through the device's [`MemoryModel`] (an opened backend's, with its
//! real capabilities, or [`crate::backend::memory_model`] without a device); `voxtile plan`
//! prints the choice, `--report` puts its prediction next to the measured peak. How each backend
//! models its memory: `backend::cpu::memory` and `backend::cuda::memory`.

mod choose;
mod summary;

pub use crate::backend::memory::{Breakdown, Estimate, PeakNode, Target, Workload};
pub use crate::backend::MemoryModel;
pub use crate::sys::memory::{
    budget_of, budget_percent, cgroup_available, cgroup_headroom, format_bytes, host_available,
    host_budget, mem_available, parse_bytes, parse_cgroup_limit, parse_mem_available,
    parse_proc_cgroup, tightest, RLIMIT_AS_LEFT,
};
pub use choose::{
    choose, default_roi, estimate, receptive_field_warning, refuse_small_roi, with_budget_source,
    MAX_BANDS, MAX_BAND_POSITIONS,
};
use serde::Serialize;

/// What the planner was asked.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// Bytes the budgeted breakdown may reach.
    pub budget: u64,
    /// The budget was given (`--memory-budget`); otherwise the default batch is kept when it
    /// fits, and a user's explicit roi + batch over budget only warns.
    pub budget_explicit: bool,
    /// A window the user fixed (`--roi`); None: the planner picks it.
    pub user_roi: Option<[usize; 3]>,
    /// A batch the user fixed (`--batch`); None: the planner picks it.
    pub user_batch: Option<usize>,
    /// The volume and what the run keeps.
    pub workload: Workload,
}

/// The chosen window and batch with their prediction.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// Window size in network axes.
    pub roi: [usize; 3],
    /// Windows per backend call.
    pub batch: usize,
    /// Windows on the volume.
    pub windows: usize,
    /// Bands along H run one after another (1: the whole cross-section at once; more when its
    /// accumulators do not fit the budget), cut by [`crate::tiling::bands`].
    pub bands: usize,
    /// Windows run: `windows` plus those near a band cut, which run in both bands.
    pub windows_run: usize,
    /// The budget the plan was checked against, bytes.
    pub budget: u64,
    /// How the batch was found: "default" (kept), "planned" (chosen under the budget), "user".
    pub how: String,
    /// The predicted memory of this roi, batch and bands.
    pub estimate: Estimate,
    /// One line for the user, set when a user's explicit roi and batch exceed a default budget
    /// (run anyway) or an explicit roi is below the model's receptive field.
    pub warning: Option<String>,
}

/// Largest batch the planner considers.
pub const MAX_BATCH: usize = 16;
/// Largest default window side of a dynamic model (a user's `--roi` may be larger).
pub const MAX_ROI: usize = 128;
