//! The CPU ops beyond the shared op-case table (`ops/`): conv and transposed-conv geometries,
//! concat, pools, resize and the executor (liveness, in place, errors, strided inputs) against
//! independent naive float64 implementations written straight from the ONNX definitions (direct
//! loops, gather formulations; conv, pool, norm and softmax in `ops::reference`), on
//! deterministic random inputs.
//! f32 path: rel L2 <= 1e-5; f64 path: rel L2 <= 1e-12. Run with `--nocapture` to see the numbers.

use crate::common::rng::Rng;
use ndarray::{Array5, ArrayView5, Axis};
use voxtile::backend::Backend;
use voxtile::internals::cpu::{ops, run_graph, run_graph_f64, CpuBackend};
use voxtile::model::graph::*;

use crate::ops::reference::{
    conv as naive_conv, conv_t as naive_conv_t, group_norm as naive_group_norm, pool as naive_pool,
    sh, softmax as naive_softmax,
};

// ---------- helpers ----------

fn f64a(x: &Array5<f32>) -> Array5<f64> {
    x.mapv(|v| v as f64)
}

fn rel_l2(got: &Array5<f64>, want: &Array5<f64>) -> f64 {
    assert_eq!(got.shape(), want.shape(), "shape mismatch");
    let mut num = 0.0;
    let mut den = 0.0;
    for (a, b) in got.iter().zip(want.iter()) {
        assert!(a.is_finite(), "non-finite output");
        num += (a - b) * (a - b);
        den += b * b;
    }
    (num / den.max(1e-300)).sqrt()
}

/// Runs `op` through the public dispatcher in f32 and f64 and compares both with `want`.
fn check(name: &str, op: &Op, inputs: &[&Array5<f32>], want: &Array5<f64>) {
    let v32: Vec<ArrayView5<f32>> = inputs.iter().map(|a| a.view()).collect();
    let i64s: Vec<Array5<f64>> = inputs.iter().map(|a| f64a(a)).collect();
    let v64: Vec<ArrayView5<f64>> = i64s.iter().map(|a| a.view()).collect();
    let got32 = ops::apply(op, &v32).unwrap_or_else(|e| panic!("{name}: {e}"));
    let got64 = ops::apply(op, &v64).unwrap_or_else(|e| panic!("{name}: {e}"));
    let e32 = rel_l2(&f64a(&got32), want);
    let e64 = rel_l2(&got64, want);
    eprintln!(
        "{name:<48} f32 relL2 {e32:.2e}   f64 relL2 {e64:.2e}   out {:?}",
        want.shape()
    );
    assert!(e32 <= 1e-5, "{name}: f32 rel L2 {e32:e}");
    assert!(e64 <= 1e-12, "{name}: f64 rel L2 {e64:e}");
}

// ---------- naive references (f64, straight from the ONNX definitions; conv, pool, norm
// and softmax are the shared ones, `ops::reference`) ----------

fn coord(mode: CoordMode, o: usize, scale: f32, i: usize, olen: usize) -> f32 {
    let xo = o as f32;
    match mode {
        CoordMode::HalfPixel => (xo + 0.5) / scale - 0.5,
        CoordMode::PytorchHalfPixel => {
            if olen > 1 {
                (xo + 0.5) / scale - 0.5
            } else {
                0.0
            }
        }
        CoordMode::AlignCorners => {
            if olen == 1 {
                0.0
            } else {
                xo * (i as f32 - 1.0) / (olen as f32 - 1.0)
            }
        }
        CoordMode::Asymmetric => xo / scale,
    }
}

