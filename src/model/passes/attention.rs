//! Attention fusion: the exporters write a transformer's attention as
//! `MatMul(q, kᵀ)` → optional scalar `Mul` (also on q first: Swin's `q * scale`) → optional
//! bias `Add`s (relative-position bias; Swin's shifted-window mask, added through a `Reshape`
//! that splits the leading dims `[B_, h, T, S] → [B, nW, h, T, S]` and one that merges them
//! back) → `Softmax` over the last axis → `MatMul(·, v)`. When every intermediate is read once
//! (and is no graph output) the chain becomes one [`Op::Attention`], so no backend stores the
//! `[..., T, S]` scores. kᵀ coming from a `Transpose` is undone by composing its permutation
//! (the Transpose disappears when it only swapped the last two axes); any other kᵀ gets a new
//! Transpose of its last two axes.
//!
//! The constants are combined in f32 (scales multiplied, bias terms scaled and summed in the
//! scores' layout), so the fused graph may differ from the unfused one by an f32 rounding of
//! the bias. Layout facts (ranks, what a Reshape moves) come from shape inference on a few
//! probe windows; a chain is fused only when they all agree on the same folded constants.

use super::uses::Uses;
use crate::model::ew_fold::{broadcast_strides, par_rows};
use crate::model::graph::*;
use crate::model::ops::{transpose_dims, Attention, Dims};
use crate::model::shape::infer_shapes_raw;

/// Most elements one folded bias term may have (a chain whose term is bigger stays unfused).
pub const MAX_BIAS_ELEMS: usize = 1 << 26;

/// The graph and its use-def facts, for matching a chain.
struct Walk<'g> {
    g: &'g Graph,
    u: Uses,
}

impl Walk<'_> {
    /// The index of the node producing `v` when `v` is read once (and is not the output).
    fn only(&self, v: ValueId) -> Option<usize> {
        self.u.only(v)
    }
}

/// The scalar of a `MulConst` by one value.
fn scalar(op: &Op) -> Option<f32> {
    match op {
        Op::MulConst(t) if t.data.len() == 1 => Some(t.data[0]),
        _ => None,
    }
}

/// Where the fused op reads k `[..., S, d]` from.
#[derive(Clone, Debug)]
enum KSource {
    /// A value already laid out as k.
    Direct(ValueId),
    /// A new Transpose of a value.
    Transpose(ValueId, Vec<usize>),
}

/// One matched chain, before its shapes are checked.
struct Chain {
    /// The final MatMul (its output becomes the Attention's).
    mm2: usize,
    /// The first MatMul, whose output is the raw scores.
    mm1: usize,
    /// The Softmax node.
    softmax: usize,
    /// Scale / bias / reshape nodes from the Softmax's input back to the scores.
    steps: Vec<usize>,
    /// Every node the fused op replaces (all above, plus q's scale and k's Transpose if read once).
    absorbed: Vec<usize>,
    q: ValueId,
    q_scale: f32,
    /// kᵀ's Transpose (input, perm) when absorbed, else kᵀ itself.
    kt: Result<(ValueId, Vec<usize>), ValueId>,
    v: ValueId,
}

/// The chain ending at node `k2` when it has the attention pattern.
fn match_chain(u: &Walk, k2: usize) -> Option<Chain> {
    let nodes = &u.g.nodes;
    let n2 = &nodes[k2];
    let (Op::MatMul, &[p, v]) = (&n2.op, &n2.inputs[..]) else {
        return None;
    };
    let softmax = u.only(p)?;
    if !matches!(nodes[softmax].op, Op::Softmax { .. }) {
        return None;
    }
    let mut x = *nodes[softmax].inputs.first()?;
    let mut steps = vec![];
    let mm1 = loop {
        let k = u.only(x)?;
        let n = &nodes[k];
        match &n.op {
            Op::MatMul => break k,
            Op::AddConst(_) | Op::Reshape { .. } => {}
            op if scalar(op).is_some() => {}
            _ => return None,
        }
        steps.push(k);
        x = *n.inputs.first()?;
    };
    let [q0, kt0] = nodes[mm1].inputs[..] else {
        return None;
    };
    let mut absorbed: Vec<usize> = vec![mm1, softmax];
    absorbed.extend(&steps);
    let (q, q_scale) = match u.only(q0).filter(|&k| k != mm1) {
        Some(k) if scalar(&nodes[k].op).is_some() => {
            absorbed.push(k);
            (nodes[k].inputs[0], scalar(&nodes[k].op)?)
        }
        _ => (q0, 1.0),
    };
    let kt = match u.only(kt0).map(|k| (k, &nodes[k])) {
        Some((k, n)) if matches!(n.op, Op::Transpose { .. }) => {
            let Op::Transpose { perm } = &n.op else {
                return None;
            };
            absorbed.push(k);
            Ok((n.inputs[0], perm.clone()))
        }
        _ => Err(kt0),
    };
    Some(Chain {
        mm2: k2,
        mm1,
        softmax,
        steps,
        absorbed,
        q,
        q_scale,
        kt,
        v,
    })
}

