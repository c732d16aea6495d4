//! The tensor path: nodes on activations of any rank (transformer blocks), planned from the
//! dims at the plan's batch and the layouts of `tensor_layout` (NDHWC where a rank-5 kernel
//! touches a value, else row-major). Each step covers every window of the planned batch in one
//! launch, whatever the count of a call: a short last batch computes stale windows too, whose
//! results nothing reads (the batch rewrite freed only graphs whose every value keeps its
//! windows apart along one batch axis). Data
//! movement (Reshape, Transpose, Slice, Gather, Concat) is one strided copy each (one per
//! input for Concat), binaries one broadcast launch, Softmax / LayerNorm one launch over
//! (outer, axis, inner), MatMul / Linear one batched tensor-core GEMM. One-input elementwise
//! ops reuse the rank-5 kernels (input and output share the layout).

use super::eltwise::Elt;
use super::math::{code, MathStep};
use super::{Build, NodeIo, Step};
use crate::backend::cuda::abi::{Act, GemmParams, NdParams};
use crate::backend::cuda::host::catalogue::{
    Kernel, GEMM_WMMA, GEMM_WMMA_V8, LAYERNORM_ROWS, LAYERNORM_STRIDED, ND_BINARY, ND_BINARY_CONST,
    ND_COPY, ND_COPY_V8, SOFTMAX_ROWS, SOFTMAX_STRIDED,
};
use crate::backend::cuda::host::tensor_layout::{merge_axes, Axis, Stored};
use crate::backend::cuda::runtime::launch::{Arg, Gpu};
use crate::model::graph::{Op, Tensor};
use crate::model::ops::{gather_dims, norm_axis, Dims};
use crate::{Error, Result};
use cudarc::driver::CudaStream;

/// One tensor-path launch. Pointers are final; sizes are for the plan's whole batch.
pub(crate) enum TensorStep {
    Copy {
        x: u64,
        y: u64,
        p: NdParams,
    },
    Binary {
        a: u64,
        b: u64,
        y: u64,
        p: NdParams,
        /// b is an f32 constant (AddConst / MulConst), else an fp16 activation.
        konst: bool,
    },
    /// Over `len` elements `inner` apart, `outer x inner` times.
    Softmax {
        x: u64,
        y: u64,
        outer: usize,
        len: usize,
        inner: usize,
    },
    LayerNorm {
        x: u64,
        y: u64,
        scale: u64,
        /// 0: none.
        bias: u64,
        outer: usize,
        len: usize,
        inner: usize,
        /// C of a rank-5 row normalised over C, D, H, W (scale index remapped), else 0.
        remap: usize,
        eps: f32,
    },
    Gemm {
        a: u64,
        w: u64,
        /// f32 [N] or 0.
        bias: u64,
        y: u64,
        p: GemmParams,
    },
    /// Fused attention (`ops::attention`).
    Attention(super::attention::AttnLaunch),
    /// A one-input elementwise op run by the rank-5 kernels over the whole buffer (its length
    /// already counts every window), launched once.
    Flat(Box<Step>),
}

