//! Host-side fusion facts of the CUDA backend, no GPU needed: who consumes a value, which
//! activation runs in its producer's epilogue, which residual Add a conv's epilogue or a norm's
//! affine pass takes,
//! which 1x1x1 head reads a norm's input normalised on load, which norm reruns the conv before
//! it, which value a channel concat takes
//! in place, which conv output stays fp32, and whether a resize is linear.

use crate::backend::cuda::abi::{Act, Shape};
use crate::backend::cuda::host::conv_kernel::ConvKernel;
use crate::model::graph::{Graph, Op, Resize, ResizeMode};

/// Where value `v` can be written in place: its only consumer is a channel concat (and `v` is
/// one of its inputs once, not the graph output). Returns (concat node, channel offset, total).
pub fn concat_slice(
    graph: &Graph,
    cons: &[Vec<usize>],
    shapes: &[Shape],
    v: usize,
) -> Option<(usize, usize, usize)> {
    if v == graph.output || cons[v].len() != 1 {
        return None;
    }
    let j = cons[v][0];
    let node = &graph.nodes[j];
    if !matches!(node.op, Op::Concat { axis: 1 })
        || node.inputs.iter().filter(|&&u| u == v).count() != 1
    {
        return None;
    }
    let pos = node.inputs.iter().position(|&u| u == v)?;
    let coff = node.inputs[..pos].iter().map(|&u| shapes[u][0]).sum();
    Some((j, coff, shapes[node.output][0]))
}

/// For each value, the node indices that consume it.
pub fn consumers(graph: &Graph) -> Vec<Vec<usize>> {
    let mut c = vec![Vec::new(); graph.values.len()];
    for (i, n) in graph.nodes.iter().enumerate() {
        for &v in &n.inputs {
            if let Some(list) = c.get_mut(v) {
                if !list.contains(&i) {
                    list.push(i);
                }
            }
        }
    }
    c
}

/// The one node reading node `i`'s output, unless that output is the graph's (an epilogue
/// that takes over the reader writes the reader's output instead).
fn sole_consumer(graph: &Graph, cons: &[Vec<usize>], i: usize) -> Option<usize> {
    let out = graph.nodes[i].output;
    (out != graph.output && cons[out].len() == 1).then(|| cons[out][0])
}

/// Whether node `i`'s output feeds exactly one activation node that can run in its epilogue;
/// returns that node's index.
pub fn fusable_activation(graph: &Graph, cons: &[Vec<usize>], i: usize) -> Option<usize> {
    let j = sole_consumer(graph, cons, i)?;
    let nj = &graph.nodes[j];
    if nj.inputs.len() != 1 || Act::of(&nj.op).is_none() {
        return None;
    }
    Some(j)
}

/// Whether the output of node `i` (a conv, or an InstanceNorm / GroupNorm) goes only to an Add
/// of the same shape whose other operand is `ready` (computed, and stored fp16 NDHWC as the
/// output will be), so the conv's epilogue (`ConvParams::res`) or the norm's affine pass adds it
/// and the Add never runs. `last` is node `i`, or the activation fused after it (a norm's): the
/// node whose output the Add reads. Returns (Add node, other operand). That output must be the
/// Add's operand once, not the graph output; the Add's output must not go to a concat slice
/// (the residual is indexed as a dense output) and neither operand may be a tensor-path value.
pub fn fusable_residual(
    graph: &Graph,
    cons: &[Vec<usize>],
    shapes: &[Shape],
    tensor: &[bool],
    (i, last): (usize, usize),
    ready: impl Fn(usize) -> bool,
) -> Option<(usize, usize)> {
    let out = graph.nodes[last].output;
    let op = &graph.nodes[i].op;
    let takes = matches!(
        op,
        Op::Conv(_) | Op::InstanceNorm { .. } | Op::GroupNorm { .. }
    );
    if tensor[i] || tensor[last] || !takes {
        return None;
    }
    let j = sole_consumer(graph, cons, last)?;
    let add = &graph.nodes[j];
    if tensor[j] || !matches!(add.op, Op::Add) || add.inputs.len() != 2 {
        return None;
    }
    let r = match add.inputs[..] {
        [a, b] if a == out && b != out => b,
        [a, b] if b == out && a != out => a,
        _ => return None,
    };
    let same = shapes[r] == shapes[out] && shapes[add.output] == shapes[out];
    let sliced = concat_slice(graph, cons, shapes, add.output).is_some();
    (same && !sliced && ready(r)).then_some((j, r))
}