/// `perm` with its last two entries swapped.
fn swap_last(mut perm: Vec<usize>) -> Vec<usize> {
    let r = perm.len();
    if r >= 2 {
        perm.swap(r - 2, r - 1);
    }
    perm
}

impl Chain {
    /// Where k comes from, given the rank of kᵀ.
    fn k_source(&self, rank: usize) -> KSource {
        match &self.kt {
            Ok((x, perm)) => {
                let p = swap_last(perm.clone());
                if p.iter().enumerate().all(|(i, &a)| i == a) {
                    KSource::Direct(*x)
                } else {
                    KSource::Transpose(*x, p)
                }
            }
            Err(kt) => KSource::Transpose(*kt, swap_last((0..rank).collect())),
        }
    }

    /// The fused op and k's source on one probe's shapes, or None when the chain does not
    /// qualify there (axis, layouts, ranks, bias size).
    fn fuse_on(&self, g: &Graph, s: &[Dims]) -> Option<(Attention, KSource)> {
        let nodes = &g.nodes;
        let scores = *s.get(nodes[self.mm1].output)?;
        let r = scores.rank();
        let sm_in = *s.get(nodes[self.softmax].inputs[0])?;
        if r < 3 || sm_in != scores || nodes[self.softmax].op != (Op::Softmax { axis: r - 1 }) {
            return None;
        }
        // Walking back from the softmax: f(z) = a·z + (Σ terms), z the value at the current node.
        let mut a = 1.0f32;
        let mut terms: Vec<(f32, &Tensor, Dims)> = vec![];
        for &k in &self.steps {
            let n = &nodes[k];
            let out = *s.get(n.output)?;
            match &n.op {
                Op::AddConst(t) => terms.push((a, t, out)),
                Op::Reshape { .. } => {
                    let inp = *s.get(n.inputs[0])?;
                    let (ri, ro) = (inp.rank(), out.rank());
                    if ri < 2 || ro < 2 || inp.as_slice()[ri - 2..] != out.as_slice()[ro - 2..] {
                        return None;
                    }
                }
                op => a *= scalar(op)?,
            }
        }
        let (bias, mask) = fold_bias(&terms, &scores)?;
        let att = Attention {
            scale: a * self.q_scale,
            bias,
            mask,
        };
        let ks = self.k_source(r);
        let kd = match &ks {
            KSource::Direct(x) => *s.get(*x)?,
            KSource::Transpose(x, p) => transpose_dims(s.get(*x)?, p).ok()?,
        };
        let (qd, vd) = (*s.get(self.q)?, *s.get(self.v)?);
        let out = att.output_dims(&qd, &kd, &vd).ok()?;
        (out == *s.get(nodes[self.mm2].output)?).then_some((att, ks))
    }
}

/// Row-major strides of `d`.
fn strides(d: &[usize]) -> Vec<usize> {
    let mut st = vec![1usize; d.len()];
    for a in (0..d.len().saturating_sub(1)).rev() {
        st[a] = st[a + 1] * d[a + 1];
    }
    st
}