/// The launches of tensor-path node `op` (constants uploaded through `b`, in the order of the
/// buffer plan's `node_consts`).
pub(crate) fn build(b: &mut Build, op: &Op, io: &NodeIo) -> Result<Vec<Step>> {
    let err = |m: String| Error::Graph(format!("node {} ({}): {m}", io.name, op.name()));
    let (xv, ov) = (io.st[0], io.ost);
    let (x, o) = (xv.dims, ov.dims);
    let (xs, os) = (xv.strides(), ov.strides());
    let t = |s: TensorStep| vec![Step::Tensor(s)];
    Ok(match op {
        Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Slice(_)
        | Op::Gather { .. }
        | Op::Concat { .. } => movement(op, io)?,
        Op::Add | Op::Mul | Op::Sub | Op::Div | Op::Max | Op::Min | Op::Pow => {
            let (sa, sb) = (bcast(&xv, &o), bcast(&io.st[1], &o));
            let axes = ordered(&ov, |a| [sa[a], sb[a], os[a]]);
            let op_code = code(op).ok_or_else(|| err("no binary code".into()))?;
            t(TensorStep::Binary {
                a: io.x,
                b: io.xs[1],
                y: io.y,
                p: nd3(&axes, op_code)?,
                konst: false,
            })
        }
        Op::AddConst(k) | Op::MulConst(k) => {
            let ks = const_strides(k, &o).ok_or_else(|| {
                err(format!(
                    "constant {:?} does not broadcast to {o:?}",
                    k.shape
                ))
            })?;
            let kp = b.upload_const(&k.data)?;
            let axes = ordered(&ov, |a| [xs[a], ks[a], os[a]]);
            let op_code = if matches!(op, Op::AddConst(_)) { 0 } else { 1 };
            t(TensorStep::Binary {
                a: io.x,
                b: kp,
                y: io.y,
                p: nd3(&axes, op_code)?,
                konst: true,
            })
        }
        Op::Softmax { axis } => {
            let (outer, len, inner) = axis_run(&ov, *axis, axis + 1)
                .ok_or_else(|| err(format!("axis {axis} of {o:?}")))?;
            t(TensorStep::Softmax {
                x: io.x,
                y: io.y,
                outer,
                len: fits_i32(len, &err)?,
                inner,
            })
        }
        Op::LayerNorm(l) => {
            let a = norm_axis(l.axis, x.rank()).map_err(err)?;
            let (outer, len, inner, remap) = layer_norm_rows(&xv, a).map_err(err)?;
            let scale = b.upload_const(&l.scale.data)?;
            let bias = match &l.bias {
                Some(t) => b.upload_const(&t.data)?,
                None => 0,
            };
            t(TensorStep::LayerNorm {
                x: io.x,
                y: io.y,
                scale,
                bias,
                outer,
                len: fits_i32(len, &err)?,
                inner,
                remap,
                eps: l.eps,
            })
        }
        Op::MatMul => {
            let bv = io.st[1];
            let p = gemm_params(
                (x.as_slice(), &xs),
                (bv.dims.as_slice(), &bv.strides()),
                (o.as_slice(), &os),
            )
            .map_err(err)?;
            t(TensorStep::Gemm {
                a: io.x,
                w: io.xs[1],
                bias: 0,
                y: io.y,
                p,
            })
        }
        Op::Linear(l) => {
            let (k, n) = l.kn();
            let halves: Vec<half::f16> = l
                .weight
                .data
                .iter()
                .map(|&v| half::f16::from_f32(v))
                .collect();
            let w = b.upload_const(&halves)?;
            let bias = match &l.bias {
                Some(t) => b.upload_const(&t.data)?,
                None => 0,
            };
            let p = gemm_params(
                (x.as_slice(), &xs),
                (&[k, n], &[n as i64, 1]),
                (o.as_slice(), &os),
            )
            .map_err(err)?;
            t(TensorStep::Gemm {
                a: io.x,
                w,
                bias,
                y: io.y,
                p,
            })
        }
        Op::Attention(a) => t(TensorStep::Attention(super::attention::build(
            b,
            a,
            &io.st,
            io.ost.ndhwc,
            &io.xs,
            io.y,
        )?)),
        Op::Identity => flat(Step::Elt(Elt::Copy {
            x: io.x,
            y: io.y,
            len: o.numel(),
        })),
        Op::Pointwise(f) => flat(Step::Math(MathStep::Pointwise {
            x: io.x,
            y: io.y,
            len: o.numel(),
            code: f.code(),
        })),
        _ if op.is_elementwise_unary() => {
            let act = Act::of(op).ok_or_else(|| err("not an activation".into()))?;
            let slope = b.act_slope(&act)?;
            flat(Step::Elt(Elt::Act {
                x: io.x,
                y: io.y,
                len: o.numel(),
                c: 1,
                act,
                slope,
            }))
        }
        _ => {
            return Err(err(format!(
                "not implemented on {:?} by the CUDA backend",
                io.st.iter().map(|s| s.dims).collect::<Vec<_>>()
            )))
        }
    })
}

