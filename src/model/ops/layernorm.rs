//! LayerNormalization: each slice over the axes from `axis` to the end is normalised to zero
//! mean and unit variance, then scaled and shifted elementwise (transformer blocks normalise
//! tokens over their features; ONNX's op, or its ReduceMean/Sub/Pow/Sqrt/Div decomposition).

use super::dims::{norm_axis, Dims};
use super::Tensor;

/// LayerNorm parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerNorm {
    /// First normalised axis (negative counts from the end).
    pub axis: i64,
    /// Added to the variance.
    pub eps: f32,
    /// One per normalised element.
    pub scale: Tensor,
    /// One per normalised element, if any.
    pub bias: Option<Tensor>,
}

impl LayerNorm {
    /// (outer slices, elements per slice) on `x`, parameters checked.
    pub fn split(&self, x: &Dims) -> Result<(usize, usize), String> {
        let a = norm_axis(self.axis, x.rank())?;
        let inner: usize = x.as_slice()[a..].iter().product();
        if self.scale.len() != inner || !self.scale.is_consistent() {
            return Err(format!(
                "LayerNorm scale has {} values but each normalised slice of {x:?} has {inner}",
                self.scale.len()
            ));
        }
        if let Some(b) = &self.bias {
            if b.len() != inner || !b.is_consistent() {
                return Err(format!(
                    "LayerNorm bias has {} values, expected {inner}",
                    b.len()
                ));
            }
        }
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return Err(format!("LayerNorm epsilon {} is invalid", self.eps));
        }
        Ok((x.numel() / inner.max(1), inner))
    }
}
