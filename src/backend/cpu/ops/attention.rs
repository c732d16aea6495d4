//! Fused attention `softmax(scale · q @ kᵀ + bias + mask) @ v` on row-major data of any rank (the
//! [`Attention`] op): one query row at a time, so the `[..., T, S]` scores are never stored
//! whole. Scores, softmax and the weighted sum run in `T` (f64 for the reference), the softmax
//! stabilised by the row maximum.

use super::{err, Real};
use crate::model::ops::{Attention, AttnDims, Dims};
use crate::Result;
use rayon::prelude::*;

/// (element stride, size) of each leading dim of a value of dims `d` read at the broadcast
/// leading dims `lead`, right-aligned: stride 0 along a broadcast axis, and a size that divides
/// `lead`'s where the value repeats (an attention term of a batched graph).
fn lead_strides(d: &[usize], lead: &[usize]) -> Vec<(usize, usize)> {
    let full = Dims::new(d).map(|x| x.strides()).unwrap_or_default();
    let r = lead.len();
    (0..r)
        .map(|a| {
            let da = (a + d.len()).checked_sub(r + 2).map(|i| (d[i], full[i]));
            match da {
                Some((n, st)) if n != 1 && lead[a].is_multiple_of(n) => (st, n),
                _ => (0, 1),
            }
        })
        .collect()
}

/// Offset of leading index `i` (flat over `lead`) under `strides`.
fn offset(mut i: usize, lead: &[usize], strides: &[(usize, usize)]) -> usize {
    let mut o = 0;
    for a in (0..lead.len()).rev() {
        let (st, n) = strides[a];
        o += (i % lead[a]) % n * st;
        i /= lead[a];
    }
    o
}

/// `softmax(scale · q @ kᵀ + bias + mask) @ v` of row-major `(data, dims)` operands q `[..., T, d]`,
/// k `[..., S, d]`, v `[..., S, dv]` (one rank >= 3, leading dims broadcast); returns the
/// row-major output and its dims `[..., T, dv]`. Wrong dims or data lengths are an error.
pub fn attention<T: Real>(
    op: &Attention,
    q: (&[T], Dims),
    k: (&[T], Dims),
    v: (&[T], Dims),
) -> Result<(Vec<T>, Dims)> {
    let a = op
        .split(&q.1, &k.1, &v.1)
        .map_err(|e| err(format!("Attention: {e}")))?;
    for (name, (data, dims)) in [("q", q), ("k", k), ("v", v)] {
        if data.len() != dims.numel() {
            return Err(err(format!(
                "Attention: {name} has {} elements for dims {dims:?}",
                data.len()
            )));
        }
    }
    let od = a.output().map_err(|e| err(format!("Attention: {e}")))?;
    let AttnDims {
        ref lead,
        t,
        s,
        d,
        dv,
    } = a;
    let qs = lead_strides(q.1.as_slice(), lead);
    let ks = lead_strides(k.1.as_slice(), lead);
    let vs = lead_strides(v.1.as_slice(), lead);
    // Each additive term (bias, mask): its data and strides over lead, T and S.
    let terms: Vec<_> = op
        .terms()
        .map(|(_, b)| {
            let st = lead_strides(&b.shape, lead);
            let r = b.shape.len();
            let bt = if b.shape[r - 2] == 1 {
                0
            } else {
                b.shape[r - 1]
            };
            let bs = usize::from(b.shape[r - 1] != 1);
            (T::cast_slice(&b.data), st, bt, bs)
        })
        .collect();
    let scale = T::from_f32(op.scale);
    let mut out = vec![T::ZERO; od.numel()];
    if dv == 0 {
        return Ok((out, od));
    }
    out.par_chunks_mut(dv).enumerate().for_each_init(
        || vec![T::ZERO; s],
        |sc, (row, o)| {
            let (li, ti) = (row / t, row % t);
            let qr = &q.0[offset(li, lead, &qs) + ti * d..][..d];
            let kb = offset(li, lead, &ks);
            let vb = offset(li, lead, &vs);
            // Where each term's row of this (leading index, query row) starts.
            let mut tb = [0usize; 2];
            for (b, (_, st, bt, _)) in tb.iter_mut().zip(&terms) {
                *b = offset(li, lead, st) + ti * bt;
            }
            let mut m = T::NEG_INFINITY;
            for (j, x) in sc.iter_mut().enumerate() {
                let kr = &k.0[kb + j * d..][..d];
                let mut acc = T::ZERO;
                for (&a, &b) in qr.iter().zip(kr) {
                    acc += a * b;
                }
                *x = acc * scale;
                for (&b, (bd, _, _, bs)) in tb.iter().zip(&terms) {
                    *x += bd[b + j * bs];
                }
                m = m.max(*x);
            }
            if m == T::NEG_INFINITY {
                return; // every score masked to -inf: zeros, as the CUDA kernel writes
            }
            let mut sum = T::ZERO;
            for x in sc.iter_mut() {
                *x = (*x - m).exp();
                sum += *x;
            }
            for (j, &p) in sc.iter().enumerate() {
                let vr = &v.0[vb + j * dv..][..dv];
                for (y, &w) in o.iter_mut().zip(vr) {
                    *y += p * w;
                }
            }
            for y in o.iter_mut() {
                *y /= sum;
            }
        },
    );
    Ok((out, od))
}