fn naive_resize(x: &Array5<f64>, p: &Resize) -> Array5<f64> {
    let [n, c, d, h, w] = sh(x);
    let ins = [d, h, w];
    let os: [usize; 3] = match p.sizes {
        Some(s) => s,
        None => [0, 1, 2].map(|a| (ins[a] as f32 * p.scales[a]).floor() as usize),
    };
    let sc: [f32; 3] = match p.sizes {
        Some(s) => [0, 1, 2].map(|a| s[a] as f32 / ins[a] as f32),
        None => p.scales,
    };
    let clampi = |v: i64, len: usize| v.clamp(0, len as i64 - 1) as usize;
    let mut out = Array5::zeros([n, c, os[0], os[1], os[2]]);
    for ((b, ch, z, y, xx), o) in out.indexed_iter_mut() {
        let o3 = [z, y, xx];
        let cs: Vec<f32> = (0..3)
            .map(|a| coord(p.coord, o3[a], sc[a], ins[a], os[a]))
            .collect();
        *o = match p.mode {
            ResizeMode::Nearest => {
                let idx: Vec<usize> = (0..3)
                    .map(|a| {
                        let v = cs[a];
                        let r = match p.nearest {
                            NearestMode::RoundPreferFloor => {
                                if v == (v as i64) as f32 + 0.5 {
                                    v.floor()
                                } else {
                                    v.round()
                                }
                            }
                            NearestMode::RoundPreferCeil => {
                                if v == (v as i64) as f32 + 0.5 {
                                    v.ceil()
                                } else {
                                    v.round()
                                }
                            }
                            NearestMode::Floor => v.floor(),
                            NearestMode::Ceil => v.ceil(),
                        };
                        clampi(r as i64, ins[a])
                    })
                    .collect();
                x[[b, ch, idx[0], idx[1], idx[2]]]
            }
            ResizeMode::Linear => {
                // ONNX reference: two neighbours with edge padding, weights from the raw coordinate.
                let mut s = 0.0;
                for corner in 0..8 {
                    let mut wgt = 1.0;
                    let mut idx = [0usize; 3];
                    for a in 0..3 {
                        let v = cs[a] as f64;
                        let f = v.floor();
                        let hi = (corner >> (2 - a)) & 1 == 1;
                        let (i, wa) = if hi {
                            (f as i64 + 1, v - f)
                        } else {
                            (f as i64, 1.0 - (v - f))
                        };
                        idx[a] = clampi(i, ins[a]);
                        wgt *= wa;
                    }
                    s += wgt * x[[b, ch, idx[0], idx[1], idx[2]]];
                }
                s
            }
        };
    }
    out
}

/// A random conv's shape: `cin` -> `cout` channels, kernel `k`, the rest as ONNX names it
/// (`opad`: a ConvTranspose's output_padding; `bias`: a Conv has one).
#[derive(Clone, Copy)]
struct Spec {
    cin: usize,
    cout: usize,
    k: [usize; 3],
    stride: [usize; 3],
    dil: [usize; 3],
    pads: [usize; 6],
    opad: [usize; 3],
    groups: usize,
    bias: bool,
}

/// 1x1x1, stride 1, no dilation or pads, one group, with bias (channels 0: always set them).
const UNIT: Spec = Spec {
    cin: 0,
    cout: 0,
    k: [1; 3],
    stride: [1; 3],
    dil: [1; 3],
    pads: [0; 6],
    opad: [0; 3],
    groups: 1,
    bias: true,
};

impl Spec {
    /// `cin` -> `cout` with kernel `k`; the rest as [`UNIT`].
    fn new(cin: usize, cout: usize, k: [usize; 3]) -> Spec {
        Spec {
            cin,
            cout,
            k,
            ..UNIT
        }
    }
    fn stride(self, stride: [usize; 3]) -> Spec {
        Spec { stride, ..self }
    }
    fn dil(self, dil: [usize; 3]) -> Spec {
        Spec { dil, ..self }
    }
    fn pads(self, pads: [usize; 6]) -> Spec {
        Spec { pads, ..self }
    }
    fn opad(self, opad: [usize; 3]) -> Spec {
        Spec { opad, ..self }
    }
    fn groups(self, groups: usize) -> Spec {
        Spec { groups, ..self }
    }
    fn no_bias(self) -> Spec {
        Spec {
            bias: false,
            ..self
        }
    }
}

fn conv_p(rng: &mut Rng, s: Spec) -> Conv {
    let Spec {
        cin,
        cout,
        k,
        stride,
        dil,
        pads,
        groups,
        bias,
        ..
    } = s;
    Conv {
        weight: rng.tensor(&[cout, cin / groups, k[0], k[1], k[2]]),
        bias: bias.then(|| rng.tensor(&[cout])),
        stride,
        dilation: dil,
        pads,
        groups,
    }
}

// ---------- op tests ----------

