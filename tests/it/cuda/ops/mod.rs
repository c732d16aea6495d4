//! GPU op tests by op family: every op of the graph IR on the CUDA backend against the shared
//! float64 references (`ops::reference`, NCDHW) on random inputs, the kernel variants of each
//! family forced one by one, and the timings. The cases both backends run are the op-case table in
//! `ops/`. A fresh seed per run (printed; VOXTILE_SEED=... to replay). Skips without a GPU unless
//! VOXTILE_REQUIRE_GPU=1. Every run poisons activation buffers with NaN first, so an unwritten
//! element fails the check. Run on the GPU machine with tests/gpu/run.sh.

mod bench;
mod chain;
mod concat_split;
mod conv;
mod conv_halo;
mod conv_small;
mod conv_wgk;
mod conv_wgmma;
mod eltwise;
mod norm;
mod norm_head;
mod norm_stats;
mod pool;
mod residual;

pub use crate::common::rng::Rng;
pub use crate::ops::reference::{self, act as act_ref, sh};
pub use ndarray::{Array3, Array4, Array5};
pub use voxtile::internals::cuda::host::catalogue::{
    self as cat, halo_config, MmaConfig, MMA_CONFIGS,
};
pub use voxtile::internals::cuda::host::select::pick_halo;
pub use voxtile::internals::cuda::host::select::ConvGeom;
pub use voxtile::internals::cuda::stream::WindowJob;
pub use voxtile::internals::cuda::{CudaBackend, CudaOptions};
pub use voxtile::model::graph::*;

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
    // The stride-2 halo kernels run only with `halo_s2` (off by default).
    if st != 1 {
        return None;
    }
    pick_halo(&geom3(cin, cout, [8; 3], [8; 3], k, st), 227 * 1024, None)
}

/// A plain `k`^3 conv of stride `st` (pads 1, one group) from `xs` to `os` voxels: what the
/// kernel choice reads.
fn geom3(cin: usize, cout: usize, xs: [usize; 3], os: [usize; 3], k: usize, st: usize) -> ConvGeom {
    ConvGeom {
        xs: [cin, xs[0], xs[1], xs[2]],
        os: [cout, os[0], os[1], os[2]],
        k: [k; 3],
        stride: [st; 3],
        dil: [1; 3],
        pads: [1; 3],
        groups: 1,
        transposed: false,
        upsample: false,
    }
}

/// A random input of two samples of `c` channels over `sp`, values in [-1, 1).
fn input2(r: &mut Rng, c: usize, sp: [usize; 3]) -> T {
    let n = 2 * c * sp.iter().product::<usize>();
    T::from([2, c, sp[0], sp[1], sp[2]], &r.scaled(n, 1.0))
}

/// Random 3^3 conv weights `[cout, cin, 3, 3, 3]` scaled by 1/sqrt(fan-in), so outputs stay
/// near unit size whatever the channels.
fn weight3(r: &mut Rng, cout: usize, cin: usize) -> Tensor {
    let scale = 1.0 / ((cin * 27) as f32).sqrt();
    Tensor::new(vec![cout, cin, 3, 3, 3], r.scaled(cout * cin * 27, scale))
}

/// A backend on a GPU with the wgmma kernels, the halo and wgmma paths on (None elsewhere).
fn wgmma_gpu() -> Option<CudaBackend> {
    let mut b = gpu()?;
    if !cat::has_wgmma(b.arch()) {
        println!("skipped: the wgmma kernels run on compute capability 9.0 only");
        return None;
    }
    b.with(|o| o.conv_tile = None);
    b.with(|o| o.halo_conv = true);
    b.with(|o| o.wgmma_conv = true);
    Some(b)
}

fn gpu() -> Option<CudaBackend> {
    let mut b = crate::common::cuda_backend()?;
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

/// Whether two outputs are the same bits, element for element (fixed-order reductions).
fn same_bits<'a>(
    a: impl IntoIterator<Item = &'a f32>,
    b: impl IntoIterator<Item = &'a f32>,
) -> bool {
    a.into_iter()
        .zip(b)
        .all(|(p, q)| p.to_bits() == q.to_bits())
}

/// The largest |a - b| over two outputs.
fn max_abs_diff<'a>(
    a: impl IntoIterator<Item = &'a f32>,
    b: impl IntoIterator<Item = &'a f32>,
) -> f32 {
    a.into_iter()
        .zip(b)
        .map(|(p, q)| (p - q).abs())
        .fold(0f32, f32::max)
}

