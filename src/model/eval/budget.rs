//! The budgets that bound one import's folding, charged in one place. A hostile file can only
//! make voxtile fold so many elements of shape values ([`FOLD_BUDGET`]), allocate so many bytes
//! of folded constants (a base plus a multiple of the model's own weights), and take so many
//! steps of shape evaluation ([`WORK_BUDGET`]); past any of them the import stops at once.

use crate::model::decode::node::Ctx;
use crate::Result;
use std::cell::Cell;

/// Elements that constant folding may produce over the whole import (folded tensors and the
/// symbolic expressions built for them): real exports fold a few hundred, and this keeps a small
/// hostile file (400 ConstantOfShape of 4 M elements each) far below the machine's memory.
pub(crate) const FOLD_BUDGET: usize = 1 << 22;

/// Steps of shape evaluation (probe shape inference per node, expression nodes evaluated) over
/// the whole import: about a second of work, a hundred times what a real model needs.
pub(crate) const WORK_BUDGET: u64 = 1 << 24;

/// Largest constant one fold may produce (elements).
pub(crate) const MAX_CONST_ELEMS: usize = 1 << 26;

/// Bytes that constant folds may allocate over a whole import, on top of [`CONST_WEIGHT_FACTOR`]
/// times the bytes of the model's own initializers: a real export computes masks of the size of
/// what its weights compute with, while a small hostile file stays at a few hundred megabytes.
pub(crate) const CONST_BASE_BYTES: usize = 1 << 28;

/// The multiple of the initializers' bytes added to [`CONST_BASE_BYTES`].
pub(crate) const CONST_WEIGHT_FACTOR: usize = 8;

/// One charge against the budgets.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Charge {
    /// Elements of folded shape values and expression nodes ([`FOLD_BUDGET`]).
    Fold(usize),
    /// A folded constant of `elems` elements of `bytes` each.
    Const { elems: usize, bytes: usize },
    /// Steps of shape evaluation ([`WORK_BUDGET`]).
    Work(u64),
}

impl Charge {
    /// A folded constant of `elems` elements, i64 when `int`, else f32.
    pub fn constant(elems: usize, int: bool) -> Charge {
        let bytes = if int { 8 } else { 4 };
        Charge::Const { elems, bytes }
    }
}

/// What is left of each budget.
pub(crate) struct Budget {
    fold_left: Cell<usize>,
    const_left: Cell<usize>,
    /// The whole constant budget of this model, in bytes (for messages).
    const_total: usize,
    work_left: Cell<u64>,
    /// Expression nodes already charged to the fold budget.
    exprs_charged: Cell<usize>,
    /// Set when a charge failed: the import stops at once (no list of unsupported ops).
    hit: Cell<bool>,
}

impl Budget {
    /// The budgets of a model whose initializers take `weight_bytes`.
    pub fn new(weight_bytes: usize) -> Budget {
        let const_total =
            CONST_BASE_BYTES.saturating_add(weight_bytes.saturating_mul(CONST_WEIGHT_FACTOR));
        Budget {
            fold_left: Cell::new(FOLD_BUDGET),
            const_left: Cell::new(const_total),
            const_total,
            work_left: Cell::new(WORK_BUDGET),
            exprs_charged: Cell::new(0),
            hit: Cell::new(false),
        }
    }

    /// Whether a charge has failed.
    pub fn hit(&self) -> bool {
        self.hit.get()
    }

    /// Spend `c`, or refuse it (and stop the import) when it does not fit.
    pub fn charge(&self, ctx: &Ctx, c: Charge) -> Result<()> {
        self.take(ctx, c, true)
    }

    /// Refuse `c` when it would not fit, spending nothing (before an allocation whose result is
    /// charged when it is bound).
    pub fn check(&self, ctx: &Ctx, c: Charge) -> Result<()> {
        self.take(ctx, c, false)
    }

    /// Charge the expression nodes built since the last call (the arena holds `built`).
    pub fn charge_exprs(&self, ctx: &Ctx, built: usize) -> Result<()> {
        let new = built.saturating_sub(self.exprs_charged.replace(built));
        self.charge(ctx, Charge::Fold(new))
    }

    fn take(&self, ctx: &Ctx, c: Charge, spend: bool) -> Result<()> {
        let refuse = |msg: String| {
            self.hit.set(true);
            Err(ctx.err(msg))
        };
        match c {
            Charge::Fold(elems) => {
                let left = self.fold_left.get();
                if elems > left {
                    return refuse(format!(
                        "folding its constant/shape computation needs {elems} elements; with the \
                         folds before it, that is more than the {FOLD_BUDGET} voxtile allows for a model"
                    ));
                }
                if spend {
                    self.fold_left.set(left - elems);
                }
            }
            Charge::Const { elems, bytes } => {
                if elems > MAX_CONST_ELEMS {
                    return Err(ctx.err(format!(
                        "folding its constant computation makes {elems} elements, more than the \
                         {MAX_CONST_ELEMS} voxtile allows for one value"
                    )));
                }
                let need = elems * bytes;
                let left = self.const_left.get();
                if need > left {
                    return refuse(format!(
                        "folding its constant computation needs {need} bytes; with the folds \
                         before it, that is more than the {} bytes voxtile allows for this model",
                        self.const_total
                    ));
                }
                if spend {
                    self.const_left.set(left - need);
                }
            }
            Charge::Work(steps) => {
                let left = self.work_left.get();
                if steps > left {
                    return refuse(format!(
                        "evaluating the model's shape computations takes more than {WORK_BUDGET} \
                         steps; the graph is too large or too deep to fold"
                    ));
                }
                if spend {
                    self.work_left.set(left - steps);
                }
            }
        }
        Ok(())
    }
}
