//! The CUDA backend's memory model: not a replay but the backend's own host-only buffer plan
//! ([`buffer_plan`]), which `CudaBackend::prepare` allocates exactly — the fp16 activation arena
//! (fusion, concat slices, buffers placed by liveness), every constant upload (re-laid fp16
//! weights with their padding, per parity class for strided transposed convs, biases, norm
//! parameters) and the norm scratch, each with the 256-byte allocation floor (the single-window
//! API's f32 staging is made only when that API is used) — plus the streamed pipeline's own
//! buffers ([`pipeline_alloc`]): the window input, the weight map, the ring of fp32 sums over the
//! planes one window spans and the finalised-plane staging. Kernel choices depend
//! on the device: an opened backend answers with its own [`ArchCaps`], `voxtile plan` without
//! one with an H200's.

use super::CudaBackend;
use crate::backend::cuda::host::buffers::{buffer_plan, BufferPlan};
use crate::backend::cuda::host::conv_kernel::ArchCaps;
use crate::backend::cuda::host::options::GatherMode;
use crate::backend::cuda::stream::{
    pipeline_alloc, stage_planes, window_z0, AllocQuery, OUT_SLOTS,
};
use crate::backend::memory::{prod, Breakdown, Estimate, PeakNode, Target, Workload, F16, F32};
use crate::backend::MemoryModel;
use crate::model::graph::Graph;
use crate::sys::memory::format_bytes;
use crate::tiling::Grid;
use crate::Result;

pub use crate::backend::cuda::host::windowed::CUDA_SATURATION_VOXELS;

/// Fixed CUDA budget when the device cannot be asked.
pub const CUDA_FALLBACK_BUDGET: u64 = 4 << 30;

/// A CUDA device's memory: its capabilities and which device's free memory sets the default
/// budget.
#[derive(Clone, Copy, Debug)]
pub struct CudaMemory {
    /// What the launch list's kernel choices depend on.
    pub caps: ArchCaps,
    /// The device ordinal asked for free memory.
    pub device: usize,
}

impl CudaMemory {
    /// An H200 (sm_90), budgeted from device `device`'s free memory when a driver answers.
    pub fn h200(device: usize) -> Self {
        CudaMemory {
            caps: ArchCaps::h200(),
            device,
        }
    }
}

impl MemoryModel for CudaMemory {
    fn target(&self) -> Target {
        Target::Cuda
    }

    fn estimate(
        &self,
        graph: &Graph,
        roi: [usize; 3],
        batch: usize,
        w: &Workload,
    ) -> Result<Estimate> {
        let windows = w.check(roi, batch)?;
        let shapes = graph.infer_shapes(batch, roi)?;
        let (cin, cout) = (graph.input_channels(), shapes[graph.output][1]);
        let rvox = prod(&roi);
        let bp = buffer_plan(graph, batch, roi, &self.caps)?;
        let argmax = !w.keep_logits && cout > 1;
        let win_in = (cin as u64).saturating_mul(batch as u64 * rvox);
        // The streamed pipeline's own buffers, exactly as `stream` allocates them for the
        // engine's windows.
        let grid = Grid::new(w.shape, roi, w.overlap, w.placement)?;
        let z0 = window_z0(&grid.starts, grid.pad_before[0]);
        let pa = pipeline_alloc(&AllocQuery {
            roi,
            batch,
            cin,
            cout,
            shape: w.shape,
            argmax,
            mode: GatherMode::Auto,
            z0: &z0,
        });
        let hw = w.shape[1] * w.shape[2];
        let out_slot = pa.out_slots / OUT_SLOTS as u64;
        // Pinned input: two window batches (host gather) or two plane slots (device gather).
        let host_in = if pa.gather_on_device {
            2 * (stage_planes(batch * cin * rvox as usize, cin * hw, pa.ring_in) * cin * hw) as u64
                * F16
        } else {
            2 * win_in * F16
        };
        // The prepared plan exactly as `CudaBackend::prepare` allocates it: constants (re-laid
        // fp16 weights, biases, norm parameters), the fp16 activation arena, and the norm scratch
        // (the single-window API's f32 staging is not made by the pipeline).
        let budgeted = Breakdown {
            weights: bp.const_alloc(),
            activations: bp.activation_alloc(),
            workspace: bp.scratch_alloc(),
            // Window input (batch buffers or plane ring) and the weight map.
            staging: pa.input + pa.weight_map,
            accumulators: pa.accumulators + pa.out_slots,
        };
        let host = Breakdown {
            weights: graph.param_count() as u64 * F32,
            activations: 0,
            workspace: 0,
            // Pinned fp16 input staging and downloaded planes (OUT_SLOTS slots).
            staging: host_in + OUT_SLOTS as u64 * out_slot,
            accumulators: 0,
        };
        let vox = prod(&w.shape);
        let output = if argmax {
            vox * 2
        } else {
            // Blended outputs come back whole, labels are made on the host.
            w.per_voxel(cout, F32).saturating_add(vox * 2)
        };
        Ok(Estimate {
            target: Target::Cuda,
            roi,
            batch,
            windows,
            budgeted,
            host,
            volume_bytes: w.input_bytes(cin) + output,
            peak_node: cuda_peak_node(graph, &bp),
            backend_activation_bytes: bp.activation_bytes(),
        })
    }

