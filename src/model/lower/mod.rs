//! Lowering of a decoded ONNX graph to the IR.
//!
//! Nodes are visited in a topological order ([`topo_order`]: hostile files may be unsorted, cyclic
//! or dangling). Each ONNX value becomes one of [`Val`]: an NCDHW activation, a constant, a small
//! symbolic tensor (shape plumbing computed from `Shape(x)`), or one of the two intermediate states
//! of PyTorch's GroupNorm export. What is not an IR op is folded by the evaluator
//! ([`crate::model::eval`]); what depends on the window size it evaluates by running shape
//! inference of the partial IR on several probe windows.

use super::decode::node::{attr, norm_axis, to_i64, Ctx, ATTR_LIMIT};
use super::decode::order::{input_signature, live_nodes, output_float, topo_order, InputSignature};
use super::decode::values::{OnnxValues, Val};
use super::decode::{decode_tensor, proto, Const, Data, Float};
use super::eval::moves::squeeze_shape;
use super::eval::symbolic::{small_numel, sym_to_const};
use super::eval::{fold::FOLD_OPS, Eval, Folder};
use super::graph::*;
use super::sym::{Elem, Sym};
use crate::error::UnsupportedOp;
use crate::{Error, Result};
use std::path::Path;
use std::rc::Rc;

mod activation;
mod binary;
mod conv;
mod half;
mod math;
mod matmul;
mod norm;
mod pad;
mod plumbing;
mod pool;
mod reshape;
mod resize;
mod tensor;

use norm::to5;

struct Lowerer<'a> {
    path: &'a Path,
    dir: Option<&'a Path>,
    opset: i64,
    /// The ONNX values: bindings, aliases, readers.
    vals: OnnxValues,
    values: Vec<Value>,
    nodes: Vec<Node>,
    input: ValueId,
    /// The evaluator of constants and shape values (its budgets, expressions and probes).
    folder: Folder<'a>,
    /// Index of the node producing each IR value (None for the input).
    producer: Vec<Option<usize>>,
    /// Every construct voxtile could not lower, in graph order (see [`MAX_LISTED`]).
    unsupported: Vec<UnsupportedOp>,
}

/// Unsupported constructs named in one error; a hostile file with thousands stops there.
const MAX_LISTED: usize = 32;

