//! Lowering of a decoded ONNX graph to the IR.
//!
//! Nodes are visited in a topological order computed here (hostile files may be unsorted, cyclic or
//! dangling). Each ONNX value becomes one of [`Val`]: an NCDHW activation, a constant, a small
//! symbolic tensor (shape plumbing computed from `Shape(x)`), or one of the two intermediate states
//! of PyTorch's GroupNorm export. Shape plumbing is folded here; what depends on the window size is
//! evaluated by running shape inference of the partial IR on several probe windows.

use super::analysis::spatial_divisor_raw;
use super::decode::{decode_tensor, proto, Const, Data};
use super::graph::*;
use super::shape::infer_shapes_raw;
use super::sym::{broadcast_index, broadcast_shape, for_each_index, Bop, Elem, Exprs, Round, Sym};
use crate::error::UnsupportedOp;
use crate::{Error, Result};
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;

mod activation;
mod alias;
mod attrs;
mod binary;
mod budget;
mod constfold;
mod constmove;
mod conv;
mod fold;
mod half;
mod math;
mod matmul;
mod moves;
mod norm;
mod order;
mod pad;
mod plumbing;
mod pool;
mod reshape;
mod resize;
mod symbolic;
mod tensor;
mod values;

use attrs::*;
use budget::{Budget, Charge};
use half::Float;
use order::*;
use symbolic::*;
use values::OnnxValues;

/// Largest constant that shape-plumbing ops (Gather, Slice, elementwise folds...) will touch.
const SMALL: usize = 1 << 22;

/// Ceiling for strides, dilations and pads: keeps all size arithmetic far from overflow.
const ATTR_LIMIT: i64 = 1 << 20;

#[derive(Clone, Debug)]
enum Val {
    Act(ValueId),
    /// Shared: an Identity (or any read) copies the handle, not the data.
    Const(Rc<Const>),
    Sym(Sym),
    /// `Reshape(x, [N, G, -1])` of activation `src` (GroupNorm export, step 1).
    Grouped {
        src: ValueId,
        groups: usize,
    },
    /// InstanceNormalization (scale 1, bias 0) of a [`Val::Grouped`] (step 2).
    GroupedNormed {
        src: ValueId,
        groups: usize,
        eps: f32,
    },
}

struct Lowerer<'a> {
    path: &'a Path,
    dir: Option<&'a Path>,
    opset: i64,
    /// The ONNX values: bindings, aliases, readers.
    vals: OnnxValues,
    values: Vec<Value>,
    nodes: Vec<Node>,
    input: ValueId,
    /// Symbolic expressions of this import.
    ex: RefCell<Exprs>,
    /// What is left of the folding budgets.
    budget: Budget,
    /// Probes of the IR as it was when it had this many nodes (reused while no node is added).
    probe_cache: RefCell<Option<(usize, Probes)>>,
    /// Index of the node producing each IR value (None for the input).
    producer: Vec<Option<usize>>,
    /// Every construct voxtile could not lower, in graph order (see [`MAX_LISTED`]).
    unsupported: Vec<UnsupportedOp>,
    /// Window sizes the input declares (probes use them: exports bake them into Reshape targets).
    fixed_window: [Option<usize>; 3],
    /// Batch size the input declares.
    fixed_batch: Option<usize>,
}

/// Unsupported constructs named in one error; a hostile file with thousands stops there.
const MAX_LISTED: usize = 32;

/// Context for error messages: `node "name" (Op)`.
struct Ctx<'a> {
    path: &'a Path,
    name: String,
    op: String,
}

impl Ctx<'_> {
    /// This node as an unsupported one (its domain named when not the default).
    fn unsupported(&self, why: String) -> UnsupportedOp {
        UnsupportedOp {
            op: self.op.clone(),
            node: self.name.clone(),
            why,
        }
    }
    fn err(&self, msg: impl std::fmt::Display) -> Error {
        Error::model(
            self.path,
            format!("node \"{}\" ({}): {msg}", self.name, self.op),
        )
    }
}

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
    let mut lw = Lowerer {
        path,
        dir,
        opset,
        vals: OnnxValues::default(),
        values: vec![],
        nodes: vec![],
        input: 0,
        ex: RefCell::new(Exprs::default()),
        budget: Budget::new(0),
        probe_cache: RefCell::new(None),
        producer: vec![],
        unsupported: vec![],
        fixed_window: [None; 3],
        fixed_batch: None,
    };

    let mut weight_bytes = 0usize;
    for t in &g.initializer {
        let c = decode_tensor(t, dir, path)?;
        weight_bytes = weight_bytes.saturating_add(c.len() * if c.is_int() { 8 } else { 4 });
        lw.vals.insert(t.name().to_string(), Val::Const(Rc::new(c)));
    }
    lw.budget = Budget::new(weight_bytes);
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
    lw.fixed_window = fixed;
    lw.fixed_batch = batch;
    lw.values.push(Value {
        name: inp.name().to_string(),
        channels,
    });
    lw.producer.push(None);
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

/// The float type the first graph output declares (f32 when it declares none voxtile reads).
fn output_float(g: &proto::GraphProto) -> Float {
    use proto::type_proto::Value as TV;
    match g
        .output
        .first()
        .and_then(|o| o.r#type.as_ref()?.value.as_ref())
    {
        Some(TV::TensorType(t)) => Float::of(t.elem_type()).unwrap_or(Float::F32),
        _ => Float::F32,
    }
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

    pub(super) fn get(&self, ctx: &Ctx, n: &proto::NodeProto, i: usize) -> Result<Val> {
        let name = n
            .input
            .get(i)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| ctx.err(format!("input {i} is missing")))?;
        let v = self
            .vals
            .get(name)
            .ok_or_else(|| ctx.err(format!("input \"{name}\" is not available")))?;
        // Copies of folded values are work: a big one read by many nodes must not be free.
        if let Val::Sym(s) = v {
            self.budget
                .charge(ctx, Charge::Work(s.elems.len() as u64))?;
        }
        Ok(v.clone())
    }

    pub(super) fn get_opt(&self, ctx: &Ctx, n: &proto::NodeProto, i: usize) -> Result<Option<Val>> {
        match n.input.get(i) {
            Some(s) if !s.is_empty() => self.get(ctx, n, i).map(Some),
            _ => Ok(None),
        }
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

    /// Bind the node's output. A folded value is charged to the fold budget, with the
    /// expression nodes built since the last charge.
    pub(super) fn set(&mut self, n: &proto::NodeProto, v: Val) -> Result<()> {
        if let Val::Sym(s) = &v {
            let built = self.ex.borrow().len();
            let ctx = self.ctx_of(n);
            self.budget.charge(&ctx, Charge::Fold(s.elems.len()))?;
            self.budget.charge_exprs(&ctx, built)?;
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
        if self.try_const_fold(n, ctx)? {
            return Ok(());
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
                Err(e) if self.budget.hit() => return Err(e),
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
        m if fold::FOLD_OPS.contains(&m) => Lowerer::fold,
        _ => return None,
    })
}
