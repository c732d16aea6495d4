//! The flags of `voxtile segment`, as clap parses them; [`super::config`] turns them into the
//! one validated configuration.

use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct SegmentArgs {
    /// Input volume: NIfTI (4D = channels), NRRD, MetaImage, .hdr/.img, or a DICOM series folder;
    /// a folder of cases is a batch
    pub input: PathBuf,
    /// The SeriesInstanceUID to read from a DICOM folder that holds several series
    #[arg(long, value_name = "UID")]
    pub series: Option<String>,
    /// ONNX model (exported from PyTorch); repeat for an ensemble
    #[arg(long, short = 'm', required = true)]
    pub model: Vec<PathBuf>,
    /// Output label map (.nii.gz or .nii), or a folder (ending in / or existing): FOLDER/<case>.nii.gz
    #[arg(long, short = 'o')]
    pub output: PathBuf,
    #[command(flatten)]
    pub pipe: PipelineArgs,
    /// Window size in network axes: one number or D,H,W (default: the model's fixed size, else 128)
    #[arg(long)]
    pub roi: Option<String>,
    /// Overlap between windows in [0,1): one number or one per axis
    #[arg(long, default_value = "0.5")]
    pub overlap: String,
    /// Window weights for blending
    #[arg(long, default_value = "gaussian", value_parser = ["gaussian", "constant", "hann"])]
    pub blend: String,
    /// Gaussian sigma as a fraction of the roi (MONAI's sigma_scale): one number or per axis
    #[arg(long, default_value = "0.125")]
    pub sigma_scale: String,
    /// Window placement: MONAI's (fixed step, last window pulled back) or nnU-Net's (even steps)
    #[arg(long, default_value = "monai", value_parser = ["monai", "nnunet"])]
    pub placement: String,
    /// Windows per network call
    #[arg(long)]
    pub batch: Option<usize>,
    /// Padding where the volume is smaller than the roi: a constant value or "edge"
    #[arg(long, default_value = "0")]
    pub pad: String,
    /// Also write the blended raw outputs (float32, x,y,z,channel)
    #[arg(long)]
    pub logits: Option<PathBuf>,
    /// auto (CUDA if present, else CPU), cpu, cuda, cuda:N; a list like cuda:0,1 splits one
    /// volume's windows across the GPUs, or hands several files out to them
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Write a JSON report (shapes, windows, stage times, peak memory)
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Network axes from the file's: xyz (nibabel/MONAI, default) or zyx (SimpleITK/nnU-Net)
    #[arg(long, default_value = "xyz", value_parser = ["xyz", "zyx"])]
    pub axis_order: String,
    /// Intensity normalisation before windowing: none, zscore (per volume), ct:LO,HI,MEAN,STD
    #[arg(long, default_value = "none")]
    pub normalize: String,
    /// Overwrite existing output files
    #[arg(long)]
    pub force: bool,
    /// Memory the run may use, e.g. 4GiB, 512MiB, 8GB (device memory on CUDA, the host working
    /// set on CPU); the batch is planned under it, the window never shrinks (too small a budget
    /// is an error). Default: 80% of free device memory, or the least of half of MemAvailable,
    /// half of the cgroup's headroom and 75% of the address space left under RLIMIT_AS
    #[arg(long)]
    pub memory_budget: Option<String>,
    /// Run a --roi smaller than the model's receptive field (counted up to 64 voxels per axis),
    /// with a warning, instead of refusing it
    #[arg(long)]
    pub allow_small_roi: bool,
    /// Keep only the largest connected component (6-connectivity) of each foreground class, or
    /// of the classes listed after `=`: --keep-largest=liver,spleen (names or label values)
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "all", value_name = "CLASSES")]
    pub keep_largest: Option<String>,
    /// Remove connected components smaller than ML millilitres (from the voxel spacing), in
    /// each foreground class or in those listed after a colon: 1.5 or 1.5:liver,spleen
    #[arg(long, value_name = "ML[:CLASSES]")]
    pub min_component_ml: Option<String>,
    /// Fill enclosed holes (background not connected to the volume's border) of each
    /// foreground class, or of the classes listed after `=`: --fill-holes=liver
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "all", value_name = "CLASSES")]
    pub fill_holes: Option<String>,
    /// Write per-class statistics as JSON (voxels, volume in mL, mean and std of the input's
    /// intensity); a folder in batch mode (FOLDER/<case>.json)
    #[arg(long, value_name = "FILE.json")]
    pub statistics: Option<PathBuf>,
    /// Turn the input to these axis codes before the network (e.g. RAS, LPS; "stored": as the
    /// file stores it) and every output back onto the input's grid; default: the manifest's
    #[arg(long, value_name = "CODES|stored")]
    pub orientation: Option<String>,
}

/// The flags beyond one model on one file: manifests, resampling, TTA, ensembles, extra
/// outputs, batches of files, shards.
#[derive(Args, Debug, Default)]
pub struct PipelineArgs {
    /// More inputs (files or folders): batch mode, -o names a folder
    #[arg(value_name = "MORE")]
    pub more_inputs: Vec<PathBuf>,
    /// Model manifest (TOML or JSON); default: NAME.toml or NAME.json beside the first NAME.onnx
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Resample to this voxel size (network axes D,H,W, mm) before inference, or "none"
    #[arg(long)]
    pub spacing: Option<String>,
    /// Test-time mirroring: all flips of the manifest's mirror axes (default 0,1,2), a list of
    /// network axes like 0,1, or off (a manifest's `tta` turns it on without the flag); put it
    /// after the input path
    #[arg(long, num_args = 0..=1, default_missing_value = "all", value_name = "AXES")]
    pub tta: Option<String>,
    /// Applied to each model's output before averaging: auto, softmax, sigmoid, none
    #[arg(long, value_parser = ["auto", "softmax", "sigmoid", "none"])]
    pub activation: Option<String>,
    /// Write the averaged probabilities (float32, x,y,z,class); a folder in batch mode
    #[arg(long)]
    pub probabilities: Option<PathBuf>,
    /// Write --probabilities as uint8 (round(255 p), scl_slope 1/255)
    #[arg(long)]
    pub probabilities_u8: bool,
    /// Write one uint8 mask per class (background excepted) into this folder
    #[arg(long)]
    pub split_classes: Option<PathBuf>,
    /// Write a PNG of three orthogonal mid-slices with the labels overlaid; a folder in batch mode
    #[arg(long)]
    pub preview: Option<PathBuf>,
    /// Also write the class names as JSON ({"1": "liver", ...}) beside each label map:
    /// <label map name>.labels.json
    #[arg(long)]
    pub labels_json: bool,
    /// Also write a 3D Slicer colour table (names and colours) beside each label map:
    /// <label map name>.ctbl (Slicer does not read the table inside the NIfTI file)
    #[arg(long)]
    pub color_table: bool,
    /// Batch mode: process only cases i (sorted list) with i mod n == k; `auto` reads k and n
    /// from a Slurm job array (SLURM_ARRAY_TASK_*) or a Kubernetes Indexed Job
    /// (JOB_COMPLETION_INDEX, with VOXTILE_SHARD_COUNT or auto/N for the count)
    #[arg(long, value_name = "k/n|auto")]
    pub shard: Option<String>,
    /// Argument ids given on the command line (filled in by cli::run; flags beat the manifest).
    #[arg(skip)]
    pub explicit: Vec<String>,
}
