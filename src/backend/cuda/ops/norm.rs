//! Instance / group norm (partial sums, finalise into per-(sample, channel) scale and shift, then
//! the affine pass) and the channel affine, both with a fused activation and, for the norm, a
//! fused residual Add after it.

use super::{Build, NodeIo};
use crate::backend::cuda::abi::Act;
use crate::backend::cuda::abi::{norm_blocks, NORM_RUN};
use crate::backend::cuda::host::catalogue::{
    Kernel, AFFINE_ACT, AFFINE_ACT_F32, AFFINE_ACT_FLAT8, AFFINE_ACT_FLAT8_F32, AFFINE_ACT_V8,
    AFFINE_ACT_V8_F32, AFFINE_ACT_V8_SHIFTED, AFFINE_ACT_V8_SHIFTED_RUNS, NORM_FINALIZE,
    NORM_FINALIZE_TILES, NORM_PARTIAL, NORM_PARTIAL_F32, NORM_PARTIAL_FLAT8,
    NORM_PARTIAL_FLAT8_F32, NORM_PARTIAL_V8, NORM_PARTIAL_V8_F32,
};
use crate::backend::cuda::runtime::launch::{Arg, Gpu};
use crate::model::graph::Op;
use crate::Result;
use cudarc::driver::CudaStream;

/// y = act(x * a + b) per channel (or per sample and channel), over `pix` voxels.
pub(crate) struct Affine {
    pub x: u64,
    pub y: u64,
    /// x is fp32 (the output fp16 either way).
    pub x_f32: bool,
    pub pix: usize,
    pub c: usize,
    /// f32 (a, b) pairs.
    pub ab: u64,
    /// Pairs between samples (0: one pair per channel for all samples).
    pub nstride: usize,
    pub act: Act,
    pub slope: u64,
    /// fp16 residual added after the activation (a fused Add, dense at y's index), 0: none.
    pub res: u64,
    /// x is fp16 less each output tile's shift of the conv before (`Launch::shifted`).
    pub shifted: Option<Shifted>,
}

/// Where the shifts of a norm's input stored as fp16 less each tile's shift are
/// (`affine_act_v8_shifted`): the statistics of `tiles` tiles per sample of `tile` voxels
/// (z, y, x, `tile_origin`'s order) over an output of `h` x `w` planes; `xs` halves from one
/// voxel's values to the next (C, or 2C: `ShiftedOut::wide`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shifted {
    pub tile: [usize; 3],
    pub tiles: usize,
    pub h: usize,
    pub w: usize,
    pub xs: usize,
    /// Read in runs of `NORM_RUN` voxels along x (`affine_act_v8_shifted_runs`,
    /// `ShiftedOut::runs`).
    pub runs: bool,
}

impl Shifted {
    /// The affine kernel that reads it, and the voxels of a thread's unit (one channel group).
    pub fn kernel(&self) -> (Kernel, usize) {
        if self.runs {
            (AFFINE_ACT_V8_SHIFTED_RUNS, NORM_RUN)
        } else {
            (AFFINE_ACT_V8_SHIFTED, 1)
        }
    }
}

/// A norm: statistics of `x` into the scratch, then the affine pass with its scale / shift.
pub(crate) struct Norm {
    pub groups: usize,
    pub eps: f32,
    pub gamma: u64,
    pub beta: u64,
    /// Its `ab` is unused: the pairs are the plan's norm scratch, given at launch.
    pub affine: Affine,
    /// The conv before it wrote its statistics for this many output tiles per sample
    /// (`Launch::tile_stats`): finalised from those, with no partial-sum pass.
    pub tiles: Option<usize>,
}

/// The norm of node `op` (InstanceNorm: one group per channel).
pub(crate) fn build_norm(b: &mut Build, op: &Op, io: &NodeIo) -> Result<Norm> {
    let (eps, scale, bias, groups) = match op {
        Op::InstanceNorm { eps, scale, bias } => (*eps, scale, bias, io.xshape[0]),
        Op::GroupNorm {
            eps,
            scale,
            bias,
            groups,
        } => (*eps, scale, bias, *groups),
        _ => unreachable!("a norm op"),
    };
    let gamma = b.upload_const(&scale.data)?;
    let beta = b.upload_const(&bias.data)?;
    Ok(Norm {
        groups,
        eps,
        gamma,
        beta,
        affine: Affine {
            nstride: io.xshape[0],
            x_f32: io.x_f32 && io.shifted.is_none(),
            shifted: io.shifted.zip(io.stats_tiles).map(|(sh, tiles)| Shifted {
                tile: sh.tile,
                tiles,
                h: io.xshape[2],
                w: io.xshape[3],
                xs: io.xshape[0] * if sh.wide { 2 } else { 1 },
                runs: sh.runs,
            }),
            ..affine_of(io, 0)
        },
        tiles: io.stats_tiles,
    })
}

