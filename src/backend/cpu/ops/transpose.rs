//! Transpose of row-major data of any rank. Unit axes are dropped and axes that stay adjacent
//! are merged first (an attention head split or a window partition usually becomes a 2D or 3D
//! problem). When the innermost axis stays innermost the output is a gather of contiguous runs;
//! otherwise the output is written in cache tiles (rows along the input's contiguous axis,
//! columns along the output's), split into tasks over rows and, when rows are few, over column
//! pieces, so a 100M-element NDHWC -> NCDHW is memory bound on every core.

use super::{err, Real};
use crate::Result;
use rayon::prelude::*;

/// Rows (along the input's contiguous axis) and columns of one cache tile.
const TILE: usize = 32;
/// Elements per task at least (below this, rayon's overhead shows).
const GRAIN: usize = 1 << 14;

/// Row-major strides of `d`.
fn strides(d: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; d.len()];
    for a in (0..d.len().saturating_sub(1)).rev() {
        s[a] = s[a + 1] * d[a + 1];
    }
    s
}

/// The same transpose on fewer axes: unit axes dropped, output-adjacent runs of consecutive
/// input axes merged. Returns (input dims, perm).
fn simplify(d: &[usize], perm: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let mut id = vec![usize::MAX; d.len()];
    let kept: Vec<usize> = (0..d.len()).filter(|&a| d[a] > 1).collect();
    for (i, &a) in kept.iter().enumerate() {
        id[a] = i;
    }
    let p: Vec<usize> = perm.iter().filter(|&&a| d[a] > 1).map(|&a| id[a]).collect();
    // Runs (first input axis, length) in output order.
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &a in &p {
        match runs.last_mut() {
            Some(r) if r.0 + r.1 == a => r.1 += 1,
            _ => runs.push((a, 1)),
        }
    }
    let mut order: Vec<usize> = (0..runs.len()).collect();
    order.sort_by_key(|&r| runs[r].0);
    let dims = order
        .iter()
        .map(|&r| {
            kept[runs[r].0..runs[r].0 + runs[r].1]
                .iter()
                .map(|&a| d[a])
                .product()
        })
        .collect();
    let mut pos = vec![0usize; runs.len()];
    for (j, &r) in order.iter().enumerate() {
        pos[r] = j;
    }
    (dims, pos)
}

/// Offset in the input of the output multi-index `idx` (row-major number `i` over `od`), with
/// `st` the input stride of each output axis.
#[inline]
fn offset(mut i: usize, od: &[usize], st: &[usize]) -> usize {
    let mut off = 0;
    for a in (0..od.len()).rev() {
        off += (i % od[a]) * st[a];
        i /= od[a];
    }
    off
}

/// `y` ← `x` (dims `d`, row-major) with output axis `i` being input axis `perm[i]`.
pub fn transpose<T: Real>(x: &[T], d: &[usize], perm: &[usize], y: &mut [T]) -> Result<()> {
    let n: usize = d.iter().product();
    if perm.len() != d.len() || x.len() != n || y.len() != n {
        return Err(err(format!(
            "Transpose of {} values as {d:?} by {perm:?} into {} values",
            x.len(),
            y.len()
        )));
    }
    crate::model::ops::check_perm(perm).map_err(err)?;
    let (id, p) = simplify(d, perm);
    let r = id.len();
    if r <= 1 {
        y.par_chunks_mut(GRAIN)
            .zip(x.par_chunks(GRAIN))
            .for_each(|(a, b)| a.copy_from_slice(b));
        return Ok(());
    }
    let is = strides(&id);
    let od: Vec<usize> = p.iter().map(|&a| id[a]).collect();
    let st: Vec<usize> = p.iter().map(|&a| is[a]).collect();
    if p[r - 1] == r - 1 {
        // The innermost axis stays: copy contiguous runs.
        let inner = od[r - 1];
        y.par_chunks_mut(inner)
            .with_min_len((GRAIN / inner).max(1))
            .enumerate()
            .for_each(|(row, dst)| {
                let o = offset(row, &od[..r - 1], &st[..r - 1]);
                dst.copy_from_slice(&x[o..o + inner]);
            });
        return Ok(());
    }
    tiled(x, &od, &st, &p, y);
    Ok(())
}