#[test]
fn conv_variants() {
    let mut rng = Rng::new(1);
    let cases: Vec<(&str, [usize; 5], Conv)> = vec![
        (
            "conv 3^3 pad1",
            [2, 3, 6, 7, 5],
            conv_p(&mut rng, Spec::new(3, 4, [3, 3, 3]).pads([1; 6])),
        ),
        (
            "conv stride2 asym pads",
            [1, 4, 9, 8, 7],
            conv_p(
                &mut rng,
                Spec::new(4, 5, [3, 2, 3])
                    .stride([2, 2, 3])
                    .pads([0, 1, 2, 1, 0, 1]),
            ),
        ),
        (
            "conv dilation 2,1,3 pad",
            [1, 2, 9, 7, 10],
            conv_p(
                &mut rng,
                Spec::new(2, 3, [3, 3, 2])
                    .dil([2, 1, 3])
                    .pads([2, 1, 0, 1, 1, 3])
                    .no_bias(),
            ),
        ),
        (
            "conv groups 2",
            [2, 4, 5, 5, 5],
            conv_p(
                &mut rng,
                Spec::new(4, 6, [3, 3, 3])
                    .stride([1, 2, 1])
                    .pads([1; 6])
                    .groups(2),
            ),
        ),
        (
            "conv depthwise",
            [1, 3, 6, 6, 6],
            conv_p(&mut rng, Spec::new(3, 3, [3, 3, 3]).pads([1; 6]).groups(3)),
        ),
        (
            "conv 1x1x1",
            [2, 5, 4, 6, 3],
            conv_p(&mut rng, Spec::new(5, 7, [1, 1, 1])),
        ),
        (
            "conv 1x1x1 groups",
            [1, 4, 4, 3, 3],
            conv_p(&mut rng, Spec::new(4, 6, [1, 1, 1]).groups(2).no_bias()),
        ),
        (
            "conv 1x1x1 stride2 pad",
            [1, 3, 5, 5, 5],
            conv_p(
                &mut rng,
                Spec::new(3, 2, [1, 1, 1])
                    .stride([2, 2, 2])
                    .pads([1, 0, 1, 0, 1, 1]),
            ),
        ),
        (
            "conv kernel = input, no pad",
            [1, 2, 3, 3, 3],
            conv_p(&mut rng, Spec::new(2, 2, [3, 3, 3])),
        ),
        (
            "conv large pads",
            [1, 2, 3, 4, 2],
            conv_p(
                &mut rng,
                Spec::new(2, 3, [2, 2, 2]).pads([3, 2, 3, 2, 3, 4]),
            ),
        ),
    ];
    for (name, s, p) in cases {
        let x = rng.arr(s);
        let want = naive_conv(&f64a(&x), &p);
        check(name, &Op::Conv(p), &[&x], &want);
    }
}

#[test]
fn conv_chunked_column_buffer() {
    // Large enough that the im2col buffer is split over output rows (K*Wo*4 bytes per row).
    let mut rng = Rng::new(11);
    let p = conv_p(&mut rng, Spec::new(64, 4, [3, 3, 3]).pads([1; 6]));
    let x = rng.arr([1, 64, 2, 40, 520]);
    let rows_per_chunk = ops::COL_BUDGET_BYTES / (64 * 27 * 520 * 4);
    assert!(rows_per_chunk < 2 * 40, "test does not exercise chunking");
    let want = naive_conv(&f64a(&x), &p);
    check("conv chunked im2col", &Op::Conv(p), &[&x], &want);
}

/// A random ConvTranspose of shape `s` (always with a bias).
fn convt_p(rng: &mut Rng, s: Spec) -> ConvTranspose {
    let Spec {
        cin,
        cout,
        k,
        stride,
        dil,
        pads,
        opad: op,
        groups,
        ..
    } = s;
    ConvTranspose {
        weight: rng.tensor(&[cin, cout / groups, k[0], k[1], k[2]]),
        bias: Some(rng.tensor(&[cout])),
        stride,
        dilation: dil,
        pads,
        output_padding: op,
        groups,
    }
}

#[test]
fn conv_transpose_variants() {
    let mut rng = Rng::new(2);
    let cases: Vec<(&str, [usize; 5], ConvTranspose)> = vec![
        (
            "convT k2 s2",
            [2, 4, 3, 4, 5],
            convt_p(&mut rng, Spec::new(4, 3, [2, 2, 2]).stride([2, 2, 2])),
        ),
        (
            "convT k3 s2 pads [0,0,0,1,1,1] (TF SAME)",
            [1, 3, 4, 4, 4],
            convt_p(
                &mut rng,
                Spec::new(3, 2, [3, 3, 3])
                    .stride([2, 2, 2])
                    .pads([0, 0, 0, 1, 1, 1]),
            ),
        ),
        (
            "convT k3 s2 pad1 output_padding 1",
            [1, 2, 3, 5, 4],
            convt_p(
                &mut rng,
                Spec::new(2, 3, [3, 3, 3])
                    .stride([2, 2, 2])
                    .pads([1; 6])
                    .opad([1, 0, 1]),
            ),
        ),
        (
            "convT dilation 2 stride 3,1,2",
            [1, 2, 3, 4, 3],
            convt_p(
                &mut rng,
                Spec::new(2, 2, [2, 3, 2])
                    .stride([3, 1, 2])
                    .dil([2, 2, 1])
                    .pads([1, 0, 2, 0, 1, 1])
                    .opad([1, 0, 0]),
            ),
        ),
        (
            "convT groups 2",
            [2, 4, 3, 3, 4],
            convt_p(
                &mut rng,
                Spec::new(4, 6, [3, 2, 3])
                    .stride([2, 2, 1])
                    .pads([1, 0, 1, 1, 0, 1])
                    .groups(2),
            ),
        ),
        (
            "convT k1 s1",
            [1, 3, 3, 4, 5],
            convt_p(&mut rng, Spec::new(3, 4, [1, 1, 1])),
        ),
    ];
    for (name, s, p) in cases {
        let x = rng.arr(s);
        let want = naive_conv_t(&f64a(&x), &p);
        check(name, &Op::ConvTranspose(p), &[&x], &want);
    }
}

