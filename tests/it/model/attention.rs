//! Attention fusion and the CPU attention kernel: hand-built IR graphs in the shape of the
//! UNETR (legacy / dynamo Einsum lowered to Transpose + MatMul) and SwinUNETR (q·scale, relative
//! position bias, shifted-window mask through a leading-dims Reshape) attention chains are fused
//! into one `Op::Attention`; the fused graph, run with the CPU kernel, matches the unfused one
//! run by a direct f64 interpreter here. Chains whose intermediates have a second reader stay.

use crate::common::rng::Rng;
use voxtile::internals::cpu::ops::attention;
use voxtile::model::fuse_attention;
use voxtile::model::graph::{Dims, Graph, Node, Op, Tensor, Value, ValueId};
use voxtile::model::ops::Attention;

// ---------- a graph builder and an f64 interpreter ----------

struct B {
    values: Vec<Value>,
    nodes: Vec<Node>,
}

impl B {
    fn new(cin: usize) -> B {
        B {
            values: vec![Value {
                name: "input".into(),
                channels: cin,
            }],
            nodes: vec![],
        }
    }
    fn op(&mut self, op: Op, inputs: &[ValueId], channels: usize) -> ValueId {
        let id = self.values.len();
        self.values.push(Value {
            name: format!("v{id}"),
            channels,
        });
        self.nodes.push(Node {
            name: format!("n{id}"),
            op,
            inputs: inputs.to_vec(),
            output: id,
        });
        id
    }
    fn graph(self, out: ValueId, sp: usize) -> Graph {
        Graph {
            name: "attn".into(),
            values: self.values,
            nodes: self.nodes,
            input: 0,
            output: out,
            fixed_input_spatial: [Some(sp); 3],
        }
    }
}

fn reshape(t: &[i64]) -> Op {
    Op::Reshape { target: t.to_vec() }
}
fn transpose(p: &[usize]) -> Op {
    Op::Transpose { perm: p.to_vec() }
}
fn konst(shape: &[usize], data: Vec<f32>) -> Tensor {
    Tensor::new(shape.to_vec(), data)
}

/// Source index of every element of `x` permuted by `perm`.
fn permute(x: &[f64], d: &Dims, perm: &[usize]) -> Vec<f64> {
    let od: Vec<usize> = perm.iter().map(|&p| d[p]).collect();
    let (is, os) = (d.strides(), Dims::new(&od).unwrap().strides());
    (0..x.len())
        .map(|i| {
            x[(0..od.len())
                .map(|a| (i / os[a]) % od[a] * is[perm[a]])
                .sum::<usize>()]
        })
        .collect()
}

/// Offset of the element of `shape` (broadcast to `out`) at flat index `i` of `out`.
fn bcast(i: usize, out: &[usize], shape: &[usize]) -> usize {
    let st = Dims::new(shape).unwrap().strides();
    let os = Dims::new(out).unwrap().strides();
    let k = out.len() - shape.len();
    (k..out.len())
        .map(|a| {
            if shape[a - k] == 1 {
                0
            } else {
                (i / os[a]) % out[a] * st[a - k]
            }
        })
        .sum()
}

