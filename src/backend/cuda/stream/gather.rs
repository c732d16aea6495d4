//! Host work of the streamed pipeline: gathering windows into f16 staging (host gather),
//! converting volume planes to f16 (device gather), and storing finished planes.

use crate::{Error, Result};
use ndarray::{s, Array3, Array4, ArrayView4, Axis};
use rayon::prelude::*;

/// Gathers windows (starts in padded coordinates) from the (C, D, H, W) volume into `out` as f16
/// NDHWC bits, `cval` outside the volume. Parallel over (window, z) planes.
pub(crate) fn gather_windows(
    vol: &[f32],
    dims: [usize; 4],
    pad_before: [usize; 3],
    roi: [usize; 3],
    starts: &[[usize; 3]],
    cval: f32,
    out: &mut [u16],
) {
    let [c, d, h, w] = dims;
    let plane = roi[1] * roi[2] * c;
    let cv = half::f16::from_f32(cval).to_bits();
    let inside =
        |s: usize, p: usize, n: usize| -> Option<usize> { (s >= p && s - p < n).then(|| s - p) };
    out[..starts.len() * roi[0] * plane]
        .par_chunks_mut(plane)
        .enumerate()
        .for_each(|(i, dst)| {
            let s = starts[i / roi[0]];
            let z = i % roi[0];
            let Some(vz) = inside(s[0] + z, pad_before[0], d) else {
                dst.fill(cv);
                return;
            };
            for (y, row) in dst.chunks_mut(roi[2] * c).enumerate() {
                let Some(vy) = inside(s[1] + y, pad_before[1], h) else {
                    row.fill(cv);
                    continue;
                };
                for (x, px) in row.chunks_mut(c).enumerate() {
                    match inside(s[2] + x, pad_before[2], w) {
                        Some(vx) => {
                            for (ch, o) in px.iter_mut().enumerate() {
                                *o = half::f16::from_f32(vol[((ch * d + vz) * h + vy) * w + vx])
                                    .to_bits();
                            }
                        }
                        None => px.fill(cv),
                    }
                }
            }
        });
}

/// Output of the pipeline, either form.
pub(crate) enum Out {
    Logits(Array4<f32>),
    /// Labels, and per plane the voxels marked [`NAN_LABEL`] (counted as the planes are
    /// stored, so no pass over the whole volume follows).
    Labels(Array3<u16>, Vec<usize>),
}

/// The device argmax's label of a voxel whose blended outputs hold a NaN (`finalize_planes`).
pub(crate) const NAN_LABEL: u16 = 0xFFFF;

