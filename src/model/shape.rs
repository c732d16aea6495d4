//! Graph-level shape inference and validation: every node's shape and checks come from its op
//! ([`Op::output_shape`](super::ops::Op::output_shape), [`Op::check`](super::ops::Op::check)); this file walks the graph and names the node.
//!
//! The core functions take `(values, nodes, input)` rather than a [`Graph`] so that the importer can
//! run them on a graph that is still being built (to evaluate Shape-derived sizes).

use super::graph::{Graph, Node, Shape, Value, ValueId};
use super::ops::window::axis_name;
use super::ops::Dims;
use crate::{Error, Result};

/// Most output channels a model may have: labels are stored as u16 (0..=65535), and one more
/// channel would saturate or wrap the label of the last class.
pub const MAX_OUTPUT_CHANNELS: usize = u16::MAX as usize;

fn gerr(node: &Node, msg: impl std::fmt::Display) -> Error {
    Error::Graph(format!(
        "node \"{}\" ({}): {msg}",
        node.name,
        node.op.name()
    ))
}

/// The op's output channels must be what its output value declares (tensor ops' outputs
/// declare dim 1 of the shape the importer saw, checked when the shape is inferred).
fn check_declared(node: &Node, values: &[Value], computed: usize) -> Result<()> {
    if node.op.is_tensor_op() {
        return Ok(());
    }
    let declared = values.get(node.output).map(|v| v.channels);
    if declared != Some(computed) {
        return Err(gerr(
            node,
            format!(
                "computes {computed} channels but its output value declares {}",
                declared.unwrap_or(0)
            ),
        ));
    }
    Ok(())
}

/// Shapes of every value for an input of `[n, C, spatial]`.
pub(crate) fn infer_shapes_raw(
    values: &[Value],
    nodes: &[Node],
    input: ValueId,
    n: usize,
    spatial: [usize; 3],
) -> Result<Vec<Dims>> {
    let mut shapes: Vec<Option<Dims>> = vec![None; values.len()];
    let inp = values
        .get(input)
        .ok_or_else(|| Error::Graph(format!("input value {input} out of range")))?;
    if n == 0 || spatial.contains(&0) {
        return Err(Error::Graph(format!(
            "window {n}x{spatial:?} has an empty dimension"
        )));
    }
    shapes[input] = Some(Dims::from([
        n,
        inp.channels,
        spatial[0],
        spatial[1],
        spatial[2],
    ]));
    for node in nodes {
        let ins: Vec<Dims> = node
            .inputs
            .iter()
            .map(|&i| {
                shapes.get(i).copied().flatten().ok_or_else(|| {
                    gerr(
                        node,
                        format!("input value {i} is not computed before this node"),
                    )
                })
            })
            .collect::<Result<_>>()?;
        if ins.is_empty() {
            return Err(gerr(node, "has no input"));
        }
        let out = node.op.output_dims(&ins).map_err(|m| gerr(node, m))?;
        if out.rank() == 5 {
            check_declared(node, values, out[1])?;
        }
        if let Some(slot) = shapes.get_mut(node.output) {
            *slot = Some(out);
        }
    }
    // Values never computed (unused) get zeros; validate() reports real dangling references.
    Ok(shapes
        .into_iter()
        .map(|s| s.unwrap_or(Dims::from([0; 5])))
        .collect())
}

impl Graph {
    /// NCDHW shape of every value for an `n`-window batch of `spatial` size. Errors name the node
    /// where the window stops fitting (too small, or not divisible by [`Graph::spatial_divisor`]).
    pub fn infer_shapes(&self, n: usize, spatial: [usize; 3]) -> Result<Vec<Dims>> {
        for (a, (fixed, &s)) in self.fixed_input_spatial.iter().zip(&spatial).enumerate() {
            if let Some(f) = *fixed {
                if f != s {
                    return Err(Error::Graph(format!(
                        "the model's input declares a fixed size {f} along axis {} but the window has {s}",
                        axis_name(a)
                    )));
                }
            }
        }
        let shapes = infer_shapes_raw(&self.values, &self.nodes, self.input, n, spatial)?;
        match shapes.get(self.output).and_then(|d| d.ncdhw()) {
            Some(_) => Ok(shapes),
            None => Err(Error::Graph(format!(
                "the model's output has shape {:?}; voxtile needs an NCDHW output",
                shapes.get(self.output)
            ))),
        }
    }

