//! Host-side layout facts for activations of any rank on the CUDA backend, no GPU needed. A
//! rank-5 value is stored NDHWC (physical order of its dims 0, 2, 3, 4, 1, whatever they mean:
//! a `[N, D, H, W, C]` token tensor is stored as if it were NCDHW), every other rank row-major;
//! all fp16. Which nodes take the tensor path (`ops::tensor`) rather than the rank-5 kernels,
//! and which Reshapes are free, is decided here once for the buffer plan and the launch list.

use crate::model::graph::{Graph, Op};
use crate::model::ops::Dims;

/// Element strides of each logical axis of a value of dims `d` in its physical layout.
pub fn phys_strides(d: &Dims) -> Vec<i64> {
    let s = d.as_slice();
    let mut st = vec![0i64; s.len()];
    let mut acc = 1i64;
    for &a in phys_order(d).iter().rev() {
        st[a] = acc;
        acc *= s[a] as i64;
    }
    st
}

/// The logical axes of `d` in physical order, outermost first.
pub fn phys_order(d: &Dims) -> Vec<usize> {
    if d.rank() == 5 {
        vec![0, 2, 3, 4, 1]
    } else {
        (0..d.rank()).collect()
    }
}

/// Whether the elements of `d` lie in row-major order of its logical index (every rank but 5;
/// rank 5 when C or the spatial size is 1, so NDHWC and NCDHW coincide).
pub fn row_major_like(d: &Dims) -> bool {
    d.rank() != 5 || d[1] == 1 || d[2] * d[3] * d[4] == 1
}

/// Whether the rank-5 kernels (per-sample NDHWC, batch as N) can hold a value of dims `d`
/// inferred at batch 1: rank 5 with N = 1.
pub fn is_standard(d: &Dims) -> bool {
    d.rank() == 5 && d[0] == 1
}

/// Whether node `i` runs on the tensor path: a tensor op, a node touching a value the rank-5
/// kernels cannot hold, or a softmax / concat over an axis other than the channels.
pub fn tensor_node(graph: &Graph, dims: &[Dims], i: usize) -> bool {
    let node = &graph.nodes[i];
    let odd = |v: usize| dims.get(v).is_none_or(|d| !is_standard(d));
    node.op.is_tensor_op()
        || node.inputs.iter().any(|&v| odd(v))
        || odd(node.output)
        || matches!(node.op, Op::Softmax { axis } | Op::Concat { axis } if axis != 1)
}

/// Whether the tensor path implements `op` (the rest need standard rank-5 values).
pub fn tensor_supported(op: &Op) -> bool {
    op.is_tensor_op()
        || op.is_elementwise_unary()
        || matches!(
            op,
            Op::Softmax { .. }
                | Op::Concat { .. }
                | Op::Add
                | Op::Mul
                | Op::Sub
                | Op::Div
                | Op::Max
                | Op::Min
                | Op::Pow
                | Op::AddConst(_)
                | Op::MulConst(_)
        )
}

/// Whether Reshape node `i` reuses its input's buffer (no launch): both sides in row-major
/// order of the logical index, the input not the graph input and the output not the graph's
/// (their buffers are the pipeline's to fill and read).
pub fn reshape_aliases(graph: &Graph, dims: &[Dims], i: usize) -> bool {
    let node = &graph.nodes[i];
    let (x, y) = (node.inputs[0], node.output);
    matches!(node.op, Op::Reshape { .. })
        && x != graph.input
        && y != graph.output
        && row_major_like(&dims[x])
        && row_major_like(&dims[y])
}

/// One iteration axis of a strided launch: its size and the element stride of each operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Axis<const K: usize> {
    pub size: usize,
    pub strides: [i64; K],
}

/// Drops axes of size 1 and merges neighbours contiguous in every operand (outer stride =
/// inner stride x inner size), so kernels decompose as few dims as possible. Never empty.
pub fn merge_axes<const K: usize>(axes: &[Axis<K>]) -> Vec<Axis<K>> {
    let mut out: Vec<Axis<K>> = Vec::new();
    for a in axes.iter().filter(|a| a.size != 1) {
        if let Some(last) = out.last_mut() {
            let inner = *a;
            if (0..K).all(|k| last.strides[k] == inner.strides[k] * inner.size as i64) {
                last.size *= inner.size;
                last.strides = inner.strides;
                continue;
            }
        }
        out.push(*a);
    }
    if out.is_empty() {
        out.push(Axis {
            size: 1,
            strides: [0; K],
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &[usize]) -> Dims {
        Dims::new(s).unwrap()
    }

    #[test]
    fn strides_of_both_layouts() {
        // NDHWC: C innermost, then W, H, D, N.
        assert_eq!(phys_strides(&d(&[2, 3, 4, 5, 6])), vec![360, 1, 90, 18, 3]);
        assert_eq!(phys_strides(&d(&[2, 3, 4])), vec![12, 4, 1]);
        assert!(row_major_like(&d(&[1, 1, 4, 5, 6])));
        assert!(row_major_like(&d(&[1, 7, 1, 1, 1])));
        assert!(!row_major_like(&d(&[1, 2, 1, 1, 3])));
        assert!(row_major_like(&d(&[4, 5])));
    }

    #[test]
    fn merging_keeps_the_addressing() {
        let ax = |size, a, b| Axis {
            size,
            strides: [a, b],
        };
        // A contiguous [2, 3, 4] copy merges to one axis of 24.
        let m = merge_axes(&[ax(2, 12, 12), ax(3, 4, 4), ax(4, 1, 1)]);
        assert_eq!(m, vec![ax(24, 1, 1)]);
        // A transpose of the two last axes keeps them apart; size-1 axes vanish.
        let m = merge_axes(&[ax(1, 99, 99), ax(3, 1, 4), ax(4, 3, 1)]);
        assert_eq!(m, vec![ax(3, 1, 4), ax(4, 3, 1)]);
        assert_eq!(merge_axes::<2>(&[ax(1, 5, 5)]), vec![ax(1, 0, 0)]);
    }
}
