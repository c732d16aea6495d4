//! A conv over a channel concat run as one conv per part (`CudaOptions::concat_split`): the sum
//! over the concat's channels is the sum over each part's, so the conv runs once per part on
//! that part's slice of the weights, the first with the bias writing the fp32 output, each later
//! one adding its sums to it in its epilogue (`ConvParams::accum`). The concat is never written;
//! its parts stay in their own buffers until the conv has read them.
//!
//! Taken where the z-pair kernel runs every part and not the whole: W1's first decoder conv
//! (64 -> 32 at 128³) becomes two 32 -> 32 z-pair launches instead of two Cin chunks on
//! `conv_halo_c32n32_w4`, and its 64-channel concat (256 MiB a window) is gone. Only an output
//! that stays fp32 (its readers are norms: `keeps_f32`) takes the partial sums without rounding.

use crate::backend::cuda::abi::Shape;
use crate::backend::cuda::host::conv_kernel::{ArchCaps, ConvKernel};
use crate::backend::cuda::host::fusion::keeps_f32;
use crate::backend::cuda::host::select::ConvGeom;
use crate::model::graph::{Graph, Op};

/// One launch of a split conv: the concat input it reads, where that input's channels start in
/// the concat (its slice of the weights), and whether it adds to what the earlier parts wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    pub value: usize,
    pub cin_off: usize,
    pub accumulate: bool,
}

/// A conv that runs split: the concat node it reads, and its parts in the concat's order with
/// the kernel of each.
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    pub concat: usize,
    pub parts: Vec<(Part, ConvKernel)>,
}

/// Per node, how a conv over a concat runs split (None for every other node, and for all of
/// them unless `caps.concat_split`) for `batch` windows. `shapes`: per-sample value shapes;
/// `ndhwc`: which values are stored NDHWC (the z-pair kernel's layout).
pub fn splits(
    graph: &Graph,
    cons: &[Vec<usize>],
    shapes: &[Shape],
    tensor: &[bool],
    ndhwc: &[bool],
    caps: &ArchCaps,
    batch: usize,
) -> Vec<Option<Split>> {
    let mut producer = vec![None; graph.values.len()];
    for (j, n) in graph.nodes.iter().enumerate() {
        producer[n.output] = Some(j);
    }
    let f = Facts {
        graph,
        cons,
        shapes,
        tensor,
        ndhwc,
        caps,
        batch,
    };
    (0..graph.nodes.len())
        .map(|i| {
            let j = producer[*graph.nodes[i].inputs.first()?]?;
            caps.concat_split.then(|| f.split(i, j)).flatten()
        })
        .collect()
}

/// What [`splits`] decides by.
struct Facts<'a> {
    graph: &'a Graph,
    cons: &'a [Vec<usize>],
    shapes: &'a [Shape],
    tensor: &'a [bool],
    ndhwc: &'a [bool],
    caps: &'a ArchCaps,
    batch: usize,
}

impl Facts<'_> {
    /// Conv node `i` over concat node `j`, split if every rule of the module doc holds.
    fn split(&self, i: usize, j: usize) -> Option<Split> {
        let (graph, shapes) = (self.graph, self.shapes);
        let (node, concat) = (&graph.nodes[i], &graph.nodes[j]);
        let is_conv = matches!(&node.op, Op::Conv(c) if c.groups == 1) && node.inputs.len() == 1;
        let x = concat.output;
        let parts = &concat.inputs;
        let distinct = parts
            .iter()
            .all(|v| parts.iter().filter(|&u| u == v).count() == 1);
        if !is_conv
            || !matches!(concat.op, Op::Concat { axis: 1 })
            || self.tensor[i]
            || self.tensor[j]
            || x == graph.output
            || self.cons[x].as_slice() != [i]
            || parts.len() < 2
            || !distinct
            || !parts.iter().all(|&v| self.ndhwc[v])
        {
            return None;
        }
        let os = shapes[node.output];
        let kernel = |xs: Shape| {
            ConvGeom::of(&node.op, xs, os).map(|g| ConvKernel::choose(self.caps, self.batch, &g))
        };
        if zpair(&kernel(shapes[x])?) {
            return None;
        }
        let mut cin_off = 0;
        let mut out = Vec::new();
        for (k, &v) in parts.iter().enumerate() {
            let kernel = kernel(shapes[v]).filter(zpair)?;
            let part = Part {
                value: v,
                cin_off,
                accumulate: k > 0,
            };
            cin_off += shapes[v][0];
            out.push((part, kernel));
        }
        let f32_out = self.caps.norm_f32
            && keeps_f32(
                graph,
                self.cons,
                self.tensor,
                i,
                node.output,
                Some(&out[0].1),
            );
        f32_out.then_some(Split {
            concat: j,
            parts: out,
        })
    }
}

/// Whether `k` is a z-pair kernel, the one whose epilogue adds to its output.
fn zpair(k: &ConvKernel) -> bool {
    matches!(k, ConvKernel::Halo(c) if c.zpair)
}
