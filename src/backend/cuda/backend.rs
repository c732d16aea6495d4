//! [`Backend`] for the CUDA device: the whole window list in one streamed pipeline call
//! (gather, run, blend on the device, streams overlapped); labels are made on the device unless
//! the blended outputs are kept (or there is one channel, thresholded on the host).

use super::CudaBackend;
use crate::backend::cuda::layers::layer_kernels;
use crate::backend::cuda::stream::{GpuTimes, WindowJob};
use crate::backend::{Backend, MemoryModel, Pass, PassOutput, StageTimes};
use crate::model::Graph;
use crate::tiling::{self, PadMode};
use crate::{Error, Result};
use ndarray::{s, Array3, Array5, ArrayView5};
use std::ops::Range;
use std::time::Instant;

impl Backend for CudaBackend {
    fn name(&self) -> String {
        CudaBackend::name(self)
    }

    fn memory(&self) -> &dyn MemoryModel {
        self
    }

    fn prepare(&mut self, graph: &Graph, batch: usize, roi: [usize; 3]) -> Result<()> {
        CudaBackend::prepare(self, graph, batch, roi)
    }

    fn run(&mut self, input: ArrayView5<f32>) -> Result<Array5<f32>> {
        CudaBackend::run(self, input)
    }

    fn sliding_window(
        &mut self,
        pass: &Pass<'_>,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<PassOutput> {
        let cval = match pass.pad {
            PadMode::Constant(c) => c,
            PadMode::Edge => {
                return Err(Error::Invalid(
                    "edge padding is implemented on the CPU path only: use --device cpu or constant padding".into(),
                ))
            }
        };
        // The windows stream through the device as one pass: cancelled before it starts only.
        pass.cancel.check()?;
        let t = Instant::now();
        let grid = pass.grid;
        let rule = pass.labels;
        let job = WindowJob {
            vol: pass.volume,
            padded: grid.padded,
            pad_before: grid.pad_before,
            roi: grid.roi,
            starts: &grid.starts,
            weights: pass.weights,
            batch: pass.batch,
            cval,
        };
        let (mut labels, nan_planes, logits, times) = if !rule.keep_logits && rule.cout > 1 {
            let (labels, nan, times) = self.segment_windows_argmax(&job)?;
            (labels, Some(nan), None, times)
        } else {
            let (out, times) = self.segment_windows(&job)?;
            (rule.labels(out.view())?, None, Some(out), times)
        };
        let nan_voxels = match (&logits, nan_planes) {
            (Some(o), _) => {
                let [own, rows] = pass.own.clone();
                tiling::nan_voxels(o.slice(s![.., own, rows, ..]))
            }
            (None, Some(nan)) => take_nan_labels(&mut labels, &nan, &pass.own),
            (None, None) => 0,
        };
        progress(grid.len(), grid.len());
        Ok(PassOutput {
            labels,
            logits: logits.filter(|_| rule.keep_logits),
            nan_voxels,
            seconds: StageTimes {
                compute: t.elapsed().as_secs_f64(),
                ..Default::default()
            },
            measured_activation_bytes: self.activation_bytes() as u64,
            peak_device_bytes: self.peak_device_bytes(),
            details: self.details(&times),
        })
    }
}

impl CudaBackend {
    /// The report's CUDA details: the pass's event times and the kernel of each layer of the
    /// prepared launch list (`layers`).
    fn details(&self, times: &GpuTimes) -> Option<serde_json::Value> {
        let mut d = serde_json::to_value(times).ok()?;
        if let (serde_json::Value::Object(m), Some(p)) = (&mut d, self.prepared.as_ref()) {
            let layers = serde_json::to_value(layer_kernels(&p.labels)).ok()?;
            m.insert("layers".into(), layers);
        }
        Some(d)
    }
}

/// The device argmax marks a voxel whose blended outputs hold a NaN with label 0xFFFF (no model
/// has that many channels; `nan` counts them per plane): the marks in the planes and rows `own`,
/// and every mark written as 0, as the CPU's argmax does.
fn take_nan_labels(labels: &mut Array3<u16>, nan: &[usize], own: &[Range<usize>; 2]) -> usize {
    if nan.iter().all(|&n| n == 0) {
        return 0;
    }
    let [planes, rows] = own.clone();
    let n = labels
        .slice(s![planes, rows, ..])
        .iter()
        .filter(|&&l| l == u16::MAX)
        .count();
    labels.mapv_inplace(|l| if l == u16::MAX { 0 } else { l });
    n
}
