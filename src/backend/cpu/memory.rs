//! The CPU backend's memory model: activations by liveness over the node order, replaying what
//! the executor does with its buffers — a value lives from its node to its last needed reader,
//! elementwise ops overwrite their first input when it dies there (otherwise they copy it), dead
//! branches are skipped — so the prediction equals `CpuBackend::last_stats().peak_live_bytes`.
//!
//! The rest is counted from the same code paths: weights (f32, held twice: the engine's graph
//! and the backend's copy), workspace (the im2col/col2im chunk of each conv, ≤ 4 MiB unless one
//! row is larger), staging (the window batch) and accumulators (`SlabBlender`: roi_D padded
//! planes, plus the finished slab it hands out).

use super::ops::node_runs_inplace;
use crate::backend::memory::{prod, Breakdown, Estimate, PeakNode, Target, Workload, F32};
use crate::backend::MemoryModel;
use crate::model::graph::{Graph, Op};
use crate::sys::memory::host_budget;
use crate::Result;

/// The host's memory, as the CPU backend uses it.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuMemory;

impl MemoryModel for CpuMemory {
    fn target(&self) -> Target {
        Target::Cpu
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
        let params = graph.param_count() as u64;
        let (act, peak_node, with_ws) = cpu_activations(graph, batch, roi)?;
        let plane = (w.shape[1].max(roi[1]) * w.shape[2].max(roi[2])) as u64;
        // SlabBlender: (C + 1) sums over roi_D padded planes, shifted in place; the finished
        // slab (C channels, at most roi_D planes) is out beside them until it is labelled.
        let acc = (cout as u64 + 1)
            .saturating_mul(roi[0] as u64 * plane)
            .saturating_mul(F32);
        let slab = (cout as u64)
            .saturating_mul(roi[0] as u64 * plane)
            .saturating_mul(F32);
        let budgeted = Breakdown {
            weights: 2 * params * F32,
            activations: act,
            workspace: with_ws - act,
            // The gathered window batch; the backend's own contiguous copy of it is the first
            // live activation.
            staging: (cin as u64).saturating_mul(batch as u64 * rvox * F32),
            accumulators: acc.saturating_add(slab).saturating_add(rvox * F32),
        };
        // Labels (u16), and the blended outputs when kept.
        let output = (prod(&w.shape) * 2).saturating_add(if w.keep_logits {
            w.per_voxel(cout, F32)
        } else {
            0
        });
        Ok(Estimate {
            target: Target::Cpu,
            roi,
            batch,
            windows,
            budgeted,
            host: budgeted,
            volume_bytes: w.input_bytes(cin) + output,
            peak_node,
            backend_activation_bytes: act,
        })
    }

    /// The windows of a batch run one after another, so the cost is the voxels computed
    /// (windows × roi volume) whatever the batch.
    fn cost(&self, windows: usize, roi: [usize; 3], _batch: usize) -> u64 {
        (windows as u64).saturating_mul(prod(&roi))
    }

    /// A share of the memory left to the process ([`host_budget`]: half of MemAvailable or the
    /// cgroup's headroom, three quarters of the address space left under RLIMIT_AS, whichever is
    /// least; 4 GiB when none is known).
    fn default_budget(&self) -> (u64, String) {
        host_budget().unwrap_or((4 << 30, "MemAvailable unknown: fixed default".into()))
    }
}

/// Workspace bytes of one CPU conv node (0 for other ops), as `backend::cpu::ops` allocates it.
fn cpu_col_bytes(op: &Op, x: [usize; 5], y: [usize; 5]) -> u64 {
    super::ops::conv_workspace_bytes(op, x, y)
}

/// CPU activations for (batch, roi): the executor's liveness peak, its node, and the largest
/// (live bytes + conv workspace) at any node.
pub fn cpu_activations(
    graph: &Graph,
    batch: usize,
    roi: [usize; 3],
) -> Result<(u64, PeakNode, u64)> {
    let shapes = graph.infer_shapes(batch, roi)?;
    let (needed, last_use) = crate::model::passes::uses::last_reads(graph);
    let bytes = |v: usize| prod(shapes[v].as_slice()).saturating_mul(F32);
    let mut live: Vec<Option<u64>> = vec![None; graph.values.len()];
    live[graph.input] = Some(bytes(graph.input));
    let (mut n_live, mut b_live) = (1usize, bytes(graph.input));
    let mut peak = PeakNode {
        index: 0,
        name: "(input)".into(),
        op: "input".into(),
        live_bytes: b_live,
        live_values: 1,
    };
    let mut with_ws = b_live;
    for (i, node) in graph.nodes.iter().enumerate() {
        if !needed[i] {
            continue;
        }
        let ins: Vec<_> = node.inputs.iter().map(|&v| shapes[v]).collect();
        if node_runs_inplace(&node.op, &ins, &shapes[node.output]) {
            let v0 = node.inputs[0];
            let dies = last_use[v0] == i && !node.inputs[1..].contains(&v0);
            if dies {
                if let Some(b) = live[v0].take() {
                    n_live -= 1;
                    b_live = b_live.saturating_sub(b);
                }
            }
        }
        let ob = bytes(node.output);
        n_live += 1;
        b_live = b_live.saturating_add(ob);
        live[node.output] = Some(ob);
        if b_live > peak.live_bytes {
            peak = PeakNode {
                index: i,
                name: node.name.clone(),
                op: node.op.name().into(),
                live_bytes: b_live,
                live_values: n_live,
            };
        }
        let ws = cpu_col_bytes(
            &node.op,
            shapes[node.inputs[0]].folded5(),
            shapes[node.output].folded5(),
        );
        // The column buffer lives while the output is written, before inputs are freed.
        with_ws = with_ws.max(b_live.saturating_add(ws));
        for (j, &v) in node.inputs.iter().enumerate() {
            if last_use[v] == i && !node.inputs[..j].contains(&v) {
                if let Some(b) = live[v].take() {
                    n_live -= 1;
                    b_live = b_live.saturating_sub(b);
                }
            }
        }
    }
    Ok((peak.live_bytes, peak, with_ws))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_counts_voxels_whatever_the_batch() {
        assert!(CpuMemory.cost(10, [64; 3], 1) < CpuMemory.cost(100, [64; 3], 1));
        assert_eq!(
            CpuMemory.cost(10, [64; 3], 1),
            CpuMemory.cost(10, [64; 3], 4)
        );
    }
}