/// Bias `b` of a value laid out as `c` re-expressed in the scores' layout `f`: both have the
/// same trailing `[T, S]` and leading dims of one product, the same flat leading index naming
/// the same scores row. Only the leading axes of `f` that `b` can vary along are kept (axis `a`
/// of `f` is independent of axis `j` of `c` when their place values nest without overlap).
fn relayout(b: &Tensor, c: &Dims, f: &Dims) -> Option<Tensor> {
    if c == f {
        return Some(b.clone());
    }
    let (rc, rf) = (c.rank(), f.rank());
    let (cl, fl) = (&c.as_slice()[..rc - 2], &f.as_slice()[..rf - 2]);
    if cl.iter().product::<usize>() != fl.iter().product::<usize>() || b.shape.len() != rc {
        return None;
    }
    let (cs, fs) = (strides(cl), strides(fl));
    let plane: usize = b.shape[rc - 2..].iter().product();
    let bs: Vec<usize> = strides(&b.shape[..rc - 2])
        .iter()
        .map(|x| x * plane)
        .collect();
    let varying: Vec<usize> = (0..rc - 2).filter(|&j| b.shape[j] != 1).collect();
    let indep = |a: usize, j: usize| {
        cs[j].is_multiple_of(fs[a] * fl[a]) || fs[a].is_multiple_of(cs[j] * cl[j])
    };
    let keep: Vec<usize> = (0..rf - 2)
        .map(|a| {
            let need = fl[a] != 1 && varying.iter().any(|&j| !indep(a, j));
            if need {
                fl[a]
            } else {
                1
            }
        })
        .collect();
    let rows: usize = keep.iter().product();
    if rows.checked_mul(plane)? > MAX_BIAS_ELEMS {
        return None;
    }
    let ks = strides(&keep);
    let mut data = Vec::with_capacity(rows * plane);
    for i in 0..rows {
        let flat: usize = (0..keep.len()).map(|a| (i / ks[a]) % keep[a] * fs[a]).sum();
        let off: usize = varying
            .iter()
            .map(|&j| (flat / cs[j]) % cl[j] * bs[j])
            .sum();
        data.extend_from_slice(b.data.get(off..off + plane)?);
    }
    let mut shape = keep;
    shape.extend(&b.shape[rc - 2..]);
    Some(Tensor::new(shape, data))
}

/// `Σ coef · term` of terms already in the scores' layout (f32), broadcast to their smallest
/// common shape; `None` when that is over [`MAX_BIAS_ELEMS`].
fn sum_terms(mapped: &[(f32, Tensor)], r: usize) -> Option<Tensor> {
    let shape: Vec<usize> = (0..r)
        .map(|a| mapped.iter().map(|(_, t)| t.shape[a]).max().unwrap_or(1))
        .collect();
    let total: usize = shape.iter().product();
    if total > MAX_BIAS_ELEMS {
        return None;
    }
    let mut data = vec![0f32; total];
    for (c, t) in mapped {
        let ts = [broadcast_strides(&t.shape, &shape)];
        par_rows(&mut data, &shape, &ts, |row, at, step| {
            for (j, y) in row.iter_mut().enumerate() {
                *y += c * t.data[at[0] + j * step[0]];
            }
        });
    }
    Some(Tensor::new(shape, data))
}

/// The fused op's `(bias, mask)` from the additive terms (`terms` listed from the softmax
/// back): each term re-expressed in the scores' layout `f`, terms of one shape summed. Two
/// shapes stay two terms, in graph order (Swin: the per-head relative-position bias, then the
/// per-window mask), so that their `windows · heads · T · S` sum is never materialised; more
/// shapes are summed into one bias. `None` when a term cannot be expressed or a result is too
/// big ([`MAX_BIAS_ELEMS`]).
type Terms = (Option<Tensor>, Option<Tensor>);
fn fold_bias(terms: &[(f32, &Tensor, Dims)], f: &Dims) -> Option<Terms> {
    let mut groups: Vec<Vec<(f32, Tensor)>> = vec![];
    for (c, t, d) in terms.iter().rev() {
        let m = relayout(t, d, f)?;
        match groups.iter_mut().find(|g| g[0].1.shape == m.shape) {
            Some(g) => g.push((*c, m)),
            None => groups.push(vec![(*c, m)]),
        }
    }
    let r = f.rank();
    match &groups[..] {
        [] => Some((None, None)),
        [a] => Some((Some(sum_terms(a, r)?), None)),
        [a, b] => Some((Some(sum_terms(a, r)?), Some(sum_terms(b, r)?))),
        _ => Some((Some(sum_terms(&groups.concat(), r)?), None)),
    }
}

