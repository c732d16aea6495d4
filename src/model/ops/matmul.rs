//! Matrix products on activations: `MatMul` of two activations (numpy rules: batch dims
//! broadcast, the last two multiply; attention scores and their use) and `Linear`, an
//! activation times a constant `[K, N]` matrix plus an optional bias (the MLPs and projections
//! of transformer blocks, from MatMul/Gemm with a constant operand).

use super::dims::Dims;
use super::Tensor;

/// Output dims of `a @ b` (both of rank >= 2; batch dims broadcast).
pub fn matmul_dims(a: &Dims, b: &Dims) -> Result<Dims, String> {
    let (ra, rb) = (a.rank(), b.rank());
    if ra < 2 || rb < 2 {
        return Err(format!(
            "MatMul of {a:?} and {b:?}: both operands need rank >= 2"
        ));
    }
    let (m, k) = (a[ra - 2], a[ra - 1]);
    let (k2, n) = (b[rb - 2], b[rb - 1]);
    if k != k2 {
        return Err(format!(
            "MatMul of {a:?} and {b:?}: inner sizes {k} and {k2} differ"
        ));
    }
    let batch = broadcast_lead(&a.as_slice()[..ra - 2], &b.as_slice()[..rb - 2])
        .ok_or_else(|| format!("MatMul of {a:?} and {b:?}: batch dims do not broadcast"))?;
    let mut o = batch;
    o.extend([m, n]);
    Dims::new(&o)
}

/// numpy broadcast of two right-aligned dim lists.
pub fn broadcast_lead(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let x = if i + a.len() >= r {
                a[i + a.len() - r]
            } else {
                1
            };
            let y = if i + b.len() >= r {
                b[i + b.len() - r]
            } else {
                1
            };
            match (x, y) {
                _ if x == y => Some(x),
                (1, y) => Some(y),
                (x, 1) => Some(x),
                _ => None,
            }
        })
        .collect()
}

/// `x @ weight + bias` over the last axis of `x`.
#[derive(Clone, Debug, PartialEq)]
pub struct Linear {
    /// `[K, N]`: K the input's last size, N the output's.
    pub weight: Tensor,
    /// `[N]`, if any.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// Weight and bias are consistent.
    pub fn check(&self) -> Result<(), String> {
        let w = &self.weight;
        if w.shape.len() != 2 || !w.is_consistent() || w.is_empty() {
            return Err(format!(
                "Linear weight of shape {:?} (needs [K, N])",
                w.shape
            ));
        }
        if let Some(b) = &self.bias {
            if b.len() != w.shape[1] || !b.is_consistent() {
                return Err(format!(
                    "Linear bias of {} values for {} outputs",
                    b.len(),
                    w.shape[1]
                ));
            }
        }
        Ok(())
    }
    /// (K, N).
    pub fn kn(&self) -> (usize, usize) {
        (self.weight.shape[0], self.weight.shape[1])
    }
    /// Output dims on `x`.
    pub fn output_dims(&self, x: &Dims) -> Result<Dims, String> {
        self.check()?;
        let (k, n) = self.kn();
        let r = x.rank();
        if x[r - 1] != k {
            return Err(format!("Linear of {k} inputs applied to shape {x:?}"));
        }
        let mut o = x.as_slice().to_vec();
        o[r - 1] = n;
        Dims::new(&o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let d = |s: &[usize]| Dims::new(s).unwrap();
        assert_eq!(
            matmul_dims(&d(&[1, 2, 8, 12]), &d(&[1, 2, 12, 8])),
            Ok(d(&[1, 2, 8, 8]))
        );
        assert_eq!(
            matmul_dims(&d(&[4, 2, 8, 12]), &d(&[12, 5])),
            Ok(d(&[4, 2, 8, 5]))
        );
        assert!(matmul_dims(&d(&[2, 8, 12]), &d(&[3, 12, 8])).is_err());
        let l = Linear {
            weight: Tensor::new(vec![3, 5], vec![0.0; 15]),
            bias: None,
        };
        assert_eq!(l.output_dims(&d(&[1, 7, 3])), Ok(d(&[1, 7, 5])));
        assert!(l.output_dims(&d(&[1, 7, 4])).is_err());
    }
}
