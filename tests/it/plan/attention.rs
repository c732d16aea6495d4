//! Host only (no GPU): MONAI UNETR, whose 12 self-attentions the importer fuses into
//! `Op::Attention`, plans on the CUDA backend for an H200 at one 32^3 window, from both
//! exporters: every node launched (or fused into its producer), one offset table per attention.

use std::path::Path;
use voxtile::internals::cuda::host::buffers::buffer_plan;
use voxtile::internals::cuda::host::conv_kernel::ArchCaps;
use voxtile::model::graph::Op;

#[test]
fn unetr_plans_on_cuda_host_side() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/archs");
    for export in ["legacy", "dynamo"] {
        let path = dir.join(format!("unetr_{export}.onnx"));
        let g = voxtile::model::onnx::load(&path).unwrap();
        let bp = buffer_plan(&g, 1, [32, 32, 32], &ArchCaps::h200())
            .unwrap_or_else(|e| panic!("unetr {export}: {e}"));
        let mut planned = vec![false; g.nodes.len()];
        for l in &bp.launches {
            planned[l.node] = true;
            for j in l.fuse.into_iter().chain(l.residual.map(|(j, _)| j)) {
                planned[j] = true;
            }
        }
        let missing: Vec<&str> = g
            .nodes
            .iter()
            .zip(&planned)
            .filter(|(_, &p)| !p)
            .map(|(n, _)| n.name.as_str())
            .collect();
        assert!(
            missing.is_empty(),
            "unetr {export}: not planned {missing:?}"
        );
        let attentions = g
            .nodes
            .iter()
            .filter(|n| matches!(n.op, Op::Attention(_)))
            .count();
        let tables = bp
            .consts
            .iter()
            .filter(|c| c.what == "attention offset table (i64)")
            .count();
        println!(
            "RESULT unetr {export}: {} nodes, {attentions} attentions, device bytes {}",
            g.nodes.len(),
            bp.device_bytes()
        );
        assert_eq!(attentions, 12, "unetr {export}");
        assert_eq!(tables, attentions, "unetr {export}");
    }
}