/// Geometry of a tiled transpose: output axis `q` walks the input's contiguous axis, the output's
/// last axis (`ncol` long) reads input stride `sa`; axes between them are "mid" axes.
struct Geom<'a> {
    od: &'a [usize],
    st: &'a [usize],
    q: usize,
    ncol: usize,
    sa: usize,
}

impl Geom<'_> {
    /// Input offset of mid index `m` (row-major over output axes q+1..r-1).
    fn mid(&self, m: usize) -> usize {
        let r = self.od.len();
        offset(m, &self.od[self.q + 1..r - 1], &self.st[self.q + 1..r - 1])
    }

    /// Fills `rows` (output rows i0.. of one tile, each the same flat range of (mid, column)
    /// starting at `f0`) from the input at `base`.
    fn fill<T: Real>(&self, x: &[T], base: usize, i0: usize, f0: usize, rows: &mut [&mut [T]]) {
        let len = rows.first().map_or(0, |r| r.len());
        let mut f = f0;
        while f < f0 + len {
            let (m, j0) = (f / self.ncol, f % self.ncol);
            let j1 = self.ncol.min(j0 + (f0 + len - f));
            let mid = base + self.mid(m);
            let mut jb = j0;
            while jb < j1 {
                let je = (jb + TILE).min(j1);
                for (ii, row) in rows.iter_mut().enumerate() {
                    let src = mid + i0 + ii + jb * self.sa;
                    let dst = &mut row[f - f0 + jb - j0..f - f0 + je - j0];
                    for (jj, v) in dst.iter_mut().enumerate() {
                        *v = x[src + jj * self.sa];
                    }
                }
                jb = je;
            }
            f += j1 - j0;
        }
    }
}

/// The transpose whose innermost output axis is not the input's: cache tiles of TILE rows of
/// output axis `q` (contiguous in the input) by TILE columns.
fn tiled<T: Real>(x: &[T], od: &[usize], st: &[usize], p: &[usize], y: &mut [T]) {
    let r = od.len();
    let q = p.iter().position(|&a| a == r - 1).unwrap_or(0);
    let os = strides(od);
    let g = Geom {
        od,
        st,
        q,
        ncol: od[r - 1],
        sa: st[r - 1],
    };
    let block = od[q] * os[q];
    let tiles = y.len() / block * od[q].div_ceil(TILE);
    // Few tiles (a short contiguous input axis): split each tile's rows into column pieces too.
    let piece = if tiles >= 4 * rayon::current_num_threads() {
        os[q]
    } else {
        (GRAIN / TILE).max(1).min(os[q])
    };
    y.par_chunks_mut(block).enumerate().for_each(|(c, blk)| {
        let base = offset(c, &od[..q], &st[..q]);
        blk.par_chunks_mut(TILE * os[q])
            .enumerate()
            .for_each(|(t, tile)| {
                let i0 = t * TILE;
                if piece == os[q] {
                    let mut rows: Vec<&mut [T]> = tile.chunks_mut(os[q]).collect();
                    g.fill(x, base, i0, 0, &mut rows);
                    return;
                }
                let mut groups: Vec<Vec<&mut [T]>> = Vec::new();
                for row in tile.chunks_mut(os[q]) {
                    for (k, seg) in row.chunks_mut(piece).enumerate() {
                        if groups.len() <= k {
                            groups.push(Vec::new());
                        }
                        groups[k].push(seg);
                    }
                }
                groups
                    .into_par_iter()
                    .enumerate()
                    .for_each(|(k, mut rows)| g.fill(x, base, i0, k * piece, &mut rows));
            });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simplify_merges_and_drops() {
        // [2,1,3,4] by (0,2,3,1): the unit axis goes, axes 2,3 stay adjacent -> [2,12] identity.
        assert_eq!(simplify(&[2, 1, 3, 4], &[0, 2, 3, 1]), (vec![24], vec![0]));
        assert_eq!(simplify(&[2, 3, 4], &[2, 0, 1]), (vec![6, 4], vec![1, 0]));
        assert_eq!(
            simplify(&[2, 3, 4, 5], &[0, 2, 1, 3]),
            (vec![2, 3, 4, 5], vec![0, 2, 1, 3])
        );
    }
}
