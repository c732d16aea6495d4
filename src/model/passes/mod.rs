//! IR → IR passes, run once over a lowered graph (`run`): fusions that give the backends fewer,
//! bigger ops (norm + affine, Linear + bias, the exported GELU chain, attention), then dead-code
//! removal. Each pass reads the graph's use-def facts from `uses`, which the CPU schedule shares.

mod attention;
mod fuse_linear;
mod fuse_norm;
mod gelu;
mod prune;
pub(crate) mod uses;

pub use attention::{fuse_attention, MAX_BIAS_ELEMS};

use crate::model::graph::Graph;

/// Every pass, in order: the fusions first (each leaves dead nodes behind), then `prune`.
pub(crate) fn run(g: &mut Graph) {
    fuse_norm::fuse_norm_affine(g);
    fuse_linear::fuse_linear_bias(g);
    gelu::fuse_gelu(g);
    fuse_attention(g);
    prune::prune(g);
}
