//! One launch of the buffer plan (host only): the node it runs, what is fused into it, the
//! buffer it writes and its kernel. [`buffers`](super::buffers) builds the list;
//! [`tile_stats`](super::tile_stats) and [`windowed`](super::windowed) read it.

use crate::backend::cuda::host::concat_split::Part;
use crate::backend::cuda::host::conv_kernel::ConvKernel;
use crate::model::graph::Graph;

/// One launched node of the list (a fused activation rides with its producer).
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    /// Index in `Graph::nodes`.
    pub node: usize,
    /// The activation node fused into this one's epilogue.
    pub fuse: Option<usize>,
    /// A conv's residual Add fused into its epilogue: (Add node, its other operand).
    pub residual: Option<(usize, usize)>,
    /// The conv reading a norm's output (a 1x1x1 head, or an `_nl` z-pair conv), run on the
    /// norm's input normalised on load.
    pub head: Option<NormHead>,
    /// A norm launch that runs the Cin-1 conv before it itself (`CudaOptions::norm_recompute`):
    /// that conv node, whose output only the norm reads and which has no launch of its own.
    /// The launch runs the conv for the statistics alone, finalises them and runs the conv
    /// again normalising on store: the conv's output never exists. Its `conv` is the conv's
    /// kernel, the statistics twin once [`tile_stats::pair`](super::tile_stats::pair) sized them.
    pub recompute: Option<usize>,
    /// A conv over a channel concat run one launch per part ([`concat_split`](super::concat_split)): the part this
    /// launch reads (the conv node's own input, the concat, is never written).
    pub part: Option<Part>,
    /// The value written (the fused activation's, Add's or head's output when fused).
    pub out_v: usize,
    /// Buffer written, its channel stride and channel offset (a concat slice, else C and 0).
    pub out_buf: usize,
    pub ldc: usize,
    pub coff: usize,
    /// Kernel of a conv / transposed conv.
    pub conv: Option<ConvKernel>,
    /// A conv handing the norm right after it its statistics, and that norm
    /// ([`tile_stats::pair`](super::tile_stats::pair)): the conv's output tiles per sample, whose sums the conv writes
    /// to the norm scratch and the norm finalises.
    pub tile_stats: Option<usize>,
    /// With `tile_stats`: the conv stores fp16 less each output tile's shift, the norm adds it
    /// back (`CudaOptions::norm_shifted`).
    pub shifted: Option<ShiftedOut>,
    /// Activation bytes (buffers not free) right after the output is placed, and how many.
    pub live_bytes: usize,
    pub live_bufs: usize,
}

/// How a conv's output stored for its norm as fp16 less each tile's shift lies
/// ([`Launch::shifted`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShiftedOut {
    /// The conv's output tile (z, y, x voxels), whose shift a voxel's values are stored less.
    pub tile: [usize; 3],
    /// Stored by a split conv's last part where it read the earlier parts' fp32 sums: each
    /// voxel's halves at the start of its fp32 slot (a voxel stride of 2 C halves), so no
    /// store lands on another voxel's sums.
    pub wide: bool,
    /// Its norm reads it in runs of voxels along x (`CudaOptions::norm_runs`; see
    /// [`ShiftedOut::runs_fit`]).
    pub runs: bool,
}

impl ShiftedOut {
    /// Whether the norm's runs of `abi::NORM_RUN` voxels along x, each from a multiple
    /// of it, lie in one row of one output tile (`tile`, z y x) of an output `w` voxels wide:
    /// both multiples of the run.
    pub fn runs_fit(tile: [usize; 3], w: usize) -> bool {
        let run = crate::backend::cuda::abi::NORM_RUN;
        tile[2].is_multiple_of(run) && w.is_multiple_of(run)
    }
}

impl Launch {
    /// The nodes this launch runs: its own, the fused activation, Add and head.
    pub fn nodes(&self) -> Vec<usize> {
        [
            self.recompute,
            Some(self.node),
            self.fuse,
            self.residual.map(|r| r.0),
        ]
        .into_iter()
        .chain(self.head.iter().flat_map(|h| [Some(h.conv), h.fuse]))
        .flatten()
        .collect()
    }

    /// The values it reads: its part of a split conv's concat (and the output, where it adds
    /// to it), else its nodes' inputs but the recomputed conv's output (never stored).
    pub fn reads(&self, graph: &Graph) -> Vec<usize> {
        match self.part {
            Some(p) if p.accumulate => vec![p.value, self.out_v],
            Some(p) => vec![p.value],
            None => {
                let inner = self.recompute.map(|c| graph.nodes[c].output);
                self.nodes()
                    .iter()
                    .flat_map(|&i| graph.nodes[i].inputs.iter().copied())
                    .filter(|&v| Some(v) != inner)
                    .collect()
            }
        }
    }
}

/// The conv that reads a norm launch's normalised input ([`fusable_norm_head`](super::fusion::fusable_norm_head)): the
/// norm writes no output, its statistics go to the head, which normalises on load. A 1x1x1
/// conv on the pointwise kernel, or (`CudaOptions::norm_load_conv`) a z-pair conv on its `_nl`
/// twin.
#[derive(Clone, Debug, PartialEq)]
pub struct NormHead {
    /// The conv node, the activation node fused into it, and its kernel (`Pointwise`, or the
    /// `_nl` twin as `Halo`).
    pub conv: usize,
    pub fuse: Option<usize>,
    pub kernel: ConvKernel,
}