/// A graph of nodes applied in order (see [`crate::common::graph::chain`]).
fn graph(cin: usize, nodes: Vec<(Op, Vec<usize>, usize)>) -> Graph {
    crate::common::graph::chain("t", cin, nodes)
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

impl T {
    /// `a` as a flat tensor.
    fn of(a: &Array5<f64>) -> T {
        T {
            s: sh(a),
            d: a.iter().copied().collect(),
        }
    }

    /// The tensor as an array.
    fn array(&self) -> Array5<f64> {
        Array5::from_shape_vec(self.s, self.d.clone()).unwrap()
    }
}

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

/// A kernel == stride == 2 transposed conv without pads (the upsampling GEMM's and
/// `convt_up2_p`'s), for [`conv_ref`]; [`convt2`] is the op.
const UP2: Kernel = Kernel {
    st: [2; 3],
    transposed: true,
    ..PLAIN
};

/// That transposed conv with weight `w` ([Cin, Cout, 2, 2, 2]) and `bias`.
fn convt2(w: Tensor, bias: Tensor) -> Op {
    Op::ConvTranspose(ConvTranspose {
        weight: w,
        bias: Some(bias),
        stride: [2; 3],
        dilation: [1; 3],
        pads: [0; 6],
        output_padding: [0; 3],
        groups: 1,
    })
}

/// [`PLAIN`] with pads 1 on every side (a "same" 3^3 conv).
const PAD1: Kernel = Kernel {
    pads: [1; 6],
    ..PLAIN
};

/// A conv or transposed conv by the shared reference (`ops::reference`).
fn conv_ref(x: &T, w: &Tensor, bias: Option<&Tensor>, geo: Kernel) -> T {
    let x = x.array();
    let (weight, bias) = (w.clone(), bias.cloned());
    T::of(&if geo.transposed {
        reference::conv_t(
            &x,
            &ConvTranspose {
                weight,
                bias,
                stride: geo.st,
                dilation: geo.dl,
                pads: geo.pads,
                output_padding: geo.opad,
                groups: geo.groups,
            },
        )
    } else {
        reference::conv(
            &x,
            &Conv {
                weight,
                bias,
                stride: geo.st,
                dilation: geo.dl,
                pads: geo.pads,
                groups: geo.groups,
            },
        )
    })
}

fn norm_ref(x: &T, groups: usize, eps: f32, scale: &Tensor, bias: &Tensor) -> T {
    T::of(&reference::group_norm(
        &x.array(),
        groups,
        eps as f64,
        &scale.data,
        &bias.data,
    ))
}

/// A norm of random scale (x1) and shift (x0.5) over `c` channels in `groups`, eps 1e-5, then
/// LeakyReLU(0.01): what follows the conv in the norm and split-conv tests.
struct Tail {
    norm: Op,
    leaky: Op,
}

impl Tail {
    /// A GroupNorm (of `c` groups too).
    fn new(r: &mut Rng, c: usize, groups: usize) -> Tail {
        Tail::of(r, c, groups, false)
    }

    /// An InstanceNorm where `groups` is `c`, else a GroupNorm.
    fn instance_or_group(r: &mut Rng, c: usize, groups: usize) -> Tail {
        Tail::of(r, c, groups, groups == c)
    }

    fn of(r: &mut Rng, c: usize, groups: usize, instance: bool) -> Tail {
        let (scale, bias) = (
            Tensor::new(vec![c], r.scaled(c, 1.0)),
            Tensor::new(vec![c], r.scaled(c, 0.5)),
        );
        let eps = 1e-5;
        let norm = if instance {
            Op::InstanceNorm { eps, scale, bias }
        } else {
            Op::GroupNorm {
                groups,
                eps,
                scale,
                bias,
            }
        };
        Tail {
            norm,
            leaky: Op::LeakyRelu { alpha: 0.01 },
        }
    }

    /// `conv` (`cin` -> `cout` channels) over input 0, then the tail.
    fn after(self, cin: usize, conv: Op, cout: usize) -> Graph {
        graph(
            cin,
            vec![
                (conv, vec![0], cout),
                (self.norm, vec![1], cout),
                (self.leaky, vec![2], cout),
            ],
        )
    }

    /// The float64 reference of the tail over `y`.
    fn reference(&self, y: &T) -> T {
        let (groups, eps, scale, bias) = match &self.norm {
            Op::InstanceNorm { eps, scale, bias } => (y.s[1], eps, scale, bias),
            Op::GroupNorm {
                groups,
                eps,
                scale,
                bias,
            } => (*groups, eps, scale, bias),
            _ => unreachable!("a norm"),
        };
        norm_ref(y, groups, *eps, scale, bias).map(|ch, v| act_ref(&self.leaky, ch, v))
    }
}

/// A pool by the shared reference, whose output size must be `o`.
fn pool_ref(x: &T, p: &Pool, max: bool, o: [usize; 3]) -> T {
    let y = reference::pool(&x.array(), p, max);
    assert_eq!(&y.shape()[2..], &o[..], "pool output size");
    T::of(&y)
}

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

/// One conv case checked against float64, with every conv of it asserted to have run on `kern`.
fn conv_case_on(b: &mut CudaBackend, r: &mut Rng, c: ConvCase<'_>, kern: &str) {
    let name = c.name.to_string();
    conv_case(b, r, c);
    let used = kernels_used(b, 2);
    assert!(
        !used.is_empty() && used.iter().all(|k| k == kern),
        "{name}: expected {kern}, ran {used:?}"
    );
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
