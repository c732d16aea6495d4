//! Convs over a channel concat run one launch per part (`ArchCaps::concat_split`,
//! `host::concat_split`), host only: which convs split, their launches, constants and buffers.

use crate::common::unet::w1_graph;
use voxtile::internals::cuda::host::buffers::{buffer_plan, BufferPlan};
use voxtile::internals::cuda::host::concat_split::Part;
use voxtile::internals::cuda::host::conv_kernel::ArchCaps;
use voxtile::internals::cuda::host::fusion::consumers;
use voxtile::model::graph::{Graph, Op};

/// `caps` with the convs over a concat run per part (Cin chunks off: `chunks_on` adds them).
fn split_on(caps: ArchCaps) -> ArchCaps {
    ArchCaps {
        concat_split: true,
        cin_chunks: false,
        ..caps
    }
}

/// `caps` with the convs over a concat run whole.
fn split_off(caps: ArchCaps) -> ArchCaps {
    ArchCaps {
        concat_split: false,
        cin_chunks: false,
        ..caps
    }
}

/// Checks `on` (splits taken) against `off` (the same plan without), returns the split convs:
/// - each split conv runs as consecutive launches, one per part in channel order, each on a
///   z-pair kernel over its part (an input of the concat it reads in place of its input, or
///   of that input itself; whole, or a 32-channel chunk), the parts' channels adding up to the
///   input's, the first writing the fp32 output, the later adding; `off` ran the conv on one
///   launch of another kernel (over the concat, which `on` never runs);
/// - such a concat is the conv's alone, and its inputs are not written into its slices;
/// - every other launch is `off`'s, the constants' bytes are the same, the arena no larger.
fn check_splits(name: &str, g: &Graph, on: &BufferPlan, off: &BufferPlan) -> usize {
    let cons = consumers(g);
    let mut splits = 0;
    let (mut a, mut b) = (0, 0);
    while a < on.launches.len() {
        let l = &on.launches[a];
        if l.part.is_none() {
            let base = &off.launches[b];
            if base.node != l.node {
                // The concat of a split conv: `on` has no launch for it.
                let concat = &g.nodes[base.node];
                assert!(
                    matches!(concat.op, Op::Concat { axis: 1 }),
                    "{name}: launch {a} is {} where the plan without splits runs {}",
                    g.nodes[l.node].name,
                    concat.name
                );
                assert!(cons[concat.output].len() == 1, "{name}");
                assert!(
                    concat.inputs.iter().all(|&v| !on.in_place[v]),
                    "{name}: a split concat's input written into its slice"
                );
                b += 1;
                continue;
            }
            assert_eq!((l.out_v, &l.conv), (base.out_v, &base.conv), "{name}: {a}");
            a += 1;
            b += 1;
            continue;
        }
        let node = &g.nodes[l.node];
        let x = node.inputs[0];
        let concat = g
            .nodes
            .iter()
            .find(|n| n.output == x && on.value_buf[x].is_none());
        let sources = concat.map_or(vec![x], |c| c.inputs.clone());
        if concat.is_some() {
            assert_eq!(
                cons[x],
                vec![l.node],
                "{name}: the concat is the conv's alone"
            );
        }
        let parts: Vec<Part> = on.launches[a..]
            .iter()
            .take_while(|p| p.node == l.node && p.part.is_some())
            .map(|p| {
                assert_eq!((p.out_v, p.out_buf), (l.out_v, l.out_buf));
                let k = p.conv.as_ref().expect("a part's kernel").funcs()[0];
                assert!(k.starts_with("conv_wz_"), "{name}: part on {k}");
                p.part.unwrap()
            })
            .collect();
        assert!(parts.len() >= 2, "{name}: a conv split in one part");
        let mut cin_off = 0;
        for (k, p) in parts.iter().enumerate() {
            let src = sources.iter().position(|&v| v == p.value);
            let src = src.unwrap_or_else(|| panic!("{name}: part {p:?} reads no source"));
            let before: usize = sources[..src].iter().map(|&v| on.shapes[v][0]).sum();
            assert_eq!(p.cin_off, before + p.x_coff, "{name}: {p:?}");
            assert_eq!(p.cin_off, cin_off, "{name}: parts in channel order");
            assert!(p.x_coff + p.cin <= on.shapes[p.value][0], "{name}: {p:?}");
            assert!(
                p.cin == on.shapes[p.value][0] || p.cin == 32,
                "{name}: {p:?}"
            );
            assert_eq!(p.accumulate, k > 0, "{name}");
            cin_off += p.cin;
        }
        assert_eq!(cin_off, on.shapes[x][0], "{name}");
        assert!(
            on.f32_values[l.out_v],
            "{name}: a split conv's output is fp32"
        );
        if concat.is_some() && off.launches[b].out_v == x {
            b += 1; // `off` runs the concat right before the conv
        }
        let whole = &off.launches[b];
        assert_eq!(whole.node, l.node, "{name}");
        let k = whole.conv.as_ref().expect("a conv's kernel").funcs()[0];
        assert!(!k.starts_with("conv_wz_"), "{name}: split a z-pair conv");
        a += parts.len();
        b += 1;
        splits += 1;
    }
    assert_eq!(b, off.launches.len(), "{name}");
    let bytes = |p: &BufferPlan| p.consts.iter().map(|c| c.bytes).sum::<usize>();
    assert_eq!(bytes(on), bytes(off), "{name}: constants");
    assert!(
        on.arena <= off.arena,
        "{name}: arena {} > {}",
        on.arena,
        off.arena
    );
    splits
}

