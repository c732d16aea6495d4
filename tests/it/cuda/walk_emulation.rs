//! CPU emulation of the copy walks of the wgmma halo convs (kernels/mma.cuh `BoxWalk`, and
//! `WgConv::load_halo` / `load_w` of kernels/conv_wgmma.cu), no GPU: each thread's piece is
//! fixed and its voxels (or weight rows) are stepped, with coordinates and source offset carried
//! instead of divided out of every copy's index. The walk must visit what the division gives,
//! and the copies must fill the halo and weight stages exactly as the per-index formulas do.

/// `BoxWalk<HY, HX, VS>` line for line (mma.cuh); `kernels_compile`'s halo emulation walks
/// `conv_halo`'s copies with it.
pub(super) struct BoxWalk {
    hy: i64,
    hx: i64,
    sz: i64,
    sy: i64,
    sx: i64,
    pub z: i64,
    pub y: i64,
    pub x: i64,
    pub off: i64,
    d: i64,
    wx: i64,
    wy: i64,
}

impl BoxWalk {
    pub fn new(hy: i64, hx: i64, vs: i64, v0: i64, ex: i64, ey: i64, ez: i64) -> Self {
        let hp = hy * hx;
        let (sz, sy, sx) = (vs / hp, vs % hp / hx, vs % hx);
        let z = v0 / hp;
        let r = v0 - z * hp;
        let y = r / hx;
        let x = r - y * hx;
        BoxWalk {
            hy,
            hx,
            sz,
            sy,
            sx,
            z,
            y,
            x,
            off: x * ex + y * ey + z * ez,
            d: sx * ex + sy * ey + sz * ez,
            wx: (if hy > 1 { ey } else { ez }) - hx * ex,
            wy: ez - hy * ey,
        }
    }

    pub fn step(&mut self) {
        self.z += self.sz;
        self.off += self.d;
        if self.sx == 0 && self.sy == 0 {
            return;
        }
        self.x += self.sx;
        self.y += self.sy;
        if self.x >= self.hx {
            self.x -= self.hx;
            if self.hy > 1 {
                self.y += 1;
            } else {
                self.z += 1;
            }
            self.off += self.wx;
        }
        if self.hy > 1 && self.y >= self.hy {
            self.y -= self.hy;
            self.z += 1;
            self.off += self.wy;
        }
    }
}

#[test]
fn box_walks_visit_what_the_division_gives() {
    let (ex, ey, ez) = (3i64, 37, 1009);
    // (HY, HX, VS): the halo boxes of the 8x8 faces (10 x 10 planes) at the steps NT / pieces
    // takes (16, 32, 64, 128 > a plane, 256), and weight rows (HY 1) of BN 16/32/64.
    let cases = [
        (10, 10, 16),
        (10, 10, 32),
        (10, 10, 64),
        (10, 10, 128),
        (10, 10, 256),
        (6, 18, 16),
        (1, 16, 8),
        (1, 16, 16),
        (1, 16, 64),
        (1, 32, 16),
        (1, 64, 16),
        (1, 64, 128),
    ];
    for (hy, hx, vs) in cases {
        for v0 in 0..vs {
            let mut b = BoxWalk::new(hy, hx, vs, v0, ex, ey, ez);
            let mut v = v0;
            while v < 40 * hy * hx {
                let (z, y, x) = (v / (hy * hx), v % (hy * hx) / hx, v % hx);
                assert_eq!((b.z, b.y, b.x), (z, y, x), "HY {hy} HX {hx} VS {vs} v {v}");
                assert_eq!(
                    b.off,
                    x * ex + y * ey + z * ez,
                    "HY {hy} HX {hx} VS {vs} v {v}"
                );
                v += vs;
                b.step();
            }
        }
    }
}

/// One conv_wg launch's shape: per-sample input dims, Cin, begin pads, the kernel's CIN width,
/// its tile depth TZ, threads NT, Cout tile BN and Cout.
struct Shape {
    n: i64,
    di: [i64; 3],
    cin: i64,
    pads: [i64; 3],
    width: i64,
    tz: i64,
    nt: i64,
    bn: i64,
    cout: i64,
}

