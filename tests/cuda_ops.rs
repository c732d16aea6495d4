//! GPU op tests: every op of the graph IR on the CUDA backend against an independent float64
//! reference (written here, NCDHW, scatter form for transposed convs) on random inputs.
//! A fresh seed per run (printed; VOXTILE_SEED=... to replay). Skips without a GPU unless
//! VOXTILE_REQUIRE_GPU=1. Every run poisons activation buffers with NaN first, so an unwritten
//! element fails the check. Run on the GPU machine with tests/gpu/run.sh.

mod common;
use common::rng::Rng;
use ndarray::{Array3, Array4, Array5};
use voxtile::internals::cuda::host::catalogue::{self as cat, halo_config, MmaConfig, MMA_CONFIGS};
use voxtile::internals::cuda::host::select::pick_halo;
use voxtile::internals::cuda::host::select::ConvGeom;
use voxtile::internals::cuda::stream::WindowJob;
use voxtile::internals::cuda::{CudaBackend, CudaOptions};
use voxtile::model::graph::*;

// ---------- helpers ----------

/// Switches the backend's options (kernel variants apply from the next `prepare`).
trait Opts {
    fn with(&mut self, f: impl FnOnce(&mut CudaOptions));
}

impl Opts for CudaBackend {
    fn with(&mut self, f: impl FnOnce(&mut CudaOptions)) {
        let mut o = *self.options();
        f(&mut o);
        self.set_options(o);
    }
}

/// The mma tile named `name` (a catalogue entry's name).
fn mma_named(name: &str) -> &'static MmaConfig {
    MMA_CONFIGS
        .iter()
        .find(|c| c.name == name)
        .expect("an mma tile")
}

/// The halo kernel named `name` (a catalogue entry's name).
fn halo_named(name: &str) -> &'static cat::HaloConfig {
    halo_config(name).expect("a halo kernel")
}

/// The halo kernel the planner picks by default for a stride-1 3^3 conv (227 KiB of smem).
fn default_halo(cin: usize, cout: usize, k: usize, st: usize) -> Option<&'static cat::HaloConfig> {
    let g = ConvGeom {
        xs: [cin, 8, 8, 8],
        os: [cout, 8, 8, 8],
        k: [k; 3],
        stride: [st; 3],
        dil: [1; 3],
        pads: [1; 3],
        groups: 1,
        transposed: false,
        upsample: false,
    };
    pick_halo(&g, 227 * 1024, None)
}

fn gpu() -> Option<CudaBackend> {
    let mut b = common::cuda_backend()?;
    println!(
        "{} ({}), kernel families from the PTX cache: {}",
        b.name(),
        b.arch(),
        b.ptx_from_cache
    );
    b.with(|o| o.poison = true);
    Some(b)
}

/// f64 NCDHW tensor.
#[derive(Clone, Debug)]
struct T {
    s: [usize; 5],
    d: Vec<f64>,
}
impl T {
    fn zeros(s: [usize; 5]) -> T {
        T {
            s,
            d: vec![0.0; s.iter().product()],
        }
    }
    fn from(s: [usize; 5], v: &[f32]) -> T {
        T {
            s,
            d: v.iter().map(|&x| x as f64).collect(),
        }
    }
    fn idx(&self, n: usize, c: usize, z: usize, y: usize, x: usize) -> usize {
        (((n * self.s[1] + c) * self.s[2] + z) * self.s[3] + y) * self.s[4] + x
    }
    fn at(&self, n: usize, c: usize, z: usize, y: usize, x: usize) -> f64 {
        self.d[self.idx(n, c, z, y, x)]
    }
    fn map(&self, f: impl Fn(usize, f64) -> f64) -> T {
        let sp = self.s[2] * self.s[3] * self.s[4];
        T {
            s: self.s,
            d: self
                .d
                .iter()
                .enumerate()
                .map(|(i, &v)| f((i / sp) % self.s[1], v))
                .collect(),
        }
    }
}

fn rel_l2(got: &Array5<f32>, want: &T) -> f64 {
    assert_eq!(got.shape(), &want.s[..], "output shape");
    let mut num = 0.0;
    let mut den = 0.0;
    for (g, w) in got.iter().zip(&want.d) {
        assert!(
            g.is_finite(),
            "non-finite output {g} (unwritten or overflow)"
        );
        num += (*g as f64 - w) * (*g as f64 - w);
        den += w * w;
    }
    assert!(
        den > 0.0,
        "reference is all zeros: the test would prove nothing"
    );
    (num / den).sqrt()
}

/// A graph of nodes applied in order (see [`common::graph::chain`]).
fn graph(cin: usize, nodes: Vec<(Op, Vec<usize>, usize)>) -> Graph {
    common::graph::chain("t", cin, nodes)
}

fn run(b: &mut CudaBackend, g: &Graph, x: &T, batch: usize) -> Array5<f32> {
    let roi = [x.s[2], x.s[3], x.s[4]];
    b.prepare(g, batch, roi).expect("prepare");
    let inp = Array5::from_shape_vec(x.s, x.d.iter().map(|&v| v as f32).collect()).unwrap();
    b.run(inp.view()).expect("run")
}

const TOL: f64 = 1e-2;

fn report(name: &str, e: f64) {
    println!(
        "RESULT {name:<40} rel_l2 {e:.2e} {}",
        if e <= TOL { "ok" } else { "FAIL" }
    );
    assert!(e <= TOL, "{name}: rel L2 {e:.3e} > {TOL}");
}

// ---------- f64 references ----------

/// A conv's geometry as the reference takes it (`transposed`: ConvTranspose, `opad` its output
/// padding).
#[derive(Clone, Copy)]
struct Kernel {
    st: [usize; 3],
    dl: [usize; 3],
    pads: [usize; 6],
    groups: usize,
    transposed: bool,
    opad: [usize; 3],
}

/// Stride 1, no dilation, no pads, one group, forward.
const PLAIN: Kernel = Kernel {
    st: [1; 3],
    dl: [1; 3],
    pads: [0; 6],
    groups: 1,
    transposed: false,
    opad: [0; 3],
};

/// [`PLAIN`] with pads 1 on every side (a "same" 3^3 conv).
const PAD1: Kernel = Kernel {
    pads: [1; 6],
    ..PLAIN
};

