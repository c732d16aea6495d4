//! Data-movement ops on activations of any rank: Reshape, Transpose, Slice and Gather (a
//! single index). They are how exporters write token layouts, attention heads, window
//! partitions and `roll`; each one's output shape is defined here only.

use super::dims::{norm_axis, Dims};

/// The ONNX Reshape of `x` to `target` (0 keeps the input's size at that position, -1 is
/// inferred from the element count).
pub fn reshape_dims(x: &Dims, target: &[i64]) -> Result<Dims, String> {
    let mut out = Vec::with_capacity(target.len());
    let mut infer = None;
    for (i, &t) in target.iter().enumerate() {
        out.push(match t {
            0 => *x.as_slice().get(i).ok_or_else(|| {
                format!("Reshape target {target:?}: 0 at {i} has no input dimension to copy")
            })?,
            -1 if infer.is_none() => {
                infer = Some(i);
                1
            }
            t if t > 0 => t as usize,
            _ => return Err(format!("Reshape target {target:?} is invalid")),
        });
    }
    let known: usize = out.iter().product();
    if let Some(i) = infer {
        if known == 0 || x.numel() % known != 0 {
            return Err(format!("cannot reshape {x:?} to {target:?}"));
        }
        out[i] = x.numel() / known;
    }
    if out.iter().product::<usize>() != x.numel() {
        return Err(format!(
            "cannot reshape {x:?} ({} elements) to {target:?} (the batch or window differs from the export's?)",
            x.numel()
        ));
    }
    Dims::new(&out)
}

/// Whether `perm` is a permutation of `0..rank`.
pub fn check_perm(perm: &[usize]) -> Result<(), String> {
    let mut seen = vec![false; perm.len()];
    for &p in perm {
        if p >= perm.len() || std::mem::replace(&mut seen[p], true) {
            return Err(format!("Transpose perm {perm:?} is not a permutation"));
        }
    }
    Ok(())
}

/// `x`'s dims permuted: output axis `i` is input axis `perm[i]`.
pub fn transpose_dims(x: &Dims, perm: &[usize]) -> Result<Dims, String> {
    check_perm(perm)?;
    if perm.len() != x.rank() {
        return Err(format!(
            "Transpose perm {perm:?} on an input of shape {x:?}"
        ));
    }
    let o: Vec<usize> = perm.iter().map(|&p| x[p]).collect();
    Dims::new(&o)
}

/// A strided range along one axis (ONNX Slice semantics, positive step).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slice {
    /// Axis (negative counts from the end).
    pub axis: i64,
    /// First index (negative counts from the end; clamped).
    pub start: i64,
    /// One past the last index (negative counts from the end; clamped).
    pub end: i64,
    /// Stride, at least 1.
    pub step: i64,
}

/// A slice resolved on concrete dims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SliceAt {
    /// The axis.
    pub axis: usize,
    /// First index taken.
    pub start: usize,
    /// Indices taken.
    pub len: usize,
    /// Stride between them.
    pub step: usize,
}

impl Slice {
    /// The slice on input `x`.
    pub fn resolve(&self, x: &Dims) -> Result<SliceAt, String> {
        let axis = norm_axis(self.axis, x.rank())?;
        if self.step < 1 {
            return Err(format!(
                "Slice step {} (only positive steps are supported)",
                self.step
            ));
        }
        let n = x[axis] as i64;
        let clamp = |v: i64| if v < 0 { (v + n).max(0) } else { v.min(n) };
        let (s, e) = (clamp(self.start), clamp(self.end));
        let len = if e > s {
            (e - s + self.step - 1) / self.step
        } else {
            0
        };
        if len == 0 {
            return Err(format!("Slice {self:?} of {x:?} is empty"));
        }
        Ok(SliceAt {
            axis,
            start: s as usize,
            len: len as usize,
            step: self.step as usize,
        })
    }
    /// Output dims on input `x`.
    pub fn output_dims(&self, x: &Dims) -> Result<Dims, String> {
        let r = self.resolve(x)?;
        let mut o = x.as_slice().to_vec();
        o[r.axis] = r.len;
        Dims::new(&o)
    }
}

/// Gather of one index along `axis`, which drops that axis (`qkv[0]`).
pub fn gather_dims(x: &Dims, axis: i64, index: i64) -> Result<(usize, usize, Dims), String> {
    let a = norm_axis(axis, x.rank())?;
    let n = x[a] as i64;
    let i = if index < 0 { index + n } else { index };
    if !(0..n).contains(&i) {
        return Err(format!("Gather index {index} is out of range for size {n}"));
    }
    let mut o = x.as_slice().to_vec();
    o.remove(a);
    if o.is_empty() {
        o.push(1);
    }
    Ok((a, i as usize, Dims::new(&o)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &[usize]) -> Dims {
        Dims::new(s).unwrap()
    }

    #[test]
    fn shapes() {
        let x = d(&[1, 8, 72]);
        assert_eq!(
            reshape_dims(&x, &[1, 8, 3, 2, 12]),
            Ok(d(&[1, 8, 3, 2, 12]))
        );
        assert_eq!(reshape_dims(&x, &[0, -1]), Ok(d(&[1, 576])));
        assert!(reshape_dims(&x, &[2, 8, 3, 2, 12]).is_err());
        let y = d(&[1, 8, 3, 2, 12]);
        assert_eq!(
            transpose_dims(&y, &[2, 0, 3, 1, 4]),
            Ok(d(&[3, 1, 2, 8, 12]))
        );
        assert!(transpose_dims(&y, &[0, 0, 1, 2, 3]).is_err());
        let s = Slice {
            axis: 1,
            start: 1,
            end: i64::MAX,
            step: 2,
        };
        assert_eq!(s.output_dims(&d(&[1, 7, 3])), Ok(d(&[1, 3, 3])));
        let r = Slice {
            axis: -1,
            start: -2,
            end: i64::MAX,
            step: 1,
        };
        assert_eq!(
            r.resolve(&d(&[4, 5])).unwrap(),
            SliceAt {
                axis: 1,
                start: 3,
                len: 2,
                step: 1
            }
        );
        assert_eq!(
            gather_dims(&d(&[3, 1, 2]), 0, 2).unwrap(),
            (0, 2, d(&[1, 2]))
        );
        assert!(gather_dims(&d(&[3, 1, 2]), 0, 3).is_err());
    }
}