/// A [`Shape`] as one row: (n, di, Cin, pads, CIN, TZ, NT, BN, Cout).
type ShapeRow = (i64, [i64; 3], i64, [i64; 3], i64, i64, i64, i64, i64);

impl From<ShapeRow> for Shape {
    fn from((n, di, cin, pads, width, tz, nt, bn, cout): ShapeRow) -> Self {
        Shape {
            n,
            di,
            cin,
            pads,
            width,
            tz,
            nt,
            bn,
            cout,
        }
    }
}

/// Halves a copy moves: 2 (4-byte channel pairs) when the real Cin is below the kernel's width,
/// else 8 (16-byte groups), as `load_halo` / `load_w` choose.
fn piece_halves(s: &Shape) -> i64 {
    if s.cin < s.width {
        2
    } else {
        8
    }
}

/// The input's value at (n, z, y, x, c): distinct and non-zero, so a misplaced or missed copy shows.
fn xval(s: &Shape, n: i64, z: i64, y: i64, x: i64, c: i64) -> i64 {
    1 + ((((n * s.di[0] + z) * s.di[1] + y) * s.di[2] + x) * s.cin + c)
}

/// `load_halo` as the kernel walks it: the halo buffer ([CIN/8][HV][8] halves) of tile origin
/// (n, o) and channels c0.., each slot's source value (0 for a zero fill), and a count of writes.
fn halo_walked(s: &Shape, n: i64, o: [i64; 3], c0: i64) -> (Vec<i64>, Vec<u32>) {
    let (hy, hx) = (10i64, 10i64);
    let hv = (s.tz + 2) * hy * hx;
    let cpv = s.width / 8;
    let (ex, ey) = (s.cin, s.di[2] * s.cin);
    let ez = s.di[1] * ey;
    let i0 = [o[0] - s.pads[0], o[1] - s.pads[1], o[2] - s.pads[2]];
    let o0 = n * s.di[0] * ez + i0[0] * ez + i0[1] * ey + i0[2] * ex + c0;
    let mut buf = vec![0i64; (cpv * hv * 8) as usize];
    let mut writes = vec![0u32; buf.len()];
    let inside = |b: &BoxWalk| {
        (0..s.di[0]).contains(&(i0[0] + b.z))
            && (0..s.di[1]).contains(&(i0[1] + b.y))
            && (0..s.di[2]).contains(&(i0[2] + b.x))
    };
    // The flat tensor's value at element offset e (NDHWC).
    let at = |e: i64| 1 + e;
    // `halo_pieces<NT, U>`: U 2 (narrow: 4-byte pairs) or 8 (16-byte groups).
    let u = piece_halves(s);
    let pieces = s.width / u;
    assert_eq!(s.nt % pieces, 0);
    for tid in 0..s.nt {
        let vs = s.nt / pieces;
        let c = (tid % pieces) * u;
        let mut b = BoxWalk::new(hy, hx, vs, tid / pieces, ex, ey, ez);
        let mut v = tid / pieces;
        while v < hv {
            let ok = (u == 8 || c < s.cin) && inside(&b);
            let dst = ((c >> 3) * hv + v) * 8 + (c & 7);
            for k in 0..u {
                buf[(dst + k) as usize] = if ok { at(o0 + b.off + c + k) } else { 0 };
                writes[(dst + k) as usize] += 1;
            }
            v += vs;
            b.step();
        }
    }
    (buf, writes)
}

