//! Convs and transposed convs: the launch(es) of one conv on the kernel the buffer plan chose
//! (weights re-laid and uploaded at build), and their grids at run.

use super::norm::{slope_n, Affine};
use super::{Build, NodeIo};
use crate::backend::cuda::abi::elem_bytes;
use crate::backend::cuda::abi::{ConvParams, OUT_SHIFTED};
use crate::backend::cuda::host::catalogue::{
    box_tiles, halo_config, wgk_config, HaloConfig, C1_TILE, CONV1X1_MMA_N16, CONV1X1_N16,
    CONV1X1_N16_S, CONV1X1_N32, CONV1X1_N32_S, CONV1X1_NORM_MMA_N16, CONV1X1_NORM_N16,
    CONV1X1_NORM_N16_S, CONV1X1_NORM_N32, CONV1X1_NORM_N32_S, CONVT_UP2_P, CONV_C1_K3,
    CONV_C1_K3_NRM, CONV_C1_K3_ST, CONV_C1_K3_STO, CONV_SPLITK_REDUCE, UP2_BLOCKS_PER_SM,
    UP2_TILE_VOXELS, WGK_THREADS,
};
use crate::backend::cuda::host::conv_kernel::ConvKernel;
use crate::backend::cuda::host::relayout::{
    relayout_fused_parity_weight, relayout_parity_weight, relayout_upsampling_weight,
    relayout_weight,
};
use crate::backend::cuda::runtime::launch::{Arg, Gpu};
use crate::backend::cuda::runtime::tma::{halo_map, tile_map, weight_map};
use crate::model::graph::{Op, Tensor};
use crate::{Error, Result};
use cudarc::driver::CudaStream;

/// One conv launch: the kernel, its parameter block (n filled in at run), the operands and the
/// launch shape.
#[derive(Clone)]
pub(crate) struct ConvStep {
    pub func: &'static str,
    pub p: ConvParams,
    pub x: u64,
    pub w: u64,
    pub bias: u64,
    pub y: u64,
    pub slope: u64,
    /// GEMM tile rows / columns, threads and dynamic shared memory of the launch.
    pub bm: u32,
    pub bn: u32,
    pub threads: u32,
    pub smem: u32,
    /// Grouped conv on `CONV_DIRECT` (one thread per output).
    pub direct: bool,
    /// 1x1x1 conv with few outputs on `conv1x1_n*` (one thread per voxel).
    pub pointwise: bool,
    /// K splits of an mma conv (`ConvKernel::SplitK`; 1: none): partial sums in the plan's
    /// scratch, then `conv_splitk_reduce`.
    pub ksplit: usize,
    /// An `_st` kernel writing the next norm's statistics per output tile into the plan's
    /// scratch (`ConvParams::stats`).
    pub stats: bool,
}

/// The op's conv parameters, the same for a conv and a transposed conv.
struct ConvOp<'a> {
    weight: &'a Tensor,
    bias: Option<&'a Tensor>,
    groups: usize,
    transposed: bool,
    stride: [usize; 3],
    dil: [usize; 3],
    pads: [usize; 3],
}

impl<'a> ConvOp<'a> {
    fn of(op: &'a Op) -> Option<Self> {
        let (weight, bias, groups, stride, dil, pads, transposed) = match op {
            Op::Conv(c) => (
                &c.weight,
                c.bias.as_ref(),
                c.groups,
                c.stride,
                c.dilation,
                &c.pads,
                false,
            ),
            Op::ConvTranspose(c) => (
                &c.weight,
                c.bias.as_ref(),
                c.groups,
                c.stride,
                c.dilation,
                &c.pads,
                true,
            ),
            _ => return None,
        };
        Some(ConvOp {
            weight,
            bias,
            groups,
            transposed,
            stride,
            dil,
            pads: [pads[0], pads[1], pads[2]],
        })
    }

