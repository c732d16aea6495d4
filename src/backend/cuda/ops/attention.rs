//! The fused attention launch (kernels/attention.cu, `attention_fwd`): plain device pointers,
//! row strides and a per-leading-index offset table, so any buffer plan (contiguous heads,
//! strided views, broadcast operands) can drive it. [`offsets`] builds the table for row-major
//! operands of the IR's dims; [`attention_f16`] runs one attention from host data (tests).

use super::super::device::{drv, DevBuf};
use super::super::launch::{Arg, Gpu};
use super::super::CudaBackend;
use crate::backend::cuda::catalogue::ATTENTION_FWD;
use crate::model::ops::{Attention, AttnDims, Dims};
use crate::{Error, Result};
use cudarc::driver::{result as cu, CudaStream};
use half::f16;

/// Most features of q / k (d) and of v (dv) the kernel holds (its `ATT_DMAX`).
pub const MAX_FEATURES: usize = 128;
/// Query rows per block (`ATT_BM`) and threads per block (`ATT_THREADS`).
const ROWS: usize = 64;
const THREADS: u32 = 256;

/// The element type of the bias constant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BiasKind {
    /// No bias (the pointer is ignored).
    None = 0,
    /// fp16.
    F16 = 1,
    /// fp32.
    F32 = 2,
}

/// One attention launch: device pointers, sizes and element strides.
#[derive(Clone, Debug)]
pub struct AttnLaunch {
    /// q, k, v (fp16).
    pub q: u64,
    pub k: u64,
    pub v: u64,
    /// The bias (of `bias_kind`), or 0.
    pub bias: u64,
    pub bias_kind: BiasKind,
    /// The output (fp16).
    pub o: u64,
    /// Device table of `lead * 5` i64 element offsets: q, k, v, bias, output of each leading
    /// index (see [`offsets`]).
    pub offs: u64,
    /// Leading indices (blocks along them).
    pub lead: usize,
    /// Matrix sizes: query rows, key rows, q/k features, v features.
    pub t: usize,
    pub s: usize,
    pub d: usize,
    pub dv: usize,
    /// Row strides (elements) of q, k, v and the output.
    pub ld: [usize; 4],
    /// Bias strides (elements) along T and S (0: broadcast).
    pub bias_ts: [usize; 2],
    pub scale: f32,
}

/// The offset table and bias strides of row-major operands.
#[derive(Clone, Debug, PartialEq)]
pub struct AttnTable {
    /// The attention's shapes.
    pub dims: AttnDims,
    /// `lead * 5` element offsets (q, k, v, bias, output) per leading index.
    pub offs: Vec<i64>,
    /// Bias strides along T and S.
    pub bias_ts: [usize; 2],
}

/// Strides of a value of dims `d` over the broadcast leading dims `lead` (0 where broadcast).
fn lead_strides(d: &[usize], lead: &[usize], inner: usize) -> Vec<usize> {
    let mut st = vec![0usize; lead.len()];
    let mut acc = inner;
    for a in (0..lead.len()).rev() {
        if d[a] != 1 {
            st[a] = acc;
        }
        acc *= d[a];
    }
    st
}

/// The launch table of `op` on contiguous row-major q, k, v, its bias and output.
pub fn offsets(op: &Attention, q: &Dims, k: &Dims, v: &Dims) -> Result<AttnTable> {
    let a = op
        .split(q, k, v)
        .map_err(|e| Error::Graph(format!("Attention: {e}")))?;
    if a.d > MAX_FEATURES || a.dv > MAX_FEATURES || a.d == 0 || a.dv == 0 {
        return Err(Error::Backend(format!(
            "Attention with {} / {} features: the CUDA kernel holds 1 to {MAX_FEATURES}",
            a.d, a.dv
        )));
    }
    let lead = &a.lead;
    let n = lead.len();
    let sq = lead_strides(q.as_slice(), lead, a.t * a.d);
    let sk = lead_strides(k.as_slice(), lead, a.s * a.d);
    let sv = lead_strides(v.as_slice(), lead, a.s * a.dv);
    let so = lead_strides(lead, lead, a.t * a.dv);
    let (sb, bias_ts) = match &op.bias {
        Some(b) => {
            let (bt, bs) = (b.shape[n], b.shape[n + 1]);
            let st = lead_strides(&b.shape, lead, bt * bs);
            (st, [if bt == 1 { 0 } else { bs }, usize::from(bs != 1)])
        }
        None => (vec![0; n], [0, 0]),
    };
    let rows: usize = lead.iter().product();
    let mut offs = Vec::with_capacity(rows * 5);
    for l in 0..rows {
        let mut o = [0usize; 5];
        let mut i = l;
        for ax in (0..n).rev() {
            let x = i % lead[ax];
            i /= lead[ax];
            for (slot, st) in o.iter_mut().zip([&sq, &sk, &sv, &sb, &so]) {
                *slot += x * st[ax];
            }
        }
        offs.extend(o.map(|x| x as i64));
    }
    Ok(AttnTable {
        dims: a,
        offs,
        bias_ts,
    })
}

