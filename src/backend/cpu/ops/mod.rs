//! Every IR op on NCDHW arrays, generic over [`Real`] (f32 for the backend, f64 for the
//! reference). Each op is callable alone; [`apply`] dispatches any [`Op`]. Shapes and parameters
//! are validated first, so bad input is an `Err`, never a panic.

mod attention;
mod conv;
mod direct;
mod eltwise;
mod gemm;
mod layernorm;
mod math;
mod matmul;
mod microkernel;
mod nd;
mod norm;
mod pad;
mod pool;
mod resize;
mod tensor;
mod transpose;
mod vmath;

pub use attention::attention;
pub use conv::{conv3d, conv_transpose3d, conv_workspace_bytes, COL_BUDGET_BYTES};
pub use direct::conv3d_fused;
pub use eltwise::{
    add, add_const, binary_inplace, concat, const_inplace, div, elu, leaky_relu, mul, mul_const,
    prelu, relu, sigmoid, softmax, softmax_inplace, sub, tanh, unary_inplace, Binary, Unary,
};
pub use math::{binary_of, broadcast_binary, broadcast_inplace, pointwise_inplace};
pub use norm::{
    channel_affine, channel_affine_inplace, group_norm, group_norm_inplace, instance_norm,
    instance_norm_inplace,
};
pub use pad::{pad, tile};
pub use pool::{average_pool3d, max_pool3d};
pub use resize::resize;
pub use tensor::{apply_tensor, node_runs_inplace, runs_as_tensor};

use super::Real;
use crate::model::graph::Op;
use crate::model::graph::Shape;
use crate::{Error, Result};
use ndarray::{Array5, ArrayView5, CowArray, Ix5};

pub(crate) fn err(msg: String) -> Error {
    Error::Graph(msg)
}

pub(crate) fn dims<T>(x: &ArrayView5<T>) -> Shape {
    let d = x.dim();
    [d.0, d.1, d.2, d.3, d.4]
}

/// A C-contiguous view (copying only when the caller passed a strided view).
pub(crate) fn standard<'a, T: Real>(x: &'a ArrayView5<'a, T>) -> CowArray<'a, T, Ix5> {
    x.as_standard_layout()
}

/// Makes an owned array C-contiguous so slice-based kernels can run on it.
pub(crate) fn make_standard<T: Real>(x: &mut Array5<T>) -> Result<()> {
    if !x.is_standard_layout() {
        *x = owned(x.view())?;
    }
    Ok(())
}

/// An owned C-contiguous copy of an activation. Host memory running out is `OutOfMemory`, so
/// the engine retries with a smaller batch or window instead of the process aborting.
pub(crate) fn owned<T: Real>(x: ArrayView5<T>) -> Result<Array5<T>> {
    crate::sys::alloc::try_to_owned(x, "an activation").map_err(crate::sys::alloc::retryable)
}

/// A zero-filled activation or scratch buffer of `len` values, fallible as [`owned`].
pub(crate) fn zeroed<T: Real>(len: usize, what: &str) -> Result<Vec<T>> {
    crate::sys::alloc::try_vec(len, T::ZERO, what).map_err(crate::sys::alloc::retryable)
}

/// As [`zeroed`], with the fill (and the page faults of a fresh allocation) spread over the
/// threads: filling a large conv output on one thread was the serial part that kept the
/// 1 -> 2 core speed-up below 1.8x.
pub(crate) fn zeroed_par<T: Real>(len: usize, what: &str) -> Result<Vec<T>> {
    use rayon::prelude::*;
    let mut v = crate::sys::alloc::try_with_capacity::<T>(len, what)
        .map_err(crate::sys::alloc::retryable)?;
    v.spare_capacity_mut()
        .par_chunks_mut(1 << 16)
        .for_each(|c| {
            c.iter_mut().for_each(|x| {
                x.write(T::ZERO);
            })
        });
    // SAFETY: every one of the `len` reserved values was written just above.
    unsafe { v.set_len(len) };
    Ok(v)
}

