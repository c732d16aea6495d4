//! Elementwise binaries with numpy broadcasting, Softmax, Concat and strided ranges on row-major
//! data of any rank (the NCDHW kernels' facts reused: [`bin`] for the binaries, the stable
//! [`softmax_inplace`] for Softmax).

use super::eltwise::{bin, softmax_inplace, Binary};
use super::{err, zeroed_par, Real};
use crate::Result;
use ndarray::{Array5, ArrayViewD, ArrayViewMutD, IxDyn, Zip};
use rayon::prelude::*;

/// Elements per parallel task at least.
const GRAIN: usize = 1 << 14;

/// `a op b` broadcast (numpy rules, right-aligned) to `out`, as row-major values. Adjacent axes
/// that broadcast alike are merged first, so the walk is over as few axes as possible.
pub fn broadcast<T: Real>(
    op: Binary,
    a: &[T],
    ad: &[usize],
    b: &[T],
    bd: &[usize],
    out: &[usize],
) -> Result<Vec<T>> {
    let r = out.len();
    let bad = || {
        err(format!(
            "{op:?} of {ad:?} and {bd:?} does not broadcast to {out:?}"
        ))
    };
    if ad.len() > r
        || bd.len() > r
        || a.len() != ad.iter().product::<usize>()
        || b.len() != bd.iter().product::<usize>()
    {
        return Err(bad());
    }
    let pad = |d: &[usize]| -> Vec<usize> {
        let mut v = vec![1usize; r - d.len()];
        v.extend_from_slice(d);
        v
    };
    let (pa, pb) = (pad(ad), pad(bd));
    if (0..r).any(|i| (pa[i] != out[i] && pa[i] != 1) || (pb[i] != out[i] && pb[i] != 1)) {
        return Err(bad());
    }
    // Merge runs of axes where each operand is either full on both or broadcast on both.
    let (mut ma, mut mb, mut mo) = (Vec::new(), Vec::new(), Vec::new());
    for i in (0..r).filter(|&i| out[i] > 1) {
        let kind = (pa[i] == 1, pb[i] == 1);
        let same = mo.last().is_some_and(|_: &usize| {
            let j = mo.len() - 1;
            (ma[j] == 1, mb[j] == 1) == kind
        });
        if same {
            let j = mo.len() - 1;
            ma[j] *= pa[i];
            mb[j] *= pb[i];
            mo[j] *= out[i];
        } else {
            ma.push(pa[i]);
            mb.push(pb[i]);
            mo.push(out[i]);
        }
    }
    let mut y = zeroed_par(out.iter().product(), "a broadcast binary output")?;
    let va = ArrayViewD::from_shape(IxDyn(&ma), a).map_err(|e| err(e.to_string()))?;
    let vb = ArrayViewD::from_shape(IxDyn(&mb), b).map_err(|e| err(e.to_string()))?;
    let (va, vb) = (
        va.broadcast(IxDyn(&mo)).ok_or_else(bad)?,
        vb.broadcast(IxDyn(&mo)).ok_or_else(bad)?,
    );
    let vy = ArrayViewMutD::from_shape(IxDyn(&mo), &mut y).map_err(|e| err(e.to_string()))?;
    Zip::from(vy)
        .and(&va)
        .and(&vb)
        .par_for_each(|o, &p, &q| *o = bin(op, p, q));
    Ok(y)
}

/// (outer, size, inner): the elements before, along and after `axis` of `d`.
pub fn split(d: &[usize], axis: usize) -> (usize, usize, usize) {
    (
        d[..axis].iter().product(),
        d[axis],
        d[axis + 1..].iter().product(),
    )
}

/// Stable softmax of `x` (dims `d`) along `axis`, stored as `shape`.
pub fn softmax<T: Real>(x: &[T], d: &[usize], axis: usize, shape: [usize; 5]) -> Result<Array5<T>> {
    if axis >= d.len() || x.len() != d.iter().product::<usize>() {
        return Err(err(format!(
            "Softmax over axis {axis} of {} values as {d:?}",
            x.len()
        )));
    }
    let (o, n, i) = split(d, axis);
    let mut v = crate::sys::alloc::try_with_capacity(x.len(), "a Softmax output")
        .map_err(crate::sys::alloc::retryable)?;
    v.extend_from_slice(x);
    let mut a = Array5::from_shape_vec([o, n, i, 1, 1], v).map_err(|e| err(e.to_string()))?;
    softmax_inplace(&mut a, 1)?;
    a.into_shape_with_order(shape)
        .map_err(|e| err(e.to_string()))
}

/// Concatenation along `axis` of row-major inputs `(data, dims)` into `y`.
pub fn concat<T: Real>(ins: &[(&[T], &[usize])], axis: usize, y: &mut [T]) -> Result<()> {
    if ins.is_empty() || ins.iter().any(|&(_, d)| axis >= d.len()) {
        return Err(err(format!(
            "Concat along axis {axis} of {} inputs",
            ins.len()
        )));
    }
    let parts: Vec<(usize, &[T])> = ins
        .iter()
        .map(|&(x, d)| (split(d, axis).1 * split(d, axis).2, x))
        .collect();
    let row: usize = parts.iter().map(|p| p.0).sum();
    let outer = split(ins[0].1, axis).0;
    if row * outer != y.len() || parts.iter().any(|&(w, x)| w * outer != x.len()) {
        return Err(err(format!(
            "Concat along {axis} of inputs that do not fit {} values",
            y.len()
        )));
    }
    y.par_chunks_mut(row.max(1))
        .enumerate()
        .for_each(|(o, dst)| {
            let mut off = 0;
            for &(w, x) in &parts {
                copy(&mut dst[off..off + w], &x[o * w..(o + 1) * w]);
                off += w;
            }
        });
    Ok(())
}

/// `dst` ← `src`, in parallel pieces when long.
fn copy<T: Real>(dst: &mut [T], src: &[T]) {
    if dst.len() <= GRAIN {
        dst.copy_from_slice(src);
    } else {
        dst.par_chunks_mut(GRAIN)
            .zip(src.par_chunks(GRAIN))
            .for_each(|(a, b)| a.copy_from_slice(b));
    }
}

/// `len` indices `start, start + step, ...` along `axis` of `x` (dims `d`) into `y`.
pub fn strided<T: Real>(
    x: &[T],
    d: &[usize],
    axis: usize,
    start: usize,
    len: usize,
    step: usize,
    y: &mut [T],
) -> Result<()> {
    if axis >= d.len() {
        return Err(err(format!("axis {axis} of {d:?}")));
    }
    let (outer, n, inner) = split(d, axis);
    let last = start + (len.max(1) - 1) * step;
    if x.len() != outer * n * inner
        || y.len() != outer * len * inner
        || len == 0
        || inner == 0
        || last >= n
    {
        return Err(err(format!(
            "{len} indices from {start} by {step} along axis {axis} of {d:?}"
        )));
    }
    y.par_chunks_mut(inner)
        .with_min_len((GRAIN / inner).max(1))
        .enumerate()
        .for_each(|(r, dst)| {
            let (o, k) = (r / len, r % len);
            let s = (o * n + start + k * step) * inner;
            dst.copy_from_slice(&x[s..s + inner]);
        });
    Ok(())
}