/// Pinned host slot of finished planes: f32 logits or u16 labels.
pub(crate) enum HostOut<'a> {
    F(&'a mut [f32]),
    L(&'a mut [u16]),
}

/// Copies `np` downloaded planes starting at plane `p0` into the output array, in parallel
/// pieces (the copy is bound by page faults and memory bandwidth, not one core).
pub(super) fn store_planes(
    out: &mut Out,
    buf: &HostOut,
    p0: usize,
    np: usize,
    hw: usize,
) -> Result<()> {
    const PIECE: usize = 1 << 16;
    match (out, buf) {
        (Out::Labels(l, nan), HostOut::L(src)) => {
            let dst = l
                .as_slice_mut()
                .ok_or_else(|| Error::Backend("label array is not contiguous".into()))?;
            // One piece per plane (several planes when they are small), NaN marks counted.
            let per = PIECE.div_ceil(hw.max(1)).max(1) * hw.max(1);
            let counts: Vec<usize> = dst[p0 * hw..(p0 + np) * hw]
                .par_chunks_mut(per)
                .zip(src[..np * hw].par_chunks(per))
                .flat_map_iter(|(d, s)| {
                    d.copy_from_slice(s);
                    s.chunks(hw.max(1))
                        .map(|p| p.iter().filter(|&&v| v == NAN_LABEL).count())
                        .collect::<Vec<_>>()
                })
                .collect();
            nan[p0..p0 + np].copy_from_slice(&counts);
        }
        (Out::Logits(a), HostOut::F(src)) => {
            let mut dsts = Vec::new();
            for plane in a.axis_iter_mut(Axis(0)) {
                let dst = plane
                    .into_slice()
                    .ok_or_else(|| Error::Backend("logit array is not contiguous".into()))?;
                dsts.push(&mut dst[p0 * hw..(p0 + np) * hw]);
            }
            dsts.into_par_iter().enumerate().for_each(|(ch, dst)| {
                dst.par_chunks_mut(PIECE)
                    .zip(src[ch * np * hw..(ch + 1) * np * hw].par_chunks(PIECE))
                    .for_each(|(d, s)| d.copy_from_slice(s));
            });
        }
        _ => return Err(Error::Backend("output and staging kinds differ".into())),
    }
    Ok(())
}

/// Planes the store worker touches per idle step: about 2 MiB of output.
pub(super) fn prefault_planes(out: &Out, hw: usize) -> usize {
    let plane = match out {
        Out::Labels(..) => hw * 2,
        Out::Logits(a) => a.shape()[0] * hw * 4,
    };
    (2usize << 20).div_ceil(plane.max(1)).max(1)
}

/// Writes zeros over planes `[p0, p0 + np)` of the (still all-zero) output, so the first-touch
/// page faults of a fresh allocation are paid while the worker waits for downloads.
pub(super) fn prefault(out: &mut Out, p0: usize, np: usize, hw: usize) {
    match out {
        Out::Labels(l, _) => {
            if let Some(s) = l.as_slice_mut() {
                s[p0 * hw..(p0 + np) * hw].fill(0);
            }
        }
        Out::Logits(a) => {
            for mut plane in a.axis_iter_mut(Axis(0)) {
                if let Some(s) = plane.as_slice_mut() {
                    s[p0 * hw..(p0 + np) * hw].fill(0.0);
                }
            }
        }
    }
}

/// Volume planes `[za, zb)` of the (C, D, H, W) volume (any strides) as f16 bits in the input
/// ring's slot layout `[z - za][c][h][w]`; the same bits as `half::f16::from_f32` per value.
/// Parallel over (plane, channel); contiguous rows use the vector conversion.
pub(crate) fn convert_planes(vol: ArrayView4<f32>, za: usize, zb: usize, out: &mut [u16]) {
    use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
    let (c, _, h, w) = vol.dim();
    out[..(zb - za) * c * h * w]
        .par_chunks_mut(h * w)
        .enumerate()
        .for_each(|(i, dst)| {
            let src = vol.slice(s![i % c, za + i / c, .., ..]);
            let dst: &mut [half::f16] = dst.reinterpret_cast_mut();
            if let Some(sl) = src.as_slice() {
                dst.convert_from_f32_slice(sl);
                return;
            }
            for (row, drow) in src.outer_iter().zip(dst.chunks_mut(w)) {
                match row.as_slice() {
                    Some(sl) => drow.convert_from_f32_slice(sl),
                    None => {
                        for (o, v) in drow.iter_mut().zip(row.iter()) {
                            *o = half::f16::from_f32(*v);
                        }
                    }
                }
            }
        });
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::super::schedule::{plane_uploads, schedule};
    use super::*;
    use std::time::Instant;

    /// The host gather against direct indexing with padding.
    #[test]
    fn gather_matches_indexing() {
        let (c, d, h, w) = (2usize, 5usize, 4usize, 3usize);
        let vol: Vec<f32> = (0..c * d * h * w).map(|i| i as f32 * 0.5 - 3.0).collect();
        let roi = [3usize, 4, 4];
        let pb = [1usize, 2, 0];
        let starts = [[0usize, 0, 0], [3, 2, 1]];
        let mut out = vec![0u16; 2 * c * roi.iter().product::<usize>()];
        gather_windows(&vol, [c, d, h, w], pb, roi, &starts, 7.0, &mut out);
        let mut e = 0;
        for s in starts {
            for z in 0..roi[0] {
                for y in 0..roi[1] {
                    for x in 0..roi[2] {
                        for ch in 0..c {
                            let (vz, vy, vx) = (
                                (s[0] + z) as i64 - pb[0] as i64,
                                (s[1] + y) as i64 - pb[1] as i64,
                                (s[2] + x) as i64 - pb[2] as i64,
                            );
                            let want = if (0..d as i64).contains(&vz)
                                && (0..h as i64).contains(&vy)
                                && (0..w as i64).contains(&vx)
                            {
                                vol[((ch * d + vz as usize) * h + vy as usize) * w + vx as usize]
                            } else {
                                7.0
                            };
                            assert_eq!(half::f16::from_bits(out[e]).to_f32(), want);
                            e += 1;
                        }
                    }
                }
            }
        }
    }

    /// `GATHER_WINDOW_RING` (kernels/blend.cu) emulated: the same index math, one window.
    /// `[pb, roi, start]`: padding before the volume, window size, window start.
    fn gather_ring_emulated(
        ring_buf: &[u16],
        dims: [usize; 4],
        ring: usize,
        [pb, roi, start]: [[usize; 3]; 3],
        cval: u16,
        out: &mut [u16],
    ) {
        let [c, d, h, w] = dims.map(|v| v as i64);
        let hw = h * w;
        for e in 0..(roi.iter().product::<usize>() * c as usize) as i64 {
            let ch = e % c;
            let mut t = e / c;
            let x = t % roi[2] as i64;
            t /= roi[2] as i64;
            let y = t % roi[1] as i64;
            let z = t / roi[1] as i64;
            let (vz, vy, vx) = (
                start[0] as i64 + z - pb[0] as i64,
                start[1] as i64 + y - pb[1] as i64,
                start[2] as i64 + x - pb[2] as i64,
            );
            out[e as usize] =
                if (0..d).contains(&vz) && (0..h).contains(&vy) && (0..w).contains(&vx) {
                    ring_buf[(((vz % ring as i64) * c + ch) * hw + vy * w + vx) as usize]
                } else {
                    cval
                };
        }
    }

    /// The device gather on the CPU: the schedule's batches, the plane uploads (converted by
    /// `convert_planes` into a ring of `ring` planes, applied in order before each batch) and the
    /// kernel's index math give exactly the host gather's bits, window by window. Also checks
    /// that every plane is uploaded once, in order, in pieces of at most `stage` planes.
    #[test]
    fn device_gather_emulation_matches_host_gather() {
        let mut seed = 7u64;
        let mut rnd = move || crate::backend::cuda::lcg_next(&mut seed) as usize;
        // (c, d, h, w, roi, pad_before, step, batch, stage)
        for (c, d, h, w, roi, pb, stepz, batch, stage) in [
            (
                1usize,
                23usize,
                9usize,
                7usize,
                [8usize, 6, 5],
                [2usize, 1, 0],
                4usize,
                3usize,
                5usize,
            ),
            (2, 40, 6, 10, [16, 8, 8], [0, 1, 2], 8, 4, 100),
            (3, 12, 5, 5, [16, 4, 4], [2, 0, 1], 2, 2, 1),
            (1, 70, 4, 6, [32, 4, 6], [0, 0, 0], 16, 1, 7),
        ] {
            let vol: Vec<f32> = (0..c * d * h * w)
                .map(|_| (rnd() % 20000) as f32 * 0.013 - 130.0)
                .collect();
            let va = ndarray::ArrayView4::from_shape((c, d, h, w), &vol).unwrap();
            let padded = [
                (d + 2 * pb[0]).max(roi[0]),
                (h + 2 * pb[1]).max(roi[1]),
                (w + 2 * pb[2]).max(roi[2]),
            ];
            let mut starts = Vec::new();
            let mut sz = 0;
            loop {
                for sy in [0, padded[1] - roi[1]] {
                    for sx in [0, padded[2] - roi[2]] {
                        starts.push([sz, sy, sx]);
                    }
                }
                if sz + roi[0] >= padded[0] {
                    break;
                }
                sz = (sz + stepz).min(padded[0] - roi[0]);
            }
            starts.sort_by_key(|s| s[0]);
            let z0: Vec<i64> = starts.iter().map(|s| s[0] as i64 - pb[0] as i64).collect();
            let sc = schedule(&z0, roi[0], d, batch);
            let ring = sc.ring_in;
            let spans: Vec<(usize, usize)> = sc
                .steps
                .iter()
                .filter(|st| st.end > st.begin)
                .map(|st| (st.begin, st.end))
                .collect();
            let ups = plane_uploads(&z0, &spans, roi[0], d, stage);
            let mut next = 0;
            for u in &ups {
                assert_eq!(u.za, next, "planes uploaded out of order");
                assert!(u.zb > u.za && u.zb - u.za <= stage);
                next = u.zb;
            }
            assert_eq!(next, d, "every plane uploaded");
            let plane = c * h * w;
            let mut ringb = vec![0xFFFFu16; ring * plane];
            let cval = half::f16::from_f32(-0.75).to_bits();
            let rvox: usize = roi.iter().product();
            let mut ui = 0;
            for (k, &(b, e)) in spans.iter().enumerate() {
                while ui < ups.len() && ups[ui].k == k {
                    let u = ups[ui];
                    let mut st = vec![0u16; (u.zb - u.za) * plane];
                    convert_planes(va, u.za, u.zb, &mut st);
                    for z in u.za..u.zb {
                        let dst = (z % ring) * plane;
                        ringb[dst..dst + plane]
                            .copy_from_slice(&st[(z - u.za) * plane..(z - u.za + 1) * plane]);
                    }
                    ui += 1;
                }
                let mut want = vec![0u16; (e - b) * c * rvox];
                gather_windows(&vol, [c, d, h, w], pb, roi, &starts[b..e], -0.75, &mut want);
                let mut got = vec![0u16; (e - b) * c * rvox];
                for (i, st) in starts[b..e].iter().enumerate() {
                    gather_ring_emulated(
                        &ringb,
                        [c, d, h, w],
                        ring,
                        [pb, roi, *st],
                        cval,
                        &mut got[i * c * rvox..(i + 1) * c * rvox],
                    );
                }
                assert!(got == want, "batch {k} differs (c {c} d {d} roi {roi:?})");
            }
            assert_eq!(ui, ups.len());
        }
    }

    /// Plane conversion: the bits of `f16::from_f32` for normal, tie, subnormal, overflowing,
    /// infinite and NaN values, from a standard and a permuted (strided) volume.
    #[test]
    fn convert_planes_matches_scalar_conversion() {
        let (c, d, h, w) = (2usize, 5usize, 3usize, 37usize);
        let special = [
            0.0f32,
            -0.0,
            1.0 + 1.0 / 2048.0,
            1.0 + 3.0 / 2048.0,
            65504.0,
            65520.0,
            1e6,
            -1e6,
            6e-8,
            3e-8,
            1e-5,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MIN_POSITIVE,
        ];
        let vol: Vec<f32> = (0..c * d * h * w)
            .map(|i| {
                if i % 3 == 0 {
                    special[i / 3 % special.len()]
                } else {
                    (i as f32 * 0.37).sin() * 1000.0
                }
            })
            .collect();
        let std = ndarray::Array4::from_shape_vec((c, d, h, w), vol).unwrap();
        // The same volume stored (C, W, H, D) and viewed back as (C, D, H, W).
        let perm = std
            .view()
            .permuted_axes([0, 3, 2, 1])
            .as_standard_layout()
            .to_owned();
        let strided = perm.view().permuted_axes([0, 3, 2, 1]);
        assert!(strided.as_slice().is_none());
        for v in [std.view(), strided] {
            let (za, zb) = (1, 4);
            let mut out = vec![0u16; (zb - za) * c * h * w];
            convert_planes(v, za, zb, &mut out);
            for z in za..zb {
                for ch in 0..c {
                    for y in 0..h {
                        for x in 0..w {
                            let want = half::f16::from_f32(v[[ch, z, y, x]]).to_bits();
                            let got = out[(((z - za) * c + ch) * h + y) * w + x];
                            assert_eq!(got, want, "at {:?}", (ch, z, y, x));
                        }
                    }
                }
            }
        }
    }

    /// Stored label planes are copied and their NaN marks counted per plane, small planes
    /// grouped into one piece or not.
    #[test]
    fn store_counts_nan_marks_per_plane() {
        for (d, h, w) in [(6usize, 3usize, 4usize), (5, 300, 250)] {
            let hw = h * w;
            let mut out = Out::Labels(Array3::zeros((d, h, w)), vec![usize::MAX; d]);
            // Planes 1..4 stored: plane 1 + k holds k + 1 marks, the rest its plane index.
            let mut src: Vec<u16> = (0..3 * hw).map(|i| (i / hw) as u16 + 1).collect();
            for k in 0..3 {
                for m in 0..=k {
                    src[k * hw + (m * 7) % hw] = NAN_LABEL;
                }
            }
            let buf = HostOut::L(&mut src);
            store_planes(&mut out, &buf, 1, 3, hw).unwrap();
            let HostOut::L(src) = buf else { unreachable!() };
            let Out::Labels(l, nan) = out else {
                unreachable!()
            };
            assert_eq!(&nan[1..4], &[1, 2, 3], "{d}x{h}x{w}");
            assert_eq!((nan[0], nan[4]), (usize::MAX, usize::MAX));
            let flat = l.as_slice().unwrap();
            assert_eq!(&flat[hw..4 * hw], &src[..]);
            assert!(flat[..hw].iter().chain(&flat[4 * hw..]).all(|&v| v == 0));
        }
    }

    /// Host costs of the pipeline on a W2-sized volume (512x512x128, roi 128, 49 windows, batch
    /// 4): host gather of all batches vs the device gather's plane conversion, and the store of
    /// all label planes into a fresh array serially vs in parallel after prefaulting.
    /// `cargo test --release --lib pipeline::tests::host_costs -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn host_costs_w2() {
        let (d, h, w) = (512usize, 512usize, 128usize);
        let roi = [128usize; 3];
        let vol: Vec<f32> = (0..d * h * w).map(|i| (i % 977) as f32 * 0.01).collect();
        let mut starts = Vec::new();
        for z in (0..=384).step_by(64) {
            for y in (0..=384).step_by(64) {
                starts.push([z, y, 0usize]);
            }
        }
        let rvox: usize = roi.iter().product();
        let mut buf = vec![0u16; 4 * rvox];
        let t = Instant::now();
        for b in starts.chunks(4) {
            gather_windows(&vol, [1, d, h, w], [0; 3], roi, b, 0.0, &mut buf);
        }
        let tg = t.elapsed().as_secs_f64() * 1e3;
        let va = ndarray::ArrayView4::from_shape((1, d, h, w), &vol).unwrap();
        let mut st = vec![0u16; 128 * h * w];
        let t = Instant::now();
        for za in (0..d).step_by(128) {
            convert_planes(va, za, za + 128, &mut st);
        }
        let tc = t.elapsed().as_secs_f64() * 1e3;
        let src = vec![3u16; 32 * h * w];
        let hw = h * w;
        let mut times = Vec::new();
        for mode in 0..3 {
            let mut out = Out::Labels(Array3::zeros((d, h, w)), vec![0; d]);
            let buf = HostOut::L(unsafe {
                std::slice::from_raw_parts_mut(src.as_ptr() as *mut u16, src.len())
            });
            let t = Instant::now();
            if mode == 2 {
                prefault(&mut out, 0, d, hw);
            }
            let tp = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            for p0 in (0..d).step_by(32) {
                if mode == 0 {
                    if let (Out::Labels(l, _), HostOut::L(s)) = (&mut out, &buf) {
                        l.as_slice_mut().unwrap()[p0 * hw..(p0 + 32) * hw]
                            .copy_from_slice(&s[..32 * hw]);
                    }
                } else {
                    store_planes(&mut out, &buf, p0, 32, hw).unwrap();
                }
            }
            times.push((tp, t.elapsed().as_secs_f64() * 1e3));
        }
        println!(
            "RESULT host costs W2 ({} threads): host gather of 13 batches {tg:.1} ms; plane conversion of the volume {tc:.1} ms; \
             store 64 MiB labels: serial {:.1} ms, parallel {:.1} ms, prefault {:.1} ms + parallel store {:.1} ms",
            rayon::current_num_threads(), times[0].1, times[1].1, times[2].0, times[2].1
        );
        let t = Instant::now();
        let wm = crate::tiling::weight_map(roi, crate::tiling::BlendMode::Gaussian, [0.125; 3]);
        println!(
            "RESULT weight map 128^3: {:.1} ms ({})",
            t.elapsed().as_secs_f64() * 1e3,
            wm.len()
        );
    }
}
