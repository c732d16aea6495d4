//! Which values the CUDA buffer plan keeps in fp32 (`BufferPlan::f32_values`), on the
//! architecture fixtures (no GPU): exactly the conv outputs whose every reader is an
//! InstanceNorm / GroupNorm, at 4 bytes an element, and none with `norm_f32` off.

use voxtile::internals::cuda::host::buffers::buffer_plan;
use voxtile::internals::cuda::host::conv_kernel::ArchCaps;
use voxtile::model::graph::Op;

fn is_norm(op: &Op) -> bool {
    matches!(op, Op::InstanceNorm { .. } | Op::GroupNorm { .. })
}

#[test]
fn conv_outputs_only_norms_read_are_fp32() {
    let caps = ArchCaps::h200();
    let mut kept = 0;
    let all = crate::common::arch_fixtures();
    assert!(all.len() >= 20, "{} fixtures loaded", all.len());
    for (name, g, roi) in &all {
        let bp = buffer_plan(g, 1, *roi, &caps).unwrap();
        let mut readers = vec![Vec::new(); g.values.len()];
        for (j, n) in g.nodes.iter().enumerate() {
            for &v in &n.inputs {
                readers[v].push(j);
            }
        }
        for l in &bp.launches {
            let node = &g.nodes[l.node];
            let v = l.out_v;
            let conv = matches!(node.op, Op::Conv(_) | Op::ConvTranspose(_));
            let only_norms = !readers[v].is_empty()
                && readers[v]
                    .iter()
                    .all(|&j| is_norm(&g.nodes[j].op) && !bp.tensor[j]);
            let eligible = conv
                && !bp.tensor[l.node]
                && v != g.output
                && only_norms
                && l.conv.as_ref().is_some_and(|k| k.writes_f32());
            assert_eq!(bp.f32_values[v], eligible, "{name}: node {}", node.name);
            let b = bp.value_buf[v].unwrap();
            if eligible {
                kept += 1;
                let numel: usize = bp.shapes[v].iter().product();
                assert_eq!(bp.bufs[b], numel * 4, "{name}: node {}", node.name);
                assert_eq!((l.ldc, l.coff), (bp.shapes[v][0], 0), "{name}");
            }
        }
        for (v, &f) in bp.f32_values.iter().enumerate() {
            if f {
                assert!(
                    bp.launches.iter().any(|l| l.out_v == v),
                    "{name}: value {v} fp32 but no launch writes it"
                );
            }
        }
        let off = ArchCaps {
            norm_f32: false,
            ..caps
        };
        let bp16 = buffer_plan(g, 1, *roi, &off).unwrap();
        assert!(bp16.f32_values.iter().all(|&f| !f), "{name}");
        let bytes =
            |p: &voxtile::internals::cuda::host::buffers::BufferPlan| p.bufs.iter().sum::<usize>();
        let extra: usize = bp
            .f32_values
            .iter()
            .enumerate()
            .filter(|(_, &f)| f)
            .map(|(v, _)| bp.shapes[v].iter().product::<usize>() * 2)
            .sum();
        assert_eq!(bytes(&bp), bytes(&bp16) + extra, "{name}");
    }
    assert!(kept >= 50, "only {kept} fp32 values over the fixtures");
}
