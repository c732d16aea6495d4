//! CPU emulation of the z-pair conv's index math (kernels/conv_wgmma_z.cu, `conv_wz_*_h2` and
//! its `_nl` twin), no GPU: the persistent blocks' tiles and steps, the weight blocks
//! (`load_w`), the ring of two-plane slots (`load_slot`: a channel slice of a wider input,
//! `ConvParams::ldi`; or `load_normed`: a norm's input normalised on load), each step's wgmma
//! operands through their descriptors (no-swizzle core matrices), the staged planes and the
//! helper's stores (`put`, adding to the output where the launch accumulates; `_h2b`: one
//! bulk copy per staged voxel where it does not; `_h2t`: the slots as tensor loads' boxes), over
//! Cout tiles (grid.y). Each launch writes every output element once; the launches of a conv in Cin
//! chunks sum to a direct float64 conv. The values are small integers, so every sum is exact.

use voxtile::internals::cuda::host::catalogue::{
    HaloConfig, WzStores, CONV_WZ_C32_Y16_H2, CONV_WZ_C32_Y16_H2B, CONV_WZ_C32_Y16_H2L,
    CONV_WZ_C32_Y16_H2T,
};
use voxtile::internals::cuda::host::relayout::relayout_weight;

const CIN: usize = 32;
const CPV: usize = CIN / 8;
const KS: usize = CIN / 16;
const TX: usize = 8;
const R: usize = 5;
const BLK: usize = 32 * 8;
/// The helper's threads (`_h2`: two warpgroups).
const NT: usize = 256;

/// One launch: input dims (per sample, NDHWC with `ldi` channels, the launch's 32 from `x_coff`
/// on), the output's dims and Cout, begin pads, and whether it adds to the output.
#[derive(Clone, Copy)]
struct Launch {
    n: usize,
    di: [usize; 3],
    ldi: usize,
    x_coff: usize,
    out: [usize; 3],
    cout: usize,
    pads: [usize; 3],
    accum: bool,
}

/// A norm's (a, b) pairs per (sample, channel of the `ldi`), with a LeakyReLU (`_nl`).
struct NormIn<'a> {
    ab: &'a [(f64, f64)],
    alpha: f64,
}

fn f16r(v: f64) -> f64 {
    half::f16::from_f64(v).to_f64()
}

/// The norm's output value as `norm_load1` gives it: act(v * a + b) rounded to fp16 (the
/// fp32 rounding of v * a + b does not arise: the test's values are exact in fp32).
fn norm_load(v: f64, (a, b): (f64, f64), alpha: f64) -> f64 {
    let u = v * a + b;
    f16r(if u >= 0.0 { u } else { alpha * u })
}

