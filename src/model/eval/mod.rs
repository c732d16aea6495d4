//! The evaluator of constants and shape values: one import's folds, apart from its lowering.
//!
//! Exporters compute shapes, masks and indices in the graph. What the lowering does not turn into
//! IR ops is folded here, on constants ([`Const`](super::decode::Const)) and on symbolic tensors
//! ([`Sym`](super::sym::Sym), elements that may read activation sizes) alike: the element moves ([`moves`]), the constant fast path
//! ([`constfold`], [`constmove`]), the comparison and scatter folds ([`fold`]), the one-input folds
//! of shape values ([`plumb`]), and the evaluation of window-dependent values on probe windows of
//! the partial IR ([`symbolic`]). Every fold is paid from the import's budgets ([`budget`]).
//!
//! Its state is its own ([`Folder`]: budgets, expressions, probe cache, the input's fixed sizes);
//! it reads the ONNX bindings and the IR built so far, and changes neither ([`Eval`]).

pub(crate) mod budget;
pub(crate) mod constfold;
mod constmove;
pub(crate) mod fold;
pub(crate) mod moves;
mod plumb;
pub(crate) mod symbolic;

use super::decode::node::Ctx;
use super::decode::proto;
use super::decode::values::{OnnxValues, Val};
use super::graph::{Node, Value, ValueId};
use super::sym::Exprs;
use crate::Result;
use budget::{Budget, Charge};
use std::cell::{RefCell, RefMut};
use std::path::Path;
use symbolic::Probes;

/// Largest constant that shape-plumbing ops (Gather, Slice, elementwise folds...) will touch.
pub(crate) const SMALL: usize = 1 << 22;

/// The evaluator's own state for one import.
pub(crate) struct Folder<'a> {
    /// Where the model file is (constants decoded from attributes, error messages).
    path: &'a Path,
    dir: Option<&'a Path>,
    /// Symbolic expressions of this import.
    ex: RefCell<Exprs>,
    /// What is left of the folding budgets.
    budget: Budget,
    /// Probes of the IR as it was when it had this many nodes (reused while no node is added).
    probe_cache: RefCell<Option<(usize, Probes)>>,
    /// Window sizes the input declares (probes use them: exports bake them into Reshape targets).
    fixed_window: [Option<usize>; 3],
    /// Batch size the input declares.
    fixed_batch: Option<usize>,
}

impl<'a> Folder<'a> {
    /// The evaluator of a model whose initializers take `weight_bytes` and whose input declares
    /// `fixed_window` and `fixed_batch`.
    pub(crate) fn new(
        path: &'a Path,
        dir: Option<&'a Path>,
        weight_bytes: usize,
        fixed_window: [Option<usize>; 3],
        fixed_batch: Option<usize>,
    ) -> Self {
        Folder {
            path,
            dir,
            ex: RefCell::new(Exprs::default()),
            budget: Budget::new(weight_bytes),
            probe_cache: RefCell::new(None),
            fixed_window,
            fixed_batch,
        }
    }

    /// The expression arena (a `Shape` of an activation builds its dimensions here).
    pub(crate) fn exprs(&self) -> RefMut<'_, Exprs> {
        self.ex.borrow_mut()
    }

    /// Whether a budget ran out: the import stops at once (no list of unsupported ops).
    pub(crate) fn budget_hit(&self) -> bool {
        self.budget.hit()
    }

    /// Charge a folded value of `elems` elements when it is bound, with the expression nodes
    /// built since the last charge.
    pub(crate) fn charge_bound(&self, ctx: &Ctx, elems: usize) -> Result<()> {
        let built = self.ex.borrow().len();
        self.budget.charge(ctx, Charge::Fold(elems))?;
        self.budget.charge_exprs(ctx, built)
    }
}

/// The evaluator at one node: its state, the ONNX bindings and the IR built so far, all read-only.
pub(crate) struct Eval<'a> {
    pub st: &'a Folder<'a>,
    pub vals: &'a OnnxValues,
    pub values: &'a [Value],
    pub nodes: &'a [Node],
    pub input: ValueId,
}

impl Eval<'_> {
    /// Operand `i` of `n`. Copies of folded values are work: a big one read by many nodes must
    /// not be free.
    pub(crate) fn get(&self, ctx: &Ctx, n: &proto::NodeProto, i: usize) -> Result<Val> {
        let name = n
            .input
            .get(i)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| ctx.err(format!("input {i} is missing")))?;
        let v = self
            .vals
            .get(name)
            .ok_or_else(|| ctx.err(format!("input \"{name}\" is not available")))?;
        if let Val::Sym(s) = v {
            self.st
                .budget
                .charge(ctx, Charge::Work(s.elems.len() as u64))?;
        }
        Ok(v.clone())
    }

    /// Operand `i` of `n`, None when absent.
    pub(crate) fn get_opt(&self, ctx: &Ctx, n: &proto::NodeProto, i: usize) -> Result<Option<Val>> {
        match n.input.get(i) {
            Some(s) if !s.is_empty() => self.get(ctx, n, i).map(Some),
            _ => Ok(None),
        }
    }
}