    /// The parameter block of the conv as written (n = 0: set per run).
    fn params(&self, io: &NodeIo) -> ConvParams {
        let (xs, os, w) = (io.xshape, io.oshape, &self.weight.shape);
        let (k, stride, dil, pads) = ([w[2], w[3], w[4]], self.stride, self.dil, self.pads);
        ConvParams {
            n: 0,
            di: xs[1] as i32,
            hi: xs[2] as i32,
            wi: xs[3] as i32,
            cin: io.part.map_or(xs[0], |p| p.cin) as i32,
            do_: os[1] as i32,
            ho: os[2] as i32,
            wo: os[3] as i32,
            cout: os[0] as i32,
            kd: k[0] as i32,
            kh: k[1] as i32,
            kw: k[2] as i32,
            sd: stride[0] as i32,
            sh: stride[1] as i32,
            sw: stride[2] as i32,
            pd: pads[0] as i32,
            ph: pads[1] as i32,
            pw: pads[2] as i32,
            dd: dil[0] as i32,
            dh: dil[1] as i32,
            dw: dil[2] as i32,
            transposed: self.transposed as i32,
            kpad: 0,
            groups: self.groups as i32,
            ldc: io.ldc as i32,
            coff: io.coff as i32,
            act: io.act.code(),
            alpha: io.act.alpha(),
            slope_n: io.slope_n,
            out_f32: if io.shifted.is_some() {
                OUT_SHIFTED
            } else {
                io.y_f32 as i32
            },
            accum: io.part.is_some_and(|p| p.accumulate) as i32,
            ldi: xs[0] as i32,
            res: io.res,
            ..Default::default()
        }
    }
}

