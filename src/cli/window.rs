//! The model, window and memory flags `segment` and `plan` both take: declared once here and
//! read by one merge, so that `plan` plans what `segment` runs with the same flags.

use super::flags;
use crate::engine::{AxisOrder, Device, Options};
use crate::pipeline::Overrides;
use crate::Result;
use clap::Args;
use std::path::PathBuf;

/// The flags `segment` and `plan` share (each command flattens this one struct). The window
/// settings have no clap default: a flag not typed leaves the manifest's value, else the
/// engine's default ([`Options::default`]), in force.
#[derive(Args, Debug, Clone, PartialEq, Default)]
pub struct WindowArgs {
    /// ONNX model (exported from PyTorch); repeat for an ensemble (segment averages the models;
    /// plan takes one)
    #[arg(long, short = 'm', required = true)]
    pub model: Vec<PathBuf>,
    /// Model manifest (TOML or JSON); default: NAME.toml or NAME.json beside the first NAME.onnx
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Resample the input to this voxel size (network axes D,H,W, mm) before inference, or
    /// "none"; default: the manifest's
    #[arg(long)]
    pub spacing: Option<String>,
    /// Turn the input to these axis codes before the network (e.g. RAS, LPS; "stored": as the
    /// file stores it) and every output back onto the input's grid; default: the manifest's
    #[arg(long, value_name = "CODES|stored")]
    pub orientation: Option<String>,
    /// Network axes from the file's: xyz (nibabel/MONAI) or zyx (SimpleITK/nnU-Net); default:
    /// the manifest's, else xyz
    #[arg(long, value_parser = ["xyz", "zyx"])]
    pub axis_order: Option<String>,
    /// Window size in network axes: one number or D,H,W; default: the manifest's, else the
    /// model's fixed input size, else 128 clipped to the volume. The planner never shrinks it:
    /// it only chooses the batch
    #[arg(long)]
    pub roi: Option<String>,
    /// Overlap between windows in [0,1): one number or one per axis; default: the manifest's,
    /// else 0.5
    #[arg(long)]
    pub overlap: Option<String>,
    /// Window placement: MONAI's (fixed step, last window pulled back) or nnU-Net's (even
    /// steps); default: the manifest's, else monai
    #[arg(long, value_parser = ["monai", "nnunet"])]
    pub placement: Option<String>,
    /// Windows per network call; default: planned under the memory budget (a typed batch is
    /// only checked against it)
    #[arg(long)]
    pub batch: Option<usize>,
    /// Memory the run may use, e.g. 4GiB, 512MiB, 8GB (device memory on CUDA, the host working
    /// set on CPU); the batch is planned under it, the window never shrinks (too small a budget
    /// is an error). Default: 80% of free device memory, or the least of half of MemAvailable,
    /// half of the cgroup's headroom and 75% of the address space left under RLIMIT_AS
    #[arg(long)]
    pub memory_budget: Option<String>,
    /// Run (or plan) a --roi smaller than the model's receptive field (counted up to 64 voxels
    /// per axis), with a warning, instead of refusing it
    #[arg(long)]
    pub allow_small_roi: bool,
    /// auto (CUDA device 0 if it opens, else the CPU), cpu, cuda, cuda:N; segment also takes a
    /// list like cuda:0,1, which splits one volume's windows across the GPUs or hands several
    /// files out to them (plan plans one device)
    #[arg(long, default_value = "auto")]
    pub device: String,
}

impl WindowArgs {
    /// `--device`: one device, or a list.
    pub fn devices(&self) -> Result<Vec<Device>> {
        super::segment::dataset::parse_devices(&self.device)
    }

    /// The engine options these flags give (`keep_logits`: the blended outputs are kept). The
    /// window settings stay at their defaults here: typed, they are [`Self::overrides`].
    pub fn options(&self, keep_logits: bool) -> Result<Options> {
        Ok(Options {
            roi: flags::roi(self.roi.as_deref())?,
            batch: flags::batch(self.batch)?,
            keep_logits,
            memory_budget: flags::memory_budget(self.memory_budget.as_deref())?,
            // Only a window the user types is refused: a manifest's roi is the model's own.
            refuse_small_roi: !self.allow_small_roi && self.roi.is_some(),
            ..Options::default()
        })
    }

    /// The settings typed here that beat the manifest (`keep_logits`: the blended outputs are
    /// kept); the caller adds its own.
    pub fn overrides(&self, keep_logits: bool) -> Result<Overrides> {
        Ok(Overrides {
            manifest: self.manifest.clone(),
            roi: flags::roi(self.roi.as_deref())?,
            overlap: self.overlap.as_deref().map(flags::overlap).transpose()?,
            placement: self.placement.as_deref().map(flags::placement),
            axis_order: self
                .axis_order
                .as_deref()
                .map(str::parse::<AxisOrder>)
                .transpose()?,
            spacing: flags::spacing(self.spacing.as_deref())?,
            orientation: flags::orientation(self.orientation.as_deref())?,
            keep_logits,
            ..Overrides::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Cli, Command};
    use super::WindowArgs;
    use clap::{CommandFactory, Parser};

    /// The shared flags as `plan` and as `segment` parse the same words.
    fn both(flags: &[&str]) -> (WindowArgs, WindowArgs) {
        let parse = |head: &[&str]| {
            let argv = ["voxtile"].iter().chain(head).chain(flags);
            match Cli::try_parse_from(argv).unwrap().command {
                Command::Plan(a) => a.window,
                Command::Segment(a) => a.window,
                c => panic!("{c:?}"),
            }
        };
        (
            parse(&["plan", "in.nii.gz"]),
            parse(&["segment", "in.nii.gz", "-o", "out.nii.gz"]),
        )
    }

    #[test]
    fn plan_and_segment_parse_the_shared_flags_alike() {
        Cli::command().debug_assert();
        let (plan, segment) = both(&["-m", "a.onnx"]);
        assert_eq!(plan, segment);
        // Nothing typed: no window setting beats the manifest, on either command.
        let untyped = WindowArgs {
            model: vec!["a.onnx".into()],
            device: "auto".into(),
            ..WindowArgs::default()
        };
        assert_eq!(plan, untyped);
        let every = [
            "-m=a.onnx",
            "--manifest=m.toml",
            "--spacing=1,1,2",
            "--orientation=LPS",
            "--axis-order=zyx",
            "--roi=64",
            "--overlap=0.25",
            "--placement=nnunet",
            "--batch=3",
            "--memory-budget=2GiB",
            "--allow-small-roi",
            "--device=cpu",
        ];
        let (plan, segment) = both(&every);
        assert_eq!(plan, segment);
        assert_ne!(plan, untyped);
        assert_eq!(plan.overlap.as_deref(), Some("0.25"));
    }
}
