//! CPU emulation of the `conv_wg` kernels' index math (kernels/conv_wgmma.cu, one tile per
//! block), no GPU, at stride 1 and 2: the tile decode, the halo rows (`WgConv::row_of`: at
//! stride 2 the reach stored by parity class), the weight stages, and each tap's wgmma operands
//! read through their descriptors (no-swizzle core matrices; at stride 2 the A operand's M step
//! one row of the tap's phase), over Cin chunks and Cout tiles (grid.y). Every output element is
//! written once and equals a direct float64 conv; the values are small integers, so every sum
//! is exact.

use voxtile::internals::cuda::host::catalogue::{
    HaloConfig, CONV_WG_C32N64_S2, CONV_WG_C32N64_S2P, CONV_WG_C32N64_S2Z1, CONV_WG_C32N64_S4,
};
use voxtile::internals::cuda::host::relayout::relayout_weight;

/// The kernel's halo geometry for a config: reach per axis and the phase arithmetic
/// (`WgConv::ext`, `phase_off`, `row_of`).
struct Halo {
    s: usize,
    h: [usize; 3],
}

impl Halo {
    fn of(c: &HaloConfig) -> Self {
        let s = c.stride;
        Halo {
            s,
            h: [0, 1, 2].map(|i| (c.tile[i] - 1) * s + 3),
        }
    }
    fn rows(&self) -> usize {
        self.h.iter().product()
    }
    /// Extent of phase `ph` of axis `a`.
    fn ext(&self, a: usize, ph: usize) -> usize {
        if self.s == 1 {
            self.h[a]
        } else {
            (self.h[a] + 1 - ph) / 2
        }
    }
    fn phase_off(&self, pz: usize, py: usize, px: usize) -> usize {
        let hp = self.h[1] * self.h[2];
        pz * self.ext(0, 0) * hp
            + py * self.ext(0, pz) * self.ext(1, 0) * self.h[2]
            + px * self.ext(0, pz) * self.ext(1, py) * self.ext(2, 0)
    }
    fn row_of(&self, z: usize, y: usize, x: usize) -> usize {
        if self.s == 1 {
            return (z * self.h[1] + y) * self.h[2] + x;
        }
        let (py, px) = (y & 1, x & 1);
        self.phase_off(z & 1, py, px)
            + ((z >> 1) * self.ext(1, py) + (y >> 1)) * self.ext(2, px)
            + (x >> 1)
    }
    /// `issue_tap`'s row of output (0, 0, 0) through tap (dz, dy, dx), the rows between output
    /// planes, and the A descriptor's M step in rows.
    fn tap(&self, dz: usize, dy: usize, dx: usize) -> (usize, usize, usize) {
        if self.s == 1 {
            let hp = self.h[1] * self.h[2];
            return ((dz * self.h[1] + dy) * self.h[2] + dx, hp, self.h[2]);
        }
        let (py, px) = (dy & 1, dx & 1);
        let (ny, nx) = (self.ext(1, py), self.ext(2, px));
        let toff = self.phase_off(dz & 1, py, px) + ((dz >> 1) * ny + (dy >> 1)) * nx + (dx >> 1);
        (toff, ny * nx, nx)
    }
}

/// One launch: batch, input dims, Cin, Cout, begin pads (the output's dims follow from the
/// stride with end pads equal to the begin ones).
struct Problem {
    n: usize,
    di: [usize; 3],
    cin: usize,
    cout: usize,
    pads: [usize; 3],
}

impl Problem {
    fn out(&self, s: usize) -> [usize; 3] {
        [0, 1, 2].map(|i| (self.di[i] + 2 * self.pads[i] - 3) / s + 1)
    }
}

