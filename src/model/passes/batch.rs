//! Exports traced at batch 1 (MONAI's SwinUNETR and UNETR) bake the batch into Reshape targets
//! (`[1, nW, h, T, T]`, `[nW, T, C]` computed at trace time), so they would run one window per
//! forward. This pass follows the batch from the input through every op (`batch_axis`) and
//! rewrites each Reshape target so that its batch axis is inferred (`-1`, or `0` copying it):
//! each sample's elements and results stay what they were. The rewrite is kept only when it is
//! the same on every probe window and shape inference at batches 2 and 3 scales exactly the
//! batch axis of every value; otherwise the graph stays as exported (batch 1).

use super::batch_axis::output_axis;
use crate::model::graph::{Graph, Op};
use crate::model::ops::Dims;
use crate::model::shape::infer_shapes_raw;

/// Batches the rewrite is checked at (besides 1).
const CHECKED: [usize; 2] = [2, 3];

/// Rewrites `g`'s Reshape targets so that it runs at any batch (module doc); returns whether
/// it did. A graph that already runs at batch 2, or whose batch cannot be followed, is left as
/// it is.
pub(super) fn free_batch(g: &mut Graph) -> bool {
    if !g.has_tensor_ops() {
        return false;
    }
    let infer = |g: &Graph, n, w| infer_shapes_raw(&g.values, &g.nodes, g.input, n, w).ok();
    let probes: Vec<([usize; 3], Vec<Dims>)> = g
        .probe_windows()
        .into_iter()
        .filter_map(|w| infer(g, 1, w).map(|s| (w, s)))
        .collect();
    if probes.is_empty() || probes.iter().all(|(w, _)| infer(g, 2, *w).is_some()) {
        return false;
    }
    let mut plans = probes.iter().map(|(_, s)| plan(g, s));
    let Some(Some(first)) = plans.next() else {
        tracing::debug!("batch axis not followed: the graph keeps batch 1");
        return false;
    };
    if !plans.all(|p| p.as_ref() == Some(&first)) {
        tracing::debug!("batch rewrite differs between windows: the graph keeps batch 1");
        return false;
    }
    let old = apply(g, &first.targets);
    let ok = probes.iter().all(|(w, s1)| {
        infer(g, 1, *w).as_ref() == Some(s1)
            && CHECKED
                .iter()
                .all(|&n| infer(g, n, *w).is_some_and(|sn| scaled(s1, &first.axes, n) == sn))
    });
    if !ok {
        apply(g, &old);
        tracing::debug!("batch rewrite does not infer at batches {CHECKED:?}: kept batch 1");
    }
    ok
}

/// The batch axis of every value and the new target of every Reshape, on one probe's shapes.
#[derive(Debug, PartialEq)]
struct Plan {
    axes: Vec<Option<usize>>,
    targets: Vec<(usize, Vec<i64>)>,
}

/// The plan on batch-1 shapes `s`, or None where the batch cannot be followed or the output
/// would not hold one sample per index of its axis 0.
fn plan(g: &Graph, s: &[Dims]) -> Option<Plan> {
    let mut axes = vec![None; g.values.len()];
    axes[g.input] = Some(0);
    let mut targets = vec![];
    for (k, n) in g.nodes.iter().enumerate() {
        let ins: Vec<(Dims, usize)> = n
            .inputs
            .iter()
            .map(|&v| Some((s[v], axes[v]?)))
            .collect::<Option<_>>()?;
        let out = s[n.output];
        let c = output_axis(n, &ins, &out)?;
        if let Op::Reshape { target } = &n.op {
            let (x, a) = ins[0];
            targets.push((k, retarget(target, &x, a, &out, c)));
        }
        axes[n.output] = Some(c);
    }
    (axes[g.output] == Some(0) && s[g.output][0] == 1).then_some(Plan { axes, targets })
}

/// `t` (resolving `x` to `out` at batch 1) with its batch entry `c` inferred at any batch:
/// `0` when it copies `x`'s batch axis `a` unchanged, else `-1`, another `-1` then fixed at
/// its batch-1 size; a `0` copying `x`'s batch axis elsewhere is fixed too.
fn retarget(t: &[i64], x: &Dims, a: usize, out: &Dims, c: usize) -> Vec<i64> {
    let copies = a == c && x[a] == out[c];
    let mut new = t.to_vec();
    if !(t[c] == -1 || (t[c] == 0 && copies)) {
        let other = t.iter().enumerate().any(|(i, &e)| i != c && e == -1);
        new[c] = if other && copies { 0 } else { -1 };
    }
    let inferred = new[c] == -1;
    for (i, e) in new.iter_mut().enumerate() {
        let fixed = (*e == 0 && i == a) || (*e == -1 && inferred);
        if i != c && fixed {
            *e = out[i] as i64;
        }
    }
    new
}

/// Sets each listed node's Reshape target; returns the targets it replaced.
fn apply(g: &mut Graph, targets: &[(usize, Vec<i64>)]) -> Vec<(usize, Vec<i64>)> {
    targets
        .iter()
        .filter_map(|(k, t)| match &mut g.nodes[*k].op {
            Op::Reshape { target } => Some((*k, std::mem::replace(target, t.clone()))),
            _ => None,
        })
        .collect()
}

/// Batch-1 shapes `s` at batch `n`: each value's batch axis `n` times larger.
fn scaled(s: &[Dims], axes: &[Option<usize>], n: usize) -> Vec<Dims> {
    s.iter()
        .zip(axes)
        .map(|(d, a)| match a {
            Some(a) => {
                let mut v = d.to_vec();
                v[*a] *= n;
                Dims::new(&v).unwrap_or(*d)
            }
            None => *d,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &[usize]) -> Dims {
        Dims::new(s).unwrap()
    }

    #[test]
    fn targets_infer_the_batch_entry() {
        // [1, 8, 6] -> [1, 2, 4, 6]: the leading 1 is the batch.
        let (x, o) = (d(&[1, 8, 6]), d(&[1, 2, 4, 6]));
        assert_eq!(retarget(&[1, 2, 4, 6], &x, 0, &o, 0), vec![-1, 2, 4, 6]);
        // A -1 elsewhere stays when the batch entry can copy the input's.
        assert_eq!(retarget(&[1, 2, -1, 6], &x, 0, &o, 0), vec![0, 2, -1, 6]);
        // Windows merged [2, 4, 6] (axis 0 = B · 2) -> [8, 6]: the other -1 is fixed.
        let (x, o) = (d(&[2, 4, 6]), d(&[8, 6]));
        assert_eq!(retarget(&[8, 6], &x, 0, &o, 0), vec![-1, 6]);
        assert_eq!(retarget(&[8, -1], &x, 0, &o, 0), vec![-1, 6]);
        assert_eq!(retarget(&[-1, 6], &x, 0, &o, 0), vec![-1, 6]);
        // Heads: the batch on axis 1 of [3, 2, 4], a 0 copying it becomes its size.
        let (x, o) = (d(&[3, 2, 4]), d(&[3, 2, 2, 2]));
        assert_eq!(retarget(&[3, 0, 2, 2], &x, 1, &o, 1), vec![3, 0, 2, 2]);
        assert_eq!(retarget(&[0, 0, 2, 2], &x, 1, &o, 1), vec![0, 0, 2, 2]);
    }
}
