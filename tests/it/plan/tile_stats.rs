//! Convs handing the norm after them its statistics (`ArchCaps::norm_stats`, `host::tile_stats`),
//! host only: which launches pair, on which kernels, and the scratch they need.

use crate::common::unet::w1_graph;
use voxtile::internals::cuda::host::buffers::{buffer_plan, BufferPlan};
use voxtile::internals::cuda::host::catalogue::{zpair_st_variant, C1_TILE};
use voxtile::internals::cuda::host::conv_kernel::{ArchCaps, ConvKernel};
use voxtile::internals::cuda::host::fusion::consumers;
use voxtile::internals::cuda::host::launch::{Launch, ShiftedOut};
use voxtile::internals::cuda::host::tile_stats::TILE_STAT_BYTES;
use voxtile::internals::cuda::host::windowed::Run;
use voxtile::model::graph::{Graph, Op};

/// The H200's defaults with the norm statistics on (the fused parity classes' too), convs over
/// a concat run whole (their parts' pairs: `plan::concat_split`).
fn stats_on() -> ArchCaps {
    ArchCaps {
        norm_stats: true,
        convt_stats: true,
        concat_split: false,
        ..ArchCaps::h200()
    }
}

/// As [`stats_on`], the statistics off.
fn stats_off() -> ArchCaps {
    ArchCaps {
        norm_stats: false,
        ..stats_on()
    }
}

/// Checks `on` (statistics handed over) against `off` (the same plan without): the same
/// launches, buffers and arena; each pair is a conv on the `_st` twin of `off`'s kernel for its
/// output (`with_norm_stats`) and the norm right after it, the conv's output read by that norm alone, both run the same way; every
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
        let base = off.launches[t - 1]
            .conv
            .as_ref()
            .expect("a pair's conv has a kernel");
        let os = on.shapes[c.out_v];
        let (twin, entries) = base
            .with_norm_stats(os, c.ldc, c.coff)
            .expect("the twin of the kernel without statistics");
        // (`ArchCaps::zpair_st_staged`: `_h2t_st` runs as `_h2l_st`.)
        let twin = match twin {
            ConvKernel::Halo(t) => {
                ConvKernel::Halo(zpair_st_variant(t, stats_on().zpair_st_staged))
            }
            t => t,
        };
        assert_eq!(c.conv.as_ref(), Some(&twin), "{name}");
        assert!(twin.funcs()[0].ends_with("_st"), "{name}");
        assert_eq!((c.tile_stats, tiles), (Some(entries), entries), "{name}");
        assert_eq!(
            cons[c.out_v],
            vec![l.node],
            "{name}: the norm must be the only reader"
        );
        assert!(c.fuse.is_none() && c.residual.is_none(), "{name}");
        assert_eq!(on.windows.run(t - 1), on.windows.run(t), "{name}");
        let n = if on.windows.run(t) == Run::Batch {
            on.batch
        } else {
            1
        };
        need = need.max(n * entries * os[0] * TILE_STAT_BYTES);
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

