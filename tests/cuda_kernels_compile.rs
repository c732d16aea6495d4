//! Compiles every kernels/*.cu family with NVRTC (no GPU needed): any error or warning fails.
//! Skips with a message when libnvrtc cannot be loaded, unless VOXTILE_REQUIRE_NVRTC=1.
//! CI: LD_LIBRARY_PATH=<wheel>/nvidia/cu13/lib VOXTILE_CUDA_INCLUDE=<wheel>/nvidia/cu13/include.

use voxtile::backend::cuda::kernels;

#[test]
fn every_kernel_family_compiles_without_warnings() {
    let require = std::env::var("VOXTILE_REQUIRE_NVRTC")
        .map(|v| v == "1")
        .unwrap_or(false);
    if !kernels::nvrtc_present() {
        assert!(
            !require,
            "VOXTILE_REQUIRE_NVRTC=1 but libnvrtc could not be loaded (check LD_LIBRARY_PATH)"
        );
        println!("skipped: libnvrtc not found (set LD_LIBRARY_PATH to a CUDA 13.0 NVRTC)");
        return;
    }
    let (ma, mi) = kernels::nvrtc_version().expect("nvrtc version");
    println!(
        "NVRTC {ma}.{mi}, include dirs {:?}",
        kernels::include_dirs()
    );
    let mut failures = Vec::new();
    for arch in ["sm_90", "sm_80"] {
        for (name, src, entries) in kernels::FAMILIES {
            match kernels::compile_family(name, src, arch) {
                Ok(ptx) => {
                    for e in entries.iter() {
                        if !ptx.contains(&format!(".entry {e}(")) {
                            failures.push(format!(
                                "{name}.cu ({arch}): entry {e} missing from the PTX"
                            ));
                        }
                    }
                    println!("{name}.cu {arch}: {} bytes of PTX", ptx.len());
                }
                Err(e) => failures.push(e.to_string()),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "kernel build failures:\n{}",
        failures.join("\n")
    );
}

use voxtile::backend::cuda::plan::{halo_config, HaloConfig, HALO_CONFIGS};

/// The `HALO_ENTRY(...)` / `HALO2_ENTRY(...)` lines of kernels/conv.cu: name and numbers.
fn halo_entries() -> Vec<(String, Vec<usize>)> {
    let src = kernels::FAMILIES
        .iter()
        .find(|f| f.0 == "conv")
        .expect("conv family")
        .1;
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
    let listed = kernels::FAMILIES.iter().find(|f| f.0 == "conv").unwrap().2;
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
            vec![c.cin, c.bn, c.wm, wn, z, y, x, c.wst, c.hb]
        };
        assert_eq!(&want, a, "{name}: config vs kernel entry");
        assert!(
            listed.contains(&name.as_str()),
            "{name} not in kernels::FAMILIES"
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

/// Emulates one `conv_halo` / `conv_halo_t` launch on the CPU at the level of its index
/// arithmetic: tile decode, halo copy (zero fill outside the input), weight staging (resident
/// or ring), the per-lane ldmatrix addresses turned into mma fragments by the ldmatrix/mma
/// operand layouts, the tile loop of persistent blocks (program order: a buffer overwritten
/// before it is read shows up as a wrong value), the Cin chunks (Cin = k * c.cin: each chunk's
/// halo reloaded, or with two buffers prefetched in slabs during the previous chunk's taps),
/// the grid.y output-channel tiles and the epilogue's row/column mapping.
/// Returns y (NDHWC, Cout channels) and how often each output was written.
#[allow(clippy::too_many_arguments)]
fn emulate_halo(
    c: &HaloConfig,
    x: &[f64],
    inp: [usize; 5], // n, d, h, w, Cin
    w: &[f64],       // [cout_pad][kpad], K = tap * Cin + ci
    kpad: usize,
    cout: usize,
    pads: [usize; 3], // begin pads
    out: [usize; 3],
    sm_count: usize,
) -> (Vec<f64>, Vec<u32>) {
    let (cin, xc) = (c.cin, inp[4]); // smem chunk width, real Cin (the input's voxel stride)
    assert!(c.accepts_cin(xc), "{}: Cin {xc}", c.name);
    let (ld, cpv) = (cin + 8, cin / 8);
    let [tz, ty, tx] = c.tile;
    let (hy, hx) = (ty + 2, tx + 2);
    let hv = c.halo_rows();
    let res = c.wst == 0;
    let wld = if res { 27 * cin + 8 } else { ld };
    let ws_n = if res { 2 } else { c.wst };
    let wrows = if res { c.bn } else { c.wst * c.bn };
    // The original kernel puts the halo first, conv_halo_t the weights first.
    let v1 = halo_entries()
        .iter()
        .any(|(n, a)| n == c.name && a.len() == 4);
    let (w_base, in_base) = if v1 { (hv * ld, 0) } else { (0, wrows * wld) };
    let smem_len = c.smem_bytes() as usize / 2;
    let mut sm = vec![f64::NAN; smem_len];
    let threads = c.threads as usize;
    let (wm_n, wn_n) = (c.wm, threads / 32 / c.wm);
    let (tm, tn) = (c.tile.iter().product::<usize>() / wm_n, c.bn / wn_n);
    let (mi, ni) = (tm / 16, tn / 8);
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
    let mut y = vec![0.0; n_b * out.iter().product::<usize>() * cout];
    let mut writes = vec![0u32; y.len()];
    let decode = |t: usize| {
        let ox0 = (t % ntx) * tx;
        let t = t / ntx;
        let oy0 = (t % nty) * ty;
        let t = t / nty;
        ((t / ntz), (t % ntz) * tz, oy0, ox0)
    };
    let copy16 = |sm: &mut Vec<f64>, dst: usize, src: Option<&[f64]>| {
        assert!(
            dst.is_multiple_of(8) && dst + 8 <= smem_len,
            "{}: smem write {dst}",
            c.name
        );
        for e in 0..8 {
            sm[dst + e] = src.map_or(0.0, |s| s[e]);
        }
    };
    // Pieces lo..end (of hv * cpv) of tile t's halo of channels c0..c0 + cin.
    let load_halo = |sm: &mut Vec<f64>, buf: usize, t: usize, c0: usize, lo: usize, end: usize| {
        let (n, oz0, oy0, ox0) = decode(t);
        let (iz0, iy0, ix0) = (
            oz0 as isize - pads[0] as isize,
            oy0 as isize - pads[1] as isize,
            ox0 as isize - pads[2] as isize,
        );
        for idx in lo..end.min(hv * cpv) {
            let (v, ch) = (idx / cpv, idx % cpv);
            let (hz, r) = (v / (hy * hx), v % (hy * hx));
            let (yy, xx) = (r / hx, r % hx);
            let (iz, iy, ix) = (iz0 + hz as isize, iy0 + yy as isize, ix0 + xx as isize);
            let ok = (0..di as isize).contains(&iz)
                && (0..hi as isize).contains(&iy)
                && (0..wi as isize).contains(&ix);
            let src = ok.then(|| {
                let o = ((((n * di) as isize + iz) * hi as isize + iy) * wi as isize + ix) as usize
                    * xc
                    + c0
                    + ch * 8;
                &x[o..o + 8]
            });
            copy16(sm, buf + v * ld + ch * 8, src);
        }
    };
    let load_w = |sm: &mut Vec<f64>, stage: usize, tap: usize, c0: usize, nb0: usize| {
        for idx in 0..c.bn * cpv {
            let (co, ch) = (idx / cpv, idx % cpv);
            let o = (nb0 + co) * kpad + tap * xc + c0 + ch * 8;
            copy16(
                sm,
                w_base + stage * c.bn * ld + co * ld + ch * 8,
                Some(&w[o..o + 8]),
            );
        }
    };
    for yb in 0..ny {
        let nb0 = yb * c.bn; // blockIdx.y: output-channel tile
        for b in 0..grid {
            if res {
                for idx in 0..c.bn * 27 * cpv {
                    let (co, ch) = (idx / (27 * cpv), idx % (27 * cpv));
                    let o = (nb0 + co) * kpad + ch * 8;
                    copy16(&mut sm, w_base + co * wld + ch * 8, Some(&w[o..o + 8]));
                }
            }
            let mut t = b;
            if t < ntiles {
                load_halo(&mut sm, in_base, t, 0, 0, hv * cpv);
            }
            let mut buf = 0;
            while t < ntiles {
                // acc[row of the block tile][column]
                let tbm = tm * wm_n;
                let mut acc = vec![0.0f64; tbm * c.bn];
                for c0 in (0..xc).step_by(cin) {
                    let hin = in_base + buf * hv * ld;
                    if c.hb == 1 && c0 > 0 {
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
                    for tap in 0..27 {
                        if !res && tap + ws_n - 1 < 27 {
                            load_w(&mut sm, (tap + ws_n - 1) % ws_n, tap + ws_n - 1, c0, nb0);
                        }
                        if pre {
                            let hi = if tap == 26 {
                                hv * cpv
                            } else {
                                (tap + 1) * threads
                            };
                            load_halo(
                                &mut sm,
                                in_base + (buf ^ 1) * hv * ld,
                                pt,
                                pc,
                                tap * threads,
                                hi,
                            );
                        }
                        let (dz, dy, dx) = (tap / 9, (tap / 3) % 3, tap % 3);
                        let toff = (dz * hy + dy) * hx + dx;
                        for warp in 0..wm_n * wn_n {
                            let (wm, wn) = (warp % wm_n, warp / wm_n);
                            for kk in (0..cin).step_by(16) {
                                // Per-lane ldmatrix addresses, as the kernel computes them.
                                let a_addr = |i: usize, lane: usize| {
                                    let r = wm * tm + i * 16 + (lane & 15);
                                    let (z, yy, xx) = (r / (ty * tx), (r / tx) % ty, r % tx);
                                    let hrow = (z * hy + yy) * hx + xx;
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
                                        let bm: Vec<Vec<f64>> =
                                            (0..32).map(|l| rd(b_addr(jn / 2, l))).collect();
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
                    if !res && c.hb == 2 {
                        buf ^= 1;
                    }
                }
                // Epilogue: lane holds rows lane/4 (+8) and columns (lane % 4) * 2 (+1).
                let (n, oz0, oy0, ox0) = decode(t);
                for warp in 0..wm_n * wn_n {
                    let (wm, wn) = (warp % wm_n, warp / wm_n);
                    for lane in 0..32 {
                        for i in 0..mi {
                            for h in 0..2 {
                                let r = wm * tm + i * 16 + (lane >> 2) + h * 8;
                                let (oz, oy, ox) =
                                    (oz0 + r / (ty * tx), oy0 + (r / tx) % ty, ox0 + r % tx);
                                if oz >= out[0] || oy >= out[1] || ox >= out[2] {
                                    continue;
                                }
                                let m = ((n * out[0] + oz) * out[1] + oy) * out[2] + ox;
                                for jn in 0..ni {
                                    let col = wn * tn + jn * 8 + (lane & 3) * 2;
                                    for cc in [col, col + 1] {
                                        let co = nb0 + cc;
                                        if co < cout {
                                            y[m * cout + co] = acc[r * c.bn + cc];
                                            writes[m * cout + co] += 1;
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
                } else if t < ntiles {
                    load_halo(&mut sm, in_base, t, 0, 0, hv * cpv);
                }
            }
        }
    }
    (y, writes)
}

/// Every halo config's emulated launch equals the direct conv (small integers: exact in f64)
/// on shapes with partial tiles, asymmetric pads, odd Cout, batch 2, (persistent configs,
/// sm_count 1..2) several tiles per block, Cout > bn (grid.y tiles) and, for the staged ones,
/// chunked Cin 128 / 192 / 256 (the two-buffer ones also as a persistent block, so the slab
/// prefetch crosses tiles).
#[test]
fn halo_index_emulation() {
    let mut seed = 7u64;
    let mut rnd = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 33) % 5) as f64 - 2.0
    };
    let mut chunked = 0;
    for (ci, c0) in HALO_CONFIGS.iter().enumerate() {
        // (config, input d, h, w, begin pads, end pads, Cin, Cout, sm_count)
        #[allow(clippy::type_complexity)]
        let mut cases: Vec<(
            HaloConfig,
            [usize; 3],
            [usize; 3],
            [usize; 3],
            usize,
            usize,
            usize,
        )> = vec![
            (
                *c0,
                [5, 9, 10],
                [1, 1, 1],
                [1, 1, 1],
                c0.cin,
                c0.bn.min(33) - 1,
                1,
            ),
            (
                *c0,
                [6, 7, 11],
                [2, 0, 1],
                [0, 1, 2],
                c0.cin,
                if c0.bn == 64 { 33 } else { 17 },
                2,
            ),
        ];
        // Chunked Cin (staged only) with an odd Cout above bn (2 channel tiles) or below it.
        let xc = if c0.wst == 0 {
            c0.cin
        } else {
            [128, 192, 256][ci % 3]
        };
        let cout = if ci % 2 == 0 { c0.bn + 17 } else { c0.bn - 5 };
        cases.push((*c0, [4, 6, 9], [1, 0, 2], [0, 1, 1], xc, cout, 1));
        if c0.wst != 0 && c0.hb == 2 {
            let pc = HaloConfig { persist: 1, ..*c0 };
            cases.push((pc, [4, 6, 9], [1, 0, 2], [0, 1, 1], 128, c0.bn + 17, 1));
        }
        for (c, inp, pb, pe, cin, cout, smc) in cases {
            let c = &c;
            chunked += usize::from(cin > c.cin);
            let nb = 2;
            let out = [0, 1, 2].map(|i| inp[i] + pb[i] + pe[i] - 2);
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
            let (y, writes) = emulate_halo(
                c,
                &x,
                [nb, inp[0], inp[1], inp[2], cin],
                &w,
                kpad,
                cout,
                pb,
                out,
                smc,
            );
            assert!(
                writes.iter().all(|&n| n == 1),
                "{}: every output written once",
                c.name
            );
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
                                    let iz = (oz + tap / 9) as isize - pb[0] as isize;
                                    let iy = (oy + (tap / 3) % 3) as isize - pb[1] as isize;
                                    let ix = (ox + tap % 3) as isize - pb[2] as isize;
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
                                if s != y[m * cout + co] {
                                    bad += 1;
                                }
                            }
                        }
                    }
                }
            }
            assert_eq!(
                bad, 0,
                "{}: {bad} outputs differ from the direct conv ({inp:?}, pads {pb:?}/{pe:?})",
                c.name
            );
            println!(
                "{}: {inp:?} pads {pb:?}/{pe:?} Cin {cin} Cout {cout}: {} tiles on {} x {} blocks ok",
                c.name,
                c.tiles(nb, out),
                c.grid(nb, out, smc),
                c.cout_tiles(cout)
            );
        }
    }
    assert!(chunked >= 10, "chunked-Cin cases: {chunked}");
}

/// The `UP_ENTRY(...)` lines of kernels/conv.cu (`convt_up_*`) use the tile, warps and stages
/// of their `MMA_ENTRY` twin (plan::UPSAMPLE_VEC), so the twin's shared memory size is right.
#[test]
fn upsample_vec_entries_match_their_mma_twins() {
    use voxtile::backend::cuda::plan::UPSAMPLE_VEC;
    let src = kernels::FAMILIES
        .iter()
        .find(|f| f.0 == "conv")
        .expect("conv family")
        .1;
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

/// CPU emulation of `conv_c1_k3`'s index math (block decode, halo load, the thread's two
/// voxels, weight offsets, output ldc/coff): every output element written exactly once and
/// equal to a direct float64 conv, for strides 1/2/mixed, pads, partial tiles, Cout 5..64.
#[test]
fn conv_c1_index_emulation() {
    const TZ: usize = 2;
    const TY: usize = 8;
    const TX: usize = 32;
    #[allow(clippy::type_complexity)]
    let cases: [(usize, [usize; 3], [usize; 3], [usize; 6], usize, usize); 5] = [
        (32, [5, 9, 37], [1; 3], [1; 6], 32, 0),
        (20, [5, 17, 40], [2; 3], [1; 6], 37, 16),
        (64, [4, 9, 70], [2; 3], [2, 1, 0, 0, 1, 2], 64, 0),
        (5, [3, 5, 7], [2, 1, 2], [1, 0, 1, 1, 0, 1], 13, 8),
        (24, [6, 3, 33], [1, 2, 1], [0; 6], 24, 0),
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
        let w: Vec<f64> = (0..cout * kpad)
            .map(|i| ((i * 104729) % 17) as f64 - 8.0)
            .collect();
        let nvox = n_b * o[0] * o[1] * o[2];
        let mut y = vec![f64::NAN; nvox * ldc];
        let mut hits = vec![0u32; nvox * ldc];
        let cg_n = cout.div_ceil(8);
        let cpad = cg_n * 8;
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
            assert!(hz * hy * hx <= 5 * 17 * 65);
            let iz0 = (oz0 * st[0]) as i64 - pads[0] as i64;
            let iy0 = (oy0 * st[1]) as i64 - pads[1] as i64;
            let ix0 = (ox0 * st[2]) as i64 - pads[2] as i64;
            let mut xs = vec![0.0; hz * hy * hx];
            for (i, v) in xs.iter_mut().enumerate() {
                let (lx, t) = (i % hx, i / hx);
                let (ly, lz) = (t % hy, t / hy);
                let (iz, iy, ix) = (iz0 + lz as i64, iy0 + ly as i64, ix0 + lx as i64);
                if (0..di[0] as i64).contains(&iz)
                    && (0..di[1] as i64).contains(&iy)
                    && (0..di[2] as i64).contains(&ix)
                {
                    *v = x[((n * di[0] + iz as usize) * di[1] + iy as usize) * di[2] + ix as usize];
                }
            }
            let ws: Vec<f64> = (0..27 * cpad)
                .map(|i| {
                    let (tap, co) = (i / cpad, i % cpad);
                    if co < cout {
                        w[co * kpad + tap]
                    } else {
                        0.0
                    }
                })
                .collect();
            let zstep = st[0] * hy * hx;
            for it in 0..256 * cg_n {
                let (cg, pv) = (it % cg_n, it / cg_n);
                let (ly, lx) = (pv / TX, pv % TX);
                let (oy, ox) = (oy0 + ly, ox0 + lx);
                if oy >= o[1] || ox >= o[2] {
                    continue;
                }
                let mut a = [[0.0f64; 8]; 2];
                let xb = ly * st[1] * hx + lx * st[2];
                for tap in 0..27 {
                    let (kz, ky, kx) = (tap / 9, (tap / 3) % 3, tap % 3);
                    let xp = xb + (kz * hy + ky) * hx + kx;
                    for q in 0..8 {
                        let wv = ws[tap * cpad + cg * 8 + q];
                        a[0][q] += xs[xp] * wv;
                        a[1][q] += xs[xp + zstep] * wv;
                    }
                }
                let co = cg * 8;
                for (s, acc) in a.iter().enumerate() {
                    let oz = oz0 + s;
                    if oz >= o[0] {
                        continue;
                    }
                    let m = ((n * o[0] + oz) * o[1] + oy) * o[2] + ox;
                    for (q, v) in acc.iter().enumerate() {
                        if co + q < cout {
                            y[m * ldc + coff + co + q] = *v;
                            hits[m * ldc + coff + co + q] += 1;
                        }
                    }
                }
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
/// 8-column chunk c of tap * Cout + co) -> output voxel and channel; every output element of a
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
                let o = ((n * od[0] + iz * k + qz) * od[1] + iy * k + qy) * od[2] + ix * k + qx;
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
