//! The fused attention launch (kernels/attention.cu, `attention_fwd`): plain device pointers,
//! row strides and a per-leading-index offset table, so any buffer plan (contiguous heads,
//! strided views, broadcast operands) can drive it. [`offsets`] builds the table for row-major
//! operands of the IR's dims; [`attention_f16`] runs one attention from host data (tests).

use super::super::device::{drv, DevBuf};
use super::super::launch::{Arg, Gpu};
use super::super::CudaBackend;
use super::Build;
use crate::backend::cuda::catalogue::{
    ATTENTION_FWD, ATTENTION_WMMA_D16, ATTENTION_WMMA_D32, ATTENTION_WMMA_D64,
};
use crate::backend::cuda::tensor_layout::phys_strides;
use crate::model::graph::Tensor;
use crate::model::ops::{Attention, AttnDims, Dims};
use crate::{Error, Result};
use cudarc::driver::{result as cu, CudaStream};
use half::f16;

/// Most features of q / k (d) and of v (dv) the kernel holds (its `ATT_DMAX`).
pub const MAX_FEATURES: usize = 128;
/// Query rows per block (`ATT_BM`, `AW_BM`) and threads per block of the SIMT kernel
/// (`ATT_THREADS`).
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
    /// The bias and the mask (each of its kind), or 0.
    pub bias: u64,
    pub bias_kind: BiasKind,
    pub mask: u64,
    pub mask_kind: BiasKind,
    /// The output (fp16).
    pub o: u64,
    /// Device table of `lead * 6` i64 element offsets: q, k, v, bias, mask, output of each
    /// leading index (see [`offsets`]).
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
    /// Bias and mask strides (elements) along T and S (0: broadcast).
    pub bias_ts: [usize; 2],
    pub mask_ts: [usize; 2],
    pub scale: f32,
}

/// The offset table, row strides and bias strides of one attention's operands.
#[derive(Clone, Debug, PartialEq)]
pub struct AttnTable {
    /// The attention's shapes.
    pub dims: AttnDims,
    /// `lead * 6` element offsets (q, k, v, bias, mask, output) per leading index.
    pub offs: Vec<i64>,
    /// Row strides (elements) of q, k, v and the output.
    pub ld: [usize; 4],
    /// Bias and mask strides along T and S (both are row-major constants).
    pub bias_ts: [usize; 2],
    pub mask_ts: [usize; 2],
}

/// Element strides of each axis of a row-major value of dims `d`.
fn row_major(d: &[usize]) -> Vec<i64> {
    let mut st = vec![0i64; d.len()];
    let mut acc = 1i64;
    for a in (0..d.len()).rev() {
        st[a] = acc;
        acc *= d[a] as i64;
    }
    st
}

/// Strides of a value of dims `d` (element strides `st`) over the broadcast leading dims
/// (0 where broadcast).
fn lead_strides(d: &[usize], st: &[i64], n: usize) -> Vec<i64> {
    (0..n).map(|a| if d[a] == 1 { 0 } else { st[a] }).collect()
}

/// The launch table of `op` on contiguous row-major q, k, v, its bias and output.
pub fn offsets(op: &Attention, q: &Dims, k: &Dims, v: &Dims) -> Result<AttnTable> {
    let (rq, rk, rv) = (
        row_major(q.as_slice()),
        row_major(k.as_slice()),
        row_major(v.as_slice()),
    );
    let od = split(op, q, k, v)?.output().map_err(Error::Graph)?;
    strided_offsets(
        op,
        [(q, &rq), (k, &rk), (v, &rv)],
        &row_major(od.as_slice()),
    )
}

/// `op`'s shapes, with the kernel's feature limit checked.
fn split(op: &Attention, q: &Dims, k: &Dims, v: &Dims) -> Result<AttnDims> {
    let a = op
        .split(q, k, v)
        .map_err(|e| Error::Graph(format!("Attention: {e}")))?;
    if a.d > MAX_FEATURES || a.dv > MAX_FEATURES || a.d == 0 || a.dv == 0 {
        return Err(Error::Backend(format!(
            "Attention with {} / {} features: the CUDA kernel holds 1 to {MAX_FEATURES}",
            a.d, a.dv
        )));
    }
    Ok(a)
}