fn conv_ref(x: &T, w: &Tensor, bias: Option<&Tensor>, geo: Kernel) -> T {
    let Kernel {
        st,
        dl,
        pads,
        groups,
        transposed,
        opad,
    } = geo;
    let ws = &w.shape;
    let (n, cin) = (x.s[0], x.s[1]);
    let k = [ws[2], ws[3], ws[4]];
    let cout = if transposed { ws[1] * groups } else { ws[0] };
    let mut o = [n, cout, 0, 0, 0];
    for a in 0..3 {
        let i = x.s[a + 2];
        o[a + 2] = if transposed {
            (i - 1) * st[a] + dl[a] * (k[a] - 1) + opad[a] + 1 - pads[a] - pads[a + 3]
        } else {
            (i + pads[a] + pads[a + 3] - dl[a] * (k[a] - 1) - 1) / st[a] + 1
        };
    }
    let mut y = T::zeros(o);
    let (cin_g, cout_g) = (cin / groups, cout / groups);
    let wat = |a: usize, b: usize, z: usize, yy: usize, xx: usize| {
        w.data[(((a * ws[1] + b) * k[0] + z) * k[1] + yy) * k[2] + xx] as f64
    };
    if !transposed {
        for nn in 0..n {
            for co in 0..cout {
                let g = co / cout_g;
                for oz in 0..o[2] {
                    for oy in 0..o[3] {
                        for ox in 0..o[4] {
                            let mut s = bias.map_or(0.0, |b| b.data[co] as f64);
                            for cl in 0..cin_g {
                                for kz in 0..k[0] {
                                    let iz = (oz * st[0] + kz * dl[0]) as isize - pads[0] as isize;
                                    if iz < 0 || iz >= x.s[2] as isize {
                                        continue;
                                    }
                                    for ky in 0..k[1] {
                                        let iy =
                                            (oy * st[1] + ky * dl[1]) as isize - pads[1] as isize;
                                        if iy < 0 || iy >= x.s[3] as isize {
                                            continue;
                                        }
                                        for kx in 0..k[2] {
                                            let ix = (ox * st[2] + kx * dl[2]) as isize
                                                - pads[2] as isize;
                                            if ix < 0 || ix >= x.s[4] as isize {
                                                continue;
                                            }
                                            s += x.at(
                                                nn,
                                                g * cin_g + cl,
                                                iz as usize,
                                                iy as usize,
                                                ix as usize,
                                            ) * wat(co, cl, kz, ky, kx);
                                        }
                                    }
                                }
                            }
                            let i = y.idx(nn, co, oz, oy, ox);
                            y.d[i] = s;
                        }
                    }
                }
            }
        }
    } else {
        // Scatter form: every input voxel adds its kernel footprint to the output.
        for nn in 0..n {
            for co in 0..cout {
                if let Some(b) = bias {
                    for z in 0..o[2] {
                        for yy in 0..o[3] {
                            for xx in 0..o[4] {
                                let i = y.idx(nn, co, z, yy, xx);
                                y.d[i] = b.data[co] as f64;
                            }
                        }
                    }
                }
            }
            for ci in 0..cin {
                let g = ci / cin_g;
                for iz in 0..x.s[2] {
                    for iy in 0..x.s[3] {
                        for ix in 0..x.s[4] {
                            let v = x.at(nn, ci, iz, iy, ix);
                            for cl in 0..cout_g {
                                for kz in 0..k[0] {
                                    let oz = (iz * st[0] + kz * dl[0]) as isize - pads[0] as isize;
                                    if oz < 0 || oz >= o[2] as isize {
                                        continue;
                                    }
                                    for ky in 0..k[1] {
                                        let oy =
                                            (iy * st[1] + ky * dl[1]) as isize - pads[1] as isize;
                                        if oy < 0 || oy >= o[3] as isize {
                                            continue;
                                        }
                                        for kx in 0..k[2] {
                                            let ox = (ix * st[2] + kx * dl[2]) as isize
                                                - pads[2] as isize;
                                            if ox < 0 || ox >= o[4] as isize {
                                                continue;
                                            }
                                            let i = y.idx(
                                                nn,
                                                g * cout_g + cl,
                                                oz as usize,
                                                oy as usize,
                                                ox as usize,
                                            );
                                            y.d[i] += v * wat(ci, cl, kz, ky, kx);
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    y
}

fn act_ref(op: &Op, c: usize, v: f64) -> f64 {
    match op {
        Op::Relu => v.max(0.0),
        Op::LeakyRelu { alpha } => {
            if v >= 0.0 {
                v
            } else {
                *alpha as f64 * v
            }
        }
        Op::PRelu { slope } => {
            if v >= 0.0 {
                v
            } else {
                slope.data[if slope.len() == 1 { 0 } else { c }] as f64 * v
            }
        }
        Op::Elu { alpha } => {
            if v > 0.0 {
                v
            } else {
                *alpha as f64 * (v.exp() - 1.0)
            }
        }
        Op::Sigmoid => 1.0 / (1.0 + (-v).exp()),
        Op::Tanh => v.tanh(),
        _ => unreachable!(),
    }
}

fn norm_ref(x: &T, groups: usize, eps: f32, scale: &Tensor, bias: &Tensor) -> T {
    let [n, c, d, h, w] = x.s;
    let sp = d * h * w;
    let cg = c / groups;
    let mut y = x.clone();
    for nn in 0..n {
        for g in 0..groups {
            let range = (nn * c + g * cg) * sp..(nn * c + (g + 1) * cg) * sp;
            let cnt = range.len() as f64;
            let mean = x.d[range.clone()].iter().sum::<f64>() / cnt;
            let var = x.d[range.clone()]
                .iter()
                .map(|v| (v - mean) * (v - mean))
                .sum::<f64>()
                / cnt;
            for i in range {
                let ch = (i / sp) % c;
                y.d[i] = (x.d[i] - mean) / (var + eps as f64).sqrt() * scale.data[ch] as f64
                    + bias.data[ch] as f64;
            }
        }
    }
    y
}

fn pool_ref(x: &T, p: &Pool, max: bool, o: [usize; 3]) -> T {
    let [n, c, d, h, w] = x.s;
    let mut y = T::zeros([n, c, o[0], o[1], o[2]]);
    for nn in 0..n {
        for cc in 0..c {
            for oz in 0..o[0] {
                for oy in 0..o[1] {
                    for ox in 0..o[2] {
                        let (mut m, mut s, mut cnt, mut cntp) =
                            (f64::NEG_INFINITY, 0.0, 0usize, 0usize);
                        for kz in 0..p.kernel[0] {
                            for ky in 0..p.kernel[1] {
                                for kx in 0..p.kernel[2] {
                                    let iz = (oz * p.stride[0] + kz * p.dilation[0]) as isize
                                        - p.pads[0] as isize;
                                    let iy = (oy * p.stride[1] + ky * p.dilation[1]) as isize
                                        - p.pads[1] as isize;
                                    let ix = (ox * p.stride[2] + kx * p.dilation[2]) as isize
                                        - p.pads[2] as isize;
                                    let inpad = iz < (d + p.pads[3]) as isize
                                        && iy < (h + p.pads[4]) as isize
                                        && ix < (w + p.pads[5]) as isize;
                                    if inpad {
                                        cntp += 1;
                                    }
                                    if iz < 0
                                        || iy < 0
                                        || ix < 0
                                        || iz >= d as isize
                                        || iy >= h as isize
                                        || ix >= w as isize
                                    {
                                        continue;
                                    }
                                    let v = x.at(nn, cc, iz as usize, iy as usize, ix as usize);
                                    m = m.max(v);
                                    s += v;
                                    cnt += 1;
                                }
                            }
                        }
                        let i = y.idx(nn, cc, oz, oy, ox);
                        y.d[i] = if max {
                            m
                        } else {
                            s / (if p.count_include_pad { cntp } else { cnt }) as f64
                        };
                    }
                }
            }
        }
    }
    y
}

// ---------- tests ----------

/// One random conv (or transposed conv) test: `cin` -> `cout` on a batch of 2 `sp` volumes,
/// kernel `k`, then `act` when given.
struct ConvCase<'a> {
    name: &'a str,
    cin: usize,
    cout: usize,
    sp: [usize; 3],
    k: [usize; 3],
    geo: Kernel,
    act: Option<Op>,
}

impl<'a> ConvCase<'a> {
    /// `cin` -> `cout` on `sp`, a `k`^3 kernel, [`PLAIN`], no activation.
    fn new(name: &'a str, cin: usize, cout: usize, sp: [usize; 3], k: usize) -> Self {
        ConvCase {
            name,
            cin,
            cout,
            sp,
            k: [k; 3],
            geo: PLAIN,
            act: None,
        }
    }
    fn k(self, k: [usize; 3]) -> Self {
        ConvCase { k, ..self }
    }
    fn st(mut self, st: [usize; 3]) -> Self {
        self.geo.st = st;
        self
    }
    fn dl(mut self, dl: [usize; 3]) -> Self {
        self.geo.dl = dl;
        self
    }
    fn pads(mut self, pads: [usize; 6]) -> Self {
        self.geo.pads = pads;
        self
    }
    fn groups(mut self, groups: usize) -> Self {
        self.geo.groups = groups;
        self
    }
    fn opad(mut self, opad: [usize; 3]) -> Self {
        self.geo.opad = opad;
        self
    }
    fn act(self, act: Option<Op>) -> Self {
        ConvCase { act, ..self }
    }
}

fn conv_case(b: &mut CudaBackend, r: &mut Rng, c: ConvCase<'_>) {
    let ConvCase {
        name,
        cin,
        cout,
        sp,
        k,
        geo,
        act,
    } = c;
    let Kernel {
        st,
        dl,
        pads,
        groups,
        ..
    } = geo;
    let x = T::from(
        [2, cin, sp[0], sp[1], sp[2]],
        &r.scaled(2 * cin * sp.iter().product::<usize>(), 1.0),
    );
    let fan = (cin / groups * k.iter().product::<usize>()) as f32;
    let w = Tensor::new(
        vec![cout, cin / groups, k[0], k[1], k[2]],
        r.scaled(
            cout * cin / groups * k.iter().product::<usize>(),
            1.0 / fan.sqrt(),
        ),
    );
    let bias = Tensor::new(vec![cout], r.scaled(cout, 0.5));
    let conv = Conv {
        weight: w.clone(),
        bias: Some(bias.clone()),
        stride: st,
        dilation: dl,
        pads,
        groups,
    };
    let mut nodes = vec![(Op::Conv(conv), vec![0], cout)];
    let mut want = conv_ref(&x, &w, Some(&bias), geo);
    if let Some(a) = act {
        want = want.map(|c, v| act_ref(&a, c, v));
        nodes.push((a, vec![1], cout));
    }
    let got = run(b, &graph(cin, nodes), &x, 2);
    report(name, rel_l2(&got, &want));
}

#[test]
fn conv_variants() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("conv");
    // Even Cin that is not a multiple of 8: the 4-byte gather tiles (`_v2`); the 1x1x1 head
    // kernel with Cout 17..32 and a fused activation.
    for (name, ci, co, k, st, pads) in [
        (
            "3^3 14->14 (v2 gather)",
            14usize,
            14usize,
            3usize,
            1usize,
            1usize,
        ),
        ("3^3 s2 6->40 (v2 gather)", 6, 40, 3, 2, 1),
        ("1x1 head 40->20 (conv1x1_n32)", 40, 20, 1, 1, 0),
    ] {
        conv_case(
            &mut b,
            &mut r,
            ConvCase::new(name, ci, co, [9, 7, 11], k)
                .st([st; 3])
                .pads([pads; 6])
                .act(Some(Op::LeakyRelu { alpha: 0.1 })),
        );
    }
    for c in [
        ConvCase::new("conv 3^3 16->32 pad1", 16, 32, [10, 9, 11], 3).pads([1; 6]),
        ConvCase::new("conv 3^3 32->32 pad1 +leaky", 32, 32, [8, 8, 8], 3)
            .pads([1; 6])
            .act(Some(Op::LeakyRelu { alpha: 0.01 })),
        ConvCase::new("conv 3^3 stride2 16->64", 16, 64, [12, 10, 9], 3)
            .st([2; 3])
            .pads([1; 6]),
        ConvCase::new(
            "conv 3^3 dilation 4 pad 4 (meshnet) +elu",
            8,
            20,
            [12, 12, 12],
            3,
        )
        .dl([4; 3])
        .pads([4; 6])
        .act(Some(Op::Elu { alpha: 1.0 })),
        ConvCase::new("conv Cin=1 3^3 -> 8 +relu", 1, 8, [11, 10, 9], 3)
            .pads([1; 6])
            .act(Some(Op::Relu)),
        ConvCase::new("conv Cin=3 asym pads 2x3x1 s(1,2,1)", 3, 40, [9, 10, 8], 1)
            .k([2, 3, 1])
            .st([1, 2, 1])
            .pads([0, 1, 0, 1, 2, 0]),
        ConvCase::new("conv 1x1x1 head 32->4 +sigmoid", 32, 4, [8, 9, 10], 1)
            .act(Some(Op::Sigmoid)),
        ConvCase::new("conv 1x1x1 head 20->3", 20, 3, [8, 9, 10], 1),
        ConvCase::new("conv 80->80 3^3 (Cout>64) +tanh", 80, 80, [6, 6, 6], 3)
            .pads([1; 6])
            .act(Some(Op::Tanh)),
        ConvCase::new("conv grouped g=4 16->16", 16, 16, [8, 8, 8], 3)
            .pads([1; 6])
            .groups(4),
    ] {
        conv_case(&mut b, &mut r, c);
    }
    let slope = Tensor::new(vec![8], r.scaled(8, 0.5));
    conv_case(
        &mut b,
        &mut r,
        ConvCase::new("conv depthwise g=8 8->8 +prelu", 8, 8, [7, 8, 9], 3)
            .pads([1; 6])
            .groups(8)
            .act(Some(Op::PRelu { slope })),
    );
}

fn convt_case(b: &mut CudaBackend, r: &mut Rng, c: ConvCase<'_>) {
    let ConvCase {
        name,
        cin,
        cout,
        sp,
        k,
        geo,
        ..
    } = c;
    let geo = Kernel {
        transposed: true,
        ..geo
    };
    let Kernel {
        st,
        pads,
        groups,
        opad,
        ..
    } = geo;
    let x = T::from(
        [2, cin, sp[0], sp[1], sp[2]],
        &r.scaled(2 * cin * sp.iter().product::<usize>(), 1.0),
    );
    let w = Tensor::new(
        vec![cin, cout / groups, k[0], k[1], k[2]],
        r.scaled(
            cin * cout / groups * k.iter().product::<usize>(),
            1.0 / ((cin / groups) as f32).sqrt(),
        ),
    );
    let bias = Tensor::new(vec![cout], r.scaled(cout, 0.5));
    let ct = ConvTranspose {
        weight: w.clone(),
        bias: Some(bias.clone()),
        stride: st,
        dilation: [1; 3],
        pads,
        output_padding: opad,
        groups,
    };
    let want = conv_ref(&x, &w, Some(&bias), geo);
    let got = run(
        b,
        &graph(cin, vec![(Op::ConvTranspose(ct), vec![0], cout)]),
        &x,
        2,
    );
    report(name, rel_l2(&got, &want));
}

#[test]
fn conv_transpose_variants() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("convt");
    for c in [
        ConvCase::new("convT k2 s2 32->16 (nnU-Net)", 32, 16, [5, 6, 7], 2).st([2; 3]),
        ConvCase::new(
            "convT k3 s2 pads[0,0,0,1,1,1] (deepbrain)",
            16,
            8,
            [5, 4, 6],
            3,
        )
        .st([2; 3])
        .pads([0, 0, 0, 1, 1, 1]),
        ConvCase::new("convT k3 s2 p1 opad1 (MONAI)", 16, 8, [5, 4, 6], 3)
            .st([2; 3])
            .pads([1; 6])
            .opad([1; 3]),
        ConvCase::new("convT Cin=3 k3 s2 p1 opad1", 3, 5, [4, 5, 3], 3)
            .st([2; 3])
            .pads([1; 6])
            .opad([1; 3]),
    ] {
        convt_case(&mut b, &mut r, c);
    }
    // Parity-class path: other kernels, strides 1 and 3, anisotropic strides, odd Cout; each
    // fused (one launch over the classes' union of taps when out % stride == 0) and per class.
    for (name, ci, co, sp, k, st, pads, opad) in [
        (
            "convT k4 s2 p1 24->12 (parity)",
            24,
            12,
            [4, 5, 3],
            [4; 3],
            [2; 3],
            [1; 6],
            [0; 3],
        ),
        (
            "convT k3 s1 p1 16->8 (parity, flipped conv)",
            16,
            8,
            [5, 4, 6],
            [3; 3],
            [1; 3],
            [1; 6],
            [0; 3],
        ),
        (
            "convT k3 s[1,2,3] opad[0,1,2] 16->14",
            16,
            14,
            [4, 5, 3],
            [3; 3],
            [1, 2, 3],
            [1; 6],
            [0, 1, 2],
        ),
        (
            "convT k3 s2 p1 opad1 32->14 16^3 (MONAI head)",
            32,
            14,
            [16; 3],
            [3; 3],
            [2; 3],
            [1; 6],
            [1; 3],
        ),
        (
            "convT k3 s2 p1 opad0 (odd output: per class)",
            16,
            14,
            [4, 5, 3],
            [3; 3],
            [2; 3],
            [1; 6],
            [0; 3],
        ),
        (
            "convT k1 s2 (no-tap classes: gather kernel)",
            8,
            8,
            [3, 4, 5],
            [1; 3],
            [2; 3],
            [0; 6],
            [1; 3],
        ),
    ] {
        for fused in [true, false] {
            b.with(|o| o.fused_parity = fused);
            let tag = if fused { "fused" } else { "classes" };
            convt_case(
                &mut b,
                &mut r,
                ConvCase::new(&format!("{name} {tag}"), ci, co, sp, 1)
                    .k(k)
                    .st(st)
                    .pads(pads)
                    .opad(opad),
            );
            // Launches: one when fused, one per parity class otherwise (k1 s2: gather kernel).
            let out: Vec<usize> = (0..3)
                .map(|a| (sp[a] - 1) * st[a] + k[a] + opad[a] - pads[a] - pads[a + 3])
                .collect();
            let fusable = (0..3).all(|a| out[a].is_multiple_of(st[a]));
            let want = if k == [1; 3] || (fused && fusable) {
                1
            } else {
                st.iter().product::<usize>()
            };
            let prof = b.profile_forward(2, 1).expect("profile");
            let launches: usize = prof
                .iter()
                .filter(|(l, _, _)| l.contains('['))
                .map(|(_, _, n)| n)
                .sum();
            assert_eq!(launches, want, "{name} {tag}: ran {prof:?}");
        }
    }
    b.with(|o| o.fused_parity = true);
    convt_case(
        &mut b,
        &mut r,
        ConvCase::new("convT grouped g=2 k2 s2", 8, 8, [4, 5, 3], 2)
            .st([2; 3])
            .groups(2),
    );
}

#[test]
fn norms_and_affine() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("norm");
    for (name, c, groups, act) in [
        (
            "instancenorm C=16 +leaky",
            16usize,
            16usize,
            Some(Op::LeakyRelu { alpha: 0.01 }),
        ),
        ("instancenorm C=40", 40, 40, None),
        (
            "groupnorm C=32 g=8 +prelu",
            32,
            8,
            Some(Op::PRelu {
                slope: Tensor::new(vec![1], vec![0.25]),
            }),
        ),
        ("groupnorm C=300 g=3 (C>256)", 300, 3, Some(Op::Relu)),
        (
            "instancenorm C=32 (16-byte path, many blocks) +prelu per channel",
            32,
            32,
            Some(Op::PRelu {
                slope: Tensor::new(vec![32], (0..32).map(|i| 0.01 * i as f32).collect()),
            }),
        ),
        // C % 8 != 0 with P * C % 8 == 0: flat 16-byte vectors (periods 7, 3, 5, 75).
        (
            "instancenorm C=14 (flat vectors, many blocks) +prelu per channel",
            14,
            14,
            Some(Op::PRelu {
                slope: Tensor::new(vec![14], (0..14).map(|i| 0.02 * i as f32).collect()),
            }),
        ),
        ("groupnorm C=6 g=2 (flat vectors)", 6, 6 / 3, None),
        (
            "instancenorm C=5 (flat vectors) +leaky",
            5,
            5,
            Some(Op::LeakyRelu { alpha: 0.01 }),
        ),
        (
            "instancenorm C=14 (P * C % 8 != 0: element kernels)",
            14,
            14,
            None,
        ),
    ] {
        // P * C % 8 == 0 for the flat cases (the C = 14 one spans many blocks); 990 voxels
        // for the rest (C = 300: flat vectors of period 75, C = 14: the element kernels).
        let sp = match (c, name.contains("flat")) {
            (32, false) if groups == 32 => [40, 36, 33],
            (14, true) => [40, 36, 32],
            (_, true) => [8, 10, 12],
            _ => [9, 10, 11],
        };
        let n = sp.iter().product::<usize>();
        // Offset mean (3) so cancellation in the variance would show.
        let xv: Vec<f32> = r.scaled(2 * c * n, 1.0).iter().map(|v| v + 3.0).collect();
        let x = T::from([2, c, sp[0], sp[1], sp[2]], &xv);
        let scale = Tensor::new(vec![c], r.scaled(c, 1.0));
        let bias = Tensor::new(vec![c], r.scaled(c, 1.0));
        let op = if groups == c {
            Op::InstanceNorm {
                eps: 1e-5,
                scale: scale.clone(),
                bias: bias.clone(),
            }
        } else {
            Op::GroupNorm {
                groups,
                eps: 1e-5,
                scale: scale.clone(),
                bias: bias.clone(),
            }
        };
        let mut want = norm_ref(&x, groups, 1e-5, &scale, &bias);
        let mut nodes = vec![(op, vec![0], c)];
        if let Some(a) = act {
            want = want.map(|ch, v| act_ref(&a, ch, v));
            nodes.push((a, vec![1], c));
        }
        let g = graph(c, nodes);
        let got = run(&mut b, &g, &x, 2);
        report(name, rel_l2(&got, &want));
        // Fixed-order reductions: a second run gives the same bits.
        let again = run(&mut b, &g, &x, 2);
        assert!(
            got.iter()
                .zip(again.iter())
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: two runs differ"
        );
    }
    // ChannelAffine alone.
    let c = 6;
    let x = T::from([2, c, 5, 6, 7], &r.scaled(2 * c * 210, 2.0));
    let scale = Tensor::new(vec![c], r.scaled(c, 1.0));
    let shift = Tensor::new(vec![c], r.scaled(c, 1.0));
    let want = x.map(|ch, v| v * scale.data[ch] as f64 + shift.data[ch] as f64);
    let got = run(
        &mut b,
        &graph(c, vec![(Op::ChannelAffine { scale, shift }, vec![0], c)]),
        &x,
        2,
    );
    report("channel affine", rel_l2(&got, &want));
}

#[test]
fn elementwise_concat_softmax() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("eltwise");
    let c = 5;
    let s = [2, c, 6, 7, 8];
    let x = T::from(s, &r.scaled(2 * c * 336, 2.0));
    // Standalone activations (the previous op is not a conv, so nothing fuses).
    for a in [
        Op::Relu,
        Op::LeakyRelu { alpha: 0.1 },
        Op::PRelu {
            slope: Tensor::new(vec![c], r.scaled(c, 0.5)),
        },
        Op::Elu { alpha: 0.7 },
        Op::Sigmoid,
        Op::Tanh,
    ] {
        let name = format!("activation {}", a.name());
        let want = x.map(|ch, v| act_ref(&a, ch, v));
        let got = run(&mut b, &graph(c, vec![(a, vec![0], c)]), &x, 2);
        report(&name, rel_l2(&got, &want));
    }
    // Binary ops on two computed values: v1 = sigmoid(x), v2 = op(x, v1).
    for (op, f) in [
        (Op::Add, (|a, b| a + b) as fn(f64, f64) -> f64),
        (Op::Mul, |a, b| a * b),
        (Op::Sub, |a, b| a - b),
        (Op::Div, |a, b| a / b),
    ] {
        let name = format!("binary {}", op.name());
        let sg = x.map(|_, v| 1.0 / (1.0 + (-v).exp()));
        let want = T {
            s,
            d: x.d.iter().zip(&sg.d).map(|(a, b)| f(*a, *b)).collect(),
        };
        let got = run(
            &mut b,
            &graph(c, vec![(Op::Sigmoid, vec![0], c), (op, vec![0, 1], c)]),
            &x,
            2,
        );
        report(&name, rel_l2(&got, &want));
    }
    // Broadcast constants: per channel, scalar, per (c, d).
    for (name, shape) in [
        ("const per-channel", vec![1, c, 1, 1, 1]),
        ("const scalar", vec![1, 1, 1, 1, 1]),
        ("const [1,C,D,1,1]", vec![1, c, 6, 1, 1]),
    ] {
        let k = Tensor::new(shape.clone(), r.scaled(shape.iter().product(), 2.0));
        let kat = |ch: usize, z: usize| -> f64 {
            match k.data.len() {
                1 => k.data[0] as f64,
                _ if shape[2] == 1 => k.data[ch] as f64,
                _ => k.data[ch * 6 + z] as f64,
            }
        };
        for add in [true, false] {
            let mut want = x.clone();
            for (i, v) in want.d.iter_mut().enumerate() {
                let ch = (i / 336) % c;
                let z = (i / 56) % 6;
                *v = if add {
                    *v + kat(ch, z)
                } else {
                    *v * kat(ch, z)
                };
            }
            let op = if add {
                Op::AddConst(k.clone())
            } else {
                Op::MulConst(k.clone())
            };
            let got = run(&mut b, &graph(c, vec![(op, vec![0], c)]), &x, 2);
            report(
                &format!("{name} {}", if add { "add" } else { "mul" }),
                rel_l2(&got, &want),
            );
        }
    }
    // Concat of the input and two derived values along channels (3 inputs, odd widths).
    let sg = x.map(|_, v| 1.0 / (1.0 + (-v).exp()));
    let th = x.map(|_, v| v.tanh());
    let mut want = T::zeros([2, 3 * c, 6, 7, 8]);
    for n in 0..2 {
        for (j, src) in [&x, &sg, &th].iter().enumerate() {
            for ch in 0..c {
                for z in 0..6 {
                    for y in 0..7 {
                        for xx in 0..8 {
                            let i = want.idx(n, j * c + ch, z, y, xx);
                            want.d[i] = src.at(n, ch, z, y, xx);
                        }
                    }
                }
            }
        }
    }
    let g = graph(
        c,
        vec![
            (Op::Sigmoid, vec![0], c),
            (Op::Tanh, vec![0], c),
            (Op::Concat { axis: 1 }, vec![0, 1, 2], 3 * c),
        ],
    );
    report("concat 3 inputs", rel_l2(&run(&mut b, &g, &x, 2), &want));
    // Softmax over channels.
    let sp = 336;
    let mut want = x.clone();
    for n in 0..2 {
        for p in 0..sp {
            let m = (0..c)
                .map(|ch| x.d[(n * c + ch) * sp + p])
                .fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = (0..c)
                .map(|ch| (x.d[(n * c + ch) * sp + p] - m).exp())
                .sum();
            for ch in 0..c {
                want.d[(n * c + ch) * sp + p] = (x.d[(n * c + ch) * sp + p] - m).exp() / z;
            }
        }
    }
    report(
        "softmax channels",
        rel_l2(
            &run(
                &mut b,
                &graph(c, vec![(Op::Softmax { axis: 1 }, vec![0], c)]),
                &x,
                2,
            ),
            &want,
        ),
    );
    // Identity (kept when it names an output).
    report(
        "identity",
        rel_l2(
            &run(&mut b, &graph(c, vec![(Op::Identity, vec![0], c)]), &x, 2),
            &x,
        ),
    );
    // A smaller batch than prepared: run 1 of 2.
    b.prepare(&graph(c, vec![(Op::Tanh, vec![0], c)]), 2, [6, 7, 8])
        .unwrap();
    let one = T {
        s: [1, c, 6, 7, 8],
        d: x.d[..c * 336].to_vec(),
    };
    let got = b
        .run(
            Array5::from_shape_vec(one.s, one.d.iter().map(|&v| v as f32).collect())
                .unwrap()
                .view(),
        )
        .unwrap();
    report(
        "partial batch 1 of 2",
        rel_l2(&got, &one.map(|_, v| v.tanh())),
    );
}

#[test]
fn pools_and_resize() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("pool");
    let c = 6;
    let x = T::from([2, c, 9, 10, 11], &r.scaled(2 * c * 990, 2.0));
    // A cube pool: kernel k, stride s, pads p on every side.
    let pool = |k: usize, s: usize, p: usize, ceil_mode: bool, count_include_pad: bool| Pool {
        kernel: [k; 3],
        stride: [s; 3],
        dilation: [1; 3],
        pads: [p; 6],
        ceil_mode,
        count_include_pad,
    };
    for (name, p, max, o) in [
        (
            "maxpool k2 s2",
            pool(2, 2, 0, false, false),
            true,
            [4, 5, 5],
        ),
        (
            "maxpool k3 s2 p1 ceil",
            pool(3, 2, 1, true, false),
            true,
            [5, 6, 6],
        ),
        (
            "avgpool k2 s2",
            pool(2, 2, 0, false, false),
            false,
            [4, 5, 5],
        ),
        (
            "avgpool k3 s1 p1 include_pad",
            pool(3, 1, 1, false, true),
            false,
            [9, 10, 11],
        ),
        (
            "avgpool k3 s1 p1 exclude_pad",
            pool(3, 1, 1, false, false),
            false,
            [9, 10, 11],
        ),
    ] {
        let want = pool_ref(&x, &p, max, o);
        let op = if max {
            Op::MaxPool(p)
        } else {
            Op::AveragePool(p)
        };
        report(
            name,
            rel_l2(
                &run(&mut b, &graph(c, vec![(op, vec![0], c)]), &x, 2),
                &want,
            ),
        );
    }
    // Resize: nearest x2 (asymmetric/floor, as PyTorch's nearest export) and trilinear x2
    // half_pixel (align_corners=False), plus align_corners with explicit sizes.
    let xs = T::from([2, c, 4, 5, 6], &r.scaled(2 * c * 120, 2.0));
    let near = Resize {
        mode: ResizeMode::Nearest,
        coord: CoordMode::Asymmetric,
        nearest: NearestMode::Floor,
        scales: [2.0; 3],
        sizes: None,
    };
    let mut want = T::zeros([2, c, 8, 10, 12]);
    for n in 0..2 {
        for ch in 0..c {
            for z in 0..8 {
                for y in 0..10 {
                    for xx in 0..12 {
                        let i = want.idx(n, ch, z, y, xx);
                        want.d[i] = xs.at(n, ch, z / 2, y / 2, xx / 2);
                    }
                }
            }
        }
    }
    report(
        "resize nearest x2",
        rel_l2(
            &run(
                &mut b,
                &graph(c, vec![(Op::Resize(near), vec![0], c)]),
                &xs,
                2,
            ),
            &want,
        ),
    );
    for (name, coord, sizes) in [
        ("resize linear x2 half_pixel", CoordMode::HalfPixel, None),
        (
            "resize linear align_corners sizes",
            CoordMode::AlignCorners,
            Some([7, 9, 13]),
        ),
    ] {
        let rz = Resize {
            mode: ResizeMode::Linear,
            coord,
            nearest: NearestMode::RoundPreferFloor,
            scales: [2.0; 3],
            sizes,
        };
        let o = sizes.unwrap_or([8, 10, 12]);
        let ins = [4usize, 5, 6];
        let src = |a: usize, oc: usize| -> (usize, usize, f64) {
            let f = match coord {
                CoordMode::AlignCorners => {
                    if o[a] == 1 {
                        0.0
                    } else {
                        oc as f64 * (ins[a] - 1) as f64 / (o[a] - 1) as f64
                    }
                }
                _ => ((oc as f64 + 0.5) / (o[a] as f64 / ins[a] as f64) - 0.5).max(0.0),
            };
            let f = f.min((ins[a] - 1) as f64);
            let i0 = f.floor() as usize;
            (i0, (i0 + 1).min(ins[a] - 1), f - i0 as f64)
        };
        let mut want = T::zeros([2, c, o[0], o[1], o[2]]);
        for n in 0..2 {
            for ch in 0..c {
                for z in 0..o[0] {
                    for y in 0..o[1] {
                        for xx in 0..o[2] {
                            let (z0, z1, fz) = src(0, z);
                            let (y0, y1, fy) = src(1, y);
                            let (x0, x1, fx) = src(2, xx);
                            let mut v = 0.0;
                            for (zi, wz) in [(z0, 1.0 - fz), (z1, fz)] {
                                for (yi, wy) in [(y0, 1.0 - fy), (y1, fy)] {
                                    for (xi, wx) in [(x0, 1.0 - fx), (x1, fx)] {
                                        v += wz * wy * wx * xs.at(n, ch, zi, yi, xi);
                                    }
                                }
                            }
                            let i = want.idx(n, ch, z, y, xx);
                            want.d[i] = v;
                        }
                    }
                }
            }
        }
        report(
            name,
            rel_l2(
                &run(
                    &mut b,
                    &graph(c, vec![(Op::Resize(rz), vec![0], c)]),
                    &xs,
                    2,
                ),
                &want,
            ),
        );
    }
}

/// A small UNet-like chain (conv s2, norm+leaky, convT k2s2, concat skip, head, softmax) as one
/// graph: checks liveness reuse and fusion together.
#[test]
fn small_unet_chain() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("unet");
    let (cin, f) = (1usize, 16usize);
    let x = T::from([2, cin, 16, 16, 16], &r.scaled(2 * 4096, 1.0));
    let w1 = Tensor::new(vec![f, cin, 3, 3, 3], r.scaled(f * 27, 1.0 / 27f32.sqrt()));
    let w2 = Tensor::new(
        vec![2 * f, f, 3, 3, 3],
        r.scaled(2 * f * f * 27, 1.0 / ((f * 27) as f32).sqrt()),
    );
    let wt = Tensor::new(
        vec![2 * f, f, 2, 2, 2],
        r.scaled(2 * f * f * 8, 1.0 / ((2 * f) as f32).sqrt()),
    );
    let wh = Tensor::new(
        vec![3, 2 * f, 1, 1, 1],
        r.scaled(3 * 2 * f, 1.0 / ((2 * f) as f32).sqrt()),
    );
    let g1 = Tensor::new(vec![2 * f], r.scaled(2 * f, 1.0));
    let b1 = Tensor::new(vec![2 * f], r.scaled(2 * f, 1.0));
    let conv = |w: &Tensor, s: usize, p: usize| {
        Op::Conv(Conv {
            weight: w.clone(),
            bias: None,
            stride: [s; 3],
            dilation: [1; 3],
            pads: [p; 6],
            groups: 1,
        })
    };
    let nodes = vec![
        (conv(&w1, 1, 1), vec![0], f),               // v1
        (Op::LeakyRelu { alpha: 0.01 }, vec![1], f), // v2 (fused)
        (conv(&w2, 2, 1), vec![2], 2 * f),           // v3
        (
            Op::InstanceNorm {
                eps: 1e-5,
                scale: g1.clone(),
                bias: b1.clone(),
            },
            vec![3],
            2 * f,
        ), // v4
        (Op::LeakyRelu { alpha: 0.01 }, vec![4], 2 * f), // v5 (fused)
        (
            Op::ConvTranspose(ConvTranspose {
                weight: wt.clone(),
                bias: None,
                stride: [2; 3],
                dilation: [1; 3],
                pads: [0; 6],
                output_padding: [0; 3],
                groups: 1,
            }),
            vec![5],
            f,
        ), // v6
        (Op::Concat { axis: 1 }, vec![6, 2], 2 * f), // v7
        (conv(&wh, 1, 0), vec![7], 3),               // v8
        (Op::Softmax { axis: 1 }, vec![8], 3),       // v9
    ];
    let leaky = Op::LeakyRelu { alpha: 0.01 };
    let v2 = conv_ref(&x, &w1, None, PAD1).map(|c, v| act_ref(&leaky, c, v));
    let v3 = conv_ref(
        &v2,
        &w2,
        None,
        Kernel {
            st: [2; 3],
            pads: [1; 6],
            ..PLAIN
        },
    );
    let v5 = norm_ref(&v3, 2 * f, 1e-5, &g1, &b1).map(|c, v| act_ref(&leaky, c, v));
    let v6 = conv_ref(
        &v5,
        &wt,
        None,
        Kernel {
            st: [2; 3],
            transposed: true,
            ..PLAIN
        },
    );
    let mut v7 = T::zeros([2, 2 * f, 16, 16, 16]);
    let sp = 4096;
    for n in 0..2 {
        v7.d[n * 2 * f * sp..(n * 2 * f + f) * sp]
            .copy_from_slice(&v6.d[n * f * sp..(n + 1) * f * sp]);
        v7.d[(n * 2 * f + f) * sp..(n + 1) * 2 * f * sp]
            .copy_from_slice(&v2.d[n * f * sp..(n + 1) * f * sp]);
    }
    let v8 = conv_ref(&v7, &wh, None, PLAIN);
    let mut v9 = v8.clone();
    for n in 0..2 {
        for p in 0..sp {
            let z: f64 = (0..3).map(|c| v8.d[(n * 3 + c) * sp + p].exp()).sum();
            for c in 0..3 {
                v9.d[(n * 3 + c) * sp + p] = v8.d[(n * 3 + c) * sp + p].exp() / z;
            }
        }
    }
    let g = graph(cin, nodes);
    let got = run(&mut b, &g, &x, 2);
    println!(
        "small unet: {} bytes of activation buffers",
        b.activation_bytes()
    );
    report("small unet chain (logits before softmax)", {
        // Compare softmax output; also require the plan to have reused buffers.
        rel_l2(&got, &v9)
    });
}

/// Sliding windows on the device against a host f64 blend of per-window f64 outputs of a
/// 1x1x1 conv (so every window's output is exactly computable).
#[test]
fn sliding_window_blend_and_argmax() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("sw");
    let (cin, cout) = (2usize, 4usize);
    let (d, h, w) = (13usize, 17usize, 11usize);
    let roi = [8usize, 8, 8];
    let pad_before = [1usize, 0, 2];
    let padded = [16usize, 17, 16];
    let mut starts = Vec::new();
    for z in [0, 4, 8] {
        for y in [0, 5, 9] {
            for x in [0, 8] {
                starts.push([z, y, x]);
            }
        }
    }
    let vol = Array4::from_shape_vec((cin, d, h, w), r.scaled(cin * d * h * w, 1.0)).unwrap();
    let wmap = Array3::from_shape_vec(
        (8, 8, 8),
        (0..512)
            .map(|i| 0.1 + ((i * 37) % 100) as f32 / 100.0)
            .collect(),
    )
    .unwrap();
    let wt = Tensor::new(vec![cout, cin, 1, 1, 1], r.scaled(cout * cin, 1.0));
    let bias = Tensor::new(vec![cout], r.scaled(cout, 0.5));
    let g = graph(
        cin,
        vec![(
            Op::Conv(Conv {
                weight: wt.clone(),
                bias: Some(bias.clone()),
                stride: [1; 3],
                dilation: [1; 3],
                pads: [0; 6],
                groups: 1,
            }),
            vec![0],
            cout,
        )],
    );
    let cval = 0.25f32;
    // f64 reference.
    let mut acc = vec![0.0f64; cout * d * h * w];
    let mut ws = vec![0.0f64; d * h * w];
    for s in &starts {
        for z in 0..8 {
            for y in 0..8 {
                for x in 0..8 {
                    let (vz, vy, vx) = (s[0] + z, s[1] + y, s[2] + x);
                    let inside = |v: usize, p: usize, n: usize| v >= p && v - p < n;
                    let wv = wmap[[z, y, x]] as f64;
                    let ins = inside(vz, pad_before[0], d)
                        && inside(vy, pad_before[1], h)
                        && inside(vx, pad_before[2], w);
                    let val = |c: usize| {
                        if ins {
                            vol[[
                                c,
                                vz - pad_before[0],
                                vy - pad_before[1],
                                vx - pad_before[2],
                            ]] as f64
                        } else {
                            cval as f64
                        }
                    };
                    if !ins {
                        continue;
                    }
                    let vi =
                        ((vz - pad_before[0]) * h + vy - pad_before[1]) * w + vx - pad_before[2];
                    for co in 0..cout {
                        let o: f64 = bias.data[co] as f64
                            + (0..cin)
                                .map(|ci| wt.data[co * cin + ci] as f64 * val(ci))
                                .sum::<f64>();
                        acc[co * d * h * w + vi] += wv * o;
                    }
                    ws[vi] += wv;
                }
            }
        }
    }
    for (i, a) in acc.iter_mut().enumerate() {
        *a /= ws[i % (d * h * w)];
    }
    for batch in [1usize, 4] {
        b.prepare(&g, batch, roi).unwrap();
        let (got, times) = b
            .segment_windows(&WindowJob {
                vol: vol.view(),
                padded,
                pad_before,
                roi,
                starts: &starts,
                weights: wmap.view(),
                batch,
                cval,
            })
            .unwrap();
        let want = T {
            s: [1, cout, d, h, w],
            d: acc.clone(),
        };
        let got5 = got.into_shape_with_order((1, cout, d, h, w)).unwrap();
        report(
            &format!("sliding window blend batch {batch}"),
            rel_l2(&got5, &want),
        );
        println!("times {times:?}");
        let (labels, _, _) = b
            .segment_windows_argmax(&WindowJob {
                vol: vol.view(),
                padded,
                pad_before,
                roi,
                starts: &starts,
                weights: wmap.view(),
                batch,
                cval,
            })
            .unwrap();
        let mut agree = 0usize;
        let mut close = 0usize;
        for v in 0..d * h * w {
            let vals: Vec<f64> = (0..cout).map(|c| acc[c * d * h * w + v]).collect();
            let best = (0..cout).fold(0, |bi, c| if vals[c] > vals[bi] { c } else { bi });
            let l = labels.as_slice().unwrap()[v] as usize;
            if l == best {
                agree += 1
            } else if (vals[l] - vals[best]).abs() < 1e-2 {
                close += 1
            }
        }
        println!(
            "RESULT argmax batch {batch}: {agree} equal, {close} near-ties, of {}",
            d * h * w
        );
        assert_eq!(
            agree + close,
            d * h * w,
            "argmax labels differ beyond near-ties"
        );
    }
    // Errors, not panics, on bad input.
    assert!(b
        .segment_windows(&WindowJob {
            vol: vol.view(),
            padded,
            pad_before,
            roi: [8, 8, 4],
            starts: &starts,
            weights: wmap.view(),
            batch: 1,
            cval
        })
        .is_err());
    assert!(b
        .segment_windows(&WindowJob {
            vol: vol.view(),
            padded,
            pad_before,
            roi,
            starts: &[[9, 0, 0]],
            weights: wmap.view(),
            batch: 1,
            cval
        })
        .is_err());
}

/// Throughput of the implicit-GEMM conv: 32->32 3^3 on 2x32x128^3 (fp16 NDHWC), and 64->64 on
/// 2x64x96^3 (the BN=64 tile).
#[test]
fn bench_conv_32_32() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("bench");
    for (c, s) in [(32usize, 128usize), (64, 96)] {
        let w = Tensor::new(vec![c, c, 3, 3, 3], r.scaled(c * c * 27, 0.03));
        let g = graph(
            c,
            vec![(
                Op::Conv(Conv {
                    weight: w,
                    bias: None,
                    stride: [1; 3],
                    dilation: [1; 3],
                    pads: [1; 6],
                    groups: 1,
                }),
                vec![0],
                c,
            )],
        );
        b.with(|o| o.poison = false);
        b.prepare(&g, 2, [s; 3]).unwrap();
        let x = Array5::from_shape_vec((2, c, s, s, s), r.scaled(2 * c * s * s * s, 1.0)).unwrap();
        b.run(x.view()).unwrap();
        let ms = b.time_forward(2, 20).unwrap();
        let flops = 2.0 * (2 * s * s * s) as f64 * c as f64 * (27 * c) as f64;
        println!(
            "RESULT bench conv {c}->{c} 3^3 2x{c}x{s}^3: {ms:.3} ms, {:.1} TFLOP/s",
            flops / ms / 1e9
        );
    }
}

/// Every `conv_mma_*` tile (forced), the upsampling transposed conv (kernel == stride, run as a
/// GEMM with a scatter epilogue) and the legacy wmma path, on shapes that leave partial tiles.
#[test]
fn conv_mma_tiles() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("mma");
    let tiles: Vec<Option<&str>> = MMA_CONFIGS.iter().map(|c| Some(c.name)).collect();
    for tile in tiles.into_iter().chain([None]) {
        b.with(|o| o.conv_tile = tile.map(mma_named));
        let t = tile.unwrap_or("auto");
        let leaky = || Some(Op::LeakyRelu { alpha: 0.01 });
        for c in [
            ConvCase::new(&format!("{t} 3^3 16->32"), 16, 32, [6, 7, 9], 3).pads([1; 6]),
            ConvCase::new(&format!("{t} 3^3 s2 24->72 +leaky"), 24, 72, [9, 8, 10], 3)
                .st([2; 3])
                .pads([1; 6])
                .act(leaky()),
            ConvCase::new(&format!("{t} 3^3 dil2 8->16"), 8, 16, [7, 8, 6], 3)
                .dl([2; 3])
                .pads([2; 6]),
            ConvCase::new(&format!("{t} 1x1 head 32->14"), 32, 14, [8, 9, 10], 1),
            ConvCase::new(&format!("{t} Cin=1 3^3 ->32 +leaky"), 1, 32, [9, 8, 7], 3)
                .pads([1; 6])
                .act(leaky()),
            ConvCase::new(&format!("{t} 3^3 64->136"), 64, 136, [5, 6, 4], 3).pads([1; 6]),
        ] {
            conv_case(&mut b, &mut r, c);
        }
        for c in [
            ConvCase::new(&format!("{t} convT k2s2 32->16"), 32, 16, [5, 6, 7], 2).st([2; 3]),
            ConvCase::new(
                &format!("{t} convT k2s2 3->5 (odd Cout)"),
                3,
                5,
                [4, 3, 5],
                2,
            )
            .st([2; 3]),
            ConvCase::new(&format!("{t} convT k2s2 16->40"), 16, 40, [4, 4, 3], 2).st([2; 3]),
            ConvCase::new(
                &format!("{t} convT k(2,1,2) s(2,1,2) 8->24"),
                8,
                24,
                [3, 5, 4],
                1,
            )
            .k([2, 1, 2])
            .st([2, 1, 2]),
        ] {
            convt_case(&mut b, &mut r, c);
        }
    }
    b.with(|o| o.conv_tile = None);
    b.with(|o| o.legacy_conv = true);
    conv_case(
        &mut b,
        &mut r,
        ConvCase::new("legacy 3^3 16->32", 16, 32, [6, 7, 9], 3).pads([1; 6]),
    );
    convt_case(
        &mut b,
        &mut r,
        ConvCase::new("legacy convT k2s2 32->16", 32, 16, [5, 6, 7], 2).st([2; 3]),
    );
    b.with(|o| o.legacy_conv = false);
}

