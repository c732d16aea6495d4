//! Where each value carries the batch, followed from the input through every op on batch-1
//! shapes: one axis whose size at batch `N` is `N ·` its batch-1 size, the batch being that
//! axis's outermost factor (Swin's windows `[B · nW, T, C]`, heads `[3, B · nW, h, T, d]`).
//! An op gets an axis only when its outputs stay one sample apart from another's at any
//! batch: no reduction, broadcast, slice or gather along the batch, constants of size 1 there
//! (an attention term may also repeat per sample). `None` = the batch cannot be followed.

use crate::model::graph::{Node, Op, Tensor};
use crate::model::ops::{norm_axis, Dims};

/// The batch axis of `node`'s output, given its inputs' batch-1 dims and batch axes and its
/// output's batch-1 dims.
pub(super) fn output_axis(node: &Node, ins: &[(Dims, usize)], out: &Dims) -> Option<usize> {
    let &(x, a) = ins.first()?;
    match &node.op {
        Op::Reshape { .. } => reshape_axis(&x, a, out),
        Op::Transpose { perm } => perm.iter().position(|&p| p == a),
        Op::Slice(s) => (s.resolve(&x).ok()?.axis != a).then_some(a),
        Op::Gather { axis, .. } => {
            let g = norm_axis(*axis, x.rank()).ok()?;
            (g != a).then_some(if g < a { a - 1 } else { a })
        }
        Op::Linear(_) => (a + 1 < x.rank()).then_some(a),
        Op::LayerNorm(l) => (a < norm_axis(l.axis, x.rank()).ok()?).then_some(a),
        Op::Softmax { axis } | Op::Concat { axis } => {
            let same = ins
                .iter()
                .all(|&(d, b)| b == a && d.rank() == x.rank() && d[a] == x[a]);
            (same && *axis != a).then_some(a)
        }
        Op::MatMul => leading_axis(ins, 2, out),
        Op::Attention(att) => {
            let o = leading_axis(ins, 2, out)?;
            att.terms()
                .all(|(_, t)| term_fits(t, o, out[o]))
                .then_some(o)
        }
        Op::Add | Op::Mul | Op::Sub | Op::Div | Op::Max | Op::Min | Op::Pow => {
            leading_axis(ins, 0, out)
        }
        Op::AddConst(t) | Op::MulConst(t) => {
            (t.shape.len() == x.rank() && t.shape[a] == 1).then_some(a)
        }
        op if op.is_elementwise_unary() => Some(a),
        // The positional NCDHW ops (convolutions, pools, norms, Pad, Resize, Tile, affines)
        // treat axis 0 as the batch.
        _ => (x.rank() == 5 && out.rank() == 5 && a == 0).then_some(0),
    }
}

/// The outermost axis of `out` whose preceding dims hold exactly the elements before axis `a`
/// of `x`: the batch, the outer factor of `x[a]`, is then the outer factor of that axis.
fn reshape_axis(x: &Dims, a: usize, out: &Dims) -> Option<usize> {
    let before: usize = x[..a].iter().product();
    let mut acc = 1usize;
    for (c, &d) in out.iter().enumerate() {
        if acc == before {
            return Some(c);
        }
        acc = acc.checked_mul(d)?;
    }
    None
}

/// The common batch axis of inputs broadcast against each other (right-aligned to `out`),
/// outside their last `skip` axes (a matrix product's rows and columns), of one size in all.
fn leading_axis(ins: &[(Dims, usize)], skip: usize, out: &Dims) -> Option<usize> {
    let mut at = None;
    for &(d, a) in ins {
        let o = (a + out.rank()).checked_sub(d.rank())?;
        if a + skip >= d.rank() || at.is_some_and(|p| p != o) || d[a] != out[o] {
            return None;
        }
        at = Some(o);
    }
    at
}

/// Whether an attention term (right-aligned to the scores, which have the output's rank) is
/// 1 along the batch axis `o` or the batch-1 size `n` there (then it repeats per sample).
fn term_fits(t: &Tensor, o: usize, n: usize) -> bool {
    matches!(t.shape.get(o), Some(&s) if s == 1 || s == n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &[usize]) -> Dims {
        Dims::new(s).unwrap()
    }

    #[test]
    fn reshape_moves_the_batch_to_the_axis_after_the_same_prefix() {
        // Window partition [B, 4, 6] -> [B, 2, 2, 6]; windows merged: [B·2, 2, 6] -> [B·2·2, 6].
        assert_eq!(reshape_axis(&d(&[1, 4, 6]), 0, &d(&[1, 2, 2, 6])), Some(0));
        assert_eq!(reshape_axis(&d(&[2, 2, 6]), 0, &d(&[4, 6])), Some(0));
        // Heads [3, B·nW, h, T, d] merged to [3 · B·nW, ...]: the batch is no longer outermost.
        assert_eq!(reshape_axis(&d(&[3, 2, 4, 5]), 1, &d(&[6, 4, 5])), None);
        assert_eq!(reshape_axis(&d(&[3, 2, 4, 5]), 1, &d(&[3, 8, 5])), Some(1));
    }

    #[test]
    fn leading_axes_align_right() {
        let (x, y) = (d(&[2, 3, 4, 5]), d(&[3, 5, 6]));
        let out = d(&[2, 3, 4, 6]);
        // x's batch axis 1 and y's axis 0 are the same output axis 1.
        assert_eq!(leading_axis(&[(x, 1), (y, 0)], 2, &out), Some(1));
        // A batch along the rows (axis 2 of x) is not a leading axis.
        assert_eq!(leading_axis(&[(x, 2), (y, 0)], 2, &out), None);
        assert_eq!(leading_axis(&[(x, 0), (y, 0)], 2, &out), None);
    }
}