    /// The voxels of every launch, a launch costing at least [`CUDA_SATURATION_VOXELS`].
    fn cost(&self, windows: usize, roi: [usize; 3], batch: usize) -> u64 {
        let rv = prod(&roi);
        let launch = |n: usize| (n as u64).saturating_mul(rv).max(CUDA_SATURATION_VOXELS);
        let (full, rem) = (windows / batch, windows % batch);
        (full as u64)
            .saturating_mul(launch(batch))
            .saturating_add(if rem > 0 { launch(rem) } else { 0 })
    }

    /// 80% of the device's free memory (20% reserve for the driver, other processes and
    /// fragmentation), or [`CUDA_FALLBACK_BUDGET`] when no device answers.
    fn default_budget(&self) -> (u64, String) {
        let device = self.device;
        match cuda_free_bytes(device) {
            Some(f) => (
                (f as f64 * 0.8) as u64,
                format!("80% of the {} free on cuda:{device}", format_bytes(f)),
            ),
            None => (
                CUDA_FALLBACK_BUDGET,
                "no CUDA device answered: fixed default".into(),
            ),
        }
    }
}

/// An opened device models itself: its own capabilities and switches, its own free memory.
impl MemoryModel for CudaBackend {
    fn target(&self) -> Target {
        Target::Cuda
    }
    fn estimate(
        &self,
        graph: &Graph,
        roi: [usize; 3],
        batch: usize,
        w: &Workload,
    ) -> Result<Estimate> {
        self.memory_model().estimate(graph, roi, batch, w)
    }
    fn cost(&self, windows: usize, roi: [usize; 3], batch: usize) -> u64 {
        self.memory_model().cost(windows, roi, batch)
    }
    fn default_budget(&self) -> (u64, String) {
        self.memory_model().default_budget()
    }
    fn max_batch(&self, graph: &Graph, roi: [usize; 3]) -> usize {
        self.memory_model().max_batch(graph, roi)
    }
}

/// The launch with the most activation bytes live, as a [`PeakNode`] (the input alone when the
/// graph launches nothing).
fn cuda_peak_node(graph: &Graph, bp: &BufferPlan) -> PeakNode {
    match bp.peak_launch() {
        Some(l) => {
            let node = &graph.nodes[l.node];
            PeakNode {
                index: l.node,
                name: node.name.clone(),
                op: node.op.name().into(),
                live_bytes: l.live_bytes as u64,
                live_values: l.live_bufs,
            }
        }
        None => PeakNode {
            index: 0,
            name: "(input)".into(),
            op: "input".into(),
            live_bytes: bp.activation_bytes(),
            live_values: bp.bufs.len(),
        },
    }
}

/// CUDA activations for (batch, roi) on an H200 (sm_90), from the backend's own buffer plan:
/// (sum of buffers with the 256-byte allocation floor, sum without, liveness peak, widest output
/// channel count).
pub fn cuda_activations(
    graph: &Graph,
    batch: usize,
    roi: [usize; 3],
) -> Result<(u64, u64, PeakNode, usize)> {
    let bp = buffer_plan(graph, batch, roi, &ArchCaps::h200())?;
    Ok((
        bp.activation_alloc(),
        bp.activation_bytes(),
        cuda_peak_node(graph, &bp),
        bp.cmax,
    ))
}

/// Free memory of CUDA device `device`, through the driver (its primary context); None without
/// a driver or device.
pub fn cuda_free_bytes(device: usize) -> Option<u64> {
    // SAFETY: only tries to dlopen the driver library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return None;
    }
    let ctx = cudarc::driver::CudaContext::new(device).ok()?;
    ctx.bind_to_thread().ok()?;
    cudarc::driver::result::mem_get_info()
        .ok()
        .map(|(free, _)| free as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_prefers_saturated_launches() {
        // 8 windows of 32³ in one launch cost one saturated launch; one at a time cost 8.
        let m = CudaMemory::h200(0);
        assert!(m.cost(8, [32; 3], 8) < m.cost(8, [32; 3], 1));
    }
}