/// Runs `g` on `x` in f64 (Attention through the crate's CPU kernel), returning the output.
fn run(g: &Graph, x: &[f64]) -> Vec<f64> {
    let sp = g.fixed_input_spatial.map(|s| s.unwrap());
    let shapes = g.infer_shapes(1, sp).expect("shapes");
    let mut vals: Vec<Option<Vec<f64>>> = vec![None; g.values.len()];
    vals[g.input] = Some(x.to_vec());
    for n in &g.nodes {
        let ins: Vec<&[f64]> = n
            .inputs
            .iter()
            .map(|&i| vals[i].as_deref().unwrap())
            .collect();
        let ds: Vec<Dims> = n.inputs.iter().map(|&i| shapes[i]).collect();
        let od = shapes[n.output];
        let o = od.as_slice();
        let y: Vec<f64> = match &n.op {
            Op::Reshape { .. } => ins[0].to_vec(),
            Op::Transpose { perm } => permute(ins[0], &ds[0], perm),
            Op::Gather { axis: 0, index } => {
                let per = od.numel();
                ins[0][*index as usize * per..][..per].to_vec()
            }
            Op::MulConst(t) | Op::AddConst(t) => (0..od.numel())
                .map(|i| {
                    let c = t.data[bcast(i, o, &t.shape)] as f64;
                    if matches!(n.op, Op::MulConst(_)) {
                        ins[0][i] * c
                    } else {
                        ins[0][i] + c
                    }
                })
                .collect(),
            Op::Softmax { axis } => {
                assert_eq!(*axis, od.rank() - 1);
                ins[0]
                    .chunks(o[o.len() - 1])
                    .flat_map(|r| {
                        let m = r.iter().cloned().fold(f64::MIN, f64::max);
                        let s: f64 = r.iter().map(|v| (v - m).exp()).sum();
                        r.iter().map(move |v| (v - m).exp() / s)
                    })
                    .collect()
            }
            Op::MatMul => {
                let (a, b) = (ds[0].as_slice(), ds[1].as_slice());
                let (m, k, nn) = (a[a.len() - 2], a[a.len() - 1], b[b.len() - 1]);
                let mut lead = o.to_vec();
                lead.truncate(o.len() - 2);
                let (mut la, mut lb) = (a[..a.len() - 2].to_vec(), b[..b.len() - 2].to_vec());
                let rows: usize = lead.iter().product::<usize>().max(1);
                lead.push(1);
                la.push(1);
                lb.push(1);
                let mut y = vec![0.0; od.numel()];
                for l in 0..rows {
                    let (oa, ob) = (bcast(l, &lead, &la) * m * k, bcast(l, &lead, &lb) * k * nn);
                    for i in 0..m {
                        for j in 0..nn {
                            y[(l * m + i) * nn + j] = (0..k)
                                .map(|p| ins[0][oa + i * k + p] * ins[1][ob + p * nn + j])
                                .sum();
                        }
                    }
                }
                y
            }
            Op::Attention(a) => {
                let (y, d) =
                    attention::<f64>(a, (ins[0], ds[0]), (ins[1], ds[1]), (ins[2], ds[2])).unwrap();
                assert_eq!(d, od);
                y
            }
            Op::Relu => ins[0].iter().map(|v| v.max(0.0)).collect(),
            op => panic!("test interpreter lacks {}", op.name()),
        };
        assert_eq!(y.len(), od.numel(), "{}", n.name);
        vals[n.output] = Some(y);
    }
    vals[g.output].take().unwrap()
}

fn count(g: &Graph, name: &str) -> usize {
    g.nodes.iter().filter(|n| n.op.name() == name).count()
}

/// Fuses a clone of `g`; checks the node counts and that both run to the same output.
fn fuse_and_compare(g: &Graph, fused_chains: usize, nodes_after: usize, seed: u64) -> Graph {
    let mut f = g.clone();
    assert_eq!(fuse_attention(&mut f), fused_chains);
    assert_eq!(
        f.nodes.len(),
        nodes_after,
        "{:#?}",
        f.nodes.iter().map(|n| n.op.name()).collect::<Vec<_>>()
    );
    assert_eq!(count(&f, "Attention"), fused_chains);
    assert_eq!(count(&f, "Softmax"), count(g, "Softmax") - fused_chains);
    f.validate().expect("the fused graph validates");
    let n: usize = g.values[0].channels
        * g.fixed_input_spatial
            .iter()
            .map(|s| s.unwrap())
            .product::<usize>();
    let mut r = Rng::new(seed);
    let x: Vec<f64> = (0..n).map(|_| r.uni() as f64 * 2.0).collect();
    let (a, b) = (run(g, &x), run(&f, &x));
    let err = a
        .iter()
        .zip(&b)
        .map(|(p, q)| (p - q).abs())
        .fold(0.0, f64::max);
    assert!(err <= 1e-6, "fused differs from unfused by {err}");
    f
}

// ---------- the exporters' chains ----------

/// tokens [1, L=8, 3·h·dh] from an input [1, C, 2, 2, 2] → q, k, v [1, h, 8, dh] (qkv reshape,
/// permute [2, 0, 3, 1, 4], Gather 0 / 1 / 2: what both UNETR exports write).
fn qkv(b: &mut B, h: usize, dh: usize) -> [ValueId; 3] {
    let c = 3 * h * dh;
    let t = b.op(reshape(&[1, c as i64, 8]), &[0], c);
    let t = b.op(transpose(&[0, 2, 1]), &[t], 8);
    let t = b.op(reshape(&[1, 8, 3, h as i64, dh as i64]), &[t], 8);
    let t = b.op(transpose(&[2, 0, 3, 1, 4]), &[t], 1);
    [0, 1, 2].map(|i| b.op(Op::Gather { axis: 0, index: i }, &[t], h))
}