/// Whether norm node `i`'s output (`out_v`: after its fused activation, if any) goes only to a
/// conv (one group, that one input) that could read the norm's input instead and normalise it
/// on load; returns that conv node. Whether its kernel does so is the caller's question: a
/// 1x1x1 head on `ConvKernel::Pointwise`, or a z-pair conv with an `_nl` twin.
pub fn fusable_norm_head(
    graph: &Graph,
    cons: &[Vec<usize>],
    tensor: &[bool],
    i: usize,
    out_v: usize,
) -> Option<usize> {
    if tensor[i]
        || !matches!(
            graph.nodes[i].op,
            Op::InstanceNorm { .. } | Op::GroupNorm { .. }
        )
        || out_v == graph.output
        || cons[out_v].len() != 1
    {
        return None;
    }
    let j = cons[out_v][0];
    let head = matches!(&graph.nodes[j].op, Op::Conv(c) if c.groups == 1);
    (head && !tensor[j] && graph.nodes[j].inputs == [out_v]).then_some(j)
}

/// Whether conv node `i`'s output goes only to an InstanceNorm / GroupNorm (as its one input,
/// not the graph output) that could run the conv itself, computing it once for the statistics
/// and once more normalising on store, rather than read its output (`Launch::recompute`);
/// returns that norm node. Whether the conv's kernel has those two forms is the caller's
/// question.
pub fn recomputable_norm(
    graph: &Graph,
    cons: &[Vec<usize>],
    tensor: &[bool],
    i: usize,
) -> Option<usize> {
    if tensor[i] || !matches!(graph.nodes[i].op, Op::Conv(_)) {
        return None;
    }
    let j = sole_consumer(graph, cons, i)?;
    let norm = &graph.nodes[j];
    let is_norm = matches!(norm.op, Op::InstanceNorm { .. } | Op::GroupNorm { .. });
    (is_norm && !tensor[j] && norm.inputs == [graph.nodes[i].output]).then_some(j)
}

/// Whether the resize mode is linear (trilinear in 3D).
pub fn is_linear(r: &Resize) -> bool {
    r.mode == ResizeMode::Linear
}

/// Whether node `i`'s output `out_v`, written by conv kernel `k`, is kept in fp32: a conv
/// (not on the tensor path) whose every reader is an InstanceNorm / GroupNorm. The norm
/// subtracts the channel mean and divides by the spread, so fp16 rounding relative to the raw
/// value becomes a larger error relative to the normalised one: on random-weight MONAI nets
/// it was the largest single term of the fp16 error (PERF_NOTES, session 9).
pub fn keeps_f32(
    graph: &Graph,
    cons: &[Vec<usize>],
    tensor: &[bool],
    i: usize,
    out_v: usize,
    k: Option<&ConvKernel>,
) -> bool {
    let is_conv = matches!(graph.nodes[i].op, Op::Conv(_) | Op::ConvTranspose(_));
    is_conv
        && !tensor[i]
        && out_v != graph.output
        && k.is_some_and(ConvKernel::writes_f32)
        && !cons[out_v].is_empty()
        && cons[out_v].iter().all(|&j| {
            !tensor[j]
                && matches!(
                    graph.nodes[j].op,
                    Op::InstanceNorm { .. } | Op::GroupNorm { .. }
                )
        })
}
