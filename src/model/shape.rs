//! Shape inference and static analyses of the IR: shapes per window, validation, parameter and
//! FLOP counts, receptive field, spatial divisor, output activation.
//!
//! The core functions take `(values, nodes, input)` rather than a [`Graph`] so that the importer can
//! run them on a graph that is still being built (to evaluate Shape-derived sizes).

use super::graph::{Graph, Node, Op, OutputActivation, Pool, Value, ValueId};
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

/// Output size of a sliding window op; None when the window does not fit.
fn window_out(
    inp: usize,
    k: usize,
    s: usize,
    d: usize,
    pb: usize,
    pe: usize,
    ceil: bool,
) -> Option<usize> {
    let keff = d.checked_mul(k.checked_sub(1)?)?.checked_add(1)?;
    let padded = inp.checked_add(pb)?.checked_add(pe)?;
    if padded < keff || s == 0 {
        return None;
    }
    let span = padded - keff;
    let mut out = if ceil {
        span.div_ceil(s) + 1
    } else {
        span / s + 1
    };
    // PyTorch/ONNX rule: the last window must start inside the input or the begin padding.
    if ceil && (out - 1) * s >= inp + pb {
        out -= 1;
    }
    Some(out)
}

fn pool_out(node: &Node, p: &Pool, s: [usize; 5]) -> Result<[usize; 5]> {
    let mut o = s;
    for a in 0..3 {
        o[a + 2] = window_out(
            s[a + 2],
            p.kernel[a],
            p.stride[a],
            p.dilation[a],
            p.pads[a],
            p.pads[a + 3],
            p.ceil_mode,
        )
        .ok_or_else(|| {
            gerr(
                node,
                format!(
                    "window size {} along axis {} is smaller than the kernel {}",
                    s[a + 2],
                    "DHW".as_bytes()[a] as char,
                    p.kernel[a]
                ),
            )
        })?;
    }
    Ok(o)
}