/// Conv kernels of the prepared plan (from the profile labels "... [kernel] ...").
fn kernels_used(b: &mut CudaBackend, batch: usize) -> Vec<String> {
    let prof = b.profile_forward(batch, 1).expect("profile");
    prof.iter()
        .filter_map(|(l, _, _)| {
            let i = l.find('[')?;
            let j = l[i..].find(']')?;
            Some(l[i + 1..i + j].to_string())
        })
        .collect()
}

/// The halo-tile kernels (`conv_halo_*`, stride-1 3^3, Cin 16/32/64, an even Cin < 16
/// zero-padded to 16, or Cin k x 32 in chunks; Cout <= 128) vs float64: spatial sizes that
/// leave partial 4x8x8 tiles, zero / asymmetric pads (borders), odd and even Cout, fused
/// activations, outputs written into concat slices at even and odd channel offsets (the
/// vector epilogue where Cout, ldc and the offset are multiples of 8), and (phase 7) Cin
/// 96..256 in chunks with Cout up to 128 (grid.y channel tiles). Each case runs every variant
/// that accepts its Cin at the tile width the planner picks (forced by name; Cin 6 and 2 only
/// run forced) and checks that it is the one that ran.
#[test]
fn conv_halo_cases() {
    use voxtile::internals::cuda::host::catalogue::{HaloConfig, HALO_CONFIGS};
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("halo");
    b.with(|o| o.conv_tile = None);
    b.with(|o| o.halo_conv = true);
    let leaky = || Some(Op::LeakyRelu { alpha: 0.01 });
    #[allow(clippy::type_complexity)]
    let cases: Vec<(usize, usize, [usize; 3], [usize; 6], Option<Op>, &str)> = vec![
        (
            32,
            32,
            [9, 13, 17],
            [1; 6],
            None,
            cat::CONV_HALO_C32N32_W4.name,
        ),
        (
            64,
            32,
            [6, 10, 7],
            [1; 6],
            leaky(),
            cat::CONV_HALO_C32N32_W4.name,
        ),
        (
            32,
            64,
            [5, 9, 8],
            [1; 6],
            Some(Op::Relu),
            cat::CONV_HALO_C32N64.name,
        ),
        (
            64,
            64,
            [4, 8, 8],
            [1; 6],
            leaky(),
            cat::CONV_HALO_C64N64.name,
        ),
        (
            32,
            20,
            [7, 9, 11],
            [0; 6],
            None,
            cat::CONV_HALO_C32N32_W4.name,
        ),
        (
            64,
            33,
            [5, 7, 9],
            [2, 1, 0, 0, 1, 2],
            None,
            cat::CONV_HALO_C64N64.name,
        ),
        (
            32,
            17,
            [3, 1, 12],
            [1; 6],
            leaky(),
            cat::CONV_HALO_C32N32_W4.name,
        ),
        // Phase 6, smem width 16: W2's 14->14 (4-byte copies, channels 14/15 zero), Cin 16
        // (16-byte copies), Cout 14 / 16 / 5 / 20 / 32, partial tiles, asymmetric pads.
        (
            14,
            14,
            [9, 13, 17],
            [1; 6],
            None,
            cat::CONV_HALO_C16N16_R.name,
        ),
        (
            16,
            16,
            [6, 10, 7],
            [1; 6],
            leaky(),
            cat::CONV_HALO_C16N16_R.name,
        ),
        (
            14,
            5,
            [5, 7, 9],
            [2, 1, 0, 0, 1, 2],
            None,
            cat::CONV_HALO_C16N16_R.name,
        ),
        (
            16,
            5,
            [3, 1, 12],
            [1; 6],
            Some(Op::Relu),
            cat::CONV_HALO_C16N16_R.name,
        ),
        (
            14,
            16,
            [4, 8, 8],
            [0; 6],
            None,
            cat::CONV_HALO_C16N16_R.name,
        ),
        (
            14,
            20,
            [5, 9, 8],
            [1; 6],
            leaky(),
            cat::CONV_HALO_C16N32.name,
        ),
        (
            16,
            32,
            [7, 9, 11],
            [0, 1, 2, 2, 1, 0],
            None,
            cat::CONV_HALO_C16N32.name,
        ),
        (6, 14, [5, 9, 10], [1; 6], None, "forced only"),
        (2, 16, [3, 9, 8], [1, 1, 1, 0, 0, 0], None, "forced only"),
    ];
    // Every variant that accepts each case's Cin at the planner's width (the narrowest that
    // holds Cout): forced by name, so each case checks the kernel it names whatever the
    // defaults are; the default (where there is one) is the case's last field.
    let mut all = Vec::new();
    for c in &cases {
        let ok = |v: &&HaloConfig| v.accepts_cin(c.0) && c.1 <= v.bn;
        let bn = HALO_CONFIGS.iter().filter(ok).map(|v| v.bn).min().unwrap();
        let def = default_halo(c.0, c.1, 3, 1);
        assert_eq!(def.map_or("forced only", |d| d.name), c.5, "{c:?}");
        for v in HALO_CONFIGS.iter().filter(ok).filter(|v| v.bn == bn) {
            all.push((c.0, c.1, c.2, c.3, c.4.clone(), v.name));
        }
    }
    let names: Vec<&str> = all.iter().map(|c| c.5).collect();
    assert!(
        HALO_CONFIGS.iter().all(|v| names.contains(&v.name)),
        "every halo kernel has a case: {names:?}"
    );
    for (cin, cout, sp, pads, act, kern) in all {
        b.with(|o| o.halo_tile = Some(halo_named(kern)));
        let name = format!(
            "{kern} {cin}->{cout} {sp:?} pads {pads:?}{}",
            if act.is_some() { " +act" } else { "" }
        );
        conv_case(
            &mut b,
            &mut r,
            ConvCase::new(&name, cin, cout, sp, 3).pads(pads).act(act),
        );
        let used = kernels_used(&mut b, 2);
        assert!(
            used.iter().any(|k| k == kern),
            "{name}: expected {kern}, ran {used:?}"
        );
    }
    // Chunked Cin (phase 7): the default kernel (asserted), then every variant that accepts
    // the Cin at the tile width, forced; Cout 33 / 17 / 100 / 128 (odd, two channel tiles).
    #[allow(clippy::type_complexity)]
    let chunked: Vec<(usize, usize, [usize; 3], [usize; 6], Option<Op>, &str)> = vec![
        (
            128,
            64,
            [5, 9, 10],
            [1; 6],
            leaky(),
            cat::CONV_HALO_C64N64.name,
        ),
        (
            256,
            33,
            [4, 7, 9],
            [2, 1, 0, 0, 1, 2],
            None,
            cat::CONV_HALO_C64N64.name,
        ),
        (
            128,
            17,
            [3, 9, 12],
            [1; 6],
            Some(Op::Relu),
            cat::CONV_HALO_C32N32_W4.name,
        ),
        (192, 64, [4, 8, 8], [1; 6], None, cat::CONV_HALO_C64N64.name),
        (
            128,
            128,
            [5, 8, 9],
            [1; 6],
            leaky(),
            cat::CONV_HALO_C64N64.name,
        ),
        (
            256,
            100,
            [3, 5, 17],
            [0, 1, 1, 1, 0, 1],
            None,
            cat::CONV_HALO_C64N64.name,
        ),
        (
            96,
            20,
            [5, 6, 7],
            [1; 6],
            None,
            cat::CONV_HALO_C32N32_W4.name,
        ),
    ];
    for (cin, cout, sp, pads, act, def) in chunked {
        let bn = if cout <= 32 { 32 } else { 64 };
        let forced = HALO_CONFIGS
            .iter()
            .filter(|v| v.accepts_cin(cin) && v.bn == bn)
            .map(|v| Some(v.name));
        for tile in std::iter::once(None).chain(forced) {
            b.with(|o| o.halo_tile = tile.map(halo_named));
            let kern = tile.unwrap_or(def);
            let name = format!(
                "{kern} {cin}->{cout} {sp:?} pads {pads:?}{} (chunked Cin)",
                if act.is_some() { " +act" } else { "" }
            );
            conv_case(
                &mut b,
                &mut r,
                ConvCase::new(&name, cin, cout, sp, 3)
                    .pads(pads)
                    .act(act.clone()),
            );
            let used = kernels_used(&mut b, 2);
            assert!(
                !used.is_empty() && used.iter().all(|k| k == kern),
                "{name}: expected {kern}, ran {used:?}"
            );
        }
    }
    b.with(|o| o.halo_tile = None);
    // Persistent kernels on more tiles than blocks (H200: 132 SMs x persist), so blocks loop
    // over tiles, with partial tiles on every axis; Cout 5 keeps the f64 reference cheap.
    // The zero-padding ones also with real Cin 14.
    for v in HALO_CONFIGS.iter().filter(|v| v.persist > 0) {
        b.with(|o| o.halo_tile = Some(v));
        let (sp, cout) = ([21usize, 23, 89], if v.bn == 64 { 37 } else { 5 });
        assert!(
            v.tiles(2, sp) > v.persist * 132,
            "{}: tiles per block",
            v.name
        );
        for cin in [v.cin, 14].into_iter().filter(|&c| v.accepts_cin(c)) {
            let name = format!("{} {cin}->{cout} {sp:?} persistent", v.name);
            conv_case(
                &mut b,
                &mut r,
                ConvCase::new(&name, cin, cout, sp, 3)
                    .pads([1; 6])
                    .act(leaky()),
            );
            let used = kernels_used(&mut b, 2);
            assert!(used.iter().any(|k| k == v.name), "{name}: ran {used:?}");
        }
    }
    // Channel slices: concat [conv a (Cout ca), conv b (cb), x] written in place, with the
    // second conv at an even (32, 14, 8) and an odd (17, 5) channel offset; default kernels and
    // some variants (resident weights, persistent). Input channels c: 32, 14 / 16 on the
    // width-16 kernels, 128 in chunks. (32, 32, 32) and (16, 8, 16): both convs on the vector
    // epilogue (ldc 96 / 40, offsets 0 and 32 / 8).
    for (c, ca, cb, tile) in [
        (32usize, 32usize, 32usize, None),
        (32, 17, 32, None),
        #[cfg(feature = "kernel-experiments")]
        (32, 17, 32, Some(cat::CONV_HALO_C32N32_RP.name)),
        #[cfg(feature = "kernel-experiments")]
        (32, 32, 32, Some(cat::CONV_HALO_C32N32_RB.name)),
        (14, 14, 14, None),
        (14, 5, 14, None),
        (14, 5, 16, Some(cat::CONV_HALO_C16N16_RP2.name)),
        (16, 3, 14, Some(cat::CONV_HALO_C16N16.name)),
        (16, 8, 16, None),
        // Chunked Cin 128 (phase 7): default (CONV_HALO_C32N32_W4, 4 chunks) and a staged 4-tap ring.
        (128, 17, 32, None),
        #[cfg(feature = "kernel-experiments")]
        (128, 32, 32, Some(cat::CONV_HALO_C64N32_S4.name)),
        (128, 32, 64, None),
    ] {
        b.with(|o| o.halo_tile = tile.map(halo_named));
        let sp = [5usize, 9, 10];
        let nvox = sp.iter().product::<usize>();
        let x = T::from([2, c, sp[0], sp[1], sp[2]], &r.scaled(2 * c * nvox, 1.0));
        let wa = Tensor::new(vec![ca, c, 3, 3, 3], r.scaled(ca * c * 27, 0.03));
        let wb = Tensor::new(vec![cb, c, 3, 3, 3], r.scaled(cb * c * 27, 0.03));
        let ba = Tensor::new(vec![ca], r.scaled(ca, 0.5));
        let conv = |w: &Tensor, bias: Option<Tensor>| {
            Op::Conv(Conv {
                weight: w.clone(),
                bias,
                stride: [1; 3],
                dilation: [1; 3],
                pads: [1; 6],
                groups: 1,
            })
        };
        let ct = ca + cb + c;
        let g = graph(
            c,
            vec![
                (conv(&wa, Some(ba.clone())), vec![0], ca),
                (conv(&wb, None), vec![0], cb),
                (Op::Concat { axis: 1 }, vec![1, 2, 0], ct),
            ],
        );
        let va = conv_ref(&x, &wa, Some(&ba), PAD1);
        let vb = conv_ref(&x, &wb, None, PAD1);
        let mut want = T::zeros([2, ct, sp[0], sp[1], sp[2]]);
        for n in 0..2 {
            for ch in 0..ct {
                for v in 0..nvox {
                    want.d[(n * ct + ch) * nvox + v] = if ch < ca {
                        va.d[(n * ca + ch) * nvox + v]
                    } else if ch < ca + cb {
                        vb.d[(n * cb + ch - ca) * nvox + v]
                    } else {
                        x.d[(n * c + ch - ca - cb) * nvox + v]
                    };
                }
            }
        }
        let got = run(&mut b, &g, &x, 2);
        report(
            &format!(
                "halo convs {c}->{ca},{cb} into concat slices (offset {ca}, {})",
                tile.unwrap_or("default")
            ),
            rel_l2(&got, &want),
        );
        let used = kernels_used(&mut b, 2);
        // (Same-shape convs share a profile label: count kernels, not labels.)
        assert!(
            !used.is_empty()
                && used
                    .iter()
                    .all(|k| k.starts_with("conv_halo") && tile.is_none_or(|t| k == t)),
            "both convs on the halo kernel {tile:?}: {used:?}"
        );
    }
    b.with(|o| o.halo_tile = None);
}

