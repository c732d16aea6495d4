//! ONNX Conv (3D, NCDHW) as a direct convolution: the output rows (d, h) are cut into groups of
//! R rows; per group, each worker copies the input rows the group reads into a scratch "row
//! stack" (one zero-padded, stride-phase-split W row per input channel, (kd, kh) tap and output
//! row, sized to stay in L2), then runs register tiles of `co` channels × 32 pixels over it
//! (`microkernel`), and writes bias + activation in the same pass. Every output value is summed
//! by one worker in a fixed order, so results do not depend on the thread count.

use super::eltwise::Unary;
use super::microkernel::{self, Taps, Tile, PIX};
use super::{dims, err, standard, zeroed_par};
use crate::backend::cpu::Real;
use crate::model::graph::Conv;
use crate::model::graph::Shape;
use crate::Result;
use ndarray::{Array5, ArrayView5};
use rayon::prelude::*;

/// Scratch (row stack) bytes per worker in f32: a quarter of a 2-4 MiB L2, so the stack, the
/// packed weights and the output tiles stay cached while every channel block reuses them.
const SCRATCH_BUDGET_BYTES: usize = 1 << 20;
/// At least this many row groups per (image, group) when there are enough rows (load balance).
const MIN_GROUPS: usize = 16;

/// The index arithmetic of one Conv on one input shape.
struct Geom {
    cin: usize,
    cout: usize,
    cin_g: usize,
    cout_g: usize,
    groups: usize,
    k: [usize; 3],
    stride: [usize; 3],
    dil: [usize; 3],
    pad: [usize; 3],
    inp: [usize; 3],
    out: [usize; 3],
    /// Length of one stride phase of a padded input row.
    lph: usize,
    /// Output rows per group.
    rows: usize,
    /// Values of one row stack (plus the slack the last tile reads past it).
    scratch_len: usize,
}

impl Geom {
    fn new(xs: &Shape, os: &Shape, p: &Conv) -> Self {
        let ws = &p.weight.shape;
        let k = [ws[2], ws[3], ws[4]];
        let (cin, cout, g) = (xs[1], os[1], p.groups.max(1));
        let sw = p.stride[2];
        let a_max = (k[2] - 1) * p.dilation[2] / sw;
        let lph = os[4] + a_max;
        let per_row = (cin / g) * k[0] * k[1] * sw * lph;
        let total_rows = os[2] * os[3];
        let budget_rows = (SCRATCH_BUDGET_BYTES / 4 / per_row.max(1)).max(1);
        let rows = budget_rows
            .min(total_rows.div_ceil(MIN_GROUPS))
            .clamp(1, total_rows.max(1));
        Geom {
            cin,
            cout,
            cin_g: cin / g,
            cout_g: cout / g,
            groups: g,
            k,
            stride: p.stride,
            dil: p.dilation,
            pad: [p.pads[0], p.pads[1], p.pads[2]],
            inp: [xs[2], xs[3], xs[4]],
            out: [os[2], os[3], os[4]],
            lph,
            rows,
            scratch_len: per_row * rows + a_max + PIX,
        }
    }

    /// Offset of row stack (ci, kd, kh, phase) for R rows.
    fn stack(&self, ci: usize, kd: usize, kh: usize, phase: usize) -> usize {
        (((ci * self.k[0] + kd) * self.k[1] + kh) * self.stride[2] + phase) * self.rows * self.lph
    }

    /// Tap offsets in weight order (ci, kd, kh, kw).
    fn taps(&self) -> Taps {
        let (sw, dw) = (self.stride[2], self.dil[2]);
        let mut offs = Vec::with_capacity(self.cin_g * self.k.iter().product::<usize>());
        for ci in 0..self.cin_g {
            for kd in 0..self.k[0] {
                for kh in 0..self.k[1] {
                    for kw in 0..self.k[2] {
                        let i = kw * dw;
                        offs.push(self.stack(ci, kd, kh, i % sw) + i / sw);
                    }
                }
            }
        }
        Taps::new(offs)
    }

    /// Output channel blocks `(first, count)` of one group, as even as the tile size allows.
    fn co_blocks<T: Real>(&self) -> Vec<(usize, usize)> {
        let nb = self.cout_g.div_ceil(microkernel::max_co::<T>());
        let per = self.cout_g.div_ceil(nb.max(1));
        (0..self.cout_g)
            .step_by(per.max(1))
            .map(|c| (c, per.min(self.cout_g - c)))
            .collect()
    }

    fn groups_per_image(&self) -> usize {
        (self.out[0] * self.out[1]).div_ceil(self.rows)
    }
}