/// Shapes of every value for an input of `[n, C, spatial]`.
pub(crate) fn infer_shapes_raw(
    values: &[Value],
    nodes: &[Node],
    input: ValueId,
    n: usize,
    spatial: [usize; 3],
) -> Result<Vec<[usize; 5]>> {
    let mut shapes: Vec<Option<[usize; 5]>> = vec![None; values.len()];
    let inp = values
        .get(input)
        .ok_or_else(|| Error::Graph(format!("input value {input} out of range")))?;
    if n == 0 || spatial.contains(&0) {
        return Err(Error::Graph(format!(
            "window {n}x{spatial:?} has an empty dimension"
        )));
    }
    shapes[input] = Some([n, inp.channels, spatial[0], spatial[1], spatial[2]]);
    for node in nodes {
        let ins: Vec<[usize; 5]> = node
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
        let first = *ins.first().ok_or_else(|| gerr(node, "has no input"))?;
        let axis_name = |a: usize| "NCDHW".as_bytes()[a] as char;
        let mut out = first;
        match &node.op {
            Op::Conv(c) => {
                out[1] = c.weight.shape[0];
                for a in 0..3 {
                    out[a + 2] = window_out(first[a + 2], c.weight.shape[a + 2], c.stride[a], c.dilation[a], c.pads[a], c.pads[a + 3], false).ok_or_else(|| {
                        gerr(node, format!("its input is {} voxels along {}, smaller than the (dilated) kernel: the window is too small for this model", first[a + 2], axis_name(a + 2)))
                    })?;
                }
            }
            Op::ConvTranspose(c) => {
                out[1] = c.weight.shape[1] * c.groups;
                for a in 0..3 {
                    let full = c.stride[a]
                        .checked_mul(first[a + 2].saturating_sub(1))
                        .and_then(|v| v.checked_add(c.output_padding[a]))
                        .and_then(|v| {
                            v.checked_add(
                                c.dilation[a].checked_mul(c.weight.shape[a + 2].checked_sub(1)?)?,
                            )
                        })
                        .and_then(|v| v.checked_add(1))
                        .ok_or_else(|| {
                            gerr(
                                node,
                                format!("its output size along {} overflows", axis_name(a + 2)),
                            )
                        })?;
                    out[a + 2] = full
                        .checked_sub(c.pads[a] + c.pads[a + 3])
                        .filter(|&v| v > 0)
                        .ok_or_else(|| {
                            gerr(
                                node,
                                format!(
                                    "pads {:?} remove the whole output along {}",
                                    c.pads,
                                    axis_name(a + 2)
                                ),
                            )
                        })?;
                }
            }
            Op::MaxPool(p) | Op::AveragePool(p) => out = pool_out(node, p, first)?,
            Op::Resize(r) => {
                for a in 0..3 {
                    out[a + 2] = match r.sizes {
                        Some(s) => s[a],
                        None => (first[a + 2] as f32 * r.scales[a]).floor() as usize,
                    };
                    if out[a + 2] == 0 {
                        return Err(gerr(
                            node,
                            format!(
                                "resizing {} voxels by {} along {} gives an empty output",
                                first[a + 2],
                                r.scales[a],
                                axis_name(a + 2)
                            ),
                        ));
                    }
                }
            }
            Op::Concat { axis } => {
                let axis = *axis;
                out[axis] = 0;
                for (i, s) in ins.iter().enumerate() {
                    for a in 0..5 {
                        if a != axis && s[a] != first[a] {
                            let hint = if a >= 2 {
                                " (the window is probably not divisible by the model's spatial divisor: each down/up-sampling stage halves/doubles it)"
                            } else {
                                ""
                            };
                            return Err(gerr(node, format!("input {i} has shape {s:?} but input 0 has {first:?}: they differ along {}{hint}", axis_name(a))));
                        }
                    }
                    out[axis] = out[axis].checked_add(s[axis]).ok_or_else(|| {
                        gerr(
                            node,
                            format!("its output size along {} overflows", axis_name(axis)),
                        )
                    })?;
                }
            }
            Op::Add | Op::Mul | Op::Sub | Op::Div => {
                for s in &ins[1..] {
                    if *s != first {
                        return Err(gerr(node, format!("operands have shapes {first:?} and {s:?}; elementwise ops need equal shapes (the window may not be divisible by the model's spatial divisor)")));
                    }
                }
            }
            Op::AddConst(t) | Op::MulConst(t) => {
                if t.shape.len() != 5 || (0..5).any(|a| t.shape[a] != 1 && t.shape[a] != first[a]) {
                    return Err(gerr(
                        node,
                        format!(
                            "constant of shape {:?} does not broadcast to {first:?}",
                            t.shape
                        ),
                    ));
                }
            }
            Op::Softmax { axis } if *axis >= 5 => {
                return Err(gerr(node, format!("axis {axis} out of range")))
            }
            _ => {}
        }
        if out[1]
            != values
                .get(node.output)
                .map(|v| v.channels)
                .unwrap_or(usize::MAX)
        {
            return Err(gerr(
                node,
                format!(
                    "computes {} channels but its output value declares {}",
                    out[1],
                    values.get(node.output).map(|v| v.channels).unwrap_or(0)
                ),
            ));
        }
        if let Some(slot) = shapes.get_mut(node.output) {
            *slot = Some(out);
        }
    }
    // Values never computed (unused) get zeros; validate() reports real dangling references.
    Ok(shapes.into_iter().map(|s| s.unwrap_or([0; 5])).collect())
}

/// Per value: product of downsampling strides from the input (as a rational num/den), and the
/// divisor it requires so far. Upsampling divides the running factor but never lowers the requirement.
pub(crate) fn spatial_divisor_raw(values: &[Value], nodes: &[Node], input: ValueId) -> [usize; 3] {
    let mut fac: Vec<Option<[(u64, u64); 3]>> = vec![None; values.len()];
    let mut req: Vec<[u64; 3]> = vec![[1; 3]; values.len()];
    if input < values.len() {
        fac[input] = Some([(1, 1); 3]);
    }
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    let lcm = |a: u64, b: u64| {
        if a == 0 || b == 0 {
            a.max(b)
        } else {
            (a / gcd(a, b)).saturating_mul(b)
        }
    };
    let norm = |(n, d): (u64, u64)| {
        let g = gcd(n, d).max(1);
        (n / g, d / g)
    };
    for node in nodes {
        let Some(&i0) = node.inputs.first() else {
            continue;
        };
        let Some(mut f) = fac.get(i0).copied().flatten() else {
            continue;
        };
        let mut r = req[i0];
        for &i in &node.inputs[1..] {
            if let (Some(Some(fi)), Some(ri)) = (fac.get(i), req.get(i)) {
                for a in 0..3 {
                    r[a] = lcm(r[a], ri[a]);
                    if fi[a].0 * f[a].1 > f[a].0 * fi[a].1 {
                        f[a] = fi[a];
                    }
                }
            }
        }
        let (down, up): ([usize; 3], [f64; 3]) = match &node.op {
            Op::Conv(c) => (c.stride, [1.0; 3]),
            Op::MaxPool(p) | Op::AveragePool(p) => (p.stride, [1.0; 3]),
            Op::ConvTranspose(c) => ([1; 3], c.stride.map(|s| s as f64)),
            Op::Resize(rz) if rz.sizes.is_none() => {
                let mut d = [1; 3];
                let mut u = [1.0; 3];
                for a in 0..3 {
                    if rz.scales[a] < 1.0 && rz.scales[a] > 0.0 {
                        d[a] = (1.0 / rz.scales[a]).round() as usize;
                    } else {
                        u[a] = rz.scales[a] as f64;
                    }
                }
                (d, u)
            }
            _ => ([1; 3], [1.0; 3]),
        };
        for a in 0..3 {
            if down[a] > 1 {
                f[a] = norm((f[a].0.saturating_mul(down[a] as u64), f[a].1));
                // Downsampling by s needs the incoming size divisible by s: input multiple of num.
                r[a] = lcm(r[a], f[a].0 / gcd(f[a].0, f[a].1).max(1));
            }
            if up[a] > 1.0 && up[a].fract() == 0.0 {
                f[a] = norm((f[a].0, f[a].1.saturating_mul(up[a] as u64)));
            }
        }
        if node.output < fac.len() {
            fac[node.output] = Some(f);
            req[node.output] = r;
        }
    }
    let out = req.iter().fold([1u64; 3], |acc, r| {
        [lcm(acc[0], r[0]), lcm(acc[1], r[1]), lcm(acc[2], r[2])]
    });
    out.map(|v| v as usize)
}