/// The launch(es) of conv node `op` on `kernel`, uploading its bias and re-laid weight(s).
pub(crate) fn build(
    b: &mut Build,
    op: &Op,
    kernel: &ConvKernel,
    io: &NodeIo,
) -> Result<Vec<ConvStep>> {
    let c = ConvOp::of(op).expect("a conv op");
    // A split conv's launch: its part's slice of the weights, the bias on the first part only,
    // x at the part's first channel (fp16).
    let sliced;
    let (c, x) = match io.part {
        Some(part) => {
            let zpair = matches!(kernel, ConvKernel::Halo(h) if h.zpair);
            if part.accumulate && !(zpair && io.y_f32) {
                return Err(Error::Backend(format!(
                    "node {}: only a z-pair kernel adds to an fp32 output, not {}",
                    io.name,
                    kernel.funcs()[0]
                )));
            }
            let slice = part.cin != io.xshape[0];
            if slice && !(zpair && !io.x_f32 && part.x_coff % 8 == 0) {
                return Err(Error::Backend(format!(
                    "node {}: {} cannot read channels {}..{} of its input",
                    io.name,
                    kernel.funcs()[0],
                    part.x_coff,
                    part.x_coff + part.cin
                )));
            }
            sliced = cin_slice(c.weight, part.cin_off, part.cin);
            let c = ConvOp {
                weight: &sliced,
                bias: c.bias.filter(|_| !part.accumulate),
                ..c
            };
            (c, io.x + (part.x_coff * 2) as u64)
        }
        None => (c, io.x),
    };
    if io.stats_tiles.is_some() != kernel.writes_stats() {
        return Err(Error::Backend(format!(
            "node {}: the plan and kernel {} disagree on writing norm statistics",
            io.name,
            kernel.funcs()[0]
        )));
    }
    let bias = match c.bias {
        Some(t) => b.upload_const(&t.data)?,
        None => 0,
    };
    let p = c.params(io);
    let rows_pad = kernel.weight_rows(&c.weight.shape, c.groups, c.transposed);
    let step = |p: ConvParams, w: u64, y: u64, (func, bm, bn, threads, smem)| ConvStep {
        func,
        p,
        x,
        w,
        bias,
        y,
        slope: io.slope,
        bm,
        bn,
        threads,
        smem,
        direct: c.groups != 1,
        pointwise: false,
        ksplit: 1,
        stats: false,
    };
    use ConvKernel as K;
    match kernel {
        // A strided transposed conv: one dense conv per output parity class on the mma
        // kernel, scattered with stride `stride` (no zero MACs).
        K::Parity(classes) => {
            let (os, stride) = (io.oshape, c.stride);
            let mut out = Vec::new();
            for (cl, m) in classes {
                let w = &c.weight;
                let (wh, kpad) = relayout_parity_weight(&w.data, &w.shape, &cl.taps, rows_pad);
                let mut q = p;
                (q.do_, q.ho, q.wo) = (cl.grid[0] as i32, cl.grid[1] as i32, cl.grid[2] as i32);
                (q.kd, q.kh, q.kw) = (
                    cl.taps[0].len() as i32,
                    cl.taps[1].len() as i32,
                    cl.taps[2].len() as i32,
                );
                (q.sd, q.sh, q.sw) = (1, 1, 1);
                (q.dd, q.dh, q.dw) = (1, 1, 1);
                (q.pd, q.ph, q.pw) = (cl.pad[0], cl.pad[1], cl.pad[2]);
                q.transposed = 0;
                (q.up_d, q.up_h, q.up_w) = (stride[0] as i32, stride[1] as i32, stride[2] as i32);
                q.ocout = os[0] as i32;
                (q.od, q.oh, q.ow) = (os[1] as i32, os[2] as i32, os[3] as i32);
                q.kpad = kpad as i32;
                let wp = b.upload_const(&wh)?;
                // The class's first output voxel: the scatter adds (j * stride) to it.
                let first = (cl.r[0] * os[2] + cl.r[1]) * os[3] + cl.r[2];
                let y = io.y + (first * io.ldc * elem_bytes(io.y_f32)) as u64;
                let shape = (m.name, m.bm as u32, m.bn as u32, m.threads, m.smem_bytes());
                out.push(step(q, wp, y, shape));
            }
            Ok(out)
        }
        // The classes as one conv over the union of their taps: GEMM column class * Cout + co,
        // the scatter epilogue stores row j's column block of class r at j * stride + r (on
        // mma.sync, or on wgmma over tiles of the input grid).
        K::ParityFused(f, _) | K::ParityFusedVec(f, _, _) | K::ParityFusedWgk(f, _) => {
            let (os, stride, w) = (io.oshape, c.stride, &c.weight);
            let (wh, kpad) = relayout_fused_parity_weight(&w.data, &w.shape, f, rows_pad);
            let mut q = p;
            (q.do_, q.ho, q.wo) = (f.grid[0] as i32, f.grid[1] as i32, f.grid[2] as i32);
            (q.kd, q.kh, q.kw) = (f.k[0] as i32, f.k[1] as i32, f.k[2] as i32);
            (q.sd, q.sh, q.sw) = (1, 1, 1);
            (q.dd, q.dh, q.dw) = (1, 1, 1);
            (q.pd, q.ph, q.pw) = (f.pad[0], f.pad[1], f.pad[2]);
            q.transposed = 0;
            q.cout = (f.classes.len() * os[0]) as i32;
            (q.up_d, q.up_h, q.up_w) = (stride[0] as i32, stride[1] as i32, stride[2] as i32);
            q.ocout = os[0] as i32;
            (q.od, q.oh, q.ow) = (os[1] as i32, os[2] as i32, os[3] as i32);
            q.kpad = kpad as i32;
            let wp = b.upload_const(&wh)?;
            let func = kernel.funcs()[0];
            let shape = match kernel {
                K::ParityFusedWgk(_, c) => (func, 128, c.bn as u32, WGK_THREADS, c.smem_bytes()),
                K::ParityFused(_, m) | K::ParityFusedVec(_, m, _) => {
                    (func, m.bm as u32, m.bn as u32, m.threads, m.smem_bytes())
                }
                _ => unreachable!("matched above"),
            };
            Ok(vec![ConvStep {
                stats: kernel.writes_stats(),
                ..step(q, wp, io.y, shape)
            }])
        }
        // 1x1x1 conv with few outputs (the head): memory bound, one thread per voxel.
        K::Pointwise { nc, .. } => {
            let cin = io.xshape[0];
            let w = &c.weight;
            let (wh, kpad) = relayout_weight(&w.data, &w.shape, 1, false, rows_pad);
            let mut p = p;
            p.kpad = kpad as i32;
            let wp = b.upload_const(&wh)?;
            let func = kernel.funcs()[0];
            let smem = kernel.pointwise_smem(cin) as u32;
            Ok(vec![ConvStep {
                direct: false,
                pointwise: true,
                ..step(p, wp, io.y, (func, 256, *nc as u32, 256, smem))
            }])
        }
        // Plain GEMM [input voxels x Cin] x [Cin x taps*Cout], scattered to the k^3 blocks.
        K::Upsample(_) | K::UpsampleVec(_) | K::Up2 => {
            let (xs, os, w) = (io.xshape, io.oshape, &c.weight);
            let k = [w.shape[2], w.shape[3], w.shape[4]];
            let (wh, kpad) = relayout_upsampling_weight(&w.data, &w.shape, rows_pad);
            let mut p = p;
            p.do_ = xs[1] as i32;
            p.ho = xs[2] as i32;
            p.wo = xs[3] as i32;
            p.cout = (k[0] * k[1] * k[2] * os[0]) as i32;
            (p.kd, p.kh, p.kw) = (1, 1, 1);
            (p.sd, p.sh, p.sw) = (1, 1, 1);
            (p.dd, p.dh, p.dw) = (1, 1, 1);
            p.transposed = 0;
            (p.up_d, p.up_h, p.up_w) = (k[0] as i32, k[1] as i32, k[2] as i32);
            p.ocout = os[0] as i32;
            (p.od, p.oh, p.ow) = (os[1] as i32, os[2] as i32, os[3] as i32);
            p.kpad = kpad as i32;
            let wp = b.upload_const(&wh)?;
            let shape = match kernel {
                K::Upsample(m) | K::UpsampleVec(m) => (
                    kernel.funcs()[0],
                    m.bm as u32,
                    m.bn as u32,
                    m.threads,
                    m.smem_bytes(),
                ),
                // Static shared memory; `launch` sizes its persistent grid.
                _ => (kernel.funcs()[0], UP2_TILE_VOXELS as u32, 0, 256, 0),
            };
            Ok(vec![step(p, wp, io.y, shape)])
        }
        // Stride-1 3^3 with Cin k x 32: the input halo of a 4x8x8 output tile loaded once
        // for all 27 taps (`conv_halo_*`), the mma weight layout; or the mma / legacy tiles.
        K::Halo(_) | K::Mma(_) | K::Wgk(_) | K::SplitK(..) | K::Legacy { .. } | K::Cin1 { .. } => {
            let w = &c.weight;
            let (wh, kpad) = relayout_weight(&w.data, &w.shape, c.groups, c.transposed, rows_pad);
            let mut p = p;
            p.kpad = kpad as i32;
            let wp = b.upload_const(&wh)?;
            let (func, bm, bn, threads, smem) = match kernel {
                K::Halo(h) => (h.name, 256, h.bn, h.threads, h.smem_bytes()),
                K::Mma(m) | K::SplitK(m, _) => (m.name, m.bm, m.bn, m.threads, m.smem_bytes()),
                K::Wgk(c) => (c.name, 128, c.bn, WGK_THREADS, c.smem_bytes()),
                K::Legacy { func, bn } => (*func, 128, *bn, 128, 0),
                // One block per 4x8x32 output tile, static shared memory.
                K::Cin1 { .. } => (kernel.funcs()[0], 1024, 64, 256, 0),
                _ => unreachable!("matched above"),
            };
            let shape = (func, bm as u32, bn as u32, threads, smem);
            Ok(vec![ConvStep {
                ksplit: kernel.k_splits(),
                stats: io.stats_tiles.is_some(),
                ..step(p, wp, io.y, shape)
            }])
        }
    }
}

