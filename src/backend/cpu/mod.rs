//! The float32 CPU backend: the reference every other backend is checked against.
//!
//! Every op is written once, generic over [`Real`], so [`run_graph_f64`] runs the same algorithm
//! in double precision (the yardstick for the fp16 CUDA kernels). Convolutions are im2col/col2im +
//! `matrixmultiply` GEMMs (threaded), the rest is rayon over channel planes.
//!
//! The executor runs nodes in order and frees every intermediate right after its last consumer;
//! elementwise ops reuse their input's buffer when that input dies at them.

mod fuse;
pub mod memory;
pub mod ops;
mod real;
mod window;

pub use real::Real;

use crate::backend::Backend;
use crate::model::graph::{Dims, Graph, Node};
use crate::{Error, Result};
use ndarray::{Array5, ArrayView5};

/// What the executor measured on the last run (for tests and the memory planner's cross-check).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Most activation buffers alive at once (input and output included).
    pub peak_live_buffers: usize,
    /// Most activation bytes alive at once.
    pub peak_live_bytes: usize,
    /// Nodes executed (nodes that do not feed the output are skipped).
    pub nodes_run: usize,
}

/// A graph checked for one (batch, roi): shapes, liveness and which nodes matter.
#[derive(Clone, Debug)]
struct Schedule {
    batch: usize,
    roi: [usize; 3],
    /// Shape of every value at the prepared batch (None: never computed).
    shapes: Vec<Option<Dims>>,
    /// Index of the last node reading each value (`usize::MAX` for the graph output).
    last_use: Vec<usize>,
    /// Whether each node contributes to the output.
    needed: Vec<bool>,
}

fn node_err(node: &Node, e: Error) -> Error {
    let prefix = format!("node '{}' ({})", node.name, node.op.name());
    match e {
        Error::Graph(m) => Error::Graph(format!("{prefix}: {m}")),
        Error::Invalid(m) => Error::Invalid(format!("{prefix}: {m}")),
        Error::Backend(m) => Error::Backend(format!("{prefix}: {m}")),
        other => other,
    }
}

fn schedule(graph: &Graph, batch: usize, roi: [usize; 3]) -> Result<Schedule> {
    let nv = graph.values.len();
    if batch == 0 || roi.contains(&0) {
        return Err(Error::Invalid(format!(
            "cpu backend: batch {batch} and window {roi:?} must be non-zero"
        )));
    }
    if graph.input >= nv || graph.output >= nv {
        return Err(Error::Graph(format!(
            "graph '{}': input or output value id is out of range ({} values)",
            graph.name, nv
        )));
    }
    for (a, (fixed, r)) in graph.fixed_input_spatial.iter().zip(roi).enumerate() {
        if let Some(f) = fixed {
            if *f != r {
                return Err(Error::Invalid(format!(
                    "graph '{}' has a fixed input size {f} on spatial axis {a}, but the window is {roi:?}",
                    graph.name
                )));
            }
        }
    }
    // The model's validation and shape inference are the only ones (no backend re-checks).
    graph.validate()?;
    let all = graph.infer_shapes(batch, roi)?;
    let mut computed = vec![false; nv];
    computed[graph.input] = true;
    for node in &graph.nodes {
        computed[node.output] = true;
    }
    let shapes: Vec<Option<Dims>> = all
        .into_iter()
        .zip(computed)
        .map(|(s, c)| c.then_some(s))
        .collect();
    // Backward reachability from the output: dead branches (extra exported heads) are skipped.
    let (needed, last_use) = crate::model::passes::uses::last_reads(graph);
    Ok(Schedule {
        batch,
        roi,
        shapes,
        last_use,
        needed,
    })
}