impl Graph {
    /// NCDHW shape of every value for an `n`-window batch of `spatial` size. Errors name the node
    /// where the window stops fitting (too small, or not divisible by [`Graph::spatial_divisor`]).
    pub fn infer_shapes(&self, n: usize, spatial: [usize; 3]) -> Result<Vec<[usize; 5]>> {
        for a in 0..3 {
            if let Some(f) = self.fixed_input_spatial[a] {
                if f != spatial[a] {
                    return Err(Error::Graph(format!(
                        "the model's input declares a fixed size {f} along axis {} but the window has {}",
                        "DHW".as_bytes()[a] as char,
                        spatial[a]
                    )));
                }
            }
        }
        infer_shapes_raw(&self.values, &self.nodes, self.input, n, spatial)
    }

    /// What the last op applies: Softmax over channels, Sigmoid, or nothing.
    pub fn output_activation(&self) -> OutputActivation {
        let last = self.nodes.iter().rev().find(|n| n.output == self.output);
        let mut node = last;
        // Look through a trailing Identity (kept for an output name).
        while let Some(n) = node {
            if matches!(n.op, Op::Identity) {
                let src = n.inputs.first().copied();
                node = self.nodes.iter().rev().find(|m| Some(m.output) == src);
            } else {
                break;
            }
        }
        match node.map(|n| &n.op) {
            Some(Op::Softmax { axis: 1 }) => OutputActivation::Softmax,
            Some(Op::Sigmoid) => OutputActivation::Sigmoid,
            _ => OutputActivation::None,
        }
    }

    /// Number of f32 parameters held by the ops.
    pub fn param_count(&self) -> usize {
        self.nodes
            .iter()
            .map(|n| match &n.op {
                Op::Conv(c) => c.weight.len() + c.bias.as_ref().map_or(0, |b| b.len()),
                Op::ConvTranspose(c) => c.weight.len() + c.bias.as_ref().map_or(0, |b| b.len()),
                Op::InstanceNorm { scale, bias, .. } | Op::GroupNorm { scale, bias, .. } => {
                    scale.len() + bias.len()
                }
                Op::ChannelAffine { scale, shift } => scale.len() + shift.len(),
                Op::PRelu { slope } => slope.len(),
                Op::AddConst(t) | Op::MulConst(t) => t.len(),
                _ => 0,
            })
            .sum()
    }