/// W1 at batches 1 and 4: the first decoder conv (64 -> 32 at 128³, `conv_halo_c32n32_w4` in
/// two Cin chunks) runs as two 32 -> 32 z-pair launches over the skip and the transposed conv's
/// output, the second on the twin that writes the norm's statistics; the other decoder levels (Cin 128 and up: parts of 64 and more, which no z-pair
/// kernel takes) do not split. Without wgmma (sm_80) nothing splits.
#[test]
fn w1_first_decoder_conv_runs_per_part() {
    let g = w1_graph();
    let roi = [128; 3];
    for batch in [1, 4] {
        let off = buffer_plan(&g, batch, roi, &split_off(ArchCaps::h200())).unwrap();
        let on = buffer_plan(&g, batch, roi, &split_on(ArchCaps::h200())).unwrap();
        assert_eq!(check_splits("w1", &g, &on, &off), 1);
        let parts: Vec<_> = on.launches.iter().filter(|l| l.part.is_some()).collect();
        assert_eq!(parts.len(), 2);
        // The last part hands the norm after it the statistics (`norm_stats`, on by default).
        let funcs: Vec<&str> = parts
            .iter()
            .map(|l| l.conv.as_ref().unwrap().funcs()[0])
            .collect();
        assert_eq!(funcs, ["conv_wz_c32_y16_h2t", "conv_wz_c32_y16_h2l_st"]);
        assert!(parts[0].tile_stats.is_none() && parts[1].tile_stats.is_some());
        assert_eq!(on.shapes[parts[0].out_v], [32, 128, 128, 128]);
        eprintln!(
            "RESULT w1 b{batch} concat split: arena {} -> {} MiB, {} -> {} launches",
            off.arena >> 20,
            on.arena >> 20,
            off.launches.len(),
            on.launches.len()
        );
        let sm80 = ArchCaps::new(8, 0, 108, 163 * 1024);
        let a = buffer_plan(&g, batch, roi, &split_on(sm80)).unwrap();
        assert!(a.launches.iter().all(|l| l.part.is_none()));
    }
}