/// Input channels `[off, off + n)` of conv weight `w` ([Cout, Cin, kd, kh, kw]).
fn cin_slice(w: &Tensor, off: usize, n: usize) -> Tensor {
    let (cin, taps) = (w.shape[1], w.shape[2..].iter().product::<usize>());
    let data = w
        .data
        .chunks(cin * taps)
        .flat_map(|co| &co[off * taps..(off + n) * taps])
        .copied()
        .collect();
    let mut shape = w.shape.clone();
    shape[1] = n;
    Tensor::new(shape, data)
}

/// The grid of halo kernel `c` over `p` (its samples set): one block per output tile, or
/// persistent blocks that loop over the tiles; grid.y: the bn-wide output-channel tiles.
fn halo_grid(gpu: &Gpu, c: &HaloConfig, p: &ConvParams) -> (u32, u32, u32) {
    let out = [p.do_ as usize, p.ho as usize, p.wo as usize];
    let blocks = c.grid(p.n as usize, out, gpu.sm_count as usize);
    (blocks, c.cout_tiles(p.cout as usize), 1)
}

/// Whether `func` is one of the Cin-1 kernels (one block per `C1_TILE` output tile).
fn is_c1(func: &str) -> bool {
    [CONV_C1_K3, CONV_C1_K3_ST, CONV_C1_K3_STO, CONV_C1_K3_NRM]
        .iter()
        .any(|k| k.name == func)
}

/// The grid of a Cin-1 kernel over `p` (its samples set): one block per `C1_TILE` output tile.
fn c1_grid(p: &ConvParams) -> (u32, u32, u32) {
    let out = [p.do_ as usize, p.ho as usize, p.wo as usize];
    (box_tiles(p.n as usize, out, C1_TILE) as u32, 1, 1)
}

