//! The window schedule of the streamed pipeline (host only): windows sorted by D start, cut into
//! batches that fit the input ring of D-planes, where the blends of each batch stop to finalise
//! the planes no later window touches, and (device gather) the volume planes uploaded before each
//! batch.

/// One batch of the schedule: windows `[begin, end)` of the D-sorted list run through the
/// network, then its `parts` in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Step {
    pub begin: usize,
    pub end: usize,
    pub parts: Vec<Part>,
}

/// Windows `[from, to)` blended, then planes `[final_lo, final_hi)` finalised: every window
/// touching them has been blended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Part {
    pub from: usize,
    pub to: usize,
    pub final_lo: usize,
    pub final_hi: usize,
}

/// What one pass does, in order, and the two rings it needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Schedule {
    /// D-planes of the device gather's input ring: a batch's windows are gathered together,
    /// so it holds the most planes a batch spans ([`ring_planes`]).
    pub ring_in: usize,
    /// D-planes of the accumulator ring: the planes below a window's start are finalised
    /// before it is blended, so it holds the most planes one window spans ([`acc_planes`]).
    pub acc_ring: usize,
    pub steps: Vec<Step>,
}

/// The most D-planes the input ring ever holds: `min(d, 2 * rd)` for a volume of depth `d` and
/// window depth `rd` (a bound on [`ring_planes`] whatever the windows).
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

/// Input ring depth in D-planes for windows with sorted volume D starts `z0`, window depth
/// `rd`, volume depth `d`, `batch` windows per launch: the most planes any `batch` consecutive
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

/// Accumulator ring depth in D-planes: the most planes one window spans within the volume
/// (`min(rd, d)` for windows that cover it), whatever the batch.
pub fn acc_planes(z0: &[i64], rd: usize, d: usize) -> usize {
    let clamp = |z: i64| z.clamp(0, d as i64) as usize;
    z0.iter()
        .map(|&z| clamp(z + rd as i64) - clamp(z))
        .max()
        .unwrap_or(0)
        .max(1)
}

