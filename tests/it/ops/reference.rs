//! The float64 references of the op cases, one copy each, written straight from the ONNX
//! definitions (direct loops, gather formulations) on NCDHW arrays: the CPU tests (f32, f64) and
//! the CUDA tests (fp16) check against the same functions.

use ndarray::{Array5, Axis};
use rayon::prelude::*;
use voxtile::model::graph::*;

/// The shape of `a` as an array.
pub fn sh(a: &Array5<f64>) -> [usize; 5] {
    let s = a.shape();
    [s[0], s[1], s[2], s[3], s[4]]
}

/// Sets every element of `out` to `f([b, c, z, y, x])`, its output planes in parallel: the
/// references are direct loops, and the GPU tests' larger cases spent minutes of device time in
/// them. Each value is the same sum.
fn fill(out: &mut Array5<f64>, f: impl Fn([usize; 5]) -> f64 + Sync) {
    let [_, c, d, h, w] = sh(out);
    let all = out.as_slice_mut().expect("a new array is contiguous");
    all.par_chunks_mut(h * w)
        .enumerate()
        .for_each(|(i, plane)| {
            let (b, ch, z) = (i / (c * d), i / d % c, i % d);
            for (j, v) in plane.iter_mut().enumerate() {
                *v = f([b, ch, z, j / w, j % w]);
            }
        });
}

/// Conv by its definition.
pub fn conv(x: &Array5<f64>, p: &Conv) -> Array5<f64> {
    let [n, cin, d, h, w] = sh(x);
    let ws = &p.weight.shape;
    let (cout, cig, k) = (ws[0], ws[1], [ws[2], ws[3], ws[4]]);
    let cog = cout / p.groups;
    let ins = [d, h, w];
    let mut os = [0; 3];
    for a in 0..3 {
        os[a] =
            (ins[a] + p.pads[a] + p.pads[a + 3] - p.dilation[a] * (k[a] - 1) - 1) / p.stride[a] + 1;
    }
    assert_eq!(cin, cig * p.groups);
    let wt = |co: usize, ci: usize, a: usize, b: usize, c: usize| {
        p.weight.data[(((co * cig + ci) * k[0] + a) * k[1] + b) * k[2] + c] as f64
    };
    let mut out = Array5::zeros([n, cout, os[0], os[1], os[2]]);
    fill(&mut out, |[b, co, z, y, xx]| {
        let g = co / cog;
        let mut s = p.bias.as_ref().map_or(0.0, |t| t.data[co] as f64);
        for ci in 0..cig {
            for a in 0..k[0] {
                let id = (z * p.stride[0] + a * p.dilation[0]) as i64 - p.pads[0] as i64;
                if id < 0 || id >= d as i64 {
                    continue;
                }
                for bb in 0..k[1] {
                    let ih = (y * p.stride[1] + bb * p.dilation[1]) as i64 - p.pads[1] as i64;
                    if ih < 0 || ih >= h as i64 {
                        continue;
                    }
                    for c in 0..k[2] {
                        let iw = (xx * p.stride[2] + c * p.dilation[2]) as i64 - p.pads[2] as i64;
                        if iw < 0 || iw >= w as i64 {
                            continue;
                        }
                        s += x[[b, g * cig + ci, id as usize, ih as usize, iw as usize]]
                            * wt(co, ci, a, bb, c);
                    }
                }
            }
        }
        s
    });
    out
}

/// Gather form: out[o] = Σ x[i] w[k] over i·s + k·dil − pad_begin = o.
pub fn conv_t(x: &Array5<f64>, p: &ConvTranspose) -> Array5<f64> {
    let [n, cin, d, h, w] = sh(x);
    let ws = &p.weight.shape;
    let (cog, k) = (ws[1], [ws[2], ws[3], ws[4]]);
    let cig = cin / p.groups;
    let cout = cog * p.groups;
    let ins = [d, h, w];
    let mut os = [0; 3];
    for a in 0..3 {
        os[a] = p.stride[a] * (ins[a] - 1) + p.output_padding[a] + (k[a] - 1) * p.dilation[a] + 1
            - p.pads[a]
            - p.pads[a + 3];
    }
    let wt = |ci: usize, co: usize, a: usize, b: usize, c: usize| {
        p.weight.data[(((ci * cog + co) * k[0] + a) * k[1] + b) * k[2] + c] as f64
    };
    // Input index along an axis for output o and tap t, if any.
    let src = |a: usize, o: usize, t: usize| -> Option<usize> {
        let num = o as i64 + p.pads[a] as i64 - (t * p.dilation[a]) as i64;
        if num < 0 || num % p.stride[a] as i64 != 0 {
            return None;
        }
        let i = (num / p.stride[a] as i64) as usize;
        (i < ins[a]).then_some(i)
    };
    let mut out = Array5::zeros([n, cout, os[0], os[1], os[2]]);
    fill(&mut out, |[b, co, z, y, xx]| {
        let g = co / cog;
        let mut s = p.bias.as_ref().map_or(0.0, |t| t.data[co] as f64);
        for ci in 0..cig {
            for a in 0..k[0] {
                let Some(id) = src(0, z, a) else { continue };
                for bb in 0..k[1] {
                    let Some(ih) = src(1, y, bb) else { continue };
                    for c in 0..k[2] {
                        let Some(iw) = src(2, xx, c) else { continue };
                        s += x[[b, g * cig + ci, id, ih, iw]]
                            * wt(g * cig + ci, co - g * cog, a, bb, c);
                    }
                }
            }
        }
        s
    });
    out
}

