//! Fast folding of pure constants: when every operand of a node is a known constant, the node is
//! computed directly on the `Const` data (f32 / i64 vectors, numpy broadcasting) instead of going
//! through the symbolic [`Sym`](crate::model::sym::Sym) machinery (an `Elem` enum per element). Transformer exports compute
//! attention masks and relative-position indices in the graph this way (SwinUNETR: tens of millions
//! of elements); the symbolic path stays for what depends on activation sizes.
//!
//! Results are charged, in bytes actually allocated, to the import's constant budget (see
//! [`super::budget`]); a single folded value may hold at most [`super::budget::MAX_CONST_ELEMS`] elements.
//! Booleans (Equal, Not, Cast to bool...) are kept as f32 0/1: exact, and half the bytes of i64.

use super::budget::Charge;
use super::moves::Folded;
use super::symbolic::sym_to_const;
use super::Eval;
use crate::model::decode::node::{attr, to_i64, Ctx};
use crate::model::decode::values::Val;
use crate::model::decode::{proto, Const, Data};
use crate::model::ew_fold::{self, Ew};
use crate::model::sym::broadcast_shape;
use crate::Result;

/// Operators with a constant-only fast path.
const FAST_OPS: [&str; 26] = [
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Min",
    "Max",
    "Equal",
    "Less",
    "Greater",
    "Mod",
    "Not",
    "Where",
    "Neg",
    "Cast",
    "Reshape",
    "Transpose",
    "Slice",
    "Gather",
    "Concat",
    "Expand",
    "Unsqueeze",
    "Squeeze",
    "ScatterND",
    "GatherND",
    "ConstantOfShape",
    "Range",
];

/// Operators whose inputs after the first are shapes, indices or axes.
const SHAPE_OPERANDS: [&str; 6] = [
    "Reshape",
    "Expand",
    "Slice",
    "Gather",
    "Unsqueeze",
    "Squeeze",
];

pub(crate) use crate::model::ew_fold::at;

/// The values as i64 (indices, shapes, axes).
pub(crate) fn ints_of(ctx: &Ctx, c: &Const, what: &str) -> Result<Vec<i64>> {
    match &c.data {
        Data::I(v) => Ok(v.clone()),
        Data::F(v) => v.iter().map(|&x| to_i64(ctx, x as f64, what)).collect(),
    }
}

