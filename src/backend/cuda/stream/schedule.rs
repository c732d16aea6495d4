//! The window schedule of the streamed pipeline (host only): windows sorted by D start, cut into
//! batches that fit the ring of D-planes, the planes each batch completes, and (device gather)
//! the volume planes uploaded before each batch.

/// One batch of the schedule: windows `[begin, end)` of the D-sorted list, then planes
/// `[final_lo, final_hi)` are complete and get finalised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Step {
    pub begin: usize,
    pub end: usize,
    pub final_lo: usize,
    pub final_hi: usize,
}

/// The most D-planes the ring ever holds: `min(d, 2 * rd)` for a volume of depth `d` and window
/// depth `rd` (a bound on [`ring_planes`] whatever the windows).
pub(crate) fn ring_cap(d: usize, rd: usize) -> usize {
    d.min(2 * rd).max(1)
}

/// Volume D starts of windows at padded `starts` (volume offset `pad_before` in D), sorted: the
/// order the pipeline visits them in.
pub fn window_z0(starts: &[[usize; 3]], pad_before: usize) -> Vec<i64> {
    let mut z0: Vec<i64> = starts
        .iter()
        .map(|s| s[0] as i64 - pad_before as i64)
        .collect();
    z0.sort_unstable();
    z0
}

/// Ring depth in D-planes for windows with sorted volume D starts `z0`, window depth `rd`,
/// volume depth `d`, `batch` windows per launch: the most planes any `batch` consecutive
/// windows span (clipped to the volume), so `schedule` cuts no batch short for the ring,
/// capped at `ring_cap` (batches spanning more are cut). W1 (rows of 7 windows, step rd/2):
/// `rd` at batch 1, `rd + step` for batches 2..7.
pub fn ring_planes(z0: &[i64], rd: usize, d: usize, batch: usize) -> usize {
    let clamp = |z: i64| z.clamp(0, d as i64) as usize;
    let n = z0.len();
    let span = (0..n)
        .map(|i| {
            let j = (i + batch.max(1)).min(n) - 1;
            clamp(z0[j] + rd as i64) - clamp(z0[i])
        })
        .max()
        .unwrap_or(0);
    span.clamp(1, ring_cap(d, rd))
}

/// Batches over windows whose volume D starts `z0` (may be negative: padding) are sorted
/// ascending. A batch is cut short where a window would reach past `lo + ring` (lo = first plane
/// not yet finalised = the batch's first window's start), so every plane in flight has its own
/// ring slot; planes before the first window are finalised first (an empty step).
pub(crate) fn schedule(z0: &[i64], rd: usize, d: usize, batch: usize) -> (usize, Vec<Step>) {
    let ring = ring_planes(z0, rd, d, batch);
    let clamp = |z: i64| z.clamp(0, d as i64) as usize;
    let z1 = |i: usize| clamp(z0[i] + rd as i64);
    let mut steps = Vec::new();
    let (mut lo, mut i) = (0usize, 0usize);
    if let Some(&first) = z0.first() {
        if clamp(first) > 0 {
            steps.push(Step {
                begin: 0,
                end: 0,
                final_lo: 0,
                final_hi: clamp(first),
            });
            lo = clamp(first);
        }
    }
    while i < z0.len() {
        let mut j = i + 1;
        while j < z0.len() && j - i < batch && z1(j) <= lo + ring {
            j += 1;
        }
        let hi = if j < z0.len() { clamp(z0[j]) } else { d };
        let hi = hi.max(lo);
        steps.push(Step {
            begin: i,
            end: j,
            final_lo: lo,
            final_hi: hi,
        });
        lo = hi;
        i = j;
    }
    if z0.is_empty() && d > 0 {
        steps.push(Step {
            begin: 0,
            end: 0,
            final_lo: 0,
            final_hi: d,
        });
    }
    (ring, steps)
}

/// One host-to-device upload of volume planes `[za, zb)` into the input ring, before batch `k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Upload {
    pub k: usize,
    pub za: usize,
    pub zb: usize,
}