/// The schedule of windows whose volume D starts `z0` (may be negative: padding) are sorted
/// ascending. A batch is cut short where a window would reach past its first window's start
/// plus the input ring. Planes before the first window are finalised first (an empty step);
/// within a batch, the blends stop wherever the next window starts deeper, and the planes above
/// its start are finalised, so every plane in flight has its own accumulator slot.
pub(crate) fn schedule(z0: &[i64], rd: usize, d: usize, batch: usize) -> Schedule {
    let ring_in = ring_planes(z0, rd, d, batch);
    let acc_ring = acc_planes(z0, rd, d);
    let clamp = |z: i64| z.clamp(0, d as i64) as usize;
    let z1 = |i: usize| clamp(z0[i] + rd as i64);
    let mut steps = Vec::new();
    let (mut lo, mut i) = (0usize, 0usize);
    let lead = |lo: usize, hi: usize| Step {
        begin: 0,
        end: 0,
        parts: vec![Part {
            from: 0,
            to: 0,
            final_lo: lo,
            final_hi: hi,
        }],
    };
    if let Some(&first) = z0.first() {
        if clamp(first) > 0 {
            steps.push(lead(0, clamp(first)));
            lo = clamp(first);
        }
    }
    while i < z0.len() {
        let top = clamp(z0[i]);
        let mut j = i + 1;
        while j < z0.len() && j - i < batch && z1(j) <= top + ring_in {
            j += 1;
        }
        let mut parts = Vec::new();
        let mut from = i;
        for (m, &z) in z0.iter().enumerate().take(j).skip(i + 1) {
            if clamp(z) > lo {
                parts.push(Part {
                    from,
                    to: m,
                    final_lo: lo,
                    final_hi: clamp(z),
                });
                (lo, from) = (clamp(z), m);
            }
        }
        let hi = if j < z0.len() { clamp(z0[j]) } else { d }.max(lo);
        parts.push(Part {
            from,
            to: j,
            final_lo: lo,
            final_hi: hi,
        });
        steps.push(Step {
            begin: i,
            end: j,
            parts,
        });
        lo = hi;
        i = j;
    }
    if z0.is_empty() && d > 0 {
        steps.push(lead(0, d));
    }
    Schedule {
        ring_in,
        acc_ring,
        steps,
    }
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

    /// Rows of `per_row` windows `step` apart from `first` (the last row pulled back to end at
    /// `d + 2 pb`), in volume coordinates (`pb` planes of padding before).
    fn rows(d: usize, rd: usize, step: usize, per_row: usize, pb: i64) -> Vec<i64> {
        let mut z0 = Vec::new();
        let mut s = 0i64;
        let end = d + 2 * pb as usize;
        loop {
            z0.extend(std::iter::repeat_n(s - pb, per_row));
            if s as usize + rd >= end {
                break;
            }
            s = (s + step as i64).min((end - rd.min(end)) as i64);
        }
        z0
    }

    /// Runs `sc` on a ring of `acc_ring` slots as the pass does (a window's blend adds to
    /// the slots `z % acc_ring` of the planes it covers, a finalisation reads and zeroes them)
    /// and checks: the steps cover the windows in order, in batches of at most `batch`, each
    /// batch's windows blended once, in its parts; no blend lands in a slot holding another
    /// plane; every plane is finalised once, after its last window, with the sum of the
    /// windows covering it; the input ring holds each batch's planes.
    fn emulate(case: &str, z0: &[i64], rd: usize, d: usize, batch: usize, sc: &Schedule) {
        let clamp = |z: i64| z.clamp(0, d as i64) as usize;
        let ring = sc.acc_ring;
        let mut owner = vec![usize::MAX; ring];
        let mut acc = vec![0u64; ring];
        let mut fin = vec![None; d];
        let mut windows = 0;
        for st in &sc.steps {
            assert_eq!(st.begin, windows, "{case}: steps out of order");
            assert!(st.end - st.begin <= batch, "{case}: batch too large");
            let mut from = st.begin;
            for p in &st.parts {
                assert_eq!(p.from, from, "{case}: parts out of order");
                for i in p.from..p.to {
                    assert!(
                        clamp(z0[i] + rd as i64) <= clamp(z0[st.begin]) + sc.ring_in,
                        "{case}: window {i} outside the input ring"
                    );
                    for z in clamp(z0[i])..clamp(z0[i] + rd as i64) {
                        let s = z % ring;
                        assert!(
                            owner[s] == usize::MAX || owner[s] == z,
                            "{case}: window {i} blends plane {z} into plane {}'s slot",
                            owner[s]
                        );
                        owner[s] = z;
                        acc[s] += 1 + i as u64;
                    }
                }
                for z in p.final_lo..p.final_hi {
                    let s = z % ring;
                    assert!(owner[s] == usize::MAX || owner[s] == z, "{case}");
                    assert!(fin[z].is_none(), "{case}: plane {z} finalised twice");
                    fin[z] = Some(acc[s]);
                    (owner[s], acc[s]) = (usize::MAX, 0);
                }
                from = p.to;
            }
            assert_eq!(from, st.end, "{case}: a window not blended");
            windows = st.end;
        }
        assert_eq!(windows, z0.len(), "{case}: windows left");
        for z in 0..d {
            let want: u64 = (0..z0.len())
                .filter(|&i| z0[i] <= z as i64 && (z as i64) < z0[i] + rd as i64)
                .map(|i| 1 + i as u64)
                .sum();
            assert_eq!(fin[z], Some(want), "{case}: plane {z}");
        }
    }

    /// Fixed layouts, W1's among them: every plane finalised once with all its windows, in a
    /// ring of one window's planes at any batch.
    #[test]
    fn schedule_finalises_each_plane_once_after_its_last_window() {
        for (d, rd, batch, step, per_row, pb) in [
            (70usize, 32usize, 3usize, 16usize, 4usize, 0i64),
            (70, 32, 1, 32, 2, 0),
            (20, 32, 4, 32, 3, 6),
            (100, 16, 7, 4, 1, 0),
            (45, 32, 4, 24, 5, 3),
            (512, 128, 4, 64, 7, 0),
            (512, 128, 16, 64, 7, 0),
        ] {
            let z0 = rows(d, rd, step, per_row, pb);
            let sc = schedule(&z0, rd, d, batch);
            let case = format!("d {d} rd {rd} batch {batch} step {step} rows of {per_row}");
            assert!(sc.acc_ring <= rd.min(d), "{case}");
            if pb == 0 {
                assert_eq!(sc.acc_ring, rd.min(d), "{case}");
            }
            emulate(&case, &z0, rd, d, batch, &sc);
        }
    }

    /// Random layouts: the input ring is what the batches need (with rows of windows `step`
    /// apart, batches that fit in `min(d, 2 rd)` planes are never cut; the ring is `rd` at
    /// batch 1 and at most `rd + step` while a batch cannot span three rows); the accumulator
    /// ring is one window's planes; windows starting after plane 0 get their leading planes
    /// finalised first; the emulated blends come out right.
    #[test]
    fn rings_fit_the_batches_and_never_cut_them() {
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
                z0.extend(std::iter::repeat_n(first + (r * step) as i64, per_row));
            }
            let sc = schedule(&z0, rd, d, batch);
            let ring = sc.ring_in;
            let clamp = |z: i64| z.clamp(0, d as i64) as usize;
            assert_eq!(ring, ring_planes(&z0, rd, d, batch));
            assert!(ring <= ring_cap(d, rd) && ring >= 1);
            assert!(sc.acc_ring <= rd.min(d).max(1), "case {case}");
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
            let run: Vec<(usize, usize)> = sc
                .steps
                .iter()
                .filter(|s| s.end > s.begin)
                .map(|s| (s.begin, s.end))
                .collect();
            if widest <= ring_cap(d, rd) {
                assert_eq!(run, chunks, "case {case}: a batch was cut");
            }
            if first > 0 {
                let lead = &sc.steps[0];
                assert_eq!((lead.begin, lead.end), (0, 0), "case {case}");
                assert_eq!(lead.parts[0].final_hi, clamp(first), "case {case}");
            }
            emulate(&format!("case {case}"), &z0, rd, d, batch, &sc);
        }
        // W1: 512 planes, rows of 7 windows 64 apart (the last pulled back to 384).
        let z0: Vec<i64> = (0..7).flat_map(|r| [r * 64; 7]).collect();
        for (batch, ring) in [(1, 128), (2, 192), (4, 192), (8, 192), (15, 256), (16, 256)] {
            assert_eq!(ring_planes(&z0, 128, 512, batch), ring, "batch {batch}");
            assert_eq!(
                schedule(&z0, 128, 512, batch).acc_ring,
                128,
                "batch {batch}"
            );
        }
        // No windows: the whole volume finalised (empty) in one step.
        let sc = schedule(&[], 8, 5, 2);
        assert_eq!(sc.steps.len(), 1);
        assert_eq!(
            (sc.steps[0].parts[0].final_lo, sc.steps[0].parts[0].final_hi),
            (0, 5)
        );
    }
}
