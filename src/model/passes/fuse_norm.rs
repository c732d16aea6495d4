//! GroupNorm followed by per-channel MulConst / AddConst (PyTorch's GroupNorm export with its
//! affine): the constants fold into the norm's own scale and bias.

use super::uses::{remove_nodes, Uses};
use crate::model::graph::{Graph, Op};

/// GroupNorm (from the export pattern, unit affine) followed by per-channel MulConst then
/// AddConst, each the sole reader of the previous value: fold them into the norm's affine.
/// Linear in the node count (consumers indexed once, folded nodes removed at the end), so a long
/// chain of norms costs no more than its length.
pub(super) fn fuse_norm_affine(g: &mut Graph) {
    let uses = Uses::of(g);
    let mut removed = vec![false; g.nodes.len()];
    for i in 0..g.nodes.len() {
        if removed[i] || !matches!(g.nodes[i].op, Op::GroupNorm { .. }) {
            continue;
        }
        loop {
            let out = g.nodes[i].output;
            let Some(j) = uses.sole_reader(out) else {
                break;
            };
            if g.nodes[j].inputs != [out] {
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
    remove_nodes(g, &removed);
}
