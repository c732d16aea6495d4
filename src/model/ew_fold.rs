//! The arithmetic of folding an elementwise op over constants: numpy broadcasting read through
//! per-operand strides (0 along a broadcast axis), the output filled row by row (its last axis)
//! in parallel. Transformer exports fold attention masks of 343³ = 40 million elements several
//! times over (SwinUNETR), so this runs in a few nanoseconds per element: no index arithmetic per
//! element, no dynamic call, no shared state between rows. [`par_rows`] is that walk for any
//! broadcast sum (the attention pass's bias terms use it too).

use super::decode::Data;
use rayon::prelude::*;

/// One elementwise operation, resolved from the operator before the loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ew {
    Add,
    Sub,
    Mul,
    /// Integer division, truncated.
    IDiv,
    Div,
    Min,
    Max,
    Equal,
    Less,
    Greater,
    Not,
    Neg,
    ToBool,
    Trunc,
    Copy,
    /// `x != 0 ? y : z`.
    Where,
    /// numpy's sign-of-divisor modulo.
    Mod,
    /// C's fmod.
    Fmod,
}

impl Ew {
    /// Whether the second operand must hold no zero.
    pub(crate) fn divides(self) -> bool {
        matches!(self, Ew::IDiv | Ew::Mod | Ew::Fmod)
    }

    /// The value of one element (a divisor was checked for zeros before).
    #[inline(always)]
    fn eval(self, x: f64, y: f64, z: f64) -> f64 {
        let b = |t: bool| t as i32 as f64;
        match self {
            Ew::Add => x + y,
            Ew::Sub => x - y,
            Ew::Mul => x * y,
            Ew::IDiv => (x / y).trunc(),
            Ew::Div => x / y,
            Ew::Min => x.min(y),
            Ew::Max => x.max(y),
            Ew::Equal => b(x == y),
            Ew::Less => b(x < y),
            Ew::Greater => b(x > y),
            Ew::Not => b(x == 0.0),
            Ew::Neg => -x,
            Ew::ToBool => b(x != 0.0),
            Ew::Trunc => x.trunc(),
            Ew::Copy => x,
            Ew::Where => {
                if x != 0.0 {
                    y
                } else {
                    z
                }
            }
            Ew::Fmod => x % y,
            Ew::Mod => x - y * (x / y).floor(),
        }
    }
}

/// The strides (elements) with which an operand of `shape` is read along each axis of `out`,
/// numpy-broadcast: 0 along an axis where it has size 1 or that it lacks.
pub(crate) fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let off = out.len() - shape.len();
    let mut strides = vec![0; out.len()];
    let mut s = 1;
    for (a, &d) in shape.iter().enumerate().rev() {
        if d != 1 {
            strides[off + a] = s;
        }
        s *= d;
    }
    strides
}

/// Rows of at least this many elements per parallel task.
const MIN_TASK: usize = 1 << 14;

/// Calls `f(row, offsets, steps)` for every row (last axis) of `data`, laid out as `out`, in
/// parallel: `offsets[k]` is where operand `k` (read with `strides[k]`, at most 3 operands) is at
/// the row's start, `steps[k]` its stride along the row.
pub(crate) fn par_rows<T: Send>(
    data: &mut [T],
    out: &[usize],
    strides: &[Vec<usize>],
    f: impl Fn(&mut [T], [usize; 3], [usize; 3]) + Sync,
) {
    assert!(strides.len() <= 3, "at most three operands");
    let row = out.last().copied().unwrap_or(1).max(1);
    let last = out.len().saturating_sub(1);
    let outer = &out[..last];
    let mut steps = [0usize; 3];
    for (s, st) in steps.iter_mut().zip(strides) {
        *s = st.get(last).copied().unwrap_or(0);
    }
    data.par_chunks_mut(row)
        .with_min_len(MIN_TASK.div_ceil(row))
        .enumerate()
        .for_each(|(r, dst)| {
            let mut base = [0usize; 3];
            let mut rest = r;
            for (a, &n) in outer.iter().enumerate().rev() {
                let i = rest % n;
                rest /= n;
                for (b, st) in base.iter_mut().zip(strides) {
                    *b += i * st[a];
                }
            }
            f(dst, base, steps)
        });
}

/// Element `i` as f64.
#[inline(always)]
pub(crate) fn at(d: &Data, i: usize) -> f64 {
    match d {
        Data::F(v) => v[i] as f64,
        Data::I(v) => v[i] as f64,
    }
}

