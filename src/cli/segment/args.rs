//! The flags of `voxtile segment`, as clap parses them; [`super::config`] turns them into the
//! one validated configuration.

use crate::cli::window::WindowArgs;
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
    /// Output label map (.nii.gz or .nii), or a folder (ending in / or existing): FOLDER/<case>.nii.gz
    #[arg(long, short = 'o')]
    pub output: PathBuf,
    #[command(flatten)]
    pub window: WindowArgs,
    #[command(flatten)]
    pub pipe: PipelineArgs,
    /// Window weights for blending
    #[arg(long, default_value = "gaussian", value_parser = ["gaussian", "constant", "hann"])]
    pub blend: String,
    /// Gaussian sigma as a fraction of the roi (MONAI's sigma_scale): one number or per axis
    #[arg(long, default_value = "0.125")]
    pub sigma_scale: String,
    /// Padding where the volume is smaller than the roi: a constant value or "edge"
    #[arg(long, default_value = "0")]
    pub pad: String,
    /// Also write the blended raw outputs (float32, x,y,z,channel)
    #[arg(long)]
    pub logits: Option<PathBuf>,
    /// Write a JSON report (shapes, windows, stage times, peak memory)
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Intensity normalisation before windowing: none, zscore (per volume), ct:LO,HI,MEAN,STD
    #[arg(long, default_value = "none")]
    pub normalize: String,
    /// Overwrite existing output files
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub post: PostArgs,
    /// Write per-class statistics as JSON (voxels, volume in mL, mean and std of the input's
    /// intensity); a folder in batch mode (FOLDER/<case>.json)
    #[arg(long, value_name = "FILE.json")]
    pub statistics: Option<PathBuf>,
}

impl SegmentArgs {
    /// The first flag given that names files or cases (refused by a run on arrays, which
    /// returns its outputs instead).
    pub fn file_flag(&self) -> Option<&'static str> {
        let p = &self.pipe;
        let named = [
            ("--logits", self.logits.is_some()),
            ("--report", self.report.is_some()),
            ("--statistics", self.statistics.is_some()),
            ("--series", self.series.is_some()),
            ("--force", self.force),
            ("--probabilities", p.probabilities.is_some()),
            ("--probabilities-u8", p.probabilities_u8),
            ("--split-classes", p.split_classes.is_some()),
            ("--preview", p.preview.is_some()),
            ("--labels-json", p.labels_json),
            ("--color-table", p.color_table),
            ("--shard", p.shard.is_some()),
            ("more inputs", !p.more_inputs.is_empty()),
        ];
        named
            .iter()
            .find(|(_, given)| *given)
            .map(|(flag, _)| *flag)
    }
}

/// The post-processing flags of the label map (each beats the manifest's step).
#[derive(Args, Debug, Default)]
pub struct PostArgs {
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
}

/// The flags beyond one model on one file: TTA, ensembles, extra
/// outputs, batches of files, shards.
#[derive(Args, Debug, Default)]
pub struct PipelineArgs {
    /// More inputs (files or folders): batch mode, -o names a folder
    #[arg(value_name = "MORE")]
    pub more_inputs: Vec<PathBuf>,
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