#[test]
fn concat_axes() {
    let mut rng = Rng::new(7);
    for axis in 0..5 {
        let mut s1 = [2, 3, 4, 3, 2];
        let mut s2 = s1;
        let mut s3 = s1;
        s1[axis] = 1;
        s2[axis] = 2;
        s3[axis] = 3;
        let (x1, x2, x3) = (rng.arr(s1), rng.arr(s2), rng.arr(s3));
        let mut want = Array5::zeros({
            let mut s = s1;
            s[axis] = 6;
            s
        });
        for ((i, j, k, l, m), v) in want.indexed_iter_mut() {
            let idx = [i, j, k, l, m];
            let t = idx[axis];
            let mut local = idx;
            *v = if t < 1 {
                x1[local] as f64
            } else if t < 3 {
                local[axis] = t - 1;
                x2[local] as f64
            } else {
                local[axis] = t - 3;
                x3[local] as f64
            };
        }
        check(
            &format!("Concat axis {axis}"),
            &Op::Concat { axis },
            &[&x1, &x2, &x3],
            &want,
        );
    }
}

#[test]
fn pools() {
    let mut rng = Rng::new(8);
    let pool = |k, s, d, pads, ceil, cip| Pool {
        kernel: k,
        stride: s,
        dilation: d,
        pads,
        ceil_mode: ceil,
        count_include_pad: cip,
    };
    let cases: Vec<(&str, [usize; 5], Pool)> = vec![
        (
            "k2 s2",
            [2, 3, 8, 6, 4],
            pool([2, 2, 2], [2, 2, 2], [1, 1, 1], [0; 6], false, false),
        ),
        (
            "k3 s2 pad1",
            [1, 2, 7, 6, 5],
            pool([3, 3, 3], [2, 2, 2], [1, 1, 1], [1; 6], false, false),
        ),
        (
            "k3 s2 pad1 count_include_pad",
            [1, 2, 7, 6, 5],
            pool([3, 3, 3], [2, 2, 2], [1, 1, 1], [1; 6], false, true),
        ),
        (
            "k2 s2 ceil_mode (odd)",
            [1, 2, 7, 5, 3],
            pool([2, 2, 2], [2, 2, 2], [1, 1, 1], [0; 6], true, false),
        ),
        (
            "k3 s2 ceil_mode pad1 cip",
            [1, 2, 8, 7, 6],
            pool([3, 3, 3], [2, 2, 2], [1, 1, 1], [1; 6], true, true),
        ),
        (
            "k3,2,2 s1,2,3 asym pads ceil",
            [1, 2, 6, 7, 8],
            pool(
                [3, 2, 2],
                [1, 2, 3],
                [1, 1, 1],
                [1, 0, 1, 0, 1, 0],
                true,
                false,
            ),
        ),
        (
            "k2 dilation 2 pad",
            [1, 2, 7, 6, 9],
            pool(
                [2, 2, 3],
                [1, 2, 2],
                [2, 2, 2],
                [1, 0, 2, 1, 1, 2],
                false,
                false,
            ),
        ),
    ];
    for (name, s, p) in cases {
        let x = rng.arr(s);
        let xf = f64a(&x);
        check(
            &format!("MaxPool {name}"),
            &Op::MaxPool(p.clone()),
            &[&x],
            &naive_pool(&xf, &p, true),
        );
        check(
            &format!("AveragePool {name}"),
            &Op::AveragePool(p.clone()),
            &[&x],
            &naive_pool(&xf, &p, false),
        );
    }
}