/// W1 at batch 4: the three convs before a norm on kernels with a twin hand it their
/// statistics (at 128³ the Cin-1 conv and the two z-pair 32 -> 32 convs, in the window
/// segments, one window at a time); the halo and mma convs do not, nor (`wgk_stats` off) those
/// on the wgmma implicit GEMM; with `wgk_stats` (the default) the eight of those (32³ and 16³,
/// batched) do.
#[test]
fn w1_convs_hand_their_norms_the_statistics() {
    let g = w1_graph();
    let roi = [128; 3];
    let no_wgk = ArchCaps {
        wgk_stats: false,
        ..stats_on()
    };
    let on = buffer_plan(&g, 4, roi, &no_wgk).unwrap();
    let off = buffer_plan(&g, 4, roi, &stats_off()).unwrap();
    assert!(off.launches.iter().all(|l| l.tile_stats.is_none()));
    let pairs = check_pairs("w1", &g, &on, &off);
    let kernels: Vec<&str> = on
        .launches
        .iter()
        .filter(|l| l.tile_stats.is_some())
        .filter_map(|l| l.conv.as_ref().map(|k| k.funcs()[0]))
        .collect();
    eprintln!(
        "RESULT w1 pairs {pairs}: {kernels:?}, scratch {} bytes",
        on.norm_sums
    );
    assert_eq!(
        kernels,
        [
            "conv_c1_k3_st",
            "conv_wz_c32_y16_h2l_st",
            "conv_wz_c32_y16_h2l_st"
        ]
    );
    assert_eq!(pairs, 3);
    assert!(stats_on().wgk_stats, "the default");
    let on = buffer_plan(&g, 4, roi, &stats_on()).unwrap();
    assert_eq!(check_pairs("w1 wgk", &g, &on, &off), 11);
    let kernels: Vec<&str> = on
        .launches
        .iter()
        .filter_map(|l| l.tile_stats.and(l.conv.as_ref()).map(|k| k.funcs()[0]))
        .filter(|k| k.starts_with("conv_wgk"))
        .collect();
    assert_eq!(
        kernels,
        [
            "conv_wgk_n128_s2_st",
            "conv_wgk_n128_st",
            "conv_wgk_n256_s2_st",
            "conv_wgk_n256_st",
            "conv_wgk_n256_st",
            "conv_wgk_n256_st",
            "conv_wgk_n128_st",
            "conv_wgk_n128_st"
        ]
    );
}

/// Every model and architecture fixture at 128³ (or its fixed window), batches 1 and 3: the
/// pairs follow the rules of `check_pairs`.
#[test]
fn fixtures_pair_by_the_rules() {
    let nets = super::planner::fixtures_and_models();
    let mut pairs = 0;
    for (name, g) in &nets {
        let roi = g.spatial_divisor().map(|d| 128usize.div_ceil(d) * d);
        for batch in [1usize, 3] {
            let Ok(off) = buffer_plan(g, batch, roi, &stats_off()) else {
                continue;
            };
            let on = buffer_plan(g, batch, roi, &stats_on()).unwrap();
            pairs += check_pairs(name, g, &on, &off);
        }
    }
    eprintln!("RESULT {pairs} pairs over the fixtures");
    assert!(pairs > 0, "no fixture pairs a conv with its norm");
}

/// Checks `on` (`norm_recompute`) against `off` (the same caps without): each norm launch that
/// runs a conv (`Launch::recompute`) replaces that conv's launch and its own, the conv's kernel
/// and entries those of `off`'s pair (the Cin-1 `_st` twin), the conv's output stored nowhere and read by
/// that norm alone, which takes no residual or head; the constants as in `off`, every other
/// launch's node and output too; the scratch holds the partials. Returns the recomputed convs.
fn check_recomputed(name: &str, g: &Graph, on: &BufferPlan, off: &BufferPlan) -> usize {
    assert_eq!(on.consts, off.consts, "{name}: constants");
    let cons = consumers(g);
    let mut n = 0;
    let mut need = 0;
    let mut rest = off.launches.iter().enumerate();
    for (t, l) in on.launches.iter().enumerate() {
        let Some(c) = l.recompute else {
            let (_, base) = rest.next().expect("as many other launches");
            assert_eq!((l.node, l.out_v), (base.node, base.out_v), "{name}");
            continue;
        };
        let (_, conv) = rest.next().expect("the conv's launch in off");
        let (_, norm) = rest.next().expect("the norm's launch in off");
        assert_eq!((conv.node, norm.node), (c, l.node), "{name}: launch {t}");
        assert_eq!(l.out_v, norm.out_v, "{name}");
        let v = g.nodes[c].output;
        assert_eq!(
            cons[v],
            vec![l.node],
            "{name}: the norm must be the only reader"
        );
        assert!(
            on.value_buf[v].is_none(),
            "{name}: the conv's output is stored"
        );
        assert!(l.residual.is_none() && l.head.is_none(), "{name}");
        // `off` pairs the conv with its norm (`check_pairs`): the same twin and entries.
        let entries = conv.tile_stats.expect("off pairs the conv with its norm");
        let twin = conv.conv.as_ref().expect("a conv kernel");
        assert_eq!(twin.funcs(), ["conv_c1_k3_st"], "{name}");
        assert_eq!(
            (l.conv.as_ref(), l.tile_stats),
            (Some(twin), Some(entries)),
            "{name}"
        );
        assert!(!l.reads(g).contains(&v), "{name}: reads the conv's output");
        let samples = if on.windows.run(t) == Run::Batch {
            on.batch
        } else {
            1
        };
        need = need.max(samples * entries * on.shapes[v][0] * TILE_STAT_BYTES);
        n += 1;
    }
    assert!(rest.next().is_none(), "{name}: launches left over");
    assert!(
        on.norm_sums >= need,
        "{name}: scratch {} < {need}",
        on.norm_sums
    );
    n
}

