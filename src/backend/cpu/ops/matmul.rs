//! MatMul of two activations (batch dims broadcast like numpy) and Linear (an activation times a
//! constant `[K, N]` matrix, plus a bias), on the same bounds-checked `matrixmultiply` front as
//! the convolutions, in f32 or f64. Batches of small products (attention heads) run in parallel
//! over rayon; large ones one after another on matrixmultiply's own threads.

use super::gemm::{gemm, Mat};
use super::{err, zeroed, zeroed_par, Real};
use crate::model::graph::Linear;
use crate::model::ops::{broadcast_lead, Dims};
use crate::Result;
use rayon::prelude::*;

/// Below this many multiply-adds a product runs on one thread (matrixmultiply does not split
/// it), so the batch is spread over rayon instead.
const SMALL_MACS: usize = 1 << 18;

/// Row-major `[m, n]` matrix at `c` ← `[m, k]` at `a` times `[k, n]` at `b`, plus `c` × beta.
#[allow(clippy::too_many_arguments)]
fn product<T: Real>(
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    ao: usize,
    b: &[T],
    bo: usize,
    beta: T,
    c: &mut [T],
) {
    let am = Mat {
        off: ao,
        rs: k,
        cs: 1,
    };
    let bm = Mat {
        off: bo,
        rs: n,
        cs: 1,
    };
    let cm = Mat {
        off: 0,
        rs: n,
        cs: 1,
    };
    gemm(m, k, n, a, am, b, bm, beta, c, cm);
}

/// Offsets of each output batch into `a`'s and `b`'s data (broadcast batch axes read offset 0).
fn batch_offsets(
    ad: &[usize],
    bd: &[usize],
    batch: &[usize],
    amat: usize,
    bmat: usize,
) -> Vec<(usize, usize)> {
    let r = batch.len();
    let pad = |d: &[usize]| -> Vec<usize> {
        let mut v = vec![1usize; r - d.len()];
        v.extend_from_slice(d);
        v
    };
    let (pa, pb) = (pad(ad), pad(bd));
    // Element strides of each batch axis, 0 where the operand broadcasts.
    let bstrides = |p: &[usize], mat: usize| -> Vec<usize> {
        let mut s = vec![0usize; r];
        let mut acc = mat;
        for i in (0..r).rev() {
            s[i] = if p[i] == 1 { 0 } else { acc };
            acc *= p[i];
        }
        s
    };
    let (sa, sb) = (bstrides(&pa, amat), bstrides(&pb, bmat));
    let total: usize = batch.iter().product();
    (0..total)
        .map(|mut i| {
            let (mut oa, mut ob) = (0, 0);
            for ax in (0..r).rev() {
                let j = i % batch[ax];
                i /= batch[ax];
                oa += j * sa[ax];
                ob += j * sb[ax];
            }
            (oa, ob)
        })
        .collect()
}

/// `a @ b` (dims `ad`, `bd`, both rank >= 2) as row-major values of `out`.
pub fn matmul<T: Real>(a: &[T], ad: Dims, b: &[T], bd: Dims, out: Dims) -> Result<Vec<T>> {
    let want = crate::model::ops::matmul_dims(&ad, &bd).map_err(err)?;
    if want != out || a.len() != ad.numel() || b.len() != bd.numel() {
        return Err(err(format!(
            "MatMul of {ad:?} ({} values) and {bd:?} ({} values) into {out:?}",
            a.len(),
            b.len()
        )));
    }
    let (ra, rb) = (ad.rank(), bd.rank());
    let (m, k, n) = (ad[ra - 2], ad[ra - 1], bd[rb - 1]);
    let (abatch, bbatch) = (&ad.as_slice()[..ra - 2], &bd.as_slice()[..rb - 2]);
    let batch = broadcast_lead(abatch, bbatch).ok_or_else(|| {
        err(format!(
            "MatMul of {ad:?} and {bd:?}: batch dims do not broadcast"
        ))
    })?;
    let nb: usize = batch.iter().product();
    let mut y = zeroed_par(out.numel(), "a MatMul output")?;
    if bbatch.iter().product::<usize>() == 1 && abatch.iter().product::<usize>() == nb {
        // One right-hand matrix for every batch: a single [nb*m, k] x [k, n] product.
        product(nb * m, k, n, a, 0, b, 0, T::ZERO, &mut y);
        return Ok(y);
    }
    let offs = batch_offsets(abatch, bbatch, &batch, m * k, k * n);
    let one = |(dst, &(oa, ob)): (&mut [T], &(usize, usize))| {
        product(m, k, n, a, oa, b, ob, T::ZERO, dst)
    };
    if m * k * n < SMALL_MACS {
        y.par_chunks_mut(m * n).zip(offs.par_iter()).for_each(one);
    } else {
        y.chunks_mut(m * n).zip(offs.iter()).for_each(one);
    }
    Ok(y)
}

/// `x @ weight + bias` over the last axis of `x` (dims `xd`), as row-major values of `out`.
pub fn linear<T: Real>(l: &Linear, x: &[T], xd: Dims, out: Dims) -> Result<Vec<T>> {
    let want = l.output_dims(&xd).map_err(err)?;
    if want != out || x.len() != xd.numel() {
        return Err(err(format!(
            "Linear of {xd:?} ({} values) into {out:?}",
            x.len()
        )));
    }
    let (k, n) = l.kn();
    let rows = xd.numel() / k;
    let w = T::cast_slice(&l.weight.data);
    let mut y = match &l.bias {
        Some(bias) => {
            // Start from the bias in every row; the product adds onto it (beta = 1).
            let bias = T::cast_slice(&bias.data);
            let mut y = zeroed(out.numel(), "a Linear output")?;
            y.par_chunks_mut(n)
                .with_min_len((4096 / n).max(1))
                .for_each(|row| row.copy_from_slice(&bias));
            y
        }
        None => zeroed_par(out.numel(), "a Linear output")?,
    };
    product(rows, k, n, x, 0, &w, 0, T::ONE, &mut y);
    Ok(y)
}
