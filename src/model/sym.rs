//! Small tensors whose elements may be symbolic expressions of activation sizes.
//!
//! Exporters compute Reshape targets and Resize sizes from `Shape(x)`; since N,D,H,W are only known
//! per window, such a value is kept as an expression tree over "dimension `axis` of IR value `v`"
//! and evaluated later against concrete shapes (see `lower.rs`, which probes several windows).

use super::graph::ValueId;
use std::rc::Rc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bop {
    Add,
    Sub,
    Mul,
    Div,
    Min,
    Max,
}

#[derive(Debug)]
pub(crate) enum E {
    /// Dimension `axis` of the IR value (an NCDHW activation).
    Dim(ValueId, usize),
    Bin(Bop, X, X),
    Floor(X),
    Ceil(X),
    /// C-style truncation (integer division of ONNX int tensors).
    Trunc(X),
}

/// One element: a known number or an expression.
#[derive(Clone, Debug)]
pub(crate) enum X {
    K(f64),
    E(Rc<E>),
}

impl X {
    pub fn known(&self) -> Option<f64> {
        match self {
            X::K(v) => Some(*v),
            X::E(_) => None,
        }
    }
    pub fn dim(v: ValueId, axis: usize) -> X {
        X::E(Rc::new(E::Dim(v, axis)))
    }
    pub fn bin(op: Bop, a: &X, b: &X) -> X {
        match (a, b) {
            (X::K(x), X::K(y)) => X::K(apply(op, *x, *y)),
            // x*1, x+0, x/1 stay x so that Shape→Gather→Mul(1) chains keep simple forms.
            (e, X::K(y))
                if (*y == 1.0 && matches!(op, Bop::Mul | Bop::Div))
                    || (*y == 0.0 && matches!(op, Bop::Add | Bop::Sub)) =>
            {
                e.clone()
            }
            _ => X::E(Rc::new(E::Bin(op, a.clone(), b.clone()))),
        }
    }
    pub fn un(kind: u8, a: &X) -> X {
        match a {
            X::K(x) => X::K(match kind {
                0 => x.floor(),
                1 => x.ceil(),
                _ => x.trunc(),
            }),
            _ => X::E(Rc::new(match kind {
                0 => E::Floor(a.clone()),
                1 => E::Ceil(a.clone()),
                _ => E::Trunc(a.clone()),
            })),
        }
    }
    /// Evaluate against concrete activation shapes (`shapes[v]` = NCDHW of value v).
    pub fn eval(&self, shapes: &[[usize; 5]]) -> Option<f64> {
        match self {
            X::K(v) => Some(*v),
            X::E(e) => match &**e {
                E::Dim(v, a) => shapes.get(*v).and_then(|s| s.get(*a)).map(|&d| d as f64),
                E::Bin(op, a, b) => Some(apply(*op, a.eval(shapes)?, b.eval(shapes)?)),
                E::Floor(a) => Some(a.eval(shapes)?.floor()),
                E::Ceil(a) => Some(a.eval(shapes)?.ceil()),
                E::Trunc(a) => Some(a.eval(shapes)?.trunc()),
            },
        }
    }
}

fn apply(op: Bop, x: f64, y: f64) -> f64 {
    match op {
        Bop::Add => x + y,
        Bop::Sub => x - y,
        Bop::Mul => x * y,
        Bop::Div => x / y,
        Bop::Min => x.min(y),
        Bop::Max => x.max(y),
    }
}

/// A small tensor of [`X`] (shape arbitrary but small), flagged integer or float.
#[derive(Clone, Debug)]
pub(crate) struct Sym {
    pub shape: Vec<usize>,
    pub elems: Vec<X>,
    pub int: bool,
}

impl Sym {
    pub fn all_known(&self) -> Option<Vec<f64>> {
        self.elems.iter().map(X::known).collect()
    }
}

/// numpy broadcast of two shapes; None when incompatible.
pub(crate) fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let r = a.len().max(b.len());
    let mut out = vec![0; r];
    for i in 0..r {
        let da = if i + a.len() >= r {
            a[i + a.len() - r]
        } else {
            1
        };
        let db = if i + b.len() >= r {
            b[i + b.len() - r]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return None;
        };
    }
    Some(out)
}

/// Flat index into a tensor of `shape` broadcast to `out`, for the output multi-index `idx`.
pub(crate) fn broadcast_index(shape: &[usize], out: &[usize], idx: &[usize]) -> usize {
    let off = out.len() - shape.len();
    let mut flat = 0;
    for (i, &d) in shape.iter().enumerate() {
        let j = if d == 1 { 0 } else { idx[off + i] };
        flat = flat * d + j;
    }
    flat
}

/// Iterate multi-indices of `shape` in row-major order.
pub(crate) fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    let n: usize = shape.iter().product();
    let mut idx = vec![0usize; shape.len()];
    for _ in 0..n {
        f(&idx);
        for a in (0..shape.len()).rev() {
            idx[a] += 1;
            if idx[a] < shape[a] {
                break;
            }
            idx[a] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions_fold_and_evaluate() {
        let d = X::dim(0, 2);
        let e = X::un(0, &X::bin(Bop::Mul, &d, &X::K(2.5)));
        let shapes = [[1, 3, 7, 8, 9]];
        assert_eq!(e.eval(&shapes), Some(17.0));
        assert_eq!(X::bin(Bop::Add, &X::K(2.0), &X::K(3.0)).known(), Some(5.0));
        assert!(matches!(X::bin(Bop::Mul, &d, &X::K(1.0)), X::E(_)));
        assert_eq!(X::un(2, &X::K(-2.5)).known(), Some(-2.0));
    }

    #[test]
    fn broadcasting() {
        assert_eq!(broadcast_shape(&[3, 1], &[4]), Some(vec![3, 4]));
        assert_eq!(broadcast_shape(&[3], &[4]), None);
        let out = [2, 3];
        // [3] broadcast to [2,3]: element (1,2) reads flat 2
        assert_eq!(broadcast_index(&[3], &out, &[1, 2]), 2);
        assert_eq!(broadcast_index(&[2, 1], &out, &[1, 2]), 1);
        let mut seen = vec![];
        for_each_index(&[2, 2], |i| seen.push(i.to_vec()));
        assert_eq!(seen, vec![vec![0, 0], vec![0, 1], vec![1, 0], vec![1, 1]]);
    }
}
