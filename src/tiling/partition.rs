//! Cutting one axis of a grid into contiguous parts at window origins, exactly.
//!
//! Part `k` owns the planes `[lo, hi)` along the axis; it runs every window that touches them, on
//! a crop of the volume, and keeps only its own planes. Every voxel of a part therefore receives
//! the same windows, in the same grid order, as from the whole grid, so the blended outputs and
//! labels are bitwise the whole grid's. The price: windows near a cut run in both neighbours. The
//! engine cuts D to share a volume among devices, and H into bands run one after another when the
//! accumulators of the whole cross-section do not fit the memory budget.

use super::Grid;

/// One share of a grid along one axis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// Output planes `[lo, hi)` along the axis (volume coordinates) this part is the one to write.
    pub planes: [usize; 2],
    /// Volume planes `[lo, hi)` its windows read: the crop it runs on.
    pub crop: [usize; 2],
    /// Positions `[first, end)` (indices into the grid's distinct origins along the axis) it runs.
    pub positions: [usize; 2],
}

/// Cut `[0, d)` into at most `workers` parts at window origins (`starts`: the distinct origins
/// along the axis, ascending, the first 0; windows are `roi` planes long; `d` the size the
/// windows cover).
///
/// The cuts minimise the largest part (in D positions, so in windows); among the cuts that reach
/// it, the fewest parts (a part that would not shorten the slowest one only adds duplicated
/// windows), then the fewest windows in all. One part when there is one position or one worker.
pub fn partition(starts: &[usize], roi: usize, d: usize, workers: usize) -> Vec<Part> {
    let p = starts.len();
    let whole = || {
        vec![Part {
            planes: [0, d],
            crop: [0, d],
            positions: [0, p],
        }]
    };
    if p <= 1 || workers <= 1 || starts[0] != 0 {
        return whole();
    }
    // Positions i..j owned (planes [s_i, s_j), or up to d for j = p): the part runs positions
    // first(i)..j, first(i) being the first window that reaches plane s_i.
    let first: Vec<usize> = (0..p)
        .map(|i| {
            starts
                .iter()
                .position(|&s| s + roi > starts[i])
                .unwrap_or(i)
        })
        .collect();
    let cost = |i: usize, j: usize| j - first[i];
    let m_max = workers.min(p);
    const INF: usize = usize::MAX;
    // best[m][j]: smallest largest part covering positions 0..j with m parts.
    let mut best = vec![vec![INF; p + 1]; m_max + 1];
    best[0][0] = 0;
    for m in 1..=m_max {
        for j in 1..=p {
            for i in 0..j {
                if best[m - 1][i] != INF {
                    let v = best[m - 1][i].max(cost(i, j));
                    best[m][j] = best[m][j].min(v);
                }
            }
        }
    }
    let target = (1..=m_max).map(|m| best[m][p]).min().unwrap_or(INF);
    let m = (1..=m_max).find(|&m| best[m][p] == target).unwrap_or(1);
    // With m parts and no part above `target`: fewest windows in all, cuts remembered.
    let mut sum = vec![vec![INF; p + 1]; m + 1];
    let mut from = vec![vec![0usize; p + 1]; m + 1];
    sum[0][0] = 0;
    for k in 1..=m {
        for j in 1..=p {
            for i in 0..j {
                if sum[k - 1][i] != INF && cost(i, j) <= target {
                    let v = sum[k - 1][i] + cost(i, j);
                    if v < sum[k][j] {
                        sum[k][j] = v;
                        from[k][j] = i;
                    }
                }
            }
        }
    }
    let mut cuts = vec![p];
    let mut j = p;
    for k in (1..=m).rev() {
        j = from[k][j];
        cuts.push(j);
    }
    cuts.reverse();
    cuts.windows(2)
        .map(|w| {
            let (i, j) = (w[0], w[1]);
            let hi = if j == p { d } else { starts[j] };
            Part {
                planes: [starts[i], hi],
                crop: [starts[first[i]], (starts[j - 1] + roi).min(d)],
                positions: [first[i], j],
            }
        })
        .collect()
}

