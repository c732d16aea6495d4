//! IR → IR passes, run once over a lowered graph (`run`): fusions that give the backends fewer,
//! bigger ops (norm + affine, Linear + bias, the exported GELU chain, attention), then dead-code
//! removal, then the batch freed from Reshape targets that an export traced at batch 1 fixed.
//! Each pass reads the graph's use-def facts from `uses`, which the CPU schedule shares.

mod attention;
mod batch;
mod batch_axis;
mod fuse_linear;
mod fuse_norm;
mod gelu;
mod prune;
pub(crate) mod uses;

pub use attention::{fuse_attention, MAX_BIAS_ELEMS};

use crate::model::graph::Graph;

/// Every pass, in order: the fusions first (each leaves dead nodes behind), then `prune`, then
/// the batch rewrite (on live nodes only, and after the attention fusion has folded the masks
/// at the exported batch).
pub(crate) fn run(g: &mut Graph) {
    fuse_norm::fuse_norm_affine(g);
    fuse_linear::fuse_linear_bias(g);
    gelu::fuse_gelu(g);
    fuse_attention(g);
    prune::prune(g);
    batch::free_batch(g);
}