/// Concats the outputs of `parts` (single-input conv / transposed conv nodes on `x`, with their
/// float64 references) in place, optionally followed by `x` itself, and checks the result:
/// each part is written at its channel offset with the concat's channel stride.
fn concat_parts_case(
    b: &mut CudaBackend,
    name: &str,
    x: &T,
    parts: Vec<(Op, T)>,
    with_input: bool,
) -> Vec<String> {
    let cin = x.s[1];
    let os = parts[0].1.s;
    let mut cs: Vec<usize> = parts.iter().map(|(_, t)| t.s[1]).collect();
    let mut nodes: Vec<(Op, Vec<usize>, usize)> = Vec::new();
    let mut refs: Vec<T> = Vec::new();
    for (op, t) in parts {
        assert_eq!(&t.s[2..], &os[2..], "parts share the output shape");
        nodes.push((op, vec![0], t.s[1]));
        refs.push(t);
    }
    let mut cat_in: Vec<usize> = (1..=nodes.len()).collect();
    if with_input {
        assert_eq!(&x.s[2..], &os[2..], "input shape");
        cat_in.push(0);
        cs.push(cin);
        refs.push(x.clone());
    }
    let ct: usize = cs.iter().sum();
    nodes.push((Op::Concat { axis: 1 }, cat_in, ct));
    let nvox = os[2] * os[3] * os[4];
    let mut want = T::zeros([os[0], ct, os[2], os[3], os[4]]);
    for n in 0..os[0] {
        let mut off = 0;
        for (t, &c) in refs.iter().zip(&cs) {
            for ch in 0..c {
                for v in 0..nvox {
                    want.d[(n * ct + off + ch) * nvox + v] = t.d[(n * c + ch) * nvox + v];
                }
            }
            off += c;
        }
    }
    let got = run(b, &graph(cin, nodes), x, os[0]);
    report(name, rel_l2(&got, &want));
    kernels_used(b, os[0])
}