impl AttnLaunch {
    /// Launches the attention on `s`: one block per (leading index, 64 query rows).
    pub(crate) fn launch(&self, gpu: &Gpu, s: &CudaStream) -> Result<()> {
        if self.d > MAX_FEATURES || self.dv > MAX_FEATURES {
            return Err(Error::Backend(format!(
                "Attention with {} / {} features: the CUDA kernel holds {MAX_FEATURES}",
                self.d, self.dv
            )));
        }
        let blocks = self.lead * self.t.div_ceil(ROWS);
        if blocks == 0 || self.s == 0 {
            return Ok(());
        }
        let blocks = u32::try_from(blocks)
            .map_err(|_| Error::Backend(format!("Attention of {blocks} blocks")))?;
        let i = |x: usize| -> Result<Arg> {
            i32::try_from(x)
                .map(Arg::I32)
                .map_err(|_| Error::Backend(format!("Attention size {x} exceeds i32")))
        };
        let mut args = vec![
            Arg::Ptr(self.q),
            Arg::Ptr(self.k),
            Arg::Ptr(self.v),
            Arg::Ptr(self.bias),
            Arg::Ptr(self.o),
            Arg::Ptr(self.offs),
            i(self.t)?,
            i(self.s)?,
            i(self.d)?,
            i(self.dv)?,
        ];
        for x in self.ld {
            args.push(i(x)?);
        }
        args.push(Arg::I32(self.bias_kind as i32));
        args.push(i(self.bias_ts[0])?);
        args.push(i(self.bias_ts[1])?);
        args.push(Arg::F32(self.scale));
        gpu.launch(
            s,
            ATTENTION_FWD.name,
            (blocks, 1, 1),
            (THREADS, 0),
            &mut args,
        )
    }
}

/// Runs `op` on host f32 q, k, v (converted to fp16; the bias uploaded as fp32 when `bias_f32`,
/// else fp16) on `b`'s device and returns the f32 output: the kernel test's entry point.
pub fn attention_f16(
    b: &CudaBackend,
    op: &Attention,
    q: (&[f32], Dims),
    k: (&[f32], Dims),
    v: (&[f32], Dims),
    bias_f32: bool,
) -> Result<Vec<f32>> {
    let tab = offsets(op, &q.1, &k.1, &v.1)?;
    for (name, (x, d)) in [("q", q), ("k", k), ("v", v)] {
        if x.len() != d.numel() {
            return Err(Error::Backend(format!(
                "Attention: {name} has {} values for {d:?}",
                x.len()
            )));
        }
    }
    let (ctx, s) = (&b.gpu.ctx, &b.gpu.stream);
    let h = |x: &[f32]| x.iter().map(|&y| f16::from_f32(y)).collect::<Vec<f16>>();
    let (dq, dk, dv) = (
        DevBuf::upload(ctx, s, &h(q.0))?,
        DevBuf::upload(ctx, s, &h(k.0))?,
        DevBuf::upload(ctx, s, &h(v.0))?,
    );
    let (bias, kind) = match &op.bias {
        Some(t) if bias_f32 => (Some(DevBuf::upload(ctx, s, &t.data)?), BiasKind::F32),
        Some(t) => (Some(DevBuf::upload(ctx, s, &h(&t.data))?), BiasKind::F16),
        None => (None, BiasKind::None),
    };
    let offs = DevBuf::upload(ctx, s, &tab.offs)?;
    let a = &tab.dims;
    let n_out = a.lead.iter().product::<usize>() * a.t * a.dv;
    let out = DevBuf::new(ctx, n_out * 2)?;
    AttnLaunch {
        q: dq.ptr,
        k: dk.ptr,
        v: dv.ptr,
        bias: bias.as_ref().map_or(0, |x| x.ptr),
        bias_kind: kind,
        o: out.ptr,
        offs: offs.ptr,
        lead: a.lead.iter().product(),
        t: a.t,
        s: a.s,
        d: a.d,
        dv: a.dv,
        ld: [a.d, a.d, a.dv, a.dv],
        bias_ts: tab.bias_ts,
        scale: op.scale,
    }
    .launch(&b.gpu, s)?;
    let mut host = vec![f16::ZERO; n_out];
    // SAFETY: `out` holds n_out halves; synchronised right after, before `host` is read.
    unsafe { cu::memcpy_dtoh_async(&mut host[..], out.ptr, s.cu_stream()) }
        .map_err(drv("download"))?;
    s.synchronize().map_err(drv("running attention"))?;
    Ok(host.iter().map(|x| x.to_f32()).collect())
}