/// The launch table of `op` on q, k, v of the given dims and element strides per axis
/// (`o_st`: the output's, dims from the op). The kernel reads features contiguous and rows
/// `ld` apart: an operand whose last axis has a stride other than 1 (a rank-5 NDHWC value
/// with C > 1 and more than one spatial element) is refused.
pub fn strided_offsets(
    op: &Attention,
    [(q, sq), (k, sk), (v, sv)]: [(&Dims, &[i64]); 3],
    o_st: &[i64],
) -> Result<AttnTable> {
    let a = split(op, q, k, v)?;
    let od = a.output().map_err(Error::Graph)?;
    let r = q.rank();
    let ops = [
        (q, sq, "q"),
        (k, sk, "k"),
        (v, sv, "v"),
        (&od, o_st, "output"),
    ];
    let mut ld = [0usize; 4];
    for (slot, (d, st, name)) in ld.iter_mut().zip(ops) {
        if st.len() != r {
            return Err(Error::Backend(format!(
                "Attention {name}: {} strides for {d:?}",
                st.len()
            )));
        }
        if (st[r - 1] != 1 && d[r - 1] != 1) || st[r - 2] < 0 {
            return Err(Error::Backend(format!(
                "Attention {name} {d:?} with element strides {st:?}: the CUDA kernel needs its features contiguous (rank-5 operands are stored NDHWC)"
            )));
        }
        *slot = if d[r - 2] == 1 {
            d[r - 1]
        } else {
            st[r - 2] as usize
        };
    }
    let lead = &a.lead;
    let n = lead.len();
    let ls: Vec<Vec<i64>> = ops
        .iter()
        .map(|(d, st, _)| lead_strides(d.as_slice(), st, n))
        .collect();
    // A term's strides over the leading dims, and along T and S.
    let term = |b: &Option<Tensor>| match b {
        Some(b) => {
            let (bt, bs) = (b.shape[n], b.shape[n + 1]);
            let st = lead_strides(&b.shape, &row_major(&b.shape), n);
            (st, [if bt == 1 { 0 } else { bs }, usize::from(bs != 1)])
        }
        None => (vec![0; n], [0, 0]),
    };
    let ((sb, bias_ts), (sm, mask_ts)) = (term(&op.bias), term(&op.mask));
    let rows: usize = lead.iter().product();
    let mut offs = Vec::with_capacity(rows * 6);
    for l in 0..rows {
        let mut o = [0i64; 6];
        let mut i = l;
        for ax in (0..n).rev() {
            let x = (i % lead[ax]) as i64;
            i /= lead[ax];
            for (slot, st) in o.iter_mut().zip([&ls[0], &ls[1], &ls[2], &sb, &sm, &ls[3]]) {
                *slot += x * st[ax];
            }
        }
        offs.extend(o);
    }
    Ok(AttnTable {
        dims: a,
        offs,
        ld,
        bias_ts,
        mask_ts,
    })
}

/// The table of tensor-path node `op` on its planned layouts (`tensor_layout`: rank 5 NDHWC,
/// other ranks row-major): what the buffer plan counts and the launch list uploads.
pub fn node_table(op: &Attention, dims: &[Dims]) -> Result<AttnTable> {
    let [q, k, v] = dims else {
        return Err(Error::Graph(format!(
            "Attention needs 3 inputs, got {}",
            dims.len()
        )));
    };
    let od = op.output_dims(q, k, v).map_err(Error::Graph)?;
    let st = |d: &Dims| phys_strides(d);
    let (sq, sk, sv) = (st(q), st(k), st(v));
    strided_offsets(op, [(q, &sq), (k, &sk), (v, &sv)], &st(&od))
}

/// The bias and mask of `op` as uploaded, in that order: fp32, so masks of -100 plus small
/// relative-position biases keep every bit the CPU reference sees (fp16 would round 0.01 next
/// to -100 away).
pub fn terms_f32(op: &Attention) -> [Option<&[f32]>; 2] {
    [&op.bias, &op.mask].map(|b| b.as_ref().map(|b| b.data.as_slice()))
}