    /// Floating point operations for one batch: 2·MACs for (transposed) convolutions, and rough
    /// per-element costs for the rest (norm 8, pooling kernel volume, linear resize 16, others 1-4).
    pub fn flops(&self, n: usize, spatial: [usize; 3]) -> Result<u64> {
        let shapes = self.infer_shapes(n, spatial)?;
        let numel = |s: &[usize; 5]| s.iter().map(|&d| d as u64).product::<u64>();
        let mut total: u64 = 0;
        for node in &self.nodes {
            let out = &shapes[node.output];
            let inp = &shapes[node.inputs[0]];
            let f = match &node.op {
                Op::Conv(c) => {
                    2 * numel(out)
                        * c.weight.shape[1..]
                            .iter()
                            .map(|&d| d as u64)
                            .product::<u64>()
                }
                Op::ConvTranspose(c) => {
                    2 * numel(inp)
                        * c.weight.shape[1..]
                            .iter()
                            .map(|&d| d as u64)
                            .product::<u64>()
                }
                Op::InstanceNorm { .. } | Op::GroupNorm { .. } => 8 * numel(out),
                Op::Softmax { .. } => 4 * numel(out),
                Op::Elu { .. } | Op::Sigmoid | Op::Tanh => 4 * numel(out),
                Op::MaxPool(p) | Op::AveragePool(p) => {
                    numel(out) * p.kernel.iter().map(|&k| k as u64).product::<u64>()
                }
                Op::Resize(r) => {
                    numel(out)
                        * if r.mode == super::graph::ResizeMode::Linear {
                            16
                        } else {
                            1
                        }
                }
                Op::Concat { .. } | Op::Identity => 0,
                Op::ChannelAffine { .. } => 2 * numel(out),
                _ => numel(out),
            };
            total = total.saturating_add(f);
        }
        Ok(total)
    }

    /// Receptive field (input voxels along D,H,W) of one output voxel, along the path that grows it
    /// most. Each value carries (rf, jump): jump is the input-voxel distance between neighbouring
    /// voxels of that value. A conv/pool of dilated extent k_eff adds (k_eff-1)·jump and multiplies
    /// jump by its stride; a transposed conv of stride s reads ceil(k_eff/s) inputs per output, adds
    /// (that-1)·jump and divides jump by s; linear resize adds one jump (2 taps), nearest none; merges
    /// (Add, Concat...) keep the input with the largest rf. Instance/group norm statistics, which span
    /// the whole window, are ignored.
    pub fn receptive_field(&self) -> [usize; 3] {
        let mut st: Vec<Option<([f64; 3], [f64; 3])>> = vec![None; self.values.len()];
        if self.input < st.len() {
            st[self.input] = Some(([1.0; 3], [1.0; 3]));
        }
        for node in &self.nodes {
            let mut best: Option<([f64; 3], [f64; 3])> = None;
            for &i in &node.inputs {
                if let Some(Some(s)) = st.get(i) {
                    best = Some(match best {
                        None => *s,
                        Some(b) => {
                            let mut m = b;
                            for a in 0..3 {
                                if s.0[a] > b.0[a] {
                                    m.0[a] = s.0[a];
                                    m.1[a] = s.1[a];
                                }
                            }
                            m
                        }
                    });
                }
            }
            let Some((mut rf, mut jump)) = best else {
                continue;
            };
            for a in 0..3 {
                match &node.op {
                    Op::Conv(c) => {
                        let keff = (c.dilation[a] * (c.weight.shape[a + 2] - 1) + 1) as f64;
                        rf[a] += (keff - 1.0) * jump[a];
                        jump[a] *= c.stride[a] as f64;
                    }
                    Op::MaxPool(p) | Op::AveragePool(p) => {
                        let keff = (p.dilation[a] * (p.kernel[a] - 1) + 1) as f64;
                        rf[a] += (keff - 1.0) * jump[a];
                        jump[a] *= p.stride[a] as f64;
                    }
                    Op::ConvTranspose(c) => {
                        let keff = c.dilation[a] * (c.weight.shape[a + 2] - 1) + 1;
                        let taps = keff.div_ceil(c.stride[a].max(1)) as f64;
                        rf[a] += (taps - 1.0) * jump[a];
                        jump[a] /= c.stride[a].max(1) as f64;
                    }
                    Op::Resize(r) => {
                        if r.mode == super::graph::ResizeMode::Linear {
                            rf[a] += jump[a];
                        }
                        if r.scales[a] > 0.0 {
                            jump[a] /= r.scales[a] as f64;
                        }
                    }
                    _ => {}
                }
            }
            if node.output < st.len() {
                st[node.output] = Some((rf, jump));
            }
        }
        match st.get(self.output).copied().flatten() {
            Some((rf, _)) => rf.map(|v| (v - 1e-9).ceil().max(1.0) as usize),
            None => [1; 3],
        }
    }

    /// Smallest per-axis d such that windows that are multiples of d keep every down/up-sampling
    /// stage integral (and skip connections consistent): the lcm of the cumulative strides of all
    /// downsampling ops, following the deepest path.
    pub fn spatial_divisor(&self) -> [usize; 3] {
        spatial_divisor_raw(&self.values, &self.nodes, self.input)
    }

