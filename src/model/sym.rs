//! Small tensors whose elements may be symbolic expressions of activation sizes.
//!
//! Exporters compute Reshape targets and Resize sizes from `Shape(x)`; since N,D,H,W are only known
//! per window, such a value is kept as an expression over "dimension `axis` of IR value `v`" and
//! evaluated later against concrete shapes (see `lower.rs`, which probes several windows).
//!
//! Expressions live in one arena ([`Exprs`]) and refer to their operands by index, so a hostile
//! graph cannot make them expensive: a DAG that doubles at each step is evaluated once per node
//! (memoised), a chain of 80 000 steps is evaluated with an explicit stack, and dropping the arena
//! is one flat `Vec` free (an `Rc` chain would recurse on drop and overflow the stack).

use super::graph::ValueId;
use super::ops::Dims;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bop {
    Add,
    Sub,
    Mul,
    Div,
    Min,
    Max,
}

/// Rounding of one operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Round {
    Floor,
    Ceil,
    /// C-style truncation (integer division of ONNX int tensors, casts to int).
    Trunc,
}

impl Round {
    fn apply(self, x: f64) -> f64 {
        match self {
            Round::Floor => x.floor(),
            Round::Ceil => x.ceil(),
            Round::Trunc => x.trunc(),
        }
    }
}

/// One arena node; operands always have smaller ids than the node (built bottom-up).
#[derive(Clone, Copy, Debug)]
enum Expr {
    /// Dimension `axis` of the IR value (an NCDHW activation).
    Dim(ValueId, usize),
    Bin(Bop, Elem, Elem),
    Un(Round, Elem),
}

/// One element: a known number or an expression (an index into [`Exprs`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Elem {
    Known(f64),
    Expr(u32),
}

impl Elem {
    pub fn known(&self) -> Option<f64> {
        match self {
            Elem::Known(v) => Some(*v),
            Elem::Expr(_) => None,
        }
    }
}

/// The expression arena of one model import.
#[derive(Default, Debug)]
pub(crate) struct Exprs {
    nodes: Vec<Expr>,
}

impl Exprs {
    /// Number of expression nodes built so far.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    fn push(&mut self, e: Expr) -> Elem {
        let id = u32::try_from(self.nodes.len()).expect("the fold budget keeps the arena small");
        self.nodes.push(e);
        Elem::Expr(id)
    }

    pub fn dim(&mut self, v: ValueId, axis: usize) -> Elem {
        self.push(Expr::Dim(v, axis))
    }

    pub fn bin(&mut self, op: Bop, a: Elem, b: Elem) -> Elem {
        match (a, b) {
            (Elem::Known(x), Elem::Known(y)) => Elem::Known(apply(op, x, y)),
            // x*1, x+0, x/1 stay x so that Shape→Gather→Mul(1) chains keep simple forms.
            (e, Elem::Known(y))
                if (y == 1.0 && matches!(op, Bop::Mul | Bop::Div))
                    || (y == 0.0 && matches!(op, Bop::Add | Bop::Sub)) =>
            {
                e
            }
            _ => self.push(Expr::Bin(op, a, b)),
        }
    }

    pub fn un(&mut self, r: Round, a: Elem) -> Elem {
        match a {
            Elem::Known(x) => Elem::Known(r.apply(x)),
            Elem::Expr(_) => self.push(Expr::Un(r, a)),
        }
    }

    /// Evaluate `xs` against concrete activation shapes (`shapes[v]` = NCDHW of value v); NaN
    /// where an expression names a value or axis that has no shape. Operands have smaller ids
    /// than their users, so one ascending pass over the arena evaluates every node once, without
    /// recursion. Also returns the number of nodes evaluated, which the importer charges to its
    /// work budget.
    pub fn eval(&self, xs: &[Elem], shapes: &[Dims]) -> (Vec<f64>, usize) {
        let top = xs
            .iter()
            .filter_map(|x| match x {
                Elem::Expr(id) => Some(*id as usize + 1),
                Elem::Known(_) => None,
            })
            .max()
            .unwrap_or(0)
            .min(self.nodes.len());
        let mut memo = vec![f64::NAN; top];
        for id in 0..top {
            let v = |x: Elem, memo: &[f64]| match x {
                Elem::Known(k) => k,
                Elem::Expr(c) => memo[c as usize],
            };
            memo[id] = match self.nodes[id] {
                Expr::Dim(val, a) => shapes
                    .get(val)
                    .and_then(|s| s.as_slice().get(a))
                    .map_or(f64::NAN, |&d| d as f64),
                Expr::Bin(op, a, b) => apply(op, v(a, &memo), v(b, &memo)),
                Expr::Un(r, a) => r.apply(v(a, &memo)),
            };
        }
        let out = xs
            .iter()
            .map(|x| match *x {
                Elem::Known(k) => k,
                Elem::Expr(id) => memo.get(id as usize).copied().unwrap_or(f64::NAN),
            })
            .collect();
        (out, top)
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

/// A small tensor of [`Elem`] (shape arbitrary but small), flagged integer or float.
#[derive(Clone, Debug)]
pub(crate) struct Sym {
    pub shape: Vec<usize>,
    pub elems: Vec<Elem>,
    pub int: bool,
}

impl Sym {
    pub fn all_known(&self) -> Option<Vec<f64>> {
        self.elems.iter().map(Elem::known).collect()
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
        let mut ex = Exprs::default();
        let d = ex.dim(0, 2);
        let m = ex.bin(Bop::Mul, d, Elem::Known(2.5));
        let e = ex.un(Round::Floor, m);
        let shapes = [Dims::from([1, 3, 7, 8, 9])];
        assert_eq!(ex.eval(&[e, Elem::Known(4.0)], &shapes).0, vec![17.0, 4.0]);
        let missing = ex.dim(1, 0);
        assert!(ex.eval(&[missing], &shapes).0[0].is_nan());
        assert_eq!(
            ex.bin(Bop::Add, Elem::Known(2.0), Elem::Known(3.0)).known(),
            Some(5.0)
        );
        assert_eq!(ex.bin(Bop::Mul, d, Elem::Known(1.0)), d);
        assert_eq!(ex.un(Round::Trunc, Elem::Known(-2.5)).known(), Some(-2.0));
    }

    /// s_{k+1} = (s_k + s_k) - s_k, 60 steps: a tree of 2^60 leaves, a DAG of 120 nodes.
    #[test]
    fn doubling_dag_and_deep_chain_evaluate_quickly() {
        let mut ex = Exprs::default();
        let mut s = ex.dim(0, 3);
        for _ in 0..60 {
            let t = ex.bin(Bop::Add, s, s);
            s = ex.bin(Bop::Sub, t, s);
        }
        let (v, visited) = ex.eval(&[s], &[Dims::from([1, 1, 1, 5, 1])]);
        assert_eq!(v, vec![5.0]);
        assert!(visited <= 121, "{visited}");
        // A chain far deeper than the stack allows with recursion.
        let mut c = ex.dim(0, 4);
        for _ in 0..1_000_000 {
            let t = ex.bin(Bop::Add, c, Elem::Known(1.0));
            c = ex.bin(Bop::Sub, t, Elem::Known(1.0));
        }
        assert_eq!(ex.eval(&[c], &[Dims::from([1, 1, 1, 1, 7])]).0, vec![7.0]);
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
