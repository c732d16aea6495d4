//! Window segments of a buffer plan (host only): the launches at the window's full resolution
//! before the first downsampling and after the last upsampling run one window at a time, so
//! their own buffers hold one window instead of the batch, while the launches between them run
//! on the whole batch (the small layers, where a batch fills the GPU). A U-Net's peak is there:
//! W1's first decoder conv reads a 64-channel concat and writes a 32-channel fp32 output at
//! 128³, 512 MiB a window, both of which a segment holds once.
//!
//! A buffer only one segment's launches touch (and the network output, which the pipeline blends
//! after each window's last segment) holds one window and is rewritten by every window's pass.
//! A buffer a segment shares with the rest (the input, a skip, the decoder's input) holds the
//! batch; the segment reads or writes its window's slice, and the buffer stays live over the
//! whole segment, since every window's pass touches it.

use crate::model::graph::{Graph, Op};

/// Launch size (voxels) below which the GPU is taken as under-used: a launch of fewer voxels is
/// costed as if it had this many (one 128³ window). Segments run one window a launch, so only
/// windows this large get them.
pub const CUDA_SATURATION_VOXELS: u64 = 1 << 21;

/// The launches `[0, pre)` and `[post, n)` run one window at a time (empty ranges: none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Segments {
    pub pre: usize,
    pub post: usize,
}

/// How launch `t` of a list with these segments runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Run {
    /// Once, on the batch.
    Batch,
    /// Once per window, before the batched launches.
    Front,
    /// Once per window, after them, followed by that window's blend.
    Back,
}

impl Segments {
    /// How launch `t` runs.
    pub fn run(&self, t: usize) -> Run {
        if t < self.pre {
            Run::Front
        } else if t >= self.post {
            Run::Back
        } else {
            Run::Batch
        }
    }

    /// Whether any launch runs one window at a time.
    pub fn any(&self, n: usize) -> bool {
        self.pre > 0 || self.post < n
    }
}

/// Per buffer, the launches that read or write it: launch k reads the values `reads[k]`
/// (`Launch::reads`) and writes buffer `out_bufs[k]`; `value_buf` holds each value's buffer.
pub fn touched(
    reads: &[Vec<usize>],
    out_bufs: &[usize],
    value_buf: &[Option<usize>],
    nbufs: usize,
) -> Vec<Vec<usize>> {
    let mut t = vec![Vec::new(); nbufs];
    for (k, (vs, &ob)) in reads.iter().zip(out_bufs).enumerate() {
        for b in vs.iter().filter_map(|&v| value_buf[v]).chain([ob]) {
            if !t[b].contains(&k) {
                t[b].push(k);
            }
        }
    }
    t
}

/// Whether every one of a launch's `nodes` computes each window from that window alone, on the
/// NDHWC kernels: convs, norms (statistics per window and channel), channel concats,
/// activations and binaries (whose operands all hold the batch, as every kernel value does:
/// `buffers::batch_dims`). The tensor path's values are not batch-major, so it never
/// qualifies.
fn per_window(graph: &Graph, tensor: &[bool], nodes: &[usize]) -> bool {
    nodes.iter().all(|&i| {
        !tensor[i]
            && match &graph.nodes[i].op {
                Op::Conv(_)
                | Op::ConvTranspose(_)
                | Op::InstanceNorm { .. }
                | Op::GroupNorm { .. }
                | Op::ChannelAffine { .. }
                | Op::Concat { axis: 1 }
                | Op::Add
                | Op::Mul
                | Op::Sub
                | Op::Div => true,
                op => crate::backend::cuda::abi::Act::of(op).is_some(),
            }
    })
}

