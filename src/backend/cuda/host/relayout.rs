//! Weight re-layout for the GEMM kernels (host only): conv / transposed-conv weights as fp16
//! B matrices, and a strided transposed conv split into dense parity-class convs.

/// Re-lays a conv / transposed-conv weight as `[cout_pad][kpad]` f16 bits, element `[co][tap][ci]` (ci
/// within the group), zero padded, as the GEMM's B matrix wants it. Returns (data, kpad).
pub fn relayout_weight(
    w: &[f32],
    shape: &[usize],
    groups: usize,
    transposed: bool,
    cout_pad: usize,
) -> (Vec<half::f16>, usize) {
    let taps = shape[2] * shape[3] * shape[4];
    let (cout, cin_g) = if transposed {
        (shape[1] * groups, shape[0] / groups)
    } else {
        (shape[0], shape[1])
    };
    let cout_g = cout / groups;
    let k = taps * cin_g;
    let kpad = k.div_ceil(32) * 32;
    let mut out = vec![half::f16::ZERO; cout_pad * kpad];
    rows(&mut out, kpad, cout, |co, row| {
        let g = co / cout_g;
        for t in 0..taps {
            for ci in 0..cin_g {
                let src = if transposed {
                    ((g * cin_g + ci) * shape[1] + (co - g * cout_g)) * taps + t
                } else {
                    (co * cin_g + ci) * taps + t
                };
                row[t * cin_g + ci] = half::f16::from_f32(w[src]);
            }
        }
    });
    (out, kpad)
}

/// `fill(r, row)` for each of the first `n` rows of `kpad` elements of `out`, on the thread
/// pool: W1's 31M weights converted one by one took ~0.15 s of a start (W3).
fn rows(
    out: &mut [half::f16],
    kpad: usize,
    n: usize,
    fill: impl Fn(usize, &mut [half::f16]) + Sync,
) {
    use rayon::prelude::*;
    if kpad == 0 {
        return;
    }
    out.par_chunks_mut(kpad)
        .take(n)
        .enumerate()
        .for_each(|(r, row)| fill(r, row));
}

/// Weight of the upsampling transposed conv as the GEMM's B matrix: row j = tap * Cout + co,
/// column ci (weight shape `[Cin][Cout][kd][kh][kw]`); rows padded to `rows_pad`, K to 32.
/// Returns (data, kpad).
pub fn relayout_upsampling_weight(
    w: &[f32],
    shape: &[usize],
    rows_pad: usize,
) -> (Vec<half::f16>, usize) {
    let (cin, cout) = (shape[0], shape[1]);
    let taps = shape[2] * shape[3] * shape[4];
    let kpad = cin.div_ceil(32) * 32;
    let mut out = vec![half::f16::ZERO; rows_pad * kpad];
    rows(&mut out, kpad, taps * cout, |r, row| {
        let (t, co) = (r / cout, r % cout);
        for ci in 0..cin {
            row[ci] = half::f16::from_f32(w[(ci * cout + co) * taps + t]);
        }
    });
    (out, kpad)
}

/// One output parity class of a strided transposed conv: outputs o = j * stride + r (per axis)
/// form a dense forward conv over the input with the taps `taps` (original kernel indices, in
/// the order of the sub-conv's taps t = 0, 1, ...) and begin pad `pad`: input j - pad + t.
#[derive(Clone, Debug, PartialEq)]
pub struct ParityClass {
    pub r: [usize; 3],
    pub taps: [Vec<usize>; 3],
    pub pad: [i32; 3],
    /// Outputs of this class per axis: ceil((out - r) / stride).
    pub grid: [usize; 3],
}