/// Every model and architecture fixture at 128³ (or its fixed window), batches 1 and 3, with
/// and without Cin chunks: the splits follow the rules of `check_splits`; with norm statistics
/// on as well, a split conv's last part hands the norm after it the statistics and no other
/// part does.
#[test]
fn fixtures_split_by_the_rules() {
    let mut nets = super::planner::fixtures_and_models();
    nets.push(("w1".into(), w1_graph()));
    let mut splits = [0, 0];
    for (name, g) in &nets {
        let roi = g.spatial_divisor().map(|d| 128usize.div_ceil(d) * d);
        for (batch, (c, caps)) in [1usize, 3]
            .into_iter()
            .flat_map(|b| [(b, (0, split_on as fn(_) -> _)), (b, (1, chunks_on))])
        {
            let Ok(off) = buffer_plan(g, batch, roi, &split_off(ArchCaps::h200())) else {
                continue;
            };
            let on = buffer_plan(g, batch, roi, &caps(ArchCaps::h200())).unwrap();
            splits[c] += check_splits(name, g, &on, &off);
            let both = ArchCaps {
                norm_stats: true,
                ..caps(ArchCaps::h200())
            };
            let st = buffer_plan(g, batch, roi, &both).unwrap();
            for (t, l) in st.launches.iter().enumerate() {
                let last = st
                    .launches
                    .get(t + 1)
                    .is_none_or(|n| n.part.is_none() || n.node != l.node);
                if l.part.is_some() && !last {
                    assert!(
                        l.tile_stats.is_none(),
                        "{name}: a part before the last pairs"
                    );
                }
            }
        }
    }
    eprintln!(
        "RESULT {} split convs over the fixtures, {} with Cin chunks",
        splits[0], splits[1]
    );
    assert!(splits[0] > 0, "no fixture splits a conv");
    assert!(
        splits[1] > splits[0],
        "no fixture runs a conv in Cin chunks"
    );
}

/// `split_on` with the Cin chunks too.
fn chunks_on(caps: ArchCaps) -> ArchCaps {
    ArchCaps {
        cin_chunks: true,
        ..split_on(caps)
    }
}

/// W1 at batches 1 and 4 with `cin_chunks` (132 SMs): at batch 4 the convs that `conv_halo_*`
/// takes whole at 64³ (Cin 64 and the concat of 2 x 64; 512 z-pair tiles) run in 32-channel
/// chunks on the z-pair kernel, Cout 64 in 32-channel tiles; at 32³ (64 tiles) and at batch 1
/// (128 tiles at 64³) nothing is chunked: fewer tiles than SMs. The first decoder conv at 128³
/// splits per concat part as without chunks; the strided and the 16³-and-smaller convs do not
/// split.
#[test]
fn w1_convs_run_in_cin_chunks() {
    let g = w1_graph();
    let roi = [128; 3];
    for batch in [1, 4] {
        let off = buffer_plan(&g, batch, roi, &split_off(ArchCaps::h200())).unwrap();
        let on = buffer_plan(&g, batch, roi, &chunks_on(ArchCaps::h200())).unwrap();
        let want: &[(usize, usize, usize)] = if batch == 4 {
            &[
                (64, 64_064, 2),
                (128, 64_064, 4),
                (64, 64_064, 2),
                (64, 32_128, 2),
            ]
        } else {
            &[(64, 32_128, 2)]
        };
        assert_eq!(check_splits("w1 chunks", &g, &on, &off), want.len());
        let mut split: Vec<(usize, usize, usize, usize)> = Vec::new();
        for l in on.launches.iter().filter(|l| l.part.is_some()) {
            let x = g.nodes[l.node].inputs[0];
            let os = on.shapes[l.out_v];
            match split.last_mut() {
                Some(s) if s.0 == l.node => s.3 += 1,
                _ => split.push((l.node, on.shapes[x][0], os[0] * 1000 + os[1], 1)),
            }
        }
        let got: Vec<_> = split.iter().map(|s| (s.1, s.2, s.3)).collect();
        // (Cin, Cout * 1000 + side, launches) in the list's order.
        assert_eq!(got, want, "w1 b{batch}");
        eprintln!(
            "RESULT w1 b{batch} cin chunks: arena {} -> {} MiB, {} -> {} launches",
            off.arena >> 20,
            on.arena >> 20,
            off.launches.len(),
            on.launches.len()
        );
    }
}