/// `CONV_C1_K3` (Cin 1, 3^3, stride 1/2, Cout <= 64) vs float64: Cout 16/32/20/64/24, stride
/// 1, 2 and mixed, zero / asymmetric pads, odd sizes (partial 2x8x32 tiles on every axis),
/// fused activations, outputs into concat slices (8-aligned stride and offset: 16-byte stores;
/// odd: element stores). Each case checks that `CONV_C1_K3` ran; the switch turns it off.
#[test]
fn conv_c1_cases() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("c1");
    b.with(|o| o.conv_tile = None);
    b.with(|o| o.c1_conv = true);
    let leaky = || Some(Op::LeakyRelu { alpha: 0.1 });
    #[allow(clippy::type_complexity)]
    let cases: Vec<(usize, [usize; 3], [usize; 3], [usize; 6], Option<Op>)> = vec![
        (32, [9, 13, 37], [1; 3], [1; 6], None),
        (16, [7, 10, 33], [1; 3], [0; 6], Some(Op::Relu)),
        (20, [5, 17, 40], [2; 3], [1; 6], leaky()),
        (64, [4, 9, 70], [2; 3], [2, 1, 0, 0, 1, 2], None),
        (24, [3, 5, 7], [2, 1, 2], [1, 0, 1, 1, 0, 1], leaky()),
        (8, [11, 8, 31], [1; 3], [1; 6], Some(Op::Sigmoid)),
        (5, [6, 9, 12], [1, 2, 1], [1; 6], None),
    ];
    for (cout, sp, st, pads, act) in cases {
        let name = format!(
            "c1 1->{cout} {sp:?} s{st:?} pads {pads:?}{}",
            if act.is_some() { " +act" } else { "" }
        );
        conv_case(
            &mut b,
            &mut r,
            ConvCase::new(&name, 1, cout, sp, 3)
                .st(st)
                .pads(pads)
                .act(act),
        );
        let used = kernels_used(&mut b, 2);
        assert!(
            used.iter().all(|k| k == cat::CONV_C1_K3.name) && !used.is_empty(),
            "{name}: ran {used:?}"
        );
    }
    // Concat slices: [c1 conv a, c1 conv b, (x)]: stride 64 offset 32 (vector stores); stride
    // 37 = 16 + 20 + 1 with offset 16 (element stores).
    for (ca, cb, with_x) in [(32usize, 32usize, false), (16, 20, true), (24, 8, false)] {
        let sp = [5usize, 9, 35];
        let x = T::from(
            [2, 1, sp[0], sp[1], sp[2]],
            &r.scaled(2 * sp.iter().product::<usize>(), 1.0),
        );
        let mut parts = Vec::new();
        for c in [ca, cb] {
            let w = Tensor::new(vec![c, 1, 3, 3, 3], r.scaled(c * 27, 0.3));
            let bias = Tensor::new(vec![c], r.scaled(c, 0.5));
            let want = conv_ref(&x, &w, Some(&bias), PAD1);
            let op = Op::Conv(Conv {
                weight: w,
                bias: Some(bias),
                stride: [1; 3],
                dilation: [1; 3],
                pads: [1; 6],
                groups: 1,
            });
            parts.push((op, want));
        }
        let name = format!(
            "c1 convs into concat [{ca}, {cb}{}]",
            if with_x { ", x" } else { "" }
        );
        let used = concat_parts_case(&mut b, &name, &x, parts, with_x);
        assert!(
            !used.is_empty() && used.iter().all(|k| k == cat::CONV_C1_K3.name),
            "{name}: ran {used:?}"
        );
    }
    // Switched off: the mma tile runs the same conv.
    b.with(|o| o.c1_conv = false);
    conv_case(
        &mut b,
        &mut r,
        ConvCase::new("c1 off 1->32", 1, 32, [6, 7, 9], 3).pads([1; 6]),
    );
    let used = kernels_used(&mut b, 2);
    assert!(used.iter().all(|k| k.starts_with("conv_mma_")), "{used:?}");
    b.with(|o| o.c1_conv = true);
}

