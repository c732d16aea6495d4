//! Lowering of the matrix products and norms of transformer blocks: MatMul (two activations ->
//! [`Op::MatMul`], an activation times a constant matrix -> [`Op::Linear`]), Gemm (-> Linear),
//! two-operand Einsum that is a batched matrix product (-> Transposes around a MatMul), and
//! LayerNormalization (-> [`Op::LayerNorm`]).

use super::{attr, proto, Const, Ctx, Lowerer, Op, Result, Tensor, Val};
use crate::model::decode::node::sattr;
use crate::model::ops::{LayerNorm, Linear};

/// How a two-operand einsum maps onto `MatMul`: the permutations that bring each operand to
/// `[batch..., rows, k]` / `[batch..., k, cols]`, and the one that orders the product's
/// `[batch..., rows, cols]` as the equation's output.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct EinsumPlan {
    pub a: Vec<usize>,
    pub b: Vec<usize>,
    pub out: Vec<usize>,
}

/// The plan of equation `eq`: indices in both inputs and the output are batch, in one input and
/// the output free (one per input), in both inputs but not the output contracted (exactly one).
pub(super) fn einsum_plan(eq: &str) -> std::result::Result<EinsumPlan, String> {
    let eq: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, out) = eq
        .split_once("->")
        .ok_or("an equation without an explicit output (->)")?;
    let ins: Vec<&str> = lhs.split(',').collect();
    let [a, b] = ins[..] else {
        return Err(format!("{} operands (only two are supported)", ins.len()));
    };
    let ok = |s: &str| {
        s.chars().all(|c| c.is_ascii_alphabetic())
            && s.chars().enumerate().all(|(i, c)| !s[i + 1..].contains(c))
    };
    if !ok(a) || !ok(b) || !ok(out) {
        return Err("ellipses or repeated indices (diagonals) are not supported".into());
    }
    let batch: Vec<char> = out
        .chars()
        .filter(|&c| a.contains(c) && b.contains(c))
        .collect();
    let free = |s: &str, t: &str| -> Vec<char> {
        s.chars()
            .filter(|&c| out.contains(c) && !t.contains(c))
            .collect()
    };
    let (fa, fb) = (free(a, b), free(b, a));
    let k: Vec<char> = a
        .chars()
        .filter(|&c| b.contains(c) && !out.contains(c))
        .collect();
    let summed = a
        .chars()
        .chain(b.chars())
        .any(|c| !out.contains(c) && !k.contains(&c));
    let stray = out.chars().any(|c| !a.contains(c) && !b.contains(c));
    if fa.len() != 1 || fb.len() != 1 || k.len() != 1 || summed || stray {
        return Err(format!(
            "\"{eq}\" is not a batched matrix product (one free index per operand, one contracted)"
        ));
    }
    let pos = |s: &str, c: char| s.chars().position(|x| x == c).unwrap_or(0);
    let mut pa: Vec<usize> = batch.iter().map(|&c| pos(a, c)).collect();
    let mut pb: Vec<usize> = batch.iter().map(|&c| pos(b, c)).collect();
    pa.extend([pos(a, fa[0]), pos(a, k[0])]);
    pb.extend([pos(b, k[0]), pos(b, fb[0])]);
    let mut prod: Vec<char> = batch.clone();
    prod.extend([fa[0], fb[0]]);
    let po: Vec<usize> = out
        .chars()
        .map(|c| prod.iter().position(|&x| x == c).unwrap_or(0))
        .collect();
    Ok(EinsumPlan {
        a: pa,
        b: pb,
        out: po,
    })
}

fn identity(p: &[usize]) -> bool {
    p.iter().enumerate().all(|(i, &v)| i == v)
}

/// `k` as a `[K, N]` matrix (leading 1s dropped).
fn matrix(ctx: &Ctx, k: Const) -> Result<Tensor> {
    let lead = k.shape.len().saturating_sub(2);
    if k.shape.len() < 2 || k.shape[..lead].iter().any(|&d| d != 1) {
        return Err(ctx.err(format!(
            "multiplying by a constant of shape {:?} (only [K, N] matrices are supported)",
            k.shape
        )));
    }
    Ok(Tensor::new(k.shape[lead..].to_vec(), k.into_f32()))
}

