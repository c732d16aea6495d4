//! Lowering of a decoded ONNX graph to the IR.
//!
//! Nodes are visited in a topological order computed here (hostile files may be unsorted, cyclic or
//! dangling). Each ONNX value becomes one of [`Val`]: an NCDHW activation, a constant, a small
//! symbolic tensor (shape plumbing computed from `Shape(x)`), or one of the two intermediate states
//! of PyTorch's GroupNorm export. Shape plumbing is folded here; what depends on the window size is
//! evaluated by running shape inference of the partial IR on several probe windows.

use super::analysis::spatial_divisor_raw;
use super::graph::*;
use super::onnx::{decode_tensor, proto, Const, Data};
use super::shape::infer_shapes_raw;
use super::sym::{broadcast_index, broadcast_shape, for_each_index, Bop, Exprs, Round, Sym, X};
use crate::{Error, Result};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::rc::Rc;

/// Largest constant that shape-plumbing ops (Gather, Slice, elementwise folds...) will touch.
const SMALL: usize = 1 << 22;
/// Ceiling for strides, dilations and pads: keeps all size arithmetic far from overflow.
const ATTR_LIMIT: i64 = 1 << 20;
/// Elements that constant folding may produce over the whole import (folded tensors and the
/// symbolic expressions built for them): real exports fold a few hundred, and this keeps a small
/// hostile file (400 ConstantOfShape of 4 M elements each) far below the machine's memory.
const FOLD_BUDGET: usize = 1 << 22;
/// Steps of shape evaluation (probe shape inference per node, expression nodes evaluated) over
/// the whole import: about a second of work, a hundred times what a real model needs.
const WORK_BUDGET: u64 = 1 << 24;

/// Strides, dilations, pads (ONNX order) and auto_pad of a Conv / pool node.
type WindowAttrs = ([usize; 3], [usize; 3], [i64; 6], String);

/// Shapes of the partial IR on the probe windows: (shapes per value, window) pairs.
type Probes = Rc<Vec<(Vec<[usize; 5]>, [usize; 3])>>;

/// Element count of a shape, None on overflow or above [`SMALL`].
fn small_numel(shape: &[usize]) -> Option<usize> {
    shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= SMALL)
}

#[derive(Clone, Debug)]
enum Val {
    Act(ValueId),
    Const(Const),
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
    vals: HashMap<String, Val>,
    values: Vec<Value>,
    nodes: Vec<Node>,
    /// ONNX consumer count per value name, with Identity chains resolved to their source.
    uses: HashMap<String, usize>,
    alias: HashMap<String, String>,
    graph_outputs: HashSet<String>,
    input: ValueId,
    /// Symbolic expressions of this import.
    ex: RefCell<Exprs>,
    /// Elements left of [`FOLD_BUDGET`].
    fold_left: Cell<usize>,
    /// Steps left of [`WORK_BUDGET`].
    work_left: Cell<u64>,
    /// Probes of the IR as it was when it had this many nodes (reused while no node is added).
    probe_cache: RefCell<Option<(usize, Probes)>>,
    /// Arena length already charged to the fold budget.
    exprs_charged: Cell<usize>,
    /// Index of the node producing each IR value (None for the input).
    producer: Vec<Option<usize>>,
}

fn attr<'n>(n: &'n proto::NodeProto, name: &str) -> Option<&'n proto::AttributeProto> {
    n.attribute.iter().find(|a| a.name() == name)
}

/// Context for error messages: `node "name" (Op)`.
struct Ctx<'a> {
    path: &'a Path,
    name: String,
    op: String,
}

impl Ctx<'_> {
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
        vals: HashMap::new(),
        values: vec![],
        nodes: vec![],
        uses: HashMap::new(),
        alias: HashMap::new(),
        graph_outputs: HashSet::new(),
        input: 0,
        ex: RefCell::new(Exprs::default()),
        fold_left: Cell::new(FOLD_BUDGET),
        work_left: Cell::new(WORK_BUDGET),
        probe_cache: RefCell::new(None),
        exprs_charged: Cell::new(0),
        producer: vec![],
    };

    for t in &g.initializer {
        let c = decode_tensor(t, dir, path)?;
        lw.vals.insert(t.name().to_string(), Val::Const(c));
    }
    // The single activation input (inputs that are also initializers are old-style defaults).
    let acts: Vec<&proto::ValueInfoProto> = g
        .input
        .iter()
        .filter(|i| !lw.vals.contains_key(i.name()))
        .collect();
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
    let (channels, fixed) = input_signature(inp, path)?;
    lw.values.push(Value {
        name: inp.name().to_string(),
        channels,
    });
    lw.producer.push(None);
    lw.vals.insert(inp.name().to_string(), Val::Act(0));

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

    let order = topo_order(g, &lw.vals, path)?;
    // Nodes the output does not need are never lowered: folding them could only cost time and
    // memory (a hostile file carries hundreds of unused ConstantOfShape).
    let live = live_nodes(g, &out_name);
    let order: Vec<usize> = order.into_iter().filter(|&i| live[i]).collect();
    for &i in &order {
        let n = &g.node[i];
        if n.op_type() == "Identity" && n.input.len() == 1 && n.output.len() == 1 {
            lw.alias.insert(n.output[0].clone(), n.input[0].clone());
        }
    }
    for &i in &order {
        let n = &g.node[i];
        if n.op_type() == "Identity" {
            continue;
        }
        for i in n.input.iter().filter(|s| !s.is_empty()) {
            *lw.uses.entry(lw.resolve(i)).or_default() += 1;
        }
    }
    for o in &g.output {
        let r = lw.resolve(o.name());
        lw.graph_outputs.insert(r.clone());
        *lw.uses.entry(r).or_default() += 1;
    }

    for &i in &order {
        let n = &g.node[i];
        let name = if n.name().is_empty() {
            format!("{}#{i}", n.op_type())
        } else {
            n.name().to_string()
        };
        let ctx = Ctx {
            path,
            name,
            op: n.op_type().to_string(),
        };
        if !n.domain().is_empty() && n.domain() != "ai.onnx" {
            return Err(ctx.err(format!(
                "operators of domain \"{}\" are not supported",
                n.domain()
            )));
        }
        lw.node(n, &ctx)?;
    }

    let output = match lw.vals.get(&out_name) {
        Some(Val::Act(v)) => *v,
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
    if output == lw.input {
        return Err(Error::model(
            path,
            "the graph output is the input itself: the model computes nothing",
        ));
    }
    lw.values[output].name = out_name;

    let mut graph = Graph {
        name: g.name().to_string(),
        values: lw.values,
        nodes: lw.nodes,
        input: lw.input,
        output,
        fixed_input_spatial: fixed,
    };
    fuse_norm_affine(&mut graph);
    prune(&mut graph);
    graph
        .validate()
        .map_err(|e| Error::model(path, e.to_string()))?;
    Ok(graph)
}

/// Per node: whether the graph output `out` depends on it (a walk back from `out`'s producer).
fn live_nodes(g: &proto::GraphProto, out: &str) -> Vec<bool> {
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, n) in g.node.iter().enumerate() {
        for o in n.output.iter().filter(|s| !s.is_empty()) {
            producer.entry(o).or_insert(i);
        }
    }
    let mut live = vec![false; g.node.len()];
    let mut stack: Vec<usize> = producer.get(out).copied().into_iter().collect();
    while let Some(i) = stack.pop() {
        if std::mem::replace(&mut live[i], true) {
            continue;
        }
        for inp in &g.node[i].input {
            if let Some(&p) = producer.get(inp.as_str()) {
                if !live[p] {
                    stack.push(p);
                }
            }
        }
    }
    live
}

/// Channels (must be fixed) and fixed spatial sizes of the model input.
fn input_signature(
    inp: &proto::ValueInfoProto,
    path: &Path,
) -> Result<(usize, [Option<usize>; 3])> {
    use proto::tensor_shape_proto::dimension::Value as DV;
    use proto::type_proto::Value as TV;
    let name = inp.name();
    let Some(TV::TensorType(t)) = inp.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        return Err(Error::model(
            path,
            format!("input \"{name}\" is not a tensor"),
        ));
    };
    if t.elem_type() != 1 {
        return Err(Error::model(
            path,
            format!(
                "input \"{name}\" has element type {}; voxtile needs float32 (1)",
                t.elem_type()
            ),
        ));
    }
    let dims = t.shape.as_ref().map(|s| s.dim.as_slice()).unwrap_or(&[]);
    if dims.len() != 5 {
        return Err(Error::model(
            path,
            format!(
                "input \"{name}\" has rank {}; voxtile runs 3D models with NCDHW inputs (rank 5)",
                dims.len()
            ),
        ));
    }
    let fixed = |i: usize| match dims[i].value {
        Some(DV::DimValue(v)) if v > 0 => Some(v as usize),
        _ => None,
    };
    let c = fixed(1).ok_or_else(|| {
        Error::model(
            path,
            format!("input \"{name}\" must declare a fixed channel count (dimension 1)"),
        )
    })?;
    Ok((c, [fixed(2), fixed(3), fixed(4)]))
}