/// The channel affine of node `op`: its (scale, shift) pairs uploaded.
pub(crate) fn build_affine(b: &mut Build, op: &Op, io: &NodeIo) -> Result<Affine> {
    let Op::ChannelAffine { scale, shift } = op else {
        unreachable!("an affine op")
    };
    let ab: Vec<f32> = scale
        .data
        .iter()
        .zip(&shift.data)
        .flat_map(|(a, b)| [*a, *b])
        .collect();
    let ab = b.upload_const(&ab)?;
    Ok(affine_of(io, ab))
}

fn affine_of(io: &NodeIo, ab: u64) -> Affine {
    Affine {
        x: io.x,
        y: io.y,
        x_f32: io.x_f32,
        pix: io.pix,
        c: io.xshape[0],
        ab,
        nstride: 0,
        act: io.act.clone(),
        slope: io.slope,
        res: io.res,
        shifted: None,
    }
}

/// The vector period (C / gcd(C, 8)) of the flat 16-byte kernels for a channel count that is
/// not a multiple of 8, when a sample is whole vectors and a block's threads hold a period.
fn flat8_period(pix: usize, c: usize) -> Option<usize> {
    let g = [8, 4, 2, 1].into_iter().find(|g| c.is_multiple_of(*g))?;
    let period = c / g;
    (!c.is_multiple_of(8) && c > 0 && (pix * c).is_multiple_of(8) && period <= 256)
        .then_some(period)
}

/// Slope values of a PRelu (1 when there is none).
pub(crate) fn slope_n(act: &Act) -> i32 {
    match act {
        Act::PRelu(s) => s.len() as i32,
        _ => 1,
    }
}

impl Norm {
    /// The three launches for `n` samples: partial sums into `part`, scale / shift pairs into
    /// `ab`, the affine pass from them.
    pub fn launch(&self, gpu: &Gpu, s: &CudaStream, n: usize, scratch: [u64; 2]) -> Result<()> {
        self.stats(gpu, s, n, scratch)?;
        let shift = self.affine.shifted.map(|sh| (scratch[0], sh));
        self.affine.launch_with(gpu, s, n, scratch[1], shift)
    }

    /// The statistics of `n` samples: partial sums into `part`, then the scale / shift pairs
    /// into `ab` (what the affine pass, or a head normalising on load, reads); or only the
    /// pairs, from the tile sums the conv before left in `part` (`tiles`).
    pub fn stats(&self, gpu: &Gpu, s: &CudaStream, n: usize, [part, ab]: [u64; 2]) -> Result<()> {
        let a = &self.affine;
        let (pix, c) = (a.pix, a.c);
        // The finalisations' last arguments: groups, eps, gamma, beta, the pairs' destination.
        let [g, eps, gamma, beta, ab] = [
            Arg::I32(self.groups as i32),
            Arg::F32(self.eps),
            Arg::Ptr(self.gamma),
            Arg::Ptr(self.beta),
            Arg::Ptr(ab),
        ];
        if let Some(tiles) = self.tiles {
            // The conv before wrote each tile's sums into `part`.
            return gpu.launch(
                s,
                NORM_FINALIZE_TILES.name,
                ((n * c) as u32, 1, 1),
                (256, 0),
                &mut [
                    Arg::Ptr(part),
                    Arg::I32(tiles as i32),
                    Arg::I32(c as i32),
                    g,
                    eps,
                    gamma,
                    beta,
                    ab,
                ],
            );
        }
        let nblk = norm_blocks(gpu.sm_count as usize, pix);
        // (kernel, blocks per sample, pixels or vectors per block, shared memory bytes)
        let (k, nblk, chunk, smem) = if c % 8 == 0 && c <= 2048 {
            let rows = 256 / (c / 8);
            let k = if a.x_f32 {
                NORM_PARTIAL_V8_F32
            } else {
                NORM_PARTIAL_V8
            };
            (k, nblk, pix.div_ceil(nblk), rows * c * 8)
        } else if let Some(period) = flat8_period(pix, c) {
            // Blocks start at a multiple of the period, so each thread keeps its channels.
            let nv = pix * c / 8;
            let chunkv = nv.div_ceil(nblk).div_ceil(period) * period;
            let threads = (256 / period) * period;
            (
                if a.x_f32 {
                    NORM_PARTIAL_FLAT8_F32
                } else {
                    NORM_PARTIAL_FLAT8
                },
                nv.div_ceil(chunkv),
                chunkv,
                threads * 8 * 8,
            )
        } else {
            let rows = 256 / c.min(256);
            let k = if a.x_f32 {
                NORM_PARTIAL_F32
            } else {
                NORM_PARTIAL
            };
            (k, nblk, pix.div_ceil(nblk), rows * c * 8)
        };
        gpu.launch(
            s,
            k.name,
            (nblk as u32, n as u32, 1),
            (256, smem as u32),
            &mut [
                Arg::Ptr(a.x),
                Arg::I64(pix as i64),
                Arg::I32(c as i32),
                Arg::I32(self.groups as i32),
                Arg::I64(chunk as i64),
                Arg::Ptr(part),
            ],
        )?;
        gpu.launch(
            s,
            NORM_FINALIZE.name,
            ((n * c).div_ceil(4) as u32, 1, 1),
            (128, 0),
            &mut [
                Arg::Ptr(part),
                Arg::I32(nblk as i32),
                Arg::Ptr(a.x),
                Arg::I32(a.x_f32 as i32),
                Arg::I32(n as i32),
                Arg::I64(pix as i64),
                Arg::I32(c as i32),
                g,
                eps,
                gamma,
                beta,
                ab,
            ],
        )
    }
}