/// W1 at batch 4 with `norm_recompute`: its Cin-1 conv runs in the first norm's launch, which
/// needs no fp32 buffer for the conv's output: fewer bytes live there, the arena no larger.
#[test]
fn w1_norm_recomputes_its_cin1_conv() {
    let g = w1_graph();
    let on_caps = ArchCaps {
        norm_recompute: true,
        ..ArchCaps::h200()
    };
    let on = buffer_plan(&g, 4, [128; 3], &on_caps).unwrap();
    let off = buffer_plan(&g, 4, [128; 3], &ArchCaps::h200()).unwrap();
    assert_eq!(check_recomputed("w1", &g, &on, &off), 1);
    let l = on.launches.iter().find(|l| l.recompute.is_some()).unwrap();
    let norm = off.launches.iter().find(|b| b.node == l.node).unwrap();
    eprintln!(
        "RESULT w1 arena {} -> {} bytes, live at the norm {} -> {}",
        off.arena, on.arena, norm.live_bytes, l.live_bytes
    );
    assert!(on.arena <= off.arena, "{} > {}", on.arena, off.arena);
    assert!(
        l.live_bytes < norm.live_bytes,
        "the conv's fp32 output still live"
    );
}

/// Every model and architecture fixture at 128³ (or its fixed window), batches 1 and 3, with
/// `norm_recompute`: the recomputing launches follow the rules of `check_recomputed`.
#[test]
fn fixtures_recompute_by_the_rules() {
    let nets = super::planner::fixtures_and_models();
    let on_caps = ArchCaps {
        norm_recompute: true,
        ..ArchCaps::h200()
    };
    let mut n = 0;
    for (name, g) in &nets {
        let roi = g.spatial_divisor().map(|d| 128usize.div_ceil(d) * d);
        for batch in [1usize, 3] {
            let Ok(off) = buffer_plan(g, batch, roi, &ArchCaps::h200()) else {
                continue;
            };
            let on = buffer_plan(g, batch, roi, &on_caps).unwrap();
            n += check_recomputed(name, g, &on, &off);
        }
    }
    eprintln!("RESULT {n} recomputed convs over the fixtures");
    assert!(n > 0, "no fixture recomputes a conv");
}

/// The fixtures' strided transposed convs on the fused parity classes' `_st` twin
/// (`convt_stats`): each pairs with its norm where a sample's GEMM rows are whole M tiles and
/// the columns one tile (`check_pairs` holds them to the rules; here, that some do, at 128³,
/// and none without the switch).
#[test]
fn fused_parity_convs_hand_their_norms_the_statistics() {
    let nets = super::planner::fixtures_and_models();
    let mut names = Vec::new();
    for (name, g) in &nets {
        let roi = g.spatial_divisor().map(|d| 128usize.div_ceil(d) * d);
        let Ok(on) = buffer_plan(g, 2, roi, &stats_on()) else {
            continue;
        };
        for l in on.launches.iter().filter(|l| l.tile_stats.is_some()) {
            let f = l.conv.as_ref().map(|k| k.funcs()[0]).unwrap_or("");
            if f.starts_with("convt_up_") {
                names.push(format!("{name}: {f}"));
            }
        }
    }
    eprintln!("RESULT fused parity pairs {names:?}");
    assert!(!names.is_empty(), "no transposed conv pairs with its norm");
    assert!(names.iter().all(|n| n.ends_with("_st")), "{names:?}");
    let off = ArchCaps {
        convt_stats: false,
        ..stats_on()
    };
    for (name, g) in &nets {
        let roi = g.spatial_divisor().map(|d| 128usize.div_ceil(d) * d);
        let Ok(bp) = buffer_plan(g, 2, roi, &off) else {
            continue;
        };
        let convt = bp
            .launches
            .iter()
            .filter(|l| l.tile_stats.is_some())
            .any(|l| {
                l.conv
                    .as_ref()
                    .is_some_and(|k| k.funcs()[0].starts_with("convt_up_"))
            });
        assert!(
            !convt,
            "{name}: a transposed conv paired without convt_stats"
        );
    }
}

