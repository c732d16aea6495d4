//! Pools and Resize on CUDA.

use super::*;

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
