//! Fused scaled dot-product attention: `softmax(scale · q @ kᵀ + bias + mask) @ v` over the last axis,
//! one op for the whole MatMul / scale / bias / Softmax / MatMul chain of transformer blocks
//! (UNETR's global self-attention, SwinUNETR's window attention with its relative-position bias
//! and shifted-window mask) so that backends never store the `[..., T, S]` scores.

use super::dims::Dims;
use super::matmul::broadcast_lead;
use super::Tensor;

/// Attention parameters. Inputs: q `[..., T, d]`, k `[..., S, d]` (not transposed), v
/// `[..., S, dv]`, all of one rank >= 3, leading dims broadcast; output `[..., T, dv]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Attention {
    /// Multiplies `q @ kᵀ` before the bias is added.
    pub scale: f32,
    /// Added to the scaled scores `[..., T, S]` before the softmax: same rank as the scores,
    /// each dim 1 or equal (a relative-position bias, or every additive term summed). A leading
    /// dim may also divide the scores' and repeats along it (index modulo its size): a graph
    /// rewritten for any batch keeps its per-window mask `[nW, ...]` against scores whose
    /// leading axis is `batch · nW` (`passes::batch`).
    pub bias: Option<Tensor>,
    /// A second additive term of another broadcast shape (Swin's shifted-window mask, per
    /// window but not per head), kept apart from `bias` so that neither is materialised at
    /// their common shape (`windows · heads · T · S` values).
    pub mask: Option<Tensor>,
}

/// The shapes of one attention: leading (broadcast) dims and the matrix sizes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttnDims {
    /// The broadcast leading dims (the output's, without `[T, dv]`).
    pub lead: Vec<usize>,
    /// Query rows.
    pub t: usize,
    /// Key / value rows.
    pub s: usize,
    /// Query / key features.
    pub d: usize,
    /// Value features.
    pub dv: usize,
}

impl AttnDims {
    /// The scores' dims `[lead..., T, S]`.
    pub fn scores(&self) -> Vec<usize> {
        let mut o = self.lead.clone();
        o.extend([self.t, self.s]);
        o
    }
    /// The output's dims `[lead..., T, dv]`.
    pub fn output(&self) -> Result<Dims, String> {
        let mut o = self.lead.clone();
        o.extend([self.t, self.dv]);
        Dims::new(&o)
    }
}

impl Attention {
    /// The shapes of the attention of `q`, `k`, `v`, parameters checked.
    pub fn split(&self, q: &Dims, k: &Dims, v: &Dims) -> Result<AttnDims, String> {
        let r = q.rank();
        if r < 3 || k.rank() != r || v.rank() != r {
            return Err(format!(
                "Attention needs q, k, v of one rank >= 3, got {q:?}, {k:?}, {v:?}"
            ));
        }
        let (t, d, s, dk, sv, dv) = (q[r - 2], q[r - 1], k[r - 2], k[r - 1], v[r - 2], v[r - 1]);
        if d != dk || s != sv {
            return Err(format!(
                "Attention of q {q:?}, k {k:?}, v {v:?}: q and k need equal features, k and v equal rows"
            ));
        }
        let lead = broadcast_lead(&q.as_slice()[..r - 2], &k.as_slice()[..r - 2])
            .and_then(|l| broadcast_lead(&l, &v.as_slice()[..r - 2]))
            .ok_or_else(|| {
                format!("Attention of {q:?}, {k:?}, {v:?}: leading dims do not broadcast")
            })?;
        let a = AttnDims { lead, t, s, d, dv };
        if !self.scale.is_finite() {
            return Err(format!("Attention scale {} is not finite", self.scale));
        }
        let sc = a.scores();
        let lead = sc.len() - 2;
        for (name, b) in self.terms() {
            let fits = |(i, (&x, &y)): (usize, (&usize, &usize))| {
                x == 1 || x == y || (i < lead && x > 0 && y.is_multiple_of(x))
            };
            let ok = b.shape.len() == sc.len()
                && b.is_consistent()
                && b.shape.iter().zip(&sc).enumerate().all(fits);
            if !ok {
                return Err(format!(
                    "Attention {name} of shape {:?} does not broadcast to the scores {sc:?}",
                    b.shape
                ));
            }
        }
        Ok(a)
    }