#[test]
fn resize_all_modes() {
    let mut rng = Rng::new(9);
    let x = rng.arr([1, 2, 4, 5, 3]);
    let xf = f64a(&x);
    let coords = [
        CoordMode::HalfPixel,
        CoordMode::PytorchHalfPixel,
        CoordMode::AlignCorners,
        CoordMode::Asymmetric,
    ];
    let nearests = [
        NearestMode::RoundPreferFloor,
        NearestMode::RoundPreferCeil,
        NearestMode::Floor,
        NearestMode::Ceil,
    ];
    let sizes_cases: [(Option<[usize; 3]>, [f32; 3]); 4] = [
        (None, [2.0, 2.0, 2.0]),
        (None, [1.5, 0.6, 2.5]),
        (Some([7, 3, 1]), [0.0; 3]),
        (Some([8, 10, 9]), [0.0; 3]),
    ];
    for (sizes, scales) in sizes_cases {
        for coord in coords {
            let p = Resize {
                mode: ResizeMode::Linear,
                coord,
                nearest: NearestMode::RoundPreferFloor,
                scales,
                sizes,
            };
            check(
                &format!("Resize linear {coord:?} {sizes:?} {scales:?}"),
                &Op::Resize(p.clone()),
                &[&x],
                &naive_resize(&xf, &p),
            );
            for nearest in nearests {
                let p = Resize {
                    mode: ResizeMode::Nearest,
                    coord,
                    nearest,
                    scales,
                    sizes,
                };
                check(
                    &format!("Resize nearest {coord:?} {nearest:?} {sizes:?}"),
                    &Op::Resize(p.clone()),
                    &[&x],
                    &naive_resize(&xf, &p),
                );
            }
        }
    }
}

// ---------- graph-level tests ----------

struct Builder {
    g: Graph,
}
impl Builder {
    fn new(cin: usize) -> Self {
        Builder {
            g: Graph {
                name: "test".into(),
                values: vec![Value {
                    name: "input".into(),
                    channels: cin,
                }],
                nodes: vec![],
                input: 0,
                output: 0,
                fixed_input_spatial: [None; 3],
            },
        }
    }
    fn add(&mut self, op: Op, inputs: &[usize], channels: usize) -> usize {
        let id = self.g.values.len();
        self.g.values.push(Value {
            name: format!("v{id}"),
            channels,
        });
        self.g.nodes.push(Node {
            name: format!("{}#{}", op.name(), self.g.nodes.len()),
            op,
            inputs: inputs.to_vec(),
            output: id,
        });
        self.g.output = id;
        id
    }
}

#[test]
fn small_unet_graph_matches_naive_composition() {
    let mut rng = Rng::new(10);
    let c1 = conv_p(&mut rng, Spec::new(2, 4, [3, 3, 3]).pads([1; 6]));
    let (s1, b1) = (rng.tensor(&[4]), rng.tensor(&[4]));
    let c2 = conv_p(
        &mut rng,
        Spec::new(4, 6, [3, 3, 3]).stride([2, 2, 2]).pads([1; 6]),
    );
    let ct = convt_p(&mut rng, Spec::new(6, 4, [2, 2, 2]).stride([2, 2, 2]));
    let c3 = conv_p(&mut rng, Spec::new(8, 3, [1, 1, 1]));

    let mut b = Builder::new(2);
    let v = b.add(Op::Conv(c1.clone()), &[0], 4);
    let v = b.add(
        Op::InstanceNorm {
            eps: 1e-5,
            scale: s1.clone(),
            bias: b1.clone(),
        },
        &[v],
        4,
    );
    let skip = b.add(Op::LeakyRelu { alpha: 0.01 }, &[v], 4);
    let v = b.add(Op::Conv(c2.clone()), &[skip], 6);
    let v = b.add(Op::Relu, &[v], 6);
    let v = b.add(Op::ConvTranspose(ct.clone()), &[v], 4);
    let v = b.add(Op::Concat { axis: 1 }, &[v, skip], 8);
    let v = b.add(Op::Conv(c3.clone()), &[v], 3);
    b.add(Op::Softmax { axis: 1 }, &[v], 3);
    let g = b.g;

    let x = rng.arr([2, 2, 6, 8, 4]);
    // Naive composition.
    let xf = f64a(&x);
    let a = naive_conv(&xf, &c1);
    let a = naive_group_norm(&a, 4, 1e-5f32 as f64, &s1.data, &b1.data);
    let skip_v = a.mapv(|v| if v >= 0.0 { v } else { 0.01f32 as f64 * v });
    let d = naive_conv(&skip_v, &c2).mapv(|v| v.max(0.0));
    let u = naive_conv_t(&d, &ct);
    let cat = ndarray::concatenate(Axis(1), &[u.view(), skip_v.view()]).unwrap();
    let want = naive_softmax(&naive_conv(&cat, &c3), 1);

    let mut be = CpuBackend::new();
    be.prepare(&g, 2, [6, 8, 4]).unwrap();
    let got = be.run(x.view()).unwrap();
    let e32 = rel_l2(&f64a(&got), &want);
    // A smaller batch than prepared is allowed.
    let got1 = be.run(x.slice(ndarray::s![1..2, .., .., .., ..])).unwrap();
    let e1 = rel_l2(
        &f64a(&got1),
        &want.slice(ndarray::s![1..2, .., .., .., ..]).to_owned(),
    );
    let got64 = run_graph_f64(&g, xf.view()).unwrap();
    let e64 = rel_l2(&got64, &want);
    let e_rg = rel_l2(&f64a(&run_graph(&g, x.view()).unwrap()), &want);
    eprintln!("graph: backend f32 {e32:.2e}, batch-1 {e1:.2e}, run_graph {e_rg:.2e}, f64 {e64:.2e}; stats {:?}", be.last_stats());
    assert!(
        e32 <= 1e-5 && e1 <= 1e-5 && e_rg <= 1e-5,
        "f32 graph rel L2 {e32:e} / {e1:e} / {e_rg:e}"
    );
    assert!(e64 <= 1e-12, "f64 graph rel L2 {e64:e}");
    // skip is alive across the down/up path, so at most input-free chain + skip + current.
    assert!(
        be.last_stats().peak_live_buffers <= 3,
        "{:?}",
        be.last_stats()
    );
}