/// heads [1, h, 8, dh] back to an NCDHW output [1, h·dh, 2, 2, 2].
fn merge(b: &mut B, x: ValueId, h: usize, dh: usize) -> ValueId {
    let c = h * dh;
    let t = b.op(transpose(&[0, 2, 1, 3]), &[x], 8);
    let t = b.op(reshape(&[1, 8, c as i64]), &[t], 8);
    let t = b.op(transpose(&[0, 2, 1]), &[t], c);
    b.op(reshape(&[1, c as i64, 2, 2, 2]), &[t], c)
}

fn scalar4(v: f32) -> Tensor {
    konst(&[1, 1, 1, 1], vec![v])
}

/// UNETR SABlock: einsum(q, k) lowered as MatMul(q, Transpose(k, [0,1,3,2])), Mul by the scale,
/// Softmax, einsum(p, v) as MatMul. `extra_reader`: the scores also feed a Relu.
fn unetr(extra_reader: bool) -> Graph {
    let (h, dh) = (2, 12);
    let mut b = B::new(3 * h * dh);
    let [q, k, v] = qkv(&mut b, h, dh);
    let kt = b.op(transpose(&[0, 1, 3, 2]), &[k], h);
    let s = b.op(Op::MatMul, &[q, kt], h);
    let s = b.op(Op::MulConst(scalar4(1.0 / (dh as f32).sqrt())), &[s], h);
    if extra_reader {
        b.op(Op::Relu, &[s], h);
    }
    let p = b.op(Op::Softmax { axis: 3 }, &[s], h);
    let o = b.op(Op::MatMul, &[p, v], h);
    let out = merge(&mut b, o, h, dh);
    b.graph(out, 2)
}

#[test]
fn unetr_chain_fuses_and_matches() {
    let g = unetr(false);
    let before = g.nodes.len();
    // MatMul, Transpose(k), Mul, Softmax go; the second MatMul becomes the Attention.
    let f = fuse_and_compare(&g, 1, before - 4, 1);
    let a = f.nodes.iter().find_map(|n| match &n.op {
        Op::Attention(a) => Some(a.clone()),
        _ => None,
    });
    let a = a.unwrap();
    assert_eq!(a.scale, 1.0 / 12f32.sqrt());
    assert!(a.bias.is_none());
}

#[test]
fn a_second_reader_keeps_the_chain() {
    let g = unetr(true);
    let mut f = g.clone();
    assert_eq!(fuse_attention(&mut f), 0);
    assert_eq!(f, g);
}

/// The scores graph output: nothing fuses either.
#[test]
fn scores_as_graph_output_keep_the_chain() {
    let mut g = unetr(false);
    let sm = g
        .nodes
        .iter()
        .position(|n| matches!(n.op, Op::Softmax { .. }))
        .unwrap();
    g.output = g.nodes[sm].output;
    let mut f = g.clone();
    assert_eq!(fuse_attention(&mut f), 0);
    assert_eq!(f, g);
}

/// k laid out [B, S, d, h] and transposed by [0, 3, 2, 1] to kᵀ [B, h, d, S]: the fused graph
/// reads k through one Transpose [0, 3, 1, 2] (the old one goes), and a Div lowered as MulConst.
#[test]
fn k_from_another_permutation() {
    let (h, dh) = (2, 12);
    let mut b = B::new(3 * h * dh);
    let [q, k, v] = qkv(&mut b, h, dh);
    let kx = b.op(transpose(&[0, 2, 3, 1]), &[k], 8);
    let kt = b.op(transpose(&[0, 3, 2, 1]), &[kx], h);
    let s = b.op(Op::MatMul, &[q, kt], h);
    let s = b.op(Op::MulConst(scalar4(0.25)), &[s], h);
    let p = b.op(Op::Softmax { axis: 3 }, &[s], h);
    let o = b.op(Op::MatMul, &[p, v], h);
    let out = merge(&mut b, o, h, dh);
    let g = b.graph(out, 2);
    let before = g.nodes.len();
    // MatMul, Mul, Softmax, old Transpose go; a new Transpose and the Attention come.
    let f = fuse_and_compare(&g, 1, before - 3, 2);
    assert!(f.nodes.iter().any(|n| n.op == transpose(&[0, 3, 1, 2])));
}