/// `op` over the operands (`(data, shape)`, one to three, each broadcastable to `out`), in f64
/// per element, converted by `conv`. The caller checked that the shapes broadcast and, for an
/// op that [`Ew::divides`], that the divisor holds no zero.
pub(crate) fn fold<T: Copy + Default + Send>(
    op: Ew,
    operands: &[(&Data, &[usize])],
    out: &[usize],
    conv: impl Fn(f64) -> T + Sync,
) -> Vec<T> {
    let numel: usize = out.iter().product();
    let strides: Vec<Vec<usize>> = operands
        .iter()
        .map(|(_, s)| broadcast_strides(s, out))
        .collect();
    let mut data = vec![T::default(); numel];
    if numel == 0 {
        return data;
    }
    let get = |k: usize, i: usize| operands.get(k).map_or(0.0, |(d, _)| at(d, i));
    par_rows(&mut data, out, &strides, |dst, base, step| {
        for (j, o) in dst.iter_mut().enumerate() {
            let x = get(0, base[0] + j * step[0]);
            let y = get(1, base[1] + j * step[1]);
            let z = get(2, base[2] + j * step[2]);
            *o = conv(op.eval(x, y, z));
        }
    });
    data
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::sym::{broadcast_index, for_each_index};

    /// Every op over broadcast operands of mixed kinds (a row, a column, a scalar, a full
    /// tensor) against the element-by-element definition with multi-indices.
    #[test]
    fn broadcast_rows_match_indexing() {
        let out = [3usize, 4, 5];
        let a = Data::F((0..20).map(|i| i as f32 * 0.5 - 3.0).collect()); // [4, 5]
        let b = Data::I((0..3).map(|i| i - 1).collect()); // [3, 1, 1]
        let c = Data::F((0..60).map(|i| (i % 7) as f32 - 2.0).collect()); // [3, 4, 5]
        let s = Data::I(vec![3]); // []
        let shapes: [&[usize]; 4] = [&[4, 5], &[3, 1, 1], &[3, 4, 5], &[]];
        let datas = [&a, &b, &c, &s];
        let value = |d: &Data, i: usize| match d {
            Data::F(v) => v[i] as f64,
            Data::I(v) => v[i] as f64,
        };
        for op in [
            Ew::Add,
            Ew::Sub,
            Ew::Mul,
            Ew::Div,
            Ew::Min,
            Ew::Max,
            Ew::Equal,
            Ew::Less,
            Ew::Greater,
            Ew::Not,
            Ew::Neg,
            Ew::ToBool,
            Ew::Trunc,
            Ew::Copy,
            Ew::Where,
        ] {
            for (x, y, z) in [(0, 1, 2), (2, 3, 0), (3, 0, 1), (1, 2, 3)] {
                let operands: Vec<(&Data, &[usize])> =
                    [x, y, z].iter().map(|&k| (datas[k], shapes[k])).collect();
                let got = fold(op, &operands, &out, |v| v);
                let mut want = Vec::new();
                for_each_index(&out, |idx| {
                    let v: Vec<f64> = [x, y, z]
                        .iter()
                        .map(|&k| value(datas[k], broadcast_index(shapes[k], &out, idx)))
                        .collect();
                    want.push(op.eval(v[0], v[1], v[2]));
                });
                // Bits: 0/0 is NaN on both sides.
                let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{op:?} over operands {x} {y} {z}");
            }
        }
        // One operand, a scalar output, an empty one.
        assert_eq!(fold(Ew::Neg, &[(&s, &[])], &[], |v| v), vec![-3.0]);
        assert!(fold(Ew::Neg, &[(&a, &[4, 5])], &[0, 5], |v| v).is_empty());
        // Rows longer than one task, the last axis broadcast.
        let big = Data::F((0..3000).map(|i| i as f32).collect());
        let got = fold(
            Ew::Sub,
            &[(&big, &[3000, 1]), (&big, &[1, 3000])],
            &[3000, 3000],
            |v| v,
        );
        assert_eq!(got[3000 * 7 + 11], 7.0 - 11.0);
        assert_eq!(got[3000 * 2999 + 5], 2999.0 - 5.0);
    }

    #[test]
    fn modulo_follows_numpy_and_c() {
        let x = Data::I(vec![7, -7, 7, -7]);
        let y = Data::I(vec![3, 3, -3, -3]);
        let m = fold(Ew::Mod, &[(&x, &[4]), (&y, &[4])], &[4], |v| v as i64);
        assert_eq!(m, vec![1, 2, -2, -1]);
        let f = fold(Ew::Fmod, &[(&x, &[4]), (&y, &[4])], &[4], |v| v as i64);
        assert_eq!(f, vec![1, -1, 1, -1]);
        let d = fold(Ew::IDiv, &[(&x, &[4]), (&y, &[4])], &[4], |v| v as i64);
        assert_eq!(d, vec![2, -2, -2, 2]);
    }
}