/// Blocks of a pointwise conv over `m` voxels: one thread a voxel, grid-stride past 16 blocks
/// per SM.
fn pointwise_blocks(gpu: &Gpu, m: usize) -> u32 {
    m.div_ceil(256).clamp(1, gpu.sm_count as usize * 16) as u32
}

/// The `conv1x1_norm_*` twin of pointwise kernel `func` (the head that normalises a norm's
/// input on load), if it has one.
pub(crate) fn normed_func(func: &str) -> Option<&'static str> {
    match func {
        f if f == CONV1X1_N16.name => Some(CONV1X1_NORM_N16.name),
        f if f == CONV1X1_N32.name => Some(CONV1X1_NORM_N32.name),
        f if f == CONV1X1_N16_S.name => Some(CONV1X1_NORM_N16_S.name),
        f if f == CONV1X1_N32_S.name => Some(CONV1X1_NORM_N32_S.name),
        f if f == CONV1X1_MMA_N16.name => Some(CONV1X1_NORM_MMA_N16.name),
        _ => None,
    }
}

impl ConvStep {
    /// Whether it can run on a norm's input ([`launch_normed`](Self::launch_normed)): a
    /// pointwise head with a `conv1x1_norm_*` twin, or an `_nl` z-pair kernel.
    pub fn reads_norm_input(&self) -> bool {
        (self.pointwise && normed_func(self.func).is_some())
            || halo_config(self.func).is_some_and(|c| c.norm_load)
    }

    /// The two launches of a Cin-1 conv its norm recomputes (`Launch::recompute`), from its
    /// statistics twin (`CONV_C1_K3_ST`): the statistics alone (`_sto`), and the conv
    /// normalising on store (`_nrm`, run by [`launch_normed`](Self::launch_normed)).
    pub fn recomputed(self) -> Result<(ConvStep, ConvStep)> {
        if self.func != CONV_C1_K3_ST.name || self.p.act != 0 {
            return Err(Error::Backend(format!(
                "{}: only a Cin-1 conv without an activation, on its statistics twin, is recomputed",
                self.func
            )));
        }
        let stats = ConvStep {
            func: CONV_C1_K3_STO.name,
            ..self.clone()
        };
        let normed = ConvStep {
            func: CONV_C1_K3_NRM.name,
            stats: false,
            ..self
        };
        Ok((stats, normed))
    }

    /// The arguments every conv kernel takes first, with `p` and input `x`.
    fn args(&self, p: ConvParams, x: u64) -> [Arg; 6] {
        [
            Arg::Conv(p),
            Arg::Ptr(x),
            Arg::Ptr(self.w),
            Arg::Ptr(self.bias),
            Arg::Ptr(self.y),
            Arg::Ptr(self.slope),
        ]
    }

    /// Launches the conv on the input of the norm `a` (its input pointer, type and activation)
    /// for `n` samples, normalising on load with the (a, b) pairs at `ab`: a pointwise head
    /// on its `conv1x1_norm_*` twin, or an `_nl` z-pair kernel. The norm's output is never
    /// written.
    pub fn launch_normed(
        &self,
        gpu: &Gpu,
        s: &CudaStream,
        n: usize,
        ab: u64,
        a: &Affine,
    ) -> Result<()> {
        let nrm = self.func == CONV_C1_K3_NRM.name;
        if !self.reads_norm_input() && !nrm {
            return Err(Error::Backend(format!(
                "{}: only the pointwise heads, the `_nl` kernels and `{}` normalise",
                self.func, CONV_C1_K3_NRM.name
            )));
        }
        let mut p = self.p;
        p.n = n as i32;
        let (func, grid) = match halo_config(self.func) {
            _ if nrm => (self.func, c1_grid(&p)),
            Some(c) => (self.func, halo_grid(gpu, c, &p)),
            None => {
                let m = n * (p.do_ * p.ho * p.wo) as usize;
                let func = normed_func(self.func).expect("checked by reads_norm_input");
                (func, (pointwise_blocks(gpu, m), 1, 1))
            }
        };
        // The recomputed conv reads its own input; the others the norm's.
        let x = if nrm { self.x } else { a.x };
        let [a0, a1, a2, a3, a4, a5] = self.args(p, x);
        gpu.launch(
            s,
            func,
            grid,
            (self.threads, self.smem),
            &mut [
                a0,
                a1,
                a2,
                a3,
                a4,
                a5,
                Arg::Ptr(ab),
                Arg::I32(a.x_f32 as i32),
                Arg::I32(a.act.code()),
                Arg::F32(a.act.alpha()),
                Arg::Ptr(a.slope),
                Arg::I32(slope_n(&a.act)),
            ],
        )
    }