    /// Structural checks: ids in range, topological order, single producer per value, and the
    /// channel counts implied by weights.
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
            defined[node.output] = true;
            let cin = self.values[node.inputs[0]].channels;
            let cout = self.values[node.output].channels;
            let want_inputs = match &node.op {
                Op::Add | Op::Mul | Op::Sub | Op::Div => 2,
                Op::Concat { .. } => node.inputs.len(),
                _ => 1,
            };
            if node.inputs.len() != want_inputs {
                return Err(gerr(
                    node,
                    format!("has {} inputs, expected {want_inputs}", node.inputs.len()),
                ));
            }
            let per_channel = |t: &super::graph::Tensor, what: &str, c: usize| -> Result<()> {
                if t.len() != c {
                    return Err(gerr(
                        node,
                        format!("{what} has {} elements for {c} channels", t.len()),
                    ));
                }
                Ok(())
            };
            let expect_cout = match &node.op {
                Op::Conv(c) => {
                    let w = &c.weight.shape;
                    if w.len() != 5
                        || c.groups == 0
                        || !cin.is_multiple_of(c.groups)
                        || w[1] * c.groups != cin
                        || w[0] % c.groups != 0
                    {
                        return Err(gerr(
                            node,
                            format!(
                                "weight {w:?} with groups {} does not fit {cin} input channels",
                                c.groups
                            ),
                        ));
                    }
                    if c.stride.contains(&0) || c.dilation.contains(&0) {
                        return Err(gerr(node, "zero stride or dilation"));
                    }
                    if let Some(b) = &c.bias {
                        per_channel(b, "bias", w[0])?;
                    }
                    w[0]
                }
                Op::ConvTranspose(c) => {
                    let w = &c.weight.shape;
                    if w.len() != 5 || c.groups == 0 || w[0] != cin || !cin.is_multiple_of(c.groups)
                    {
                        return Err(gerr(
                            node,
                            format!(
                                "weight {w:?} with groups {} does not fit {cin} input channels",
                                c.groups
                            ),
                        ));
                    }
                    if c.stride.contains(&0) || c.dilation.contains(&0) {
                        return Err(gerr(node, "zero stride or dilation"));
                    }
                    if let Some(b) = &c.bias {
                        per_channel(b, "bias", w[1] * c.groups)?;
                    }
                    w[1] * c.groups
                }
                Op::InstanceNorm { scale, bias, .. } => {
                    per_channel(scale, "scale", cin)?;
                    per_channel(bias, "bias", cin)?;
                    cin
                }
                Op::GroupNorm {
                    groups,
                    scale,
                    bias,
                    ..
                } => {
                    if *groups == 0 || !cin.is_multiple_of(*groups) {
                        return Err(gerr(
                            node,
                            format!("{groups} groups do not divide {cin} channels"),
                        ));
                    }
                    per_channel(scale, "scale", cin)?;
                    per_channel(bias, "bias", cin)?;
                    cin
                }
                Op::ChannelAffine { scale, shift } => {
                    per_channel(scale, "scale", cin)?;
                    per_channel(shift, "shift", cin)?;
                    cin
                }
                Op::PRelu { slope } => {
                    if slope.len() != 1 && slope.len() != cin {
                        return Err(gerr(
                            node,
                            format!("slope has {} elements for {cin} channels", slope.len()),
                        ));
                    }
                    cin
                }
                Op::AddConst(t) | Op::MulConst(t) => {
                    if t.shape.len() != 5
                        || (t.shape[1] != 1 && t.shape[1] != cin)
                        || t.shape[0] != 1
                    {
                        return Err(gerr(
                            node,
                            format!(
                                "constant of shape {:?} does not broadcast over {cin} channels",
                                t.shape
                            ),
                        ));
                    }
                    cin
                }
                Op::Add | Op::Mul | Op::Sub | Op::Div => {
                    let c1 = self.values[node.inputs[1]].channels;
                    if c1 != cin {
                        return Err(gerr(node, format!("operands have {cin} and {c1} channels")));
                    }
                    cin
                }
                Op::Concat { axis } => {
                    if *axis == 1 {
                        node.inputs.iter().map(|&i| self.values[i].channels).sum()
                    } else {
                        cin
                    }
                }
                Op::MaxPool(p) | Op::AveragePool(p) => {
                    if p.stride.contains(&0) || p.kernel.contains(&0) || p.dilation.contains(&0) {
                        return Err(gerr(node, "zero kernel, stride or dilation"));
                    }
                    cin
                }
                Op::Softmax { axis } => {
                    if *axis >= 5 {
                        return Err(gerr(node, format!("axis {axis} out of range")));
                    }
                    cin
                }
                _ => cin,
            };
            if expect_cout != cout {
                return Err(gerr(
                    node,
                    format!("computes {expect_cout} channels but its output declares {cout}"),
                ));
            }
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
}
