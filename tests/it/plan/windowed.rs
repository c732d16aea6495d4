//! Window segments (`host::windowed`), host only: the plans that run their full-resolution ends
//! one window at a time, replayed in the backend's order over the arena's bytes.

use super::planner::check_no_alias;
use crate::common::unet::w1_graph;
use voxtile::internals::cuda::host::buffers::{buffer_plan, BufferPlan};
use voxtile::internals::cuda::host::conv_kernel::ArchCaps;
use voxtile::internals::cuda::host::tensor_layout::aliases;
use voxtile::internals::cuda::host::windowed::Run;
use voxtile::model::graph::{Graph, Op};

/// Arena bytes tagged with the (value group, window) last written there.
#[derive(Default)]
struct Bytes(Vec<(usize, usize, (usize, usize))>);

impl Bytes {
    fn write(&mut self, lo: usize, hi: usize, tag: (usize, usize)) {
        let mut out = Vec::with_capacity(self.0.len() + 2);
        for &(a, b, t) in &self.0 {
            if b <= lo || a >= hi {
                out.push((a, b, t));
                continue;
            }
            if a < lo {
                out.push((a, lo, t));
            }
            if b > hi {
                out.push((hi, b, t));
            }
        }
        out.push((lo, hi, tag));
        out.sort_unstable();
        self.0 = out;
    }

    /// Whether every byte of [lo, hi) was last written with `tag`.
    fn holds(&self, lo: usize, hi: usize, tag: (usize, usize)) -> bool {
        let mut at = lo;
        for &(a, b, t) in &self.0 {
            if b <= at || a >= hi {
                continue;
            }
            if a > at || t != tag {
                return false;
            }
            at = b;
        }
        at >= hi
    }
}

/// Replays `bp` as the backend runs it for `bp.batch` windows: the front segment's launches
/// window by window, the batched launches once over every window, then the back segment's
/// launches window by window, each window's output read (blended) right after its pass, or
/// every window's after the batched launches where there is no back segment. Every read must
/// find what the value's writer left for that window, byte for byte. Buffers hold the batch
/// (window s at s times one window's bytes, which must be the stride the launch list offsets
/// by) or one window (rewritten by each window's pass); nothing else.
fn replay(name: &str, g: &Graph, bp: &BufferPlan) {
    let batch = bp.batch;
    let nv = g.values.len();
    // Values that share bytes by design: a concat's slices and output, a view and its input.
    let mut group: Vec<usize> = (0..nv).collect();
    let stored: Vec<_> = (0..nv).map(|v| bp.stored(v)).collect();
    let root = |grp: &Vec<usize>, mut v: usize| {
        while grp[v] != v {
            v = grp[v];
        }
        v
    };
    for (i, node) in g.nodes.iter().enumerate() {
        let mut join = |a: usize, b: usize| {
            let (ra, rb) = (root(&group, a), root(&group, b));
            group[ra] = rb;
        };
        if matches!(node.op, Op::Concat { axis: 1 }) {
            for &v in node.inputs.iter().filter(|&&v| bp.in_place[v]) {
                join(v, node.output);
            }
        }
        if aliases(g, &stored, i) {
            join(node.output, node.inputs[0]);
        }
    }
    let elem = |v: usize| if bp.f32_values[v] { 4 } else { 2 };
    // One window's bytes of each buffer, from the values written into it.
    let mut one = vec![0usize; bp.bufs.len()];
    one[bp.input_buf] = bp.shapes[g.input].iter().product::<usize>() * 2;
    for l in &bp.launches {
        let s = bp.shapes[l.out_v];
        one[l.out_buf] = one[l.out_buf].max(l.ldc * s[1] * s[2] * s[3] * elem(l.out_v));
    }
    let mut mem = Bytes::default();
    let region = |b: usize, s: usize| {
        let o = bp.offsets[b];
        if bp.bufs[b] == one[b] && batch > 1 {
            (o, o + one[b])
        } else {
            assert_eq!(bp.bufs[b], batch * one[b], "{name}: buffer {b}");
            (o + s * one[b], o + (s + 1) * one[b])
        }
    };
    for s in 0..batch {
        let (lo, hi) = region(bp.input_buf, s);
        mem.write(lo, hi, (root(&group, g.input), s));
    }
    let seg = bp.windows;
    let n = bp.launches.len();
    let run = |mem: &mut Bytes, t: usize, windows: &[usize]| {
        let l = &bp.launches[t];
        let reads: Vec<usize> = l
            .reads(g)
            .into_iter()
            .filter(|&v| bp.value_buf[v].is_some())
            .collect();
        let per_window = seg.run(t) != Run::Batch;
        for &s in windows {
            for &v in &reads {
                let b = bp.value_buf[v].unwrap();
                if per_window && bp.bufs[b] != one[b] {
                    assert_eq!(bp.window_stride[b], one[b], "{name}: stride of buffer {b}");
                }
                let (lo, hi) = region(b, s);
                assert!(
                    mem.holds(lo, hi, (root(&group, v), s)),
                    "{name}: launch {t} ({}) reads value {v} of window {s}, overwritten",
                    g.nodes[l.node].name
                );
            }
        }
        if aliases(g, &stored, l.node) {
            return;
        }
        if !per_window {
            assert_eq!(
                bp.bufs[l.out_buf],
                batch * one[l.out_buf],
                "{name}: launch {t}"
            );
        }
        for &s in windows {
            let (lo, hi) = region(l.out_buf, s);
            mem.write(lo, hi, (root(&group, l.out_v), s));
        }
    };
    let all: Vec<usize> = (0..batch).collect();
    let out = |mem: &Bytes, s: usize| {
        let (lo, hi) = region(bp.output_buf, s);
        assert!(
            mem.holds(lo, hi, (root(&group, g.output), s)),
            "{name}: the output of window {s} is overwritten before its blend"
        );
    };
    for s in 0..batch {
        for t in 0..seg.pre {
            run(&mut mem, t, &[s]);
        }
    }
    for t in seg.pre..seg.post {
        run(&mut mem, t, &all);
    }
    if seg.post < n {
        for s in 0..batch {
            for t in seg.post..n {
                run(&mut mem, t, &[s]);
            }
            out(&mem, s);
        }
    } else {
        for s in 0..batch {
            out(&mem, s);
        }
    }
    for b in 0..bp.bufs.len() {
        assert!(bp.offsets[b] + bp.bufs[b] <= bp.arena, "{name}: buffer {b}");
    }
}