/// The uploads of the device gather, in order: before batch k (windows `spans[k]` of the
/// D-sorted list with volume D starts `z0`), the planes it reads that are not in the ring yet,
/// in pieces of at most `stage` planes. Planes arrive once each, in increasing order.
pub(crate) fn plane_uploads(
    z0: &[i64],
    spans: &[(usize, usize)],
    rd: usize,
    d: usize,
    stage: usize,
) -> Vec<Upload> {
    let mut ups = Vec::new();
    let mut loaded = 0usize;
    for (k, &(b, e)) in spans.iter().enumerate() {
        // Sorted by D start: the batch's last window reaches deepest.
        let need = z0[b..e]
            .iter()
            .map(|&z| (z + rd as i64).clamp(0, d as i64) as usize)
            .max()
            .unwrap_or(0);
        while loaded < need {
            let zb = need.min(loaded + stage.max(1));
            ups.push(Upload { k, za: loaded, zb });
            loaded = zb;
        }
    }
    ups
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::*;

    /// Every plane is finalised exactly once, after the last window touching it, and the planes
    /// in flight never exceed the ring.
    #[test]
    fn schedule_finalises_each_plane_once_after_its_last_window() {
        for (d, rd, batch, step, per_row, pb) in [
            (70usize, 32usize, 3usize, 16usize, 4usize, 0i64),
            (70, 32, 1, 32, 2, 0),
            (20, 32, 4, 32, 3, 6),
            (100, 16, 7, 4, 1, 0),
            (45, 32, 4, 24, 5, 3),
        ] {
            let mut z0 = Vec::new();
            let mut s = 0i64;
            loop {
                for _ in 0..per_row {
                    z0.push(s - pb);
                }
                if s as usize + rd >= d + 2 * pb as usize {
                    break;
                }
                s = (s + step as i64)
                    .min((d + 2 * pb as usize - rd.min(d + 2 * pb as usize)) as i64);
            }
            let (ring, steps) = schedule(&z0, rd, d, batch);
            let mut fin = vec![usize::MAX; d];
            let mut done_windows = 0;
            for (k, st) in steps.iter().enumerate() {
                assert_eq!(st.begin, done_windows);
                assert!(st.end - st.begin <= batch);
                done_windows = st.end;
                for p in st.final_lo..st.final_hi {
                    assert_eq!(fin[p], usize::MAX, "plane {p} finalised twice");
                    fin[p] = k;
                }
                // Every plane the batch's windows touch is in flight with its own ring slot.
                for i in st.begin..st.end {
                    let z1 = (z0[i] + rd as i64).clamp(0, d as i64) as usize;
                    assert!(z1 <= st.final_lo + ring, "ring overflow at window {i}");
                }
            }
            assert_eq!(done_windows, z0.len());
            for p in 0..d {
                assert_ne!(fin[p], usize::MAX, "plane {p} never finalised");
                // No window touching p comes after its finalisation.
                let k = fin[p];
                for i in steps[k].end..z0.len() {
                    let (a, b) = (z0[i], z0[i] + rd as i64);
                    assert!(
                        !(a <= p as i64 && (p as i64) < b),
                        "window {i} touches finalised plane {p}"
                    );
                }
            }
        }
    }

    /// The ring is what the batches need: with rows of windows `step` apart, batches that fit in
    /// `min(d, 2 rd)` planes are never cut (the steps are plain chunks of `batch` windows, as
    /// with an unbounded ring), the ring is `rd` at batch 1 and at most `rd + step` while a
    /// batch cannot span three rows; windows starting after plane 0 get their leading planes
    /// finalised first and the ring still holds every plane in flight.
    #[test]
    fn ring_fits_the_batches_and_never_cuts_them() {
        let mut rng = 12345u64;
        let mut next = |m: usize| crate::backend::cuda::lcg_next(&mut rng) as usize % m;
        for case in 0..400 {
            let rd = 1 + next(40);
            let step = 1 + next(rd);
            let per_row = 1 + next(8);
            let rows = 1 + next(6);
            let first = if case % 3 == 0 { next(20) as i64 } else { 0 };
            let d = (first as usize + (rows - 1) * step + rd).max(1) - next(3).min(rd - 1);
            let batch = 1 + next(12);
            let mut z0 = Vec::new();
            for r in 0..rows {
                for _ in 0..per_row {
                    z0.push(first + (r * step) as i64);
                }
            }
            let ring = ring_planes(&z0, rd, d, batch);
            let clamp = |z: i64| z.clamp(0, d as i64) as usize;
            assert!(ring <= ring_cap(d, rd) && ring >= 1);
            // Spans of the chunks an unbounded ring gives.
            let chunks: Vec<(usize, usize)> = (0..z0.len())
                .step_by(batch)
                .map(|i| (i, (i + batch).min(z0.len())))
                .collect();
            let widest = chunks
                .iter()
                .map(|&(i, j)| clamp(z0[j - 1] + rd as i64) - clamp(z0[i]))
                .max()
                .unwrap();
            assert!(ring >= widest.min(ring_cap(d, rd)), "case {case}");
            if batch == 1 {
                assert_eq!(ring, rd.min(d), "case {case}");
            }
            if batch <= per_row {
                assert!(ring <= (rd + step).min(d), "case {case}: {ring}");
            }
            let (r2, steps) = schedule(&z0, rd, d, batch);
            assert_eq!(r2, ring);
            let run: Vec<(usize, usize)> = steps
                .iter()
                .filter(|s| s.end > s.begin)
                .map(|s| (s.begin, s.end))
                .collect();
            if widest <= ring_cap(d, rd) {
                assert_eq!(run, chunks, "case {case}: a batch was cut");
            }
            let mut fin = vec![0usize; d];
            for st in &steps {
                for i in st.begin..st.end {
                    let z1 = clamp(z0[i] + rd as i64);
                    assert!(z1 <= st.final_lo + ring, "case {case}: ring overflow");
                    assert!(
                        clamp(z0[i]) >= st.final_lo,
                        "case {case}: plane finalised early"
                    );
                }
                for p in st.final_lo..st.final_hi {
                    fin[p] += 1;
                }
            }
            assert!(fin.iter().all(|&f| f == 1), "case {case}: {fin:?}");
        }
        // W1: 512 planes, rows of 7 windows 64 apart (the last pulled back to 384).
        let z0: Vec<i64> = (0..7).flat_map(|r| [r * 64; 7]).collect();
        for (batch, ring) in [(1, 128), (2, 192), (4, 192), (8, 192), (15, 256), (16, 256)] {
            assert_eq!(ring_planes(&z0, 128, 512, batch), ring, "batch {batch}");
        }
    }
}
