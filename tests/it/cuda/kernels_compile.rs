//! Compiles every kernels/*.cu family with NVRTC (no GPU needed): any error or warning fails.
//! Skips with a message when libnvrtc cannot be loaded, unless VOXTILE_REQUIRE_NVRTC=1.
//! CI: LD_LIBRARY_PATH=<wheel>/nvidia/cu13/lib VOXTILE_CUDA_INCLUDE=<wheel>/nvidia/cu13/include.

use super::walk_emulation::BoxWalk;
use crate::common::rng::Rng;
use voxtile::internals::cuda::host::catalogue::{self as cat, Family};
use voxtile::internals::cuda::runtime::compile;

#[test]
fn every_kernel_family_compiles_without_warnings() {
    let require = std::env::var("VOXTILE_REQUIRE_NVRTC")
        .map(|v| v == "1")
        .unwrap_or(false);
    if !compile::nvrtc_present() {
        assert!(
            !require,
            "VOXTILE_REQUIRE_NVRTC=1 but libnvrtc could not be loaded (check LD_LIBRARY_PATH)"
        );
        println!("skipped: libnvrtc not found (set LD_LIBRARY_PATH to a CUDA 13.0 NVRTC)");
        return;
    }
    let (ma, mi) = compile::nvrtc_version().expect("nvrtc version");
    println!(
        "NVRTC {ma}.{mi}, include dirs {:?}",
        compile::include_dirs()
    );
    let mut failures = Vec::new();
    // Every (program, architecture) at once, as a cold start builds them (`compile::compile_all`:
    // rayon's threads); a family for another architecture only (the wgmma one: sm_90a, on
    // sm_90) is skipped.
    let targets: Vec<_> = ["sm_90", "sm_80"]
        .iter()
        .flat_map(|arch| compile::targets_for(arch))
        .collect();
    for ((unit, arch), got) in targets.iter().zip(compile::compile_all(&targets)) {
        let name = unit.label();
        match got {
            Ok(image) => {
                // The cubin is what a warm start loads: it must hold every entry too.
                let Some(cubin) = &image.cubin else {
                    failures.push(format!("{name}.cu ({arch}): NVRTC gave no cubin"));
                    continue;
                };
                let strings: std::collections::HashSet<&[u8]> = cubin.split(|b| *b == 0).collect();
                for e in unit.entries() {
                    if !image.ptx.contains(&format!(".entry {e}(")) {
                        failures.push(format!(
                            "{name}.cu ({arch}): entry {e} missing from the PTX"
                        ));
                    }
                    if !strings.contains(e.as_bytes()) {
                        failures.push(format!(
                            "{name}.cu ({arch}): symbol {e} missing from the cubin"
                        ));
                    }
                }
                println!(
                    "{name}.cu {arch}: {} bytes of PTX, {} of cubin",
                    image.ptx.len(),
                    cubin.len()
                );
            }
            Err(e) => failures.push(e.to_string()),
        }
    }
    assert!(
        failures.is_empty(),
        "kernel build failures:\n{}",
        failures.join("\n")
    );
}

use voxtile::internals::cuda::host::catalogue::{halo_config, HaloConfig, HALO_CONFIGS};

/// The `HALO_ENTRY(...)` / `HALO2_ENTRY(...)` lines of kernels/conv_halo.cu: name and numbers.
fn halo_entries() -> Vec<(String, Vec<usize>)> {
    let src = Family::ConvHalo.source();
    src.lines()
        .filter_map(|l| {
            let rest = l
                .strip_prefix("HALO_ENTRY(")
                .or_else(|| l.strip_prefix("HALO2_ENTRY("))?;
            let args: Vec<&str> = rest
                .trim_end_matches(')')
                .split(',')
                .map(str::trim)
                .collect();
            let nums = args[1..]
                .iter()
                .map(|a| a.parse().expect("number"))
                .collect();
            Some((args[0].to_string(), nums))
        })
        .collect()
}

/// plan.rs's HALO_CONFIGS and the kernel definitions agree: every config has an entry whose
/// template arguments match its fields, every entry a config, and the conv family lists them.
#[test]
fn halo_configs_match_the_kernel_entries() {
    let entries = halo_entries();
    assert_eq!(entries.len(), HALO_CONFIGS.len(), "{entries:?}");
    let listed = Family::ConvHalo.entries();
    for (name, a) in &entries {
        let c = halo_config(name).unwrap_or_else(|| panic!("{name} not in HALO_CONFIGS"));
        let wn = c.threads as usize / 32 / c.wm;
        let want: Vec<usize> = if a.len() == 4 {
            // HALO_ENTRY(NAME, CIN, BN, WM, WN): 4x8x8, 2 weight stages, one block per tile.
            assert_eq!(
                (c.tile, c.wst, c.hb, c.persist),
                ([4, 8, 8], 2, 1, 0),
                "{name}"
            );
            vec![c.cin, c.bn, c.wm, wn]
        } else {
            let [z, y, x] = c.tile;
            assert!(c.stride == 1 || c.stride == 2, "{name}: stride");
            vec![c.cin, c.bn, c.wm, wn, z, y, x, c.wst, c.hb, c.stride]
        };
        assert_eq!(&want, a, "{name}: config vs kernel entry");
        assert!(
            name.starts_with(&format!("conv_halo_c{}n{}", c.cin, c.bn)),
            "{name}: named by its smem width and tile width"
        );
        // The kernels zero-pad any even real Cin below CIN (a runtime branch); the config
        // says whether the planner may use that: the width-16 kernels (W2's Cin 14).
        assert_eq!(c.pad_cin, c.cin == 16, "{name}: zero-padding configs");
        assert!(
            listed.contains(&name.as_str()),
            "{name} not in the conv family"
        );
        // Shapes the kernel's static_asserts require (checked here too, for the config side).
        let tbm = c.tile.iter().product::<usize>();
        assert!(
            tbm.is_multiple_of(c.wm * 16) && (c.bn / wn).is_multiple_of(16),
            "{name}: warp tile"
        );
        assert!(c.wst == 0 || c.wst >= 2, "{name}: staging");
        assert!(c.hb == 1 || c.hb == 2, "{name}: halo buffers");
    }
}

/// What one emulated launch did, so the test can assert that every path ran.
#[derive(Default)]
struct HaloRun {
    /// Output tiles stored by `halo_store_vec` (conv_halo's vector epilogue) / by `halo_store`.
    vec_tiles: usize,
    scalar_tiles: usize,
    /// Vector-epilogue tiles of grid.y > 0 (nb0 > 0).
    vec_tiles_y: usize,
    /// 4-byte (narrow) halo copies into the other buffer during the taps (slab prefetch).
    narrow_slab_copies: usize,
}