/// Emulates the launch of `c` over `pr`: x NDHWC, `wh` the mma layout [Cout_pad][kpad].
/// Returns y (NDHWC) and how often each element was written.
fn emulate(
    c: &HaloConfig,
    pr: &Problem,
    x: &[f64],
    wh: &[f64],
    kpad: usize,
) -> (Vec<f64>, Vec<u32>) {
    let hg = Halo::of(c);
    let (s, cw, bn) = (c.stride, c.cin, c.bn);
    let cpv = cw / 8;
    let hv = hg.rows();
    let out = pr.out(s);
    let t = c.tile;
    let nt = [0, 1, 2].map(|i| out[i].div_ceil(t[i]));
    let tiles = pr.n * nt.iter().product::<usize>();
    let mut y = vec![0.0; pr.n * out.iter().product::<usize>() * pr.cout];
    let mut writes = vec![0u32; y.len()];
    // The fill is one-to-one into the halo's rows.
    let mut seen = vec![false; hv];
    for z in 0..hg.h[0] {
        for yy in 0..hg.h[1] {
            for xx in 0..hg.h[2] {
                let r = hg.row_of(z, yy, xx);
                assert!(r < hv && !seen[r], "row {r} of ({z}, {yy}, {xx})");
                seen[r] = true;
            }
        }
    }
    for by in 0..pr.cout.div_ceil(bn) {
        let nb0 = by * bn;
        for tile in 0..tiles {
            // tile_origin's order: x fastest, then y, z, sample.
            let (tx, r) = (tile % nt[2], tile / nt[2]);
            let (ty, r) = (r % nt[1], r / nt[1]);
            let (tz, n) = (r % nt[0], r / nt[0]);
            let o0 = [tz * t[0], ty * t[1], tx * t[2]];
            let i0 = [0, 1, 2].map(|i| (o0[i] * s) as i64 - pr.pads[i] as i64);
            let mut acc = vec![0.0; t[0] * 64 * bn];
            for c0 in (0..pr.cin).step_by(cw) {
                // The halo: [cpv][hv][8].
                let mut halo = vec![f64::NAN; cpv * hv * 8];
                for z in 0..hg.h[0] {
                    for yy in 0..hg.h[1] {
                        for xx in 0..hg.h[2] {
                            let iv = [z, yy, xx].map(|v| v as i64);
                            let ii = [0, 1, 2].map(|i| i0[i] + iv[i]);
                            let inside = (0..3).all(|i| (0..pr.di[i] as i64).contains(&ii[i]));
                            let row = hg.row_of(z, yy, xx);
                            for ci in 0..cw {
                                let v = if inside {
                                    let vox = ((n * pr.di[0] + ii[0] as usize) * pr.di[1]
                                        + ii[1] as usize)
                                        * pr.di[2]
                                        + ii[2] as usize;
                                    x[vox * pr.cin + c0 + ci]
                                } else {
                                    0.0
                                };
                                halo[((ci / 8) * hv + row) * 8 + ci % 8] = v;
                            }
                        }
                    }
                }
                // The 27 taps' weight stages [tap][cpv][bn][8] (rows past Cout zero).
                let mut ws = vec![0.0; 27 * cpv * bn * 8];
                for tap in 0..27 {
                    for nn in 0..bn {
                        for ci in 0..cw {
                            let co = nb0 + nn;
                            let v = if co < pr.cout {
                                wh[co * kpad + tap * pr.cin + c0 + ci]
                            } else {
                                0.0
                            };
                            ws[((tap * cpv + ci / 8) * bn + nn) * 8 + ci % 8] = v;
                        }
                    }
                }
                for tap in 0..27 {
                    let (toff, plane, sbo) = hg.tap(tap / 9, (tap / 3) % 3, tap % 3);
                    for ks in 0..cw / 16 {
                        for z in 0..t[0] {
                            let a0 = 2 * ks * hv + z * plane + toff;
                            let b0 = (tap * cpv + 2 * ks) * bn;
                            for m in 0..64 {
                                for nn in 0..bn {
                                    let mut sum = 0.0;
                                    for k in 0..16 {
                                        // A: M step sbo rows, K step hv rows; B: N step 8 rows
                                        // (128 bytes), K step bn rows.
                                        let ar = a0 + (m / 8) * sbo + m % 8 + (k / 8) * hv;
                                        let br = b0 + (nn / 8) * 8 + nn % 8 + (k / 8) * bn;
                                        sum += halo[ar * 8 + k % 8] * ws[br * 8 + k % 8];
                                    }
                                    acc[(z * 64 + m) * bn + nn] += sum;
                                }
                            }
                        }
                    }
                }
            }
            for z in 0..t[0] {
                for m in 0..64 {
                    let o = [o0[0] + z, o0[1] + m / 8, o0[2] + m % 8];
                    if (0..3).any(|i| o[i] >= out[i]) {
                        continue;
                    }
                    let vox = ((n * out[0] + o[0]) * out[1] + o[1]) * out[2] + o[2];
                    for nn in 0..bn.min(pr.cout - nb0) {
                        let e = vox * pr.cout + nb0 + nn;
                        y[e] = acc[(z * 64 + m) * bn + nn];
                        writes[e] += 1;
                    }
                }
            }
        }
    }
    (y, writes)
}