#[test]
fn halo_copies_fill_what_the_indices_name() {
    // (n, di, Cin, pads, CIN, TZ, NT, BN, Cout)
    let shapes = [
        // W2's 14 -> 14 (narrow 4-byte pairs), a short last tile in every axis.
        (2, [6, 11, 9], 14, [1, 1, 1], 16, 4, 128, 16, 14),
        // Wide, one chunk and two (c0 16), 256 threads (the persistent kernel's weights).
        (1, [5, 9, 12], 32, [1, 1, 1], 16, 4, 256, 16, 16),
        (1, [9, 8, 8], 64, [1, 2, 0], 64, 8, 128, 64, 40),
        (2, [4, 10, 10], 32, [1, 1, 1], 32, 4, 128, 32, 32),
    ]
    .map(Shape::from);
    for s in &shapes {
        let tiles = [
            (s.di[0] + s.tz - 1) / s.tz,
            (s.di[1] + 7) / 8,
            (s.di[2] + 7) / 8,
        ];
        let hv = (s.tz + 2) * 100;
        for n in 0..s.n {
            for tz in 0..tiles[0] {
                for ty in 0..tiles[1] {
                    for tx in 0..tiles[2] {
                        let o = [tz * s.tz, ty * 8, tx * 8];
                        for c0 in (0..s.cin).step_by(s.width as usize) {
                            let (buf, writes) = halo_walked(s, n, o, c0);
                            assert!(writes.iter().all(|&w| w == 1), "every slot written once");
                            for v in 0..hv {
                                let (hz, hy, hx) = (v / 100, v % 100 / 10, v % 10);
                                let i = [
                                    o[0] - s.pads[0] + hz,
                                    o[1] - s.pads[1] + hy,
                                    o[2] - s.pads[2] + hx,
                                ];
                                let inside = (0..3).all(|a| (0..s.di[a]).contains(&i[a]));
                                for c in 0..s.width {
                                    let want = if inside && c0 + c < s.cin {
                                        xval(s, n, i[0], i[1], i[2], c0 + c)
                                    } else {
                                        0
                                    };
                                    let got = buf[(((c / 8) * hv + v) * 8 + c % 8) as usize];
                                    assert_eq!(
                                        got, want,
                                        "tile {o:?} c0 {c0} voxel {v} channel {c}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn weight_copies_fill_what_the_indices_name() {
    // (n, di, Cin, pads, CIN, TZ, NT, BN, Cout)
    let shapes = [
        (1, [1, 1, 1], 14, [0; 3], 16, 4, 128, 16, 14),
        (1, [1, 1, 1], 32, [0; 3], 16, 4, 256, 16, 16),
        (1, [1, 1, 1], 64, [0; 3], 64, 4, 128, 64, 100),
        (1, [1, 1, 1], 32, [0; 3], 32, 4, 128, 32, 30),
    ]
    .map(Shape::from);
    for s in &shapes {
        // Weights [Cout_pad][kpad], K = tap * Cin + ci; value 1 + flat index.
        let kpad = (27 * s.cin + 63) / 64 * 64;
        let cpv = s.width / 8;
        let u = piece_halves(s);
        let pieces = s.width / u;
        let ntiles_n = (s.cout + s.bn - 1) / s.bn;
        for nb in 0..ntiles_n {
            let nb0 = nb * s.bn;
            for c0 in (0..s.cin).step_by(s.width as usize) {
                // Resident (27 taps from 0) and a ring stage (one tap from 5).
                for (tap0, ntaps) in [(0i64, 27i64), (5, 1)] {
                    let mut st = vec![0i64; (ntaps * cpv * s.bn * 8) as usize];
                    let mut writes = vec![0u32; st.len()];
                    let w0 = nb0 * kpad + tap0 * s.cin + c0;
                    for tid in 0..s.nt {
                        let mut b =
                            BoxWalk::new(1, s.bn, s.nt / pieces, tid / pieces, kpad, s.cin, s.cin);
                        while b.z < ntaps {
                            let c = (tid % pieces) * u;
                            let ok = nb0 + b.x < s.cout && (u == 8 || c < s.cin);
                            let dst = ((b.z * cpv + (c >> 3)) * s.bn + b.x) * 8 + (c & 7);
                            for k in 0..u {
                                st[(dst + k) as usize] =
                                    if ok { 1 + w0 + b.off + c + k } else { 0 };
                                writes[(dst + k) as usize] += 1;
                            }
                            b.step();
                        }
                    }
                    assert!(
                        writes.iter().all(|&w| w == 1),
                        "every weight slot written once"
                    );
                    for t in 0..ntaps {
                        for g in 0..cpv {
                            for co in 0..s.bn {
                                for k in 0..8 {
                                    let ci = c0 + g * 8 + k;
                                    let want = if nb0 + co < s.cout && ci < s.cin {
                                        1 + (nb0 + co) * kpad + (tap0 + t) * s.cin + ci
                                    } else {
                                        0
                                    };
                                    let got = st[(((t * cpv + g) * s.bn + co) * 8 + k) as usize];
                                    assert_eq!(
                                        got, want,
                                        "stage tap {t} group {g} row {co} lane {k}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