pub(crate) fn lower(model: &proto::ModelProto, dir: Option<&Path>, path: &Path) -> Result<Graph> {
    let g = model
        .graph
        .as_ref()
        .ok_or_else(|| Error::model(path, "the model has no graph"))?;
    let opset = model
        .opset_import
        .iter()
        .find(|o| matches!(o.domain(), "" | "ai.onnx"))
        .map(|o| o.version())
        .unwrap_or(17);
    let mut vals = OnnxValues::default();
    let mut weight_bytes = 0usize;
    for t in &g.initializer {
        let c = decode_tensor(t, dir, path)?;
        weight_bytes = weight_bytes.saturating_add(c.len() * if c.is_int() { 8 } else { 4 });
        vals.insert(t.name().to_string(), Val::Const(Rc::new(c)));
    }
    let acts = super::decode::activation_inputs(g);
    if acts.len() != 1 {
        let names: Vec<&str> = acts.iter().map(|i| i.name()).collect();
        return Err(Error::model(
            path,
            format!(
                "voxtile needs exactly one input tensor, the model has {}: {names:?}",
                acts.len()
            ),
        ));
    }
    let inp = acts[0];
    let InputSignature {
        channels,
        fixed,
        batch,
        float,
    } = input_signature(inp, path)?;
    let mut lw = Lowerer {
        path,
        dir,
        opset,
        vals,
        values: vec![Value {
            name: inp.name().to_string(),
            channels,
        }],
        nodes: vec![],
        input: 0,
        folder: Folder::new(path, dir, weight_bytes, fixed, batch),
        producer: vec![None],
        unsupported: vec![],
    };
    // A half input holds half values: the engine's f32 window is rounded to them first.
    let stored = lw.store_as(0, float, &format!("{}_as_stored", inp.name()));
    lw.vals.insert(inp.name().to_string(), Val::Act(stored));

    let out_name = match g.output.first() {
        Some(o) => o.name().to_string(),
        None => return Err(Error::model(path, "the graph declares no output")),
    };
    if g.output.len() > 1 {
        tracing::warn!(
            "{}: the graph has {} outputs; using the first, \"{out_name}\"",
            path.display(),
            g.output.len()
        );
    }

    let order = topo_order(g, lw.vals.bound(), path)?;
    // Nodes the output does not need are never lowered: folding them could only cost time and
    // memory (a hostile file carries hundreds of unused ConstantOfShape).
    let live = live_nodes(g, &out_name);
    let order: Vec<usize> = order.into_iter().filter(|&i| live[i]).collect();
    lw.vals.count_reads(g, &order);

    let ctx_of = |i: usize| {
        let n = &g.node[i];
        let name = if n.name().is_empty() {
            format!("{}#{i}", n.op_type())
        } else {
            n.name().to_string()
        };
        let op = match n.domain() {
            "" | "ai.onnx" => n.op_type().to_string(),
            d => format!("{d}.{}", n.op_type()),
        };
        Ctx { path, name, op }
    };
    // Every construct the model needs that voxtile lacks, in one error: the import goes on past
    // each and lists them all.
    for &i in &order {
        lw.visit(&g.node[i], &ctx_of(i))?;
        if lw.unsupported.len() >= MAX_LISTED {
            break;
        }
    }
    if !lw.unsupported.is_empty() {
        return Err(Error::UnsupportedOps {
            path: path.to_path_buf(),
            ops: std::mem::take(&mut lw.unsupported),
        });
    }
    let declared = output_float(g);
    lw.finish(g, out_name, declared, fixed)
}

