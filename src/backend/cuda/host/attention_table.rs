//! The host side of the fused attention launch: the per-leading-index offset table, row strides
//! and bias strides of one attention's operands on any buffer layout, and the bias and mask as
//! uploaded. The buffer plan counts these tables; `ops::attention` uploads them and launches.

use crate::backend::cuda::host::tensor_layout::Stored;
use crate::model::graph::Tensor;
use crate::model::ops::{Attention, AttnDims, Dims};
use crate::{Error, Result};
use std::borrow::Cow;

/// Most features of q / k (d) and of v (dv) the kernel holds (its `ATT_DMAX`).
pub const MAX_FEATURES: usize = 128;
/// The offset table, row strides and bias strides of one attention's operands.
#[derive(Clone, Debug, PartialEq)]
pub struct AttnTable {
    /// The attention's shapes.
    pub dims: AttnDims,
    /// `lead * 6` element offsets (q, k, v, bias, mask, output) per leading index.
    pub offs: Vec<i64>,
    /// Row strides (elements) of q, k, v and the output.
    pub ld: [usize; 4],
    /// Bias and mask strides along T and S (both are row-major constants, rows padded to
    /// `row_stride` as uploaded).
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
            let up = uploaded_shape(b);
            let st = lead_strides(&b.shape, &row_major(&up), n);
            (
                st,
                [if bt == 1 { 0 } else { up[n + 1] }, usize::from(bs != 1)],
            )
        }
        None => (vec![0; n], [0, 0]),
    };
    let ((sb, bias_ts), (sm, mask_ts)) = (term(&op.bias), term(&op.mask));
    // Each operand's size per leading axis: a term whose size divides the lead's repeats along it.
    let size = |b: &Option<Tensor>| b.as_ref().map_or(vec![1; n], |b| b.shape[..n].to_vec());
    let sizes = [q, k, v]
        .map(|d| d.as_slice()[..n].to_vec())
        .into_iter()
        .chain([size(&op.bias), size(&op.mask), od.as_slice()[..n].to_vec()])
        .collect::<Vec<_>>();
    let rows: usize = lead.iter().product();
    let mut offs = Vec::with_capacity(rows * 6);
    for l in 0..rows {
        let mut o = [0i64; 6];
        let mut i = l;
        for ax in (0..n).rev() {
            let x = i % lead[ax];
            i /= lead[ax];
            let strides = [&ls[0], &ls[1], &ls[2], &sb, &sm, &ls[3]];
            for ((slot, st), sz) in o.iter_mut().zip(strides).zip(&sizes) {
                *slot += (x % sz[ax]) as i64 * st[ax];
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

/// The table of tensor-path node `op` on its planned layouts (`tensor_layout::paths`): q, k,
/// v as stored, the output NDHWC or row-major by `out_ndhwc`. What the buffer plan counts and
/// the launch list uploads.
pub fn node_table(op: &Attention, ins: &[Stored], out_ndhwc: bool) -> Result<AttnTable> {
    let [q, k, v] = ins else {
        return Err(Error::Graph(format!(
            "Attention needs 3 inputs, got {}",
            ins.len()
        )));
    };
    let od = op
        .output_dims(&q.dims, &k.dims, &v.dims)
        .map_err(Error::Graph)?;
    let o = Stored {
        dims: od,
        ndhwc: out_ndhwc,
    };
    let (sq, sk, sv) = (q.strides(), k.strides(), v.strides());
    strided_offsets(
        op,
        [(&q.dims, &sq), (&k.dims, &sk), (&v.dims, &sv)],
        &o.strides(),
    )
}

/// The bias and mask of `op`, in that order.
pub fn terms(op: &Attention) -> [Option<&Tensor>; 2] {
    [op.bias.as_ref(), op.mask.as_ref()]
}

/// A bias or mask row's stride as uploaded: its length rounded up to even, so that every row
/// starts 8-byte aligned and the kernel reads two keys per load (SwinUNETR's rows of 343 keys
/// would otherwise take one load per key).
fn row_stride(s: usize) -> usize {
    s + (s & 1) * usize::from(s > 1)
}

/// A term's shape as uploaded: its last axis padded to `row_stride`.
fn uploaded_shape(t: &Tensor) -> Vec<usize> {
    let mut s = t.shape.clone();
    if let Some(last) = s.last_mut() {
        *last = row_stride(*last);
    }
    s
}

/// Elements of a term as uploaded (the buffer plan's count).
pub fn uploaded_len(t: &Tensor) -> usize {
    uploaded_shape(t).iter().product()
}

/// A term as uploaded: fp32, so masks of -100 plus small relative-position biases keep every
/// bit the CPU reference sees (fp16 would round 0.01 next to -100 away), rows padded with zeros
/// to `row_stride` (the table's strides count the padding).
pub fn uploaded_f32(t: &Tensor) -> Cow<'_, [f32]> {
    let s = t.shape.last().copied().unwrap_or(1);
    let ps = row_stride(s);
    if ps == s {
        return Cow::Borrowed(&t.data);
    }
    let mut out = Vec::with_capacity(uploaded_len(t));
    for row in t.data.chunks(s) {
        out.extend_from_slice(row);
        out.resize(out.len() + ps - s, 0.0);
    }
    Cow::Owned(out)
}