/// Runs a planned graph on one batch in precision T.
fn execute<T: Real>(
    graph: &Graph,
    plan: &Schedule,
    input: Array5<T>,
    stats: &mut RunStats,
) -> Result<Array5<T>> {
    let nv = graph.values.len();
    let mut values: Vec<Option<Array5<T>>> = (0..nv).map(|_| None).collect();
    let bytes = |a: &Array5<T>| a.len() * std::mem::size_of::<T>();
    let mut live = 1usize;
    let mut live_bytes = bytes(&input);
    *stats = RunStats {
        peak_live_buffers: live,
        peak_live_bytes: live_bytes,
        nodes_run: 0,
    };
    values[graph.input] = Some(input);
    let missing = |node: &Node, v: usize| {
        node_err(
            node,
            Error::Backend(format!(
                "internal: value {v} is not available (liveness bug)"
            )),
        )
    };
    // Tensor ops read their operands' dims (values of other ranks are stored folded into 5D
    // arrays): those of this batch, which may be smaller than the planned one.
    let n = values[graph.input]
        .as_ref()
        .map_or(plan.batch, |a| a.dim().0);
    let redone;
    let dims: &[Option<Dims>] = if n == plan.batch || !graph.has_tensor_ops() {
        &plan.shapes
    } else {
        let all = graph.infer_shapes(n, plan.roi)?;
        redone = plan
            .shapes
            .iter()
            .zip(all)
            .map(|(p, d)| p.map(|_| d))
            .collect::<Vec<_>>();
        &redone
    };
    let fusion = fuse::plan(graph, &plan.needed);
    for (i, node) in graph.nodes.iter().enumerate() {
        if !plan.needed[i] || fusion.absorbed[i] {
            stats.nodes_run += usize::from(fusion.absorbed[i]);
            continue;
        }
        let in_dims = node
            .inputs
            .iter()
            .map(|&v| dims[v].ok_or_else(|| missing(node, v)))
            .collect::<Result<Vec<Dims>>>()?;
        let od = dims[node.output].ok_or_else(|| missing(node, node.output))?;
        let in_place = ops::node_runs_inplace(&node.op, &in_dims, &od);
        let out = if ops::runs_as_tensor(&node.op, &in_dims, &od) {
            let mut ins = Vec::with_capacity(node.inputs.len());
            for (&v, &d) in node.inputs.iter().zip(&in_dims) {
                let a = values[v].as_ref().ok_or_else(|| missing(node, v))?;
                ins.push((a.view(), d));
            }
            ops::apply_tensor(&node.op, &ins, od).map_err(|e| node_err(node, e))?
        } else if in_place {
            let v0 = node.inputs[0];
            let dies_here = plan.last_use[v0] == i && !node.inputs[1..].contains(&v0);
            let mut x = if dies_here {
                let x = values[v0].take().ok_or_else(|| missing(node, v0))?;
                live -= 1;
                live_bytes -= bytes(&x);
                x
            } else {
                let v = values[v0].as_ref().ok_or_else(|| missing(node, v0))?;
                ops::owned(v.view()).map_err(|e| node_err(node, e))?
            };
            ops::make_standard(&mut x).map_err(|e| node_err(node, e))?;
            let mut rest = Vec::with_capacity(node.inputs.len() - 1);
            for &v in &node.inputs[1..] {
                rest.push(values[v].as_ref().ok_or_else(|| missing(node, v))?.view());
            }
            ops::apply_inplace(&node.op, &mut x, &rest).map_err(|e| node_err(node, e))?;
            x
        } else {
            let mut ins = Vec::with_capacity(node.inputs.len());
            for &v in &node.inputs {
                ins.push(values[v].as_ref().ok_or_else(|| missing(node, v))?.view());
            }
            fusion.apply(node, i, &ins).map_err(|e| node_err(node, e))?
        };
        live += 1;
        live_bytes += bytes(&out);
        values[fusion.output(graph, i)] = Some(out);
        stats.peak_live_buffers = stats.peak_live_buffers.max(live);
        stats.peak_live_bytes = stats.peak_live_bytes.max(live_bytes);
        stats.nodes_run += 1;
        for (j, &v) in node.inputs.iter().enumerate() {
            if plan.last_use[v] == i && !node.inputs[..j].contains(&v) {
                if let Some(a) = values[v].take() {
                    live -= 1;
                    live_bytes -= bytes(&a);
                }
            }
        }
    }
    values[graph.output]
        .take()
        .ok_or_else(|| Error::Backend("internal: the graph output was not computed".into()))
}