/// SwinUNETR WindowAttention on B_ = 8 windows of T = 8 tokens (B = 2 volumes of nW = 4
/// windows): q · scale, q @ kᵀ, + relative-position bias [1, h, T, T], view [B, nW, h, T, T] +
/// mask [1, nW, 1, T, T], view [B_, h, T, T], softmax, @ v.
#[test]
fn swin_window_chain_with_mask_fuses_and_matches() {
    let (h, dh, t, bw) = (2usize, 4usize, 8usize, 8usize);
    let c = 3 * h * dh;
    let mut b = B::new(c);
    let x = b.op(reshape(&[1, c as i64, 64]), &[0], c);
    let x = b.op(transpose(&[0, 2, 1]), &[x], 64);
    let x = b.op(
        reshape(&[bw as i64, t as i64, 3, h as i64, dh as i64]),
        &[x],
        t,
    );
    let x = b.op(transpose(&[2, 0, 3, 1, 4]), &[x], bw);
    let [q, k, v] = [0, 1, 2].map(|i| b.op(Op::Gather { axis: 0, index: i }, &[x], h));
    let q = b.op(Op::MulConst(scalar4(0.5)), &[q], h);
    let kt = b.op(transpose(&[0, 1, 3, 2]), &[k], h);
    let s = b.op(Op::MatMul, &[q, kt], h);
    let mut r = Rng::new(7);
    let rel = konst(&[1, h, t, t], r.vec(h * t * t));
    let s = b.op(Op::AddConst(rel), &[s], h);
    let s = b.op(reshape(&[-1, 4, h as i64, t as i64, t as i64]), &[s], 4);
    let mask: Vec<f32> = (0..4 * t * t)
        .map(|i| {
            if r.below(3) == 0 && i % 5 != 0 {
                -100.0
            } else {
                0.0
            }
        })
        .collect();
    let s = b.op(Op::AddConst(konst(&[1, 4, 1, t, t], mask)), &[s], 4);
    let s = b.op(reshape(&[-1, h as i64, t as i64, t as i64]), &[s], h);
    let p = b.op(Op::Softmax { axis: 3 }, &[s], h);
    let o = b.op(Op::MatMul, &[p, v], h);
    let o = b.op(transpose(&[0, 2, 1, 3]), &[o], t);
    let o = b.op(reshape(&[1, 64, (h * dh) as i64]), &[o], 64);
    let o = b.op(transpose(&[0, 2, 1]), &[o], h * dh);
    let out = b.op(reshape(&[1, (h * dh) as i64, 4, 4, 4]), &[o], h * dh);
    let g = b.graph(out, 4);
    let before = g.nodes.len();
    // q's Mul, Transpose(k), MatMul, 2 Adds, 2 Reshapes, Softmax go (8); Attention replaces @ v.
    let f = fuse_and_compare(&g, 1, before - 8, 3);
    let a = f.nodes.iter().find_map(|n| match &n.op {
        Op::Attention(a) => Some(a.clone()),
        _ => None,
    });
    let a = a.unwrap();
    assert_eq!(a.scale, 0.5);
    // The per-head bias and the window mask stay two terms (their sum would be [B_, h, T, T]);
    // the mask in the scores' layout: window = b_ % nW.
    assert_eq!(a.bias.unwrap().shape, vec![1, h, t, t]);
    assert_eq!(a.mask.unwrap().shape, vec![bw, 1, t, t]);
}

// ---------- the CPU kernel against a naive f64 reference ----------

