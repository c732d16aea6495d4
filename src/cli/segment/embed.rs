//! `voxtile segment` on an array a caller holds (the Python package's `Model`): the flags parsed
//! and the manifest merged by [`Config`], the same [`Pipeline`] and post-processing as a file
//! gets in [`super::process`], minus the reading and the writing.

use super::args::SegmentArgs;
use super::config::Config;
use crate::engine::{CancelToken, Device};
use crate::pipeline::{Output, Pipeline};
use crate::volume::{Header, Mat4, Orientation};
use crate::{Error, Result};
use ndarray::ArrayView4;
use serde_json::{json, Value};

/// A model made ready as `voxtile segment` makes it, run on arrays.
pub struct Session {
    config: Config,
    pipe: Pipeline,
}

impl Session {
    /// The configuration of `args` (input and output are placeholders: flags that name files
    /// are refused) and its pipeline on the devices it names.
    pub fn new(args: &SegmentArgs) -> Result<Session> {
        if let Some(flag) = args.file_flag() {
            return Err(Error::Invalid(format!(
                "{flag} is about files: a model run on arrays returns its outputs (segment_file \
                 takes it)"
            )));
        }
        let config = Config::new(args)?;
        let pipe = config.build(&config.devices)?;
        Ok(Session { config, pipe })
    }

    /// The pipeline (its engines, settings, channels).
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipe
    }

    /// The token that stops the run in progress (its engines share it).
    pub fn cancel_token(&self) -> CancelToken {
        self.pipe.cancel_token()
    }

    /// The header of a `(channels, i, j, k)` array of `shape` with its geometry: the `affine`
    /// (voxel to world, as nibabel gives it) and the voxel size (`spacing`, else the affine's
    /// column norms, as nibabel sets pixdim). Without either, a model that resamples or turns
    /// its input to an orientation is refused: there would be nothing to do it from.
    pub fn header(
        &self,
        shape: [usize; 4],
        affine: Option<Mat4>,
        spacing: Option<[f64; 3]>,
    ) -> Result<Header> {
        let [c, i, j, k] = shape;
        if let Some(s) = spacing.filter(|s| s.iter().any(|v| !(v.is_finite() && *v > 0.0))) {
            return Err(Error::Invalid(format!(
                "the spacing must be three positive sizes (mm), got {s:?}"
            )));
        }
        // Without an affine: diag(spacing), as a NIfTI file without sform or qform reads.
        let mut header = Header::new([i, j, k], c, spacing.unwrap_or([1.0; 3]));
        if let Some(m) = affine {
            let finite = m.iter().flatten().all(|v| v.is_finite());
            if !finite || m[3] != [0.0, 0.0, 0.0, 1.0] {
                return Err(Error::Invalid(format!(
                    "the affine must be a finite 4x4 matrix with last row 0 0 0 1, got {m:?}"
                )));
            }
            header.set_affine(&m);
        }
        if let Some(s) = spacing {
            header.pixdim[1..4].copy_from_slice(&s);
        }
        let settings = self.pipe.settings();
        if affine.is_none() && settings.orientation != Orientation::Stored {
            return Err(Error::Invalid(format!(
                "the model runs in orientation {}: give the array's affine",
                settings.orientation
            )));
        }
        if let (None, None, Some(target)) = (affine, spacing, settings.spacing) {
            return Err(Error::Invalid(format!(
                "the model resamples to {target:?} mm: give the array's spacing or affine"
            )));
        }
        Ok(header)
    }

    /// Segment `data` of `header` as `voxtile segment` segments a file read as that array:
    /// normalisation, orientation, resampling, passes, label values, post-processing. `keep`:
    /// (probabilities, logits) to return beside the labels.
    pub fn run(
        &mut self,
        data: ArrayView4<f32>,
        header: &Header,
        keep: (bool, bool),
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Output> {
        self.pipe.set_keep_outputs(keep.0, keep.1);
        let mut out = self.pipe.run_array(data, header, progress)?;
        super::process::post(&self.pipe, &self.config, &mut out)?;
        Ok(out)
    }

    /// What the model is: `voxtile inspect --json`'s graph fields, the manifest, the device,
    /// the memory budget, the class names and label values.
    pub fn info(&self) -> Result<Value> {
        let engine = &self.pipe.engines()[0];
        let mut j = crate::cli::describe::graph_json(&self.config.models[0], engine.graph());
        j["manifest"] = match &self.config.manifest_path {
            Some(p) => {
                let mut v = serde_json::to_value(&self.config.manifest)
                    .map_err(|e| Error::Invalid(format!("manifest: {e}")))?;
                v["path"] = p.display().to_string().into();
                v
            }
            None => Value::Null,
        };
        let (bytes, source) = engine.memory_budget();
        j["device"] = engine.device_name().into();
        j["memory_budget"] = json!({ "bytes": bytes, "source": source });
        j["classes"] = json!(self.pipe.classes());
        j["label_values"] = json!(self.pipe.settings().remap);
        Ok(j)
    }

    /// The plan (window, batch, predicted memory) for a volume of network-axis `shape` on this
    /// model's first device and budget, as `voxtile plan --json` gives it.
    pub fn plan(&self, shape: [usize; 3]) -> Result<Value> {
        let engine = &self.pipe.engines()[0];
        let p = engine.plan_for(shape)?;
        let device = match engine.options().device {
            Device::Auto if engine.is_cuda() => Device::Cuda(0),
            Device::Auto => Device::Cpu,
            d => d,
        };
        crate::cli::plan::json(&p, engine.memory_budget().1, shape, device)
    }
}