/// GroupNorm (InstanceNorm: one group per channel) with a per-channel affine.
pub fn group_norm(
    x: &Array5<f64>,
    groups: usize,
    eps: f64,
    scale: &[f32],
    bias: &[f32],
) -> Array5<f64> {
    let [n, c, ..] = sh(x);
    let cg = c / groups;
    let mut out = x.clone();
    for b in 0..n {
        for g in 0..groups {
            let vals: Vec<f64> = (0..cg)
                .flat_map(|j| {
                    x.index_axis(Axis(0), b)
                        .index_axis(Axis(0), g * cg + j)
                        .iter()
                        .copied()
                        .collect::<Vec<_>>()
                })
                .collect();
            let m = vals.iter().sum::<f64>() / vals.len() as f64;
            let var = vals.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / vals.len() as f64;
            for j in 0..cg {
                let ch = g * cg + j;
                out.index_axis_mut(Axis(0), b)
                    .index_axis_mut(Axis(0), ch)
                    .mapv_inplace(|v| {
                        (v - m) / (var + eps).sqrt() * scale[ch] as f64 + bias[ch] as f64
                    });
            }
        }
    }
    out
}

/// `f(channel, value)` of every element.
pub fn channel(x: &Array5<f64>, f: impl Fn(usize, f64) -> f64) -> Array5<f64> {
    let mut out = x.clone();
    for ((_, c, _, _, _), v) in out.indexed_iter_mut() {
        *v = f(c, *v);
    }
    out
}

/// Softmax along `axis`, max subtracted first.
pub fn softmax(x: &Array5<f64>, axis: usize) -> Array5<f64> {
    let mut out = x.clone();
    for mut lane in out.lanes_mut(Axis(axis)) {
        let m = lane.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = lane.iter().map(|v| (v - m).exp()).sum();
        lane.mapv_inplace(|v| (v - m).exp() / s);
    }
    out
}

/// PyTorch's pooling_output_shape.
pub fn pool_len(i: usize, k: usize, s: usize, d: usize, pb: usize, pe: usize, ceil: bool) -> usize {
    let num = (i + pb + pe) as i64 - (d * (k - 1)) as i64 - 1;
    let mut o = if ceil {
        (num + s as i64 - 1).div_euclid(s as i64)
    } else {
        num.div_euclid(s as i64)
    } + 1;
    if ceil && (o - 1) * s as i64 >= (i + pb) as i64 {
        o -= 1;
    }
    o as usize
}

/// Max or average pool by its definition; an average that counts pads divides by the taps inside
/// the padded extent (PyTorch's window clipped to the end pads; the begin pads count).
pub fn pool(x: &Array5<f64>, p: &Pool, max: bool) -> Array5<f64> {
    let [n, c, d, h, w] = sh(x);
    let ins = [d, h, w];
    let os: Vec<usize> = (0..3)
        .map(|a| {
            pool_len(
                ins[a],
                p.kernel[a],
                p.stride[a],
                p.dilation[a],
                p.pads[a],
                p.pads[a + 3],
                p.ceil_mode,
            )
        })
        .collect();
    let mut out = Array5::zeros([n, c, os[0], os[1], os[2]]);
    for ((b, ch, z, y, xx), o) in out.indexed_iter_mut() {
        let o3 = [z, y, xx];
        let start: Vec<i64> = (0..3)
            .map(|a| (o3[a] * p.stride[a]) as i64 - p.pads[a] as i64)
            .collect();
        let (mut m, mut s, mut cnt, mut cntp) = (f64::NEG_INFINITY, 0.0, 0usize, 0usize);
        for a in 0..p.kernel[0] {
            for bb in 0..p.kernel[1] {
                for cc in 0..p.kernel[2] {
                    let t = [a, bb, cc];
                    let idx: Vec<i64> = (0..3)
                        .map(|q| start[q] + (t[q] * p.dilation[q]) as i64)
                        .collect();
                    if (0..3).all(|q| idx[q] < (ins[q] + p.pads[q + 3]) as i64) {
                        cntp += 1;
                    }
                    if (0..3).all(|q| idx[q] >= 0 && idx[q] < ins[q] as i64) {
                        let v = x[[b, ch, idx[0] as usize, idx[1] as usize, idx[2] as usize]];
                        m = m.max(v);
                        s += v;
                        cnt += 1;
                    }
                }
            }
        }
        *o = if max {
            m
        } else {
            s / (if p.count_include_pad { cntp } else { cnt }) as f64
        };
    }
    out
}

/// An activation of one value of channel `c` (PRelu: its slope for `c`, or its one slope).
pub fn act(op: &Op, c: usize, v: f64) -> f64 {
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
        Op::Sigmoid => sigmoid(v),
        Op::Tanh => v.tanh(),
        Op::Identity => v,
        _ => unreachable!("not an activation: {}", op.name()),
    }
}

/// The logistic function.
pub fn sigmoid(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

/// The error function by its Maclaurin series (|x| <= 4: terms shrink past n = 16, 1e-13).
pub fn erf(x: f64) -> f64 {
    let (mut term, mut sum) = (x, x);
    for n in 1..120 {
        term *= -x * x / n as f64;
        sum += term / (2 * n + 1) as f64;
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

/// A two-input function's definition.
pub type Bin = fn(f64, f64) -> f64;

/// Every two-input elementwise op and its definition (numpy broadcasting is the caller's).
pub fn binaries() -> [(Op, Bin); 7] {
    [
        (Op::Add, |a, b| a + b),
        (Op::Sub, |a, b| a - b),
        (Op::Mul, |a, b| a * b),
        (Op::Div, |a, b| a / b),
        (Op::Max, f64::max),
        (Op::Min, f64::min),
        (Op::Pow, f64::powf),
    ]
}