impl Lowerer<'_> {
    /// MatMul: two activations, or an activation times a constant matrix.
    pub(super) fn matmul(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let a = self.get(ctx, n, 0)?;
        let b = self.get(ctx, n, 1)?;
        match (a, b) {
            (Val::Act(x), Val::Act(y)) => {
                self.emit_tensor(ctx, n, Op::MatMul, vec![x, y], None)?;
            }
            (Val::Act(x), _) => {
                let k = self.take_cst(ctx, n, 1, "matrix")?;
                let weight = matrix(ctx, k)?;
                let op = Op::Linear(Linear { weight, bias: None });
                self.emit_tensor(ctx, n, op, vec![x], None)?;
            }
            (_, Val::Act(_)) => {
                return Err(ctx
                    .err("a constant times an activation (constant on the left) is not supported"))
            }
            _ => return Err(ctx.err("a product of two constants is not folded")),
        }
        Ok(())
    }

    /// Gemm `alpha·A·op(B) + beta·C` with A an activation, B and C constants.
    pub(super) fn gemm(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let x = self.act(ctx, n, 0)?;
        let i = |name: &str| attr(n, name).and_then(|a| a.i).unwrap_or(0);
        let f = |name: &str| attr(n, name).and_then(|a| a.f).unwrap_or(1.0);
        if i("transA") != 0 {
            return Err(ctx.err("attribute transA=1 is not supported"));
        }
        let k = self.take_cst(ctx, n, 1, "B")?;
        if k.shape.len() != 2 {
            return Err(ctx.err(format!("B of shape {:?} is not a matrix", k.shape)));
        }
        let (r, c) = (k.shape[0], k.shape[1]);
        let mut d = k.into_f32();
        let alpha = f("alpha");
        let weight = if i("transB") != 0 {
            let mut t = vec![0.0; d.len()];
            for p in 0..r {
                for q in 0..c {
                    t[q * r + p] = alpha * d[p * c + q];
                }
            }
            Tensor::new(vec![c, r], t)
        } else {
            d.iter_mut().for_each(|v| *v *= alpha);
            Tensor::new(vec![r, c], d)
        };
        let nout = weight.shape[1];
        let bias = match self.get_opt(ctx, n, 2)? {
            None => None,
            Some(_) => {
                let cb = self.cst(ctx, n, 2, "C")?;
                let beta = f("beta");
                let v = cb.to_f32();
                let per_n = cb.shape.iter().rev().skip(1).all(|&s| s == 1);
                let data = match v.len() {
                    1 => vec![beta * v[0]; nout],
                    l if l == nout && per_n => v.iter().map(|x| beta * x).collect(),
                    _ => {
                        return Err(ctx.err(format!(
                            "C of shape {:?} (only a bias per output column is supported)",
                            cb.shape
                        )))
                    }
                };
                Some(Tensor::new(vec![nout], data))
            }
        };
        self.emit_tensor(ctx, n, Op::Linear(Linear { weight, bias }), vec![x], None)?;
        Ok(())
    }

    /// Two-operand Einsum that is a batched matrix product: Transposes + MatMul (+ Transpose).
    pub(super) fn einsum(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let eq = sattr(n, "equation", "");
        let plan = einsum_plan(&eq).map_err(|e| ctx.err(format!("equation {e}")))?;
        if n.input.len() != 2 {
            return Err(ctx.err(format!("has {} inputs, expected 2", n.input.len())));
        }
        let (mut x, mut y) = (self.act(ctx, n, 0)?, self.act(ctx, n, 1)?);
        if self.rank_of(ctx, x)? != plan.a.len() || self.rank_of(ctx, y)? != plan.b.len() {
            return Err(ctx.err(format!("operand ranks do not match the equation \"{eq}\"")));
        }
        if !identity(&plan.a) {
            let op = Op::Transpose { perm: plan.a };
            x = self.emit_tensor(ctx, n, op, vec![x], Some("_a".into()))?;
        }
        if !identity(&plan.b) {
            let op = Op::Transpose { perm: plan.b };
            y = self.emit_tensor(ctx, n, op, vec![y], Some("_b".into()))?;
        }
        if identity(&plan.out) {
            self.emit_tensor(ctx, n, Op::MatMul, vec![x, y], None)?;
        } else {
            let m = self.emit_tensor(ctx, n, Op::MatMul, vec![x, y], Some("_mm".into()))?;
            self.emit_tensor(ctx, n, Op::Transpose { perm: plan.out }, vec![m], None)?;
        }
        Ok(())
    }

    /// LayerNormalization over the axes from `axis` (default -1) on, scale and optional bias.
    pub(super) fn layer_norm(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let x = self.act(ctx, n, 0)?;
        let axis = attr(n, "axis").and_then(|a| a.i).unwrap_or(-1);
        let eps = attr(n, "epsilon").and_then(|a| a.f).unwrap_or(1e-5);
        if attr(n, "stash_type").and_then(|a| a.i).unwrap_or(1) != 1 {
            return Err(ctx.err("stash_type other than float32 is not supported"));
        }
        let s = self.cst(ctx, n, 1, "scale")?;
        let scale = Tensor::new(vec![s.len()], s.to_f32());
        let bias = match self.get_opt(ctx, n, 2)? {
            None => None,
            Some(_) => {
                let b = self.cst(ctx, n, 2, "bias")?;
                Some(Tensor::new(vec![b.len()], b.to_f32()))
            }
        };
        let op = Op::LayerNorm(LayerNorm {
            axis,
            eps,
            scale,
            bias,
        });
        self.emit_tensor(ctx, n, op, vec![x], None)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn einsum_plans() {
        // MONAI SABlock: q·kᵀ and attention·v.
        let p = einsum_plan("bhxd,bhyd->bhxy").unwrap();
        assert_eq!(
            (p.a, p.b, p.out),
            (vec![0, 1, 2, 3], vec![0, 1, 3, 2], vec![0, 1, 2, 3])
        );
        let p = einsum_plan("bhxy,bhyd->bhxd").unwrap();
        assert_eq!(
            (p.a, p.b, p.out),
            (vec![0, 1, 2, 3], vec![0, 1, 2, 3], vec![0, 1, 2, 3])
        );
        // Output rows and columns swapped, batch order from the output.
        let p = einsum_plan("ik,bkj->bji").unwrap_err();
        assert!(p.contains("batched"), "{p}");
        let p = einsum_plan("hbik,bhkj->bhji").unwrap();
        assert_eq!(
            (p.a, p.b, p.out),
            (vec![1, 0, 2, 3], vec![0, 1, 2, 3], vec![0, 1, 3, 2])
        );
        assert!(einsum_plan("bij,bjk").is_err());
        assert!(einsum_plan("bii,bij->bj").is_err());
        assert!(einsum_plan("bij,bjk,bkl->bil").is_err());
        assert!(einsum_plan("bijm,bjk->bik").is_err());
    }
}
