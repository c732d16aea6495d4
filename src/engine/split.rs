//! Splitting one volume's windows across several devices, exactly.
//!
//! The output planes along the slab axis D are cut into contiguous parts at window origins; part
//! `k` runs every window that touches its planes, on a D-crop of the volume, and keeps only its
//! planes. Every voxel of part `k` therefore receives the same windows, in the same (D-major)
//! order, as on one device, so the blended outputs and labels are bitwise the single-device ones.
//! The price: windows near a cut are computed by both neighbours (see [`Split::windows_run`]).

use crate::tiling::Grid;

/// One device's share of a grid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// Output planes `[lo, hi)` (volume D coordinates) this part is the one to write.
    pub planes: [usize; 2],
    /// Volume planes `[lo, hi)` its windows read: the D-crop it runs on.
    pub crop: [usize; 2],
    /// D positions `[first, end)` (indices into the grid's distinct D origins) it runs.
    pub positions: [usize; 2],
}

/// How a grid is shared: the parts, in D order, and what sharing costs.
#[derive(Clone, Debug)]
pub struct Split {
    /// Each device's share, in D order.
    pub parts: Vec<Part>,
    /// Windows per D position (the H × W positions of the grid).
    pub per_position: usize,
}

impl Split {
    /// Windows part `k` runs.
    pub fn windows(&self, k: usize) -> usize {
        let p = &self.parts[k].positions;
        (p[1] - p[0]) * self.per_position
    }
    /// Windows run over all parts (the grid's count plus the ones computed twice).
    pub fn windows_run(&self) -> usize {
        (0..self.parts.len()).map(|k| self.windows(k)).sum()
    }
}

/// Cut `[0, d)` into at most `workers` parts at window origins (`starts`: the distinct D origins,
/// ascending, the first 0; windows are `roi` planes long; `d` the D size the windows cover).
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

/// Share `grid` among `workers`. Padding along D (a volume thinner than the window) means one D
/// position, hence one part: the whole grid.
pub fn split(grid: &Grid, workers: usize) -> Split {
    let starts = grid.d_origins();
    let per_position = grid.len() / starts.len().max(1);
    Split {
        parts: partition(&starts, grid.roi[0], grid.shape[0], workers),
        per_position,
    }
}

/// The grid part `part` runs, over the volume's D-crop `part.crop` (origins re-based to the crop,
/// same order). A whole-volume part returns the grid unchanged (padding included).
pub fn sub_grid(grid: &Grid, part: &Part) -> Grid {
    if part.crop == [0, grid.shape[0]] {
        return grid.clone();
    }
    let [c0, c1] = part.crop;
    let mut g = grid.clone();
    g.shape[0] = c1 - c0;
    g.padded[0] = c1 - c0;
    g.pad_before[0] = 0;
    g.starts = grid
        .starts
        .iter()
        .filter(|s| s[0] >= c0 && s[0] + grid.roi[0] <= c1)
        .map(|s| [s[0] - c0, s[1], s[2]])
        .collect();
    g
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
            let starts = grid.d_origins();
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
    fn sub_grid_keeps_the_windows_and_their_order() {
        let grid = Grid::new([300, 40, 20], [64, 32, 32], [0.5; 3], Placement::NnUnet).unwrap();
        let s = split(&grid, 3);
        assert_eq!(s.parts.len(), 3);
        for (seen, p) in s.parts.iter().enumerate() {
            let g = sub_grid(&grid, p);
            assert_eq!(g.shape, [p.crop[1] - p.crop[0], 40, 20]);
            assert_eq!(g.padded[1..], grid.padded[1..]);
            assert_eq!(g.pad_before, [0, grid.pad_before[1], grid.pad_before[2]]);
            let want: Vec<[usize; 3]> = grid
                .starts
                .iter()
                .filter(|st| st[0] < p.planes[1] && st[0] + 64 > p.planes[0])
                .map(|st| [st[0] - p.crop[0], st[1], st[2]])
                .collect();
            assert_eq!(g.starts, want);
            assert_eq!(g.len(), s.windows(seen));
        }
        assert!(s.windows_run() > grid.len());
        // Padding along D (100 planes, roi 128): one part, the grid itself.
        let grid = Grid::new([100, 40, 20], [128, 32, 32], [0.5; 3], Placement::Monai).unwrap();
        let s = split(&grid, 4);
        assert_eq!(s.parts.len(), 1);
        assert_eq!(sub_grid(&grid, &s.parts[0]).starts, grid.starts);
    }
}