/// Whether `op` can overwrite its first input (the executor then hands it the buffer when that
/// input dies at this node).
pub fn is_inplace(op: &Op) -> bool {
    !matches!(
        op,
        Op::Conv(_)
            | Op::ConvTranspose(_)
            | Op::Concat { .. }
            | Op::MaxPool(_)
            | Op::AveragePool(_)
            | Op::Resize(_)
            | Op::Pad(_)
            | Op::Tile(_)
    ) && !op.is_tensor_op()
}

/// Whether node `op` runs in place on an input 0 of shape `x` giving `out`: an in-place op
/// whose output is its first input's shape (a broadcast binary whose first operand is the
/// smaller writes a new array).
pub fn runs_inplace<S: PartialEq>(op: &Op, x: &S, out: &S) -> bool {
    is_inplace(op) && x == out
}

/// Runs an in-place-capable op (see [`is_inplace`]) on its first input; `rest` are the others.
pub fn apply_inplace<T: Real>(op: &Op, x: &mut Array5<T>, rest: &[ArrayView5<T>]) -> Result<()> {
    let mut shapes = vec![dims(&x.view())];
    shapes.extend(rest.iter().map(dims));
    op.output_shape(&shapes).map_err(err)?;
    match op {
        Op::InstanceNorm { eps, scale, bias } => instance_norm_inplace(x, *eps, scale, bias),
        Op::GroupNorm {
            groups,
            eps,
            scale,
            bias,
        } => group_norm_inplace(x, *groups, *eps, scale, bias),
        Op::ChannelAffine { scale, shift } => channel_affine_inplace(x, scale, shift),
        Op::Relu => unary_inplace(x, Unary::Relu),
        Op::LeakyRelu { alpha } => unary_inplace(x, Unary::LeakyRelu(*alpha)),
        Op::Elu { alpha } => unary_inplace(x, Unary::Elu(*alpha)),
        Op::Sigmoid => unary_inplace(x, Unary::Sigmoid),
        Op::Tanh => unary_inplace(x, Unary::Tanh),
        Op::PRelu { slope } => eltwise::prelu_inplace(x, slope),
        Op::Softmax { axis } => softmax_inplace(x, *axis),
        Op::Add => broadcast_inplace(x, rest[0], Binary::Add),
        Op::Sub => broadcast_inplace(x, rest[0], Binary::Sub),
        Op::Mul => broadcast_inplace(x, rest[0], Binary::Mul),
        Op::Div => broadcast_inplace(x, rest[0], Binary::Div),
        Op::AddConst(t) => const_inplace(x, t, Binary::Add),
        Op::MulConst(t) => const_inplace(x, t, Binary::Mul),
        Op::Identity => Ok(()),
        Op::Max => broadcast_inplace(x, rest[0], Binary::Max),
        Op::Min => broadcast_inplace(x, rest[0], Binary::Min),
        Op::Pow => broadcast_inplace(x, rest[0], Binary::Pow),
        Op::Pointwise(f) => pointwise_inplace(x, *f),
        _ => Err(err(format!("{} cannot run in place", op.name()))),
    }
}

/// Runs any op on borrowed inputs and returns a new array.
pub fn apply<T: Real>(op: &Op, inputs: &[ArrayView5<T>]) -> Result<Array5<T>> {
    let shapes: Vec<Shape> = inputs.iter().map(dims).collect();
    let out = op.output_shape(&shapes).map_err(err)?;
    if runs_inplace(op, &shapes[0], &out) {
        let mut x = owned(inputs[0])?;
        apply_inplace(op, &mut x, &inputs[1..])?;
        return Ok(x);
    }
    match op {
        Op::Conv(p) => conv3d(inputs[0], p),
        Op::ConvTranspose(p) => conv_transpose3d(inputs[0], p),
        Op::Concat { axis } => concat(inputs, *axis),
        Op::MaxPool(p) => max_pool3d(inputs[0], p),
        Op::AveragePool(p) => average_pool3d(inputs[0], p),
        Op::Resize(p) => resize(inputs[0], p),
        Op::Pad(p) => pad(inputs[0], p),
        Op::Tile(t) => tile(inputs[0], t),
        _ => match binary_of(op) {
            Some(b) => broadcast_binary(inputs[0], inputs[1], b),
            None => Err(err(format!("{} has no out-of-place kernel", op.name()))),
        },
    }
}