#[test]
fn liveness_frees_intermediates() {
    let mut rng = Rng::new(12);
    let mut b = Builder::new(3);
    let mut v = 0;
    for _ in 0..8 {
        v = b.add(
            Op::Conv(conv_p(&mut rng, Spec::new(3, 3, [3, 3, 3]).pads([1; 6]))),
            &[v],
            3,
        );
        v = b.add(Op::Relu, &[v], 3);
    }
    // A dead branch (an extra head the output does not need) must not run.
    b.add(Op::Sigmoid, &[v], 3);
    let dead = b.g.output;
    let out = b.add(Op::Tanh, &[v], 3);
    assert_ne!(dead, out);
    let g = b.g;
    let mut be = CpuBackend::new();
    be.prepare(&g, 1, [5, 5, 5]).unwrap();
    let x = rng.arr([1, 3, 5, 5, 5]);
    be.run(x.view()).unwrap();
    let st = be.last_stats();
    eprintln!("liveness on a {}-node chain: {st:?}", g.nodes.len());
    // Conv: its input and output alive; Relu/Tanh run in place on the dying buffer.
    assert_eq!(st.peak_live_buffers, 2);
    assert_eq!(st.peak_live_bytes, 2 * 3 * 125 * 4);
    assert_eq!(st.nodes_run, g.nodes.len() - 1);
}

#[test]
fn inplace_does_not_clobber_shared_inputs() {
    // x feeds both Relu (in-place candidate) and a later Add: Relu must not overwrite x.
    let mut rng = Rng::new(13);
    let mut b = Builder::new(2);
    let r = b.add(Op::Relu, &[0], 2);
    let s = b.add(Op::Add, &[r, 0], 2);
    let _ = b.add(Op::Mul, &[s, s], 2);
    let x = rng.arr([1, 2, 3, 4, 5]);
    let xf = f64a(&x);
    let sum = &xf.mapv(|v| v.max(0.0)) + &xf;
    let want = &sum * &sum;
    let got = run_graph(&b.g, x.view()).unwrap();
    let e = rel_l2(&f64a(&got), &want);
    assert!(e <= 1e-6, "rel L2 {e}");
}

#[test]
fn errors_are_reported_not_panics() {
    let mut rng = Rng::new(14);
    let mut b = Builder::new(2);
    // Weight expects 3 input channels but the input has 2.
    b.add(
        Op::Conv(conv_p(&mut rng, Spec::new(3, 4, [3, 3, 3]).pads([1; 6]))),
        &[0],
        4,
    );
    let mut be = CpuBackend::new();
    let e = be.prepare(&b.g, 1, [4, 4, 4]).unwrap_err().to_string();
    assert!(e.contains("Conv#0") && e.contains("input channels"), "{e}");

    let mut be = CpuBackend::new();
    assert!(
        be.run(rng.arr([1, 2, 4, 4, 4]).view()).is_err(),
        "run before prepare"
    );

    let mut b = Builder::new(2);
    b.add(Op::Relu, &[0], 2);
    let mut be = CpuBackend::new();
    be.prepare(&b.g, 1, [4, 4, 4]).unwrap();
    assert!(
        be.run(rng.arr([1, 3, 4, 4, 4]).view()).is_err(),
        "wrong channels"
    );
    assert!(
        be.run(rng.arr([2, 2, 4, 4, 4]).view()).is_err(),
        "batch too large"
    );
    assert!(
        be.run(rng.arr([1, 2, 4, 4, 5]).view()).is_err(),
        "wrong window"
    );

    // Kernel larger than the padded input, mismatched binary shapes, bad const broadcast.
    let x = rng.arr([1, 2, 2, 2, 2]);
    let p = conv_p(&mut rng, Spec::new(2, 2, [3, 3, 3]).no_bias());
    assert!(ops::conv3d(x.view(), &p).is_err());
    let y = rng.arr([1, 2, 2, 2, 3]);
    assert!(ops::add(x.view(), y.view()).is_err());
    assert!(ops::add_const(x.view(), &rng.tensor(&[1, 3, 1, 1, 1])).is_err());
    assert!(ops::apply(&Op::Softmax { axis: 5 }, &[x.view()]).is_err());
    // Value used before it is computed.
    let mut b = Builder::new(2);
    b.add(Op::Add, &[0, 5], 2);
    assert!(CpuBackend::new().prepare(&b.g, 1, [2, 2, 2]).is_err());
    // A fixed-size model refuses another window.
    let mut b = Builder::new(2);
    b.add(Op::Relu, &[0], 2);
    b.g.fixed_input_spatial = [Some(4), None, None];
    assert!(CpuBackend::new().prepare(&b.g, 1, [5, 4, 4]).is_err());
}