/// softmax(scale · q kᵀ + bias + mask) v with every broadcast done by index arithmetic.
fn naive(
    a: &Attention,
    q: (&[f64], &[usize]),
    k: (&[f64], &[usize]),
    v: (&[f64], &[usize]),
) -> Vec<f64> {
    let r = q.1.len();
    let (t, d, s, dv) = (q.1[r - 2], q.1[r - 1], k.1[r - 2], v.1[r - 1]);
    let lead: Vec<usize> = (0..r - 2).map(|i| q.1[i].max(k.1[i]).max(v.1[i])).collect();
    let rows: usize = lead.iter().product();
    let mut out = vec![0.0; rows * t * dv];
    let (mut sc_shape, lq, lk, lv) = (lead.clone(), &q.1[..r - 2], &k.1[..r - 2], &v.1[..r - 2]);
    sc_shape.extend([t, s]);
    for l in 0..rows {
        let (oq, ok, ov) = (
            bcast(l, &lead, lq),
            bcast(l, &lead, lk),
            bcast(l, &lead, lv),
        );
        for i in 0..t {
            let sc: Vec<f64> = (0..s)
                .map(|j| {
                    let dot: f64 = (0..d)
                        .map(|p| q.0[(oq * t + i) * d + p] * k.0[(ok * s + j) * d + p])
                        .sum();
                    let b: f64 = [&a.bias, &a.mask]
                        .into_iter()
                        .flatten()
                        .map(|b| b.data[bcast((l * t + i) * s + j, &sc_shape, &b.shape)] as f64)
                        .sum();
                    a.scale as f64 * dot + b
                })
                .collect();
            let m = sc.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for c in 0..dv {
                out[(l * t + i) * dv + c] = (0..s)
                    .map(|j| e[j] * v.0[(ov * s + j) * dv + c])
                    .sum::<f64>()
                    / z;
            }
        }
    }
    out
}

#[test]
fn cpu_kernel_matches_naive_reference() {
    let mut r = Rng::tagged("cpu_attention");
    // q [2, 3, T=5, d=6], k [1, 3, S=7, 6], v [2, 1, 7, 4], bias [2, 1, 5, 7] / [1, 3, 1, 7],
    // mask [1, 3, 5, 7] / [2, 1, 1, 7].
    let (qs, ks, vs) = ([2, 3, 5, 6], [1, 3, 7, 6], [2, 1, 7, 4]);
    let n = |s: &[usize]| s.iter().product::<usize>();
    let (q, k, v) = (r.vec(n(&qs)), r.vec(n(&ks)), r.vec(n(&vs)));
    type Shape<'a> = Option<&'a [usize]>;
    let terms: [(Shape, Shape); 5] = [
        (None, None),
        (Some(&[2, 1, 5, 7]), None),
        (Some(&[1, 3, 1, 7]), None),
        (Some(&[2, 1, 5, 7]), Some(&[1, 3, 5, 7])),
        (None, Some(&[2, 1, 1, 7])),
    ];
    for (bias, mask) in terms {
        let a = Attention {
            scale: 0.7,
            bias: bias.map(|s| konst(s, r.scaled(n(s), 3.0))),
            mask: mask.map(|s| konst(s, r.scaled(n(s), 3.0))),
        };
        let f64s = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
        let (q64, k64, v64) = (f64s(&q), f64s(&k), f64s(&v));
        let want = naive(&a, (&q64, &qs), (&k64, &ks), (&v64, &vs));
        let dims = |s: &[usize]| Dims::new(s).unwrap();
        let (got, od) =
            attention::<f64>(&a, (&q64, dims(&qs)), (&k64, dims(&ks)), (&v64, dims(&vs))).unwrap();
        assert_eq!(od.as_slice(), &[2, 3, 5, 4]);
        let e64 = got
            .iter()
            .zip(&want)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        assert!(e64 <= 1e-12, "f64 kernel off by {e64}");
        let (g32, _) =
            attention::<f32>(&a, (&q, dims(&qs)), (&k, dims(&ks)), (&v, dims(&vs))).unwrap();
        let e32 = g32
            .iter()
            .zip(&want)
            .map(|(x, y)| (*x as f64 - y).abs())
            .fold(0.0, f64::max);
        assert!(e32 <= 1e-5, "f32 kernel off by {e32}");
    }
    // Bad input is an error, not a panic.
    let a = Attention {
        scale: 1.0,
        bias: None,
        mask: None,
    };
    let d = |s: &[usize]| Dims::new(s).unwrap();
    assert!(attention::<f32>(&a, (&q[..10], d(&qs)), (&k, d(&ks)), (&v, d(&vs))).is_err());
    assert!(attention::<f32>(&a, (&q, d(&qs)), (&k, d(&[1, 3, 7, 5])), (&v, d(&vs))).is_err());
}