/// The same classes on the wgmma implicit GEMM (`wgk_convt`, on by default): the fixtures' k3 s2
/// transposed convs of Cin 64k take `conv_wgk_up_n128` (none without the switch), and with the
/// statistics those whose classes x Cout fit its 128 columns pair with their norm on the `_st`
/// twin, one entry per tile of the input grid (`check_pairs` holds them to the rules).
#[test]
fn fused_parity_convs_on_wgk() {
    let nets = super::planner::fixtures_and_models();
    let wgk = stats_on();
    let off = ArchCaps {
        norm_stats: false,
        ..wgk
    };
    let mma = ArchCaps {
        wgk_convt: false,
        ..wgk
    };
    let (mut ran, mut paired) = (Vec::new(), 0);
    for (name, g) in &nets {
        let roi = g.spatial_divisor().map(|d| 128usize.div_ceil(d) * d);
        let (Ok(on), Ok(bare), Ok(mma)) = (
            buffer_plan(g, 2, roi, &wgk),
            buffer_plan(g, 2, roi, &off),
            buffer_plan(g, 2, roi, &mma),
        ) else {
            continue;
        };
        let up = |bp: &BufferPlan| {
            bp.launches
                .iter()
                .filter_map(|l| l.conv.as_ref())
                .filter(|k| matches!(k, ConvKernel::ParityFusedWgk(..)))
                .count()
        };
        assert_eq!(up(&mma), 0, "{name}: conv_wgk_up without the switch");
        if up(&on) == 0 {
            continue;
        }
        paired += check_pairs(name, g, &on, &bare);
        for l in on.launches.iter().filter(|l| l.tile_stats.is_some()) {
            if let Some(k @ ConvKernel::ParityFusedWgk(..)) = &l.conv {
                assert_eq!(k.funcs(), ["conv_wgk_up_n128_st"], "{name}");
            }
        }
        ran.push(name.to_string());
    }
    eprintln!("RESULT conv_wgk_up nets {ran:?}, {paired} pairs");
    assert!(!ran.is_empty() && paired > 0, "{ran:?}: {paired} pairs");
}

/// Checks `on` (`norm_shifted`) against `off` (the same caps without): the same launches,
/// kernels, buffers and scratch, but for `Launch::shifted`, which a pair has on both launches
/// where its conv is a z-pair or Cin-1 twin writing all of a dense output of Cout % 8 == 0 in one launch
/// or as a split conv's last part (wide), and its norm writes its own output (no head), the
/// tile the twin's, read in runs where `runs` (`norm_runs`) and the tile and width fit; no other
/// launch has it. Returns the shifted pairs.
fn check_shifted(name: &str, on: &BufferPlan, off: &BufferPlan, runs: bool) -> usize {
    assert_eq!(on.launches.len(), off.launches.len(), "{name}");
    assert_eq!(
        (&on.bufs, on.arena, on.norm_sums),
        (&off.bufs, off.arena, off.norm_sums),
        "{name}"
    );
    let mut pairs = 0;
    for (t, (l, base)) in on.launches.iter().zip(&off.launches).enumerate() {
        assert_eq!(
            Launch {
                shifted: None,
                ..l.clone()
            },
            *base,
            "{name}: launch {t}"
        );
        // (A conv right before another conv: the second's own turn checks it.)
        let is_conv = l.conv.is_some() && l.head.is_none();
        let Some(next) = on
            .launches
            .get(t + 1)
            .filter(|n| is_conv && n.conv.is_none())
        else {
            continue;
        };
        let twin_tile = match &l.conv {
            Some(ConvKernel::Halo(c)) if c.zpair && c.stats => Some(c.tile),
            Some(ConvKernel::Cin1 { stats: true }) => Some(C1_TILE),
            _ => None,
        };
        let c = on.shapes[l.out_v][0];
        // A split conv's last part (it adds the earlier parts' sums) stores wide.
        let want = match twin_tile {
            Some(tile)
                if l.tile_stats.is_some()
                    && l.part.is_none_or(|p| p.accumulate)
                    && next.head.is_none()
                    && c.is_multiple_of(8)
                    && (l.ldc, l.coff) == (c, 0) =>
            {
                Some(ShiftedOut {
                    tile,
                    wide: l.part.is_some(),
                    runs: runs && ShiftedOut::runs_fit(tile, on.shapes[l.out_v][3]),
                })
            }
            _ => None,
        };
        assert_eq!(l.shifted, want, "{name}: conv launch {t}");
        assert_eq!(next.shifted, want, "{name}: its norm");
        pairs += want.is_some() as usize;
    }
    let marked = on.launches.iter().filter(|l| l.shifted.is_some()).count();
    assert_eq!(marked, 2 * pairs, "{name}: a shifted launch outside a pair");
    pairs
}