/// The strided copies of the data-movement ops (one per input for Concat; none for a Reshape
/// that aliases its input).
fn movement(op: &Op, io: &NodeIo) -> Result<Vec<Step>> {
    let err = |m: String| Error::Graph(format!("node {} ({}): {m}", io.name, op.name()));
    let (xv, ov) = (io.st[0], io.ost);
    let x = xv.dims;
    let (xs, os) = (xv.strides(), ov.strides());
    let copy = |p: NdParams| {
        vec![Step::Tensor(TensorStep::Copy {
            x: io.x,
            y: io.y,
            p,
        })]
    };
    Ok(match op {
        // The buffer plan gave an aliasing Reshape / Transpose its input's buffer: nothing to
        // do (two distinct buffers live at one launch never share an offset).
        Op::Reshape { .. } | Op::Transpose { .. } if io.y == io.x => vec![],
        Op::Reshape { .. } => copy(reshape_params(&xv, &ov)?),
        Op::Transpose { perm } => {
            let axes = ordered(&ov, |a| [xs[perm[a]], os[a]]);
            copy(nd(&axes, 0, 0)?)
        }
        Op::Slice(s) => {
            let r = s.resolve(&x).map_err(err)?;
            let step = |a: usize| if a == r.axis { r.step as i64 } else { 1 };
            let axes = ordered(&ov, |a| [xs[a] * step(a), os[a]]);
            copy(nd(&axes, r.start as i64 * xs[r.axis], 0)?)
        }
        Op::Gather { axis, index } => {
            let (ax, i, _) = gather_dims(&x, *axis, *index).map_err(err)?;
            let src = |a: usize| if a < ax { a } else { a + 1 };
            let axes = ordered(&ov, |a| [xs.get(src(a)).copied().unwrap_or(0), os[a]]);
            copy(nd(&axes, i as i64 * xs[ax], 0)?)
        }
        Op::Concat { axis } => {
            let mut steps = Vec::new();
            let mut at = 0usize;
            for (d, &xp) in io.st.iter().zip(&io.xs) {
                let ds = d.strides();
                let axes = ordered(d, |a| [ds[a], os[a]]);
                steps.push(Step::Tensor(TensorStep::Copy {
                    x: xp,
                    y: io.y,
                    p: nd(&axes, 0, at as i64 * os[*axis])?,
                }));
                at += d.dims[*axis];
            }
            steps
        }
        _ => return Err(err("not a data-movement op".into())),
    })
}

fn flat(s: Step) -> Vec<Step> {
    vec![Step::Tensor(TensorStep::Flat(Box::new(s)))]
}

fn fits_i32(v: usize, err: &dyn Fn(String) -> Error) -> Result<usize> {
    if v > i32::MAX as usize {
        return Err(err(format!("an axis of {v} elements is too long")));
    }
    Ok(v)
}

/// The axes of `o` in its physical order (outermost first, so the innermost written elements
/// are consecutive), each with the strides `f(axis)`.
fn ordered<const K: usize>(o: &Stored, f: impl Fn(usize) -> [i64; K]) -> Vec<Axis<K>> {
    o.order()
        .into_iter()
        .map(|a| Axis {
            size: o.dims[a],
            strides: f(a),
        })
        .collect()
}

/// Copy parameters over `axes` (strides: x, y), merged.
fn nd(axes: &[Axis<2>], xoff: i64, yoff: i64) -> Result<NdParams> {
    let m = merge_axes(axes);
    let mut p = NdParams {
        total: m.iter().map(|a| a.size as i64).product(),
        rx: m.len() as i32,
        xoff,
        yoff,
        ..Default::default()
    };
    for (k, a) in m.iter().enumerate() {
        p.xd[k] = a.size as i64;
        p.xs[k] = a.strides[0];
        p.ys[k] = a.strides[1];
    }
    Ok(p)
}