#[test]
fn strided_view_input() {
    // A permuted (non-contiguous) view must give the same result as its contiguous copy.
    let mut rng = Rng::new(15);
    let x = rng.arr([1, 5, 4, 3, 2]);
    let v = x.view().permuted_axes([0, 4, 2, 3, 1]); // shape [1, 2, 4, 3, 5]
    let c = v.to_owned();
    let p = conv_p(&mut rng, Spec::new(2, 3, [3, 3, 3]).pads([1; 6]));
    let a = ops::conv3d(v, &p).unwrap();
    let b = ops::conv3d(c.view(), &p).unwrap();
    assert_eq!(a, b);
}

// ---------- timing (run: cargo test --test it cpu::ops::bench -- --ignored --nocapture) ----------

/// Process CPU seconds (user + system) from /proc/self/stat; 0 where unavailable.
fn cpu_seconds() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = s.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

/// Best wall time of n runs; also prints the CPU seconds of that best run, which is what the
/// work costs regardless of how loaded the (shared) machine is.
fn best_of<F: FnMut()>(n: usize, mut f: F) -> f64 {
    let mut best = f64::INFINITY;
    let mut best_cpu = 0.0;
    for _ in 0..n {
        let c = cpu_seconds();
        let t = std::time::Instant::now();
        f();
        let w = t.elapsed().as_secs_f64();
        if w < best {
            best = w;
            best_cpu = cpu_seconds() - c;
        }
    }
    eprintln!("    (best wall {best:.3} s, cpu {best_cpu:.2} s)");
    best
}

#[test]
#[ignore]
fn bench_conv_32_to_32_64cubed() {
    let mut rng = Rng::new(20);
    let p = conv_p(&mut rng, Spec::new(32, 32, [3, 3, 3]).pads([1; 6]));
    let x = rng.arr([1, 32, 64, 64, 64]);
    let t = best_of(3, || {
        ops::conv3d(x.view(), &p).unwrap();
    });
    let gflop = 2.0 * 32.0 * 32.0 * 27.0 * 64f64.powi(3) / 1e9;
    eprintln!(
        "conv 3^3 32->32 on 1x32x64^3: {:.3} s ({:.1} GFLOP/s, {} rayon threads)",
        t,
        gflop / t,
        rayon::current_num_threads()
    );
    let p1 = conv_p(&mut rng, Spec::new(32, 32, [1, 1, 1]));
    let t1 = best_of(3, || {
        ops::conv3d(x.view(), &p1).unwrap();
    });
    eprintln!("conv 1^3 32->32 on 1x32x64^3: {:.3} s", t1);
    let pt = convt_p(
        &mut rng,
        Spec::new(32, 16, [3, 3, 3])
            .stride([2, 2, 2])
            .pads([0, 0, 0, 1, 1, 1]),
    );
    let xt = rng.arr([1, 32, 32, 32, 32]);
    let tt = best_of(3, || {
        ops::conv_transpose3d(xt.view(), &pt).unwrap();
    });
    eprintln!("convT 3^3 s2 32->16 on 1x32x32^3 -> 64^3: {:.3} s", tt);
}