/// `convt_up_*` (kernel == stride transposed conv, Cin and Cout % 8 == 0, 16-byte staged
/// epilogue) vs float64: k2s2 with Cin 32/64/128/320, Cout 32/64/16/24, odd spatial sizes
/// (partial M tiles), every v8 tile forced once, Cout 14 (falls back to the scatter epilogue),
/// outputs into concat slices (aligned: vector stores; offset 14: element stores).
#[test]
fn convt_up_vec_cases() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("upvec");
    b.with(|o| o.conv_tile = None);
    b.with(|o| o.upsample_vec = true);
    let cases: Vec<(usize, usize, [usize; 3], Option<&str>)> = vec![
        (32, 32, [5, 6, 7], None),
        (64, 32, [3, 5, 9], None),
        (128, 64, [4, 3, 5], None),
        (320, 64, [3, 3, 2], None),
        (64, 16, [7, 5, 3], None),
        (128, 24, [5, 5, 5], None),
        (32, 14, [5, 4, 3], None),
        (64, 32, [9, 7, 5], Some(cat::CONV_MMA_M256N32_V8.name)),
        (64, 32, [9, 7, 5], Some(cat::CONV_MMA_M128N32_V8.name)),
        (64, 64, [5, 7, 3], Some(cat::CONV_MMA_M128N64_V8.name)),
        (32, 64, [3, 3, 7], Some(cat::CONV_MMA_M128N128_V8.name)),
    ];
    for (cin, cout, sp, tile) in cases {
        b.with(|o| o.conv_tile = tile.map(mma_named));
        let name = format!(
            "convt_up k2s2 {cin}->{cout} {sp:?} {}",
            tile.unwrap_or("auto")
        );
        convt_case(
            &mut b,
            &mut r,
            ConvCase::new(&name, cin, cout, sp, 2).st([2; 3]),
        );
        let used = kernels_used(&mut b, 2);
        let ok = if cout % 8 == 0 {
            used.iter().all(|k| {
                k.starts_with("convt_up_")
                    && tile.is_none_or(|t| k.as_str() == t.replace("conv_mma_", "convt_up_"))
            })
        } else {
            used.iter().all(|k| k.starts_with("conv_mma_"))
        };
        assert!(ok && !used.is_empty(), "{name}: ran {used:?}");
    }
    b.with(|o| o.conv_tile = None);
    // Concat slices of two k2s2 transposed convs of the same input: [32, 24] (stride 56,
    // offset 32: vector stores) and [14, 32] (stride 46, offset 14: element stores).
    for (ca, cb) in [(32usize, 24usize), (14, 32)] {
        let (cin, sp) = (64usize, [3usize, 5, 4]);
        let x = T::from([2, cin, sp[0], sp[1], sp[2]], &r.scaled(2 * cin * 60, 1.0));
        let mut parts = Vec::new();
        for c in [ca, cb] {
            let w = Tensor::new(vec![cin, c, 2, 2, 2], r.scaled(cin * c * 8, 0.125));
            let bias = Tensor::new(vec![c], r.scaled(c, 0.5));
            let want = conv_ref(
                &x,
                &w,
                Some(&bias),
                Kernel {
                    st: [2; 3],
                    transposed: true,
                    ..PLAIN
                },
            );
            let op = Op::ConvTranspose(ConvTranspose {
                weight: w,
                bias: Some(bias),
                stride: [2; 3],
                dilation: [1; 3],
                pads: [0; 6],
                output_padding: [0; 3],
                groups: 1,
            });
            parts.push((op, want));
        }
        let name = format!("convt_up into concat [{ca}, {cb}]");
        let used = concat_parts_case(&mut b, &name, &x, parts, false);
        assert!(
            used.iter().any(|k| k.starts_with("convt_up_")),
            "{name}: ran {used:?}"
        );
    }
    // A fused activation after the transposed conv (the epilogue's act_apply), then off.
    let (cin, cout, sp) = (32usize, 16usize, [3usize, 4, 5]);
    let x = T::from([2, cin, sp[0], sp[1], sp[2]], &r.scaled(2 * cin * 60, 1.0));
    let w = Tensor::new(vec![cin, cout, 2, 2, 2], r.scaled(cin * cout * 8, 0.18));
    let bias = Tensor::new(vec![cout], r.scaled(cout, 0.5));
    let want = conv_ref(
        &x,
        &w,
        Some(&bias),
        Kernel {
            st: [2; 3],
            transposed: true,
            ..PLAIN
        },
    )
    .map(|_, v| if v >= 0.0 { v } else { 0.1 * v });
    let ct = Op::ConvTranspose(ConvTranspose {
        weight: w,
        bias: Some(bias),
        stride: [2; 3],
        dilation: [1; 3],
        pads: [0; 6],
        output_padding: [0; 3],
        groups: 1,
    });
    let g = graph(
        cin,
        vec![
            (ct, vec![0], cout),
            (Op::LeakyRelu { alpha: 0.1 }, vec![1], cout),
        ],
    );
    for on in [true, false] {
        b.with(|o| o.upsample_vec = on);
        let got = run(&mut b, &g, &x, 2);
        report(
            &format!("convt_up k2s2 + leaky (vec {on})"),
            rel_l2(&got, &want),
        );
        let used = kernels_used(&mut b, 2);
        let pre = if on { "convt_up_" } else { "conv_mma_" };
        assert!(
            !used.is_empty() && used.iter().all(|k| k.starts_with(pre)),
            "{used:?}"
        );
    }
    b.with(|o| o.upsample_vec = true);
}

/// Times one single-conv graph (batch n, window s^3) on random data; returns ms per forward.
fn time_one(
    b: &mut CudaBackend,
    r: &mut Rng,
    op: Op,
    cin: usize,
    cout: usize,
    n: usize,
    s: usize,
) -> f64 {
    let g = graph(cin, vec![(op, vec![0], cout)]);
    b.with(|o| o.poison = false);
    b.prepare(&g, n, [s; 3]).expect("prepare");
    // A random block repeated (not zeros, cheap to make for the 1 GB inputs).
    let total = n * cin * s * s * s;
    let block = r.scaled(total.min(1 << 22), 1.0);
    let data: Vec<f32> = (0..total).map(|i| block[i % block.len()]).collect();
    let x = Array5::from_shape_vec((n, cin, s, s, s), data).unwrap();
    b.run(x.view()).expect("run");
    let est = b.time_forward(n, 3).expect("time");
    let reps = ((100.0 / est.max(1e-3)) as usize).clamp(5, 200);
    b.time_forward(n, reps).expect("time")
}

