//! What decides a run besides the model and the volume: axes, normalisation, windows, devices.

use crate::backend::Device;
use crate::sys::cancel::CancelToken;
use crate::tiling::{BlendMode, PadMode, Placement};
use crate::volume::intensity::Intensity;
use crate::{Error, Result};

/// How the network's D,H,W axes map onto the file's i,j,k axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AxisOrder {
    /// D,H,W = i,j,k: nibabel + MONAI.
    Xyz,
    /// D,H,W = k,j,i: SimpleITK + nnU-Net.
    Zyx,
}

impl AxisOrder {
    /// A per-axis value of the file's i,j,k (a shape, a spacing) in network axes D,H,W (the
    /// permutation is its own inverse: it also maps network axes back to the file's).
    pub fn network<T: Copy>(self, [i, j, k]: [T; 3]) -> [T; 3] {
        match self {
            AxisOrder::Xyz => [i, j, k],
            AxisOrder::Zyx => [k, j, i],
        }
    }
}

impl std::str::FromStr for AxisOrder {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "xyz" | "ijk" => Ok(AxisOrder::Xyz),
            "zyx" | "kji" => Ok(AxisOrder::Zyx),
            _ => Err(Error::Invalid(format!(
                "unknown axis order '{s}': use xyz or zyx"
            ))),
        }
    }
}

/// Everything that decides the result besides the model and the volume.
#[derive(Clone, Debug)]
pub struct Options {
    /// Window size in network axes; None: the model's fixed input size, else 128 clipped to the
    /// volume (rounded up to what the network's strides need).
    pub roi: Option<[usize; 3]>,
    /// Fraction of the window shared by neighbours, per network axis (in [0, 1)).
    pub overlap: [f64; 3],
    /// How window outputs are weighted when blended.
    pub blend: BlendMode,
    /// Gaussian sigma as a fraction of the window (`BlendMode::Gaussian` only).
    pub sigma_scale: [f64; 3],
    /// Where windows start: MONAI's placement or nnU-Net's even spread.
    pub placement: Placement,
    /// Windows per backend call; None: 1 on CPU, 2 on CUDA.
    pub batch: Option<usize>,
    /// Values read outside the volume.
    pub pad: PadMode,
    /// The device that runs the network (the first when several share a volume).
    pub device: Device,
    /// More devices for each volume: with `device` they share its windows by D planes (windows
    /// near a cut run on both neighbours), and labels and outputs are bitwise those of `device`
    /// alone. All CPU (`cpu` may repeat: several CPU workers) or all CUDA. Set both with
    /// [`Options::set_devices`].
    pub extra_devices: Vec<Device>,
    /// How the network's D,H,W map onto the file's i,j,k.
    pub axis_order: AxisOrder,
    /// Keep the blended raw outputs (what MONAI's sliding_window_inference returns).
    pub keep_logits: bool,
    /// The input is the volume mirrored along these file axes (i, j, k): a test-time
    /// augmentation pass. The window weights are mirrored too, so that once the outputs are
    /// flipped back each window carries the weights of the unmirrored pass, as nnU-Net's
    /// per-window mirroring does (its gaussian is centred at `n // 2`, not symmetric).
    pub mirrored: [bool; 3],
    /// Intensity normalisation before windowing.
    pub normalize: Intensity,
    /// Bytes the run may use (device memory on CUDA, the host working set on CPU); None: 80% of
    /// the device's free memory, or half of the memory left to the process (RAM, RLIMIT_AS,
    /// cgroup). The planner picks the batch under it and never shrinks the window (see
    /// [`crate::plan::choose`]).
    pub memory_budget: Option<u64>,
    /// Stops the runs of every engine made with these options (or a clone of them): see
    /// [`CancelToken`]. A fresh token by default.
    pub cancel: CancelToken,
    /// Blend into whole-volume accumulators instead of streaming slabs (the reference the slab
    /// path is tested against; needs C × volume fp32).
    #[doc(hidden)]
    pub blend_in_memory: bool,
    /// CPU test hook: the N-th backend call (1-based, counted over the whole run) fails once
    /// with `Error::OutOfMemory`. `VOXTILE_INJECT_OOM=N` sets it for the CPU backend (the CUDA
    /// pipeline reads the variable itself).
    #[doc(hidden)]
    pub inject_oom: Option<usize>,
    /// Refuse a window (`roi`) smaller than the model's receptive field (see
    /// [`crate::plan::refuse_small_roi`]); off, it runs with a warning. The command line
    /// refuses unless `--allow-small-roi`.
    pub refuse_small_roi: bool,
}

impl Default for Options {
    /// nnU-Net's defaults (gaussian, overlap 0.5) with MONAI's sigma_scale and zero padding.
    fn default() -> Self {
        Options {
            roi: None,
            overlap: [0.5; 3],
            blend: BlendMode::Gaussian,
            sigma_scale: [0.125; 3],
            placement: Placement::Monai,
            batch: None,
            pad: PadMode::Constant(0.0),
            device: Device::Auto,
            extra_devices: Vec::new(),
            axis_order: AxisOrder::Xyz,
            keep_logits: false,
            mirrored: [false; 3],
            normalize: Intensity::None,
            memory_budget: None,
            cancel: CancelToken::new(),
            blend_in_memory: false,
            inject_oom: None,
            refuse_small_roi: false,
        }
    }
}

impl Options {
    /// Every device of a run: `device`, then `extra_devices`.
    pub fn devices(&self) -> Vec<Device> {
        std::iter::once(self.device)
            .chain(self.extra_devices.iter().copied())
            .collect()
    }

    /// Run on `list` (the first becomes `device`); an empty list leaves the options as they are.
    pub fn set_devices(&mut self, list: &[Device]) {
        if let Some((first, rest)) = list.split_first() {
            self.device = *first;
            self.extra_devices = rest.to_vec();
        }
    }
}