/// Binary parameters over `axes` (strides: a, b, y), merged.
fn nd3(axes: &[Axis<3>], op: i32) -> Result<NdParams> {
    let m = merge_axes(axes);
    let mut p = NdParams {
        total: m.iter().map(|a| a.size as i64).product(),
        rx: m.len() as i32,
        op,
        ..Default::default()
    };
    for (k, a) in m.iter().enumerate() {
        p.xd[k] = a.size as i64;
        p.xs[k] = a.strides[0];
        p.bs[k] = a.strides[1];
        p.ys[k] = a.strides[2];
    }
    Ok(p)
}

/// A Reshape between layouts: both sides decompose the shared row-major logical index over
/// their own dims (merged where contiguous).
fn reshape_params(x: &Stored, o: &Stored) -> Result<NdParams> {
    let side = |v: &Stored| {
        let (d, s) = (v.dims, v.strides());
        let axes: Vec<Axis<1>> = (0..d.rank())
            .map(|a| Axis {
                size: d[a],
                strides: [s[a]],
            })
            .collect();
        merge_axes(&axes)
    };
    let (mx, my) = (side(x), side(o));
    let mut p = NdParams {
        total: x.dims.numel() as i64,
        rx: mx.len() as i32,
        ry: my.len() as i32,
        ..Default::default()
    };
    for (k, a) in mx.iter().enumerate() {
        p.xd[k] = a.size as i64;
        p.xs[k] = a.strides[0];
    }
    for (k, a) in my.iter().enumerate() {
        p.yd[k] = a.size as i64;
        p.ys[k] = a.strides[0];
    }
    Ok(p)
}

/// Strides of operand `d` read at the positions of output `o` (numpy: right-aligned, 0 where
/// broadcast), per axis of `o`.
fn bcast(v: &Stored, o: &Dims) -> Vec<i64> {
    let (d, s) = (v.dims, v.strides());
    let lead = o.rank() - d.rank().min(o.rank());
    (0..o.rank())
        .map(|a| match a.checked_sub(lead) {
            Some(k) if k < d.rank() && d[k] != 1 => s[k],
            _ => 0,
        })
        .collect()
}

/// Row-major strides of a constant of the output's rank read at the output's positions (0 on
/// its size-1 axes); None when it does not broadcast.
fn const_strides(t: &Tensor, o: &Dims) -> Option<Vec<i64>> {
    if t.shape.len() != o.rank() || t.shape.iter().product::<usize>() != t.data.len() {
        return None;
    }
    let mut st = vec![0i64; o.rank()];
    let mut acc = 1i64;
    for a in (0..o.rank()).rev() {
        match t.shape[a] {
            1 => {}
            s if s == o[a] => st[a] = acc,
            _ => return None,
        }
        acc *= t.shape[a] as i64;
    }
    Some(st)
}

/// (outer, len, inner) of logical axes `lo..hi` of `d` when they are consecutive in its
/// physical order: `len` elements `inner` apart, in `outer` blocks.
pub(crate) fn axis_run(v: &Stored, lo: usize, hi: usize) -> Option<(usize, usize, usize)> {
    let (d, order) = (v.dims, v.order());
    let p0 = order.iter().position(|&a| a == lo)?;
    let want: Vec<usize> = (lo..hi).collect();
    if order.get(p0..p0 + want.len())? != want.as_slice() {
        return None;
    }
    let size = |r: &[usize]| r.iter().map(|&a| d[a]).product::<usize>();
    Some((
        size(&order[..p0]),
        size(&order[p0..p0 + want.len()]),
        size(&order[p0 + want.len()..]),
    ))
}