/// `norm_shifted` (on by default): W1 at batch 4 shifts its 128³ encoder's two convs (the Cin-1
/// one and the z-pair one), the decoder's first 128³ conv (a split conv's last part: wide) and
/// its three 64³ convs in Cin chunks (wide), not the conv before the norm the head reads; the
/// fixtures by the rules of `check_shifted`.
/// With `norm_runs` W1's six pairs are all read in runs (128³ and 64³ outputs, z-pair tiles 8
/// wide, the Cin-1 tile 32), and the plan is otherwise the same.
#[test]
fn shifted_pairs_follow_the_rules() {
    let g = w1_graph();
    let mut in_runs = 0;
    for runs in [false, true] {
        let shifted = ArchCaps {
            norm_shifted: true,
            norm_runs: runs,
            ..ArchCaps::h200()
        };
        let unshifted = ArchCaps {
            norm_shifted: false,
            ..shifted
        };
        let on = buffer_plan(&g, 4, [128; 3], &shifted).unwrap();
        let off = buffer_plan(&g, 4, [128; 3], &unshifted).unwrap();
        assert_eq!(check_shifted("w1", &on, &off, runs), 6);
        let read_in_runs = on
            .launches
            .iter()
            .filter(|l| l.shifted.is_some_and(|s| s.runs));
        assert_eq!(
            read_in_runs.count(),
            if runs { 12 } else { 0 },
            "runs {runs}"
        );
        let mut pairs = 0;
        for (name, g) in &super::planner::fixtures_and_models() {
            let roi = g.spatial_divisor().map(|d| 128usize.div_ceil(d) * d);
            for batch in [1usize, 3] {
                let Ok(off) = buffer_plan(g, batch, roi, &unshifted) else {
                    continue;
                };
                let on = buffer_plan(g, batch, roi, &shifted).unwrap();
                pairs += check_shifted(name, &on, &off, runs);
                in_runs += on
                    .launches
                    .iter()
                    .filter(|l| l.shifted.is_some_and(|s| s.runs))
                    .count();
            }
        }
        eprintln!("RESULT runs {runs}: {pairs} shifted pairs over the fixtures");
        assert!(pairs > 0, "no fixture shifts a pair");
    }
    assert!(in_runs > 0, "no fixture's norm reads in runs");
}

/// Runs fit where the tile's x and the width are multiples of the run, and nowhere else.
#[test]
fn runs_fit_only_whole_runs() {
    let run = voxtile::internals::cuda::abi::NORM_RUN;
    assert!(ShiftedOut::runs_fit([16, 16, 8], 128));
    assert!(ShiftedOut::runs_fit([4, 8, 32], 64));
    assert!(!ShiftedOut::runs_fit([16, 16, 8], 128 + run / 2));
    assert!(!ShiftedOut::runs_fit([16, 16, run / 2], 128));
    assert!(ShiftedOut::runs_fit([1, 1, run], 3 * run));
}