fn check_input(
    plan: &Schedule,
    graph: &Graph,
    d: (usize, usize, usize, usize, usize),
) -> Result<()> {
    let (n, c, sd, sh, sw) = d;
    if n == 0 || n > plan.batch {
        return Err(Error::Invalid(format!(
            "cpu backend: batch of {n} windows, expected 1..={} as prepared",
            plan.batch
        )));
    }
    if c != graph.input_channels() {
        return Err(Error::Invalid(format!(
            "model '{}' expects {} input channels, got {c}",
            graph.name,
            graph.input_channels()
        )));
    }
    if [sd, sh, sw] != plan.roi {
        return Err(Error::Invalid(format!(
            "cpu backend was prepared for windows {:?}, got {:?}",
            plan.roi,
            [sd, sh, sw]
        )));
    }
    Ok(())
}

/// The f32 CPU backend (rayon + matrixmultiply threads).
#[derive(Default)]
pub struct CpuBackend {
    prepared: Option<(Graph, Schedule)>,
    stats: RunStats,
}

impl CpuBackend {
    pub fn new() -> Self {
        Self::default()
    }

    /// Liveness counters of the last [`Backend::run`].
    pub fn last_stats(&self) -> RunStats {
        self.stats
    }

    /// Shape of every value at the prepared batch (`None` for values no node computes).
    pub fn planned_shapes(&self) -> Option<&[Option<Dims>]> {
        self.prepared.as_ref().map(|(_, p)| p.shapes.as_slice())
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> String {
        format!("cpu ({} threads)", rayon::current_num_threads())
    }

    fn memory(&self) -> &dyn crate::backend::MemoryModel {
        &memory::CpuMemory
    }

    fn prepare(&mut self, graph: &Graph, batch: usize, roi: [usize; 3]) -> Result<()> {
        let p = schedule(graph, batch, roi)?;
        self.prepared = Some((graph.clone(), p));
        Ok(())
    }

    fn run(&mut self, input: ArrayView5<f32>) -> Result<Array5<f32>> {
        let (graph, plan) = self
            .prepared
            .as_ref()
            .ok_or_else(|| Error::Backend("cpu backend: run called before prepare".into()))?;
        check_input(plan, graph, input.dim())?;
        let x = ops::owned(input)?;
        execute(graph, plan, x, &mut self.stats)
    }

    fn sliding_window(
        &mut self,
        pass: &crate::backend::Pass<'_>,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<crate::backend::PassOutput> {
        window::sliding_window(self, pass, progress)
    }
}

fn run_generic<T: Real>(
    graph: &Graph,
    input: ArrayView5<T>,
    stats: &mut RunStats,
) -> Result<Array5<T>> {
    let (n, _, d, h, w) = input.dim();
    let p = schedule(graph, n.max(1), [d, h, w])?;
    check_input(&p, graph, input.dim())?;
    execute(graph, &p, ops::owned(input)?, stats)
}

/// Prepares for the input's own shape and runs once, in f32.
pub fn run_graph(graph: &Graph, input: ArrayView5<f32>) -> Result<Array5<f32>> {
    run_generic(graph, input, &mut RunStats::default())
}

/// The same algorithm in f64: the reference the fp16 kernels are checked against.
pub fn run_graph_f64(graph: &Graph, input: ArrayView5<f64>) -> Result<Array5<f64>> {
    run_generic(graph, input, &mut RunStats::default())
}