    /// Launches the conv for `n` samples on `s`; `scratch`: the plan's scratch, which holds
    /// a split conv's partial sums or an `_st` kernel's tile statistics
    /// (`BufferPlan::norm_sums` is sized for them).
    pub fn launch(&self, gpu: &Gpu, s: &CudaStream, n: usize, scratch: u64) -> Result<()> {
        let mut p = self.p;
        p.n = n as i32;
        if self.stats {
            if scratch == 0 {
                return Err(Error::Backend(format!(
                    "{}: a conv writing norm statistics launched without the scratch",
                    self.func
                )));
            }
            p.stats = scratch;
        }
        if self.ksplit > 1 {
            if scratch == 0 {
                return Err(Error::Backend(format!(
                    "{}: a split-K conv launched without its scratch",
                    self.func
                )));
            }
            p.ksplit = self.ksplit as i32;
            p.ws = scratch;
        }
        let mut args = self.args(p, self.x);
        let out = [p.do_ as usize, p.ho as usize, p.wo as usize];
        let m = n * out.iter().product::<usize>();
        let func = self.func;
        if self.pointwise {
            let grid = (pointwise_blocks(gpu, m), 1, 1);
            gpu.launch(s, func, grid, (self.threads, self.smem), &mut args)
        } else if self.direct {
            gpu.eltwise(s, func, m * p.cout as usize, &mut args)
        } else if is_c1(func) {
            gpu.launch(s, func, c1_grid(&p), (self.threads, 0), &mut args)
        } else if func == CONVT_UP2_P.name {
            // Persistent: `UP2_BLOCKS_PER_SM` blocks an SM, or one a tile.
            let tiles = m.div_ceil(UP2_TILE_VOXELS);
            let grid = (
                tiles.min(UP2_BLOCKS_PER_SM * gpu.sm_count as usize).max(1) as u32,
                1,
                1,
            );
            gpu.launch(s, func, grid, (self.threads, 0), &mut args)
        } else if let Some(c) = wgk_config(func) {
            // The input's and the weights' tensor maps, for this launch's samples.
            let grid = (
                c.tiles(n, out) as u32,
                c.cout_tiles(p.cout as usize) as u32,
                1,
            );
            let dims = [p.di, p.hi, p.wi].map(|v| v as usize);
            let maps = [
                tile_map(
                    n,
                    dims,
                    p.cin as usize,
                    p.ldi as usize,
                    c.tile,
                    c.stride,
                    c.ck,
                )
                .encode(self.x),
                weight_map(p.cout as usize, p.kpad as usize, c.bn, c.ck).encode(self.w),
            ];
            let mut args: Vec<Arg> = args.into_iter().collect();
            for m in maps {
                let m = m.map_err(|e| Error::Backend(format!("{func}: {e}")))?;
                args.push(Arg::Tma(m));
            }
            gpu.launch(s, func, grid, (self.threads, self.smem), &mut args)
        } else if let Some(c) = halo_config(func) {
            let grid = halo_grid(gpu, c, &p);
            if !c.tma_loads {
                return gpu.launch(s, func, grid, (self.threads, self.smem), &mut args);
            }
            // The input's tensor map, for this launch's samples (`runtime::tma`).
            let dims = [p.di, p.hi, p.wi].map(|v| v as usize);
            let map = halo_map(n, dims, p.cin as usize, p.ldi as usize, c.tile[1])
                .encode(self.x)
                .map_err(|e| Error::Backend(format!("{func}: {e}")))?;
            let mut args: Vec<Arg> = args.into_iter().chain([Arg::Tma(map)]).collect();
            gpu.launch(s, func, grid, (self.threads, self.smem), &mut args)
        } else {
            let grid = (
                m.div_ceil(self.bm as usize) as u32,
                (p.cout as u32).div_ceil(self.bn),
                self.ksplit as u32,
            );
            gpu.launch(s, func, grid, (self.threads, self.smem), &mut args)?;
            if self.ksplit > 1 {
                gpu.eltwise(s, CONV_SPLITK_REDUCE.name, m * p.cout as usize, &mut args)?;
            }
            Ok(())
        }
    }
}