impl Affine {
    /// y = act(x * a + b) for `n` samples.
    pub fn launch(&self, gpu: &Gpu, s: &CudaStream, n: usize) -> Result<()> {
        self.launch_with(gpu, s, n, self.ab, None)
    }

    /// As `launch` with the pairs at `ab`; vectors of 8 values when C % 8 == 0, or over the
    /// flattened sample when only P * C % 8 == 0. `shift`: x is fp16 less each tile's shift,
    /// the shifts in the tile statistics at that address (the norm scratch, as the conv before
    /// left it; vectors of 8 only).
    fn launch_with(
        &self,
        gpu: &Gpu,
        s: &CudaStream,
        n: usize,
        ab: u64,
        shift: Option<(u64, Shifted)>,
    ) -> Result<()> {
        let (pix, c) = (self.pix, self.c);
        let nv = pix * c / 8;
        let v8 = c.is_multiple_of(8) && nv < (1usize << 32);
        if shift.is_some() && !v8 {
            return Err(crate::Error::Backend(format!(
                "a shifted norm input needs C % 8 == 0 and fewer than 2^32 vectors (C {c}, {pix} voxels)"
            )));
        }
        if v8 || flat8_period(pix, c).is_some() {
            // A thread's unit: one vector, or a channel group of a shifted kernel's run.
            let (k, run) = match (shift, v8, self.x_f32) {
                (Some((_, sh)), _, _) => sh.kernel(),
                (None, true, true) => (AFFINE_ACT_V8_F32, 1),
                (None, true, false) => (AFFINE_ACT_V8, 1),
                (None, false, true) => (AFFINE_ACT_FLAT8_F32, 1),
                (None, false, false) => (AFFINE_ACT_FLAT8, 1),
            };
            let per = (gpu.sm_count as usize * 16).div_ceil(n).max(1);
            let grid = ((nv / run).div_ceil(256).clamp(1, per) as u32, n as u32, 1);
            let mut args = vec![
                Arg::Ptr(self.x),
                Arg::Ptr(self.y),
                Arg::I64(pix as i64),
                Arg::I32(c as i32),
            ];
            args.extend(self.pair_args(ab));
            if let Some((part, sh)) = shift {
                let [h, w, tz, ty, tx, tiles, xs] = [
                    sh.h, sh.w, sh.tile[0], sh.tile[1], sh.tile[2], sh.tiles, sh.xs,
                ];
                args.push(Arg::Ptr(part));
                args.extend([h, w, tz, ty, tx, tiles, xs].map(|v| Arg::I32(v as i32)));
            }
            return gpu.launch(s, k.name, grid, (256, 0), &mut args);
        }
        let total = n * pix * c;
        let k = if self.x_f32 {
            AFFINE_ACT_F32
        } else {
            AFFINE_ACT
        };
        let mut args = vec![
            Arg::Ptr(self.x),
            Arg::Ptr(self.y),
            Arg::I64(total as i64),
            Arg::I64(pix as i64),
            Arg::I32(c as i32),
        ];
        args.extend(self.pair_args(ab));
        gpu.eltwise(s, k.name, total, &mut args)
    }

    /// The arguments every affine kernel takes after the shapes: the pairs at `ab`, their
    /// stride between samples, the activation and the residual.
    fn pair_args(&self, ab: u64) -> [Arg; 7] {
        let act = &self.act;
        [
            Arg::Ptr(ab),
            Arg::I32(self.nstride as i32),
            Arg::I32(act.code()),
            Arg::F32(act.alpha()),
            Arg::Ptr(self.slope),
            Arg::I32(slope_n(act)),
            Arg::Ptr(self.res),
        ]
    }
}
