//! Shapes of any rank (up to [`MAX_RANK`]): transformer nets move activations through token
//! layouts (`[N, L, C]`), attention heads (`[N, heads, L, d]`) and window partitions (8 dims)
//! between their NCDHW convolutions. `Copy`, so shape tables stay as cheap as the NCDHW arrays.

use super::Shape;
use std::fmt;

/// Most dimensions an activation may have (Swin's window partition uses 8).
pub const MAX_RANK: usize = 8;

/// The dimensions of one activation, outermost first; rank 5 is NCDHW.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dims {
    rank: u8,
    d: [usize; MAX_RANK],
}

impl Dims {
    /// Dims of `s`, or why they cannot be held (rank 0 or above [`MAX_RANK`]).
    pub fn new(s: &[usize]) -> Result<Dims, String> {
        if s.is_empty() || s.len() > MAX_RANK {
            return Err(format!(
                "a tensor of rank {} (voxtile holds activations of rank 1 to {MAX_RANK})",
                s.len()
            ));
        }
        let mut d = [1usize; MAX_RANK];
        d[..s.len()].copy_from_slice(s);
        Ok(Dims {
            rank: s.len() as u8,
            d,
        })
    }
    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.rank as usize
    }
    /// The dimensions as a slice.
    pub fn as_slice(&self) -> &[usize] {
        &self.d[..self.rank()]
    }
    /// Number of elements (saturating: shape inference rejects overflowing shapes first).
    pub fn numel(&self) -> usize {
        self.as_slice()
            .iter()
            .fold(1usize, |a, &x| a.saturating_mul(x))
    }
    /// The NCDHW shape when the rank is 5.
    pub fn ncdhw(&self) -> Option<Shape> {
        (self.rank == 5).then(|| [self.d[0], self.d[1], self.d[2], self.d[3], self.d[4]])
    }
    /// The NCDHW shape, or an error naming the op that needs one.
    pub fn need_ncdhw(&self, op: &str) -> Result<Shape, String> {
        self.ncdhw()
            .ok_or_else(|| format!("{op} needs a 5-dimensional NCDHW input, got shape {self:?}"))
    }
    /// The same elements folded into 5 dims (leading dims merged, or 1s prepended): how the CPU
    /// executor stores a value of any rank in its 5D arrays.
    pub fn folded5(&self) -> Shape {
        let s = self.as_slice();
        let mut o = [1usize; 5];
        if s.len() <= 5 {
            o[5 - s.len()..].copy_from_slice(s);
        } else {
            let k = s.len() - 4;
            o[0] = s[..k].iter().product();
            o[1..].copy_from_slice(&s[k..]);
        }
        o
    }
    /// Row-major element strides.
    pub fn strides(&self) -> Vec<usize> {
        let s = self.as_slice();
        let mut st = vec![1usize; s.len()];
        for a in (0..s.len().saturating_sub(1)).rev() {
            st[a] = st[a + 1] * s[a + 1];
        }
        st
    }
}

impl From<Shape> for Dims {
    fn from(s: Shape) -> Dims {
        let mut d = [1usize; MAX_RANK];
        d[..5].copy_from_slice(&s);
        Dims { rank: 5, d }
    }
}

impl std::ops::Index<usize> for Dims {
    type Output = usize;
    fn index(&self, i: usize) -> &usize {
        &self.as_slice()[i]
    }
}

impl fmt::Debug for Dims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_slice())
    }
}

/// Resolves a possibly negative ONNX axis against `rank`.
pub fn norm_axis(axis: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) {
        Ok(a as usize)
    } else {
        Err(format!("axis {axis} is out of range for rank {rank}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folding_and_strides() {
        let d = Dims::new(&[2, 3, 4]).unwrap();
        assert_eq!(d.folded5(), [1, 1, 2, 3, 4]);
        assert_eq!(d.strides(), vec![12, 4, 1]);
        let e = Dims::new(&[2, 2, 2, 3, 2, 5, 1, 7]).unwrap();
        assert_eq!(e.folded5(), [24, 2, 5, 1, 7]);
        assert_eq!(e.numel(), e.folded5().iter().product::<usize>());
        assert!(Dims::new(&[1; 9]).is_err());
        assert_eq!(Dims::from([1, 2, 3, 4, 5]).ncdhw(), Some([1, 2, 3, 4, 5]));
        assert_eq!(norm_axis(-1, 3), Ok(2));
        assert!(norm_axis(3, 3).is_err());
    }
}
