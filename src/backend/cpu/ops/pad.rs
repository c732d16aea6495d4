//! Pad (constant / reflect / edge, negative pads crop) and channel Tile on NCDHW arrays. Both
//! are gathers: every output element reads the input element the op's index map names
//! ([`AxisMap::source`]), so the same code serves every mode; planes run in parallel.

use super::{dims, err, standard, zeroed};
use crate::backend::cpu::Real;
use crate::model::graph::{Pad, Tile};
use crate::model::ops::AxisMap;
use crate::Result;
use ndarray::{Array5, ArrayView5};
use rayon::prelude::*;

/// Source index of every output index along one axis (None: the fill value).
fn table(m: &AxisMap, p: &Pad) -> Vec<Option<usize>> {
    (0..m.out).map(|o| m.source(o, p.mode)).collect()
}

/// `x` padded (or cropped) by `p`.
pub fn pad<T: Real>(x: ArrayView5<T>, p: &Pad) -> Result<Array5<T>> {
    let xs = dims(&x);
    let maps: Vec<AxisMap> = (1..5)
        .map(|a| p.axis(a, xs[a]))
        .collect::<Result<_, _>>()
        .map_err(err)?;
    let [tc, td, th, tw] = [0, 1, 2, 3].map(|i| table(&maps[i], p));
    let os = [xs[0], maps[0].out, maps[1].out, maps[2].out, maps[3].out];
    let x = standard(&x);
    let xd = x
        .as_slice()
        .ok_or_else(|| err("Pad input is not contiguous".into()))?;
    let mut out = zeroed::<T>(os.iter().product(), "the Pad output")?;
    let fill = T::from_f32(p.value);
    let (ip, op) = (xs[2] * xs[3] * xs[4], os[2] * os[3] * os[4]);
    out.par_chunks_mut(op).enumerate().for_each(|(q, y)| {
        let (n, oc) = (q / os[1], q % os[1]);
        let Some(c) = tc[oc] else {
            y.fill(fill);
            return;
        };
        let plane = &xd[(n * xs[1] + c) * ip..][..ip];
        for (od, yd) in y.chunks_mut(os[3] * os[4]).enumerate() {
            for (oh, yh) in yd.chunks_mut(os[4]).enumerate() {
                let (Some(d), Some(h)) = (td[od], th[oh]) else {
                    yh.fill(fill);
                    continue;
                };
                let row = &plane[(d * xs[3] + h) * xs[4]..][..xs[4]];
                for (v, s) in yh.iter_mut().zip(&tw) {
                    *v = s.map_or(fill, |w| row[w]);
                }
            }
        }
    });
    Array5::from_shape_vec(os, out).map_err(|e| err(format!("Pad output: {e}")))
}

/// `x`'s channels repeated `t.repeats` times.
pub fn tile<T: Real>(x: ArrayView5<T>, t: &Tile) -> Result<Array5<T>> {
    let xs = dims(&x);
    let c = t.check(xs[1]).map_err(err)?;
    let os = [xs[0], c, xs[2], xs[3], xs[4]];
    let x = standard(&x);
    let xd = x
        .as_slice()
        .ok_or_else(|| err("Tile input is not contiguous".into()))?;
    let p = xs[2] * xs[3] * xs[4];
    let mut out = zeroed::<T>(os.iter().product(), "the Tile output")?;
    if p == 0 {
        return Array5::from_shape_vec(os, out).map_err(|e| err(format!("Tile output: {e}")));
    }
    out.par_chunks_mut(p).enumerate().for_each(|(q, y)| {
        let (n, oc) = (q / c, q % c);
        y.copy_from_slice(&xd[(n * xs[1] + oc % xs[1]) * p..][..p]);
    });
    Array5::from_shape_vec(os, out).map_err(|e| err(format!("Tile output: {e}")))
}
