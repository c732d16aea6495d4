//! Filling enclosed holes, per class (scipy.ndimage.binary_fill_holes on the class's mask, with
//! the same 6-connectivity): background voxels that cannot reach the volume's border without
//! crossing the class become that class. Voxels of other classes are left as they are.

use super::components::{label, Region};
use crate::Result;

/// The first and last voxel (inclusive, per axis) of each label value (None: absent), in one
/// pass.
fn boxes(labels: &[u16], dims: [usize; 3]) -> Vec<Option<[[usize; 3]; 2]>> {
    let mut b: Vec<Option<[[usize; 3]; 2]>> = vec![None; 1 << 16];
    let mut i = 0;
    for x in 0..dims[0] {
        for y in 0..dims[1] {
            for z in 0..dims[2] {
                let p = [x, y, z];
                let [lo, hi] = b[labels[i] as usize].get_or_insert([p, p]);
                for (a, &c) in p.iter().enumerate() {
                    lo[a] = lo[a].min(c);
                    hi[a] = hi[a].max(c);
                }
                i += 1;
            }
        }
    }
    b
}

/// Fill the holes of every class in `classes` (per label value: whether it applies), in label
/// order (a background voxel enclosed by two classes goes to the lower one). Returns the
/// voxels filled.
///
/// Each class is searched only in its bounding box grown by one voxel: every voxel outside the
/// box reaches the border in a straight line without meeting the class, so a region of the box
/// that touches the box's faces is not enclosed.
pub fn fill(labels: &mut [u16], dims: [usize; 3], classes: &[bool]) -> Result<u64> {
    let boxes = boxes(labels, dims);
    let mut filled = 0;
    for (c, b) in boxes.iter().enumerate().skip(1) {
        let (Some([first, last]), true) = (b, classes.get(c).copied().unwrap_or(false)) else {
            continue;
        };
        let region = Region {
            lo: first.map(|v| v.saturating_sub(1)),
            hi: [0, 1, 2].map(|a| (last[a] + 2).min(dims[a])),
        };
        let c = c as u16;
        let comps = label(labels, dims, region, |l| (l != c).then_some(0))?;
        let rd = region.dims();
        let mut i = 0;
        for x in 0..rd[0] {
            for y in 0..rd[1] {
                for z in 0..rd[2] {
                    let n = comps.id[i];
                    i += 1;
                    if n == 0 || comps.border[n as usize - 1] {
                        continue;
                    }
                    let g = ((region.lo[0] + x) * dims[1] + region.lo[1] + y) * dims[2]
                        + region.lo[2]
                        + z;
                    if labels[g] == 0 {
                        labels[g] = c;
                        filled += 1;
                    }
                }
            }
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::super::components::tests::{neighbours, Rng};
    use super::*;

    /// Brute force on the whole volume: the voxels not of class `c` that reach the border
    /// through voxels not of `c`, by relaxation; every other background voxel becomes `c`.
    fn brute_fill(v: &[u16], d: [usize; 3], classes: &[bool]) -> Vec<u16> {
        let mut out = v.to_vec();
        for c in 1..classes.len() as u16 {
            if !classes[c as usize] {
                continue;
            }
            let on_border = |i: usize| neighbours(i, d).len() < 6;
            let mut open: Vec<bool> = (0..v.len()).map(|i| out[i] != c && on_border(i)).collect();
            loop {
                let mut changed = false;
                for i in 0..v.len() {
                    if !open[i] && out[i] != c && neighbours(i, d).iter().any(|&j| open[j]) {
                        open[i] = true;
                        changed = true;
                    }
                }
                if !changed {
                    break;
                }
            }
            for i in 0..v.len() {
                if !open[i] && out[i] == 0 {
                    out[i] = c;
                }
            }
        }
        out
    }

    #[test]
    fn fill_matches_brute_force() {
        let mut rng = Rng(0xdeadbeef);
        let mut some = 0;
        for t in 0..400 {
            let (v, d) = rng.volume(if t % 2 == 0 { 2 } else { 3 });
            let classes = [false, true, t % 3 != 0];
            let mut got = v.clone();
            let filled = fill(&mut got, d, &classes).unwrap();
            let want = brute_fill(&v, d, &classes);
            assert_eq!(got, want, "{d:?} {v:?}");
            assert_eq!(
                filled,
                v.iter().zip(&want).filter(|(a, b)| a != b).count() as u64
            );
            some += filled;
        }
        assert!(some > 0, "the random volumes must hold some holes");
    }

    #[test]
    fn a_shell_is_filled_and_an_open_cup_is_not() {
        let d = [7, 7, 7];
        let idx = |x: usize, y: usize, z: usize| (x * 7 + y) * 7 + z;
        let mut v = vec![0u16; 343];
        for x in 1..6 {
            for y in 1..6 {
                for z in 1..6 {
                    v[idx(x, y, z)] = 1;
                }
            }
        }
        v[idx(3, 3, 3)] = 0;
        v[idx(2, 3, 3)] = 2; // another class inside stays
        let mut shell = v.clone();
        assert_eq!(fill(&mut shell, d, &[false, true]).unwrap(), 1);
        assert_eq!((shell[idx(3, 3, 3)], shell[idx(2, 3, 3)]), (1, 2));
        v[idx(3, 3, 4)] = 0;
        v[idx(3, 3, 5)] = 0; // a channel to the outside
        let mut cup = v.clone();
        assert_eq!(fill(&mut cup, d, &[false, true]).unwrap(), 0);
        assert_eq!(cup, v);
    }
}
