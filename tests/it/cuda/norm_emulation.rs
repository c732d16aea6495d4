//! CPU emulation of the flat-vector norm partials (kernels/norm.cu, `norm_partial_flat8_t`, for
//! channel counts that are not a multiple of 8), no GPU: each block's threads and their vectors
//! (`NORM_LOADS` at a time, then the rest), the per-(thread, lane) sums, and the block tail
//! that gives each channel its (phase, lane) slots. Integer values, so every sum is exact: the
//! blocks' partials of each channel add up to that channel's direct sums.

/// The vector period of a channel count (`flat8_period` in the kernel and in ops/norm.rs).
fn period(c: usize) -> usize {
    let g = [8, 4, 2, 1]
        .into_iter()
        .find(|g| c.is_multiple_of(*g))
        .unwrap();
    c / g
}

const NORM_LOADS: usize = 4;

/// The partials [block][c] = (sum, sum of squares) of one sample of `p` voxels x `c` channels,
/// as the kernel's blocks of `block` threads compute them over `nblk` requested blocks.
fn flat8_partials(
    x: &[f64],
    p: usize,
    c: usize,
    nblk: usize,
    block: usize,
) -> Vec<Vec<(f64, f64)>> {
    let per = period(c);
    let nv = p * c / 8;
    // The host's chunk (ops/norm.rs): a multiple of the period, so a thread keeps its channels.
    let chunkv = nv.div_ceil(nblk).div_ceil(per) * per;
    let th = (block / per) * per;
    let shift = |ch: usize| x[ch]; // InstanceNorm: the group's first value
    let mut out = Vec::new();
    for b in 0..nv.div_ceil(chunkv) {
        let (v0, v1) = (b * chunkv, ((b + 1) * chunkv).min(nv));
        let mut sh = vec![(0.0, 0.0); th * 8];
        for tid in 0..th {
            let c0 = (8 * tid) % c;
            let shf: Vec<f64> = (0..8).map(|k| shift((c0 + k) % c)).collect();
            let (mut s, mut q) = ([0.0f64; 8], [0.0f64; 8]);
            let mut add = |v: usize| {
                for k in 0..8 {
                    let a = x[v * 8 + k] - shf[k];
                    s[k] += a;
                    q[k] += a * a;
                }
            };
            let mut v = v0 + tid;
            while v + (NORM_LOADS - 1) * th < v1 {
                (0..NORM_LOADS).for_each(|l| add(v + l * th));
                v += NORM_LOADS * th;
            }
            while v < v1 {
                add(v);
                v += th;
            }
            for k in 0..8 {
                sh[tid * 8 + k] = (s[k], q[k]);
            }
        }
        // The tail: channel ch's lanes k = ch - c0 (mod C), every C lanes, of each phase.
        let mut part = vec![(0.0, 0.0); c];
        for (ch, pc) in part.iter_mut().enumerate() {
            let mut c0 = 0;
            for ph in 0..per {
                let mut k = if ch >= c0 { ch - c0 } else { ch + c - c0 };
                while k < 8 {
                    let mut t = ph;
                    while t < th {
                        pc.0 += sh[t * 8 + k].0;
                        pc.1 += sh[t * 8 + k].1;
                        t += per;
                    }
                    k += c;
                }
                c0 = (c0 + 8) % c;
            }
        }
        out.push(part);
    }
    out
}

#[test]
fn flat8_partials_sum_to_each_channels_sums() {
    let mut seed = 7u64;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 33) % 17) as f64 - 8.0
    };
    // Channel counts below, between and above 8 (several lanes of one channel in a vector
    // when C < 8), periods 1 to 15, and sample sizes that leave a short last block.
    for c in [1usize, 2, 3, 5, 6, 7, 10, 12, 14, 15, 20, 30] {
        for (p, nblk) in [(8 * 97, 3), (4096, 7), (2000 + 8, 264), (512, 1)] {
            if !(p * c).is_multiple_of(8) {
                continue;
            }
            let x: Vec<f64> = (0..p * c).map(|_| next()).collect();
            let parts = flat8_partials(&x, p, c, nblk, 256);
            for ch in 0..c {
                let sh = x[ch];
                let (s, q) = (0..p)
                    .map(|i| x[i * c + ch] - sh)
                    .fold((0.0, 0.0), |(s, q), a| (s + a, q + a * a));
                let got = parts
                    .iter()
                    .fold((0.0, 0.0), |a, b| (a.0 + b[ch].0, a.1 + b[ch].1));
                assert_eq!(got, (s, q), "C {c}, P {p}, {nblk} blocks, channel {ch}");
            }
        }
    }
}
