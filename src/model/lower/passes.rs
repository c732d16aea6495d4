//! Graph passes after lowering: BatchNorm folding, norm + affine fusion, pruning.

use super::*;

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
pub(super) fn fuse_norm_affine(g: &mut Graph) {
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

/// A Linear without bias whose sole reader adds a constant that is one value per output column
/// (`[1, .., 1, N]`): the constant becomes the Linear's bias (MatMul + Add of the exporters).
pub(super) fn fuse_linear_bias(g: &mut Graph) {
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
        let Op::Linear(l) = &g.nodes[i].op else {
            continue;
        };
        let nout = l.weight.shape.get(1).copied().unwrap_or(0);
        let out = g.nodes[i].output;
        let j = consumer[out];
        if l.bias.is_some() || uses[out] != 1 || j == usize::MAX || g.nodes[j].inputs != [out] {
            continue;
        }
        let Op::AddConst(t) = &g.nodes[j].op else {
            continue;
        };
        let per_col = t
            .shape
            .split_last()
            .is_some_and(|(&last, lead)| last == nout && lead.iter().all(|&d| d == 1));
        if !per_col || t.data.len() != nout {
            continue;
        }
        let bias = Tensor::new(vec![nout], t.data.clone());
        if let Op::Linear(l) = &mut g.nodes[i].op {
            l.bias = Some(bias);
        }
        g.nodes[i].output = g.nodes[j].output;
        removed[j] = true;
    }
    let mut k = 0;
    g.nodes.retain(|_| {
        k += 1;
        !removed[k - 1]
    });
}

/// Drop nodes that do not contribute to the output and renumber values compactly.
pub(super) fn prune(g: &mut Graph) {
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
