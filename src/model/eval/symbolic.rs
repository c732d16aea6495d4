//! Shape values: small constant / symbolic tensors folded elementwise, and their evaluation on
//! probe windows of the partial IR.

use super::budget::Charge;
use super::moves::Folded;
use super::{Eval, SMALL};
use crate::model::analysis::spatial_divisor_raw;
use crate::model::decode::node::Ctx;
use crate::model::decode::values::Val;
use crate::model::decode::Const;
use crate::model::graph::ValueId;
use crate::model::ops::Dims;
use crate::model::shape::{infer_shapes_raw, probe_window};
use crate::model::sym::{broadcast_index, broadcast_shape, for_each_index, Bop, Elem, Round, Sym};
use crate::Result;
use std::rc::Rc;

/// Shapes of the partial IR on the probe windows: (shapes per value, window) pairs.
pub(crate) type Probes = Rc<Vec<(Vec<Dims>, [usize; 3])>>;

/// Element count of a shape, None on overflow or above [`SMALL`].
pub(crate) fn small_numel(shape: &[usize]) -> Option<usize> {
    shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= SMALL)
}

pub(crate) fn sym_to_const(s: &Sym) -> Option<Const> {
    Some(Const::from_values(s.shape.clone(), s.all_known()?, s.int))
}