/// Shape tables of `g` on a few windows (its fixed input size, else multiples of its spatial
/// divisor) at batch 1 and 2; those where inference fails are left out.
fn probes(g: &Graph) -> Vec<Vec<Dims>> {
    g.probe_windows()
        .iter()
        .flat_map(|&w| [1, 2].map(|n| (n, w)))
        .filter_map(|(n, w)| infer_shapes_raw(&g.values, &g.nodes, g.input, n, w).ok())
        .collect()
}

/// Rewrites every attention chain of `g` (see the module doc) into one [`Op::Attention`]
/// node; returns how many. The absorbed nodes are dropped; values left unread stay for `prune`.
pub fn fuse_attention(g: &mut Graph) -> usize {
    let chains: Vec<Chain> = {
        let u = Walk { g, u: Uses::of(g) };
        (0..g.nodes.len())
            .filter_map(|k| match_chain(&u, k))
            .collect()
    };
    if chains.is_empty() {
        return 0;
    }
    let probes = probes(g);
    if probes.is_empty() {
        tracing::debug!("attention fusion skipped: no probe window has shapes");
        return 0;
    }
    let mut taken = vec![false; g.nodes.len()];
    let mut fused: Vec<(Chain, Attention, KSource)> = vec![];
    for c in chains {
        let k2 = c.mm2;
        if taken[k2] || c.absorbed.iter().any(|&k| taken[k]) {
            continue;
        }
        let mut res = probes.iter().map(|s| c.fuse_on(g, s));
        let Some(Some((att, ks))) = res.next() else {
            continue;
        };
        if !res.all(|r| r.is_some_and(|(a, _)| a == att)) {
            tracing::debug!(
                "attention at {} differs between windows: left unfused",
                g.nodes[k2].name
            );
            continue;
        }
        taken[k2] = true;
        for &k in &c.absorbed {
            taken[k] = true;
        }
        fused.push((c, att, ks));
    }
    let count = fused.len();
    let mut insert: Vec<Vec<Node>> = vec![vec![]; g.nodes.len()];
    for (c, att, ks) in fused {
        let name = g.nodes[c.mm2].name.clone();
        let k = match ks {
            KSource::Direct(x) => x,
            KSource::Transpose(x, perm) => {
                let channels =
                    transpose_dims(&probes[0][x], &perm).map_or(1, |d| d[1.min(d.rank() - 1)]);
                g.values.push(Value {
                    name: format!("{name}/k"),
                    channels,
                });
                let y = g.values.len() - 1;
                insert[c.mm2].push(Node {
                    name: format!("{name}/k_transpose"),
                    op: Op::Transpose { perm },
                    inputs: vec![x],
                    output: y,
                });
                y
            }
        };
        let out = g.nodes[c.mm2].output;
        insert[c.mm2].push(Node {
            name,
            op: Op::Attention(att),
            inputs: vec![c.q, k, c.v],
            output: out,
        });
    }
    let old = std::mem::take(&mut g.nodes);
    for (k, n) in old.into_iter().enumerate() {
        if !insert[k].is_empty() {
            g.nodes.append(&mut insert[k]);
        } else if !taken[k] {
            g.nodes.push(n);
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relayout_of_a_window_mask() {
        // Scores [4, 2, T=1, S=2] seen as [2, 2, 2, 1, 2]; a mask [1, 2, 1, 1, 2] over the
        // middle (window) axis becomes [4, 1, 1, 2] in the scores' layout (window = b_ % 2).
        let c = Dims::new(&[2, 2, 2, 1, 2]).unwrap();
        let f = Dims::new(&[4, 2, 1, 2]).unwrap();
        let m = Tensor::new(vec![1, 2, 1, 1, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let r = relayout(&m, &c, &f).unwrap();
        assert_eq!(r.shape, vec![4, 1, 1, 2]);
        assert_eq!(r.data, vec![1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0]);
        assert_eq!(swap_last(vec![0, 1, 2]), vec![0, 2, 1]);
    }
}
