//! Broadcasting binaries between two activations and the [`Pointwise`] functions. Equal shapes
//! keep the plain in-place binary of `eltwise` (bit for bit what it always computed); a smaller
//! second operand is broadcast into the first in place; a smaller first operand (a gate
//! `[N,1,D,H,W]` times features, `s - x`) writes a new output.

use super::eltwise::{bin, binary_inplace, Binary};
use super::{dims, err, make_standard, zeroed};
use crate::backend::cpu::Real;
use crate::model::graph::{Op, Pointwise, Shape};
use crate::model::ops::broadcast_shape;
use crate::Result;
use ndarray::{Array5, ArrayView5, Zip};
use rayon::prelude::*;

/// The [`Binary`] of a two-activation op.
pub fn binary_of(op: &Op) -> Option<Binary> {
    Some(match op {
        Op::Add => Binary::Add,
        Op::Sub => Binary::Sub,
        Op::Mul => Binary::Mul,
        Op::Div => Binary::Div,
        Op::Max => Binary::Max,
        Op::Min => Binary::Min,
        Op::Pow => Binary::Pow,
        _ => return None,
    })
}

/// `x ← x op y` where `y` broadcasts to `x`'s shape (equal shapes: [`binary_inplace`]).
pub fn broadcast_inplace<T: Real>(x: &mut Array5<T>, y: ArrayView5<T>, op: Binary) -> Result<()> {
    let (xs, ys) = (dims(&x.view()), dims(&y));
    if xs == ys {
        return binary_inplace(x, y, op);
    }
    let out = broadcast_shape(&xs, &ys).map_err(err)?;
    if out != xs {
        return Err(err(format!(
            "{op:?} of {xs:?} and {ys:?} makes {out:?}: the first operand cannot hold it in place"
        )));
    }
    let b = y
        .broadcast(xs)
        .ok_or_else(|| err(format!("{ys:?} does not broadcast to {xs:?}")))?;
    Zip::from(x)
        .and(&b)
        .par_for_each(|a, &v| *a = bin(op, *a, v));
    Ok(())
}

/// `a op b` broadcast to their common shape, in a new array.
pub fn broadcast_binary<T: Real>(
    a: ArrayView5<T>,
    b: ArrayView5<T>,
    op: Binary,
) -> Result<Array5<T>> {
    let (sa, sb) = (dims(&a), dims(&b));
    let out: Shape = broadcast_shape(&sa, &sb).map_err(err)?;
    let bad = || err(format!("{sa:?} and {sb:?} do not broadcast to {out:?}"));
    let (va, vb) = (
        a.broadcast(out).ok_or_else(bad)?,
        b.broadcast(out).ok_or_else(bad)?,
    );
    let len = out.iter().product();
    let mut y = Array5::from_shape_vec(out, zeroed(len, "a broadcast binary output")?)
        .map_err(|e| err(e.to_string()))?;
    Zip::from(&mut y)
        .and(&va)
        .and(&vb)
        .par_for_each(|o, &p, &q| *o = bin(op, p, q));
    Ok(y)
}

/// `x ← f(x)`, each value through [`Pointwise::eval`] in f64 (rounded once for f32).
pub fn pointwise_inplace<T: Real>(x: &mut Array5<T>, f: Pointwise) -> Result<()> {
    make_standard(x)?;
    let xs = x
        .as_slice_mut()
        .ok_or_else(|| err("activation input is not contiguous".into()))?;
    xs.par_chunks_mut(1 << 14).for_each(|c| {
        for v in c {
            *v = T::from_f64(f.eval(v.to_f64()));
        }
    });
    Ok(())
}
