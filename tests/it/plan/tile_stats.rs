//! Convs handing the norm after them its statistics (`ArchCaps::norm_stats`, `host::tile_stats`),
//! host only: which launches pair, on which kernels, and the scratch they need.

use crate::common::unet::w1_graph;
use voxtile::internals::cuda::host::buffers::{buffer_plan, BufferPlan};
use voxtile::internals::cuda::host::catalogue::{stats_twin, HaloConfig};
use voxtile::internals::cuda::host::conv_kernel::{ArchCaps, ConvKernel};
use voxtile::internals::cuda::host::fusion::consumers;
use voxtile::internals::cuda::host::tile_stats::{tiles_per_sample, TILE_STAT_BYTES};
use voxtile::internals::cuda::host::windowed::Run;
use voxtile::model::graph::{Graph, Op};

fn stats_on() -> ArchCaps {
    ArchCaps {
        norm_stats: true,
        ..ArchCaps::h200()
    }
}

fn halo(k: &Option<ConvKernel>) -> Option<&'static HaloConfig> {
    match k {
        Some(ConvKernel::Halo(c)) => Some(c),
        _ => None,
    }
}

/// Checks `on` (statistics handed over) against `off` (the same plan without): the same
/// launches, buffers and arena; each pair is a conv on an `_st` twin of `off`'s kernel and the
/// norm right after it, the conv's output read by that norm alone, both run the same way; every
/// other launch as in `off`; the scratch holds every pair's partials. Returns the pairs.
fn check_pairs(name: &str, g: &Graph, on: &BufferPlan, off: &BufferPlan) -> usize {
    assert_eq!(on.launches.len(), off.launches.len(), "{name}");
    assert_eq!((&on.bufs, on.arena), (&off.bufs, off.arena), "{name}");
    let cons = consumers(g);
    let mut pairs = 0;
    let mut need = 0;
    for (t, (l, base)) in on.launches.iter().zip(&off.launches).enumerate() {
        assert_eq!((l.node, l.out_v), (base.node, base.out_v), "{name}");
        let Some(tiles) = l.tile_stats else {
            assert_eq!(
                l.conv, base.conv,
                "{name}: launch {t} changed kernel unpaired"
            );
            continue;
        };
        if !matches!(
            g.nodes[l.node].op,
            Op::InstanceNorm { .. } | Op::GroupNorm { .. }
        ) {
            continue; // the conv of a pair: checked from its norm
        }
        let c = &on.launches[t - 1];
        let twin = halo(&c.conv).expect("a pair's conv runs a halo kernel");
        let base_k = halo(&off.launches[t - 1].conv).expect("on a halo kernel without too");
        assert!(twin.stats, "{name}: {} is not an _st kernel", twin.name);
        assert_eq!(
            stats_twin(base_k).map(|k| k.name),
            Some(twin.name),
            "{name}"
        );
        assert_eq!(c.tile_stats, Some(tiles), "{name}");
        assert_eq!(
            cons[c.out_v],
            vec![l.node],
            "{name}: the norm must be the only reader"
        );
        assert!(c.fuse.is_none() && c.residual.is_none(), "{name}");
        assert_eq!(on.windows.run(t - 1), on.windows.run(t), "{name}");
        let os = on.shapes[c.out_v];
        assert_eq!(tiles, tiles_per_sample(twin, os), "{name}");
        let n = if on.windows.run(t) == Run::Batch {
            on.batch
        } else {
            1
        };
        need = need.max(n * tiles * os[0] * TILE_STAT_BYTES);
        pairs += 1;
    }
    assert!(
        on.norm_sums >= need,
        "{name}: scratch {} < {need}",
        on.norm_sums
    );
    assert_eq!(on.norm_sums, off.norm_sums.max(need), "{name}");
    pairs
}

/// W1 at batch 4: the nine convs on halo / z-pair kernels before a norm hand it their
/// statistics (at 128³ the two z-pair 32 -> 32 convs and the 64 -> 32 decoder conv, the 64 ->
/// 64 and 128 -> 64 convs at 64³ and 32³); the Cin-1 conv and the mma convs do not. The
/// decoder's full-resolution pairs run in its window segment, one window at a time.
#[test]
fn w1_convs_hand_their_norms_the_statistics() {
    let g = w1_graph();
    let roi = [128; 3];
    let on = buffer_plan(&g, 4, roi, &stats_on()).unwrap();
    let off = buffer_plan(&g, 4, roi, &ArchCaps::h200()).unwrap();
    assert!(off.launches.iter().all(|l| l.tile_stats.is_none()));
    let pairs = check_pairs("w1", &g, &on, &off);
    let kernels: Vec<&str> = on
        .launches
        .iter()
        .filter(|l| l.tile_stats.is_some())
        .filter_map(|l| halo(&l.conv).map(|c| c.name))
        .collect();
    eprintln!(
        "RESULT w1 pairs {pairs}: {kernels:?}, scratch {} bytes",
        on.norm_sums
    );
    assert_eq!(pairs, 9);
    assert_eq!(
        kernels
            .iter()
            .filter(|k| **k == "conv_wz_c32_y16_h2_st")
            .count(),
        2
    );
    // The largest partials: the 64 -> 32 decoder conv's 8192 tiles x 32 channels, one window.
    assert_eq!(on.norm_sums, 8192 * 32 * TILE_STAT_BYTES);
}

/// Every model and architecture fixture at 128³ (or its fixed window), batches 1 and 3: the
/// pairs follow the rules of `check_pairs`.
#[test]
fn fixtures_pair_by_the_rules() {
    let mut nets: Vec<(String, Graph)> = crate::common::arch_fixtures()
        .into_iter()
        .map(|(name, g, _)| (name, g))
        .collect();
    nets.extend(super::planner::models());
    let mut pairs = 0;
    for (name, g) in &nets {
        let roi = g.spatial_divisor().map(|d| 128usize.div_ceil(d) * d);
        for batch in [1usize, 3] {
            let Ok(off) = buffer_plan(g, batch, roi, &ArchCaps::h200()) else {
                continue;
            };
            let on = buffer_plan(g, batch, roi, &stats_on()).unwrap();
            pairs += check_pairs(name, g, &on, &off);
        }
    }
    eprintln!("RESULT {pairs} pairs over the fixtures");
    assert!(pairs > 0, "no fixture pairs a conv with its norm");
}