    /// [`Graph::infer_shapes`] for backends that hold NCDHW activations only: an error names
    /// the first value of another rank.
    pub fn infer_ncdhw(&self, n: usize, spatial: [usize; 3], who: &str) -> Result<Vec<Shape>> {
        let dims = self.infer_shapes(n, spatial)?;
        dims.iter()
            .enumerate()
            .map(|(v, d)| {
                d.ncdhw().ok_or_else(|| {
                    Error::Graph(format!(
                        "{who} runs NCDHW activations only, but value \"{}\" has shape {d:?}",
                        self.values[v].name
                    ))
                })
            })
            .collect()
    }

    /// Whether any op works on activations of other ranks (transformer blocks).
    pub fn has_tensor_ops(&self) -> bool {
        self.nodes.iter().any(|n| n.op.is_tensor_op())
    }

    /// The largest batch the graph runs: 1 when batch 2 does not infer but batch 1 does (an
    /// export whose Reshape targets fix the batch and that the import could not free of it,
    /// `passes::batch`), else unbounded.
    pub fn max_batch(&self, spatial: [usize; 3]) -> usize {
        if self.has_tensor_ops()
            && self.infer_shapes(2, spatial).is_err()
            && self.infer_shapes(1, spatial).is_ok()
        {
            1
        } else {
            usize::MAX
        }
    }

    /// The windows the import's passes check a graph on: its fixed input size, else the first
    /// multiples of its spatial divisor.
    pub(crate) fn probe_windows(&self) -> Vec<[usize; 3]> {
        match self.fixed_input_spatial {
            [Some(a), Some(b), Some(c)] => vec![[a, b, c]],
            _ => {
                let d = self.spatial_divisor();
                (1..4).filter_map(|m| probe_window(d, m)).collect()
            }
        }
    }

    /// Structural checks (ids in range, topological order, single producer per value) and every
    /// op's own validation ([`super::ops::Op::check_any_batch`]: weights, groups, biases, norm parameters,
    /// channel counts), so that backends need no re-checks.
    pub fn validate(&self) -> Result<()> {
        let nv = self.values.len();
        let bad = |m: String| Error::Graph(m);
        if self.input >= nv || self.output >= nv {
            return Err(bad(format!(
                "graph input {} / output {} out of range ({nv} values)",
                self.input, self.output
            )));
        }
        let mut defined = vec![false; nv];
        defined[self.input] = true;
        for node in &self.nodes {
            self.check_wiring(node, &defined)?;
            defined[node.output] = true;
            let chans: Vec<usize> = node
                .inputs
                .iter()
                .map(|&i| self.values[i].channels)
                .collect();
            let cout = node.op.check_any_batch(&chans).map_err(|m| gerr(node, m))?;
            check_declared(node, &self.values, cout)?;
        }
        if !defined[self.output] {
            return Err(bad(format!(
                "graph output \"{}\" is never computed",
                self.values[self.output].name
            )));
        }
        let classes = self.values[self.output].channels;
        if classes > MAX_OUTPUT_CHANNELS {
            return Err(bad(format!(
                "the output has {classes} channels; voxtile writes labels as 16-bit integers, so \
                 a model may have at most {MAX_OUTPUT_CHANNELS} output channels"
            )));
        }
        Ok(())
    }

    /// A node reads only values computed before it and writes one value nobody else writes.
    fn check_wiring(&self, node: &Node, defined: &[bool]) -> Result<()> {
        let nv = self.values.len();
        if node.inputs.is_empty() {
            return Err(gerr(node, "has no input"));
        }
        for &i in &node.inputs {
            if i >= nv {
                return Err(gerr(
                    node,
                    format!("input value {i} out of range ({nv} values)"),
                ));
            }
            if !defined[i] {
                return Err(gerr(node, format!("reads value \"{}\" before it is computed (not in topological order, or a cycle)", self.values[i].name)));
            }
        }
        if node.output >= nv {
            return Err(gerr(
                node,
                format!("output value {} out of range", node.output),
            ));
        }
        if defined[node.output] {
            return Err(gerr(
                node,
                format!(
                    "value \"{}\" is computed twice",
                    self.values[node.output].name
                ),
            ));
        }
        Ok(())
    }
}

/// The `m`-th probe window for spatial divisor `d` (axes differ so that mixed-up axes show);
/// None once it no longer fits in memory arithmetic (a divisor grown absurdly large).
pub(crate) fn probe_window(d: [usize; 3], m: usize) -> Option<[usize; 3]> {
    const MAX: usize = 1 << 24;
    let w = [
        d[0].checked_mul(m)?,
        d[1].checked_mul(m + 1)?,
        d[2].checked_mul(m + 3)?,
    ];
    w.iter().all(|&v| v <= MAX).then_some(w)
}
