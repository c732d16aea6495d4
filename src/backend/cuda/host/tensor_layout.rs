//! Host-side layout facts for activations of any rank on the CUDA backend, no GPU needed. A
//! rank-5 value that a rank-5 kernel (conv, norm, pool...) or the pipeline touches is stored
//! NDHWC (physical order of its dims 0, 2, 3, 4, 1); every other value row-major, so a
//! `[N, D, H, W, C]` token tensor between transformer ops keeps its features contiguous and
//! its Linear is a dense GEMM. All fp16. Which nodes take the tensor path (`ops::tensor`) rather
//! than the rank-5 kernels, how each value is stored, and which Reshapes / Transposes are free,
//! is decided here once for the buffer plan and the launch list.

use crate::model::graph::{Graph, Op};
use crate::model::ops::Dims;

/// A value as the kernels address it: its logical dims and whether a rank-5 value is stored
/// NDHWC (else row-major; the flag means nothing at other ranks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stored {
    pub dims: Dims,
    pub ndhwc: bool,
}

impl Stored {
    /// The layout the rank-5 kernels use (row-major at other ranks).
    pub fn ndhwc(dims: Dims) -> Stored {
        Stored { dims, ndhwc: true }
    }

    /// Row-major at every rank.
    pub fn row_major(dims: Dims) -> Stored {
        Stored { dims, ndhwc: false }
    }

    /// The logical axes in physical order, outermost first.
    pub fn order(&self) -> Vec<usize> {
        if self.ndhwc && self.dims.rank() == 5 {
            vec![0, 2, 3, 4, 1]
        } else {
            (0..self.dims.rank()).collect()
        }
    }

    /// Element strides of each logical axis in the physical layout.
    pub fn strides(&self) -> Vec<i64> {
        let s = self.dims.as_slice();
        let mut st = vec![0i64; s.len()];
        let mut acc = 1i64;
        for &a in self.order().iter().rev() {
            st[a] = acc;
            acc *= s[a] as i64;
        }
        st
    }

    /// Whether the elements lie in row-major order of the logical index (row-major storage, or
    /// NDHWC with C or the spatial size 1, where it coincides with NCDHW).
    pub fn row_major_like(&self) -> bool {
        let d = &self.dims;
        !self.ndhwc || d.rank() != 5 || d[1] == 1 || d[2] * d[3] * d[4] == 1
    }
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

/// How every node runs and every value is stored.
#[derive(Clone, Debug, PartialEq)]
pub struct Paths {
    /// Per node: whether it runs on the tensor path.
    pub tensor: Vec<bool>,
    /// Per value: whether it is stored NDHWC ([`Stored`]).
    pub ndhwc: Vec<bool>,
}

impl Paths {
    /// Value `v` as the kernels address it, with its `dims`.
    pub fn stored(&self, v: usize, dims: Dims) -> Stored {
        Stored {
            dims,
            ndhwc: self.ndhwc[v],
        }
    }
}

/// The paths of `graph` on its `dims` at batch 1. A rank-5 value is NDHWC when the graph's
/// input or output is it, or a node only the rank-5 kernels run touches it (a conv, a norm, a
/// pool...), or it shares a unary node or a Pad with such a value (those kernels read and write
/// one layout). Of the others, a value is row-major when a node the tensor path must run
/// ([`tensor_node`]: Linear, LayerNorm, Transpose...) touches it, or a node either path can run
/// (a binary, softmax, concat or unary on NCDHW dims) joins it to one that is; the rest stay
/// NDHWC. An either-path node runs on the tensor path when it touches a row-major rank-5 value,
/// else on the rank-5 kernels (with epilogue fusion and in-place concat slices). A Pad runs on
/// its rank-5 kernel in either layout (`ops::pad`).
pub fn paths(graph: &Graph, dims: &[Dims]) -> Paths {
    let must: Vec<bool> = (0..graph.nodes.len())
        .map(|i| tensor_node(graph, dims, i))
        .collect();
    let pad = |i: usize| !must[i] && matches!(graph.nodes[i].op, Op::Pad(_));
    let either = |i: usize| !must[i] && tensor_supported(&graph.nodes[i].op);
    let nv = graph.values.len();
    let rank5 = |v: usize| dims.get(v).is_some_and(|d| d.rank() == 5);
    let touched = |i: usize| {
        let n = &graph.nodes[i];
        n.inputs.iter().copied().chain([n.output])
    };
    let mut root: Vec<usize> = (0..nv).collect();
    fn find(root: &mut [usize], mut v: usize) -> usize {
        while root[v] != v {
            root[v] = root[root[v]];
            v = root[v];
        }
        v
    }
    for (i, n) in graph.nodes.iter().enumerate() {
        if let [x] = n.inputs.as_slice() {
            if n.op.is_elementwise_unary() || pad(i) {
                let (a, b) = (find(&mut root, *x), find(&mut root, n.output));
                root[a] = b;
            }
        }
    }
    let cls: Vec<usize> = (0..nv).map(|v| find(&mut root, v)).collect();
    let (mut pinned, mut rows) = (vec![false; nv], vec![false; nv]);
    for v in [graph.input, graph.output] {
        pinned[cls[v]] = true;
    }
    for (i, &m) in must.iter().enumerate() {
        let mark = if m {
            &mut rows
        } else if either(i) || pad(i) {
            continue;
        } else {
            &mut pinned
        };
        for v in touched(i) {
            mark[cls[v]] = true;
        }
    }
    loop {
        let mut grew = false;
        for i in (0..graph.nodes.len()).filter(|&i| either(i)) {
            if touched(i).any(|v| rank5(v) && rows[cls[v]] && !pinned[cls[v]]) {
                for v in touched(i) {
                    grew |= rank5(v) && !rows[cls[v]] && !pinned[cls[v]];
                    rows[cls[v]] = true;
                }
            }
        }
        if !grew {
            break;
        }
    }
    let ndhwc: Vec<bool> = (0..nv)
        .map(|v| rank5(v) && (pinned[cls[v]] || !rows[cls[v]]))
        .collect();
    let tensor = (0..graph.nodes.len())
        .map(|i| must[i] || (either(i) && touched(i).any(|v| rank5(v) && !ndhwc[v])))
        .collect();
    Paths { tensor, ndhwc }
}

/// Whether data-movement node `i` reuses its input's buffer (no launch): a Reshape between two
/// values in row-major order of the logical index, or a Transpose that moves no element (an
/// NCDHW value stored NDHWC read as its `[N, D, H, W, C]` tokens stored row-major). Never for
/// the graph's input or output (their buffers are the pipeline's to fill and read).
pub fn aliases(graph: &Graph, st: &[Stored], i: usize) -> bool {
    let node = &graph.nodes[i];
    let (Some(&x), y) = (node.inputs.first(), node.output) else {
        return false;
    };
    if x == graph.input || y == graph.output {
        return false;
    }
    match &node.op {
        Op::Reshape { .. } => st[x].row_major_like() && st[y].row_major_like(),
        Op::Transpose { perm } => {
            let (xs, ys) = (st[x].strides(), st[y].strides());
            (0..ys.len())
                .all(|a| st[y].dims[a] == 1 || perm.get(a).is_some_and(|&p| xs[p] == ys[a]))
        }
        _ => false,
    }
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
        let nd = |s: &[usize]| Stored::ndhwc(d(s));
        assert_eq!(nd(&[2, 3, 4, 5, 6]).strides(), vec![360, 1, 90, 18, 3]);
        assert_eq!(nd(&[2, 3, 4]).strides(), vec![12, 4, 1]);
        assert_eq!(
            Stored::row_major(d(&[2, 3, 4, 5, 6])).strides(),
            vec![360, 120, 30, 6, 1]
        );
        assert!(nd(&[1, 1, 4, 5, 6]).row_major_like());
        assert!(nd(&[1, 7, 1, 1, 1]).row_major_like());
        assert!(!nd(&[1, 2, 1, 1, 3]).row_major_like());
        assert!(Stored::row_major(d(&[1, 2, 1, 1, 3])).row_major_like());
        assert!(nd(&[4, 5]).row_major_like());
    }