/// Splits a transposed conv (kernel `k`, `stride`, begin pads `pads`, dilation 1, output size
/// `out`) into its stride^3 parity classes: output o = j*s + r receives x`[i]` * w`[kk]` for every
/// kk with (r + pad - kk) divisible by s, at i = j + (r + pad - kk) / s. None when some class
/// with outputs has no tap on an axis (its outputs would be bias only: kept on the gather kernel).
pub fn parity_split(
    k: [usize; 3],
    stride: [usize; 3],
    pads: [usize; 3],
    out: [usize; 3],
) -> Option<Vec<ParityClass>> {
    // Per axis, per residue with outputs: (r, taps with the largest kk first, pad, grid).
    // Per axis: (r, taps, pad, grid) of each residue with outputs.
    type Residue = (usize, Vec<usize>, i32, usize);
    let mut axes: Vec<Vec<Residue>> = Vec::new();
    for a in 0..3 {
        let s = stride[a];
        if s == 0 {
            return None;
        }
        let mut per_r = Vec::new();
        for r in 0..s {
            let grid = out[a].saturating_sub(r).div_ceil(s);
            let mut taps: Vec<usize> = (0..k[a])
                .filter(|&kk| (r as i64 + pads[a] as i64 - kk as i64).rem_euclid(s as i64) == 0)
                .collect();
            taps.reverse();
            if grid == 0 {
                continue;
            }
            let first = *taps.first()?;
            // Offset of the largest kk is the smallest: input j + off_min + t.
            let off_min = (r as i64 + pads[a] as i64 - first as i64).div_euclid(s as i64);
            per_r.push((r, taps, -off_min as i32, grid));
        }
        axes.push(per_r);
    }
    let mut classes = Vec::new();
    for z in &axes[0] {
        for y in &axes[1] {
            for x in &axes[2] {
                classes.push(ParityClass {
                    r: [z.0, y.0, x.0],
                    taps: [z.1.clone(), y.1.clone(), x.1.clone()],
                    pad: [z.2, y.2, x.2],
                    grid: [z.3, y.3, x.3],
                });
            }
        }
    }
    Some(classes)
}

/// The parity classes of a transposed conv run as ONE dense conv over the input (one launch
/// instead of stride^3 thin ones): per axis the union of the classes' input windows (`k` taps
/// from begin pad `pad`), one Cout-wide GEMM column block per class in the scatter epilogue's
/// tap order (class (rz * s_y + ry) * s_x + rx), zero weights where a class reads no tap.
#[derive(Clone, Debug, PartialEq)]
pub struct FusedParity {
    pub k: [usize; 3],
    pub pad: [i32; 3],
    /// Input cells per axis (out / stride): each GEMM row writes the stride^3 outputs of one.
    pub grid: [usize; 3],
    pub classes: Vec<ParityClass>,
}

impl FusedParity {
    /// `classes` (from [`parity_split`]) fused, when every residue has outputs and the same
    /// grid (out divisible by the stride on every axis); else None (one launch per class).
    pub fn of(classes: &[ParityClass], stride: [usize; 3], out: [usize; 3]) -> Option<Self> {
        if (0..3).any(|a| stride[a] == 0 || !out[a].is_multiple_of(stride[a]) || out[a] == 0) {
            return None;
        }
        let mut expect = Vec::new();
        for rz in 0..stride[0] {
            for ry in 0..stride[1] {
                for rx in 0..stride[2] {
                    expect.push([rz, ry, rx]);
                }
            }
        }
        if classes.iter().map(|c| c.r).ne(expect) {
            return None;
        }
        let (mut k, mut pad) = ([0; 3], [0; 3]);
        for a in 0..3 {
            // Class c reads input j - pad_c + t, t < taps: offsets [-pad_c, taps - 1 - pad_c].
            let lo = classes.iter().map(|c| -c.pad[a]).min()?;
            let hi = classes
                .iter()
                .map(|c| c.taps[a].len() as i32 - 1 - c.pad[a])
                .max()?;
            k[a] = (hi - lo + 1) as usize;
            pad[a] = -lo;
        }
        let grid = [out[0] / stride[0], out[1] / stride[1], out[2] / stride[2]];
        Some(FusedParity {
            k,
            pad,
            grid,
            classes: classes.to_vec(),
        })
    }

    /// The original kernel index that union tap `u` of axis `a` is for class `cl`, if any.
    pub fn tap(&self, cl: &ParityClass, a: usize, u: usize) -> Option<usize> {
        let t = u as i32 - self.pad[a] + cl.pad[a];
        usize::try_from(t)
            .ok()
            .and_then(|t| cl.taps[a].get(t).copied())
    }
}

