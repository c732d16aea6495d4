//! A conv run as a sum over its input channels (`CudaOptions::concat_split`): the sum over the
//! input's channels is the sum over each part's, so the conv runs once per part on that part's
//! slice of the weights, the first with the bias writing the fp32 output, each later one adding
//! its sums to it in its epilogue (`ConvParams::accum`).
//!
//! - Over a channel concat whose parts the z-pair kernel takes (and the whole does not), one
//!   launch per part: W1's first decoder conv (64 -> 32 at 128³) becomes two 32 -> 32 z-pair
//!   launches instead of two Cin chunks on `conv_halo_c32n32_w4`, and its 64-channel concat
//!   (256 MiB a window) is never written; its parts stay in their own buffers until the conv
//!   has read them.
//! - With `cin_chunks`, a conv that a halo kernel would take whole, over one input or a concat,
//!   runs each input of Cin = k x 32 as k launches of 32 channels (the z-pair kernel reading a
//!   channel slice, `ConvParams::ldi`; Cout in 32-channel tiles), where such a launch has a
//!   tile for every SM: W1's Cin-64 and Cin-128 convs at 64³ at batch 4, not at 32³.
//!
//! Only an output that stays fp32 (its readers are norms: `keeps_f32`) takes the partial sums
//! without rounding.

use crate::backend::cuda::abi::Shape;
use crate::backend::cuda::host::conv_kernel::{ArchCaps, ConvKernel};
use crate::backend::cuda::host::fusion::keeps_f32;
use crate::backend::cuda::host::select::{zpair_config, ConvGeom};
use crate::model::graph::{Graph, Op};

/// One launch of a split conv: the value it reads and which of its channels (`cin` of them from
/// `x_coff` on: the whole value, or a 32-channel chunk), where those channels start in the
/// conv's input (`cin_off`: its slice of the weights), and whether it adds to what the earlier
/// parts wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    pub value: usize,
    pub x_coff: usize,
    pub cin: usize,
    pub cin_off: usize,
    pub accumulate: bool,
}

/// A conv that runs split: the concat node it reads in place of its input, if any (never
/// written), and its parts in the input's channel order with the kernel of each.
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    pub concat: Option<usize>,
    pub parts: Vec<(Part, ConvKernel)>,
}

/// Per node, how a conv runs split (None for every other node, and for all of them unless
/// `caps.concat_split`) for `batch` windows. `shapes`: per-sample value shapes; `ndhwc`: which
/// values are stored NDHWC (the z-pair kernel's layout).
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
        producer,
    };
    (0..graph.nodes.len())
        .map(|i| caps.concat_split.then(|| f.split(i)).flatten())
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
    producer: Vec<Option<usize>>,
}

impl Facts<'_> {
    /// Conv node `i` split if every rule of the module doc holds.
    fn split(&self, i: usize) -> Option<Split> {
        let (graph, shapes, caps) = (self.graph, self.shapes, self.caps);
        let node = &graph.nodes[i];
        let is_conv = matches!(&node.op, Op::Conv(c) if c.groups == 1) && node.inputs.len() == 1;
        if !is_conv || self.tensor[i] {
            return None;
        }
        let (x, os) = (node.inputs[0], shapes[node.output]);
        // Nothing to split: not over a concat, and no chunks asked for.
        let concat = self.concat_of(i, x);
        if concat.is_none() && !caps.cin_chunks {
            return None;
        }
        let geom = |c: usize, v: usize| {
            let [_, d, h, w] = shapes[v];
            ConvGeom::of(&node.op, [c, d, h, w], os)
        };
        let whole = ConvKernel::choose(caps, self.batch, &geom(shapes[x][0], x)?);
        if zpair(&whole) {
            return None;
        }
        // Cin chunks where a halo kernel would run the whole (and none is forced).
        let chunked = caps.cin_chunks
            && matches!(whole, ConvKernel::Halo(_))
            && caps.halo_tile.is_none()
            && caps.conv_tile.is_none();
        let sources = match concat {
            Some(j) => graph.nodes[j].inputs.clone(),
            None if chunked && self.ndhwc[x] => vec![x],
            None => return None,
        };
        let zcaps = ArchCaps {
            halo_tile: zpair_config(32),
            ..*caps
        };
        // A chunk's z-pair kernel, where its launch has a tile for every SM: with fewer, each
        // persistent block pays the resident weights and the ring's fill for one tile's steps
        // (W1's 32³ convs in chunks, 64 tiles a batch of 4: 1.56 ms against `conv_halo`'s
        // 1.34; its 64³ ones, 512 tiles: 2.54 against 2.79; session 31).
        let (batch, out) = (self.batch, [os[1], os[2], os[3]]);
        let chunk = |v: usize| {
            let k = ConvKernel::choose(&zcaps, batch, &geom(32, v)?);
            let fills = matches!(&k, ConvKernel::Halo(c) if c.zpair && c.tiles(batch, out) >= caps.sm_count);
            fills.then_some(k)
        };
        let mut out: Vec<(Part, ConvKernel)> = Vec::new();
        let mut cin_off = 0;
        for v in sources {
            let cv = shapes[v][0];
            let chunks = (chunked && cv.is_multiple_of(32))
                .then(|| chunk(v))
                .flatten();
            let pieces: Vec<(usize, usize, ConvKernel)> = match chunks {
                Some(k) => (0..cv / 32).map(|c| (32 * c, 32, k.clone())).collect(),
                None => {
                    let k = ConvKernel::choose(caps, self.batch, &geom(cv, v)?);
                    vec![(0, cv, Some(k).filter(zpair)?)]
                }
            };
            for (x_coff, cin, kernel) in pieces {
                let part = Part {
                    value: v,
                    x_coff,
                    cin,
                    cin_off: cin_off + x_coff,
                    accumulate: !out.is_empty(),
                };
                out.push((part, kernel));
            }
            cin_off += cv;
        }
        let f32_out = out.len() >= 2
            && caps.norm_f32
            && keeps_f32(
                graph,
                self.cons,
                self.tensor,
                i,
                node.output,
                Some(&out[0].1),
            );
        f32_out.then_some(Split { concat, parts: out })
    }

    /// The concat node producing conv node `i`'s input `x`, where the conv can read its parts
    /// in place of it: channel concat of two or more distinct NDHWC values, read by the conv
    /// alone, not the graph's output.
    fn concat_of(&self, i: usize, x: usize) -> Option<usize> {
        let j = self.producer[x]?;
        let concat = &self.graph.nodes[j];
        let parts = &concat.inputs;
        let distinct = parts
            .iter()
            .all(|v| parts.iter().filter(|&u| u == v).count() == 1);
        let ok = matches!(concat.op, Op::Concat { axis: 1 })
            && !self.tensor[j]
            && x != self.graph.output
            && self.cons[x].as_slice() == [i]
            && parts.len() >= 2
            && distinct
            && parts.iter().all(|&v| self.ndhwc[v]);
        ok.then_some(j)
    }
}

/// Whether `k` is a z-pair kernel, the one whose epilogue adds to its output.
fn zpair(k: &ConvKernel) -> bool {
    matches!(k, ConvKernel::Halo(c) if c.zpair)
}
