//! Sharing one volume's windows among several devices, exactly: the output planes along D are cut
//! at window origins ([`crate::tiling::partition`]), part `k` runs on device `k` over its D-crop
//! of the volume and keeps only its own planes, so the outputs are bitwise the single-device ones.

use crate::tiling::{partition, Grid, Part};

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

/// Share `grid` among `workers`. Padding along D (a volume thinner than the window) means one D
/// position, hence one part: the whole grid.
pub fn split(grid: &Grid, workers: usize) -> Split {
    let starts = grid.origins(0);
    let per_position = grid.len() / starts.len().max(1);
    Split {
        parts: partition(&starts, grid.roi[0], grid.shape[0], workers),
        per_position,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tiling::{sub_grid, Placement};

    #[test]
    fn sub_grid_keeps_the_windows_and_their_order() {
        let grid = Grid::new([300, 40, 20], [64, 32, 32], [0.5; 3], Placement::NnUnet).unwrap();
        let s = split(&grid, 3);
        assert_eq!(s.parts.len(), 3);
        for (seen, p) in s.parts.iter().enumerate() {
            let g = sub_grid(&grid, 0, p);
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
        assert_eq!(sub_grid(&grid, 0, &s.parts[0]).starts, grid.starts);
    }
}