/// Kahn's algorithm over value names; errors name a dangling input or the nodes of a cycle.
fn topo_order(
    g: &proto::GraphProto,
    known: &HashMap<String, Val>,
    path: &Path,
) -> Result<Vec<usize>> {
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, n) in g.node.iter().enumerate() {
        for o in n.output.iter().filter(|s| !s.is_empty()) {
            if known.contains_key(o.as_str()) || producer.insert(o, i).is_some() {
                return Err(Error::model(
                    path,
                    format!(
                        "value \"{o}\" is produced more than once (node \"{}\")",
                        n.name()
                    ),
                ));
            }
        }
    }
    let mut indeg = vec![0usize; g.node.len()];
    let mut users: Vec<Vec<usize>> = vec![vec![]; g.node.len()];
    for (i, n) in g.node.iter().enumerate() {
        for inp in n.input.iter().filter(|s| !s.is_empty()) {
            if known.contains_key(inp.as_str()) {
                continue;
            }
            match producer.get(inp.as_str()) {
                Some(&p) => {
                    indeg[i] += 1;
                    users[p].push(i);
                }
                None => {
                    return Err(Error::model(path, format!("node \"{}\" ({}): input \"{inp}\" is not produced by any node, initializer or graph input", n.name(), n.op_type())))
                }
            }
        }
    }
    // Stable: process ready nodes in file order.
    let mut ready: std::collections::BTreeSet<usize> =
        (0..g.node.len()).filter(|&i| indeg[i] == 0).collect();
    let mut order = Vec::with_capacity(g.node.len());
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &u in &users[i] {
            indeg[u] -= 1;
            if indeg[u] == 0 {
                ready.insert(u);
            }
        }
    }
    if order.len() != g.node.len() {
        let stuck: Vec<String> = (0..g.node.len())
            .filter(|&i| indeg[i] > 0)
            .take(5)
            .map(|i| format!("\"{}\"", g.node[i].name()))
            .collect();
        return Err(Error::model(
            path,
            format!("the graph has a cycle through nodes {}", stuck.join(", ")),
        ));
    }
    Ok(order)
}

fn norm_axis(ctx: &Ctx, axis: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        return Err(ctx.err(format!("axis {axis} is out of range for rank {rank}")));
    }
    Ok(a as usize)
}

fn to_i64(ctx: &Ctx, v: f64, what: &str) -> Result<i64> {
    if v.fract() != 0.0 || !v.is_finite() {
        return Err(ctx.err(format!("{what} value {v} is not an integer")));
    }
    Ok(v as i64)
}