/// The W1 layer list (nnU-Net CT PlainConvUNet 32..320, roi 128, batch 4): every conv and
/// transposed conv timed alone with CUDA events, legacy wmma kernel vs the mma kernels, and the
/// K1 shape (32->32 3^3 on 2x32x128^3). Prints TFLOP/s per layer and the summed conv time.
#[test]
fn bench_w1_layers() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("w1");
    // (kind, cin, cout, input size, kernel, stride): c = conv pad k/2, t = transposed k = s.
    let feats = [32usize, 64, 128, 256, 320, 320];
    let mut layers: Vec<(char, usize, usize, usize, usize, usize)> = Vec::new();
    let mut s = 128;
    let mut cin = 1;
    for (i, &f) in feats.iter().enumerate() {
        let st = if i == 0 { 1 } else { 2 };
        layers.push(('c', cin, f, s, 3, st));
        s /= st;
        layers.push(('c', f, f, s, 3, 1));
        cin = f;
    }
    for i in (0..5).rev() {
        let f = feats[i];
        layers.push(('t', feats[i + 1], f, s, 2, 2));
        s *= 2;
        layers.push(('c', 2 * f, f, s, 3, 1));
        layers.push(('c', f, f, s, 3, 1));
    }
    layers.push(('c', 32, 14, 128, 1, 1));
    let n = 4;
    // Times by (kind, cin, cout, size, k, stride, variant).
    type LayerKey = (char, usize, usize, usize, usize, usize, usize);
    let mut cache: std::collections::HashMap<LayerKey, f64> = Default::default();
    let (mut tot_old, mut tot_mma, mut tot_new, mut tot_flop) = (0.0, 0.0, 0.0, 0.0);
    for &(kind, ci, co, s, k, st) in &layers {
        let os = if kind == 't' { s * st } else { s / st };
        let flop = if kind == 't' {
            2.0 * (n * s * s * s) as f64 * ci as f64 * (co * k * k * k) as f64
        } else {
            2.0 * (n * os * os * os) as f64 * co as f64 * (ci * k * k * k) as f64
        };
        let mut ms = [0.0; 3];
        // 0: legacy wmma, 1: conv_mma only (halo, Cin-1 and convt_up kernels off), 2: auto.
        let c1 = kind == 'c' && ci == 1 && k == 3 && co <= 64;
        let upv = kind == 't' && k == st && ci % 8 == 0 && co % 8 == 0;
        // The planner's halo rule (Cin k x 32 in chunks, Cout <= 128; PERF_NOTES phase 7).
        let halo = kind == 'c' && default_halo(ci, co, k, st).is_some();
        let mut auto_kernels = Vec::new();
        // (A layer seen before reuses its times: its kernels were checked then.)
        let mut auto_fresh = false;
        for (li, slot) in ms.iter_mut().enumerate() {
            let key = (kind, ci, co, s, k, st, li);
            if let Some(&t) = cache.get(&key) {
                *slot = t;
                continue;
            }
            if li == 1 && !(halo || c1 || upv) {
                // No special kernel: the auto run is the same kernel.
                continue;
            }
            b.with(|o| o.legacy_conv = li == 0);
            b.with(|o| o.halo_conv = li == 2);
            b.with(|o| o.c1_conv = li == 2);
            b.with(|o| o.upsample_vec = li == 2);
            let w = Tensor::new(
                if kind == 't' {
                    vec![ci, co, k, k, k]
                } else {
                    vec![co, ci, k, k, k]
                },
                r.scaled(ci * co * k * k * k, 1.0 / ((ci * k * k * k) as f32).sqrt()),
            );
            let bias = Some(Tensor::new(vec![co], r.scaled(co, 0.1)));
            let op = if kind == 't' {
                Op::ConvTranspose(ConvTranspose {
                    weight: w,
                    bias,
                    stride: [st; 3],
                    dilation: [1; 3],
                    pads: [0; 6],
                    output_padding: [0; 3],
                    groups: 1,
                })
            } else {
                Op::Conv(Conv {
                    weight: w,
                    bias,
                    stride: [st; 3],
                    dilation: [1; 3],
                    pads: [k / 2; 6],
                    groups: 1,
                })
            };
            let t = time_one(&mut b, &mut r, op, ci, co, n, s);
            if li == 2 && (c1 || upv || halo) {
                auto_kernels = kernels_used(&mut b, n);
                auto_fresh = true;
            }
            cache.insert(key, t);
            *slot = t;
        }
        // "auto" must be the new kernel where it applies ("mma" is then the old path).
        if c1 && auto_fresh {
            assert!(
                auto_kernels.iter().all(|k| k == cat::CONV_C1_K3.name),
                "{auto_kernels:?}"
            );
        }
        if upv && auto_fresh {
            assert!(
                auto_kernels.iter().all(|k| k.starts_with("convt_up_")),
                "{auto_kernels:?}"
            );
        }
        if halo && auto_fresh {
            assert!(
                !auto_kernels.is_empty()
                    && auto_kernels.iter().all(|k| k.starts_with("conv_halo_")),
                "{kind} {ci}->{co} at {s}^3: {auto_kernels:?}"
            );
        }
        if ms[1] == 0.0 {
            ms[1] = ms[2];
        }
        tot_old += ms[0];
        tot_mma += ms[1];
        tot_new += ms[2];
        tot_flop += flop;
        println!(
            "RESULT w1 {kind} {ci:>3}->{co:<3} k{k}s{st} in {s:>3}^3: legacy {:7.3} ms {:6.1} TF/s | mma {:7.3} ms {:6.1} TF/s | auto {:7.3} ms {:6.1} TF/s{}",
            ms[0],
            flop / ms[0] / 1e9,
            ms[1],
            flop / ms[1] / 1e9,
            ms[2],
            flop / ms[2] / 1e9,
            if auto_kernels.is_empty() {
                String::new()
            } else {
                format!(" [{}]", auto_kernels.join(", "))
            }
        );
    }
    b.with(|o| o.halo_conv = true);
    b.with(|o| o.c1_conv = true);
    b.with(|o| o.upsample_vec = true);
    println!(
        "RESULT w1 convs total (batch 4): {:.1} GFLOP, legacy {tot_old:.2} ms ({:.1} TF/s), mma {tot_mma:.2} ms ({:.1} TF/s), auto (halo) {tot_new:.2} ms ({:.1} TF/s)",
        tot_flop / 1e9,
        tot_flop / tot_old / 1e9,
        tot_flop / tot_mma / 1e9,
        tot_flop / tot_new / 1e9
    );
    // K1: conv 32->32 3^3 on 2x32x128^3 (cuDNN NDHWC: 166 TF/s), every vectorised tile.
    let flop = 2.0 * (2 * 128usize.pow(3)) as f64 * 32.0 * (27 * 32) as f64;
    let k1 = |r: &mut Rng| {
        Op::Conv(Conv {
            weight: Tensor::new(vec![32, 32, 3, 3, 3], r.scaled(32 * 32 * 27, 0.03)),
            bias: None,
            stride: [1; 3],
            dilation: [1; 3],
            pads: [1; 6],
            groups: 1,
        })
    };
    b.with(|o| o.legacy_conv = true);
    let op = k1(&mut r);
    let t = time_one(&mut b, &mut r, op, 32, 32, 2, 128);
    println!(
        "RESULT K1 legacy wmma: {t:.3} ms {:.1} TF/s",
        flop / t / 1e9
    );
    b.with(|o| o.legacy_conv = false);
    for tile in [
        None,
        Some(cat::CONV_MMA_M256N32_V8.name),
        Some(cat::CONV_MMA_M128N32_V8.name),
    ] {
        // auto = the halo kernel (CONV_HALO_C32N32); forced tiles turn it off.
        b.with(|o| o.conv_tile = tile.map(mma_named));
        let op = k1(&mut r);
        let t = time_one(&mut b, &mut r, op, 32, 32, 2, 128);
        println!(
            "RESULT K1 {}: {t:.3} ms {:.1} TF/s ({:.2}x cuDNN 166)",
            tile.unwrap_or("auto"),
            flop / t / 1e9,
            flop / t / 1e9 / 166.0
        );
    }
    b.with(|o| o.conv_tile = None);
    let op = k1(&mut r);
    b.with(|o| o.halo_tile = Some(&cat::CONV_HALO_C32N32_W4));
    let t = time_one(&mut b, &mut r, op, 32, 32, 2, 128);
    println!(
        "RESULT K1 {}: {t:.3} ms {:.1} TF/s ({:.2}x cuDNN 166)",
        cat::CONV_HALO_C32N32_W4.name,
        flop / t / 1e9,
        flop / t / 1e9 / 166.0
    );
    // W1's 64->32 at 128^3 (batch 4) on the 4-warp variant (the layer table has the default).
    let op = Op::Conv(Conv {
        weight: Tensor::new(vec![32, 64, 3, 3, 3], r.scaled(32 * 64 * 27, 0.02)),
        bias: None,
        stride: [1; 3],
        dilation: [1; 3],
        pads: [1; 6],
        groups: 1,
    });
    b.with(|o| o.halo_tile = Some(&cat::CONV_HALO_C64N32_W4));
    let t = time_one(&mut b, &mut r, op, 64, 32, 4, 128);
    println!(
        "RESULT w1 c 64->32 k3s1 in 128^3 on {}: {t:.3} ms {:.1} TF/s",
        cat::CONV_HALO_C64N32_W4.name,
        2.0 * (4 * 128usize.pow(3)) as f64 * 32.0 * (27 * 64) as f64 / t / 1e9
    );
    b.with(|o| o.halo_tile = None);
}

/// Every `conv_halo_*` variant (forced by name) on K1 (32->32 3^3, 2x32x128^3; cuDNN NDHWC
/// 166 TF/s), W1's 64->32 (2x64x128^3) and 64->64 (4x64x64^3), W2's 14->14 (4x14x128^3, the
/// last ResidualUnit conv) and 16->16 (4x16x64^3), and a Cin-4 conv (forced only): one RESULT
/// line per variant with ms and TF/s (real FLOPs, not the zero-padded ones), the default
/// marked, so the HALO_CONFIGS order can be chosen from one run. For Cin < 32 also the old
/// path (halo off: `conv_mma_*`) and a `RESULT w2 ... old ... new` summary line.
#[test]
fn bench_halo_variants() {
    use voxtile::internals::cuda::host::catalogue::{HaloConfig, HALO_CONFIGS};
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("halo-bench");
    b.with(|o| o.conv_tile = None);
    b.with(|o| o.halo_conv = true);
    for (cin, cout, n, s, label) in [
        (32usize, 32usize, 2usize, 128usize, "K1 32->32 2x128^3"),
        (64, 32, 2, 128, "64->32 2x128^3"),
        (64, 64, 4, 64, "64->64 4x64^3"),
        (14, 14, 4, 128, "W2 14->14 4x128^3"),
        (16, 16, 4, 64, "W2 16->16 4x64^3"),
        (4, 16, 4, 128, "Cin4 4->16 4x128^3"),
        (128, 64, 4, 64, "128->64 4x64^3"),
        (128, 128, 4, 32, "128->128 4x32^3"),
    ] {
        let flop = 2.0 * (n * s * s * s) as f64 * cout as f64 * (27 * cin) as f64;
        let conv = |r: &mut Rng| {
            Op::Conv(Conv {
                weight: Tensor::new(
                    vec![cout, cin, 3, 3, 3],
                    r.scaled(cout * cin * 27, 1.0 / ((27 * cin) as f32).sqrt()),
                ),
                bias: None,
                stride: [1; 3],
                dilation: [1; 3],
                pads: [1; 6],
                groups: 1,
            })
        };
        // The old path: halo off, asserted not to run a halo kernel.
        let old = (!(32..=64).contains(&cin)).then(|| {
            b.with(|o| o.halo_conv = false);
            let op = conv(&mut r);
            let t = time_one(&mut b, &mut r, op, cin, cout, n, s);
            let used = kernels_used(&mut b, n);
            assert!(
                !used.is_empty() && used.iter().all(|k| !k.starts_with("conv_halo")),
                "{label}: halo off ran {used:?}"
            );
            b.with(|o| o.halo_conv = true);
            println!(
                "RESULT halo {label} {:<22} {t:.3} ms {:6.1} TF/s (old path, halo off)",
                used.join("+"),
                flop / t / 1e9
            );
            t
        });
        // The variants at the planner's tile width (the narrowest that holds Cout).
        // (Cout above every width: the widest, in grid.y channel tiles.)
        let runs = |v: &&HaloConfig| v.accepts_cin(cin);
        let widths = || HALO_CONFIGS.iter().filter(runs).map(|v| v.bn);
        let bn = widths()
            .filter(|&w| cout <= w)
            .min()
            .or_else(|| widths().max())
            .unwrap();
        let default = default_halo(cin, cout, 3, 1).map(|c| c.name);
        let mut times: Vec<(f64, &str)> = Vec::new();
        for v in HALO_CONFIGS.iter().filter(runs).filter(|v| v.bn == bn) {
            b.with(|o| o.halo_tile = Some(v));
            let op = conv(&mut r);
            let t = time_one(&mut b, &mut r, op, cin, cout, n, s);
            let used = kernels_used(&mut b, n);
            if !used.iter().any(|k| k == v.name) {
                println!(
                    "RESULT halo {label} {}: not run (smem), ran {used:?}",
                    v.name
                );
                continue;
            }
            println!(
                "RESULT halo {label} {:<22} {t:.3} ms {:6.1} TF/s{}{}",
                v.name,
                flop / t / 1e9,
                if cin == 32 && cout == 32 {
                    format!(" ({:.2}x cuDNN 166)", flop / t / 1e9 / 166.0)
                } else {
                    String::new()
                },
                if default == Some(v.name) {
                    " [default]"
                } else {
                    ""
                }
            );
            times.push((t, v.name));
        }
        // "new": the default, or (Cin 4, forced only) the fastest variant.
        let new = match default {
            Some(d) => times.iter().find(|x| x.1 == d).copied(),
            None => times.iter().copied().min_by(|a, b| a.0.total_cmp(&b.0)),
        };
        if let (Some(t0), Some((t1, name))) = (old, new) {
            println!(
                "RESULT halo-vs-old c {cin}->{cout} k3s1 {label}: old {t0:.3} ms {:.1} TF/s | new {t1:.3} ms {:.1} TF/s on {name}{} ({:.2}x)",
                flop / t0 / 1e9,
                flop / t1 / 1e9,
                if default == Some(name) { " [default]" } else { " [fastest variant, forced]" },
                t0 / t1
            );
        }
    }
    b.with(|o| o.halo_tile = None);
}

