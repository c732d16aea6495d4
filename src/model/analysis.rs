//! Static analyses of the IR: parameter and FLOP counts, receptive field, spatial divisor and
//! output activation. Per-op facts come from [`super::ops`].

use super::graph::{Graph, Node, Op, OutputActivation, Pointwise, Value, ValueId};
use super::ops::window::dilated_extent;
use super::ops::ResizeMode;
use crate::Result;

/// One op's effect on (receptive field, jump) along spatial axis `a`; see
/// [`Graph::receptive_field`].
fn rf_step(op: &Op, a: usize, rf: f64, jump: f64) -> (f64, f64) {
    let window = match op {
        Op::Conv(c) => Some(c.window()),
        Op::MaxPool(p) | Op::AveragePool(p) => Some(p.window()),
        _ => None,
    };
    if let Some(w) = window {
        let keff = dilated_extent(w.kernel[a], w.dilation[a]).unwrap_or(usize::MAX) as f64;
        return (rf + (keff - 1.0) * jump, jump * w.stride[a] as f64);
    }
    match op {
        Op::ConvTranspose(c) => {
            let k = c.weight.shape.get(a + 2).copied().unwrap_or(1);
            let keff = dilated_extent(k, c.dilation[a]).unwrap_or(usize::MAX);
            let s = c.stride[a].max(1);
            let taps = keff.div_ceil(s) as f64;
            (rf + (taps - 1.0) * jump, jump / s as f64)
        }
        Op::Resize(r) => {
            let rf = if r.mode == ResizeMode::Linear {
                rf + jump
            } else {
                rf
            };
            let jump = if r.scales[a] > 0.0 {
                jump / r.scales[a] as f64
            } else {
                jump
            };
            (rf, jump)
        }
        _ => (rf, jump),
    }
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
    /// What the last op applies: Softmax over channels, Sigmoid, or nothing.
    pub fn output_activation(&self) -> OutputActivation {
        let last = self.nodes.iter().rev().find(|n| n.output == self.output);
        let mut node = last;
        // Look through a trailing Identity (kept for an output name) and the rounding of a
        // half output.
        while let Some(n) = node {
            if matches!(
                n.op,
                Op::Identity | Op::Pointwise(Pointwise::RoundF16 | Pointwise::RoundBf16)
            ) {
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
        self.nodes.iter().map(|n| n.op.param_len()).sum()
    }

    /// Floating point operations for one batch (see [`Op::flops`]).
    pub fn flops(&self, n: usize, spatial: [usize; 3]) -> Result<u64> {
        let shapes = self.infer_shapes(n, spatial)?;
        Ok(self.nodes.iter().fold(0u64, |t, node| {
            let f = node.op.flops(&shapes[node.inputs[0]], &shapes[node.output]);
            t.saturating_add(f)
        }))
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
                (rf[a], jump[a]) = rf_step(&node.op, a, rf[a], jump[a]);
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
}