/// Weights `[Cout, Cin/g, kd, kh, kw]` repacked per (group, channel block) as `[K][co]`.
fn pack<T: Real>(g: &Geom, w: &[T], blocks: &[(usize, usize)]) -> Vec<Vec<T>> {
    let kk = g.cin_g * g.k.iter().product::<usize>();
    let mut packed = Vec::with_capacity(g.groups * blocks.len());
    for gi in 0..g.groups {
        for &(c0, co) in blocks {
            let mut b = vec![T::ZERO; kk * co];
            for c in 0..co {
                let src = &w[(gi * g.cout_g + c0 + c) * kk..][..kk];
                for (k, &v) in src.iter().enumerate() {
                    b[k * co + c] = v;
                }
            }
            packed.push(b);
        }
    }
    packed
}

/// Copies the padded, phase-split input rows of output rows `r0..r0 + nr` into `s`.
fn fill<T: Real>(g: &Geom, x: &[T], img_ch: usize, r0: usize, nr: usize, s: &mut [T]) {
    let [d, h, w] = g.inp;
    let sw = g.stride[2];
    let pw = g.pad[2] as isize;
    for ci in 0..g.cin_g {
        let plane = &x[(img_ch + ci) * d * h * w..][..d * h * w];
        for kd in 0..g.k[0] {
            for kh in 0..g.k[1] {
                for r in 0..nr {
                    let (od, oh) = ((r0 + r) / g.out[1], (r0 + r) % g.out[1]);
                    let id = (od * g.stride[0] + kd * g.dil[0]) as isize - g.pad[0] as isize;
                    let ih = (oh * g.stride[1] + kh * g.dil[1]) as isize - g.pad[1] as isize;
                    let inside = (0..d as isize).contains(&id) && (0..h as isize).contains(&ih);
                    for phase in 0..sw {
                        let dst = &mut s[g.stack(ci, kd, kh, phase) + r * g.lph..][..g.lph];
                        if !inside {
                            dst.fill(T::ZERO);
                            continue;
                        }
                        let src = &plane[(id as usize * h + ih as usize) * w..][..w];
                        padded_row(src, dst, sw, phase, pw);
                    }
                }
            }
        }
    }
}

/// `dst[q] = src[q * sw + phase - pw]`, zero outside `src` (contiguous copy when `sw == 1`).
fn padded_row<T: Real>(src: &[T], dst: &mut [T], sw: usize, phase: usize, pw: isize) {
    let w = src.len() as isize;
    if sw == 1 {
        let lo = pw.clamp(0, dst.len() as isize) as usize;
        let hi = (w + pw).clamp(lo as isize, dst.len() as isize) as usize;
        dst[..lo].fill(T::ZERO);
        dst[lo..hi].copy_from_slice(&src[(lo as isize - pw) as usize..(hi as isize - pw) as usize]);
        dst[hi..].fill(T::ZERO);
        return;
    }
    for (q, v) in dst.iter_mut().enumerate() {
        let iw = (q * sw + phase) as isize - pw;
        *v = if (0..w).contains(&iw) {
            src[iw as usize]
        } else {
            T::ZERO
        };
    }
}

/// The output pointer shared by the workers; each writes only the rows of its own group.
#[derive(Clone, Copy)]
struct OutPtr<T>(*mut T);
// SAFETY: workers write disjoint elements (distinct output rows); see `write_tile`.
unsafe impl<T: Send> Send for OutPtr<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for OutPtr<T> {}

/// Where one tile's values go.
struct TileDst<'a, T> {
    /// First output-channel plane of the tile: `(image * Cout + channel) * D*H*W`.
    plane0: usize,
    bias: &'a [T],
    act: Option<Unary>,
    /// First output row of the group, rows in the group, first pixel of the tile.
    r0: usize,
    nr: usize,
    j0: usize,
}