impl Eval<'_> {
    /// `xs` evaluated on one probe's shapes (NaN where unknown), charged to the work budget.
    pub(crate) fn eval(&self, ctx: &Ctx, xs: &[Elem], shapes: &[Dims]) -> Result<Vec<f64>> {
        let (v, visited) = self.st.ex.borrow().eval(xs, shapes);
        self.st
            .budget
            .charge(ctx, Charge::Work(visited as u64 + 1))?;
        Ok(v)
    }

    /// The values of `s`: known ones, or evaluated on the probes when they read activation
    /// sizes that are the same on every probe (a fixed input); else an error naming `what`.
    pub(crate) fn values_of(&self, ctx: &Ctx, s: &Sym, what: &str) -> Result<Vec<f64>> {
        if let Some(v) = s.all_known() {
            return Ok(v);
        }
        let probes = self.probe(ctx, self.input)?;
        let mut first: Option<Vec<f64>> = None;
        for (shapes, _) in probes.iter() {
            let e = self.eval(ctx, &s.elems, shapes)?;
            if e.iter().any(|v| v.is_nan()) || first.as_ref().is_some_and(|f| *f != e) {
                return Err(ctx.err(format!("{what} depends on the window size")));
            }
            first.get_or_insert(e);
        }
        first.ok_or_else(|| ctx.err(format!("{what} cannot be evaluated")))
    }

    /// View a constant/symbolic value as a [`Sym`].
    pub(crate) fn small(&self, ctx: &Ctx, v: &Val) -> Result<Sym> {
        match v {
            Val::Sym(s) => {
                self.st.budget.charge(ctx, Charge::Work(s.elems.len() as u64))?;
                Ok(s.clone())
            }
            Val::Const(c) => {
                self.st.budget.charge(ctx, Charge::Work(c.len() as u64))?;
                if c.len() > SMALL {
                    return Err(ctx.err(format!("folding a constant of {} elements is not supported", c.len())));
                }
                Ok(Sym { shape: c.shape.clone(), elems: c.to_f64().into_iter().map(Elem::Known).collect(), int: c.is_int() })
            }
            _ => Err(ctx.err("this operation on an activation tensor is not supported (only constant / shape values can be folded)")),
        }
    }

    /// Elementwise fold of two non-activation values (numpy broadcasting).
    pub(crate) fn elementwise(&self, ctx: &Ctx, a: &Val, b: &Val, op: &str) -> Result<Val> {
        let sa = self.small(ctx, a)?;
        let sb = self.small(ctx, b)?;
        let shape = broadcast_shape(&sa.shape, &sb.shape).ok_or_else(|| {
            ctx.err(format!(
                "shapes {:?} and {:?} do not broadcast",
                sa.shape, sb.shape
            ))
        })?;
        let numel = small_numel(&shape)
            .ok_or_else(|| ctx.err(format!("broadcast result {shape:?} is too large to fold")))?;
        self.st.budget.check(ctx, Charge::Fold(numel))?;
        let int = sa.int && sb.int;
        let bop = match op {
            "Add" => Bop::Add,
            "Sub" => Bop::Sub,
            "Mul" => Bop::Mul,
            "Div" => Bop::Div,
            "Min" => Bop::Min,
            _ => Bop::Max,
        };
        let mut elems = Vec::with_capacity(numel);
        let mut ex = self.st.ex.borrow_mut();
        for_each_index(&shape, |idx| {
            let x = sa.elems[broadcast_index(&sa.shape, &shape, idx)];
            let y = sb.elems[broadcast_index(&sb.shape, &shape, idx)];
            let r = ex.bin(bop, x, y);
            elems.push(if int && bop == Bop::Div {
                ex.un(Round::Trunc, r)
            } else {
                r
            });
        });
        Ok(Val::Sym(Sym { shape, elems, int }))
    }

    /// Shapes of the partial IR on several windows (multiples of its spatial divisor, different per
    /// axis so that mixed-up axes show), N = 1 and 2; sizes the input fixes (batch, window axes)
    /// are used as declared, and a fully fixed input is probed once, at its own size.
    /// Returns (shapes, window) pairs. Each shape inference of the partial IR is charged to the
    /// work budget, and the result is reused until a node is added (a chain of no-op Reshapes
    /// probes once); with a fully fixed input the nodes added since are inferred incrementally.
    pub(crate) fn probe(&self, ctx: &Ctx, _x: ValueId) -> Result<Probes> {
        if let Some((len, p)) = &*self.st.probe_cache.borrow() {
            if *len == self.nodes.len() {
                return Ok(p.clone());
            }
        }
        if let Some(p) = self.probe_incremental(ctx)? {
            return Ok(p);
        }
        let cost = self.nodes.len() as u64 + self.values.len() as u64 + 1;
        self.st.budget.charge(ctx, Charge::Work(cost))?;
        let d = spatial_divisor_raw(self.values, self.nodes, self.input);
        let fixed_all =
            self.st.fixed_batch.is_some() && self.st.fixed_window.iter().all(|f| f.is_some());
        let want = if fixed_all { 1 } else { 4 };
        let mut out = vec![];
        let mut last_err = None;
        for m in 1..40usize {
            let Some(mut w) = probe_window(d, m) else {
                break;
            };
            for (a, f) in self.st.fixed_window.iter().enumerate() {
                if let Some(f) = f {
                    w[a] = *f;
                }
            }
            let n = self.st.fixed_batch.unwrap_or(1 + (m % 2));
            self.st.budget.charge(ctx, Charge::Work(cost))?;
            match infer_shapes_raw(self.values, self.nodes, self.input, n, w) {
                Ok(s) => {
                    out.push((s, w));
                    if out.len() == want {
                        let p = Rc::new(out);
                        *self.st.probe_cache.borrow_mut() = Some((self.nodes.len(), p.clone()));
                        return Ok(p);
                    }
                }
                Err(e) if fixed_all => {
                    last_err = Some(e);
                    break;
                }
                Err(_) => {}
            }
        }
        match last_err {
            Some(e) => Err(ctx.err(format!(
                "the model so far does not fit its own input size: {e}"
            ))),
            None => Err(ctx.err(
                "cannot evaluate the shape computation: no probe window fits the model so far",
            )),
        }
    }

    /// With a fully fixed input (one probe), the cached shapes extended by the nodes added since.
    fn probe_incremental(&self, ctx: &Ctx) -> Result<Option<Probes>> {
        let fixed_all =
            self.st.fixed_batch.is_some() && self.st.fixed_window.iter().all(|f| f.is_some());
        let cached = self.st.probe_cache.borrow().clone();
        let Some((len, p)) = cached.filter(|_| fixed_all) else {
            return Ok(None);
        };
        let [(shapes, w)] = p.as_slice() else {
            return Ok(None);
        };
        let mut shapes = shapes.clone();
        shapes.resize(self.values.len(), Dims::from([0; 5]));
        let fresh = self.nodes.get(len..).unwrap_or(&[]);
        self.st
            .budget
            .charge(ctx, Charge::Work(fresh.len() as u64 + 1))?;
        for node in fresh {
            let ins: Option<Vec<Dims>> = node
                .inputs
                .iter()
                .map(|&i| shapes.get(i).copied())
                .collect();
            let Some(ins) = ins else { return Ok(None) };
            let out = node.op.output_dims(&ins).map_err(|e| {
                ctx.err(format!("node \"{}\" ({}): {e}", node.name, node.op.name()))
            })?;
            if let Some(s) = shapes.get_mut(node.output) {
                *s = out;
            }
        }
        let p = Rc::new(vec![(shapes, *w)]);
        *self.st.probe_cache.borrow_mut() = Some((self.nodes.len(), p.clone()));
        Ok(Some(p))
    }
}