/// A deepbrain-like U-Net: two 3^3 conv+ReLU per level (16, 32, 64, 128 channels), MaxPool 2,
/// ConvTranspose 3^3 stride 2 with TF-SAME pads, skip Concat, 1^3 conv + Sigmoid.
fn unet_graph(rng: &mut Rng, feats: &[usize]) -> Graph {
    let mut b = Builder::new(1);
    let mut v = 0;
    let mut cin = 1;
    let mut skips = vec![];
    let c3 =
        |rng: &mut Rng, ci, co| Op::Conv(conv_p(rng, Spec::new(ci, co, [3, 3, 3]).pads([1; 6])));
    for (l, &f) in feats.iter().enumerate() {
        v = b.add(c3(rng, cin, f), &[v], f);
        v = b.add(Op::Relu, &[v], f);
        v = b.add(c3(rng, f, f), &[v], f);
        v = b.add(Op::Relu, &[v], f);
        cin = f;
        if l + 1 < feats.len() {
            skips.push((v, f));
            let pool = Pool {
                kernel: [2; 3],
                stride: [2; 3],
                dilation: [1; 3],
                pads: [0; 6],
                ceil_mode: false,
                count_include_pad: false,
            };
            v = b.add(Op::MaxPool(pool), &[v], f);
        }
    }
    while let Some((s, f)) = skips.pop() {
        let ct = convt_p(
            rng,
            Spec::new(cin, f, [3, 3, 3])
                .stride([2, 2, 2])
                .pads([0, 0, 0, 1, 1, 1]),
        );
        v = b.add(Op::ConvTranspose(ct), &[v], f);
        v = b.add(Op::Relu, &[v], f);
        v = b.add(Op::Concat { axis: 1 }, &[v, s], 2 * f);
        v = b.add(c3(rng, 2 * f, f), &[v], f);
        v = b.add(Op::Relu, &[v], f);
        v = b.add(c3(rng, f, f), &[v], f);
        v = b.add(Op::Relu, &[v], f);
        cin = f;
    }
    v = b.add(Op::Conv(conv_p(rng, Spec::new(cin, 1, [1, 1, 1]))), &[v], 1);
    b.add(Op::Sigmoid, &[v], 1);
    b.g
}

#[test]
#[ignore]
fn bench_unet() {
    let size: usize = std::env::var("UNET_SIZE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    let mut rng = Rng::new(21);
    let g = unet_graph(&mut rng, &[16, 32, 64, 128]);
    let x = rng.arr([1, 1, size, size, size]);
    let mut be = CpuBackend::new();
    be.prepare(&g, 1, [size; 3]).unwrap();
    let t = best_of(2, || {
        be.run(x.view()).unwrap();
    });
    eprintln!(
        "deepbrain-like U-Net (16..128 ch, {} nodes) on 1x1x{size}^3: {:.3} s; {:?}",
        g.nodes.len(),
        t,
        be.last_stats()
    );
}

#[test]
#[ignore]
fn bench_gemm_raw() {
    // Raw GEMM throughput for the conv's shapes, to separate GEMM from im2col cost.
    let mut rng = Rng::new(30);
    let (m, k, n) = (65536usize, 864usize, 32usize);
    let a = rng.vec(m * k);
    let b = rng.vec(k * n);
    let mut c = vec![0f32; m * n];
    for (name, rsa, csa) in [("A row-major", k, 1), ("A col-major", 1, m)] {
        let t = best_of(5, || unsafe {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                1.0,
                a.as_ptr(),
                rsa as isize,
                csa as isize,
                b.as_ptr(),
                1,
                k as isize,
                0.0,
                c.as_mut_ptr(),
                1,
                m as isize,
            );
        });
        eprintln!(
            "sgemm {m}x{k}x{n} {name}: {:.2} ms, {:.1} GFLOP/s",
            t * 1e3,
            2.0 * (m * k * n) as f64 / t / 1e9
        );
    }
    let t = best_of(5, || unsafe {
        matrixmultiply::sgemm(
            n,
            k,
            m,
            1.0,
            b.as_ptr(),
            k as isize,
            1,
            a.as_ptr(),
            1,
            k as isize,
            0.0,
            c.as_mut_ptr(),
            m as isize,
            1,
        );
    });
    eprintln!(
        "sgemm {n}x{k}x{m} (W·col): {:.2} ms, {:.1} GFLOP/s",
        t * 1e3,
        2.0 * (m * k * n) as f64 / t / 1e9
    );
    let q = 1024;
    let a = rng.vec(q * q);
    let b = rng.vec(q * q);
    let mut c = vec![0f32; q * q];
    let t = best_of(3, || unsafe {
        matrixmultiply::sgemm(
            q,
            q,
            q,
            1.0,
            a.as_ptr(),
            q as isize,
            1,
            b.as_ptr(),
            q as isize,
            1,
            0.0,
            c.as_mut_ptr(),
            q as isize,
            1,
        );
    });
    eprintln!(
        "sgemm {q}^3: {:.2} ms, {:.1} GFLOP/s",
        t * 1e3,
        2.0 * (q * q * q) as f64 / t / 1e9
    );
}