    /// The additive terms present, named: `bias`, then `mask`.
    pub fn terms(&self) -> impl Iterator<Item = (&'static str, &Tensor)> {
        [("bias", &self.bias), ("mask", &self.mask)]
            .into_iter()
            .filter_map(|(n, t)| t.as_ref().map(|t| (n, t)))
    }

    /// Constant values held (both terms).
    pub fn constants(&self) -> usize {
        self.terms().map(|(_, t)| t.len()).sum()
    }

    /// Output dims on `q`, `k`, `v`.
    pub fn output_dims(&self, q: &Dims, k: &Dims, v: &Dims) -> Result<Dims, String> {
        self.split(q, k, v)?.output()
    }

    /// Floating point operations given q's dims and the output's: both products (2·T·S·(d+dv))
    /// and ~5 per score for the softmax. S is read from a bias term when one has it, else taken as T
    /// (self-attention, what UNETR and SwinUNETR compute).
    pub fn flops(&self, q: &Dims, out: &Dims) -> u64 {
        let r = q.rank();
        if r < 2 || out.rank() != r {
            return 0;
        }
        let t = q[r - 2] as u64;
        let s = self
            .terms()
            .find_map(|(_, b)| b.shape.last().copied().filter(|&s| s > 1))
            .map_or(t, |s| s as u64);
        let (d, dv) = (q[r - 1] as u64, out[r - 1] as u64);
        let lead: u64 = out.as_slice()[..r - 2].iter().map(|&x| x as u64).product();
        lead * t * s * (2 * (d + dv) + 5)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let d = |s: &[usize]| Dims::new(s).unwrap();
        let a = Attention {
            scale: 0.5,
            bias: None,
            mask: None,
        };
        assert_eq!(
            a.output_dims(&d(&[2, 4, 7, 8]), &d(&[1, 4, 9, 8]), &d(&[2, 1, 9, 5])),
            Ok(d(&[2, 4, 7, 5]))
        );
        assert!(a
            .output_dims(&d(&[4, 7, 8]), &d(&[4, 9, 6]), &d(&[4, 9, 5]))
            .is_err());
        assert!(a
            .output_dims(&d(&[7, 8]), &d(&[9, 8]), &d(&[9, 5]))
            .is_err());
        let mut b = Attention {
            scale: 1.0,
            bias: Some(Tensor::new(vec![1, 4, 7, 9], vec![0.0; 252])),
            mask: Some(Tensor::new(vec![2, 1, 7, 9], vec![0.0; 126])),
        };
        assert!(b
            .output_dims(&d(&[2, 4, 7, 8]), &d(&[2, 4, 9, 8]), &d(&[2, 4, 9, 8]))
            .is_ok());
        assert!(b
            .output_dims(&d(&[2, 4, 7, 8]), &d(&[2, 4, 8, 8]), &d(&[2, 4, 8, 8]))
            .is_err());
        assert_eq!(b.constants(), 378);
        b.mask = Some(Tensor::new(vec![3, 1, 7, 9], vec![0.0; 189]));
        let e = b
            .output_dims(&d(&[2, 4, 7, 8]), &d(&[2, 4, 9, 8]), &d(&[2, 4, 9, 8]))
            .unwrap_err();
        assert!(e.contains("mask"), "{e}");
        // A leading dim that divides the scores' repeats (2 windows against 2 · 2 rows); T and
        // S do not.
        b.mask = Some(Tensor::new(vec![2, 1, 7, 9], vec![0.0; 126]));
        let (q4, k4) = (d(&[4, 4, 7, 8]), d(&[4, 4, 9, 8]));
        assert!(b.output_dims(&q4, &k4, &k4).is_ok());
        b.mask = Some(Tensor::new(vec![1, 1, 7, 3], vec![0.0; 21]));
        assert!(b.output_dims(&q4, &k4, &k4).is_err());
    }
}