/// What [`emulate_halo`] launches on: x and w in the kernel's layouts, the output slice and
/// the begin pads.
#[derive(Clone, Copy)]
struct HaloProblem<'a> {
    x: &'a [f64],
    /// n, d, h, w, Cin (p.cin).
    inp: [usize; 5],
    /// [cout_pad][kpad], K = tap * Cin + ci.
    w: &'a [f64],
    kpad: usize,
    cout: usize,
    /// ldc, coff.
    slice: [usize; 2],
    /// Begin pads.
    pads: [usize; 3],
    out: [usize; 3],
    sm_count: usize,
}

/// Emulates one `conv_halo` / `conv_halo_t` launch on the CPU at the level of its index
/// arithmetic: tile decode, halo copy (zero fill outside the input), weight staging (resident
/// or ring), the per-lane ldmatrix addresses turned into mma fragments by the ldmatrix/mma
/// operand layouts, the tile loop of persistent blocks (program order: a buffer overwritten
/// before it is read shows up as a wrong value), the Cin chunks (Cin = k * c.cin: each chunk's
/// halo reloaded, or with two buffers prefetched in slabs during the previous chunk's taps),
/// the grid.y output-channel tiles and both epilogues (`halo_store` through conv_store, and
/// conv_halo's `halo_store_vec` where the kernel takes it), into a channel slice
/// (ldc, coff) of y. A real Cin p.cin below the smem width c.cin (`narrow`, the `pad_cin`
/// configs) copies 4 bytes (2 halves) at a time and zero-fills channels p.cin..c.cin-1 of
/// every halo and weight row, as `halo_copy<2>` / `halo_wcopy<2>`; x rows are p.cin apart and
/// w's K is tap * p.cin + ci. Bias and activation are left out (null bias, no activation).
/// Returns y (NDHWC, ldc channels; NaN where not written), how often each element was written,
/// and which paths ran.
fn emulate_halo(c: &HaloConfig, prob: HaloProblem<'_>) -> (Vec<f64>, Vec<u32>, HaloRun) {
    let HaloProblem {
        x,
        inp,
        w,
        kpad,
        cout,
        slice,
        pads,
        out,
        sm_count,
    } = prob;
    let (cin, xc) = (c.cin, inp[4]); // CIN (smem width, chunk), p.cin (x's voxel stride)
    assert!(c.accepts_cin(xc), "{}: Cin {xc}", c.name);
    let [ldc, coff] = slice;
    assert!(coff + cout <= ldc);
    let narrow = xc < cin; // `narrow = p.cin < CIN`: 4-byte copies, zero-padded channels
    let (ld, cpv) = (cin + 8, cin / 8); // LD; CPV: 16-byte pieces per halo row
    let [tz, ty, tx] = c.tile;
    // The tile's reach at the config's stride; stride 2 stores each x-row's even voxels first
    // (`halo_x`), so tap dx of output xx is row xx, (hx + 1) / 2 + xx or xx + 1.
    let s = c.stride;
    let (hy, hx) = ((ty - 1) * s + 3, (tx - 1) * s + 3);
    let hv = c.halo_rows();
    let halo_x = |h: usize| {
        if s == 1 || h.is_multiple_of(2) {
            h / s
        } else {
            hx.div_ceil(2) + h / 2
        }
    };
    let tap_x = |dx: usize| if s == 1 { dx } else { halo_x(dx) };
    let res = c.wst == 0;
    let wld = if res { 27 * cin + 8 } else { ld };
    let ws_n = if res { 2 } else { c.wst };
    let wrows = if res { c.bn } else { c.wst * c.bn };
    // The original kernel (conv_halo) puts the halo first, conv_halo_t the weights first.
    let v1 = halo_entries()
        .iter()
        .any(|(n, a)| n == c.name && a.len() == 4);
    let (w_base, in_base) = if v1 { (hv * ld, 0) } else { (0, wrows * wld) };
    let smem_len = c.smem_bytes() as usize / 2;
    if v1 {
        // conv_halo's smem: HVOX * LD + 2 * BN * LD halves (its VEC_FITS bound).
        assert_eq!((hv * ld + 2 * c.bn * ld) * 2, c.smem_bytes() as usize);
    }
    let mut sm = vec![f64::NAN; smem_len];
    let threads = c.threads as usize;
    let (wm_n, wn_n) = (c.wm, threads / 32 / c.wm);
    let (tm, tn) = (c.tile.iter().product::<usize>() / wm_n, c.bn / wn_n);
    let (mi, ni) = (tm / 16, tn / 8);
    let tbm = tm * wm_n;
    let (n_b, di, hi, wi) = (inp[0], inp[1], inp[2], inp[3]);
    let ny = c.cout_tiles(cout) as usize;
    let (ntx, nty, ntz) = (
        out[2].div_ceil(tx),
        out[1].div_ceil(ty),
        out[0].div_ceil(tz),
    );
    let ntiles = n_b * ntz * nty * ntx;
    let grid = c.grid(n_b, out, sm_count) as usize;
    assert_eq!(ntiles, c.tiles(n_b, out));
    assert!(
        !v1 || grid == ntiles,
        "{}: conv_halo is one tile per block",
        c.name
    );
    let mut y = vec![f64::NAN; n_b * out.iter().product::<usize>() * ldc];
    let mut writes = vec![0u32; y.len()];
    let mut run = HaloRun::default();
    let decode = |t: usize| {
        let ox0 = (t % ntx) * tx;
        let t = t / ntx;
        let oy0 = (t % nty) * ty;
        let t = t / nty;
        ((t / ntz), (t % ntz) * tz, oy0, ox0)
    };
    // One cp.async of u halves (source None: size 0, zero fill); both addresses u-aligned.
    let copy = |sm: &mut Vec<f64>, u: usize, dst: usize, src: Option<(&[f64], usize)>| {
        assert!(
            dst.is_multiple_of(u) && dst + u <= smem_len,
            "{}: smem write {dst}",
            c.name
        );
        if let Some((s, o)) = src {
            assert!(
                o.is_multiple_of(u) && o + u <= s.len(),
                "{}: global read {o}",
                c.name
            );
        }
        for e in 0..u {
            sm[dst + e] = src.map_or(0.0, |(s, o)| s[o + e]);
        }
    };
    // `halo_copy<U>`: copies lo..end (U halves each, CIN / U per row, end clamped to the halo)
    // of tile t's halo of channels c0.. into `buf`; returns how many it made. As the kernel
    // does it: each thread's piece of a row fixed, its rows walked (`BoxWalk`), the source at
    // the box origin's offset plus the walk's.
    let halo_copy =
        |sm: &mut Vec<f64>, u: usize, buf: usize, t: usize, c0: usize, lo: usize, end: usize| {
            let upv = cin / u;
            assert_eq!(threads % upv, 0, "{}: a thread's piece is fixed", c.name);
            let (n, oz0, oy0, ox0) = decode(t);
            let (iz0, iy0, ix0) = (
                (oz0 * s) as i64 - pads[0] as i64,
                (oy0 * s) as i64 - pads[1] as i64,
                (ox0 * s) as i64 - pads[2] as i64,
            );
            let (ex, ey) = (xc as i64, (wi * xc) as i64);
            let ez = hi as i64 * ey;
            let end = end.min(hv * upv);
            for tid in 0..threads {
                let i0 = lo + tid;
                let ch = i0 % upv * u;
                let o0 = (n * di) as i64 * ez + iz0 * ez + iy0 * ey + ix0 * ex + (c0 + ch) as i64;
                let mut b = BoxWalk::new(
                    hy as i64,
                    hx as i64,
                    (threads / upv) as i64,
                    (i0 / upv) as i64,
                    ex,
                    ey,
                    ez,
                );
                let (mut idx, mut v) = (i0, i0 / upv);
                while idx < end {
                    let xx = b.x as usize;
                    let inside = (0..di as i64).contains(&(iz0 + b.z))
                        && (0..hi as i64).contains(&(iy0 + b.y))
                        && (0..wi as i64).contains(&(ix0 + b.x));
                    let ok = inside && (u == 8 || ch < xc);
                    let src = ok.then(|| (x, (o0 + b.off) as usize));
                    copy(sm, u, buf + (v - xx + halo_x(xx)) * ld + ch, src);
                    idx += threads;
                    v += threads / upv;
                    b.step();
                }
            }
            end.saturating_sub(lo)
        };
    // conv_halo_t's `load_halo`: lo..end in 16-byte pieces of the HV * CPV; narrow: the same
    // rows in 4-byte copies (x4), channels from 0.
    let load_halo = |sm: &mut Vec<f64>, buf: usize, t: usize, c0: usize, lo: usize, end: usize| {
        if narrow {
            halo_copy(sm, 2, buf, t, 0, lo * 4, end * 4)
        } else {
            halo_copy(sm, 8, buf, t, c0, lo, end)
        }
    };
    // `halo_wcopy<U, CIN, BN, NT, WLD>`: nt taps from tap0 of weight rows nb0.. (channels c0..)
    // into rows of `row` halves at `base`, tap t at column t * CIN.
    let wcopy = |sm: &mut Vec<f64>,
                 base: usize,
                 row: usize,
                 nt: usize,
                 tap0: usize,
                 c0: usize,
                 nb0: usize| {
        let u = if narrow { 2 } else { 8 };
        let upt = cin / u;
        for idx in 0..c.bn * nt * upt {
            let (co, r) = (idx / (nt * upt), idx % (nt * upt));
            let t = if nt == 1 { 0 } else { r / upt };
            let ch = (r - t * upt) * u;
            let o = (nb0 + co) * kpad + (tap0 + t) * xc + c0 + ch;
            let ok = u == 8 || ch < xc;
            copy(sm, u, base + co * row + t * cin + ch, ok.then_some((w, o)));
        }
    };
    // Staged: tap `tap`'s weights of channels c0.. into ring stage `stage`.
    let load_w = |sm: &mut Vec<f64>, stage: usize, tap: usize, c0: usize, nb0: usize| {
        wcopy(sm, w_base + stage * c.bn * ld, ld, 1, tap, c0, nb0);
    };
    // One output element (conv_store / the vector store), into the slice.
    let mut put = |m: usize, co: usize, v: f64| {
        assert!(co < cout, "{}: channel {co}", c.name);
        y[m * ldc + coff + co] = v;
        writes[m * ldc + coff + co] += 1;
    };
    for yb in 0..ny {
        let nb0 = yb * c.bn; // blockIdx.y: output-channel tile
        for b in 0..grid {
            if res {
                wcopy(&mut sm, w_base, wld, 27, 0, 0, nb0);
            }
            let mut t = b;
            if !v1 && t < ntiles {
                load_halo(&mut sm, in_base, t, 0, 0, hv * cpv);
            }
            let mut buf = 0;
            while t < ntiles {
                // acc[row of the block tile][column of the channel tile]
                let mut acc = vec![0.0f64; tbm * c.bn];
                for c0 in (0..xc).step_by(cin) {
                    let hin = in_base + buf * hv * ld;
                    if v1 {
                        // conv_halo: every chunk's halo (narrow: 0..HVOX * (CIN / 2), c0 0).
                        if narrow {
                            halo_copy(&mut sm, 2, in_base, t, 0, 0, hv * (cin / 2));
                        } else {
                            halo_copy(&mut sm, 8, in_base, t, c0, 0, hv * cpv);
                        }
                    } else if c.hb == 1 && c0 > 0 {
                        load_halo(&mut sm, in_base, t, c0, 0, hv * cpv);
                    }
                    if res && c.hb == 2 && t + grid < ntiles {
                        load_halo(
                            &mut sm,
                            in_base + (buf ^ 1) * hv * ld,
                            t + grid,
                            0,
                            0,
                            hv * cpv,
                        );
                    }
                    // Staged, two buffers: the next (tile, chunk) whose halo comes in slabs.
                    let (pt, pc) = if c0 + cin < xc {
                        (t, c0 + cin)
                    } else {
                        (t + grid, 0)
                    };
                    let pre = !res && c.hb == 2 && pt < ntiles;
                    if !res {
                        for s in 0..ws_n - 1 {
                            load_w(&mut sm, s, s, c0, nb0);
                        }
                    }
                    let mut slab_copies = 0;
                    for tap in 0..27 {
                        if !res && tap + ws_n - 1 < 27 {
                            load_w(&mut sm, (tap + ws_n - 1) % ws_n, tap + ws_n - 1, c0, nb0);
                        }
                        if pre {
                            let end = if tap == 26 {
                                hv * cpv
                            } else {
                                (hv * cpv).min((tap + 1) * threads)
                            };
                            let n = load_halo(
                                &mut sm,
                                in_base + (buf ^ 1) * hv * ld,
                                pt,
                                pc,
                                tap * threads,
                                end,
                            );
                            slab_copies += n;
                            if narrow {
                                run.narrow_slab_copies += n;
                            }
                        }
                        let (dz, dy, dx) = (tap / 9, (tap / 3) % 3, tap % 3);
                        let toff = (dz * hy + dy) * hx + tap_x(dx);
                        for warp in 0..wm_n * wn_n {
                            let (wm, wn) = (warp % wm_n, warp / wm_n);
                            for kk in (0..cin).step_by(16) {
                                // Per-lane ldmatrix addresses, as the kernel computes them.
                                let a_addr = |i: usize, lane: usize| {
                                    let r = wm * tm + i * 16 + (lane & 15);
                                    let (z, yy, xx) = (r / (ty * tx), (r / tx) % ty, r % tx);
                                    let hrow = (z * s * hy + yy * s) * hx + xx;
                                    hin + (hrow + toff) * ld + kk + (lane >> 4) * 8
                                };
                                let b_addr = |j: usize, lane: usize| {
                                    let b_row = (lane >> 4) * 8 + (lane & 7);
                                    let b_col = ((lane >> 3) & 1) * 8;
                                    if res {
                                        w_base
                                            + (wn * tn + b_row) * wld
                                            + b_col
                                            + tap * cin
                                            + j * 16 * wld
                                            + kk
                                    } else {
                                        w_base
                                            + (tap % ws_n) * c.bn * ld
                                            + (wn * tn + b_row) * ld
                                            + b_col
                                            + j * 16 * ld
                                            + kk
                                    }
                                };
                                let rd = |a: usize| {
                                    assert!(
                                        a + 8 <= smem_len && a.is_multiple_of(8),
                                        "{}: smem read {a}",
                                        c.name
                                    );
                                    let v = &sm[a..a + 8];
                                    assert!(
                                        v.iter().all(|f| f.is_finite()),
                                        "{}: unwritten smem {a}",
                                        c.name
                                    );
                                    v.to_vec()
                                };
                                // B operands (the same for every i): ldsm j's 32 lane rows.
                                let bms: Vec<Vec<Vec<f64>>> = (0..ni / 2)
                                    .map(|j| (0..32).map(|l| rd(b_addr(j, l))).collect())
                                    .collect();
                                for i in 0..mi {
                                    // ldmatrix.x4: matrix q's row rr comes from lane 8q + rr; the mma A
                                    // operand: q = (row / 8) + 2 * (k / 8).
                                    let am: Vec<Vec<f64>> =
                                        (0..32).map(|l| rd(a_addr(i, l))).collect();
                                    let a = |row: usize, k: usize| {
                                        am[8 * (row / 8 + 2 * (k / 8)) + row % 8][k % 8]
                                    };
                                    for jn in 0..ni {
                                        // B operand of n-block jn: ldsm j = jn / 2, b0/b1 = matrices
                                        // 2h, 2h+1 (h = jn % 2), row = n within the 8, k halves 0-7 / 8-15.
                                        let bm = &bms[jn / 2];
                                        let h = jn % 2;
                                        for row in 0..16 {
                                            for nn in 0..8 {
                                                let mut s = 0.0;
                                                for k in 0..16 {
                                                    let q = 2 * h + k / 8;
                                                    s += a(row, k) * bm[8 * q + nn][k % 8];
                                                }
                                                acc[(wm * tm + i * 16 + row) * c.bn
                                                    + wn * tn
                                                    + jn * 8
                                                    + nn] += s;
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                    // The 27 slabs cover the next halo once: HV * CPV pieces, narrow 4 copies each.
                    let want = if pre {
                        hv * cin / if narrow { 2 } else { 8 }
                    } else {
                        0
                    };
                    assert_eq!(slab_copies, want, "{}: slab prefetch copies", c.name);
                    if !res && c.hb == 2 {
                        buf ^= 1;
                    }
                }
                let (n, oz0, oy0, ox0) = decode(t);
                let out_of = |r: usize| {
                    let (oz, oy, ox) = (oz0 + r / (ty * tx), oy0 + (r / tx) % ty, ox0 + r % tx);
                    let m = ((n * out[0] + oz) * out[1] + oy) * out[2] + ox;
                    (oz < out[0] && oy < out[1] && ox < out[2]).then_some(m)
                };
                // conv_halo only: VEC_FITS (the fp32 stage tile within the kernel's smem) and
                // halo_store_vec's layout test (Cout, ldc, coff multiples of 8).
                let vec_fits = tbm * (c.bn + 8) * 4 <= (hv * ld + 2 * c.bn * ld) * 2;
                if v1 && vec_fits && (cout | ldc | coff) & 7 == 0 {
                    // halo_store_vec: fragments staged as fp32 rows of BN + 8 over the block's
                    // smem (float2 writes), then thread tid writes channels nb0 + (tid % CH) * 8
                    // .. + 8 of rows tid / CH, + THREADS / CH, .. (CH = BN / 8; float4 reads,
                    // one 16-byte store).
                    run.vec_tiles += 1;
                    run.vec_tiles_y += usize::from(nb0 > 0);
                    let (ldf, chn) = (c.bn + 8, c.bn / 8);
                    assert!(threads.is_multiple_of(chn));
                    let mut stage = vec![f64::NAN; smem_len / 2]; // dsm as floats
                    for warp in 0..wm_n * wn_n {
                        let (wm, wn) = (warp % wm_n, warp / wm_n);
                        for lane in 0..32 {
                            for i in 0..mi {
                                for h in 0..2 {
                                    let r = wm * tm + i * 16 + (lane >> 2) + h * 8;
                                    for jn in 0..ni {
                                        let col = wn * tn + jn * 8 + (lane & 3) * 2;
                                        let s = r * ldf + col;
                                        assert!(
                                            s.is_multiple_of(2) && s + 2 <= stage.len(),
                                            "{}: stage write {s}",
                                            c.name
                                        );
                                        for e in 0..2 {
                                            assert!(
                                                stage[s + e].is_nan(),
                                                "{}: staged twice",
                                                c.name
                                            );
                                            stage[s + e] = acc[r * c.bn + col + e];
                                        }
                                    }
                                }
                            }
                        }
                    }
                    for tid in 0..threads {
                        let ch = tid % chn;
                        let c0 = nb0 + ch * 8; // output channel of the thread's chunk
                        if c0 >= cout {
                            continue;
                        }
                        for r in (tid / chn..tbm).step_by(threads / chn) {
                            let Some(m) = out_of(r) else { continue };
                            let s = r * ldf + ch * 8;
                            assert!(
                                s.is_multiple_of(4) && s + 8 <= stage.len(),
                                "{}: stage read {s}",
                                c.name
                            );
                            assert!(
                                (m * ldc + coff + c0).is_multiple_of(8),
                                "{}: unaligned 16-byte store",
                                c.name
                            );
                            for k in 0..8 {
                                let v = stage[s + k];
                                assert!(
                                    v.is_finite(),
                                    "{}: unstaged row {r} col {}",
                                    c.name,
                                    s + k
                                );
                                put(m, c0 + k, v);
                            }
                        }
                    }
                } else {
                    // halo_store: lane holds rows lane/4 (+8) and columns (lane % 4) * 2 (+1),
                    // each pair through conv_store (4-byte store where pair).
                    run.scalar_tiles += 1;
                    let pair = (ldc | coff) & 1 == 0 && cout & 1 == 0;
                    for warp in 0..wm_n * wn_n {
                        let (wm, wn) = (warp % wm_n, warp / wm_n);
                        for lane in 0..32 {
                            for i in 0..mi {
                                for h in 0..2 {
                                    let r = wm * tm + i * 16 + (lane >> 2) + h * 8;
                                    let Some(m) = out_of(r) else { continue };
                                    for jn in 0..ni {
                                        let cc = nb0 + wn * tn + jn * 8 + (lane & 3) * 2;
                                        if cc >= cout {
                                            continue;
                                        }
                                        let a = r * c.bn + cc - nb0;
                                        assert!(
                                            !pair || (m * ldc + coff + cc).is_multiple_of(2),
                                            "{}: unaligned pair store",
                                            c.name
                                        );
                                        put(m, cc, acc[a]);
                                        if cc + 1 < cout {
                                            put(m, cc + 1, acc[a + 1]);
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                t += grid;
                if c.hb == 2 {
                    if res {
                        buf ^= 1;
                    }
                } else if !v1 && t < ntiles {
                    load_halo(&mut sm, in_base, t, 0, 0, hv * cpv);
                }
            }
        }
    }
    (y, writes, run)
}

/// The conv_halo (HALO_ENTRY) configs whose fp32 stage tile (256 x (bn + 8) floats) fits their
/// smem, i.e. those that take the vector epilogue when Cout, ldc and coff are multiples of 8
/// (not c32n64: 73.7 KB of stage vs 58.2 KB; not c16n32: 41.0 vs 31.9 KB).
const HALO_VEC: &[&str] = &[
    cat::CONV_HALO_C32N32_W4.name,
    cat::CONV_HALO_C64N32.name,
    cat::CONV_HALO_C64N64.name,
    cat::CONV_HALO_C32N32.name,
    cat::CONV_HALO_C64N32_W4.name,
    cat::CONV_HALO_C16N16.name,
    cat::CONV_HALO_C16N16_W8.name,
    cat::CONV_HALO_C48N48.name,
];

/// One emulated launch: config, input d, h, w, begin pads, end pads, Cin, Cout, [ldc, coff],
/// sm_count.
type HaloCase = (
    HaloConfig,
    [usize; 3],
    [usize; 3],
    [usize; 3],
    usize,
    usize,
    [usize; 2],
    usize,
);

/// Every halo config's emulated launch equals the direct conv (small integers: exact in f64)
/// on shapes with partial tiles, asymmetric pads, odd Cout, batch 2, (persistent configs,
/// sm_count 1..2) several tiles per block, Cout > bn (grid.y tiles), channel slices
/// (ldc, coff) for both epilogues, the vector epilogue exactly where conv_halo takes it (also
/// on grid.y > 0 and on chunked Cin), for the staged ones chunked Cin 128 / 192 / 256 (the
/// two-buffer ones also as a persistent block, so the slab prefetch crosses tiles), and on the
/// `pad_cin` configs real Cin 14, 10, 6, 2 (plus a narrow Cin on the two-buffer staged kernels,
/// which only a forced launch would run: the slab prefetch in 4-byte copies).
#[test]
fn halo_index_emulation() {
    let mut rng = Rng::new(7);
    let mut rnd = || rng.below(5) as f64 - 2.0;
    let (mut chunked, mut padded, mut pad_configs, mut narrow_slabs) = (0, 0, 0, 0);
    let mut vec_configs: Vec<&str> = Vec::new();
    let mut vec_y_configs: Vec<&str> = Vec::new();
    for (ci, cfg) in HALO_CONFIGS.iter().enumerate() {
        let own = |cout: usize| [cout, 0];
        // Chunked Cin where the config takes it, else its width.
        let xc = [128, 192, 256][ci % 3];
        let xc = if cfg.accepts_cin(xc) { xc } else { cfg.cin };
        let cout3 = if ci % 2 == 0 { cfg.bn + 17 } else { cfg.bn - 5 };
        let (b1, b2) = (cfg.bn.min(33) - 1, if cfg.bn == 64 { 33 } else { 17 });
        let mut cases: Vec<HaloCase> = vec![
            (*cfg, [5, 9, 10], [1; 3], [1; 3], cfg.cin, b1, own(b1), 1),
            // Odd ldc / coff: conv_store's unpaired stores.
            (
                *cfg,
                [6, 7, 11],
                [2, 0, 1],
                [0, 1, 2],
                cfg.cin,
                b2,
                [b2 + 5, 3],
                2,
            ),
            // Chunked Cin with an odd Cout above bn (2 channel tiles) or below it.
            (
                *cfg,
                [4, 6, 9],
                [1, 0, 2],
                [0, 1, 1],
                xc,
                cout3,
                own(cout3),
                1,
            ),
            // Cout % 8 == 0 (conv_halo: the vector epilogue where it fits), 2 channel tiles.
            (
                *cfg,
                [5, 6, 9],
                [1, 1, 0],
                [1, 0, 2],
                xc,
                cfg.bn + 16,
                own(cfg.bn + 16),
                1,
            ),
            // ... into a channel slice at coff 16 of ldc Cout + 24 (vector).
            (
                *cfg,
                [4, 9, 8],
                [1; 3],
                [1; 3],
                cfg.cin,
                cfg.bn - 8,
                [cfg.bn + 16, 16],
                2,
            ),
            // ... at coff 2 (halo_store: coff not a multiple of 8).
            (
                *cfg,
                [4, 9, 8],
                [1; 3],
                [1; 3],
                cfg.cin,
                cfg.bn,
                [cfg.bn + 2, 2],
                1,
            ),
        ];
        if cfg.wst != 0 && cfg.hb == 2 {
            let pc = HaloConfig { persist: 1, ..*cfg };
            let co = cfg.bn + 17;
            cases.push((pc, [4, 6, 9], [1, 0, 2], [0, 1, 1], 128, co, own(co), 1));
            // Narrow Cin (not a planner choice here): the next tile's halo in 4-byte slabs.
            let pn = HaloConfig {
                pad_cin: true,
                ..pc
            };
            let rc = cfg.cin - 2;
            cases.push((pn, [4, 6, 9], [1, 0, 2], [0, 1, 1], rc, 40, own(40), 1));
        }
        if cfg.pad_cin {
            assert!(cfg.accepts_cin(14) && cfg.accepts_cin(6) && !cfg.accepts_cin(13));
            pad_configs += 1;
            let bn = cfg.bn;
            cases.extend([
                (*cfg, [5, 9, 10], [1; 3], [1; 3], 14, 14, own(14), 1),
                (*cfg, [7, 10, 9], [0, 2, 1], [2, 1, 0], 14, 5, own(5), 2),
                (*cfg, [4, 8, 17], [1; 3], [1; 3], 14, bn, own(bn), 1),
                (*cfg, [6, 7, 11], [2, 0, 1], [0, 1, 2], 6, 14, own(14), 2),
                (*cfg, [3, 9, 8], [1; 3], [0; 3], 2, 5, own(5), 1),
                // Padded Cin with Cout tiles and the vector epilogue, and into a slice.
                (
                    *cfg,
                    [5, 6, 9],
                    [1, 1, 0],
                    [1, 0, 2],
                    14,
                    bn + 16,
                    own(bn + 16),
                    1,
                ),
                (*cfg, [4, 9, 8], [1; 3], [1; 3], 10, 8, [24, 8], 2),
            ]);
        }
        for (c, inp, pb, pe, cin, cout, slice, smc) in cases {
            let c = &c;
            chunked += usize::from(cin > c.cin);
            padded += usize::from(cin < c.cin);
            let nb = 2;
            let st = c.stride;
            let out = [0, 1, 2].map(|i| (inp[i] + pb[i] + pe[i] - 3) / st + 1);
            let x: Vec<f64> = (0..nb * inp.iter().product::<usize>() * cin)
                .map(|_| rnd())
                .collect();
            let kpad = (27 * cin).div_ceil(32) * 32;
            let cout_pad = cout.div_ceil(128) * 128;
            let mut w = vec![0.0; cout_pad * kpad];
            for co in 0..cout {
                for k in 0..27 * cin {
                    w[co * kpad + k] = rnd();
                }
            }
            let (y, writes, run) = emulate_halo(
                c,
                HaloProblem {
                    x: &x,
                    inp: [nb, inp[0], inp[1], inp[2], cin],
                    w: &w,
                    kpad,
                    cout,
                    slice,
                    pads: pb,
                    out,
                    sm_count: smc,
                },
            );
            let [ldc, coff] = slice;
            for (i, &k) in writes.iter().enumerate() {
                let want = u32::from((coff..coff + cout).contains(&(i % ldc)));
                assert_eq!(
                    k, want,
                    "{}: writes of y[{i}] (ldc {ldc} coff {coff})",
                    c.name
                );
            }
            // The vector epilogue exactly where conv_halo takes it, for every tile.
            let vec = HALO_VEC.contains(&c.name) && (cout | ldc | coff).is_multiple_of(8);
            let tiles = c.tiles(nb, out) * c.cout_tiles(cout) as usize;
            assert_eq!(
                (run.vec_tiles, run.scalar_tiles),
                if vec { (tiles, 0) } else { (0, tiles) },
                "{}: Cout {cout} ldc {ldc} coff {coff}: epilogue",
                c.name
            );
            if run.vec_tiles > 0 && !vec_configs.contains(&c.name) {
                vec_configs.push(c.name);
            }
            if run.vec_tiles_y > 0 && !vec_y_configs.contains(&c.name) {
                vec_y_configs.push(c.name);
            }
            narrow_slabs += run.narrow_slab_copies;
            // Direct conv: y[n][o][co] = sum_tap,ci x[n][o + tap - pb][ci] * w[co][tap*cin + ci].
            let mut bad = 0;
            for n in 0..nb {
                for oz in 0..out[0] {
                    for oy in 0..out[1] {
                        for ox in 0..out[2] {
                            let m = ((n * out[0] + oz) * out[1] + oy) * out[2] + ox;
                            for co in 0..cout {
                                let mut s = 0.0;
                                for tap in 0..27 {
                                    let iz = (oz * st + tap / 9) as isize - pb[0] as isize;
                                    let iy = (oy * st + (tap / 3) % 3) as isize - pb[1] as isize;
                                    let ix = (ox * st + tap % 3) as isize - pb[2] as isize;
                                    if iz < 0
                                        || iy < 0
                                        || ix < 0
                                        || iz >= inp[0] as isize
                                        || iy >= inp[1] as isize
                                        || ix >= inp[2] as isize
                                    {
                                        continue;
                                    }
                                    let xo = (((n * inp[0] + iz as usize) * inp[1] + iy as usize)
                                        * inp[2]
                                        + ix as usize)
                                        * cin;
                                    for ci in 0..cin {
                                        s += x[xo + ci] * w[co * kpad + tap * cin + ci];
                                    }
                                }
                                if s != y[m * ldc + coff + co] {
                                    bad += 1;
                                }
                            }
                        }
                    }
                }
            }
            assert_eq!(
                bad, 0,
                "{}: {bad} outputs differ from the direct conv ({inp:?}, pads {pb:?}/{pe:?}, Cin {cin}, Cout {cout})",
                c.name
            );
            println!(
                "{}: {inp:?} pads {pb:?}/{pe:?} Cin {cin} Cout {cout} ldc {ldc} coff {coff}: {} tiles on {} x {} blocks ({} vec) ok",
                c.name,
                c.tiles(nb, out),
                c.grid(nb, out, smc),
                c.cout_tiles(cout),
                run.vec_tiles
            );
        }
    }
    // Every path ran: chunked Cin, padded Cin (4-byte copies, also in slab prefetches), and the
    // vector epilogue on each config that has it, also on grid.y > 0.
    // (Two chunked cases per staged config of width >= 32, with or without the experiments.)
    let staged = HALO_CONFIGS.iter().filter(|c| c.wst != 0 && c.cin >= 32);
    assert!(
        chunked >= 2 * staged.count(),
        "chunked-Cin cases: {chunked}"
    );
    assert!(
        pad_configs >= 5 && padded >= 7 * pad_configs + 2,
        "padded: {padded}"
    );
    assert!(narrow_slabs > 0, "narrow slab prefetch never ran");
    vec_configs.sort_unstable();
    vec_y_configs.sort_unstable();
    let mut want = HALO_VEC.to_vec();
    want.sort_unstable();
    assert_eq!(vec_configs, want, "configs that took the vector epilogue");
    assert_eq!(vec_y_configs, want, "vector epilogue with nb0 > 0");
}

/// The `UP_ENTRY(...)` lines of kernels/conv_mma.cu (`convt_up_*`) use the tile, warps and stages
/// of their `MMA_ENTRY` twin (plan::UPSAMPLE_VEC), so the twin's shared memory size is right.
#[test]
fn upsample_vec_entries_match_their_mma_twins() {
    use voxtile::internals::cuda::host::catalogue::UPSAMPLE_VEC;
    let src = Family::ConvMma.source();
    let args = |prefix: &str| -> Vec<Vec<String>> {
        src.lines()
            .filter_map(|l| {
                let rest = l.strip_prefix(prefix)?;
                Some(
                    rest.trim_end_matches(')')
                        .split(',')
                        .map(|a| a.trim().to_string())
                        .collect(),
                )
            })
            .collect()
    };
    let (mma, up) = (args("MMA_ENTRY("), args("UP_ENTRY("));
    assert_eq!(up.len(), UPSAMPLE_VEC.len(), "{up:?}");
    for (m, u) in UPSAMPLE_VEC {
        let ua = up.iter().find(|a| a[0] == *u).expect("UP_ENTRY line");
        let ma = mma.iter().find(|a| a[0] == *m).expect("MMA_ENTRY line");
        // MMA: NAME, TBM, TBN, WM, WN, ST, VW; UP: NAME, TBM, TBN, WM, WN, ST (VW 8).
        assert_eq!(ua[1..6], ma[1..6], "{u} vs {m}");
        assert_eq!(ma[6], "8", "{m}");
    }
}

/// CPU emulation of `CONV_C1_K3`'s index math (block decode, the halo rows, each lane's taps
/// and halo offsets, the m16n8k16 fragments of A (halo), B (weights) and C, the warps' 16-voxel
/// groups, the channel passes, output ldc/coff): every output element written exactly once and
/// equal to a direct float64 conv, for strides 1/2/mixed, pads, partial tiles, Cout 5..64.
#[test]
fn conv_c1_index_emulation() {
    const TZ: usize = 4;
    const TY: usize = 8;
    const TX: usize = 32;
    const GX: usize = TX / 16;
    const GROUPS: usize = TZ * TY * GX;
    #[allow(clippy::type_complexity)]
    let cases: [(usize, [usize; 3], [usize; 3], [usize; 6], usize, usize); 5] = [
        (32, [5, 9, 37], [1; 3], [1; 6], 32, 0),
        (20, [5, 17, 40], [2; 3], [1; 6], 37, 16),
        (64, [4, 9, 70], [2; 3], [2, 1, 0, 0, 1, 2], 64, 0),
        (5, [3, 5, 7], [2, 1, 2], [1, 0, 1, 1, 0, 1], 13, 8),
        (40, [9, 3, 33], [1, 2, 1], [0; 6], 40, 0),
    ];
    for (cout, di, st, pads, ldc, coff) in cases {
        let n_b = 2usize;
        let o: Vec<usize> = (0..3)
            .map(|a| (di[a] + pads[a] + pads[a + 3] - 3) / st[a] + 1)
            .collect();
        let x: Vec<f64> = (0..n_b * di.iter().product::<usize>())
            .map(|i| ((i * 7919) % 23) as f64 - 11.0)
            .collect();
        let kpad = 32;
        // Padding taps 27..31 hold a value the kernel must never use.
        let w: Vec<f64> = (0..cout * kpad)
            .map(|i| {
                if i % kpad >= 27 {
                    1e30
                } else {
                    ((i * 104729) % 17) as f64 - 8.0
                }
            })
            .collect();
        let nvox = n_b * o[0] * o[1] * o[2];
        let mut y = vec![f64::NAN; nvox * ldc];
        let mut hits = vec![0u32; nvox * ldc];
        let (nbx, nby, nbz) = (o[2].div_ceil(TX), o[1].div_ceil(TY), o[0].div_ceil(TZ));
        for blk in 0..n_b * nbz * nby * nbx {
            let mut b = blk;
            let bx = b % nbx;
            b /= nbx;
            let by = b % nby;
            b /= nby;
            let (bz, n) = (b % nbz, b / nbz);
            let (oz0, oy0, ox0) = (bz * TZ, by * TY, bx * TX);
            let hy = (TY - 1) * st[1] + 3;
            let hx = (TX - 1) * st[2] + 3;
            let hz = (TZ - 1) * st[0] + 3;
            assert!(hz * hy * hx <= 9 * 17 * 65);
            let iz0 = (oz0 * st[0]) as i64 - pads[0] as i64;
            let iy0 = (oy0 * st[1]) as i64 - pads[1] as i64;
            let ix0 = (ox0 * st[2]) as i64 - pads[2] as i64;
            let mut xs = vec![f64::NAN; hz * hy * hx];
            for tid in 0..256usize {
                let mut r = tid >> 6;
                while r < hz * hy {
                    let (lz, ly) = (r / hy, r % hy);
                    let (iz, iy) = (iz0 + lz as i64, iy0 + ly as i64);
                    let row = (0..di[0] as i64).contains(&iz) && (0..di[1] as i64).contains(&iy);
                    let mut lx = tid & 63;
                    while lx < hx {
                        let ix = ix0 + lx as i64;
                        xs[r * hx + lx] = if row && (0..di[2] as i64).contains(&ix) {
                            x[((n * di[0] + iz as usize) * di[1] + iy as usize) * di[2]
                                + ix as usize]
                        } else {
                            0.0
                        };
                        lx += 64;
                    }
                    r += 4;
                }
            }
            for lane in 0..32usize {
                let (q, r0) = (lane & 3, lane >> 2);
                // The lane's taps: index (s * 2 + h) * 2 + e.
                let tap = |i: usize| (i >> 2) * 16 + ((i >> 1) & 1) * 8 + q * 2 + (i & 1);
                let toff: Vec<Option<usize>> = (0..8)
                    .map(|i| {
                        let t = tap(i);
                        (t < 27).then(|| ((t / 9) * hy + (t / 3) % 3) * hx + t % 3)
                    })
                    .collect();
                let mut c0 = 0;
                while c0 < cout {
                    for warp in 0..8usize {
                        let mut g = warp;
                        while g < GROUPS {
                            let (gx, gy, gz) = (g % GX, (g / GX) % TY, g / (GX * TY));
                            let (oz, oy, oxg) = (oz0 + gz, oy0 + gy, ox0 + gx * 16);
                            g += 8;
                            if oz >= o[0] || oy >= o[1] || oxg >= o[2] {
                                continue;
                            }
                            let v0 = (gz * st[0] * hy + gy * st[1]) * hx + (gx * 16 + r0) * st[2];
                            let v = [v0, v0 + 8 * st[2]];
                            // C fragment: channels c0 + j * 8 + q * 2 + e of rows r0 + rr * 8,
                            // the sum over k of A[row][k] * B[k][col] as the fragments hold them:
                            // A[row][k] from the lane owning (row, k), B[k][col] from the lane
                            // owning (k, col).
                            for rr in 0..2 {
                                let ox = oxg + r0 + rr * 8;
                                if ox >= o[2] {
                                    continue;
                                }
                                let m = ((n * o[0] + oz) * o[1] + oy) * o[2] + ox;
                                for j in 0..4 {
                                    for e in 0..2 {
                                        let co = c0 + j * 8 + q * 2 + e;
                                        if co >= cout {
                                            continue;
                                        }
                                        let mut acc = 0.0;
                                        for k in 0..32usize {
                                            // A's owner: lane (row % 8) * 4 + (k % 8) / 2 holds it
                                            // at index (k / 16) * 4 + ((k / 8) % 2) * 2 + k % 2.
                                            let ql = (k % 8) / 2;
                                            let i = (k / 16) * 4 + ((k / 8) % 2) * 2 + k % 2;
                                            let t = (i >> 2) * 16
                                                + ((i >> 1) & 1) * 8
                                                + ql * 2
                                                + (i & 1);
                                            assert_eq!(t, k);
                                            let a = if t < 27 {
                                                let off = ((t / 9) * hy + (t / 3) % 3) * hx + t % 3;
                                                xs[v[rr] + off]
                                            } else {
                                                0.0
                                            };
                                            if ql == q {
                                                assert_eq!(toff[i].is_some(), t < 27);
                                            }
                                            // B's owner holds k rows q' * 2 + {0, 1} (+ 8, + 16):
                                            // zero for k >= 27 or a channel past Cout.
                                            let wv = if k < 27 && co < cout {
                                                w[co * kpad + k]
                                            } else {
                                                0.0
                                            };
                                            acc += a * wv;
                                        }
                                        y[m * ldc + coff + co] = acc;
                                        hits[m * ldc + coff + co] += 1;
                                    }
                                }
                            }
                        }
                    }
                    c0 += 32;
                }
            }
        }
        // The staged store (ldc, coff, Cout % 4 == 0): each (voxel, channel) of a group's pass
        // once, from the lanes' 4-channel pieces.
        if (ldc | coff | cout) % 4 == 0 {
            let mut hits4 = vec![0u32; nvox * ldc];
            for blk in 0..n_b * nbz * nby * nbx {
                let (bx, by, bz, n) = (
                    blk % nbx,
                    (blk / nbx) % nby,
                    (blk / nbx / nby) % nbz,
                    blk / nbx / nby / nbz,
                );
                for g in 0..GROUPS {
                    let (gx, gy, gz) = (g % GX, (g / GX) % TY, g / (GX * TY));
                    let (oz, oy, oxg) = (bz * TZ + gz, by * TY + gy, bx * TX + gx * 16);
                    if oz >= o[0] || oy >= o[1] || oxg >= o[2] {
                        continue;
                    }
                    let mrow = ((n * o[0] + oz) * o[1] + oy) * o[2];
                    let mut c0 = 0;
                    while c0 < cout {
                        let c4n = 32.min(cout - c0) / 4;
                        for lane in 0..32 {
                            let mut idx = lane;
                            while idx < 16 * c4n {
                                let (v, c4) = (idx / c4n, idx % c4n);
                                idx += 32;
                                if oxg + v >= o[2] {
                                    continue;
                                }
                                let dst = (mrow + oxg + v) * ldc + coff + c0 + c4 * 4;
                                for e in 0..4 {
                                    hits4[dst + e] += 1;
                                }
                            }
                        }
                        c0 += 32;
                    }
                }
            }
            for (i, h) in hits4.iter().enumerate() {
                let inside = (coff..coff + cout).contains(&(i % ldc));
                assert_eq!(
                    *h, inside as u32,
                    "staged store: element {i} written {h} times"
                );
            }
        }
        // Direct reference.
        for n in 0..n_b {
            for oz in 0..o[0] {
                for oy in 0..o[1] {
                    for ox in 0..o[2] {
                        let m = ((n * o[0] + oz) * o[1] + oy) * o[2] + ox;
                        for co in 0..cout {
                            let mut want = 0.0;
                            for tap in 0..27 {
                                let (kz, ky, kx) = (tap / 9, (tap / 3) % 3, tap % 3);
                                let iz = (oz * st[0] + kz) as i64 - pads[0] as i64;
                                let iy = (oy * st[1] + ky) as i64 - pads[1] as i64;
                                let ix = (ox * st[2] + kx) as i64 - pads[2] as i64;
                                if (0..di[0] as i64).contains(&iz)
                                    && (0..di[1] as i64).contains(&iy)
                                    && (0..di[2] as i64).contains(&ix)
                                {
                                    want += x[((n * di[0] + iz as usize) * di[1] + iy as usize)
                                        * di[2]
                                        + ix as usize]
                                        * w[co * kpad + tap];
                                }
                            }
                            let i = m * ldc + coff + co;
                            assert_eq!(hits[i], 1, "cout {cout} {di:?} m {m} co {co}");
                            assert_eq!(y[i], want, "cout {cout} {di:?} m {m} co {co}");
                        }
                    }
                }
            }
        }
        // Nothing outside [coff, coff + cout) of each row.
        for (i, h) in hits.iter().enumerate() {
            let c = i % ldc;
            if c < coff || c >= coff + cout {
                assert_eq!(*h, 0, "write outside the slice at channel {c}");
            }
        }
    }
}

/// CPU emulation of the `convt_up_*` staged epilogue's mapping: GEMM (row m = input voxel,
/// 8-column chunk c of tap * Cout + co) -> output voxel (the row's staged base plus the chunk's
/// staged tap offset) and channel; every output element of a
/// k^3 stride-k transposed conv gets exactly one chunk lane, at its (voxel, channel).
#[test]
fn convt_up_epilogue_index_emulation() {
    for (k, cout, di) in [
        (2usize, 32usize, [3usize, 5, 4]),
        (2, 8, [1, 1, 7]),
        (3, 16, [2, 3, 2]),
    ] {
        let n_b = 2;
        let od = [di[0] * k, di[1] * k, di[2] * k];
        let ncols = k * k * k * cout;
        let m_tot = n_b * di.iter().product::<usize>();
        let ovox = n_b * od.iter().product::<usize>();
        let mut hits = vec![0u32; ovox * cout];
        for m in 0..m_tot {
            for c in (0..ncols).step_by(8) {
                let (ix, t) = (m % di[2], m / di[2]);
                let (iy, t) = (t % di[1], t / di[1]);
                let (iz, n) = (t % di[0], t / di[0]);
                let (tap, co) = (c / cout, c % cout);
                let (qz, rem) = (tap / (k * k), tap % (k * k));
                let (qy, qx) = (rem / k, rem % k);
                // As the kernel stages them: the row's base (tap 0) and the chunk's tap offset.
                let rb = ((n * od[0] + iz * k) * od[1] + iy * k) * od[2] + ix * k;
                let off = (qz * od[1] + qy) * od[2] + qx;
                let o = rb + off;
                for q in 0..8 {
                    // The chunk's 8 columns are taps' channels co..co+8 of the same tap.
                    assert_eq!((c + q) / cout, tap);
                    hits[o * cout + co + q] += 1;
                }
                // Independent check: output voxel of (input voxel, tap) from coordinates.
                let (z, y, xx) = (iz * k + qz, iy * k + qy, ix * k + qx);
                assert_eq!(o, ((n * od[0] + z) * od[1] + y) * od[2] + xx);
            }
        }
        assert!(hits.iter().all(|&h| h == 1), "k {k} cout {cout}");
    }
}