impl Lowerer<'_> {
    /// The IR once every node is lowered: the output resolved and named, the passes run, and the
    /// result validated.
    fn finish(
        mut self,
        g: &proto::GraphProto,
        out_name: String,
        declared: Float,
        fixed: [Option<usize>; 3],
    ) -> Result<Graph> {
        let path = self.path;
        let output = match self.vals.get(&out_name) {
            // A half output is what the model stores: rounded to its type.
            Some(Val::Act(v)) => self.store_as(*v, declared, &out_name),
            Some(_) => {
                return Err(Error::model(
                    path,
                    format!(
                    "graph output \"{out_name}\" is a constant or shape value, not an activation"
                ),
                ))
            }
            None => {
                return Err(Error::model(
                    path,
                    format!("graph output \"{out_name}\" is not computed by any node"),
                ))
            }
        };
        if output == self.input {
            return Err(Error::model(
                path,
                "the graph output is the input itself: the model computes nothing",
            ));
        }
        self.values[output].name = out_name;

        let mut graph = Graph {
            name: g.name().to_string(),
            values: self.values,
            nodes: self.nodes,
            input: self.input,
            output,
            fixed_input_spatial: fixed,
        };
        super::passes::run(&mut graph);
        graph
            .validate()
            .map_err(|e| Error::model(path, e.to_string()))?;
        Ok(graph)
    }

    /// The evaluator of constants and shape values, reading this import's bindings and IR.
    pub(super) fn ev(&self) -> Eval<'_> {
        Eval {
            st: &self.folder,
            vals: &self.vals,
            values: &self.values,
            nodes: &self.nodes,
            input: self.input,
        }
    }

    pub(super) fn get(&self, ctx: &Ctx, n: &proto::NodeProto, i: usize) -> Result<Val> {
        self.ev().get(ctx, n, i)
    }

    pub(super) fn get_opt(&self, ctx: &Ctx, n: &proto::NodeProto, i: usize) -> Result<Option<Val>> {
        self.ev().get_opt(ctx, n, i)
    }

    pub(super) fn act(&self, ctx: &Ctx, n: &proto::NodeProto, i: usize) -> Result<ValueId> {
        match self.get(ctx, n, i)? {
            Val::Act(v) => Ok(v),
            _ => Err(ctx.err(format!("input {i} (\"{}\") must be an activation tensor, but it is a constant or shape value", n.input[i]))),
        }
    }

    pub(super) fn cst(
        &self,
        ctx: &Ctx,
        n: &proto::NodeProto,
        i: usize,
        what: &str,
    ) -> Result<Const> {
        match self.get(ctx, n, i)? {
            Val::Const(c) => Ok(Rc::unwrap_or_clone(c)),
            Val::Sym(s) => sym_to_const(&s).ok_or_else(|| ctx.err(format!("{what} (input {i}) depends on the window size and cannot be folded to a constant"))),
            _ => Err(ctx.err(format!("{what} (input {i}) must be a constant (initializer or folded constant)"))),
        }
    }

    /// [`Self::cst`] for the node that reads the constant last: its binding is dropped, so a
    /// weight the file holds once is moved into the IR, not copied (W1 has 125 MB of them).
    pub(super) fn take_cst(
        &mut self,
        ctx: &Ctx,
        n: &proto::NodeProto,
        i: usize,
        what: &str,
    ) -> Result<Const> {
        if let Some(name) = n.input.get(i).filter(|s| !s.is_empty()) {
            if self.vals.last_read(name) {
                if let Some(Val::Const(c)) = self.vals.take(name) {
                    return Ok(Rc::unwrap_or_clone(c));
                }
            }
        }
        self.cst(ctx, n, i, what)
    }

    /// Bind the node's output. A folded value is charged to the fold budget, with the
    /// expression nodes built since the last charge.
    pub(super) fn set(&mut self, n: &proto::NodeProto, v: Val) -> Result<()> {
        if let Val::Sym(s) = &v {
            self.folder.charge_bound(&self.ctx_of(n), s.elems.len())?;
        }
        if let Some(o) = n.output.first() {
            self.vals.insert(o.clone(), v);
        }
        Ok(())
    }

    pub(super) fn ctx_of(&self, n: &proto::NodeProto) -> Ctx<'_> {
        Ctx {
            path: self.path,
            name: n.name().to_string(),
            op: n.op_type().to_string(),
        }
    }

    /// Append an IR node producing a new activation value.
    pub(super) fn emit(
        &mut self,
        ctx: &Ctx,
        n: &proto::NodeProto,
        op: Op,
        inputs: Vec<ValueId>,
        channels: usize,
    ) -> ValueId {
        let out = self.values.len();
        let vname = n
            .output
            .first()
            .cloned()
            .unwrap_or_else(|| format!("{}_out", ctx.name));
        self.values.push(Value {
            name: vname,
            channels,
        });
        self.producer.push(Some(self.nodes.len()));
        self.nodes.push(Node {
            name: ctx.name.clone(),
            op,
            inputs,
            output: out,
        });
        if let Some(o) = n.output.first() {
            self.vals.insert(o.clone(), Val::Act(out));
        }
        out
    }

    pub(super) fn node(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let op = n.op_type();
        if n.output.len() > 1
            && !matches!(
                op,
                "MaxPool" | "BatchNormalization" | "Dropout" | "LayerNormalization" | "Split"
            )
        {
            return Err(ctx.err(format!(
                "has {} outputs; voxtile supports single-output nodes here",
                n.output.len()
            )));
        }
        if n.output.len() > 1
            && op != "Split"
            && n.output[1..]
                .iter()
                .any(|o| !o.is_empty() && self.vals.uses(o) > 0)
        {
            return Err(ctx.err("its secondary outputs (indices / running statistics / mask) are used, which voxtile does not support"));
        }
        if let Some(c) = self.ev().const_fold(n, ctx)? {
            self.vals.release_inputs(n);
            return self.set(n, Val::Const(Rc::new(c)));
        }
        match lowering(op) {
            Some(f) => f(self, n, ctx),
            None => Err(ctx.err(format!("operator {op} is not supported by voxtile"))),
        }
    }

    /// Lower one node, or record why it cannot be and mark its outputs unavailable, so that the
    /// import goes on and reports every unsupported construct at once. A node downstream of an
    /// unsupported one can only be judged by its operator; budget overruns end the import.
    fn visit(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let why = if !matches!(n.domain(), "" | "ai.onnx") {
            Some(format!(
                "operators of domain \"{}\" are not supported",
                n.domain()
            ))
        } else if lowering(n.op_type()).is_none() {
            Some(format!(
                "operator {} is not supported by voxtile",
                n.op_type()
            ))
        } else {
            None
        };
        let downstream = n.input.iter().any(|i| self.vals.is_poisoned(i));
        let failed = match (why, downstream) {
            (Some(why), _) => Some(why),
            (None, true) => None,
            (None, false) => match self.node(n, ctx) {
                Ok(()) => return Ok(()),
                Err(e) if self.folder.budget_hit() => return Err(e),
                Err(Error::Model { msg, .. }) => {
                    let head = format!("node \"{}\" ({}): ", ctx.name, ctx.op);
                    Some(msg.strip_prefix(&head).unwrap_or(&msg).to_string())
                }
                Err(e) => return Err(e),
            },
        };
        if let Some(why) = failed {
            self.unsupported.push(ctx.unsupported(why));
        }
        self.vals
            .poison(n.output.iter().filter(|o| !o.is_empty()).cloned());
        Ok(())
    }

    fn identity(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let v = self.get(ctx, n, 0)?;
        self.set(n, v)
    }

    fn fold(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let v = self.ev().fold(n, ctx)?;
        self.set(n, v)
    }
}