/// A direct float64 3³ conv of stride `s`: x NDHWC, w [cout][cin][27].
fn direct(pr: &Problem, s: usize, x: &[f64], w: &[f64]) -> Vec<f64> {
    let out = pr.out(s);
    let mut y = vec![0.0; pr.n * out.iter().product::<usize>() * pr.cout];
    for n in 0..pr.n {
        for oz in 0..out[0] {
            for oy in 0..out[1] {
                for ox in 0..out[2] {
                    let o = ((n * out[0] + oz) * out[1] + oy) * out[2] + ox;
                    for t in 0..27 {
                        let k = [t / 9, (t / 3) % 3, t % 3];
                        let oo = [oz, oy, ox];
                        let ii = [0, 1, 2].map(|i| (oo[i] * s + k[i]) as i64 - pr.pads[i] as i64);
                        if !(0..3).all(|i| (0..pr.di[i] as i64).contains(&ii[i])) {
                            continue;
                        }
                        let vox = ((n * pr.di[0] + ii[0] as usize) * pr.di[1] + ii[1] as usize)
                            * pr.di[2]
                            + ii[2] as usize;
                        for co in 0..pr.cout {
                            for ci in 0..pr.cin {
                                y[o * pr.cout + co] +=
                                    x[vox * pr.cin + ci] * w[(co * pr.cin + ci) * 27 + t];
                            }
                        }
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

/// The stride-2 kernels (and a stride-1 one, the same arithmetic at S = 1) against the direct
/// conv: partial tiles on every axis (odd and even input edges), zero and unit pads, Cout 20
/// (one channel tile), 64 and 72 / 128 (two tiles), Cin 64 in two 32-channel chunks, batch 2.
#[test]
fn conv_wg_index_emulation() {
    let cases = [
        (&CONV_WG_C32N64_S2, 1, [9, 13, 17], 32, 64, [1; 3]),
        (&CONV_WG_C32N64_S2, 2, [6, 10, 16], 64, 20, [1, 0, 1]),
        (&CONV_WG_C32N64_S2, 1, [7, 17, 18], 32, 72, [0; 3]),
        (&CONV_WG_C32N64_S2Z1, 1, [5, 11, 19], 64, 128, [1; 3]),
        (&CONV_WG_C32N64_S2Z1, 2, [4, 9, 9], 32, 20, [1; 3]),
        (&CONV_WG_C32N64_S2P, 1, [7, 12, 15], 32, 64, [1; 3]),
        (&CONV_WG_C32N64_S4, 1, [6, 9, 11], 64, 72, [1; 3]),
    ];
    for (i, &(c, n, di, cin, cout, pads)) in cases.iter().enumerate() {
        let pr = Problem {
            n,
            di,
            cin,
            cout,
            pads,
        };
        let x = ints(n * di.iter().product::<usize>() * cin, i, 7);
        let w = ints(cout * cin * 27, i + 100, 5);
        let wf: Vec<f32> = w.iter().map(|&v| v as f32).collect();
        let (wh, kpad) =
            relayout_weight(&wf, &[cout, cin, 3, 3, 3], 1, false, cout.div_ceil(64) * 64);
        let wh: Vec<f64> = wh.iter().map(|v| v.to_f64()).collect();
        let (y, writes) = emulate(c, &pr, &x, &wh, kpad);
        let want = direct(&pr, c.stride, &x, &w);
        let name = format!(
            "{} case {i}: {n}x{di:?} {cin}->{cout} pads {pads:?}",
            c.name
        );
        assert!(writes.iter().all(|&k| k == 1), "{name}: every output once");
        let bad = y.iter().zip(&want).filter(|(a, b)| a != b).count();
        assert_eq!(bad, 0, "{name}: {bad} of {} values differ", y.len());
    }
}