/// W1: the encoder's first level (four launches: the Cin-1 conv, its norm, the conv, its norm)
/// runs window by window, and so does the last decoder level from its transposed conv to the
/// head (six launches: the transposed conv, the first conv's two parts over the skip and its
/// output, its norm, the second conv, its norm with the head); the arena at batch 4 is the peak
/// of the last level's first conv: the batch's skips (32 channels) and 64³ decoder inputs (64
/// channels), one window's transposed conv output (32) and fp32 output (32): 1024 MiB against
/// 2048 batched. (Run whole over its concat, one window's concat (64) instead: 1152 MiB.) The
/// replay holds at every batch.
#[test]
fn w1_runs_its_full_resolution_ends_one_window_at_a_time() {
    let g = w1_graph();
    let roi = [128; 3];
    let mib = 1usize << 20;
    for batch in [2usize, 3, 4, 8] {
        let bp = buffer_plan(&g, batch, roi, &ArchCaps::h200()).unwrap();
        let n = bp.launches.len();
        assert_eq!((bp.windows.pre, n - bp.windows.post), (4, 6), "b{batch}");
        let vox = 128usize.pow(3);
        let last = batch * (32 * vox * 2 + 64 * vox / 8 * 2) + 32 * vox * 2 + 32 * vox * 4;
        assert_eq!(last, batch * 160 * mib + 384 * mib);
        // The batched 64³ decoder level: the skips at 128³, its concat (128 channels) and fp32
        // output (64).
        let level1 = batch * (32 * vox * 2 + (128 * 2 + 64 * 4) * vox / 8);
        let peak = last.max(level1);
        let live = bp.launches.iter().map(|l| l.live_bytes).max().unwrap();
        assert_eq!(live, peak, "b{batch}");
        assert!(
            bp.arena <= peak + 64 * 256,
            "b{batch}: {} > {peak}",
            bp.arena
        );
        replay("w1", &g, &bp);
        let batched = ArchCaps {
            window_segments: false,
            ..ArchCaps::h200()
        };
        let full = buffer_plan(&g, batch, roi, &batched).unwrap();
        assert!(!full.windows.any(full.launches.len()));
        assert_eq!(full.arena, batch * 512 * mib);
        replay("w1 batched", &g, &full);
        // Same launches, kernels and constants either way: only where the buffers sit differs.
        assert_eq!(bp.consts, full.consts);
        let kernels = |p: &BufferPlan| {
            p.launches
                .iter()
                .map(|l| l.conv.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(kernels(&bp), kernels(&full));
    }
    // One window: nothing to split.
    let bp = buffer_plan(&g, 1, roi, &ArchCaps::h200()).unwrap();
    assert!(!bp.windows.any(bp.launches.len()));
}

/// Every model and architecture fixture at a window of 128³ or more (segments need a window
/// that fills the GPU alone; exports that fix a smaller window keep it and get none), at
/// batches 2 to 4: the replay holds with or without segments, the arena is never larger with
/// them, and `check_no_alias`'s walk still holds.
#[test]
fn fixtures_replay_in_the_windowed_order() {
    let nets = super::planner::fixtures_and_models();
    let mut windowed = 0;
    for (name, g) in &nets {
        let roi = g.spatial_divisor().map(|d| 128usize.div_ceil(d) * d);
        for batch in [2usize, 3, 4] {
            let Ok(bp) = buffer_plan(g, batch, roi, &ArchCaps::h200()) else {
                continue;
            };
            let off = ArchCaps {
                window_segments: false,
                ..ArchCaps::h200()
            };
            let full = buffer_plan(g, batch, roi, &off).unwrap();
            assert!(bp.arena <= full.arena, "{name} b{batch}");
            if bp.windows.any(bp.launches.len()) {
                assert!(bp.arena < full.arena, "{name} b{batch}");
                windowed += 1;
            }
            replay(name, g, &bp);
            replay(name, g, &full);
            check_no_alias(name, g, &bp);
        }
    }
    eprintln!("RESULT {windowed} fixture plans run segments");
    assert!(windowed > 0, "no fixture runs a segment");
}