/// The grid cut to the windows of `part` along `axis`, over the volume's crop `part.crop` (origins
/// re-based to the crop, same order). A whole-volume part returns the grid unchanged (padding
/// included).
pub fn sub_grid(grid: &Grid, axis: usize, part: &Part) -> Grid {
    if part.crop == [0, grid.shape[axis]] {
        return grid.clone();
    }
    let [c0, c1] = part.crop;
    let mut g = grid.clone();
    g.shape[axis] = c1 - c0;
    g.padded[axis] = c1 - c0;
    g.pad_before[axis] = 0;
    g.starts = grid
        .starts
        .iter()
        .filter(|s| s[axis] >= c0 && s[axis] + grid.roi[axis] <= c1)
        .map(|s| {
            let mut s = *s;
            s[axis] -= c0;
            s
        })
        .collect();
    g
}

/// The grid's H axis cut into at most `n` bands by [`partition`] (a band runs the windows over its
/// rows; the engine runs the bands one after another, so the device holds one band's
/// accumulators). Padding along H (one position) gives one band.
pub fn bands(grid: &Grid, n: usize) -> Vec<Part> {
    partition(&grid.origins(1), grid.roi[1], grid.shape[1], n)
}

/// Windows the parts run in all (a window near a cut runs in both neighbours).
pub fn windows_run(grid: &Grid, axis: usize, parts: &[Part]) -> usize {
    let per_position = grid.len() / grid.origins(axis).len().max(1);
    parts
        .iter()
        .map(|p| (p.positions[1] - p.positions[0]) * per_position)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tiling::Placement;

    /// Positions touching planes [lo, hi): the independent definition, window by window.
    fn touching(starts: &[usize], roi: usize, lo: usize, hi: usize) -> Vec<usize> {
        (0..starts.len())
            .filter(|&i| starts[i] < hi && starts[i] + roi > lo)
            .collect()
    }

    fn check(starts: &[usize], roi: usize, d: usize, workers: usize) -> Vec<Part> {
        let parts = partition(starts, roi, d, workers);
        assert!(!parts.is_empty() && parts.len() <= workers.max(1));
        // Contiguous, exact cover of [0, d).
        assert_eq!(parts[0].planes[0], 0);
        assert_eq!(parts.last().unwrap().planes[1], d);
        for w in parts.windows(2) {
            assert_eq!(w[0].planes[1], w[1].planes[0]);
        }
        for p in &parts {
            assert!(p.planes[0] < p.planes[1], "empty part {p:?}");
            // Exactly the windows that touch its planes, and the crop holds them all.
            let want = touching(starts, roi, p.planes[0], p.planes[1]);
            let got: Vec<usize> = (p.positions[0]..p.positions[1]).collect();
            assert_eq!(got, want, "part {p:?}");
            assert_eq!(p.crop[0], starts[want[0]]);
            assert_eq!(p.crop[1], (starts[*want.last().unwrap()] + roi).min(d));
            assert!(p.crop[0] <= p.planes[0] && p.planes[1] <= p.crop[1]);
        }
        parts
    }

    /// The largest part over every way to cut at origins into at most `workers` parts.
    fn brute_best(starts: &[usize], roi: usize, d: usize, workers: usize) -> usize {
        let p = starts.len();
        let mut best = usize::MAX;
        for mask in 0u32..(1 << (p - 1)) {
            if mask.count_ones() as usize + 1 > workers {
                continue;
            }
            let mut bounds = vec![0];
            for (i, &st) in starts.iter().enumerate().skip(1) {
                if mask & (1 << (i - 1)) != 0 {
                    bounds.push(st);
                }
            }
            bounds.push(d);
            let worst = bounds
                .windows(2)
                .map(|b| touching(starts, roi, b[0], b[1]).len())
                .max()
                .unwrap();
            best = best.min(worst);
        }
        best
    }

    #[test]
    fn w1_two_parts_of_four_positions() {
        // 512 planes, roi 128 at stride 64: 7 positions.
        let starts: Vec<usize> = (0..7).map(|i| i * 64).collect();
        let parts = check(&starts, 128, 512, 2);
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].planes, [0, 256]);
        assert_eq!(parts[0].positions, [0, 4]);
        assert_eq!(parts[1].positions, [3, 7]);
        assert_eq!(parts[1].crop, [192, 512]);
    }

    #[test]
    fn cuts_are_optimal_and_cover_exactly() {
        for (roi, stride, d) in [(128, 64, 512), (64, 32, 300), (96, 48, 700), (128, 96, 600)] {
            let grid = Grid::new(
                [d, 8, 8],
                [roi, 8, 8],
                [1.0 - stride as f64 / roi as f64, 0.0, 0.0],
                Placement::Monai,
            )
            .unwrap();
            let starts = grid.origins(0);
            for workers in 1..=6 {
                let parts = check(&starts, roi, d, workers);
                let worst = parts
                    .iter()
                    .map(|p| p.positions[1] - p.positions[0])
                    .max()
                    .unwrap();
                if starts.len() <= 12 {
                    assert_eq!(
                        worst,
                        brute_best(&starts, roi, d, workers),
                        "{starts:?} {workers}"
                    );
                }
                // More workers never make the slowest part slower.
                if workers > 1 {
                    let prev = partition(&starts, roi, d, workers - 1);
                    let pw = prev
                        .iter()
                        .map(|p| p.positions[1] - p.positions[0])
                        .max()
                        .unwrap();
                    assert!(worst <= pw);
                }
            }
        }
    }

    #[test]
    fn more_workers_than_positions_give_fewer_parts() {
        // 3 positions (0, 64, 128) of 128 over 256 planes: 2 parts of 2 already; a third part
        // would not shorten the slowest one.
        let parts = check(&[0, 64, 128], 128, 256, 8);
        assert_eq!(parts.len(), 2);
        // Non-overlapping windows: one part per position.
        let parts = check(&[0, 32, 64], 32, 96, 8);
        assert_eq!(parts.len(), 3);
        // One position: one part whatever the workers.
        assert_eq!(check(&[0], 128, 100, 4).len(), 1);
    }

    #[test]
    fn bands_cut_h_and_keep_the_windows_in_grid_order() {
        // H 1024 at roi 128, stride 64: 15 positions; two bands of 8 positions (576 rows).
        let grid = Grid::new([300, 1024, 40], [64, 128, 32], [0.5; 3], Placement::Monai).unwrap();
        let b = bands(&grid, 2);
        assert_eq!(b.len(), 2);
        assert_eq!(b[0].planes, [0, 512]);
        assert_eq!(b[1].crop, [448, 1024]);
        let per_position = grid.len() / 15;
        assert_eq!(windows_run(&grid, 1, &b), 16 * per_position);
        for p in &b {
            let g = sub_grid(&grid, 1, p);
            assert_eq!(g.shape, [300, p.crop[1] - p.crop[0], 40]);
            let want: Vec<[usize; 3]> = grid
                .starts
                .iter()
                .filter(|st| st[1] < p.planes[1] && st[1] + 128 > p.planes[0])
                .map(|st| [st[0], st[1] - p.crop[0], st[2]])
                .collect();
            assert_eq!(g.starts, want);
        }
        // H thinner than the window: one position, one band, the grid itself.
        let grid = Grid::new([300, 100, 40], [64, 128, 32], [0.5; 3], Placement::Monai).unwrap();
        let b = bands(&grid, 3);
        assert_eq!(b.len(), 1);
        assert_eq!(sub_grid(&grid, 1, &b[0]).starts, grid.starts);
    }
}