/// The launch of tensor-path node `op` reading q, k, v at `xs` and writing `y`, its table
/// and bias uploaded through `b` (in the order of the buffer plan: table, then bias).
pub(crate) fn build(
    b: &mut Build,
    op: &Attention,
    dims: &[Dims],
    xs: &[u64],
    y: u64,
) -> Result<AttnLaunch> {
    let tab = node_table(op, dims)?;
    let &[q, k, v] = xs else {
        return Err(Error::Graph(format!(
            "Attention needs 3 inputs, got {}",
            xs.len()
        )));
    };
    let offs = b.upload_const(&tab.offs)?;
    let mut up = [(0, BiasKind::None); 2];
    for (slot, x) in up.iter_mut().zip(terms_f32(op)) {
        if let Some(x) = x {
            *slot = (b.upload_const(x)?, BiasKind::F32);
        }
    }
    let [(bias, bias_kind), (mask, mask_kind)] = up;
    let a = &tab.dims;
    Ok(AttnLaunch {
        q,
        k,
        v,
        bias,
        bias_kind,
        mask,
        mask_kind,
        o: y,
        offs,
        lead: a.lead.iter().product(),
        t: a.t,
        s: a.s,
        d: a.d,
        dv: a.dv,
        ld: tab.ld,
        bias_ts: tab.bias_ts,
        mask_ts: tab.mask_ts,
        scale: op.scale,
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
        // The tensor-core kernel for its feature sizes, the SIMT one above them.
        let (kernel, threads) = match self.d.max(self.dv) {
            0..=16 => (ATTENTION_WMMA_D16, 128),
            17..=32 => (ATTENTION_WMMA_D32, 128),
            33..=64 => (ATTENTION_WMMA_D64, 128),
            _ => (ATTENTION_FWD, THREADS),
        };
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
            Arg::Ptr(self.mask),
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
        for (kind, ts) in [
            (self.bias_kind, self.bias_ts),
            (self.mask_kind, self.mask_ts),
        ] {
            args.push(Arg::I32(kind as i32));
            args.push(i(ts[0])?);
            args.push(i(ts[1])?);
        }
        args.push(Arg::F32(self.scale));
        gpu.launch(s, kernel.name, (blocks, 1, 1), (threads, 0), &mut args)
    }
}

/// Runs `op` on host f32 q, k, v (converted to fp16; the bias and mask uploaded as fp32 when
/// `bias_f32`, else fp16) on `b`'s device and returns the f32 output: the kernel test's entry point.
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
    let term = |b: &Option<Tensor>| -> Result<(Option<DevBuf>, BiasKind)> {
        Ok(match b {
            Some(t) if bias_f32 => (Some(DevBuf::upload(ctx, s, &t.data)?), BiasKind::F32),
            Some(t) => (Some(DevBuf::upload(ctx, s, &h(&t.data))?), BiasKind::F16),
            None => (None, BiasKind::None),
        })
    };
    let ((bias, kind), (mask, mask_kind)) = (term(&op.bias)?, term(&op.mask)?);
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
        mask: mask.as_ref().map_or(0, |x| x.ptr),
        mask_kind,
        o: out.ptr,
        offs: offs.ptr,
        lead: a.lead.iter().product(),
        t: a.t,
        s: a.s,
        d: a.d,
        dv: a.dv,
        ld: tab.ld,
        bias_ts: tab.bias_ts,
        mask_ts: tab.mask_ts,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &[usize]) -> Dims {
        Dims::new(s).unwrap()
    }

    #[test]
    fn table_of_broadcast_and_strided_operands() {
        let op = Attention {
            scale: 1.0,
            bias: Some(Tensor::new(vec![1, 2, 1, 5], vec![0.0; 10])),
            mask: Some(Tensor::new(vec![2, 1, 3, 5], vec![0.0; 30])),
        };
        // q [2, 2, 3, 4], k shared over heads [2, 1, 5, 4], v shared over batch [1, 2, 5, 6].
        let t = offsets(&op, &d(&[2, 2, 3, 4]), &d(&[2, 1, 5, 4]), &d(&[1, 2, 5, 6])).unwrap();
        assert_eq!(t.ld, [4, 4, 6, 6]);
        assert_eq!(t.bias_ts, [0, 1]);
        assert_eq!(t.mask_ts, [5, 1]);
        #[rustfmt::skip]
        let want = vec![
            0, 0, 0, 0, 0, 0,
            12, 0, 30, 5, 0, 18,
            24, 20, 0, 0, 15, 36,
            36, 20, 30, 5, 15, 54,
        ];
        assert_eq!(t.offs, want);
        // Rank 5 with C = 1 is row-major; with C = 2 the features are 2 apart: refused.
        let plain = Attention {
            scale: 1.0,
            bias: None,
            mask: None,
        };
        let x = d(&[1, 1, 2, 3, 4]);
        assert_eq!(node_table(&plain, &[x, x, x]).unwrap().ld, [4; 4]);
        let y = d(&[1, 2, 1, 3, 4]);
        let e = node_table(&plain, &[y, y, y]).unwrap_err().to_string();
        assert!(e.contains("features contiguous"), "{e}");
    }
}
