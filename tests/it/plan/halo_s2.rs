//! Stride-2 convs on the stride-2 halo kernel (`ArchCaps::halo_s2`) and on the stride-2
//! wgmma kernel (`ArchCaps::wg_s2`), host only: which of W1's convs take it, and that nothing
//! else in the plan changes.

use crate::common::unet::w1_graph;
use voxtile::internals::cuda::host::buffers::{buffer_plan, BufferPlan};
use voxtile::internals::cuda::host::catalogue::{CONV_HALO_C32N64_S2, CONV_WG_C32N64_S2P};
use voxtile::internals::cuda::host::conv_kernel::{ArchCaps, ConvKernel};
use voxtile::model::graph::Op;

/// W1 at batches 1 and 4 without the wgmma implicit GEMM (`conv_wgk`): with the switch, the
/// stride-2 convs of Cin 32 and 64 (Cout 64 and 128, at 128³ -> 64³ and 64³ -> 32³) run
/// `conv_halo_c32n64_s2`; those of Cout 256 and 320 keep the mma GEMM (above
/// `HALO_MAX_COUT`), every other conv its kernel, and the buffers, the arena and the constants
/// are the same (the halo kernels share the GEMM's weight layout).
#[test]
fn w1_strided_convs_on_the_stride2_halo_kernel() {
    let on_caps = ArchCaps {
        halo_s2: true,
        wg_s2: false,
        conv_wgk: false,
        ..ArchCaps::h200()
    };
    w1_strided_on(
        &on_caps,
        CONV_HALO_C32N64_S2.name,
        &[(32, 64, 128), (64, 128, 64)],
    );
}

/// The same with `wg_s2` and `conv_wgk` (the defaults): the Cin-32 one runs
/// `conv_wg_c32n64_s2p` (its resident weights hold Cin 32 only), the Cin-64 one the implicit
/// GEMM on wgmma either way.
#[test]
fn w1_strided_convs_on_the_stride2_wgmma_kernel() {
    let on_caps = ArchCaps::h200();
    w1_strided_on(&on_caps, CONV_WG_C32N64_S2P.name, &[(32, 64, 128)]);
}

/// W1's plan with `on_caps` against the same caps with both switches off (the implicit GEMM):
/// the stride-2 convs `want` ((Cin, Cout, input side)) run `kernel`, nothing else changes.
fn w1_strided_on(on_caps: &ArchCaps, kernel: &str, want: &[(usize, usize, usize)]) {
    let g = w1_graph();
    let roi = [128; 3];
    let off_caps = ArchCaps {
        wg_s2: false,
        halo_s2: false,
        ..*on_caps
    };
    for batch in [1, 4] {
        let off = buffer_plan(&g, batch, roi, &off_caps).unwrap();
        let on = buffer_plan(&g, batch, roi, on_caps).unwrap();
        assert_eq!(on.launches.len(), off.launches.len(), "b{batch}");
        let (mut taken, mut strided) = (Vec::new(), 0);
        for (a, b) in off.launches.iter().zip(&on.launches) {
            assert_eq!(a.node, b.node, "b{batch}: the same launches");
            let node = &g.nodes[b.node];
            let s2 = matches!(&node.op, Op::Conv(c) if c.stride == [2; 3]);
            strided += usize::from(s2);
            let names = |k: &Option<ConvKernel>| k.as_ref().map(ConvKernel::funcs);
            if names(&b.conv) == Some(vec![kernel]) {
                assert!(s2, "b{batch}: {} is not strided", node.name);
                let x = g.nodes[b.node].inputs[0];
                taken.push((on.shapes[x][0], on.shapes[b.out_v][0], on.shapes[x][1]));
                assert!(
                    names(&a.conv).is_some_and(|f| f[0].starts_with("conv_mma_")),
                    "b{batch}: {} ran {:?} without the switch",
                    node.name,
                    names(&a.conv)
                );
            } else {
                assert_eq!(names(&a.conv), names(&b.conv), "b{batch}: {}", node.name);
            }
        }
        // (Cin, Cout, input side)
        assert_eq!(taken, want, "b{batch}");
        assert_eq!(strided, 5, "b{batch}: W1's stride-2 convs");
        assert_eq!(on.arena, off.arena, "b{batch}: arena");
        assert_eq!(on.bufs, off.bufs, "b{batch}: buffers");
        let bytes = |p: &BufferPlan| p.consts.iter().map(|c| c.bytes).collect::<Vec<_>>();
        assert_eq!(bytes(&on), bytes(&off), "b{batch}: constants");
    }
}
