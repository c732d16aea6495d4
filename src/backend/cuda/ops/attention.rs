//! The fused attention launch (kernels/attention.cu, `attention_fwd`): plain device pointers,
//! row strides and a per-leading-index offset table, so any buffer plan (contiguous heads,
//! strided views, broadcast operands) can drive it. `host::attention_table` builds the table; `attention_f16` runs one attention from host data (tests).

use super::Build;
use crate::backend::cuda::host::attention_table::{
    node_table, offsets, terms, uploaded_f32, MAX_FEATURES,
};
use crate::backend::cuda::host::catalogue::{
    ATTENTION_FWD, ATTENTION_MMA_D16, ATTENTION_MMA_D32, ATTENTION_MMA_D64,
};
use crate::backend::cuda::host::tensor_layout::Stored;
use crate::backend::cuda::runtime::device::{drv, DevBuf};
use crate::backend::cuda::runtime::launch::{Arg, Gpu};
use crate::model::graph::Tensor;
use crate::model::ops::{Attention, Dims};
use crate::{Error, Result};
use cudarc::driver::{result as cu, CudaStream};
use half::f16;

/// Query rows per block (`ATT_BM`, `AM_BM`) and threads per block of the SIMT kernel
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

/// The launch of tensor-path node `op` reading q, k, v at `xs` and writing `y`, its table
/// and bias uploaded through `b` (in the order of the buffer plan: table, then bias).
pub(crate) fn build(
    b: &mut Build,
    op: &Attention,
    ins: &[Stored],
    out_ndhwc: bool,
    xs: &[u64],
    y: u64,
) -> Result<AttnLaunch> {
    let tab = node_table(op, ins, out_ndhwc)?;
    let &[q, k, v] = xs else {
        return Err(Error::Graph(format!(
            "Attention needs 3 inputs, got {}",
            xs.len()
        )));
    };
    let offs = b.upload_const(&tab.offs)?;
    let mut up = [(0, BiasKind::None); 2];
    for (slot, x) in up.iter_mut().zip(terms(op)) {
        if let Some(x) = x {
            *slot = (b.upload_const(&uploaded_f32(x))?, BiasKind::F32);
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
        // The tensor-core kernel for its feature sizes (mma.sync m16n8k16: sm_80+), the SIMT
        // one above them and on older GPUs.
        let (kernel, threads) = match self.d.max(self.dv) {
            _ if gpu.cc.0 < 8 => (ATTENTION_FWD, THREADS),
            0..=16 => (ATTENTION_MMA_D16, 128),
            17..=32 => (ATTENTION_MMA_D32, 128),
            33..=64 => (ATTENTION_MMA_D64, 128),
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
/// `bias_f32`, else fp16) on `gpu` and returns the f32 output: the kernel test's entry point
/// (`CudaBackend::attention_f16`).
pub(crate) fn attention_f16(
    gpu: &Gpu,
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
    let (ctx, s) = (&gpu.ctx, &gpu.stream);
    let h = |x: &[f32]| x.iter().map(|&y| f16::from_f32(y)).collect::<Vec<f16>>();
    let (dq, dk, dv) = (
        DevBuf::upload(ctx, s, &h(q.0))?,
        DevBuf::upload(ctx, s, &h(k.0))?,
        DevBuf::upload(ctx, s, &h(v.0))?,
    );
    let term = |b: &Option<Tensor>| -> Result<(Option<DevBuf>, BiasKind)> {
        Ok(match b {
            Some(t) if bias_f32 => (
                Some(DevBuf::upload(ctx, s, &uploaded_f32(t))?),
                BiasKind::F32,
            ),
            Some(t) => (
                Some(DevBuf::upload(ctx, s, &h(&uploaded_f32(t)))?),
                BiasKind::F16,
            ),
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
    .launch(gpu, s)?;
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
    use crate::backend::cuda::host::attention_table::uploaded_len;

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
        // Rows of 5 keys are uploaded 6 apart (even, for the kernel's pair loads).
        assert_eq!(t.mask_ts, [6, 1]);
        #[rustfmt::skip]
        let want = vec![
            0, 0, 0, 0, 0, 0,
            12, 0, 30, 6, 0, 18,
            24, 20, 0, 0, 18, 36,
            36, 20, 30, 6, 18, 54,
        ];
        assert_eq!(t.offs, want);
        let mask = op.mask.as_ref().unwrap();
        assert_eq!(uploaded_len(mask), 36);
        let m = Tensor::new(vec![1, 2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(
            &*uploaded_f32(&m),
            &[1.0, 2.0, 3.0, 0.0, 4.0, 5.0, 6.0, 0.0]
        );
        let even = Tensor::new(vec![1, 2], vec![1.0, 2.0]);
        assert_eq!(&*uploaded_f32(&even), &[1.0, 2.0]);
        // Rank 5 NDHWC with C = 1 is row-major; with C = 2 the features are 2 apart: refused;
        // the same value stored row-major has them contiguous.
        let plain = Attention {
            scale: 1.0,
            bias: None,
            mask: None,
        };
        let x = Stored::ndhwc(d(&[1, 1, 2, 3, 4]));
        assert_eq!(node_table(&plain, &[x, x, x], true).unwrap().ld, [4; 4]);
        let y = Stored::ndhwc(d(&[1, 2, 1, 3, 4]));
        let e = node_table(&plain, &[y, y, y], true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("features contiguous"), "{e}");
        let r = Stored::row_major(y.dims);
        assert_eq!(node_table(&plain, &[r, r, r], false).unwrap().ld, [4; 4]);
    }
}
