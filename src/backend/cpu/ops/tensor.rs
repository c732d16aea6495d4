//! Ops on activations of any rank (the tensor ops of transformer nets, and elementwise ops,
//! Softmax and Concat when an operand is not NCDHW). Values of other ranks are stored as
//! row-major data in 5D arrays of their [`Dims::folded5`] shape; these kernels read the data
//! with the logical dims the executor hands them.

use super::eltwise::Binary;
use super::{apply, apply_inplace, binary_of, err, owned, zeroed_par, Real};
use super::{layernorm::layer_norm, matmul, nd, transpose::transpose};
use crate::model::graph::{Dims, Op};
use crate::model::ops::gather_dims;
use crate::Result;
use ndarray::{Array5, ArrayView5};

/// Whether the executor runs node `op` through [`apply_tensor`]: a tensor op, or an op with an
/// operand or output that is not NCDHW.
pub fn runs_as_tensor(op: &Op, ins: &[Dims], out: &Dims) -> bool {
    op.is_tensor_op() || ins.iter().chain([out]).any(|d| d.rank() != 5)
}

/// Whether the executor runs the node in place on its first input (the memory model replays
/// this): an in-place op on NCDHW values whose output has its first input's shape.
pub fn node_runs_inplace(op: &Op, ins: &[Dims], out: &Dims) -> bool {
    !runs_as_tensor(op, ins, out) && ins.first().is_some_and(|x| super::runs_inplace(op, x, out))
}

/// Runs `op` on `(data, dims)` operands, giving an array of `out`'s folded shape.
pub fn apply_tensor<T: Real>(
    op: &Op,
    ins: &[(ArrayView5<T>, Dims)],
    out: Dims,
) -> Result<Array5<T>> {
    let dims: Vec<Dims> = ins.iter().map(|i| i.1).collect();
    let want = op.output_dims(&dims).map_err(err)?;
    if want != out {
        return Err(err(format!(
            "{} of {dims:?} gives {want:?}, not the expected {out:?}",
            op.name()
        )));
    }
    if out.numel() == 0 || dims.iter().any(|d| d.numel() == 0) {
        return Err(err(format!("{} of empty tensors {dims:?}", op.name())));
    }
    for (i, (x, d)) in ins.iter().enumerate() {
        if x.len() != d.numel() {
            return Err(err(format!(
                "input {i} holds {} values but has shape {d:?}",
                x.len()
            )));
        }
    }
    if !op.is_tensor_op() && dims.iter().all(|d| d.rank() == 5) {
        let views: Vec<ArrayView5<T>> = ins.iter().map(|i| i.0.view()).collect();
        return apply(op, &views);
    }
    let shape = out.folded5();
    let data: Vec<_> = ins.iter().map(|i| i.0.as_standard_layout()).collect();
    let xs = data
        .iter()
        .map(|c| {
            c.as_slice()
                .ok_or_else(|| err("input is not contiguous".into()))
        })
        .collect::<Result<Vec<&[T]>>>()?;
    let ds = |i: usize| dims[i].as_slice();
    let wrap = |v: Vec<T>| Array5::from_shape_vec(shape, v).map_err(|e| err(e.to_string()));
    let fresh = || zeroed_par::<T>(out.numel(), "a tensor op output");
    match op {
        Op::Reshape { .. } => Ok(owned(ins[0].0.view())?
            .into_shape_with_order(shape)
            .map_err(|e| err(e.to_string()))?),
        Op::Transpose { perm } => {
            let mut y = fresh()?;
            transpose(xs[0], ds(0), perm, &mut y)?;
            wrap(y)
        }
        Op::Slice(s) => {
            let r = s.resolve(&dims[0]).map_err(err)?;
            let mut y = fresh()?;
            nd::strided(xs[0], ds(0), r.axis, r.start, r.len, r.step, &mut y)?;
            wrap(y)
        }
        Op::Gather { axis, index } => {
            let (a, i, _) = gather_dims(&dims[0], *axis, *index).map_err(err)?;
            let mut y = fresh()?;
            nd::strided(xs[0], ds(0), a, i, 1, 1, &mut y)?;
            wrap(y)
        }
        Op::MatMul => wrap(matmul::matmul(xs[0], dims[0], xs[1], dims[1], out)?),
        Op::Linear(l) => wrap(matmul::linear(l, xs[0], dims[0], out)?),
        Op::LayerNorm(l) => wrap(layer_norm(l, xs[0], dims[0])?),
        Op::Softmax { axis } => nd::softmax(xs[0], ds(0), *axis, shape),
        Op::Concat { axis } => {
            let parts: Vec<(&[T], &[usize])> = (0..ins.len()).map(|i| (xs[i], ds(i))).collect();
            let mut y = fresh()?;
            nd::concat(&parts, *axis, &mut y)?;
            wrap(y)
        }
        Op::AddConst(t) | Op::MulConst(t) => {
            let b = if matches!(op, Op::AddConst(_)) {
                Binary::Add
            } else {
                Binary::Mul
            };
            let c = T::cast_slice(&t.data);
            wrap(nd::broadcast(
                b,
                xs[0],
                ds(0),
                &c,
                &t.shape,
                out.as_slice(),
            )?)
        }
        Op::Attention(a) => {
            let (y, _) = super::attention(a, (xs[0], dims[0]), (xs[1], dims[1]), (xs[2], dims[2]))?;
            wrap(y)
        }
        op if op.is_elementwise_unary() => {
            let mut y = owned(ins[0].0.view())?
                .into_shape_with_order(shape)
                .map_err(|e| err(e.to_string()))?;
            apply_inplace(op, &mut y, &[])?;
            Ok(y)
        }
        op => match binary_of(op) {
            Some(b) => wrap(nd::broadcast(
                b,
                xs[0],
                ds(0),
                xs[1],
                ds(1),
                out.as_slice(),
            )?),
            None => Err(err(format!(
                "{} needs NCDHW inputs, got {dims:?}",
                op.name()
            ))),
        },
    }
}