/// The segments of a launch list (`nodes[t]`: the nodes launch t runs; `spatial[t]`: its
/// output voxels a window) for windows of `roi_vox` voxels: the longest prefix and suffix of
/// per-window launches whose outputs have the window's voxels, the suffix only where it writes
/// the network output (`out_launch`), so each window's output can be blended before the next
/// window's pass overwrites it. None for windows under [`CUDA_SATURATION_VOXELS`], whose
/// launches need the batch to fill the GPU.
pub fn segments(
    graph: &Graph,
    tensor: &[bool],
    nodes: &[Vec<usize>],
    spatial: &[usize],
    roi_vox: usize,
    out_launch: Option<usize>,
) -> Segments {
    let n = nodes.len();
    if (roi_vox as u64) < CUDA_SATURATION_VOXELS {
        return Segments { pre: 0, post: n };
    }
    let ok = |t: usize| spatial[t] == roi_vox && per_window(graph, tensor, &nodes[t]);
    let pre = (0..n).take_while(|&t| ok(t)).count();
    let mut post = n - (0..n).rev().take_while(|&t| ok(t)).count();
    if out_launch.is_none_or(|o| o < post) {
        post = n;
    }
    // A list that is one segment throughout runs per window in front.
    let post = post.max(pre);
    Segments { pre, post }
}

/// Buffers by how the segments touch them, and the plan adjusted to match: `touched[b]` lists
/// the launches reading or writing buffer b. A buffer only one segment touches shrinks to one
/// window (`sizes[b] / batch`, stride 0), except the input, and the output unless only the back
/// segment touches it; every other buffer a segment touches keeps the batch, gets the stride
/// of one window, and is live over that whole segment. Returns the strides.
pub fn adjust(
    seg: Segments,
    n: usize,
    batch: usize,
    touched: &[Vec<usize>],
    [input_buf, output_buf]: [usize; 2],
    sizes: &mut [usize],
    life: &mut [(usize, usize)],
) -> Vec<usize> {
    let mut stride = vec![0usize; sizes.len()];
    for (b, ts) in touched.iter().enumerate() {
        let runs: Vec<Run> = ts.iter().map(|&t| seg.run(t)).collect();
        let front = runs.contains(&Run::Front);
        let back = runs.contains(&Run::Back);
        if !front && !back {
            continue;
        }
        let own = |r: Run| runs.iter().all(|&x| x == r);
        // The output leaves after a back segment's pass (blended), not after a front one's.
        let one_window = match b {
            _ if b == input_buf => false,
            _ if b == output_buf => own(Run::Back),
            _ => own(Run::Front) || own(Run::Back),
        };
        if one_window {
            sizes[b] /= batch;
            continue;
        }
        stride[b] = sizes[b] / batch;
        if front {
            life[b].0 = 0;
            life[b].1 = life[b].1.max(seg.pre - 1);
        }
        if back {
            life[b].0 = life[b].0.min(seg.post);
            life[b].1 = life[b].1.max(n - 1);
        }
    }
    stride
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs by launch index, and which buffers shrink, keep the batch or stretch their lives.
    #[test]
    fn adjust_shrinks_own_buffers_and_stretches_shared_ones() {
        let seg = Segments { pre: 2, post: 5 };
        assert_eq!(
            (0..7).map(|t| seg.run(t)).collect::<Vec<_>>(),
            [
                Run::Front,
                Run::Front,
                Run::Batch,
                Run::Batch,
                Run::Batch,
                Run::Back,
                Run::Back
            ]
        );
        assert!(seg.any(7) && !Segments { pre: 0, post: 7 }.any(7));
        // 0 input (read at 0), 1 front-only, 2 skip (written at 1, read at 2 and 6),
        // 3 batch-only, 4 read at 4 and 5 (into the back), 5 back-only, 6 the output (6).
        let touched = vec![
            vec![0],
            vec![0, 1],
            vec![1, 2, 6],
            vec![2, 3],
            vec![4, 5],
            vec![5, 6],
            vec![6],
        ];
        let mut sizes = vec![400, 800, 1200, 80, 40, 800, 120];
        let mut life = vec![
            (0, 0),
            (0, 1),
            (1, 6),
            (2, 3),
            (4, 5),
            (5, 6),
            (6, usize::MAX),
        ];
        let stride = adjust(seg, 7, 4, &touched, [0, 6], &mut sizes, &mut life);
        assert_eq!(sizes, [400, 200, 1200, 80, 40, 200, 30]);
        assert_eq!(stride, [100, 0, 300, 0, 10, 0, 0]);
        assert_eq!(
            life,
            [
                (0, 1),
                (0, 1),
                (0, 6),
                (2, 3),
                (4, 6),
                (5, 6),
                (6, usize::MAX)
            ]
        );
    }
}
