//! Connected components of a label map with 6-connectivity (face neighbours: the cross
//! structuring element, scipy.ndimage.label's default), found by breadth-first search with an
//! explicit queue: linear time, no recursion, so a volume-sized blob cannot overflow the stack.

use crate::sys::alloc::{no_memory, try_vec};
use crate::Result;

/// A box of a volume of `dims` voxels (standard layout: the last axis varies fastest), `lo`
/// inclusive, `hi` exclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// First voxel along each axis.
    pub lo: [usize; 3],
    /// One past the last voxel along each axis.
    pub hi: [usize; 3],
}

impl Region {
    /// The whole volume.
    pub fn whole(dims: [usize; 3]) -> Region {
        Region {
            lo: [0; 3],
            hi: dims,
        }
    }

    /// Voxels along each axis.
    pub fn dims(&self) -> [usize; 3] {
        [0, 1, 2].map(|a| self.hi[a] - self.lo[a])
    }

    /// Voxels in the box.
    pub fn len(&self) -> usize {
        self.dims().iter().product()
    }

    /// Whether the box holds no voxel.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The components of a region: voxels the key function maps to `Some(k)`, each joined to its
/// face neighbours of the same key.
pub struct Components {
    /// Per voxel of the region (its own standard layout): 0 outside every component, else the
    /// component's number, from 1, in the order of each component's first voxel.
    pub id: Vec<u32>,
    /// Voxel count of component `n` at `n - 1`.
    pub size: Vec<u64>,
    /// Key of component `n` at `n - 1`.
    pub key: Vec<u16>,
    /// Whether component `n` (at `n - 1`) touches a face of the region.
    pub border: Vec<bool>,
}

/// The components of `values` (a volume of `dims` voxels, standard layout) inside `region`,
/// voxels grouped by `key` (None: in no component).
pub fn label(
    values: &[u16],
    dims: [usize; 3],
    region: Region,
    key: impl Fn(u16) -> Option<u16>,
) -> Result<Components> {
    let rd = region.dims();
    let len = region.len();
    if u32::try_from(len).is_err() {
        return Err(no_memory(
            "connected components (over 2^32 voxels)",
            len as u128,
        ));
    }
    let global = |x: usize, y: usize, z: usize| {
        ((region.lo[0] + x) * dims[1] + region.lo[1] + y) * dims[2] + region.lo[2] + z
    };
    let mut c = Components {
        id: try_vec(len, 0u32, "connected components")?,
        size: Vec::new(),
        key: Vec::new(),
        border: Vec::new(),
    };
    let mut queue: Vec<u32> = Vec::new();
    let mut start = 0usize;
    for x in 0..rd[0] {
        for y in 0..rd[1] {
            for z in 0..rd[2] {
                let i = start;
                start += 1;
                if c.id[i] != 0 {
                    continue;
                }
                let Some(k) = key(values[global(x, y, z)]) else {
                    continue;
                };
                let n = c.size.len() as u32 + 1;
                let (mut size, mut border) = (0u64, false);
                c.id[i] = n;
                queue.clear();
                push(&mut queue, i as u32)?;
                let mut head = 0;
                while head < queue.len() {
                    let j = queue[head] as usize;
                    head += 1;
                    size += 1;
                    let p = [j / (rd[1] * rd[2]), (j / rd[2]) % rd[1], j % rd[2]];
                    let stride = [rd[1] * rd[2], rd[2], 1];
                    for a in 0..3 {
                        border |= p[a] == 0 || p[a] + 1 == rd[a];
                        for up in [false, true] {
                            let q = match up {
                                false if p[a] > 0 => j - stride[a],
                                true if p[a] + 1 < rd[a] => j + stride[a],
                                _ => continue,
                            };
                            if c.id[q] != 0 {
                                continue;
                            }
                            let mut g = p;
                            g[a] = if up { g[a] + 1 } else { g[a] - 1 };
                            if key(values[global(g[0], g[1], g[2])]) == Some(k) {
                                c.id[q] = n;
                                push(&mut queue, q as u32)?;
                            }
                        }
                    }
                }
                c.size.push(size);
                c.key.push(k);
                c.border.push(border);
            }
        }
    }
    Ok(c)
}

/// Append to the search queue, growing it fallibly (it holds at most one component).
fn push(queue: &mut Vec<u32>, v: u32) -> Result<()> {
    if queue.len() == queue.capacity() {
        let more = queue.len().max(1024);
        queue
            .try_reserve(more)
            .map_err(|_| no_memory("the component search queue", (more * 4) as u128))?;
    }
    queue.push(v);
    Ok(())
}

/// Set to background (0) every voxel of `labels` (a volume of `dims`, standard layout) in a
/// component of a class in `largest` other than that class's largest (ties: the component met
/// first in storage order), or in a component of a class in `min` holding less than `min_voxels`
/// voxels. `largest`, `min`: per label value, whether the rule applies to it. Returns the voxels
/// removed.
pub fn remove(
    labels: &mut [u16],
    dims: [usize; 3],
    largest: &[bool],
    (min, min_voxels): (&[bool], f64),
) -> Result<u64> {
    let on = |set: &[bool], l: u16| set.get(l as usize).copied().unwrap_or(false);
    let c = label(labels, dims, Region::whole(dims), |l| {
        (l != 0 && (on(largest, l) || on(min, l))).then_some(l)
    })?;
    // The largest component of each key: (size, number).
    let mut best: Vec<(u64, u32)> = vec![(0, 0); 1 << 16];
    for (i, (&s, &k)) in c.size.iter().zip(&c.key).enumerate() {
        if s > best[k as usize].0 {
            best[k as usize] = (s, i as u32 + 1);
        }
    }
    let drop: Vec<bool> = (0..c.size.len())
        .map(|i| {
            let k = c.key[i];
            (on(largest, k) && best[k as usize].1 != i as u32 + 1)
                || (on(min, k) && (c.size[i] as f64) < min_voxels)
        })
        .collect();
    let mut removed = 0;
    for (l, &n) in labels.iter_mut().zip(&c.id) {
        if n != 0 && drop[n as usize - 1] {
            *l = 0;
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A tiny xorshift generator for random test volumes.
    pub(crate) struct Rng(pub u64);
    impl Rng {
        pub(crate) fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
        /// A random label volume of random small dims with values below `classes`.
        pub(crate) fn volume(&mut self, classes: u64) -> (Vec<u16>, [usize; 3]) {
            let dims = [0; 3].map(|_| 1 + self.below(7) as usize);
            let n = dims.iter().product();
            ((0..n).map(|_| self.below(classes) as u16).collect(), dims)
        }
    }

    /// The face neighbours of flat index `i`, by coordinates (independent of the search).
    pub(crate) fn neighbours(i: usize, d: [usize; 3]) -> Vec<usize> {
        let p = [i / (d[1] * d[2]), (i / d[2]) % d[1], i % d[2]];
        let mut v = Vec::new();
        for a in 0..3 {
            for delta in [-1i64, 1] {
                let mut q = p.map(|c| c as i64);
                q[a] += delta;
                if (0..3).all(|b| q[b] >= 0 && q[b] < d[b] as i64) {
                    v.push(((q[0] as usize) * d[1] + q[1] as usize) * d[2] + q[2] as usize);
                }
            }
        }
        v
    }

    /// Brute force: every voxel in a component takes the smallest index of its component, by
    /// relaxation until nothing changes (None: in no component).
    pub(crate) fn brute_ids(
        v: &[u16],
        d: [usize; 3],
        key: impl Fn(u16) -> Option<u16>,
    ) -> Vec<Option<usize>> {
        let mut id: Vec<Option<usize>> = (0..v.len()).map(|i| key(v[i]).map(|_| i)).collect();
        loop {
            let mut changed = false;
            for i in 0..v.len() {
                for j in neighbours(i, d) {
                    if id[i].is_some() && key(v[i]) == key(v[j]) && id[j] < id[i] {
                        id[i] = id[j];
                        changed = true;
                    }
                }
            }
            if !changed {
                return id;
            }
        }
    }

    #[test]
    fn components_match_brute_force_partition() {
        let mut rng = Rng(0x9e3779b97f4a7c15);
        for _ in 0..200 {
            let (v, d) = rng.volume(3);
            let key = |l: u16| (l != 0).then_some(l);
            let c = label(&v, d, Region::whole(d), key).unwrap();
            let b = brute_ids(&v, d, key);
            for i in 0..v.len() {
                for j in 0..v.len() {
                    let same = c.id[i] != 0 && c.id[i] == c.id[j];
                    assert_eq!(same, b[i].is_some() && b[i] == b[j], "{d:?} {v:?}");
                }
                if c.id[i] != 0 {
                    let n = c.id[i] as usize - 1;
                    let size = b.iter().filter(|&&x| x == b[i]).count() as u64;
                    assert_eq!(c.size[n], size);
                    assert_eq!(c.key[n], v[i]);
                }
            }
        }
    }

    /// Brute-force keep-largest and minimum size, from [`brute_ids`].
    fn brute_remove(v: &[u16], d: [usize; 3], largest: &[bool], min: (&[bool], f64)) -> Vec<u16> {
        let b = brute_ids(v, d, |l| (l != 0).then_some(l));
        let size = |id: usize| b.iter().filter(|&&x| x == Some(id)).count();
        (0..v.len())
            .map(|i| {
                let Some(id) = b[i] else { return v[i] };
                let l = v[i] as usize;
                // The largest of the class: most voxels, then the smallest first index.
                let best = (0..v.len())
                    .filter(|&j| v[j] as usize == l && b[j] == Some(j))
                    .max_by_key(|&j| (size(j), std::cmp::Reverse(j)))
                    .unwrap();
                let gone = (largest[l] && best != id) || (min.0[l] && (size(id) as f64) < min.1);
                if gone {
                    0
                } else {
                    v[i]
                }
            })
            .collect()
    }

    #[test]
    fn keep_largest_and_min_size_match_brute_force() {
        let mut rng = Rng(12345);
        for t in 0..300 {
            let (v, d) = rng.volume(4);
            let largest = [false, t % 2 == 0, true, false];
            let min = [false, true, t % 3 == 0, true];
            let min_voxels = rng.below(5) as f64;
            let mut got = v.clone();
            let removed = remove(&mut got, d, &largest, (&min, min_voxels)).unwrap();
            let want = brute_remove(&v, d, &largest, (&min, min_voxels));
            assert_eq!(got, want, "{d:?} {v:?}");
            let changed = v.iter().zip(&want).filter(|(a, b)| a != b).count() as u64;
            assert_eq!(removed, changed);
        }
    }

    #[test]
    fn a_volume_sized_component_needs_no_recursion() {
        let d = [64, 64, 64];
        let mut v = vec![1u16; d.iter().product()];
        let c = label(&v, d, Region::whole(d), Some).unwrap();
        assert_eq!(c.size, vec![v.len() as u64]);
        v[0] = 2;
        let removed = remove(&mut v, d, &[false, true, true], (&[], 0.0)).unwrap();
        assert_eq!(removed, 0, "a single voxel is the largest of its class");
    }

    #[test]
    fn a_refused_allocation_is_an_error() {
        crate::sys::alloc::fail_above(1000);
        let d = [20, 20, 20];
        let r = label(&vec![1u16; 8000], d, Region::whole(d), Some);
        crate::sys::alloc::fail_above(usize::MAX);
        let e = r.err().expect("refused").to_string();
        assert!(
            e.contains("not enough memory for connected components"),
            "{e}"
        );
    }
}