/// Writes `act(tile + bias)` for the tile's valid pixels (w < Wout, row < nr).
///
/// # Safety
/// `out` must address `len` values; no other worker may write rows `r0..r0 + nr` of these planes.
unsafe fn write_tile<T: Real>(g: &Geom, tile: &[T], d: &TileDst<T>, out: OutPtr<T>, len: usize) {
    let ow = g.out[2];
    let pout = g.out.iter().product::<usize>();
    let mut l = 0;
    while l < PIX {
        let j = d.j0 + l;
        let (r, q) = (j / g.lph, j % g.lph);
        if r >= d.nr {
            break;
        }
        let seg = (g.lph - q).min(PIX - l);
        let valid = ow.saturating_sub(q).min(seg);
        // Pixels past the row's end (q >= Wout) are padding lanes: nothing to write.
        let channels = if valid > 0 { d.bias } else { &[] };
        for (c, &b) in channels.iter().enumerate() {
            let at = d.plane0 + c * pout + (d.r0 + r) * ow + q;
            assert!(at + valid <= len, "conv: tile outside the output");
            // SAFETY: in bounds (asserted); this row belongs to the caller's group only.
            let dst = unsafe { std::slice::from_raw_parts_mut(out.0.add(at), valid) };
            epilogue(dst, &tile[c * PIX + l..][..valid], b, d.act);
        }
        l += seg;
    }
}

/// `dst = act(src + bias)`: the same slice activation as the unfused op, so fusion is exact.
#[inline(always)]
fn epilogue<T: Real>(dst: &mut [T], src: &[T], b: T, act: Option<Unary>) {
    dst.iter_mut().zip(src).for_each(|(o, &v)| *o = v + b);
    if let Some(a) = act {
        super::vmath::activate(dst, a);
    }
}

/// Conv with an optional activation applied while the output is written.
pub fn conv3d_fused<T: Real>(x: ArrayView5<T>, p: &Conv, act: Option<Unary>) -> Result<Array5<T>> {
    let xs = dims(&x);
    let os = p.output_shape(&xs).map_err(err)?;
    let x = standard(&x);
    let xd = x
        .as_slice()
        .ok_or_else(|| err("Conv input is not contiguous".into()))?;
    let g = Geom::new(&xs, &os, p);
    let w = T::cast_slice(&p.weight.data);
    let zeros = vec![T::ZERO; g.cout];
    let bias_c = p.bias.as_ref().map(|b| T::cast_slice(&b.data));
    let bias: &[T] = bias_c.as_deref().unwrap_or(&zeros);
    let blocks = g.co_blocks::<T>();
    let packed = pack(&g, &w, &blocks);
    let taps = g.taps();
    assert!(taps.span() <= g.scratch_len, "conv: row stack too short");
    let mut out = zeroed_par::<T>(os.iter().product(), "a Conv output")?;
    let len = out.len();
    let optr = OutPtr(out.as_mut_ptr());
    let per_img = g.groups_per_image();
    let pout = g.out.iter().product::<usize>();
    let tiles = (g.rows * g.lph).div_ceil(PIX);
    let max_co = microkernel::max_co::<T>();
    (0..os[0] * g.groups * per_img)
        .into_par_iter()
        .for_each_init(
            || (vec![T::ZERO; g.scratch_len], vec![T::ZERO; max_co * PIX]),
            |(s, tile), job| {
                let (img, gi, grp) = (
                    job / (g.groups * per_img),
                    (job / per_img) % g.groups,
                    job % per_img,
                );
                let r0 = grp * g.rows;
                let nr = g.rows.min(g.out[0] * g.out[1] - r0);
                fill(&g, xd, img * g.cin + gi * g.cin_g, r0, nr, s);
                for t in 0..tiles.min((nr * g.lph).div_ceil(PIX)) {
                    for (bi, &(c0, co)) in blocks.iter().enumerate() {
                        let wb = &packed[gi * blocks.len() + bi];
                        let src = &s[t * PIX..];
                        microkernel::run(
                            &Tile {
                                src,
                                taps: &taps,
                                w: wb,
                                co,
                            },
                            tile,
                        );
                        let ch = gi * g.cout_g + c0;
                        let dst = TileDst {
                            plane0: (img * g.cout + ch) * pout,
                            bias: &bias[ch..ch + co],
                            act,
                            r0,
                            nr,
                            j0: t * PIX,
                        };
                        // SAFETY: `out` has `len` values; rows r0..r0 + nr of these planes belong
                        // to this job only.
                        unsafe { write_tile(&g, tile, &dst, optr, len) };
                    }
                }
            },
        );
    Array5::from_shape_vec(os, out).map_err(|e| err(e.to_string()))
}

/// Workspace bytes of one f32 Conv from `x` to `y`: the packed weights plus, per worker thread,
/// a row stack and an output tile.
pub fn conv_workspace(p: &Conv, x: Shape, y: Shape) -> u64 {
    let g = Geom::new(&x, &y, p);
    let weights = p.weight.shape.iter().product::<usize>();
    let per_thread = g.scratch_len + microkernel::max_co::<f32>() * PIX;
    ((weights + rayon::current_num_threads() * per_thread) * 4) as u64
}