/// Runs launch `l` of the z-pair kernel `c` on `sms` SMs: weights `wh` ([Cout_pad][kpad], tap
/// major), bias, input x (the whole `ldi`-channel tensor), output y (fp32, Cout channels).
/// Returns how often each output element was written.
#[allow(clippy::too_many_arguments)]
fn run(
    c: &HaloConfig,
    l: Launch,
    sms: usize,
    wh: &[f64],
    kpad: usize,
    bias: Option<&[f64]>,
    x: &[f64],
    norm: Option<&NormIn>,
    y: &mut [f64],
    mut stats: Option<&mut [[f64; 4]]>,
) -> Vec<u32> {
    let [zt, ny] = [c.tile[0], c.tile[1]];
    let (hx, hy) = (TX + 2, ny + 2);
    let hp = hx * hy;
    let nn = TX * ny;
    let h = zt / 2;
    let slot = CPV * 2 * hp * 8;
    let wn = (9 * CPV * 4 + 1) * BLK;
    let [dout, hout, wout] = l.out;
    let (ntx, nty, ntz) = (wout.div_ceil(TX), hout.div_ceil(ny), dout.div_ceil(zt));
    let ntiles = l.n * ntz * nty * ntx;
    assert_eq!(ntiles, c.tiles(l.n, l.out));
    let grid = c.grid(l.n, l.out, sms) as usize;
    let mut hits = vec![0u32; y.len()];
    // tile_origin: x fastest, then y, z, sample.
    let origin = |t: usize| {
        let (tx, r) = (t % ntx, t / ntx);
        let (ty, r) = (r % nty, r / nty);
        let (tz, n) = (r % ntz, r / ntz);
        (n, tz * zt, ty * ny, tx * TX)
    };
    for by in 0..c.cout_tiles(l.cout) as usize {
        let nb0 = by * 32;
        for bx in 0..grid {
            if bx >= ntiles {
                continue;
            }
            let steps = (ntiles - 1 - bx) / grid * h + h;
            // load_w: block i = (dy dx, group) * 4 + 3 - kz, zero for kz 3 and the last.
            let mut sw = vec![0.0; wn];
            for idx in 0..(9 * CPV * 4 + 1) * 32 {
                let (co, r) = (idx % 32, idx / 32);
                let (b, r2) = (r % 4, r / 4);
                let (g, yx) = (r2 % CPV, r2 / CPV);
                let kz = 3 - b as i64;
                if kz > 2 || yx >= 9 || nb0 + co >= l.cout {
                    continue;
                }
                let src = (nb0 + co) * kpad + (kz as usize * 9 + yx) * CIN + g * 8;
                sw[idx * 8..idx * 8 + 8].copy_from_slice(&wh[src..src + 8]);
            }
            let mut ring = vec![f64::NAN; R * slot];
            let load_slot = |ring: &mut [f64], at: usize, t: usize, k: usize| {
                let (n, oz0, oy0, ox0) = origin(t);
                let iz0 = (oz0 + 2 * k) as i64 - l.pads[0] as i64;
                let iy0 = oy0 as i64 - l.pads[1] as i64;
                let ix0 = ox0 as i64 - l.pads[2] as i64;
                let s = &mut ring[at * slot..(at + 1) * slot];
                // `_h2t`: the slot as the TMA unit writes it, one tensor load per channel group
                // g: the box [c 8][x hx][y hy][z 2] (dimension 0 fastest) of the launch's input
                // as dims [channel, x, y, z, n] (`runtime::tma::halo_map`) from (8g, ix0, iy0,
                // iz0, n), written in order from the group's block on, zeros outside.
                if c.tma_loads {
                    assert!(norm.is_none(), "tensor loads copy the input as it is");
                    for g in 0..CPV {
                        let boxed = (0..2).flat_map(|z| {
                            (0..hy).flat_map(move |y| {
                                (0..hx).flat_map(move |xx| (0..8).map(move |q| (z, y, xx, q)))
                            })
                        });
                        for (e, (z, y, xx, q)) in (g * 2 * hp * 8..).zip(boxed) {
                            let (iz, iy, ix) = (iz0 + z as i64, iy0 + y as i64, ix0 + xx as i64);
                            let inside = [iz, iy, ix]
                                .iter()
                                .zip(l.di)
                                .all(|(&i, d)| (0..d as i64).contains(&i));
                            s[e] = if inside {
                                let vox = ((n * l.di[0] + iz as usize) * l.di[1] + iy as usize)
                                    * l.di[2]
                                    + ix as usize;
                                x[vox * l.ldi + l.x_coff + g * 8 + q]
                            } else {
                                0.0
                            };
                        }
                    }
                    return;
                }
                // Thread t's pieces: its channel group g = t % CPV fixed (NT % CPV == 0), its
                // voxels vv = t / CPV, + NT / CPV, ... walked as `BoxWalk` does (x and y
                // stepped with carries; the copies), checked against the division form (the
                // walk's start, and `load_normed`'s `piece`).
                let vs = NT / CPV;
                let (sz, sy, sx) = (vs / hp, vs % hp / hx, vs % hx);
                for (tid, g) in (0..NT).map(|t| (t, t % CPV)) {
                    let v0 = tid / CPV;
                    let (mut wz, mut wy, mut wx) = (v0 / hp, v0 % hp / hx, v0 % hx);
                    for vv in (v0..2 * hp).step_by(vs) {
                        let (pl, v) = (vv / hp, vv % hp);
                        let (yy, xx) = (v / hx, v % hx);
                        assert_eq!((wz, wy, wx), (pl, yy, xx), "the walk");
                        (wz, wy, wx) = (wz + sz, wy + sy, wx + sx);
                        if wx >= hx {
                            (wx, wy) = (wx - hx, wy + 1);
                        }
                        if wy >= hy {
                            (wy, wz) = (wy - hy, wz + 1);
                        }
                        let (iz, iy, ix) = (iz0 + pl as i64, iy0 + yy as i64, ix0 + xx as i64);
                        let inside = [iz, iy, ix]
                            .iter()
                            .zip(l.di)
                            .all(|(&i, d)| (0..d as i64).contains(&i));
                        let dst = (g * 2 * hp + vv) * 8;
                        assert_eq!(dst, ((g * 2 + pl) * hp + v) * 8);
                        for q in 0..8 {
                            s[dst + q] = if inside {
                                let vox = ((n * l.di[0] + iz as usize) * l.di[1] + iy as usize)
                                    * l.di[2]
                                    + ix as usize;
                                let ch = l.x_coff + g * 8 + q;
                                let v = x[vox * l.ldi + ch];
                                match norm {
                                    Some(nl) => norm_load(v, nl.ab[n * l.ldi + ch], nl.alpha),
                                    None => v,
                                }
                            } else {
                                0.0
                            };
                        }
                    }
                }
            };
            let load_step = |ring: &mut [f64], s: usize| {
                let (ti, j) = (s / h, s % h);
                let t = bx + ti * grid;
                let k0 = if j == 0 { 0 } else { j + 1 };
                for k in k0..=j + 1 {
                    load_slot(ring, (ti * (h + 1) + k) % R, t, k);
                }
            };
            // mma_step: acc[m][v] over 4 input planes x 9 (dy, dx) x KS k16 steps, A and B
            // read through their descriptors (A: K step 4 blocks, M step 8 rows of 16 bytes;
            // B: K step two planes of the slot, N step a halo row).
            let mma = |ring: &[f64], s: usize| {
                let (ti, j) = (s / h, s % h);
                let q0 = ti * (h + 1) + j;
                let mut acc = vec![0.0; 64 * nn];
                for u in 0..4 {
                    let db = ((q0 + u / 2) % R) * slot + (u % 2) * hp * 8;
                    for yx in 0..9 {
                        for ks in 0..KS {
                            let da = ((yx * CPV + 2 * ks) * 4 + 3 - u) * BLK;
                            let dbt = db + (4 * ks * hp + (yx / 3) * hx + yx % 3) * 8;
                            for k in 0..16 {
                                // B's row k (N voxels), then A's column k against it.
                                let brow: Vec<f64> = (0..nn)
                                    .map(|v| {
                                        let at = dbt + (k / 8) * 2 * hp * 8 + (v / 8) * hx * 8;
                                        ring[at + (v % 8) * 8 + k % 8]
                                    })
                                    .collect();
                                assert!(
                                    brow.iter().all(|b| !b.is_nan()),
                                    "a wgmma read a slot never loaded"
                                );
                                for m in 0..64 {
                                    let a = sw[da
                                        + (m / 8) * 64
                                        + (m % 8) * 8
                                        + (k / 8) * 4 * BLK
                                        + k % 8];
                                    if a != 0.0 {
                                        let row = &mut acc[m * nn..(m + 1) * nn];
                                        for (o, b) in row.iter_mut().zip(&brow) {
                                            *o += a * b;
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                acc
            };
            // A thread's `TileStats8` (the `_st` twin): shift, sums, sums of squares.
            let mut ts = vec![[[0.0f64; 8]; 3]; NT];
            // put: the staged planes (row m = plane * 32 + co, + bias where co < Cout), thread
            // t's x and 8-channel piece fixed, row (plane, y) = warp + 8k; with `stats`, every
            // thread's sums of the values it stores, from the tile's first voxel's staged
            // values on, flushed into [tile][cout] at the tile's last step (tile_stats.cuh).
            let mut put = |acc: &[f64], s: usize| {
                let (ti, j) = (s / h, s % h);
                let tile = bx + ti * grid;
                let (n, oz0, oy0, ox0) = origin(tile);
                let staged = |pl: usize, v: usize, co: usize| {
                    let b = bias
                        .filter(|_| nb0 + co < l.cout)
                        .map_or(0.0, |b| b[nb0 + co]);
                    acc[(pl * 32 + co) * nn + v] + b
                };
                // `_h2b` where the output is stored as staged (never added to; fp32 and no
                // activation here): voxel v of the two planes (v = plane * nn + y * 8 + x, its
                // staging row) copied whole, the Cout tile's cw channels; the threads below
                // then only sum.
                let cw = 32.min(l.cout - nb0);
                let bulk = c.stores == WzStores::Bulk
                    && !l.accum
                    && cw.is_multiple_of(4)
                    && l.cout.is_multiple_of(4);
                if bulk {
                    for v in 0..2 * nn {
                        let (pl, yy, xx) = (v / nn, v % nn / TX, v % TX);
                        let (oz, oy, ox) = (oz0 + 2 * j + pl, oy0 + yy, ox0 + xx);
                        if oz >= dout || oy >= hout || ox >= wout {
                            continue;
                        }
                        let dst = (((n * dout + oz) * hout + oy) * wout + ox) * l.cout + nb0;
                        for q in 0..cw {
                            y[dst + q] = staged(pl, v % nn, q);
                            hits[dst + q] += 1;
                        }
                    }
                }
                for (t, tst) in ts.iter_mut().enumerate() {
                    let (warp, xq, c0) = (t >> 5, (t >> 2) & 7, (t & 3) * 8);
                    if j == 0 {
                        *tst = [
                            std::array::from_fn(|q| staged(0, 0, c0 + q)),
                            [0.0; 8],
                            [0.0; 8],
                        ];
                    }
                    let (ox, ch) = (ox0 + xq, nb0 + c0);
                    if ox >= wout || ch >= l.cout {
                        continue;
                    }
                    for k in 0..2 * ny / (NT / 32) {
                        let r = warp + NT / 32 * k;
                        let (pl, yy) = (r / ny, r % ny);
                        let (oz, oy) = (oz0 + 2 * j + pl, oy0 + yy);
                        if oz >= dout || oy >= hout {
                            continue;
                        }
                        let dst = (((n * dout + oz) * hout + oy) * wout + ox) * l.cout + ch;
                        for q in 0..8 {
                            let mut v = staged(pl, yy * 8 + xq, c0 + q);
                            if ch + q < l.cout && !bulk {
                                if l.accum {
                                    v += y[dst + q];
                                }
                                y[dst + q] = v;
                                hits[dst + q] += 1;
                            }
                            let d = v - tst[0][q];
                            tst[1][q] += d;
                            tst[2][q] += d * d;
                        }
                    }
                }
                if let (Some(st), true) = (stats.as_deref_mut(), j == h - 1) {
                    let count = zt.min(dout - oz0) * ny.min(hout - oy0) * TX.min(wout - ox0);
                    for c in 0..32.min(l.cout - nb0) {
                        let (chunk, k) = (c >> 3, c & 7);
                        let sum = |i: usize| (chunk..NT).step_by(4).map(|t| ts[t][i][k]).sum();
                        let e = [sum(1), sum(2), ts[chunk][0][k], count as f64];
                        st[tile * l.cout + nb0 + c] = e;
                    }
                }
            };
            // The block's order: the weights and steps 0, 1 loaded, step 0's wgmmas; then per
            // step s, step s + 2's slots, step s + 1's wgmmas, step s's stores.
            load_step(&mut ring, 0);
            load_step(&mut ring, 1);
            let mut cur = mma(&ring, 0);
            for s in 0..steps {
                if s + 2 < steps {
                    load_step(&mut ring, s + 2);
                }
                let next = (s + 1 < steps).then(|| mma(&ring, s + 1));
                put(&cur, s);
                if let Some(a) = next {
                    cur = a;
                }
            }
        }
    }
    hits
}

/// A direct float64 conv, 3³, stride 1: x NDHWC (`cin` channels), w [cout][cin][27], output
/// NDHWC.
#[allow(clippy::too_many_arguments)]
fn direct(
    x: &[f64],
    n: usize,
    di: [usize; 3],
    w: &[f64],
    cin: usize,
    bias: &[f64],
    out: [usize; 3],
    pads: [usize; 3],
) -> Vec<f64> {
    let cout = bias.len();
    let mut y = vec![0.0; n * out.iter().product::<usize>() * cout];
    for s in 0..n {
        for oz in 0..out[0] {
            for oy in 0..out[1] {
                for ox in 0..out[2] {
                    let o = ((s * out[0] + oz) * out[1] + oy) * out[2] + ox;
                    for co in 0..cout {
                        let mut acc = bias[co];
                        for t in 0..27 {
                            let (kz, ky, kx) = (t / 9, (t / 3) % 3, t % 3);
                            let iz = (oz + kz) as i64 - pads[0] as i64;
                            let iy = (oy + ky) as i64 - pads[1] as i64;
                            let ix = (ox + kx) as i64 - pads[2] as i64;
                            let inside = [iz, iy, ix]
                                .iter()
                                .zip(di)
                                .all(|(&i, d)| (0..d as i64).contains(&i));
                            if !inside {
                                continue;
                            }
                            let vox = ((s * di[0] + iz as usize) * di[1] + iy as usize) * di[2]
                                + ix as usize;
                            for ci in 0..cin {
                                acc += x[vox * cin + ci] * w[(co * cin + ci) * 27 + t];
                            }
                        }
                        y[o * cout + co] = acc;
                    }
                }
            }
        }
    }
    y
}

/// Small integers (exact through fp16 products and fp64 sums).
fn ints(len: usize, seed: usize, m: usize) -> Vec<f64> {
    (0..len)
        .map(|i| ((i * 7919 + seed * 104729) % m) as f64 - (m / 2) as f64)
        .collect()
}

/// The weights of input channels [off, off + 32) of `w` ([cout][cin][27]) as the z-pair
/// kernel's launch uploads them (`cin_slice`, then the mma layout [Cout_pad][kpad], tap major).
fn chunk_weights(w: &[f64], cout: usize, cin: usize, off: usize) -> (Vec<f64>, usize) {
    let sliced: Vec<f32> = (0..cout)
        .flat_map(|co| (off..off + CIN).flat_map(move |ci| (0..27).map(move |t| (co, ci, t))))
        .map(|(co, ci, t)| w[(co * cin + ci) * 27 + t] as f32)
        .collect();
    let (wh, kpad) = relayout_weight(
        &sliced,
        &[cout, CIN, 3, 3, 3],
        1,
        false,
        cout.div_ceil(64) * 64,
    );
    (wh.iter().map(|v| v.to_f64()).collect(), kpad)
}

/// A conv of Cin `cin` (a multiple of 32) as `cin / 32` chunk launches, the first with the bias
/// and the later adding: every launch writes each output once, and the sum is the direct
/// conv's, over partial tiles on every axis, Cout tiles (a partial last one), several tiles per
/// block (ring slots reused across tile changes), same and valid padding; the last launch's
/// norm statistics (its `_st` twin's) give the output's mean and spread per sample and channel.
/// On `_h2`, on `_h2b`, whose first launch stores by bulk copies (Cout 40: a 32-channel copy,
/// then an 8-channel one; Cout 12, 48 bytes), on `_h2t`, whose slots are the TMA unit's
/// boxes, and on `_h2l`, the boxes with the helper's stores.
#[test]
fn zpair_chunks_sum_to_the_conv() {
    // (samples, input dims, Cin, Cout, pads, SMs)
    type Case = (usize, [usize; 3], usize, usize, [usize; 3], usize);
    let cases: [Case; 3] = [
        (1, [19, 17, 10], 64, 40, [1, 1, 1], 3),
        (1, [18, 20, 9], 96, 32, [0, 0, 0], 2),
        (2, [5, 3, 17], 32, 12, [1, 1, 1], 132),
    ];
    let kernels = [
        &CONV_WZ_C32_Y16_H2,
        &CONV_WZ_C32_Y16_H2B,
        &CONV_WZ_C32_Y16_H2T,
        &CONV_WZ_C32_Y16_H2L,
    ];
    for (c, (n, di, cin, cout, pads, sms)) in kernels
        .into_iter()
        .flat_map(|c| cases.map(|case| (c, case)))
    {
        let out: [usize; 3] = std::array::from_fn(|a| di[a] + 2 * pads[a] - 2);
        let x = ints(n * di.iter().product::<usize>() * cin, 1, 9);
        let w = ints(cout * cin * 27, 2, 7);
        let bias = ints(cout, 3, 11);
        let want = direct(&x, n, di, &w, cin, &bias, out, pads);
        let mut y = vec![f64::NAN; want.len()];
        let tps = c.tiles(1, out);
        let mut stats = vec![[f64::NAN; 4]; n * tps * cout];
        for k in 0..cin / CIN {
            let (wh, kpad) = chunk_weights(&w, cout, cin, k * CIN);
            let l = Launch {
                n,
                di,
                ldi: cin,
                x_coff: k * CIN,
                out,
                cout,
                pads,
                accum: k > 0,
            };
            let b = (k == 0).then_some(bias.as_slice());
            // The last chunk writes the norm statistics (the `_st` twin, as paired in W1).
            let last = k + 1 == cin / CIN;
            let st = last.then_some(stats.as_mut_slice());
            let hits = run(c, l, sms, &wh, kpad, b, &x, None, &mut y, st);
            assert!(
                hits.iter().all(|&h| h == 1),
                "chunk {k}: an output written {} times",
                hits.iter().max().unwrap()
            );
        }
        let bad = y.iter().zip(&want).filter(|(a, b)| a != b).count();
        assert_eq!(bad, 0, "Cin {cin} -> {cout} {di:?}: {bad} outputs differ");
        check_stats(&stats, &y, n, tps, cout);
    }
}

/// The tiles' statistics, combined per (sample, channel) as `norm_finalize_tiles` does (each
/// tile's mean from its shift, then Chan's combination of the squared deviations), against the
/// mean and the sum of squared deviations of the output itself.
fn check_stats(stats: &[[f64; 4]], y: &[f64], n: usize, tps: usize, cout: usize) {
    let per = y.len() / n / cout;
    for s in 0..n {
        for c in 0..cout {
            let (mut cnt, mut mean, mut m2) = (0.0, 0.0, 0.0);
            for t in s * tps..(s + 1) * tps {
                let [sum, sq, shift, k] = stats[t * cout + c];
                assert!(k > 0.0, "tile {t} channel {c} never flushed");
                let (mt, m2t) = (shift + sum / k, sq - sum * sum / k);
                let d = mt - mean;
                m2 += m2t + d * d * cnt * k / (cnt + k);
                mean += d * k / (cnt + k);
                cnt += k;
            }
            let vals: Vec<f64> = (0..per).map(|v| y[(s * per + v) * cout + c]).collect();
            let want_mean = vals.iter().sum::<f64>() / per as f64;
            let want_m2: f64 = vals.iter().map(|v| (v - want_mean).powi(2)).sum();
            assert_eq!(cnt, per as f64, "sample {s} channel {c}: voxels counted");
            assert!(
                (mean - want_mean).abs() <= 1e-9 * (1.0 + want_mean.abs()),
                "sample {s} channel {c}: mean {mean} against {want_mean}"
            );
            assert!(
                (m2 - want_m2).abs() <= 1e-9 * (1.0 + want_m2),
                "sample {s} channel {c}: m2 {m2} against {want_m2}"
            );
        }
    }
}

/// The `_nl` twin: the slots hold the norm's output values (act(v * a + b) per sample and
/// channel, rounded to fp16), zeros outside the input; the conv of those is the direct conv of
/// the norm's output.
#[test]
fn zpair_normed_loads_are_the_norms_output() {
    let c = &CONV_WZ_C32_Y16_H2;
    let (n, di, cout, pads) = (2usize, [17usize, 18, 9], 32usize, [1usize; 3]);
    let out: [usize; 3] = std::array::from_fn(|a| di[a] + 2 * pads[a] - 2);
    let x = ints(n * di.iter().product::<usize>() * CIN, 4, 13);
    // a = 2^-k and b a multiple of 1/4: v * a + b exact, the activation's 1/4 exact.
    let ab: Vec<(f64, f64)> = (0..n * CIN)
        .map(|i| {
            (
                1.0 / (1 << (i % 3)) as f64,
                ((i * 5) % 9) as f64 / 4.0 - 1.0,
            )
        })
        .collect();
    let nl = NormIn {
        ab: &ab,
        alpha: 0.25,
    };
    let normed: Vec<f64> = x
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let (s, ch) = (i / (x.len() / n), i % CIN);
            norm_load(v, ab[s * CIN + ch], nl.alpha)
        })
        .collect();
    let w = ints(cout * CIN * 27, 5, 7);
    let bias = ints(cout, 6, 11);
    let want = direct(&normed, n, di, &w, CIN, &bias, out, pads);
    let (wh, kpad) = chunk_weights(&w, cout, CIN, 0);
    let l = Launch {
        n,
        di,
        ldi: CIN,
        x_coff: 0,
        out,
        cout,
        pads,
        accum: false,
    };
    let mut y = vec![f64::NAN; want.len()];
    let hits = run(c, l, 4, &wh, kpad, Some(&bias), &x, Some(&nl), &mut y, None);
    assert!(hits.iter().all(|&h| h == 1));
    let bad = y.iter().zip(&want).filter(|(a, b)| a != b).count();
    assert_eq!(bad, 0, "{bad} outputs differ");
}