/// LayerNorm over axes `a..` of `x`: (outer, len, inner, remap). A rank-5 value normalised from
/// C (or from N when N is 1) has NDHWC rows whose scale index is remapped by C.
fn layer_norm_rows(
    xv: &Stored,
    a: usize,
) -> std::result::Result<(usize, usize, usize, usize), String> {
    let x = xv.dims;
    if let Some(r) = axis_run(xv, a, x.rank()) {
        return Ok((r.0, r.1, r.2, 0));
    }
    if xv.ndhwc && x.rank() == 5 && (a == 1 || x[0] == 1) {
        let rows = if a == 1 { x[0] } else { 1 };
        return Ok((rows, x.numel() / rows, 1, x[1]));
    }
    Err(format!(
        "LayerNorm from axis {a} of {x:?} (a rank-5 value normalised over N)"
    ))
}

/// GEMM parameters of `a @ b = y` (each: logical dims, element strides; rank >= 1, a rank-1
/// operand taken as one row / one column as numpy does): batch dims broadcast, merged, and
/// folded into M where a and y are row-contiguous across them and b is broadcast.
fn gemm_params(
    a: (&[usize], &[i64]),
    b: (&[usize], &[i64]),
    y: (&[usize], &[i64]),
) -> std::result::Result<GemmParams, String> {
    let mat = |(d, s): (&[usize], &[i64]), row: bool| -> (Vec<usize>, Vec<i64>) {
        if d.len() >= 2 {
            (d.to_vec(), s.to_vec())
        } else if row {
            (vec![1, d[0]], vec![0, s[0]])
        } else {
            (vec![d[0], 1], vec![s[0], 0])
        }
    };
    let (ad, as_) = mat(a, true);
    let (bd, bs) = mat(b, false);
    let (yd, ys) = if y.0.len() >= 2 {
        (y.0.to_vec(), y.1.to_vec())
    } else if a.0.len() == 1 {
        (vec![1, y.0[0]], vec![0, y.1[0]])
    } else {
        (vec![y.0[0], 1], vec![y.1[0], 0])
    };
    let (ra, rb, ry) = (ad.len(), bd.len(), yd.len());
    let (m, k, n) = (ad[ra - 2], ad[ra - 1], bd[rb - 1]);
    if bd[rb - 2] != k || yd[ry - 2] != m || yd[ry - 1] != n {
        return Err(format!("GEMM of {ad:?} and {bd:?} into {yd:?}"));
    }
    let nbo = ry - 2;
    let bstride = |d: &[usize], s: &[i64], t: usize| {
        let lead = nbo - (d.len() - 2).min(nbo);
        match t.checked_sub(lead) {
            Some(q) if d[q] != 1 => s[q],
            _ => 0,
        }
    };
    let axes: Vec<Axis<3>> = (0..nbo)
        .map(|t| Axis {
            size: yd[t],
            strides: [bstride(&ad, &as_, t), bstride(&bd, &bs, t), ys[t]],
        })
        .collect();
    let mut batch = merge_axes(&axes);
    let mut p = GemmParams {
        m: m as i64,
        n: n as i64,
        k: k as i64,
        a_sm: as_[ra - 2],
        a_sk: as_[ra - 1],
        b_sk: bs[rb - 2],
        b_sn: bs[rb - 1],
        y_sm: ys[ry - 2],
        y_sn: ys[ry - 1],
        ..Default::default()
    };
    while let Some(l) = batch.last().copied() {
        let fold = l.size == 1
            || (l.strides[1] == 0 && l.strides[0] == p.m * p.a_sm && l.strides[2] == p.m * p.y_sm);
        if !fold {
            break;
        }
        p.m *= l.size as i64;
        batch.pop();
    }
    if batch.len() > 6 {
        return Err(format!("{} batch dims", batch.len()));
    }
    p.nb = batch.len() as i32;
    p.nbatch = batch.iter().map(|l| l.size as i64).product();
    for (i, l) in batch.iter().enumerate() {
        p.bd[i] = l.size as i64;
        p.abs[i] = l.strides[0];
        p.bbs[i] = l.strides[1];
        p.ybs[i] = l.strides[2];
    }
    Ok(p)
}