impl Eval<'_> {
    /// `n` folded directly when all its inputs are known constants and its operator has a fast
    /// path; Ok(None) leaves it to the general lowering.
    pub(crate) fn const_fold(&self, n: &proto::NodeProto, ctx: &Ctx) -> Result<Option<Const>> {
        let op = n.op_type();
        if !FAST_OPS.contains(&op) || n.input.is_empty() || n.output.len() != 1 {
            return Ok(None);
        }
        // Slice/Squeeze/Unsqueeze with attributes (old opsets) go the general way.
        if matches!(op, "Slice") && n.input.len() < 3 {
            return Ok(None);
        }
        // Known symbolic values (shape arithmetic) become constants; anything else leaves.
        // Shape operands (Reshape targets...) that read the sizes of a fixed input are evaluated.
        let mut owned: Vec<Option<Const>> = vec![];
        for (i, name) in n.input.iter().enumerate() {
            owned.push(match self.vals.get(name) {
                _ if name.is_empty() => None,
                Some(Val::Const(_)) => None,
                Some(Val::Sym(s)) => match sym_to_const(s) {
                    Some(c) => Some(c),
                    None if i > 0 && SHAPE_OPERANDS.contains(&op) => {
                        match self.values_of(ctx, s, "a shape operand") {
                            Ok(v) => Some(Const::from_values(s.shape.clone(), v, true)),
                            Err(_) => return Ok(None),
                        }
                    }
                    None => return Ok(None),
                },
                _ => return Ok(None),
            });
        }
        let vals = self.vals;
        let refs: Vec<Option<&Const>> = n
            .input
            .iter()
            .zip(&owned)
            .map(|(name, o)| match (o, vals.get(name)) {
                (Some(c), _) => Some(c),
                (None, Some(Val::Const(c))) => Some(&**c),
                _ => None,
            })
            .collect();
        self.const_op(n, ctx, &refs).map(Some)
    }

    pub(crate) fn const_op(
        &self,
        n: &proto::NodeProto,
        ctx: &Ctx,
        ins: &[Option<&Const>],
    ) -> Result<Const> {
        let input = |i: usize| -> Result<&Const> {
            ins.get(i)
                .copied()
                .flatten()
                .ok_or_else(|| ctx.err(format!("input {i} is missing")))
        };
        let op = n.op_type();
        match op {
            "Reshape" => self.c_reshape(n, ctx, input(0)?, input(1)?),
            "Transpose" => self.transpose(n, ctx, input(0)?),
            "Slice" => self.slice(n, ctx, input(0)?),
            "Gather" => self.gather(n, ctx, input(0)?),
            "Concat" => self.c_concat(n, ctx, ins),
            "Expand" => self.expand(n, ctx, input(0)?),
            "Unsqueeze" | "Squeeze" => self.squeeze(n, ctx, input(0)?),
            "ScatterND" => self.scatter_nd(n, ctx, input(0)?, input(2)?),
            "GatherND" => self.gather_nd(n, ctx, input(0)?),
            "ConstantOfShape" => self.constant_of_shape(n, ctx),
            "Range" => self.range(n, ctx),
            _ => self.c_elementwise(n, ctx, ins),
        }
    }

    /// Every elementwise op, numpy broadcasting over all inputs, computed in f64 per element.
    fn c_elementwise(
        &self,
        n: &proto::NodeProto,
        ctx: &Ctx,
        ins: &[Option<&Const>],
    ) -> Result<Const> {
        let op = n.op_type();
        let want = match op {
            "Not" | "Neg" | "Cast" => 1,
            "Where" => 3,
            _ => 2,
        };
        let cs: Vec<&Const> = ins.iter().flatten().copied().collect();
        if cs.len() != want || ins.len() != want {
            return Err(ctx.err(format!("has {} inputs, expected {want}", ins.len())));
        }
        let mut shape = cs[0].shape.clone();
        for c in &cs[1..] {
            shape = broadcast_shape(&shape, &c.shape).ok_or_else(|| {
                ctx.err(format!(
                    "shapes {shape:?} and {:?} do not broadcast",
                    c.shape
                ))
            })?;
        }
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let numel = numel.ok_or_else(|| ctx.err("the result is too large to fold"))?;
        let to = attr(n, "to").and_then(|a| a.i).unwrap_or(1);
        // Output kind: i64 for integer arithmetic, f32 for floats and booleans.
        let int = match op {
            "Equal" | "Less" | "Greater" | "Not" => false,
            "Cast" => !matches!(to, 1 | 9 | 10 | 11 | 16),
            "Where" => cs[1].is_int() && cs[2].is_int(),
            _ => cs.iter().all(|c| c.is_int()),
        };
        self.st.budget.charge(ctx, Charge::constant(numel, int))?;
        let fmod = attr(n, "fmod").and_then(|a| a.i).unwrap_or(0) != 0;
        // The operator resolved once, not per element.
        let kind = match op {
            "Add" => Ew::Add,
            "Sub" => Ew::Sub,
            "Mul" => Ew::Mul,
            "Div" if int => Ew::IDiv,
            "Div" => Ew::Div,
            "Min" => Ew::Min,
            "Max" => Ew::Max,
            "Equal" => Ew::Equal,
            "Less" => Ew::Less,
            "Greater" => Ew::Greater,
            "Not" => Ew::Not,
            "Neg" => Ew::Neg,
            "Cast" if to == 9 => Ew::ToBool,
            "Cast" if int => Ew::Trunc,
            "Cast" => Ew::Copy,
            "Where" => Ew::Where,
            _ if fmod => Ew::Fmod,
            _ => Ew::Mod,
        };
        // Every element of a divisor is read once the output is not empty.
        if kind.divides() && numel > 0 && (0..cs[1].len()).any(|i| at(&cs[1].data, i) == 0.0) {
            return Err(ctx.err(if kind == Ew::IDiv {
                "integer division by zero"
            } else {
                "modulo by zero"
            }));
        }
        let operands: Vec<(&Data, &[usize])> =
            cs.iter().map(|c| (&c.data, c.shape.as_slice())).collect();
        let data = if int {
            Data::I(ew_fold::fold(kind, &operands, &shape, |v| v as i64))
        } else {
            Data::F(ew_fold::fold(kind, &operands, &shape, |v| v as f32))
        };
        Ok(Const { shape, data })
    }
}
