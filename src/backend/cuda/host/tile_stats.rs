//! Which convs hand the InstanceNorm / GroupNorm right after them its statistics
//! (`CudaOptions::norm_stats`). The conv runs its `_st` twin, whose epilogue writes per output
//! tile the sums of its values (kernels/tile_stats.cuh) into the plan's
//! norm scratch; the norm
//! then finalises those (`norm_finalize_tiles`) instead of reading the conv's output once more
//! for its partial sums. At 128³ that read is W1's largest norm pass (1 GiB of fp32 per batch
//! of 4).

use crate::backend::cuda::abi::Shape;
use crate::backend::cuda::host::catalogue::{zpair_st_variant, C1_TILE};
use crate::backend::cuda::host::conv_kernel::{ArchCaps, ConvKernel};
use crate::backend::cuda::host::launch::{Launch, ShiftedOut};
use crate::backend::cuda::host::windowed::{Run, Segments};
use crate::model::graph::{Graph, Op};

/// Bytes of one entry's statistics of one channel: (sum, sum of squares, shift, count) as f32.
pub const TILE_STAT_BYTES: usize = 16;

/// Pairs each conv launch with the norm launch right after it where the conv can write the
/// norm's statistics: its output is read by that norm alone, with no activation, residual or
/// head in between, and its kernel has an `_st` twin for that output
/// (`ConvKernel::with_norm_stats`); both launches run the same way (batched, or both in the
/// same window segment), so nothing else uses the scratch between them. The conv's kernel
/// becomes the twin, and both launches get `tile_stats` (the twin's entries per sample).
/// A norm launch that runs the conv before it (`Launch::recompute`) is a pair in itself: its
/// conv kernel becomes the twin too. Returns the scratch bytes the partials need for `batch`
/// samples (0: no pair). The fused parity classes' twin only with `ArchCaps::convt_stats`, the
/// `conv_wgk_*` twins only with `ArchCaps::wgk_stats`; the
/// z-pair twin as `ArchCaps::zpair_st_staged` says (`zpair_st_variant`). With
/// `ArchCaps::norm_shifted`, a z-pair or Cin-1 pair whose conv writes all of a dense output of
/// Cout % 8 == 0 (in one launch, or as a split conv's last part, which adds the earlier parts'
/// fp32 sums: `ShiftedOut::wide`), and whose norm writes its own output (no head reads its
/// input), stores the conv's values as fp16 less each tile's shift (`Launch::shifted`).
#[allow(clippy::too_many_arguments)]
pub fn pair(
    caps: &ArchCaps,
    graph: &Graph,
    cons: &[Vec<usize>],
    shapes: &[Shape],
    tensor: &[bool],
    launches: &mut [Launch],
    windows: &Segments,
    batch: usize,
) -> usize {
    let mut bytes = 0;
    // The kinds whose twins are behind a switch of their own.
    let switched_on = |k: &ConvKernel| match k {
        ConvKernel::Wgk(_) => caps.wgk_stats,
        ConvKernel::ParityFusedVec(..) | ConvKernel::ParityFusedWgk(..) => caps.convt_stats,
        _ => true,
    };
    let twin_of = |k: &ConvKernel, os: [usize; 4], ldc: usize, coff: usize| {
        if !switched_on(k) {
            return None;
        }
        let (twin, tiles) = k.with_norm_stats(os, ldc, coff)?;
        Some(match twin {
            ConvKernel::Halo(c) => (
                ConvKernel::Halo(zpair_st_variant(c, caps.zpair_st_staged)),
                tiles,
            ),
            t => (t, tiles),
        })
    };
    // A window segment's copies run one window at a time.
    let samples = |t: usize| {
        if windows.run(t) == Run::Batch {
            batch
        } else {
            1
        }
    };
    for (t, l) in launches.iter_mut().enumerate() {
        let Some(c) = l.recompute else { continue };
        let os = shapes[graph.nodes[c].output];
        if let Some((twin, tiles)) = l.conv.as_ref().and_then(|k| twin_of(k, os, l.ldc, l.coff)) {
            bytes = bytes.max(samples(t) * tiles * os[0] * TILE_STAT_BYTES);
            l.conv = Some(twin);
            l.tile_stats = Some(tiles);
        }
    }
    for t in 1..launches.len() {
        let (conv, norm) = (&launches[t - 1], &launches[t]);
        let nnode = &graph.nodes[norm.node];
        let is_norm = matches!(nnode.op, Op::InstanceNorm { .. } | Op::GroupNorm { .. });
        let v = conv.out_v;
        let sole = cons[v].as_slice() == [norm.node] && nnode.inputs.as_slice() == [v];
        let plain = conv.fuse.is_none() && conv.residual.is_none() && conv.head.is_none();
        if !is_norm || tensor[norm.node] || tensor[conv.node] || !sole || !plain {
            continue;
        }
        if windows.run(t - 1) != windows.run(t) || v == graph.output {
            continue;
        }
        let os = shapes[v];
        let Some((twin, tiles)) = conv
            .conv
            .as_ref()
            .and_then(|k| twin_of(k, os, conv.ldc, conv.coff))
        else {
            continue;
        };
        bytes = bytes.max(samples(t) * tiles * os[0] * TILE_STAT_BYTES);
        // The twins that can store shifted values, by their tile.
        let tile = match &twin {
            ConvKernel::Halo(c) if c.zpair => Some(c.tile),
            ConvKernel::Cin1 { .. } => Some(C1_TILE),
            _ => None,
        };
        let part = launches[t - 1].part;
        let shifted = tile
            .filter(|_| {
                caps.norm_shifted
                    && part.is_none_or(|p| p.accumulate)
                    && launches[t].head.is_none()
                    && os[0].is_multiple_of(8)
                    && (launches[t - 1].ldc, launches[t - 1].coff) == (os[0], 0)
            })
            .map(|tile| ShiftedOut {
                tile,
                wide: part.is_some(),
                runs: caps.norm_runs && ShiftedOut::runs_fit(tile, os[3]),
            });
        launches[t - 1].conv = Some(twin);
        for l in [t - 1, t] {
            launches[l].tile_stats = Some(tiles);
            launches[l].shifted = shifted;
        }
    }
    bytes
}
