//! Ops on activations of any rank (the tensor ops of transformer nets, and elementwise ops,
//! Softmax and Concat when an operand is not NCDHW). Values of other ranks are stored as
//! row-major data in 5D arrays of their [`Dims::folded5`] shape; these kernels read the data
//! with the logical dims the executor hands them.

use super::{err, Real};
use crate::model::graph::{Dims, Op};
use crate::Result;
use ndarray::{Array5, ArrayView5};

/// Runs `op` on `(data, dims)` operands, giving an array of `out`'s folded shape.
pub fn apply_tensor<T: Real>(
    op: &Op,
    ins: &[(ArrayView5<T>, Dims)],
    out: Dims,
) -> Result<Array5<T>> {
    let _ = (ins, out);
    Err(err(format!(
        "{} on activations of rank other than 5 is not implemented on the CPU yet",
        op.name()
    )))
}