impl TensorStep {
    /// Launches the step on `s` for the plan's whole batch (see the module doc).
    pub fn launch(&self, gpu: &Gpu, s: &CudaStream) -> Result<()> {
        let nd_launch = |k: Kernel, a: u64, b: Option<u64>, y: u64, p: &NdParams| {
            let mut args = vec![Arg::Ptr(a)];
            args.extend(b.map(Arg::Ptr));
            args.extend([Arg::Ptr(y), Arg::Nd(*p)]);
            gpu.eltwise(s, k.name, p.total as usize, &mut args)
        };
        match self {
            TensorStep::Copy { x, y, p } => match p.vec8(*x, *y) {
                Some(v) => nd_launch(ND_COPY_V8, *x, None, *y, &v),
                None => nd_launch(ND_COPY, *x, None, *y, p),
            },
            TensorStep::Binary { a, b, y, p, konst } => {
                let k = if *konst { ND_BINARY_CONST } else { ND_BINARY };
                nd_launch(k, *a, Some(*b), *y, p)
            }
            TensorStep::Softmax {
                x,
                y,
                outer,
                len,
                inner,
            } => {
                let mut args = vec![Arg::Ptr(*x), Arg::Ptr(*y)];
                if *inner == 1 {
                    args.extend([Arg::I64(*outer as i64), Arg::I32(*len as i32)]);
                    gpu.eltwise(s, SOFTMAX_ROWS.name, outer * 32, &mut args)
                } else {
                    args.extend([
                        Arg::I64(*outer as i64),
                        Arg::I32(*len as i32),
                        Arg::I64(*inner as i64),
                    ]);
                    gpu.eltwise(s, SOFTMAX_STRIDED.name, outer * inner, &mut args)
                }
            }
            TensorStep::LayerNorm {
                x,
                y,
                scale,
                bias,
                outer,
                len,
                inner,
                remap,
                eps,
            } => {
                let mut args = vec![
                    Arg::Ptr(*x),
                    Arg::Ptr(*y),
                    Arg::Ptr(*scale),
                    Arg::Ptr(*bias),
                    Arg::I64(*outer as i64),
                    Arg::I32(*len as i32),
                ];
                if *inner == 1 {
                    args.extend([Arg::I32(*remap as i32), Arg::F32(*eps)]);
                    gpu.eltwise(s, LAYERNORM_ROWS.name, outer * 32, &mut args)
                } else {
                    args.extend([Arg::I64(*inner as i64), Arg::F32(*eps)]);
                    gpu.eltwise(s, LAYERNORM_STRIDED.name, outer * inner, &mut args)
                }
            }
            TensorStep::Gemm { a, w, bias, y, p } => {
                let (kernel, bm, threads) = if p.vec8(*a, *w) {
                    (GEMM_WMMA_V8, 128, 256)
                } else {
                    (GEMM_WMMA, 64, 128)
                };
                let gx = (p.m as u64).div_ceil(bm);
                let gy = (p.n as u64).div_ceil(64);
                if gx > i32::MAX as u64 || gy > 65535 {
                    return Err(Error::Backend(format!(
                        "GEMM of {} x {} outputs is too large for one launch",
                        p.m, p.n
                    )));
                }
                let gz = p.nbatch.clamp(1, 65535) as u32;
                gpu.launch(
                    s,
                    kernel.name,
                    (gx as u32, gy as u32, gz),
                    (threads, 0),
                    &mut [
                        Arg::Ptr(*a),
                        Arg::Ptr(*w),
                        Arg::Ptr(*bias),
                        Arg::Ptr(*y),
                        Arg::Gemm(*p),
                    ],
                )
            }
            TensorStep::Attention(a) => a.launch(gpu, s),
            TensorStep::Flat(step) => step.launch(gpu, s, 1, [0; 2]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &[usize]) -> Dims {
        Dims::new(s).unwrap()
    }

    #[test]
    fn runs_of_axes() {
        let (nd, rm) = (
            |s: &[usize]| Stored::ndhwc(d(s)),
            |s: &[usize]| Stored::row_major(d(s)),
        );
        // Row-major: last axis rows, middle axis strided.
        assert_eq!(axis_run(&nd(&[2, 3, 4]), 2, 3), Some((6, 4, 1)));
        assert_eq!(axis_run(&nd(&[2, 3, 4]), 1, 2), Some((2, 3, 4)));
        // NDHWC: C is innermost, W has C inner.
        assert_eq!(axis_run(&nd(&[1, 3, 4, 5, 6]), 1, 2), Some((120, 3, 1)));
        assert_eq!(axis_run(&nd(&[1, 3, 4, 5, 6]), 4, 5), Some((20, 6, 3)));
        assert_eq!(axis_run(&nd(&[1, 3, 4, 5, 6]), 2, 5), Some((1, 120, 3)));
        assert_eq!(axis_run(&nd(&[1, 3, 4, 5, 6]), 1, 5), None);
        assert_eq!(
            layer_norm_rows(&nd(&[1, 3, 4, 5, 6]), 1),
            Ok((1, 360, 1, 3))
        );
        assert!(layer_norm_rows(&nd(&[2, 3, 4, 5, 6]), 0).is_err());
        // A rank-5 token tensor stored row-major: its features are rows of their own.
        assert_eq!(axis_run(&rm(&[1, 3, 4, 5, 6]), 4, 5), Some((60, 6, 1)));
        assert_eq!(layer_norm_rows(&rm(&[1, 3, 4, 5, 6]), 4), Ok((60, 6, 1, 0)));
        assert_eq!(
            layer_norm_rows(&rm(&[1, 3, 4, 5, 6]), 1),
            Ok((1, 360, 1, 0))
        );
    }

    #[test]
    fn gemm_folds_rows_and_broadcasts_batches() {
        // Linear on [1, 7, 5] row-major: one GEMM of 7 rows.
        let p = gemm_params(
            (&[1, 7, 5], &[35, 5, 1]),
            (&[5, 3], &[3, 1]),
            (&[1, 7, 3], &[21, 3, 1]),
        )
        .unwrap();
        assert_eq!((p.m, p.n, p.k, p.nb, p.nbatch), (7, 3, 5, 0, 1));
        // [2, 3, 4, 5] @ [5, 6]: rows fold across both batch dims.
        let p = gemm_params(
            (&[2, 3, 4, 5], &[60, 20, 5, 1]),
            (&[5, 6], &[6, 1]),
            (&[2, 3, 4, 6], &[72, 24, 6, 1]),
        )
        .unwrap();
        assert_eq!((p.m, p.nb), (24, 0));
        // [2, 3, 4, 5] @ [1, 3, 5, 6]: b broadcast over dim 0 only: batches stay.
        let p = gemm_params(
            (&[2, 3, 4, 5], &[60, 20, 5, 1]),
            (&[1, 3, 5, 6], &[90, 30, 6, 1]),
            (&[2, 3, 4, 6], &[72, 24, 6, 1]),
        )
        .unwrap();
        assert_eq!((p.m, p.nb, p.nbatch), (4, 2, 6));
        assert_eq!((p.bd[0], p.bd[1], p.bbs[0], p.bbs[1]), (2, 3, 0, 30));
        // The vector path: batch strides 90 (b) and 60 (a) are not multiples of 8.
        assert!(!p.vec8(0, 0));
        let p = gemm_params(
            (&[2, 3, 4, 8], &[96, 32, 8, 1]),
            (&[1, 3, 8, 16], &[384, 128, 16, 1]),
            (&[2, 3, 4, 16], &[192, 64, 16, 1]),
        )
        .unwrap();
        assert!(p.vec8(256, 4096));
        assert!(!p.vec8(256 + 2, 4096), "an unaligned base");
        // a read along K with stride 8 (a transposed view) takes the general kernel.
        let p = gemm_params((&[8, 8], &[1, 8]), (&[8, 8], &[8, 1]), (&[8, 8], &[8, 1])).unwrap();
        assert!(!p.vec8(0, 0));
    }

    /// `nd_copy`'s addressing of element `e` (kernels/tensor.cu), on the host.
    fn addr(p: &NdParams, e: i64) -> (i64, i64) {
        let (mut t, mut xo, mut yo) = (e, p.xoff, p.yoff);
        for a in (0..p.rx as usize).rev() {
            xo += t % p.xd[a] * p.xs[a];
            if p.ry == 0 {
                yo += t % p.xd[a] * p.ys[a];
            }
            t /= p.xd[a];
        }
        t = e;
        for a in (0..p.ry as usize).rev() {
            yo += t % p.yd[a] * p.ys[a];
            t /= p.yd[a];
        }
        (xo, yo)
    }

    /// The 16-byte copy moves exactly the elements of the half one, where it is taken.
    #[test]
    fn vector_copies_keep_the_addressing() {
        let (nd5, rm) = (
            |s: &[usize]| Stored::ndhwc(d(s)),
            |s: &[usize]| Stored::row_major(d(s)),
        );
        let tr_to = |x: Stored, perm: &[usize], ndhwc: bool| {
            let o = Stored {
                dims: crate::model::ops::transpose_dims(&x.dims, perm).unwrap(),
                ndhwc,
            };
            let (xs, os) = (x.strides(), o.strides());
            nd(&ordered(&o, |a| [xs[perm[a]], os[a]]), 0, 0).unwrap()
        };
        let tr = |x: Stored, perm: &[usize]| tr_to(x, perm, false);
        let cases = [
            // Swin's qkv heads: [T, 3, h, 16] -> [3, h, T, 16].
            (tr(rm(&[7, 3, 2, 16]), &[1, 2, 0, 3]), true),
            // Features of 5: no whole vectors.
            (tr(rm(&[7, 3, 5]), &[1, 0, 2]), false),
            // Tokens of 8 features to NCDHW stored NDHWC: the same bytes, one run.
            (tr_to(rm(&[1, 2, 3, 4, 8]), &[0, 4, 1, 2, 3], true), true),
            // NDHWC C = 8 read as row-major: C is strided on the reading side.
            (tr(nd5(&[1, 8, 2, 3, 4]), &[0, 1, 2, 3, 4]), false),
            (
                reshape_params(&nd5(&[1, 8, 2, 3, 16]), &rm(&[1, 8, 96])).unwrap(),
                false,
            ),
            (
                reshape_params(&rm(&[4, 6, 16]), &rm(&[24, 2, 8])).unwrap(),
                true,
            ),
        ];
        for (i, (p, want)) in cases.iter().enumerate() {
            assert_eq!(p.vec8(256, 512).is_some(), *want, "case {i}");
            let Some(v) = p.vec8(256, 512) else { continue };
            assert!(p.vec8(256 + 2, 512).is_none(), "an unaligned base");
            assert_eq!(v.total * 8, p.total);
            for e in 0..p.total {
                let (u, j) = (e / 8, e % 8);
                let (vx, vy) = addr(&v, u);
                assert_eq!(addr(p, e), (vx * 8 + j, vy * 8 + j), "case {i} element {e}");
            }
        }
    }

    #[test]
    fn broadcast_and_constant_strides() {
        let rm = |s: &[usize]| Stored::row_major(d(s));
        assert_eq!(bcast(&rm(&[4]), &d(&[2, 3, 4])), vec![0, 0, 1]);
        assert_eq!(bcast(&rm(&[3, 1]), &d(&[2, 3, 4])), vec![0, 1, 0]);
        let t = Tensor::new(vec![1, 3, 1], vec![0.0; 3]);
        assert_eq!(const_strides(&t, &d(&[2, 3, 4])), Some(vec![0, 1, 0]));
        let t = Tensor::new(vec![3], vec![0.0; 3]);
        assert_eq!(const_strides(&t, &d(&[2, 3, 4])), None);
    }
}