    /// conv -> Transpose to tokens -> LayerNorm -> Linear -> Add (residual) -> Transpose back
    /// -> conv: the tokens and the residual sum are row-major, the Add joins the tensor path,
    /// both Transposes move nothing; the convs' values stay NDHWC.
    #[test]
    fn token_tensors_are_row_major() {
        use crate::model::graph::Tensor;
        use crate::model::graph::{Node, Value};
        use crate::model::ops::{LayerNorm, Linear};
        let c = 8;
        let conv = || {
            Op::Conv(crate::model::ops::Conv {
                weight: Tensor::new(vec![c, c, 1, 1, 1], vec![0.0; c * c]),
                bias: None,
                stride: [1; 3],
                dilation: [1; 3],
                pads: [0; 6],
                groups: 1,
            })
        };
        let ops = vec![
            (conv(), vec![0]),
            (
                Op::Transpose {
                    perm: vec![0, 2, 3, 4, 1],
                },
                vec![1],
            ),
            (
                Op::LayerNorm(LayerNorm {
                    axis: -1,
                    eps: 1e-5,
                    scale: Tensor::new(vec![c], vec![1.0; c]),
                    bias: None,
                }),
                vec![2],
            ),
            (
                Op::Linear(Linear {
                    weight: Tensor::new(vec![c, c], vec![0.0; c * c]),
                    bias: None,
                }),
                vec![3],
            ),
            (Op::Add, vec![2, 4]),
            (
                Op::Transpose {
                    perm: vec![0, 4, 1, 2, 3],
                },
                vec![5],
            ),
            (conv(), vec![6]),
        ];
        let g = Graph {
            values: (0..=ops.len())
                .map(|i| Value {
                    name: format!("v{i}"),
                    // Axis 1 of the tokens [1, D, H, W, C] is D = 4.
                    channels: if (2..=6).contains(&i) { 4 } else { c },
                })
                .collect(),
            nodes: ops
                .into_iter()
                .enumerate()
                .map(|(i, (op, inputs))| Node {
                    name: format!("n{i}"),
                    op,
                    inputs,
                    output: i + 1,
                })
                .collect(),
            input: 0,
            output: 7,
            name: "tokens".into(),
            fixed_input_spatial: [None; 3],
        };
        let dims = g.infer_shapes(1, [4, 4, 4]).unwrap();
        let p = paths(&g, &dims);
        assert_eq!(p.tensor, vec![false, true, true, true, true, true, false]);
        assert_eq!(
            p.ndhwc,
            vec![true, true, false, false, false, false, true, true]
        );
        let st: Vec<Stored> = (0..dims.len()).map(|v| p.stored(v, dims[v])).collect();
        assert!(aliases(&g, &st, 1) && aliases(&g, &st, 5));
        // Stored NDHWC on both sides, the same Transpose moves every element.
        let nd: Vec<Stored> = dims.iter().map(|&d| Stored::ndhwc(d)).collect();
        assert!(!aliases(&g, &nd, 1));
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