/// How one node is lowered.
type Lowering<'a> = fn(&mut Lowerer<'a>, &proto::NodeProto, &Ctx<'_>) -> Result<()>;

/// The lowering of each supported default-domain operator: the one list of what voxtile imports.
fn lowering<'a>(op: &str) -> Option<Lowering<'a>> {
    Some(match op {
        "Identity" | "Dropout" => Lowerer::identity,
        "Constant" => Lowerer::constant,
        "Conv" => Lowerer::conv,
        "ConvTranspose" => Lowerer::conv_transpose,
        "BatchNormalization" => Lowerer::batch_norm,
        "InstanceNormalization" => Lowerer::instance_norm,
        "GroupNormalization" => Lowerer::group_norm_op,
        "Relu" | "Sigmoid" | "Tanh" | "LeakyRelu" | "Elu" | "PRelu" => Lowerer::activation,
        "Softmax" => Lowerer::softmax,
        "Add" | "Sub" | "Mul" | "Div" => Lowerer::binary,
        "Concat" => Lowerer::concat,
        "MaxPool" | "AveragePool" => Lowerer::pool,
        "Resize" | "Upsample" => Lowerer::resize,
        "Reshape" => Lowerer::reshape,
        "Shape" => Lowerer::shape_op,
        "Cast" => Lowerer::cast,
        "Gather" | "Unsqueeze" | "Squeeze" | "Slice" | "ConstantOfShape" | "Flatten" | "Floor"
        | "Ceil" | "Range" | "Transpose" | "Split" => Lowerer::plumbing,
        "MatMul" => Lowerer::matmul,
        "Gemm" => Lowerer::gemm,
        "Einsum" => Lowerer::einsum,
        "LayerNormalization" => Lowerer::layer_norm,
        "Pad" => Lowerer::pad,
        "Expand" | "Tile" => Lowerer::expand_tile,
        m if math::MATH_OPS.contains(&m) => Lowerer::math,
        m if FOLD_OPS.contains(&m) => Lowerer::fold,
        _ => return None,
    })
}