impl Lowerer<'_> {
    fn resolve(&self, name: &str) -> String {
        let mut cur = name.to_string();
        let mut hops = 0;
        while let Some(n) = self.alias.get(&cur) {
            cur = n.clone();
            hops += 1;
            if hops > 10_000 {
                break;
            }
        }
        cur
    }

    fn get(&self, ctx: &Ctx, n: &proto::NodeProto, i: usize) -> Result<Val> {
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
            self.charge_work(ctx, s.elems.len() as u64)?;
        }
        Ok(v.clone())
    }
    fn get_opt(&self, ctx: &Ctx, n: &proto::NodeProto, i: usize) -> Result<Option<Val>> {
        match n.input.get(i) {
            Some(s) if !s.is_empty() => self.get(ctx, n, i).map(Some),
            _ => Ok(None),
        }
    }
    fn act(&self, ctx: &Ctx, n: &proto::NodeProto, i: usize) -> Result<ValueId> {
        match self.get(ctx, n, i)? {
            Val::Act(v) => Ok(v),
            _ => Err(ctx.err(format!("input {i} (\"{}\") must be an activation tensor, but it is a constant or shape value", n.input[i]))),
        }
    }
    /// The optional third input of Conv / ConvTranspose: a constant of `cout` elements.
    fn conv_bias(&self, ctx: &Ctx, n: &proto::NodeProto, cout: usize) -> Result<Option<Tensor>> {
        if self.get_opt(ctx, n, 2)?.is_none() {
            return Ok(None);
        }
        let b = self.cst(ctx, n, 2, "bias")?;
        if b.len() != cout {
            return Err(ctx.err(format!(
                "bias has {} elements for {cout} output channels",
                b.len()
            )));
        }
        Ok(Some(Tensor::new(vec![cout], b.to_f32())))
    }

    fn cst(&self, ctx: &Ctx, n: &proto::NodeProto, i: usize, what: &str) -> Result<Const> {
        match self.get(ctx, n, i)? {
            Val::Const(c) => Ok(c),
            Val::Sym(s) => sym_to_const(&s).ok_or_else(|| ctx.err(format!("{what} (input {i}) depends on the window size and cannot be folded to a constant"))),
            _ => Err(ctx.err(format!("{what} (input {i}) must be a constant (initializer or folded constant)"))),
        }
    }

    /// Bind the node's output. A folded value is charged to the fold budget, with the
    /// expression nodes built since the last charge.
    fn set(&mut self, n: &proto::NodeProto, v: Val) -> Result<()> {
        if let Val::Sym(s) = &v {
            let built = self.ex.borrow().len();
            let ctx = self.ctx_of(n);
            self.charge_fold(&ctx, s.elems.len())?;
            let new_exprs = built.saturating_sub(self.exprs_charged.replace(built));
            self.charge_fold(&ctx, new_exprs)?;
        }
        if let Some(o) = n.output.first() {
            self.vals.insert(o.clone(), v);
        }
        Ok(())
    }

    fn ctx_of(&self, n: &proto::NodeProto) -> Ctx<'_> {
        Ctx {
            path: self.path,
            name: n.name().to_string(),
            op: n.op_type().to_string(),
        }
    }

    /// Refuse a fold that would produce more than the elements left of [`FOLD_BUDGET`]
    /// (checked before allocating, where the size is known up front).
    fn check_fold(&self, ctx: &Ctx, elems: usize) -> Result<()> {
        if elems > self.fold_left.get() {
            return Err(ctx.err(format!(
                "folding its constant/shape computation needs {elems} elements; with the folds \
                 before it, that is more than the {FOLD_BUDGET} voxtile allows for a model"
            )));
        }
        Ok(())
    }

    fn charge_fold(&self, ctx: &Ctx, elems: usize) -> Result<()> {
        self.check_fold(ctx, elems)?;
        self.fold_left.set(self.fold_left.get() - elems);
        Ok(())
    }

    /// Spend `steps` of [`WORK_BUDGET`]; past it the model is refused rather than left to run.
    fn charge_work(&self, ctx: &Ctx, steps: u64) -> Result<()> {
        let left = self.work_left.get();
        if steps > left {
            return Err(ctx.err(format!(
                "evaluating the model's shape computations takes more than {WORK_BUDGET} steps; \
                 the graph is too large or too deep to fold"
            )));
        }
        self.work_left.set(left - steps);
        Ok(())
    }

    /// `xs` evaluated on one probe's shapes (NaN where unknown), charged to the work budget.
    fn eval(&self, ctx: &Ctx, xs: &[X], shapes: &[[usize; 5]]) -> Result<Vec<f64>> {
        let (v, visited) = self.ex.borrow().eval(xs, shapes);
        self.charge_work(ctx, visited as u64 + 1)?;
        Ok(v)
    }

    /// Append an IR node producing a new activation value.
    fn emit(
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

    fn node(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let op = n.op_type();
        if n.output.len() > 1 && !matches!(op, "MaxPool" | "BatchNormalization" | "Dropout") {
            return Err(ctx.err(format!(
                "has {} outputs; voxtile supports single-output nodes here",
                n.output.len()
            )));
        }
        if n.output.len() > 1
            && n.output[1..]
                .iter()
                .any(|o| !o.is_empty() && self.uses.get(&self.resolve(o)).copied().unwrap_or(0) > 0)
        {
            return Err(ctx.err("its secondary outputs (indices / running statistics / mask) are used, which voxtile does not support"));
        }
        match op {
            "Identity" | "Dropout" => {
                let v = self.get(ctx, n, 0)?;
                self.set(n, v)?;
            }
            "Constant" => self.constant(n, ctx)?,
            "Conv" => self.conv(n, ctx)?,
            "ConvTranspose" => self.conv_transpose(n, ctx)?,
            "BatchNormalization" => self.batch_norm(n, ctx)?,
            "InstanceNormalization" => self.instance_norm(n, ctx)?,
            "GroupNormalization" => self.group_norm_op(n, ctx)?,
            "Relu" | "Sigmoid" | "Tanh" => {
                let x = self.act(ctx, n, 0)?;
                let c = self.values[x].channels;
                let op = match op {
                    "Relu" => Op::Relu,
                    "Sigmoid" => Op::Sigmoid,
                    _ => Op::Tanh,
                };
                self.emit(ctx, n, op, vec![x], c);
            }
            "LeakyRelu" | "Elu" => {
                let x = self.act(ctx, n, 0)?;
                let c = self.values[x].channels;
                let default = if op == "Elu" { 1.0 } else { 0.01 };
                let alpha = attr(n, "alpha").and_then(|a| a.f).unwrap_or(default);
                let op = if op == "Elu" {
                    Op::Elu { alpha }
                } else {
                    Op::LeakyRelu { alpha }
                };
                self.emit(ctx, n, op, vec![x], c);
            }
            "PRelu" => {
                let x = self.act(ctx, n, 0)?;
                let c = self.values[x].channels;
                let s = self.cst(ctx, n, 1, "slope")?;
                let t = self.channel_vector(ctx, &s, c, "slope", true)?;
                self.emit(ctx, n, Op::PRelu { slope: t }, vec![x], c);
            }
            "Softmax" => {
                let x = self.act(ctx, n, 0)?;
                let c = self.values[x].channels;
                let default = if self.opset >= 13 { -1 } else { 1 };
                let axis = norm_axis(ctx, attr(n, "axis").and_then(|a| a.i).unwrap_or(default), 5)?;
                if self.opset < 13 && axis != 4 {
                    return Err(ctx.err(format!("attribute axis={axis}: before opset 13 Softmax normalises over all axes from {axis} on, which voxtile does not support")));
                }
                self.emit(ctx, n, Op::Softmax { axis }, vec![x], c);
            }
            "Add" | "Sub" | "Mul" | "Div" => self.binary(n, ctx)?,
            "Concat" => self.concat(n, ctx)?,
            "MaxPool" | "AveragePool" => self.pool(n, ctx)?,
            "Resize" | "Upsample" => self.resize(n, ctx)?,
            "Reshape" => self.reshape(n, ctx)?,
            "Shape" => self.shape_op(n, ctx)?,
            "Cast" => self.cast(n, ctx)?,
            "Gather" | "Unsqueeze" | "Squeeze" | "Slice" | "ConstantOfShape" | "Flatten"
            | "Floor" | "Ceil" | "Neg" | "Sqrt" | "Reciprocal" | "Min" | "Max" | "Range"
            | "Expand" | "Transpose" => self.plumbing(n, ctx)?,
            other => return Err(ctx.err(format!("operator {other} is not supported by voxtile"))),
        }
        Ok(())
    }

    fn constant(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let a = n
            .attribute
            .first()
            .ok_or_else(|| ctx.err("has no value attribute"))?;
        let c = match a.name() {
            "value" => decode_tensor(
                a.t.as_ref()
                    .ok_or_else(|| ctx.err("attribute value holds no tensor"))?,
                self.dir,
                self.path,
            )?,
            "value_float" => Const {
                shape: vec![],
                data: Data::F(vec![a.f()]),
            },
            "value_floats" => Const {
                shape: vec![a.floats.len()],
                data: Data::F(a.floats.clone()),
            },
            "value_int" => Const {
                shape: vec![],
                data: Data::I(vec![a.i()]),
            },
            "value_ints" => Const {
                shape: vec![a.ints.len()],
                data: Data::I(a.ints.clone()),
            },
            other => return Err(ctx.err(format!("attribute {other} is not supported"))),
        };
        self.set(n, Val::Const(c))?;
        Ok(())
    }

    /// A per-channel parameter as an IR tensor of `c` elements ([1] allowed when `allow_scalar`),
    /// from any shape that broadcasts only over channels (e.g. PRelu's [C,1,1,1]).
    fn channel_vector(
        &self,
        ctx: &Ctx,
        t: &Const,
        c: usize,
        what: &str,
        allow_scalar: bool,
    ) -> Result<Tensor> {
        let data = t.to_f32();
        let t5 = to5(&t.shape).ok_or_else(|| {
            ctx.err(format!(
                "{what} of shape {:?} has more than 5 dimensions",
                t.shape
            ))
        })?;
        let ok = t5[0] == 1
            && t5[2..].iter().all(|&d| d == 1)
            && (t5[1] == c || (allow_scalar && t5[1] == 1));
        if !ok {
            return Err(ctx.err(format!(
                "{what} of shape {:?} is not per-channel for {c} channels",
                t.shape
            )));
        }
        Ok(Tensor::new(vec![data.len()], data))
    }

    fn ints(&self, n: &proto::NodeProto, name: &str) -> Option<Vec<i64>> {
        attr(n, name).map(|a| a.ints.clone())
    }

    /// Parse kernel-window attributes shared by Conv, ConvTranspose and the pools.
    fn window_attrs(
        &self,
        ctx: &Ctx,
        n: &proto::NodeProto,
        kernel: [usize; 3],
    ) -> Result<WindowAttrs> {
        let three = |name: &str, default: usize| -> Result<[usize; 3]> {
            match self.ints(n, name) {
                None => Ok([default; 3]),
                Some(v) if v.len() == 3 => {
                    let mut o = [0; 3];
                    for a in 0..3 {
                        if v[a] <= 0 || v[a] > ATTR_LIMIT {
                            return Err(ctx.err(format!(
                                "attribute {name}={v:?} must be positive (and at most {ATTR_LIMIT})"
                            )));
                        }
                        o[a] = v[a] as usize;
                    }
                    Ok(o)
                }
                Some(v) => Err(ctx.err(format!(
                    "attribute {name}={v:?} must have 3 values (voxtile supports 3D only)"
                ))),
            }
        };
        let stride = three("strides", 1)?;
        let dilation = three("dilations", 1)?;
        let pads = match self.ints(n, "pads") {
            None => [0i64; 6],
            Some(v) if v.len() == 6 => {
                if v.iter().any(|&p| p < 0) {
                    return Err(ctx.err(format!("attribute pads={v:?} has negative values")));
                }
                if v.iter().any(|&p| p > ATTR_LIMIT) {
                    return Err(ctx.err(format!("attribute pads={v:?} is absurdly large")));
                }
                [v[0], v[1], v[2], v[3], v[4], v[5]]
            }
            Some(v) => return Err(ctx.err(format!("attribute pads={v:?} must have 6 values"))),
        };
        if let Some(k) = self.ints(n, "kernel_shape") {
            if k.len() != 3 || (0..3).any(|a| k[a] != kernel[a] as i64) {
                return Err(ctx.err(format!(
                    "attribute kernel_shape={k:?} disagrees with the kernel {kernel:?}"
                )));
            }
        }
        let auto_pad = attr(n, "auto_pad")
            .and_then(|a| a.s.as_ref())
            .map(|s| String::from_utf8_lossy(s).to_string())
            .unwrap_or_else(|| "NOTSET".into());
        Ok((stride, dilation, pads, auto_pad))
    }

    /// Resolve auto_pad for Conv/pools. SAME with stride s pads k_eff - s in total, which matches
    /// ONNX whenever the input size is a multiple of s (guaranteed by the spatial divisor).
    fn resolve_pads(
        &self,
        ctx: &Ctx,
        auto_pad: &str,
        pads: [i64; 6],
        kernel: [usize; 3],
        stride: [usize; 3],
        dilation: [usize; 3],
    ) -> Result<[usize; 6]> {
        let mut p = [0usize; 6];
        match auto_pad {
            "NOTSET" | "" => {
                for i in 0..6 {
                    p[i] = pads[i] as usize;
                }
            }
            "VALID" => {}
            "SAME_UPPER" | "SAME_LOWER" => {
                for a in 0..3 {
                    let keff = dilation[a] * (kernel[a] - 1) + 1;
                    let total = keff.saturating_sub(stride[a]);
                    let small = total / 2;
                    let (b, e) = if auto_pad == "SAME_UPPER" {
                        (small, total - small)
                    } else {
                        (total - small, small)
                    };
                    p[a] = b;
                    p[a + 3] = e;
                }
            }
            other => return Err(ctx.err(format!("attribute auto_pad={other} is not supported"))),
        }
        Ok(p)
    }

    fn conv(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let x = self.act(ctx, n, 0)?;
        let cin = self.values[x].channels;
        let w = self.cst(ctx, n, 1, "weight")?;
        if w.shape.len() != 5 {
            return Err(ctx.err(format!(
                "weight has shape {:?}; only 3D convolutions (5D weights) are supported",
                w.shape
            )));
        }
        let kernel = [w.shape[2], w.shape[3], w.shape[4]];
        if kernel.contains(&0) || w.shape[0] == 0 || w.shape[1] == 0 {
            return Err(ctx.err(format!("weight has an empty dimension {:?}", w.shape)));
        }
        let groups = attr(n, "group").and_then(|a| a.i).unwrap_or(1);
        if groups <= 0 || cin as i64 % groups != 0 {
            return Err(ctx.err(format!(
                "attribute group={groups} does not divide input channels {cin}"
            )));
        }
        let g = groups as usize;
        if w.shape[1] * g != cin || w.shape[0] % g != 0 {
            return Err(ctx.err(format!(
                "weight shape {:?} does not fit {cin} input channels with group={g}",
                w.shape
            )));
        }
        let (stride, dilation, pads, auto_pad) = self.window_attrs(ctx, n, kernel)?;
        let pads = self.resolve_pads(ctx, &auto_pad, pads, kernel, stride, dilation)?;
        let cout = w.shape[0];
        let bias = self.conv_bias(ctx, n, cout)?;
        let weight = Tensor::new(w.shape.clone(), w.to_f32());
        self.emit(
            ctx,
            n,
            Op::Conv(Conv {
                weight,
                bias,
                stride,
                dilation,
                pads,
                groups: g,
            }),
            vec![x],
            cout,
        );
        Ok(())
    }

    fn conv_transpose(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let x = self.act(ctx, n, 0)?;
        let cin = self.values[x].channels;
        let w = self.cst(ctx, n, 1, "weight")?;
        if w.shape.len() != 5 {
            return Err(ctx.err(format!(
                "weight has shape {:?}; only 3D transposed convolutions (5D weights) are supported",
                w.shape
            )));
        }
        let kernel = [w.shape[2], w.shape[3], w.shape[4]];
        if kernel.contains(&0) || w.shape[1] == 0 {
            return Err(ctx.err(format!("weight has an empty dimension {:?}", w.shape)));
        }
        let groups = attr(n, "group").and_then(|a| a.i).unwrap_or(1);
        if groups <= 0 || cin as i64 % groups != 0 {
            return Err(ctx.err(format!(
                "attribute group={groups} does not divide input channels {cin}"
            )));
        }
        let g = groups as usize;
        if w.shape[0] != cin {
            return Err(ctx.err(format!(
                "weight shape {:?} does not fit {cin} input channels",
                w.shape
            )));
        }
        if let Some(os) = self.ints(n, "output_shape") {
            return Err(ctx.err(format!("attribute output_shape={os:?} is not supported; export with explicit pads/output_padding")));
        }
        let (stride, dilation, pads, auto_pad) = self.window_attrs(ctx, n, kernel)?;
        let output_padding = match self.ints(n, "output_padding") {
            None => [0; 3],
            Some(v) if v.len() == 3 => {
                let mut o = [0; 3];
                for a in 0..3 {
                    if v[a] < 0 || v[a] as usize >= stride[a].max(dilation[a]) {
                        return Err(ctx.err(format!("attribute output_padding={v:?} must be non-negative and smaller than the stride or dilation")));
                    }
                    o[a] = v[a] as usize;
                }
                o
            }
            Some(v) => {
                return Err(ctx.err(format!("attribute output_padding={v:?} must have 3 values")))
            }
        };
        let mut p = [0usize; 6];
        match auto_pad.as_str() {
            "NOTSET" | "" => {
                for i in 0..6 {
                    p[i] = pads[i] as usize;
                }
            }
            "VALID" => {}
            "SAME_UPPER" | "SAME_LOWER" => {
                // Output = input·stride: total padding is output_padding + k_eff - stride.
                for a in 0..3 {
                    let keff = dilation[a] * (kernel[a] - 1) + 1;
                    let total = (output_padding[a] + keff).checked_sub(stride[a]).ok_or_else(|| ctx.err(format!("auto_pad={auto_pad} needs a kernel at least as large as the stride")))?;
                    let half = total / 2;
                    let (b, e) = if auto_pad == "SAME_UPPER" {
                        (half, total - half)
                    } else {
                        (total - half, half)
                    };
                    p[a] = b;
                    p[a + 3] = e;
                }
            }
            other => return Err(ctx.err(format!("attribute auto_pad={other} is not supported"))),
        }
        let cout = w.shape[1] * g;
        let bias = self.conv_bias(ctx, n, cout)?;
        let weight = Tensor::new(w.shape.clone(), w.to_f32());
        self.emit(
            ctx,
            n,
            Op::ConvTranspose(ConvTranspose {
                weight,
                bias,
                stride,
                dilation,
                pads: p,
                output_padding,
                groups: g,
            }),
            vec![x],
            cout,
        );
        Ok(())
    }

    fn batch_norm(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let x = self.act(ctx, n, 0)?;
        let c = self.values[x].channels;
        if attr(n, "training_mode").and_then(|a| a.i).unwrap_or(0) != 0 {
            return Err(ctx.err(
                "attribute training_mode=1 is not supported (export the model in eval mode)",
            ));
        }
        let eps = attr(n, "epsilon").and_then(|a| a.f).unwrap_or(1e-5) as f64;
        let mut p = vec![];
        for (i, what) in [(1, "scale"), (2, "bias"), (3, "mean"), (4, "var")] {
            let t = self.cst(ctx, n, i, what)?;
            if t.len() != c {
                return Err(ctx.err(format!("{what} has {} elements for {c} channels", t.len())));
            }
            p.push(t.to_f64());
        }
        let mut mul = vec![0f64; c];
        let mut add = vec![0f64; c];
        for ch in 0..c {
            if p[3][ch] + eps <= 0.0 {
                return Err(ctx.err(format!(
                    "var[{ch}] + epsilon = {} is not positive",
                    p[3][ch] + eps
                )));
            }
            mul[ch] = p[0][ch] / (p[3][ch] + eps).sqrt();
            add[ch] = p[1][ch] - p[2][ch] * mul[ch];
        }
        // Fold into the producing Conv when nothing else reads the conv's output.
        let src_name = self.resolve(&n.input[0]);
        let sole = self.uses.get(&src_name).copied().unwrap_or(0) == 1
            && !self.graph_outputs.contains(&src_name);
        let producer = self.producer.get(x).copied().flatten();
        if let Some(last) = producer.and_then(|p| self.nodes.get_mut(p)) {
            if let (true, Op::Conv(cv)) = (sole, &mut last.op) {
                fold_bn_into_conv(cv, &mul, &add);
                self.set(n, Val::Act(x))?;
                return Ok(());
            }
        }
        let scale = Tensor::new(vec![c], mul.iter().map(|&v| v as f32).collect());
        let shift = Tensor::new(vec![c], add.iter().map(|&v| v as f32).collect());
        self.emit(ctx, n, Op::ChannelAffine { scale, shift }, vec![x], c);
        Ok(())
    }

    fn instance_norm(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let eps = attr(n, "epsilon").and_then(|a| a.f).unwrap_or(1e-5);
        let scale = self.cst(ctx, n, 1, "scale")?;
        let bias = self.cst(ctx, n, 2, "bias")?;
        match self.get(ctx, n, 0)? {
            Val::Act(x) => {
                let c = self.values[x].channels;
                if scale.len() != c || bias.len() != c {
                    return Err(ctx.err(format!(
                        "scale/bias have {}/{} elements for {c} channels",
                        scale.len(),
                        bias.len()
                    )));
                }
                let op = Op::InstanceNorm {
                    eps,
                    scale: Tensor::new(vec![c], scale.to_f32()),
                    bias: Tensor::new(vec![c], bias.to_f32()),
                };
                self.emit(ctx, n, op, vec![x], c);
            }
            Val::Grouped { src, groups } => {
                // PyTorch's GroupNorm export normalises [N, G, -1] with unit scale and zero bias;
                // its real affine follows as Mul/Add after the reshape back.
                if scale.len() != groups
                    || bias.len() != groups
                    || scale.to_f32().iter().any(|&v| v != 1.0)
                    || bias.to_f32().iter().any(|&v| v != 0.0)
                {
                    return Err(ctx.err("normalises a grouped reshape with a non-trivial scale/bias, which is not the GroupNorm export pattern"));
                }
                self.set(n, Val::GroupedNormed { src, groups, eps })?;
            }
            _ => return Err(ctx.err("input 0 must be an activation")),
        }
        Ok(())
    }

    fn group_norm_op(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let x = self.act(ctx, n, 0)?;
        let c = self.values[x].channels;
        let eps = attr(n, "epsilon").and_then(|a| a.f).unwrap_or(1e-5);
        let g = attr(n, "num_groups")
            .and_then(|a| a.i)
            .ok_or_else(|| ctx.err("attribute num_groups is missing"))?;
        if g <= 0 || c as i64 % g != 0 {
            return Err(ctx.err(format!(
                "attribute num_groups={g} does not divide {c} channels"
            )));
        }
        let g = g as usize;
        let mut pv = vec![];
        for (i, what) in [(1, "scale"), (2, "bias")] {
            let t = self.cst(ctx, n, i, what)?.to_f32();
            // Opset 18 gives one value per group, opset 21 one per channel.
            let v = if t.len() == c {
                t
            } else if t.len() == g {
                (0..c).map(|ch| t[ch / (c / g)]).collect()
            } else {
                return Err(ctx.err(format!(
                    "{what} has {} elements; expected {c} (channels) or {g} (groups)",
                    t.len()
                )));
            };
            pv.push(Tensor::new(vec![c], v));
        }
        let bias = pv.pop().unwrap_or_else(|| Tensor::new(vec![], vec![]));
        let scale = pv.pop().unwrap_or_else(|| Tensor::new(vec![], vec![]));
        self.emit(
            ctx,
            n,
            Op::GroupNorm {
                groups: g,
                eps,
                scale,
                bias,
            },
            vec![x],
            c,
        );
        Ok(())
    }

    fn binary(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let op = n.op_type();
        let a = self.get(ctx, n, 0)?;
        let b = self.get(ctx, n, 1)?;
        match (&a, &b) {
            (Val::Act(x), Val::Act(y)) => {
                let (cx, cy) = (self.values[*x].channels, self.values[*y].channels);
                if cx != cy {
                    return Err(ctx.err(format!("operands have {cx} and {cy} channels; voxtile needs equal shapes for two activations")));
                }
                let o = match op {
                    "Add" => Op::Add,
                    "Sub" => Op::Sub,
                    "Mul" => Op::Mul,
                    _ => Op::Div,
                };
                self.emit(ctx, n, o, vec![*x, *y], cx);
            }
            (Val::Act(x), other) | (other, Val::Act(x)) => {
                let act_first = matches!(a, Val::Act(_));
                let c = self.values[*x].channels;
                let k = match other {
                    Val::Const(k) => k.clone(),
                    Val::Sym(s) => sym_to_const(s)
                        .ok_or_else(|| ctx.err("constant operand depends on the window size"))?,
                    _ => return Err(ctx.err("unsupported operand combination")),
                };
                let t5 = to5(&k.shape).ok_or_else(|| {
                    ctx.err(format!(
                        "constant of shape {:?} has more than 5 dimensions",
                        k.shape
                    ))
                })?;
                if t5[0] != 1 || t5[2..].iter().any(|&d| d != 1) || (t5[1] != 1 && t5[1] != c) {
                    return Err(ctx.err(format!("constant of shape {:?} must broadcast per channel over NCDHW with {c} channels (sizes 1 except the channel axis)", k.shape)));
                }
                let data = k.to_f32();
                let t = |d: Vec<f32>| Tensor::new(t5.to_vec(), d);
                match (op, act_first) {
                    ("Add", _) => {
                        self.emit(ctx, n, Op::AddConst(t(data)), vec![*x], c);
                    }
                    ("Mul", _) => {
                        self.emit(ctx, n, Op::MulConst(t(data)), vec![*x], c);
                    }
                    ("Sub", true) => {
                        self.emit(
                            ctx,
                            n,
                            Op::AddConst(t(data.iter().map(|v| -v).collect())),
                            vec![*x],
                            c,
                        );
                    }
                    ("Sub", false) => {
                        // c - x = (-1)·x + c
                        let neg = self.emit(
                            ctx,
                            n,
                            Op::MulConst(Tensor::new(vec![1; 5], vec![-1.0])),
                            vec![*x],
                            c,
                        );
                        self.values[neg].name.push_str("_neg");
                        if let Some(nd) = self.nodes.last_mut() {
                            nd.name.push_str("_neg");
                        }
                        self.emit(ctx, n, Op::AddConst(t(data)), vec![neg], c);
                    }
                    ("Div", true) => {
                        if data.contains(&0.0) {
                            return Err(ctx.err("divides by a constant that contains zero"));
                        }
                        self.emit(
                            ctx,
                            n,
                            Op::MulConst(t(data.iter().map(|v| 1.0 / v).collect())),
                            vec![*x],
                            c,
                        );
                    }
                    _ => {
                        return Err(ctx.err("dividing a constant by an activation is not supported"))
                    }
                }
            }
            _ => {
                let r = self.elementwise(ctx, &a, &b, op)?;
                self.set(n, r)?;
            }
        }
        Ok(())
    }

    /// Elementwise fold of two non-activation values (numpy broadcasting).
    fn elementwise(&self, ctx: &Ctx, a: &Val, b: &Val, op: &str) -> Result<Val> {
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
        self.check_fold(ctx, numel)?;
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
        let mut ex = self.ex.borrow_mut();
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

    /// View a constant/symbolic value as a [`Sym`].
    fn small(&self, ctx: &Ctx, v: &Val) -> Result<Sym> {
        match v {
            Val::Sym(s) => {
                self.charge_work(ctx, s.elems.len() as u64)?;
                Ok(s.clone())
            }
            Val::Const(c) => {
                self.charge_work(ctx, c.len() as u64)?;
                if c.len() > SMALL {
                    return Err(ctx.err(format!("folding a constant of {} elements is not supported", c.len())));
                }
                Ok(Sym { shape: c.shape.clone(), elems: c.to_f64().into_iter().map(X::K).collect(), int: c.is_int() })
            }
            _ => Err(ctx.err("this operation on an activation tensor is not supported (only constant / shape values can be folded)")),
        }
    }

    fn concat(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let axis = attr(n, "axis")
            .and_then(|a| a.i)
            .ok_or_else(|| ctx.err("attribute axis is missing"))?;
        let ins: Vec<Val> = (0..n.input.len())
            .map(|i| self.get(ctx, n, i))
            .collect::<Result<_>>()?;
        if ins.is_empty() {
            return Err(ctx.err("has no inputs"));
        }
        if ins.iter().any(|v| matches!(v, Val::Act(_))) {
            let axis = norm_axis(ctx, axis, 5)?;
            let mut ids = vec![];
            for (i, v) in ins.iter().enumerate() {
                match v {
                    Val::Act(x) => ids.push(*x),
                    _ => return Err(ctx.err(format!("input {i} is a constant; concatenating constants with activations is not supported"))),
                }
            }
            let chans: Vec<usize> = ids.iter().map(|&i| self.values[i].channels).collect();
            let c = if axis == 1 {
                chans.iter().sum()
            } else {
                if chans.iter().any(|&c| c != chans[0]) {
                    return Err(ctx.err(format!("inputs have channels {chans:?}, which must agree for concatenation along axis {axis}")));
                }
                chans[0]
            };
            if axis == 0 {
                return Err(ctx.err("concatenation along the batch axis is not supported"));
            }
            self.emit(ctx, n, Op::Concat { axis }, ids, c);
            return Ok(());
        }
        let parts: Vec<Sym> = ins
            .iter()
            .map(|v| self.small(ctx, v))
            .collect::<Result<_>>()?;
        let rank = parts[0].shape.len();
        let axis = norm_axis(ctx, axis, rank)?;
        let mut shape = parts[0].shape.clone();
        shape[axis] = 0;
        for p in &parts {
            if p.shape.len() != rank
                || (0..rank).any(|a| a != axis && p.shape[a] != parts[0].shape[a])
            {
                return Err(ctx.err("inputs have mismatched shapes"));
            }
            shape[axis] += p.shape[axis];
        }
        let outer: usize = shape[..axis].iter().product();
        let mut elems = vec![];
        for o in 0..outer {
            for p in &parts {
                let chunk: usize = p.shape[axis..].iter().product();
                elems.extend_from_slice(&p.elems[o * chunk..(o + 1) * chunk]);
            }
        }
        let int = parts.iter().all(|p| p.int);
        self.set(n, Val::Sym(Sym { shape, elems, int }))?;
        Ok(())
    }

    fn pool(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let x = self.act(ctx, n, 0)?;
        let c = self.values[x].channels;
        let k = self
            .ints(n, "kernel_shape")
            .ok_or_else(|| ctx.err("attribute kernel_shape is missing"))?;
        if k.len() != 3 || k.iter().any(|&v| v <= 0 || v > ATTR_LIMIT) {
            return Err(ctx.err(format!(
                "attribute kernel_shape={k:?} must be 3 positive values (3D pooling)"
            )));
        }
        let kernel = [k[0] as usize, k[1] as usize, k[2] as usize];
        let (stride, dilation, pads, auto_pad) = self.window_attrs(ctx, n, kernel)?;
        let pads = self.resolve_pads(ctx, &auto_pad, pads, kernel, stride, dilation)?;
        let ceil_mode = attr(n, "ceil_mode").and_then(|a| a.i).unwrap_or(0) != 0;
        let count_include_pad = attr(n, "count_include_pad").and_then(|a| a.i).unwrap_or(0) != 0;
        if let Some(so) = attr(n, "storage_order").and_then(|a| a.i) {
            if so != 0 {
                return Err(ctx.err(format!("attribute storage_order={so} is not supported")));
            }
        }
        let p = Pool {
            kernel,
            stride,
            dilation,
            pads,
            ceil_mode,
            count_include_pad,
        };
        let op = if n.op_type() == "MaxPool" {
            Op::MaxPool(p)
        } else {
            Op::AveragePool(p)
        };
        self.emit(ctx, n, op, vec![x], c);
        Ok(())
    }

    fn sattr(n: &proto::NodeProto, name: &str, default: &str) -> String {
        attr(n, name)
            .and_then(|a| a.s.as_ref())
            .map(|s| String::from_utf8_lossy(s).to_string())
            .unwrap_or_else(|| default.to_string())
    }

    fn resize(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let x = self.act(ctx, n, 0)?;
        let c = self.values[x].channels;
        let is_upsample = n.op_type() == "Upsample";
        let old = is_upsample || self.opset < 11;
        let mode = match Self::sattr(n, "mode", "nearest").as_str() {
            "nearest" => ResizeMode::Nearest,
            "linear" | "trilinear" => ResizeMode::Linear,
            other => {
                return Err(ctx.err(format!(
                    "attribute mode={other} is not supported (nearest, linear)"
                )))
            }
        };
        let (coord, nearest) = if old {
            (CoordMode::Asymmetric, NearestMode::Floor)
        } else {
            let coord =
                match Self::sattr(n, "coordinate_transformation_mode", "half_pixel").as_str() {
                    "half_pixel" => CoordMode::HalfPixel,
                    "pytorch_half_pixel" => CoordMode::PytorchHalfPixel,
                    "align_corners" => CoordMode::AlignCorners,
                    "asymmetric" => CoordMode::Asymmetric,
                    other => {
                        return Err(ctx.err(format!(
                            "attribute coordinate_transformation_mode={other} is not supported"
                        )))
                    }
                };
            let nearest = match Self::sattr(n, "nearest_mode", "round_prefer_floor").as_str() {
                "round_prefer_floor" => NearestMode::RoundPreferFloor,
                "round_prefer_ceil" => NearestMode::RoundPreferCeil,
                "floor" => NearestMode::Floor,
                "ceil" => NearestMode::Ceil,
                other => {
                    return Err(ctx.err(format!("attribute nearest_mode={other} is not supported")))
                }
            };
            (coord, nearest)
        };
        if attr(n, "antialias").and_then(|a| a.i).unwrap_or(0) != 0 {
            return Err(ctx.err("attribute antialias=1 is not supported"));
        }
        if attr(n, "axes").is_some() {
            return Err(ctx.err("attribute axes is not supported; export resizing all axes"));
        }
        let policy = Self::sattr(n, "keep_aspect_ratio_policy", "stretch");
        if policy != "stretch" {
            return Err(ctx.err(format!(
                "attribute keep_aspect_ratio_policy={policy} is not supported"
            )));
        }
        // Inputs: Upsample(X, scales) / opset 7 attr; Resize-10 (X, scales); Resize-11+ (X, roi, scales, sizes).
        let (scales_in, sizes_in) = if is_upsample {
            if let Some(a) = attr(n, "scales") {
                (
                    Some(Val::Const(Const {
                        shape: vec![a.floats.len()],
                        data: Data::F(a.floats.clone()),
                    })),
                    None,
                )
            } else {
                (self.get_opt(ctx, n, 1)?, None)
            }
        } else if self.opset < 11 {
            (self.get_opt(ctx, n, 1)?, None)
        } else {
            (self.get_opt(ctx, n, 2)?, self.get_opt(ctx, n, 3)?)
        };
        let scales_in = scales_in.filter(|v| !matches!(v, Val::Const(c) if c.len() == 0));
        let sizes_in = sizes_in.filter(|v| !matches!(v, Val::Const(c) if c.len() == 0));
        let r = match (scales_in, sizes_in) {
            (Some(s), None) => {
                let s = self.small(ctx, &s)?;
                let v = s.all_known().ok_or_else(|| {
                    ctx.err(
                        "scales depend on the window size; voxtile needs constant scales or sizes",
                    )
                })?;
                if v.len() != 5
                    || v[0] != 1.0
                    || v[1] != 1.0
                    || v[2..].iter().any(|&f| !(f > 0.0 && f.is_finite()))
                {
                    return Err(ctx.err(format!(
                        "scales {v:?} must be 5 positive values with 1 for N and C"
                    )));
                }
                Resize {
                    mode,
                    coord,
                    nearest,
                    scales: [v[2] as f32, v[3] as f32, v[4] as f32],
                    sizes: None,
                }
            }
            (None, Some(sz)) => {
                let s = self.small(ctx, &sz)?;
                if s.elems.len() != 5 {
                    return Err(ctx.err(format!(
                        "sizes has {} elements; expected 5 (NCDHW)",
                        s.elems.len()
                    )));
                }
                self.resize_from_sizes(ctx, x, &s, mode, coord, nearest)?
            }
            (Some(_), Some(_)) => return Err(ctx.err("both scales and sizes are given")),
            (None, None) => return Err(ctx.err("neither scales nor sizes is given")),
        };
        self.emit(ctx, n, Op::Resize(r), vec![x], c);
        Ok(())
    }

    /// Sizes that are constant become `sizes`; sizes computed from shapes become `scales` when they
    /// are a fixed multiple of the input's size on every probe window.
    fn resize_from_sizes(
        &self,
        ctx: &Ctx,
        x: ValueId,
        s: &Sym,
        mode: ResizeMode,
        coord: CoordMode,
        nearest: NearestMode,
    ) -> Result<Resize> {
        let c = self.values[x].channels;
        let probes = self.probe(ctx, x)?;
        let evs: Vec<Vec<f64>> = probes
            .iter()
            .map(|(shapes, _)| self.eval(ctx, &s.elems, shapes))
            .collect::<Result<_>>()?;
        let s0 = &evs[0];
        let x0 = probes[0].0[x];
        let mut scales = [0f32; 3];
        for a in 0..3 {
            scales[a] = (s0[a + 2] / x0[a + 2] as f64) as f32;
        }
        let (mut all_const, mut all_ratio) = (true, true);
        for ((shapes, _), ev) in probes.iter().zip(&evs) {
            let xs = shapes[x];
            // A constant N (export with batch 1) is tolerated; a computed one must be the input's.
            if ev[1] != c as f64 || (s.elems[0].known().is_none() && ev[0] != xs[0] as f64) {
                return Err(ctx.err(format!(
                    "sizes {ev:?} must keep N and C unchanged ({}, {c})",
                    xs[0]
                )));
            }
            for a in 0..3 {
                let v = ev[a + 2];
                if !(v >= 1.0 && v.fract() == 0.0) {
                    return Err(ctx.err(format!("sizes evaluate to {ev:?}, not positive integers")));
                }
                if v != s0[a + 2] {
                    all_const = false;
                }
                if ((xs[a + 2] as f32) * scales[a]).floor() as f64 != v {
                    all_ratio = false;
                }
            }
        }
        if all_const && s.elems[2..].iter().all(|e| e.known().is_some()) {
            let sizes = [s0[2] as usize, s0[3] as usize, s0[4] as usize];
            return Ok(Resize {
                mode,
                coord,
                nearest,
                scales,
                sizes: Some(sizes),
            });
        }
        if all_ratio {
            return Ok(Resize {
                mode,
                coord,
                nearest,
                scales,
                sizes: None,
            });
        }
        Err(ctx.err("the output sizes are computed from tensor shapes in a way that is neither constant nor a fixed multiple of the input size; voxtile cannot fold it"))
    }

    /// Shapes of the partial IR on several windows (multiples of its spatial divisor, different per
    /// axis so that mixed-up axes show), N = 1 and 2. Returns (shapes, window) pairs.
    /// Each shape inference of the partial IR is charged to the work budget, and the result is
    /// reused until a node is added (a chain of no-op Reshapes probes once).
    fn probe(&self, ctx: &Ctx, _x: ValueId) -> Result<Probes> {
        if let Some((len, p)) = &*self.probe_cache.borrow() {
            if *len == self.nodes.len() {
                return Ok(p.clone());
            }
        }
        let cost = self.nodes.len() as u64 + self.values.len() as u64 + 1;
        self.charge_work(ctx, cost)?;
        let d = spatial_divisor_raw(&self.values, &self.nodes, self.input);
        let mut out = vec![];
        for m in 1..40usize {
            let Some(w) = probe_window(d, m) else {
                break;
            };
            let n = 1 + (m % 2);
            self.charge_work(ctx, cost)?;
            if let Ok(s) = infer_shapes_raw(&self.values, &self.nodes, self.input, n, w) {
                out.push((s, w));
                if out.len() == 4 {
                    let p = Rc::new(out);
                    *self.probe_cache.borrow_mut() = Some((self.nodes.len(), p.clone()));
                    return Ok(p);
                }
            }
        }
        Err(ctx.err("cannot evaluate the shape computation: no probe window fits the model so far"))
    }

    fn reshape(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let data = self.get(ctx, n, 0)?;
        let target = self.get(ctx, n, 1)?;
        let ts = self.small(ctx, &target)?;
        if attr(n, "allowzero").and_then(|a| a.i).unwrap_or(0) != 0 {
            return Err(ctx.err("attribute allowzero=1 is not supported"));
        }
        match data {
            Val::Act(x) => {
                let c = self.values[x].channels;
                let probes = self.probe(ctx, x)?;
                let evs: Vec<Vec<f64>> = probes
                    .iter()
                    .map(|(shapes, _)| self.eval(ctx, &ts.elems, shapes))
                    .collect::<Result<_>>()?;
                // [N|0, G, -1]: GroupNorm step 1.
                if ts.elems.len() == 3 {
                    if let Some(g) = ts.elems[1].known() {
                        let g = g as usize;
                        let ok = g > 0
                            && c.is_multiple_of(g)
                            && probes.iter().zip(&evs).all(|((sh, _), e)| {
                                let xs = sh[x];
                                (e[0] == 0.0 || e[0] == xs[0] as f64)
                                    && (e[2] == -1.0
                                        || e[2] == (xs[1..].iter().product::<usize>() / g) as f64)
                            });
                        if ok {
                            self.set(n, Val::Grouped { src: x, groups: g })?;
                            return Ok(());
                        }
                    }
                }
                // Reshape to its own shape: a no-op.
                let same = ts.elems.len() == 5
                    && probes.iter().zip(&evs).all(|((sh, _), e)| {
                        (0..5).all(|a| {
                            e[a] == sh[x][a] as f64
                                || e[a] == 0.0
                                || (e[a] == -1.0 && e.iter().filter(|&&v| v == -1.0).count() == 1)
                        })
                    });
                if same {
                    self.set(n, Val::Act(x))?;
                    return Ok(());
                }
                Err(ctx.err("reshaping an activation is only supported as part of the GroupNorm export pattern or as a no-op"))
            }
            Val::GroupedNormed { src, groups, eps } => {
                let c = self.values[src].channels;
                let probes = self.probe(ctx, src)?;
                let evs: Vec<Vec<f64>> = probes
                    .iter()
                    .map(|(shapes, _)| self.eval(ctx, &ts.elems, shapes))
                    .collect::<Result<_>>()?;
                let ok = ts.elems.len() == 5
                    && probes.iter().zip(&evs).all(|((sh, _), e)| {
                        let xs = sh[src];
                        (0..5).all(|a| {
                            e[a] == xs[a] as f64
                                || (a == 0 && e[a] == 0.0)
                                || (e[a] == -1.0 && e.iter().filter(|&&v| v == -1.0).count() == 1)
                        })
                    });
                if !ok {
                    return Err(ctx.err("the grouped normalisation is reshaped to something other than its input's shape"));
                }
                let scale = Tensor::new(vec![c], vec![1.0; c]);
                let bias = Tensor::new(vec![c], vec![0.0; c]);
                self.emit(
                    ctx,
                    n,
                    Op::GroupNorm {
                        groups,
                        eps,
                        scale,
                        bias,
                    },
                    vec![src],
                    c,
                );
                Ok(())
            }
            Val::Grouped { .. } => {
                Err(ctx.err("reshaping a grouped activation again is not supported"))
            }
            other => {
                let s = self.small(ctx, &other)?;
                let total = s.elems.len();
                let dims = ts.all_known().ok_or_else(|| {
                    ctx.err("the target shape of a constant depends on the window size")
                })?;
                let mut shape = vec![];
                let mut infer = None;
                for (i, &d) in dims.iter().enumerate() {
                    let d = to_i64(ctx, d, "shape")?;
                    match d {
                        -1 if infer.is_none() => {
                            infer = Some(i);
                            shape.push(1);
                        }
                        0 => {
                            shape.push(*s.shape.get(i).ok_or_else(|| {
                                ctx.err("shape value 0 copies a missing dimension")
                            })?)
                        }
                        d if d > 0 => shape.push(d as usize),
                        _ => return Err(ctx.err(format!("invalid target shape {dims:?}"))),
                    }
                }
                let known = small_numel(&shape)
                    .ok_or_else(|| ctx.err(format!("target shape {dims:?} is too large")))?;
                if let Some(i) = infer {
                    if known == 0 || total % known != 0 {
                        return Err(
                            ctx.err(format!("cannot reshape {} elements to {dims:?}", total))
                        );
                    }
                    shape[i] = total / known;
                }
                if shape.iter().product::<usize>() != total {
                    return Err(ctx.err(format!("cannot reshape {} elements to {dims:?}", total)));
                }
                self.set(
                    n,
                    Val::Sym(Sym {
                        shape,
                        elems: s.elems,
                        int: s.int,
                    }),
                )?;
                Ok(())
            }
        }
    }

    fn shape_op(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let v = self.get(ctx, n, 0)?;
        let dims: Vec<X> = match &v {
            Val::Act(x) => (0..5)
                .map(|a| {
                    if a == 1 {
                        X::K(self.values[*x].channels as f64)
                    } else {
                        self.ex.borrow_mut().dim(*x, a)
                    }
                })
                .collect(),
            Val::Const(c) => c.shape.iter().map(|&d| X::K(d as f64)).collect(),
            Val::Sym(s) => s.shape.iter().map(|&d| X::K(d as f64)).collect(),
            _ => return Err(ctx.err("the shape of a grouped reshape is not supported")),
        };
        let r = dims.len() as i64;
        let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
        let start = clamp(attr(n, "start").and_then(|a| a.i).unwrap_or(0));
        let end = clamp(attr(n, "end").and_then(|a| a.i).unwrap_or(r));
        let elems: Vec<X> = if start < end {
            dims[start..end].to_vec()
        } else {
            vec![]
        };
        self.set(
            n,
            Val::Sym(Sym {
                shape: vec![elems.len()],
                elems,
                int: true,
            }),
        )?;
        Ok(())
    }

    fn cast(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let to = attr(n, "to")
            .and_then(|a| a.i)
            .ok_or_else(|| ctx.err("attribute to is missing"))? as i32;
        let is_float = matches!(to, 1 | 10 | 11 | 16);
        match self.get(ctx, n, 0)? {
            Val::Act(x) => {
                if to != 1 {
                    return Err(ctx.err(format!("casting an activation to type {to} is not supported (voxtile computes in float32)")));
                }
                self.set(n, Val::Act(x))?;
            }
            other => {
                let mut s = self.small(ctx, &other)?;
                if !is_float {
                    if to == 9 {
                        s.elems = s
                            .elems
                            .iter()
                            .map(|e| match e {
                                X::K(v) => X::K((*v != 0.0) as i32 as f64),
                                e => *e,
                            })
                            .collect();
                    } else {
                        let mut ex = self.ex.borrow_mut();
                        s.elems = s.elems.iter().map(|&e| ex.un(Round::Trunc, e)).collect();
                    }
                }
                s.int = !is_float;
                self.set(n, Val::Sym(s))?;
            }
        }
        Ok(())
    }

    /// Shape-plumbing ops on constant / symbolic values.
    fn plumbing(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let op = n.op_type();
        let x = self.get(ctx, n, 0)?;
        if matches!(x, Val::Act(_)) {
            return Err(ctx.err(format!("{op} on an activation tensor is not supported (only on constants and shape values)")));
        }
        let s = self.small(ctx, &x)?;
        let out = match op {
            "Gather" => {
                let idx = self.small(ctx, &self.get(ctx, n, 1)?)?;
                let iv = idx
                    .all_known()
                    .ok_or_else(|| ctx.err("indices depend on the window size"))?;
                let rank = s.shape.len();
                if rank == 0 {
                    return Err(ctx.err("gathering from a scalar"));
                }
                let axis = norm_axis(ctx, attr(n, "axis").and_then(|a| a.i).unwrap_or(0), rank)?;
                let dim = s.shape[axis] as i64;
                let outer: usize = s.shape[..axis].iter().product();
                let inner: usize = s.shape[axis + 1..].iter().product();
                let total = outer
                    .checked_mul(iv.len())
                    .and_then(|v| v.checked_mul(inner))
                    .filter(|&v| v <= SMALL)
                    .ok_or_else(|| ctx.err("the gathered constant is too large to fold"))?;
                self.check_fold(ctx, total)?;
                let mut elems = vec![];
                for o in 0..outer {
                    for &i in &iv {
                        let i = to_i64(ctx, i, "index")?;
                        let j = if i < 0 { i + dim } else { i };
                        if j < 0 || j >= dim {
                            return Err(
                                ctx.err(format!("index {i} out of range for dimension {dim}"))
                            );
                        }
                        let base = (o * s.shape[axis] + j as usize) * inner;
                        elems.extend_from_slice(&s.elems[base..base + inner]);
                    }
                }
                let mut shape = s.shape[..axis].to_vec();
                shape.extend_from_slice(&idx.shape);
                shape.extend_from_slice(&s.shape[axis + 1..]);
                Sym {
                    shape,
                    elems,
                    int: s.int,
                }
            }
            "Unsqueeze" | "Squeeze" => {
                let axes: Option<Vec<i64>> = match self.get_opt(ctx, n, 1)? {
                    Some(a) => Some(
                        self.small(ctx, &a)?
                            .all_known()
                            .ok_or_else(|| ctx.err("axes depend on the window size"))?
                            .iter()
                            .map(|&v| v as i64)
                            .collect(),
                    ),
                    None => self.ints(n, "axes"),
                };
                let mut shape = s.shape.clone();
                if op == "Unsqueeze" {
                    let axes = axes.ok_or_else(|| ctx.err("axes are missing"))?;
                    let r = shape.len() + axes.len();
                    let mut ax: Vec<usize> = axes
                        .iter()
                        .map(|&a| norm_axis(ctx, a, r))
                        .collect::<Result<_>>()?;
                    ax.sort_unstable();
                    for a in ax {
                        shape.insert(a, 1);
                    }
                } else {
                    match axes {
                        None => shape.retain(|&d| d != 1),
                        Some(axes) => {
                            let r = shape.len();
                            let mut ax: Vec<usize> = axes
                                .iter()
                                .map(|&a| norm_axis(ctx, a, r))
                                .collect::<Result<_>>()?;
                            ax.sort_unstable();
                            for a in ax.into_iter().rev() {
                                if shape[a] != 1 {
                                    return Err(ctx.err(format!(
                                        "cannot squeeze axis {a} of size {}",
                                        shape[a]
                                    )));
                                }
                                shape.remove(a);
                            }
                        }
                    }
                }
                Sym { shape, ..s }
            }
            "Flatten" => {
                let r = s.shape.len();
                let axis = norm_axis(ctx, attr(n, "axis").and_then(|a| a.i).unwrap_or(1), r + 1)?;
                let a: usize = s.shape[..axis].iter().product();
                let b: usize = s.shape[axis..].iter().product();
                Sym {
                    shape: vec![a, b],
                    ..s
                }
            }
            "Slice" => self.slice(n, ctx, s)?,
            "ConstantOfShape" => {
                let dims = s.all_known().ok_or_else(|| {
                    ctx.err("ConstantOfShape of a window-dependent shape is not supported")
                })?;
                let mut shape = vec![];
                let mut total: u64 = 1;
                for d in dims {
                    let d = to_i64(ctx, d, "shape")?;
                    if d < 0 {
                        return Err(ctx.err(format!("negative dimension {d}")));
                    }
                    total = total.saturating_mul(d as u64);
                    shape.push(d as usize);
                }
                if total > SMALL as u64 {
                    return Err(ctx.err(format!("{total} elements is too large a constant")));
                }
                self.check_fold(ctx, total as usize)?;
                let (v, int) = match attr(n, "value").and_then(|a| a.t.as_ref()) {
                    Some(t) => {
                        let c = decode_tensor(t, self.dir, self.path)?;
                        (c.to_f64().first().copied().unwrap_or(0.0), c.is_int())
                    }
                    None => (0.0, false),
                };
                Sym {
                    shape,
                    elems: vec![X::K(v); total as usize],
                    int,
                }
            }
            "Floor" | "Ceil" => {
                let k = if op == "Floor" {
                    Round::Floor
                } else {
                    Round::Ceil
                };
                let mut ex = self.ex.borrow_mut();
                Sym {
                    elems: s.elems.iter().map(|&e| ex.un(k, e)).collect(),
                    ..s
                }
            }
            "Neg" => Sym {
                elems: s
                    .elems
                    .iter()
                    .map(|&e| self.ex.borrow_mut().bin(Bop::Mul, e, X::K(-1.0)))
                    .collect(),
                ..s
            },
            "Sqrt" | "Reciprocal" => {
                let v = s
                    .all_known()
                    .ok_or_else(|| ctx.err("operand depends on the window size"))?;
                let elems = v
                    .iter()
                    .map(|&x| X::K(if op == "Sqrt" { x.sqrt() } else { 1.0 / x }))
                    .collect();
                Sym {
                    elems,
                    int: false,
                    ..s
                }
            }
            "Min" | "Max" => {
                let mut acc = Val::Sym(s);
                for i in 1..n.input.len() {
                    let b = self.get(ctx, n, i)?;
                    acc = self.elementwise(ctx, &acc, &b, op)?;
                }
                match acc {
                    Val::Sym(s) => s,
                    _ => return Err(ctx.err("unexpected")),
                }
            }
            "Range" => {
                let st = s.all_known().and_then(|v| v.first().copied());
                let lim = self
                    .small(ctx, &self.get(ctx, n, 1)?)?
                    .all_known()
                    .and_then(|v| v.first().copied());
                let dl = self
                    .small(ctx, &self.get(ctx, n, 2)?)?
                    .all_known()
                    .and_then(|v| v.first().copied());
                let (Some(st), Some(lim), Some(dl)) = (st, lim, dl) else {
                    return Err(ctx.err("Range over window-dependent bounds is not supported"));
                };
                if dl == 0.0 {
                    return Err(ctx.err("delta is zero"));
                }
                let cnt = ((lim - st) / dl).ceil().max(0.0);
                if cnt > SMALL as f64 {
                    return Err(ctx.err("range too long"));
                }
                self.check_fold(ctx, cnt as usize)?;
                let elems: Vec<X> = (0..cnt as usize)
                    .map(|i| X::K(st + i as f64 * dl))
                    .collect();
                Sym {
                    shape: vec![elems.len()],
                    elems,
                    int: s.int,
                }
            }
            "Expand" => {
                let target = self
                    .small(ctx, &self.get(ctx, n, 1)?)?
                    .all_known()
                    .ok_or_else(|| ctx.err("target shape depends on the window size"))?;
                let t: Vec<usize> = target
                    .iter()
                    .map(|&v| if v >= 0.0 { v as usize } else { usize::MAX })
                    .collect();
                if t.contains(&usize::MAX) {
                    return Err(ctx.err("negative target shape"));
                }
                let shape = broadcast_shape(&s.shape, &t)
                    .ok_or_else(|| ctx.err(format!("cannot expand {:?} to {t:?}", s.shape)))?;
                let numel =
                    small_numel(&shape).ok_or_else(|| ctx.err("expanded constant too large"))?;
                self.check_fold(ctx, numel)?;
                let mut elems = vec![];
                for_each_index(&shape, |idx| {
                    elems.push(s.elems[broadcast_index(&s.shape, &shape, idx)])
                });
                Sym {
                    shape,
                    elems,
                    int: s.int,
                }
            }
            "Transpose" => {
                let r = s.shape.len();
                let perm: Vec<usize> = match self.ints(n, "perm") {
                    Some(p) => p
                        .iter()
                        .map(|&a| norm_axis(ctx, a, r))
                        .collect::<Result<_>>()?,
                    None => (0..r).rev().collect(),
                };
                let mut seen = perm.clone();
                seen.sort_unstable();
                if seen != (0..r).collect::<Vec<_>>() {
                    return Err(ctx.err(format!("perm {perm:?} is not a permutation")));
                }
                let shape: Vec<usize> = perm.iter().map(|&p| s.shape[p]).collect();
                let mut strides = vec![1usize; r];
                for a in (0..r.saturating_sub(1)).rev() {
                    strides[a] = strides[a + 1] * s.shape[a + 1];
                }
                let mut elems = Vec::with_capacity(s.elems.len());
                for_each_index(&shape, |idx| {
                    let flat: usize = idx
                        .iter()
                        .enumerate()
                        .map(|(i, &v)| v * strides[perm[i]])
                        .sum();
                    elems.push(s.elems[flat]);
                });
                Sym {
                    shape,
                    elems,
                    int: s.int,
                }
            }
            _ => return Err(ctx.err(format!("operator {op} is not supported"))),
        };
        self.set(n, Val::Sym(out))?;
        Ok(())
    }

    fn slice(&self, n: &proto::NodeProto, ctx: &Ctx, s: Sym) -> Result<Sym> {
        let known = |i: usize, name: &str| -> Result<Option<Vec<i64>>> {
            match self.get_opt(ctx, n, i)? {
                None => Ok(None),
                Some(v) => {
                    let k = self
                        .small(ctx, &v)?
                        .all_known()
                        .ok_or_else(|| ctx.err(format!("{name} depend on the window size")))?;
                    Ok(Some(
                        k.iter()
                            .map(|&x| x.clamp(i64::MIN as f64, i64::MAX as f64) as i64)
                            .collect(),
                    ))
                }
            }
        };
        let (starts, ends, axes, steps) = if n.input.len() > 1 {
            (
                known(1, "starts")?.unwrap_or_default(),
                known(2, "ends")?.unwrap_or_default(),
                known(3, "axes")?,
                known(4, "steps")?,
            )
        } else {
            (
                self.ints(n, "starts").unwrap_or_default(),
                self.ints(n, "ends").unwrap_or_default(),
                self.ints(n, "axes"),
                None,
            )
        };
        let r = s.shape.len();
        if starts.len() != ends.len() {
            return Err(ctx.err("starts and ends differ in length"));
        }
        let axes: Vec<usize> = match axes {
            Some(a) => a
                .iter()
                .map(|&v| norm_axis(ctx, v, r))
                .collect::<Result<_>>()?,
            None => (0..starts.len()).collect(),
        };
        let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
        if axes.len() != starts.len() || steps.len() != starts.len() {
            return Err(ctx.err("starts/ends/axes/steps differ in length"));
        }
        // Per axis: list of kept indices.
        let mut keep: Vec<Vec<usize>> = s.shape.iter().map(|&d| (0..d).collect()).collect();
        for i in 0..starts.len() {
            let a = axes[i];
            let d = s.shape[a] as i64;
            let st = steps[i];
            if st == 0 {
                return Err(ctx.err("slice step 0"));
            }
            let norm = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
            let mut idx = vec![];
            if st > 0 {
                let (b, e) = (norm(starts[i]).clamp(0, d), norm(ends[i]).clamp(0, d));
                let mut j = b;
                while j < e {
                    idx.push(j as usize);
                    j = j.saturating_add(st);
                }
            } else {
                let (b, e) = (
                    norm(starts[i]).clamp(-1, d - 1),
                    norm(ends[i]).clamp(-1, d - 1),
                );
                let mut j = b;
                while j > e {
                    idx.push(j as usize);
                    j = j.saturating_add(st);
                }
            }
            keep[a] = idx;
        }
        let shape: Vec<usize> = keep.iter().map(|k| k.len()).collect();
        let mut strides = vec![1usize; r];
        for a in (0..r.saturating_sub(1)).rev() {
            strides[a] = strides[a + 1] * s.shape[a + 1];
        }
        let mut elems = vec![];
        for_each_index(&shape, |idx| {
            let flat: usize = idx
                .iter()
                .enumerate()
                .map(|(a, &v)| keep[a][v] * strides[a])
                .sum();
            elems.push(s.elems[flat]);
        });
        Ok(Sym {
            shape,
            elems,
            int: s.int,
        })
    }
}

/// The `m`-th probe window for spatial divisor `d` (axes differ so that mixed-up axes show);
/// None once it no longer fits in memory arithmetic (a divisor grown absurdly large).
fn probe_window(d: [usize; 3], m: usize) -> Option<[usize; 3]> {
    const MAX: usize = 1 << 24;
    let w = [
        d[0].checked_mul(m)?,
        d[1].checked_mul(m + 1)?,
        d[2].checked_mul(m + 3)?,
    ];
    w.iter().all(|&v| v <= MAX).then_some(w)
}

fn sym_to_const(s: &Sym) -> Option<Const> {
    let v = s.all_known()?;
    Some(Const {
        shape: s.shape.clone(),
        data: if s.int {
            Data::I(v.iter().map(|&x| x as i64).collect())
        } else {
            Data::F(v.iter().map(|&x| x as f32).collect())
        },
    })
}

/// Right-align a shape against NCDHW (numpy broadcasting).
fn to5(shape: &[usize]) -> Option<[usize; 5]> {
    if shape.len() > 5 {
        return None;
    }
    let mut o = [1usize; 5];
    o[5 - shape.len()..].copy_from_slice(shape);
    Some(o)
}

/// w'[o] = w[o]·mul[o]; b'[o] = b[o]·mul[o] + add[o], computed in f64.
pub(crate) fn fold_bn_into_conv(cv: &mut Conv, mul: &[f64], add: &[f64]) {
    let cout = cv.weight.shape[0];
    let per = cv.weight.len() / cout.max(1);
    for (row, &m) in cv.weight.data.chunks_mut(per.max(1)).zip(mul).take(cout) {
        for w in row {
            *w = (*w as f64 * m) as f32;
        }
    }
    let b: Vec<f32> = (0..cout)
        .map(|o| {
            let b0 = cv.bias.as_ref().map_or(0.0, |b| b.data[o] as f64);
            (b0 * mul[o] + add[o]) as f32
        })
        .collect();
    cv.bias = Some(Tensor::new(vec![cout], b));
}

/// GroupNorm (from the export pattern, unit affine) followed by per-channel MulConst then
/// AddConst, each the sole reader of the previous value: fold them into the norm's affine.
/// Linear in the node count (consumers indexed once, folded nodes removed at the end), so a long
/// chain of norms costs no more than its length.
fn fuse_norm_affine(g: &mut Graph) {
    let mut uses = vec![0usize; g.values.len()];
    let mut consumer = vec![usize::MAX; g.values.len()];
    for (k, n) in g.nodes.iter().enumerate() {
        for &i in &n.inputs {
            uses[i] += 1;
            consumer[i] = k;
        }
    }
    uses[g.output] += 1;
    let mut removed = vec![false; g.nodes.len()];
    for i in 0..g.nodes.len() {
        if removed[i] || !matches!(g.nodes[i].op, Op::GroupNorm { .. }) {
            continue;
        }
        loop {
            let out = g.nodes[i].output;
            let j = consumer[out];
            if uses[out] != 1 || j == usize::MAX || g.nodes[j].inputs != [out] {
                break;
            }
            let c = g.values[out].channels;
            let (is_mul, t) = match &g.nodes[j].op {
                Op::MulConst(t) => (true, t.clone()),
                Op::AddConst(t) => (false, t.clone()),
                _ => break,
            };
            if !(t.data.len() == 1 || t.data.len() == c) {
                break;
            }
            let per_c = |k: usize| {
                if t.data.len() == 1 {
                    t.data[0]
                } else {
                    t.data[k]
                }
            };
            if let Op::GroupNorm { scale, bias, .. } = &mut g.nodes[i].op {
                for k in 0..c {
                    if is_mul {
                        scale.data[k] *= per_c(k);
                        bias.data[k] *= per_c(k);
                    } else {
                        bias.data[k] += per_c(k);
                    }
                }
            }
            // The norm now writes the Mul/Add's output; the folded node goes at the end.
            g.nodes[i].output = g.nodes[j].output;
            removed[j] = true;
        }
    }
    let mut k = 0;
    g.nodes.retain(|_| {
        k += 1;
        !removed[k - 1]
    });
}

/// Drop nodes that do not contribute to the output and renumber values compactly.
fn prune(g: &mut Graph) {
    let mut live = vec![false; g.values.len()];
    live[g.output] = true;
    let mut keep = vec![false; g.nodes.len()];
    for (k, n) in g.nodes.iter().enumerate().rev() {
        if live[n.output] {
            keep[k] = true;
            for &i in &n.inputs {
                live[i] = true;
            }
        }
    }
    live[g.input] = true;
    let mut k = 0;
    g.nodes.retain(|_| {
        k += 1;
        keep[k - 1]
    });
    let mut map = vec![usize::MAX; g.values.len()];
    let mut values = vec![];
    for (i, v) in g.values.iter().enumerate() {
        if live[i] {
            map[i] = values.len();
            values.push(v.clone());
        }
    }
    for n in &mut g.nodes {
        n.output = map[n.output];
        for i in &mut n.inputs {
            *i = map[*i];
        }
    }
    g.input = map[g.input];
    g.output = map[g.output];
    g.values = values;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bn_fold_matches_f64() {
        let w: Vec<f32> = (0..2 * 3).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut cv = Conv {
            weight: Tensor::new(vec![2, 3, 1, 1, 1], w.clone()),
            bias: Some(Tensor::new(vec![2], vec![0.5, -0.25])),
            stride: [1; 3],
            dilation: [1; 3],
            pads: [0; 6],
            groups: 1,
        };
        fold_bn_into_conv(&mut cv, &[2.0, -0.5], &[1.0, 3.0]);
        for o in 0..2 {
            let m = [2.0, -0.5][o];
            for k in 0..3 {
                assert_eq!(cv.weight.data[o * 3 + k], (w[o * 3 + k] as f64 * m) as f32);
            }
        }
        assert_eq!(cv.bias.as_ref().unwrap().data, vec![2.0, 3.125]);
    }

    #[test]
    fn to5_right_aligns() {
        assert_eq!(to5(&[4, 1, 1, 1]), Some([1, 4, 1, 1, 1]));
        assert_eq!(to5(&[]), Some([1; 5]));
        assert_eq!(to5(&[1; 6]), None);
    }
}