/// Weight of the fused parity conv as the GEMM's B matrix `[rows_pad][kpad]`: row
/// class * Cout + co, K = (uz, uy, ux, ci), from the transposed weight `[Cin][Cout][kd][kh][kw]`
/// (groups 1). Returns (data, kpad).
pub fn relayout_fused_parity_weight(
    w: &[f32],
    shape: &[usize],
    f: &FusedParity,
    rows_pad: usize,
) -> (Vec<half::f16>, usize) {
    let (cin, cout) = (shape[0], shape[1]);
    let (kh, kw) = (shape[3], shape[4]);
    let kpad = (f.k.iter().product::<usize>() * cin).div_ceil(32) * 32;
    let mut out = vec![half::f16::ZERO; rows_pad * kpad];
    rows(&mut out, kpad, f.classes.len() * cout, |r, row| {
        let (cl, co) = (&f.classes[r / cout], r % cout);
        for uz in 0..f.k[0] {
            let Some(kz) = f.tap(cl, 0, uz) else { continue };
            for uy in 0..f.k[1] {
                let Some(ky) = f.tap(cl, 1, uy) else { continue };
                for ux in 0..f.k[2] {
                    let Some(kx) = f.tap(cl, 2, ux) else { continue };
                    let t = (uz * f.k[1] + uy) * f.k[2] + ux;
                    for ci in 0..cin {
                        let src = (((ci * cout + co) * shape[2] + kz) * kh + ky) * kw + kx;
                        row[t * cin + ci] = half::f16::from_f32(w[src]);
                    }
                }
            }
        }
    });
    (out, kpad)
}

