//! LayerNormalization over the trailing axes: statistics as the other norms take them (two-pass,
//! in f64, eps inside the square root), then the elementwise scale and bias, also in f64.

use super::norm::stats;
use super::{err, Real};
use crate::model::graph::LayerNorm;
use crate::model::ops::Dims;
use crate::Result;
use rayon::prelude::*;

/// `l` on `x` (dims `xd`), as a new row-major buffer.
pub fn layer_norm<T: Real>(l: &LayerNorm, x: &[T], xd: Dims) -> Result<Vec<T>> {
    let (_, inner) = l.split(&xd).map_err(err)?;
    if x.len() != xd.numel() || inner == 0 {
        return Err(err(format!(
            "LayerNormalization of {} values as {xd:?}",
            x.len()
        )));
    }
    let scale = T::cast_slice(&l.scale.data);
    let bias = l.bias.as_ref().map(|b| T::cast_slice(&b.data));
    let mut y = crate::sys::alloc::try_with_capacity(x.len(), "a LayerNormalization output")
        .map_err(crate::sys::alloc::retryable)?;
    y.extend_from_slice(x);
    y.par_chunks_mut(inner)
        .with_min_len((4096 / inner).max(1))
        .for_each(|row| {
            let (mean, inv) = stats(row, l.eps);
            // In f64, rounded once: the slices are short (features), so the f32 mean's rounding
            // would show against a small spread.
            for (j, v) in row.iter_mut().enumerate() {
                let b = bias.as_ref().map_or(0.0, |b| b[j].to_f64());
                *v = T::from_f64((v.to_f64() - mean) * inv * scale[j].to_f64() + b);
            }
        });
    Ok(y)
}
