//! CPU emulation of the shifted affine passes' index math (kernels/norm.cu), no GPU: the runs
//! kernel (`affine_act_v8_shifted_runs`, a thread's unit one channel group of `NORM_RUN` voxels
//! along x, its tile and pairs taken once, at the run's first voxel) against the kernel by
//! voxels (`affine_act_v8_shifted`, each 16-byte vector its own tile). Where
//! `ShiftedOut::runs_fit` holds, the runs store every output vector once, reading the same
//! input offset and the same tile's shifts as the kernel by voxels; where it does not, some run
//! would cross a tile (so the plan must not pick the runs there).

use voxtile::internals::cuda::abi::NORM_RUN;
use voxtile::internals::cuda::host::launch::ShiftedOut;

/// The tile (index in `tile_origin`'s order) of voxel `vox` of a D x `h` x `w` output, as both
/// kernels compute it.
fn tile_of(vox: usize, h: usize, w: usize, tile: [usize; 3]) -> usize {
    let (ntx, nty) = (w.div_ceil(tile[2]), h.div_ceil(tile[1]));
    let (xw, r) = (vox % w, vox / w);
    let (yh, z) = (r % h, r / h);
    ((z / tile[0]) * nty + yh / tile[1]) * ntx + xw / tile[2]
}

/// One sample's (output vector, input offset, tile) triples as the runs kernel's threads visit
/// them, over the grid the host asks (ops/norm.rs: a thread a unit, at most 16 blocks an SM
/// over the launch's samples, 256 threads).
fn runs_visits(
    sp: [usize; 3],
    c: usize,
    xs: usize,
    tile: [usize; 3],
) -> Vec<(usize, usize, usize)> {
    let [d, h, w] = sp;
    let (vpp, p) = (c / 8, d * h * w);
    let units = p / NORM_RUN * vpp;
    let grid = units.div_ceil(256).clamp(1, 132 * 16);
    let mut seen = Vec::new();
    for t in 0..grid * 256 {
        let mut u = t;
        while u < units {
            let (run, g) = (u / vpp, u % vpp);
            let (c0, vox0) = (g * 8, run * NORM_RUN);
            let tl = tile_of(vox0, h, w, tile);
            for i in 0..NORM_RUN {
                seen.push(((vox0 + i) * vpp + g, (vox0 + i) * xs + c0, tl));
            }
            u += grid * 256;
        }
    }
    seen
}

#[test]
fn runs_match_the_pass_by_voxels_where_they_fit() {
    // (spatial, C, wide, tile): the z-pair tile [16, 16, 8] and the Cin-1 tile [4, 8, 32],
    // partial tiles on every axis, a split conv's wide store (xs = 2C).
    let cases = [
        ([21, 19, 20], 32, false, [16, 16, 8]),
        ([18, 35, 36], 16, false, [16, 16, 8]),
        ([34, 33, 24], 16, true, [16, 16, 8]),
        ([21, 19, 36], 32, false, [4, 8, 32]),
        ([9, 35, 20], 16, false, [4, 8, 32]),
        ([8, 16, 128], 32, false, [16, 16, 8]),
    ];
    for (sp, c, wide, tile) in cases {
        assert!(ShiftedOut::runs_fit(tile, sp[2]), "{sp:?} {tile:?}");
        let xs = if wide { 2 * c } else { c };
        let (vpp, p) = (c / 8, sp.iter().product::<usize>());
        let mut by_vector = vec![None; p * vpp];
        for (e, at, tl) in runs_visits(sp, c, xs, tile) {
            assert!(by_vector[e].is_none(), "{sp:?}: vector {e} stored twice");
            by_vector[e] = Some((at, tl));
        }
        for (e, got) in by_vector.iter().enumerate() {
            // The pass by voxels: vector e is voxel e / vpp, channels (e % vpp) * 8.
            let (vox, c0) = (e / vpp, (e % vpp) * 8);
            let want = (vox * xs + c0, tile_of(vox, sp[1], sp[2], tile));
            assert_eq!(*got, Some(want), "{sp:?} C {c} {tile:?}: vector {e}");
        }
    }
}

#[test]
fn runs_would_cross_tiles_where_they_do_not_fit() {
    // A width that is not a multiple of the run: some run holds voxels of two tiles (or two
    // rows), so its one tile is wrong for some voxel.
    for (sp, tile) in [([5, 6, 18], [16, 16, 8]), ([5, 6, 32], [16, 16, 6])] {
        assert!(!ShiftedOut::runs_fit(tile, sp[2]));
        let (h, w) = (sp[1], sp[2]);
        let p = sp.iter().product::<usize>();
        let crosses = (0..p / NORM_RUN).any(|run| {
            let vox0 = run * NORM_RUN;
            (1..NORM_RUN).any(|i| tile_of(vox0 + i, h, w, tile) != tile_of(vox0, h, w, tile))
        });
        assert!(crosses, "{sp:?} {tile:?}: no run crosses a tile");
    }
}