/// Weight of one parity class as the GEMM's B matrix `[cout_pad][kpad]`: K = (tz, ty, tx, ci),
/// from the transposed weight `[Cin][Cout][kd][kh][kw]` (groups 1). Returns (data, kpad).
pub fn relayout_parity_weight(
    w: &[f32],
    shape: &[usize],
    taps: &[Vec<usize>; 3],
    cout_pad: usize,
) -> (Vec<half::f16>, usize) {
    let (cin, cout) = (shape[0], shape[1]);
    let (kh, kw) = (shape[3], shape[4]);
    let nt = taps[0].len() * taps[1].len() * taps[2].len();
    let kpad = (nt * cin).div_ceil(32) * 32;
    let mut out = vec![half::f16::ZERO; cout_pad * kpad];
    rows(&mut out, kpad, cout, |co, row| {
        let mut t = 0;
        for &kz in &taps[0] {
            for &ky in &taps[1] {
                for &kx in &taps[2] {
                    for ci in 0..cin {
                        let src = (((ci * cout + co) * shape[2] + kz) * kh + ky) * kw + kx;
                        row[t * cin + ci] = half::f16::from_f32(w[src]);
                    }
                    t += 1;
                }
            }
        }
    });
    (out, kpad)
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::*;

    #[test]
    fn weight_relayout_puts_cin_innermost() {
        // Conv weight [Cout=2][Cin=3][1][1][2]: element (co, ci, t) = 100co + 10ci + t.
        let shape = [2, 3, 1, 1, 2];
        let mut w = vec![0.0; 12];
        for co in 0..2 {
            for ci in 0..3 {
                for t in 0..2 {
                    w[(co * 3 + ci) * 2 + t] = (100 * co + 10 * ci + t) as f32;
                }
            }
        }
        let (r, kpad) = relayout_weight(&w, &shape, 1, false, 64);
        assert_eq!(kpad, 32);
        assert_eq!(r[kpad + 3 + 2].to_f32(), 121.0); // co 1, tap 1, ci 2
        assert_eq!(r[6].to_f32(), 0.0); // K padding
                                        // Transposed [Cin=3][Cout=2][1][1][2]: element (ci, co, t) = 100ci + 10co + t.
        let mut wt = vec![0.0; 12];
        for ci in 0..3 {
            for co in 0..2 {
                for t in 0..2 {
                    wt[(ci * 2 + co) * 2 + t] = (100 * ci + 10 * co + t) as f32;
                }
            }
        }
        let (r, kpad) = relayout_weight(&wt, &[3, 2, 1, 1, 2], 1, true, 64);
        assert_eq!(r[kpad + 3 + 2].to_f32(), 211.0); // co 1, tap 1, ci 2
                                                     // As the upsampling GEMM: row tap * Cout + co, column ci.
        let (u, kpad) = relayout_upsampling_weight(&wt, &[3, 2, 1, 1, 2], 128);
        assert_eq!(kpad, 32);
        assert_eq!(u[2 * kpad + 2].to_f32(), 201.0); // tap 1, co 0, ci 2
        assert_eq!(u[kpad + 1].to_f32(), 110.0); // tap 0, co 1, ci 1
        assert_eq!(u[4 * kpad].to_f32(), 0.0); // row padding
    }

    /// 3D transposed conv computed directly (scatter form) vs the fused parity GEMM as the
    /// kernel runs it: row = input cell j, column = class * Cout + co, K = (union tap, ci),
    /// stored at j * stride + r. Small integers: exact in f16 and f64.
    #[test]
    fn fused_parity_reproduces_transposed_conv() {
        let mut seed = 11u64;
        let mut rnd = || (crate::backend::cuda::lcg_next(&mut seed) % 7) as i64 - 3;
        // (k, stride, begin pad, end pad, input) per case; every output divisible by the stride.
        type Case = ([usize; 3], [usize; 3], [usize; 3], [i64; 3], [usize; 3]);
        let cases: [Case; 5] = [
            ([3; 3], [2; 3], [1; 3], [0; 3], [3, 4, 2]), // MONAI k3 s2 p1 opad1
            ([3; 3], [2; 3], [0; 3], [1; 3], [2, 3, 3]), // deepbrain pads [0,0,0,1,1,1]
            ([4; 3], [2; 3], [1; 3], [1; 3], [2, 3, 2]),
            ([3, 3, 5], [1, 2, 3], [1, 1, 2], [1, 0, 0], [3, 3, 2]),
            ([3, 1, 2], [2, 1, 2], [1, 0, 0], [0, 0, 0], [2, 4, 3]),
        ];
        let (cin, cout) = (3, 2);
        for (k, s, pb, pe, n) in cases {
            let out: Vec<usize> = (0..3)
                .map(|a| ((n[a] - 1) * s[a] + k[a]) as i64 - pb[a] as i64 - pe[a])
                .map(|o| o as usize)
                .collect();
            let out = [out[0], out[1], out[2]];
            let x: Vec<i64> = (0..cin * n.iter().product::<usize>())
                .map(|_| rnd())
                .collect();
            let ws = [cin, cout, k[0], k[1], k[2]];
            let w: Vec<i64> = (0..ws.iter().product::<usize>()).map(|_| rnd()).collect();
            let xi = |ci: usize, i: [usize; 3]| x[((ci * n[0] + i[0]) * n[1] + i[1]) * n[2] + i[2]];
            let mut want = vec![0i64; cout * out.iter().product::<usize>()];
            let oi =
                |co: usize, o: [usize; 3]| ((co * out[0] + o[0]) * out[1] + o[1]) * out[2] + o[2];
            for ci in 0..cin {
                for co in 0..cout {
                    for i0 in 0..n[0] {
                        for i1 in 0..n[1] {
                            for i2 in 0..n[2] {
                                for kz in 0..k[0] {
                                    for ky in 0..k[1] {
                                        for kx in 0..k[2] {
                                            let i = [i0, i1, i2];
                                            let kk = [kz, ky, kx];
                                            let o: Vec<i64> = (0..3)
                                                .map(|a| {
                                                    (i[a] * s[a] + kk[a]) as i64 - pb[a] as i64
                                                })
                                                .collect();
                                            if (0..3).any(|a| o[a] < 0 || o[a] >= out[a] as i64) {
                                                continue;
                                            }
                                            let wv = w[(((ci * cout + co) * k[0] + kz) * k[1]
                                                + ky)
                                                * k[2]
                                                + kx];
                                            let o = [o[0] as usize, o[1] as usize, o[2] as usize];
                                            want[oi(co, o)] += xi(ci, i) * wv;
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            let cls = parity_split(k, s, pb, out).unwrap();
            let f = FusedParity::of(&cls, s, out).expect("fusable");
            let wf: Vec<f32> = w.iter().map(|&v| v as f32).collect();
            let (b, kpad) = relayout_fused_parity_weight(&wf, &ws, &f, cls.len() * cout);
            let mut got = vec![None; want.len()];
            for j0 in 0..f.grid[0] {
                for j1 in 0..f.grid[1] {
                    for j2 in 0..f.grid[2] {
                        let j = [j0, j1, j2];
                        for (c, cl) in cls.iter().enumerate() {
                            for co in 0..cout {
                                let mut v = 0i64;
                                for uz in 0..f.k[0] {
                                    for uy in 0..f.k[1] {
                                        for ux in 0..f.k[2] {
                                            let u = [uz, uy, ux];
                                            let i: Vec<i64> = (0..3)
                                                .map(|a| {
                                                    j[a] as i64 - f.pad[a] as i64 + u[a] as i64
                                                })
                                                .collect();
                                            if (0..3).any(|a| i[a] < 0 || i[a] >= n[a] as i64) {
                                                continue;
                                            }
                                            let t = (uz * f.k[1] + uy) * f.k[2] + ux;
                                            let i = [i[0] as usize, i[1] as usize, i[2] as usize];
                                            for ci in 0..cin {
                                                let bw = b[(c * cout + co) * kpad + t * cin + ci];
                                                v += xi(ci, i) * bw.to_f32() as i64;
                                            }
                                        }
                                    }
                                }
                                let o = [
                                    j0 * s[0] + cl.r[0],
                                    j1 * s[1] + cl.r[1],
                                    j2 * s[2] + cl.r[2],
                                ];
                                let slot = &mut got[oi(co, o)];
                                assert!(slot.is_none(), "output {o:?} written twice");
                                *slot = Some(v);
                            }
                        }
                    }
                }
            }
            let got: Vec<i64> = got.into_iter().map(|v| v.expect("every output")).collect();
            assert_eq!(got, want, "k{k:?} s{s:?} pb{pb:?} pe{pe:?}");
        }
        // An output not divisible by the stride (k3 s2 p1 without output padding): per class.
        let cls = parity_split([3; 3], [2; 3], [1; 3], [7; 3]).unwrap();
        assert!(FusedParity::of(&cls, [2; 3], [7; 3]).is_none());
    }

    /// 1D transposed conv computed directly (scatter form) vs through the parity classes.
    #[test]
    fn parity_classes_reproduce_transposed_conv() {
        let mut seed = 7u64;
        let mut rnd = || (crate::backend::cuda::lcg_next(&mut seed) % 1000) as f64 / 500.0 - 1.0;
        for (k, s, pb, opad, n) in [
            (3, 2, 1, 1, 5),
            (3, 2, 0, 0, 4),
            (4, 2, 1, 0, 6),
            (5, 3, 2, 2, 4),
            (3, 1, 1, 0, 5),
            (2, 2, 0, 0, 3),
            (3, 3, 0, 0, 3),
        ] {
            let x: Vec<f64> = (0..n).map(|_| rnd()).collect();
            let w: Vec<f64> = (0..k).map(|_| rnd()).collect();
            let out = (n - 1) * s + k + opad - 2 * pb;
            let mut want = vec![0.0; out];
            for i in 0..n {
                for kk in 0..k {
                    let o = (i * s + kk) as i64 - pb as i64;
                    if o >= 0 && (o as usize) < out {
                        want[o as usize] += x[i] * w[kk];
                    }
                }
            }
            let cls = parity_split([k, 1, 1], [s, 1, 1], [pb, 0, 0], [out, 1, 1]).unwrap();
            assert_eq!(cls.len(), s.min(out));
            let mut got = vec![f64::NAN; out];
            for c in &cls {
                assert_eq!((c.taps[1].clone(), c.pad[1], c.grid[1]), (vec![0], 0, 1));
                for j in 0..c.grid[0] {
                    let mut v = 0.0;
                    for (t, &kk) in c.taps[0].iter().enumerate() {
                        let i = j as i64 - c.pad[0] as i64 + t as i64;
                        if i >= 0 && (i as usize) < n {
                            v += x[i as usize] * w[kk];
                        }
                    }
                    let o = j * s + c.r[0];
                    assert!(got[o].is_nan(), "output {o} written twice");
                    got[o] = v;
                }
            }
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (g - w).abs() < 1e-12,
                    "k{k} s{s} p{pb}: {got:?} vs {want:?}"
                );
            }
        }
        // A class without taps (kernel smaller than the stride) stays on the gather kernel.
        assert!(parity_split([1, 1, 1], [2, 1, 1], [0; 3], [4, 1, 1]).is_none());
        // Weight of a class: K = (tz, ty, tx, ci); transposed weight [Cin=2][Cout=1][3][1][1].
        let w: Vec<f32> = (0..6).map(|i| i as f32).collect();
        let (r, kpad) =
            relayout_parity_weight(&w, &[2, 1, 3, 1, 1], &[vec![2, 0], vec![0], vec![0]], 64);
        assert_eq!(kpad, 32);
        // t0 = k2: ci0 -> 2, ci1 -> 5; t1 = k0: ci0 -> 0, ci1 -> 3.
        assert_eq!(
            r[..4].iter().map(|v| v.to_f32()).collect::<Vec<_>>(),
            vec![2.0, 5.0, 0.0, 3.0]
        );
    }
}