/// Per-op profile (`profile_forward`) of the models in VOXTILE_PROFILE_ONNX
/// ("path[:roi[:batch]],...", e.g. W1/W2 exported by tests/gpu/bench.py), else of a small
/// conv/norm/concat chain. Prints the ops by time; checks that the per-step sum matches the
/// timed forward (events add only small gaps) and that the profile covers every launch. Then
/// times the forward again with fp16 norm inputs (`CudaOptions::norm_f32` off) in the same
/// run: the cost of the fp32 ones, and their activation bytes.
#[test]
fn profile_models() {
    let Some(mut b) = gpu() else { return };
    b.with(|o| o.poison = false);
    let mut r = Rng::tagged("profile");
    let spec = std::env::var("VOXTILE_PROFILE_ONNX").unwrap_or_default();
    let mut cases: Vec<(String, Graph, usize, usize)> = Vec::new();
    for item in spec.split(',').filter(|s| !s.is_empty()) {
        let mut f = item.split(':');
        let path = f.next().unwrap().to_string();
        let roi = f.next().and_then(|v| v.parse().ok()).unwrap_or(128);
        let batch = f.next().and_then(|v| v.parse().ok()).unwrap_or(4);
        let g = voxtile::model::onnx::load(&path).expect("model loads");
        cases.push((path, g, roi, batch));
    }
    if cases.is_empty() {
        let c = 16;
        let conv = |r: &mut Rng, ci: usize| {
            Op::Conv(Conv {
                weight: Tensor::new(vec![c, ci, 3, 3, 3], r.scaled(c * ci * 27, 0.1)),
                bias: None,
                stride: [1; 3],
                dilation: [1; 3],
                pads: [1; 6],
                groups: 1,
            })
        };
        let norm = Op::InstanceNorm {
            eps: 1e-5,
            scale: Tensor::new(vec![c], r.scaled(c, 1.0)),
            bias: Tensor::new(vec![c], r.scaled(c, 1.0)),
        };
        let g = graph(
            1,
            vec![
                (conv(&mut r, 1), vec![0], c),
                (norm, vec![1], c),
                (Op::LeakyRelu { alpha: 0.01 }, vec![2], c),
                (conv(&mut r, c), vec![3], c),
                (Op::Concat { axis: 1 }, vec![3, 4], 2 * c),
            ],
        );
        cases.push(("chain".into(), g, 32, 2));
    }
    for (name, g, roi, batch) in cases {
        b.prepare(&g, batch, [roi; 3]).expect("prepare");
        let cin = g.input_channels();
        let x = Array5::from_shape_vec(
            (batch, cin, roi, roi, roi),
            r.scaled(batch * cin * roi * roi * roi, 1.0),
        )
        .unwrap();
        b.run(x.view()).expect("run");
        let t = b.time_forward(batch, 5).expect("time");
        let prof = b.profile_forward(batch, 3).expect("profile");
        let sum: f64 = prof.iter().map(|p| p.1).sum();
        let launches: usize = prof.iter().map(|p| p.2).sum();
        println!("RESULT profile {name} roi {roi} batch {batch}: forward {t:.3} ms, per-op sum {sum:.3} ms, {launches} steps");
        let mut kinds: Vec<(String, f64)> = Vec::new();
        for (label, ms, _) in &prof {
            let k = label.split(' ').next().unwrap_or("").to_string();
            match kinds.iter_mut().find(|a| a.0 == k) {
                Some(a) => a.1 += ms,
                None => kinds.push((k, *ms)),
            }
        }
        kinds.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (k, ms) in &kinds {
            println!(
                "RESULT profile {name} kind {k:<14} {ms:8.3} ms {:5.1}%",
                100.0 * ms / sum
            );
        }
        for (label, ms, cnt) in &prof {
            println!("PROF {name} {ms:8.3} ms x{cnt:<3} {label}");
        }
        assert!(launches > 0 && prof.iter().all(|p| p.1 >= 0.0 && !p.0.is_empty()));
        assert!(
            sum > 0.7 * t && sum < 2.0 * t + 0.5,
            "per-op sum {sum} ms vs forward {t} ms"
        );
        let arena = b.activation_bytes();
        b.with(|o| o.norm_f32 = false);
        b.prepare(&g, batch, [roi; 3]).expect("prepare");
        let y16 = b.run(x.view()).expect("run").to_owned();
        let t16 = b.time_forward(batch, 5).expect("time");
        let arena16 = b.activation_bytes();
        b.with(|o| o.norm_f32 = true);
        println!(
            "RESULT profile {name} roi {roi} batch {batch}: fp32 norm inputs {t:.3} ms, arena {:.1} MiB | fp16 {t16:.3} ms, arena {:.1} MiB ({:.3}x)",
            arena as f64 / 1048576.0,
            arena16 as f64 / 1048576.0,
            t / t16
        );
        assert!(y16.iter().all(|v| v.is_finite()));
        assert!(arena >= arena16);
    }
}

/// A conv and a residual Add written straight into their concat's channel slices, a plain copy
/// for the third input, then the 1x1x1 head kernel (24 -> 5) against float64.
#[test]
fn concat_in_place_and_head() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("inplace");
    let (c, sp) = (8usize, [6usize, 7, 5]);
    let nvox = sp.iter().product::<usize>();
    let x = T::from([2, c, sp[0], sp[1], sp[2]], &r.scaled(2 * c * nvox, 1.0));
    let wa = Tensor::new(vec![16, c, 3, 3, 3], r.scaled(16 * c * 27, 0.1));
    let wb = Tensor::new(vec![c, c, 3, 3, 3], r.scaled(c * c * 27, 0.1));
    let wh = Tensor::new(vec![5, 32, 1, 1, 1], r.scaled(5 * 32, 0.3));
    let bh = Tensor::new(vec![5], r.scaled(5, 0.1));
    let conv = |w: &Tensor, bias: Option<Tensor>, p: usize| {
        Op::Conv(Conv {
            weight: w.clone(),
            bias,
            stride: [1; 3],
            dilation: [1; 3],
            pads: [p; 6],
            groups: 1,
        })
    };
    let g = graph(
        c,
        vec![
            (conv(&wa, None, 1), vec![0], 16), // v1 -> concat slice 0..16
            (conv(&wb, None, 1), vec![0], c),  // v2
            (Op::Add, vec![2, 0], c),          // v3 -> concat slice 16..24
            (Op::Concat { axis: 1 }, vec![1, 3, 0], 32), // v4 (x copied at 24..32)
            (conv(&wh, Some(bh.clone()), 0), vec![4], 5), // v5 head
        ],
    );
    let v1 = conv_ref(&x, &wa, None, PAD1);
    let v2 = conv_ref(&x, &wb, None, PAD1);
    let mut cat = T::zeros([2, 32, sp[0], sp[1], sp[2]]);
    for n in 0..2 {
        for ch in 0..32 {
            for v in 0..nvox {
                let (src, sc) = match ch {
                    0..=15 => (v1.d[(n * 16 + ch) * nvox + v], 0.0),
                    16..=23 => (
                        v2.d[(n * c + ch - 16) * nvox + v],
                        x.d[(n * c + ch - 16) * nvox + v],
                    ),
                    _ => (x.d[(n * c + ch - 24) * nvox + v], 0.0),
                };
                cat.d[(n * 32 + ch) * nvox + v] = src + sc;
            }
        }
    }
    let want = conv_ref(&cat, &wh, Some(&bh), PLAIN);
    let got = run(&mut b, &g, &x, 2);
    report(
        "concat in place (conv, add, copy) + 1x1x1 head",
        rel_l2(&got, &want),
    );
}

/// Conv outputs that only an InstanceNorm reads are stored in fp32 (`CudaOptions::norm_f32`):
/// every conv kernel family's fp32 epilogue (halo vector and pair stores, mma, Cin-1, grouped
/// direct, the upsampling GEMM with and without its staged epilogue, strided transposed convs
/// per parity class and fused, the wmma GEMM) through conv -> InstanceNorm -> LeakyReLU against
/// float64, with per-channel offsets (bias 4) large against the spread, where fp16 storage
/// loses most. Each case runs with fp32 and with fp16 norm inputs; over all cases the fp32
/// error must be the smaller one by a clear margin (fp16 storage rounds the raw value; the
/// norm then divides its error by the spread).
#[test]
fn conv_norm_fp32_inputs() {
    let Some(mut b) = gpu() else { return };
    let mut r = Rng::tagged("normf32");
    // (name, cin, cout, input spatial, k, stride, pads, output padding, groups, transposed,
    //  legacy wmma convs, the kernel expected)
    type Case = (
        &'static str,
        usize,
        usize,
        [usize; 3],
        usize,
        usize,
        usize,
        usize,
        usize,
        bool,
        bool,
        &'static str,
    );
    let cases: [Case; 10] = [
        (
            "halo 32->32 (vector store)",
            32,
            32,
            [8, 9, 10],
            3,
            1,
            1,
            0,
            1,
            false,
            false,
            "conv_halo",
        ),
        (
            "halo 32->20 (pair store)",
            32,
            20,
            [8, 9, 10],
            3,
            1,
            1,
            0,
            1,
            false,
            false,
            "conv_halo",
        ),
        (
            "mma 3^3 s2 16->64",
            16,
            64,
            [12, 10, 9],
            3,
            2,
            1,
            0,
            1,
            false,
            false,
            "conv_mma",
        ),
        (
            "Cin-1 3^3 -> 8",
            1,
            8,
            [11, 10, 9],
            3,
            1,
            1,
            0,
            1,
            false,
            false,
            "conv_c1_k3",
        ),
        (
            "grouped g=4 16->16 (direct)",
            16,
            16,
            [8, 8, 8],
            3,
            1,
            1,
            0,
            4,
            false,
            false,
            "conv_direct",
        ),
        (
            "convT k2 s2 32->16 (staged)",
            32,
            16,
            [5, 6, 7],
            2,
            2,
            0,
            0,
            1,
            true,
            false,
            "convt_up",
        ),
        (
            "convT k2 s2 12->6 (scatter)",
            12,
            6,
            [5, 6, 7],
            2,
            2,
            0,
            0,
            1,
            true,
            false,
            "conv_mma",
        ),
        (
            "convT k3 s2 40->20 (fused parity)",
            40,
            20,
            [4, 4, 4],
            3,
            2,
            1,
            1,
            1,
            true,
            false,
            "conv_mma",
        ),
        (
            "convT k3 s2 40->20 odd (parity)",
            40,
            20,
            [4, 5, 4],
            3,
            2,
            1,
            0,
            1,
            true,
            false,
            "conv_mma",
        ),
        (
            "wmma 3^3 16->24",
            16,
            24,
            [7, 8, 9],
            3,
            1,
            1,
            0,
            1,
            false,
            true,
            "conv_igemm",
        ),
    ];
    let (mut sum32, mut sum16) = (0.0, 0.0);
    for (name, cin, cout, sp, k, st, pad, opad, groups, transposed, legacy, want_kernel) in cases {
        let x = T::from(
            [2, cin, sp[0], sp[1], sp[2]],
            &r.scaled(2 * cin * sp.iter().product::<usize>(), 1.0),
        );
        let taps = k * k * k;
        let (wshape, fan) = if transposed {
            (vec![cin, cout / groups, k, k, k], cin / groups)
        } else {
            (vec![cout, cin / groups, k, k, k], cin / groups * taps)
        };
        let wlen: usize = wshape.iter().product();
        let w = Tensor::new(wshape, r.scaled(wlen, 1.0 / (fan as f32).sqrt()));
        let bias = Tensor::new(vec![cout], vec![4.0; cout]);
        let geo = Kernel {
            st: [st; 3],
            pads: [pad; 6],
            groups,
            transposed,
            opad: [opad; 3],
            ..PLAIN
        };
        let op = if transposed {
            Op::ConvTranspose(ConvTranspose {
                weight: w.clone(),
                bias: Some(bias.clone()),
                stride: [st; 3],
                dilation: [1; 3],
                pads: [pad; 6],
                output_padding: [opad; 3],
                groups,
            })
        } else {
            Op::Conv(Conv {
                weight: w.clone(),
                bias: Some(bias.clone()),
                stride: [st; 3],
                dilation: [1; 3],
                pads: [pad; 6],
                groups,
            })
        };
        let scale = Tensor::new(vec![cout], r.scaled(cout, 1.0));
        let shift = Tensor::new(vec![cout], r.scaled(cout, 0.5));
        let norm = Op::InstanceNorm {
            eps: 1e-5,
            scale: scale.clone(),
            bias: shift.clone(),
        };
        let leaky = Op::LeakyRelu { alpha: 0.01 };
        let want = norm_ref(
            &conv_ref(&x, &w, Some(&bias), geo),
            cout,
            1e-5,
            &scale,
            &shift,
        )
        .map(|c, v| act_ref(&leaky, c, v));
        let g = graph(
            cin,
            vec![
                (op, vec![0], cout),
                (norm, vec![1], cout),
                (leaky, vec![2], cout),
            ],
        );
        b.with(|o| o.legacy_conv = legacy);
        let mut errs = [0.0; 2];
        for (i, f32_in) in [true, false].into_iter().enumerate() {
            b.with(|o| o.norm_f32 = f32_in);
            let got = run(&mut b, &g, &x, 2);
            let used = kernels_used(&mut b, 2);
            assert!(
                used.iter().any(|k| k.starts_with(want_kernel)),
                "{name}: ran {used:?}, expected {want_kernel}*"
            );
            errs[i] = rel_l2(&got, &want);
        }
        println!(
            "RESULT conv->norm {name:<36} fp32 norm input {:.2e} | fp16 {:.2e}",
            errs[0], errs[1]
        );
        assert!(errs[0] <= TOL, "{name}: rel L2 {:.3e}", errs[0]);
        sum32 += errs[0];
        sum16 += errs[1];
    }
    b.with(|o| {
        o.legacy_conv = false;
        o.norm_f32 = true;
    });
    println!(
        "RESULT conv->norm mean rel L2: fp32 inputs {:.2e}, fp16 {:.2e}",
        sum32 / 10.0,
        sum16 / 10.0
    );
    assert!(
        sum32 < 0.7 * sum16,
        "fp32 norm inputs {sum32:.3e} vs fp16 {sum16:.3e}"
    );
}
