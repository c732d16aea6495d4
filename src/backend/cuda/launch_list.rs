//! The prepared graph: the launch list over exactly the buffers of [`buffer_plan`] (one
//! activation arena, the constants, the norm scratch), built once per (roi, batch), and its
//! launch for n samples.

use super::ops::norm::{slope_n, Affine, Norm};
use super::ops::{build_node, conv, Build, NodeIo, Step};
use crate::backend::cuda::abi::{Act, Shape};
use crate::backend::cuda::host::buffers::{buffer_plan, BufferPlan};
use crate::backend::cuda::host::catalogue::FILL_HALF;
use crate::backend::cuda::host::conv_kernel::ArchCaps;
use crate::backend::cuda::host::launch::{Launch, NormHead};
use crate::backend::cuda::host::windowed::Run;
use crate::backend::cuda::ops::eltwise::Elt;
use crate::backend::cuda::runtime::device::drv;
use crate::backend::cuda::runtime::device::DevBuf;
use crate::backend::cuda::runtime::launch::{Arg, Gpu};
use crate::model::graph::{Graph, Op, Tensor};
use crate::{Error, Result};
use cudarc::driver::{sys, CudaGraph, PinnedHostSlice};
use std::sync::Mutex;

pub(crate) struct Prepared {
    pub batch: usize,
    pub roi: [usize; 3],
    pub cin: usize,
    pub cout: usize,
    pub out_spatial: [usize; 3],
    /// In the order they run: the front segment's steps window by window, the batched steps,
    /// the back segment's window by window (`host::windowed`).
    pub steps: Vec<Step>,
    /// Per step: how it runs, and for a segment's copy its window.
    pub runs: Vec<(Run, usize)>,
    /// One label per step (op kind, shapes, kernel) for `profile_forward`.
    pub labels: Vec<String>,
    /// Bytes from one window's network output to the next: 0 where the back segment writes
    /// one window's output at a time, to be blended before the next window's pass.
    pub output_stride: usize,
    /// Whether window segments end the list: then each window's output exists only between
    /// its back steps ([`Prepared::run_back`]) and the next window's.
    pub back: bool,
    /// The activation arena (fp16; every buffer of the plan at its offset), then constants;
    /// all kept alive for the launch list.
    pub arena: DevBuf,
    pub consts: Vec<DevBuf>,
    pub input: u64,
    pub output: u64,
    /// f32 staging of the single-window API (`Backend::run`), made on its first call: the
    /// streamed pipeline never needs it.
    pub single: Option<SingleWindow>,
    /// Its bytes (the buffer plan's `stage_in`, `stage_out`).
    pub stage_bytes: (usize, usize),
    /// fp64 [batch][Cmax][2] channel sums (also a split-K conv's fp32 partial sums) and f32
    /// [batch][Cmax][2] norm scale/shift.
    pub norm_sums: DevBuf,
    pub norm_ab: DevBuf,
    /// Bytes of activation memory the plan allocated (after reuse).
    pub activation_bytes: usize,
    /// The launch list as CUDA graphs per sample count (`CudaOptions::graphs`), or None.
    pub graphs: Option<Graphs>,
}

/// The launch list captured as CUDA graphs, replayed per batch: one launch instead of one per
/// step (SwinUNETR's list has 415). One graph per sample count for the front and batched steps,
/// one per window for the back segment's. Each is captured the second time it runs: its first
/// run launches the steps directly, so every kernel has run once (and been loaded) outside a
/// capture. Every pointer the steps take is fixed by the plan, so a replay launches exactly
/// what the list would.
#[derive(Default)]
pub(crate) struct Graphs(Mutex<Vec<(Steps, Option<CudaGraph>)>>);

/// What a graph replays: the front and batched steps for n samples, or window s's back steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Steps {
    Front(usize),
    Back(usize),
}

// SAFETY: the graphs are reached only through the mutex, which serialises every call on them as
// the CUDA driver asks of graph objects; the stream they launch on is Send + Sync.
unsafe impl Send for Graphs {}
unsafe impl Sync for Graphs {}

/// Device and pinned f32 NCDHW staging of one window batch in and out (`Backend::run`).
pub(crate) struct SingleWindow {
    pub stage_in: DevBuf,
    pub stage_out: DevBuf,
    pub host_in: PinnedHostSlice<f32>,
    pub host_out: PinnedHostSlice<f32>,
}

/// Builds the launch list over exactly the buffers of [`buffer_plan`]: the plan says which
/// buffers exist, which launch writes which, each conv's kernel and every constant's bytes;
/// this only allocates, uploads (checking each size against the plan) and fills in pointers.
pub(crate) fn build(
    gpu: &Gpu,
    caps: &ArchCaps,
    graph: &Graph,
    batch: usize,
    roi: [usize; 3],
    graphs: bool,
) -> Result<Prepared> {
    let t = std::time::Instant::now();
    let bp = buffer_plan(graph, batch, roi, caps)?;
    let planned = t.elapsed();
    let arena = DevBuf::new(&gpu.ctx, bp.arena)?;
    let allocated = t.elapsed();
    let bufs: Vec<u64> = bp.offsets.iter().map(|&o| arena.ptr + o as u64).collect();
    let mut b = Build {
        gpu,
        bufs: Vec::new(),
        plan: &bp.consts,
        replay: None,
    };
    // (run, window, launch) of each step, sorted into running order below.
    let mut built: Vec<((Run, usize, usize), Step, String)> = Vec::new();
    for (t, l) in bp.launches.iter().enumerate() {
        let run = bp.windows.run(t);
        let copies = if run == Run::Batch { 1 } else { batch };
        let k0 = b.bufs.len();
        let mut k1 = None;
        for w in 0..copies {
            // Window w's copy: every batch-holding buffer at its w-th slice.
            let at: Vec<u64> = bufs
                .iter()
                .zip(&bp.window_stride)
                .map(|(&p, &st)| p + (w * st) as u64)
                .collect();
            b.replay = (w > 0).then_some(k0);
            for (step, label) in launch_steps(&mut b, &bp, &at, graph, l, batch)? {
                built.push(((run, w, t), step, label));
            }
            match (k1, b.replay) {
                (None, _) => k1 = Some(b.bufs.len()),
                (Some(k), Some(r)) if r == k => {}
                _ => {
                    return Err(Error::Backend(format!(
                        "node {}: a window's copy of the launch took other constants",
                        graph.nodes[l.node].name
                    )))
                }
            }
        }
        b.replay = None;
    }
    // Front copies window by window, then the batched steps, then the back copies.
    let rank = |r: Run| match r {
        Run::Front => 0,
        Run::Batch => 1,
        Run::Back => 2,
    };
    built.sort_by_key(|&((r, w, t), _, _)| (rank(r), w, t));
    let runs: Vec<(Run, usize)> = built.iter().map(|&((r, w, _), _, _)| (r, w)).collect();
    let (steps, labels): (Vec<Step>, Vec<String>) =
        built.into_iter().map(|(_, s, l)| (s, l)).unzip();
    if b.bufs.len() != bp.consts.len() {
        return Err(Error::Backend(format!(
            "CUDA launch list: {} constants uploaded, the buffer plan lists {}",
            b.bufs.len(),
            bp.consts.len()
        )));
    }
    // Where a run's `prepare` goes (W3's start-up).
    tracing::debug!(
        "launch list for {batch} x {roi:?}: buffer plan {:.0} ms, arena of {} MiB {:.0} ms, \
         {} steps and {} constants {:.0} ms",
        planned.as_secs_f64() * 1e3,
        bp.arena >> 20,
        (allocated - planned).as_secs_f64() * 1e3,
        steps.len(),
        b.bufs.len(),
        (t.elapsed() - allocated).as_secs_f64() * 1e3
    );
    let in_shape = bp.shapes[graph.input];
    let out_shape = bp.shapes[graph.output];
    let back = bp.windows.post < bp.launches.len();
    let output_stride = if back {
        bp.window_stride[bp.output_buf]
    } else {
        out_shape.iter().product::<usize>() * 2
    };
    Ok(Prepared {
        batch,
        roi,
        cin: in_shape[0],
        cout: out_shape[0],
        out_spatial: [out_shape[1], out_shape[2], out_shape[3]],
        steps,
        runs,
        labels,
        output_stride,
        back,
        input: bufs[bp.input_buf],
        output: bufs[bp.output_buf],
        activation_bytes: arena.bytes,
        arena,
        consts: b.bufs,
        single: None,
        stage_bytes: (bp.stage_in, bp.stage_out),
        norm_sums: DevBuf::new(&gpu.ctx, bp.norm_sums)?,
        norm_ab: DevBuf::new(&gpu.ctx, bp.norm_ab)?,
        graphs: graphs.then(Graphs::default),
    })
}

/// The steps (with their profile labels) of launch `l` over buffers at `bufs`.
fn launch_steps(
    b: &mut Build,
    bp: &BufferPlan,
    bufs: &[u64],
    graph: &Graph,
    l: &Launch,
    batch: usize,
) -> Result<Vec<(Step, String)>> {
    let node = &graph.nodes[l.node];
    let act = match l.fuse {
        Some(j) => Act::of(&graph.nodes[j].op).expect("checked by fusable_activation"),
        None => Act::None,
    };
    // The conv a norm recomputes is built first (its constants come first in the plan).
    let recomputed = match l.recompute {
        Some(c) => Some(recomputed_conv(b, bp, bufs, graph, l, c)?),
        None => None,
    };
    let io = node_io(bp, bufs, graph, l, act)?;
    let slope = b.act_slope(&io.act)?;
    let io = NodeIo { slope, ..io };
    let in_place: Vec<bool> = node.inputs.iter().map(|&v| bp.in_place[v]).collect();
    let conv = l.conv.as_ref().filter(|_| recomputed.is_none());
    let new = build_node(b, &node.op, &io, conv, &in_place, batch)?;
    let new = match (&l.head, new.as_slice()) {
        (None, [Step::Norm(_)]) if recomputed.is_some() => {
            let (Some((stats, conv)), Some(Step::Norm(norm))) =
                (recomputed, new.into_iter().next())
            else {
                unreachable!("matched above")
            };
            vec![Step::NormRecompute {
                stats: Box::new(stats),
                norm,
                conv: Box::new(conv),
            }]
        }
        (Some(h), [Step::Norm(_)]) => {
            let Some(Step::Norm(norm)) = new.into_iter().next() else {
                unreachable!("matched above")
            };
            vec![head_step(b, bp, graph, &io, h, norm)?]
        }
        (Some(_), _) => {
            return Err(Error::Backend(format!(
                "node {}: a head fused into a node that is not a norm",
                node.name
            )))
        }
        (None, _) if recomputed.is_some() => {
            return Err(Error::Backend(format!(
                "node {}: a conv recomputed by a node that is not a norm",
                node.name
            )))
        }
        (None, _) => new,
    };
    Ok(new
        .into_iter()
        .map(|s| {
            let label = step_label(&s, &node.op, &io.act, io.xshape, io.oshape);
            (s, label)
        })
        .collect())
}

/// The two launches of conv node `c` that norm launch `l` runs (`l.recompute`): the conv on
/// its statistics twin reading its own input and writing the launch's output, split into the
/// statistics-only and the normalising launch ([`conv::ConvStep::recomputed`]).
fn recomputed_conv(
    b: &mut Build,
    bp: &BufferPlan,
    bufs: &[u64],
    graph: &Graph,
    l: &Launch,
    c: usize,
) -> Result<(conv::ConvStep, conv::ConvStep)> {
    let node = &graph.nodes[c];
    let cl = Launch {
        node: c,
        fuse: None,
        recompute: None,
        ..l.clone()
    };
    let io = node_io(bp, bufs, graph, &cl, Act::None)?;
    let kernel = l
        .conv
        .as_ref()
        .ok_or_else(|| Error::Backend(format!("node {}: no conv kernel planned", node.name)))?;
    let mut steps = conv::build(b, &node.op, kernel, &io)?;
    match (steps.pop(), steps.is_empty()) {
        (Some(step), true) => step.recomputed(),
        _ => Err(Error::Backend(format!(
            "node {}: a recomputed conv must be one launch",
            node.name
        ))),
    }
}

/// The norm's statistics and its head (`l.head`), which reads the norm's input (`io`: the
/// norm launch's buffers) and writes the launch's output, with its own activation and slope.
fn head_step(
    b: &mut Build,
    bp: &BufferPlan,
    graph: &Graph,
    io: &NodeIo,
    h: &NormHead,
    norm: Norm,
) -> Result<Step> {
    let conv = &graph.nodes[h.conv];
    let act = h.fuse.map_or(Act::None, |f| {
        Act::of(&graph.nodes[f].op).unwrap_or(Act::None)
    });
    let slope = b.act_slope(&act)?;
    let hio = NodeIo {
        name: &conv.name,
        oshape: bp.shapes[conv.output],
        slope,
        slope_n: slope_n(&act),
        act,
        xs: vec![io.x],
        stats_tiles: None,
        shifted: None,
        part: None,
        ..io.clone()
    };
    let mut steps = conv::build(b, &conv.op, &h.kernel, &hio)?;
    match (steps.pop(), steps.is_empty()) {
        (Some(head), true) if head.reads_norm_input() => Ok(Step::NormHead { norm, head }),
        _ => Err(Error::Backend(format!(
            "node {}: a norm's head must be one pointwise or `_nl` launch",
            conv.name
        ))),
    }
}

/// Buffers, shapes and fused activation of launch `l` (slope not uploaded yet).
fn node_io<'g>(
    bp: &BufferPlan,
    bufs: &[u64],
    graph: &'g Graph,
    l: &Launch,
    act: Act,
) -> Result<NodeIo<'g>> {
    let node = &graph.nodes[l.node];
    // A split conv's launch reads its part of the concat, not the concat.
    let ins: Vec<usize> = match l.part {
        Some(p) => vec![p.value],
        None => node.inputs.clone(),
    };
    // A recomputed conv's output is never stored (its norm's `x` is unused).
    let inner = l.recompute.map(|c| graph.nodes[c].output);
    let xs: Vec<u64> = ins
        .iter()
        .map(|&v| {
            if Some(v) == inner {
                return Ok(0);
            }
            bp.value_buf[v].map(|b| bufs[b]).ok_or_else(|| {
                Error::Graph(format!(
                    "node {}: input value {v} was never computed",
                    node.name
                ))
            })
        })
        .collect::<Result<_>>()?;
    let oshape = bp.shapes[node.output];
    let slope_n = match &act {
        Act::PRelu(s) => s.len() as i32,
        _ => 1,
    };
    Ok(NodeIo {
        name: &node.name,
        tensor: bp.tensor[l.node],
        st: ins.iter().map(|&v| bp.stored(v)).collect(),
        ost: bp.stored(node.output),
        x: xs[0],
        cins: ins.iter().map(|&v| bp.shapes[v][0]).collect(),
        shapes: ins.iter().map(|&v| bp.shapes[v]).collect(),
        xs,
        y: bufs[l.out_buf],
        x_f32: bp.f32_values[ins[0]],
        y_f32: bp.f32_values[l.out_v],
        xshape: bp.shapes[ins[0]],
        oshape,
        pix: oshape[1] * oshape[2] * oshape[3],
        ldc: l.ldc,
        coff: l.coff,
        act,
        slope: 0,
        slope_n,
        res: match l.residual {
            Some((_, r)) => bp.value_buf[r].map_or(0, |b| bufs[b]),
            None => 0,
        },
        stats_tiles: l.tile_stats,
        shifted: l.shifted,
        part: l.part,
    })
}

impl Prepared {
    /// Launches step `step` for `n` samples on the compute stream.
    pub fn run_step(&self, gpu: &Gpu, step: &Step, n: usize) -> Result<()> {
        let scratch = [self.norm_sums.ptr, self.norm_ab.ptr];
        step.launch(gpu, &gpu.stream, n, scratch)
    }

    /// Whether step `i` runs in `part`, and on how many samples.
    pub fn samples(&self, i: usize, part: Steps) -> Option<usize> {
        match (self.runs[i], part) {
            ((Run::Batch, _), Steps::Front(n)) => Some(n),
            ((Run::Front, w), Steps::Front(n)) if w < n => Some(1),
            ((Run::Back, w), Steps::Back(s)) if w == s => Some(1),
            _ => None,
        }
    }

    /// Launches the steps of `part` on the compute stream.
    pub fn run_part(&self, gpu: &Gpu, part: Steps) -> Result<()> {
        for (i, step) in self.steps.iter().enumerate() {
            if let Some(n) = self.samples(i, part) {
                self.run_step(gpu, step, n)?;
            }
        }
        Ok(())
    }

    /// Launches the whole list for `n` samples: the front and batched steps, then each
    /// window's back steps (for timing: a back segment's windows share one output buffer).
    pub fn run_steps(&self, gpu: &Gpu, n: usize) -> Result<()> {
        self.run_part(gpu, Steps::Front(n))?;
        if self.back {
            for s in 0..n {
                self.run_part(gpu, Steps::Back(s))?;
            }
        }
        Ok(())
    }

    /// Where window `b`'s network output is (after its back steps, where there are some).
    pub fn window_output(&self, b: usize) -> u64 {
        self.output + (b * self.output_stride) as u64
    }

    /// Runs the front and batched steps for `n` samples on the compute stream: their graph
    /// where one is captured (see [`Graphs`]), else the steps. Without a back segment that is
    /// the whole list.
    pub fn run_batch(&self, gpu: &Gpu, n: usize) -> Result<()> {
        self.run_graph(gpu, Steps::Front(n))
    }

    /// Runs window `s`'s back steps on the compute stream, as `run_batch` does.
    pub fn run_back(&self, gpu: &Gpu, s: usize) -> Result<()> {
        self.run_graph(gpu, Steps::Back(s))
    }

    fn run_graph(&self, gpu: &Gpu, part: Steps) -> Result<()> {
        let Some(graphs) = &self.graphs else {
            return self.run_part(gpu, part);
        };
        let mut g = graphs
            .0
            .lock()
            .map_err(|_| Error::Backend("the CUDA graph cache was poisoned".into()))?;
        match g.iter().position(|(m, _)| *m == part) {
            None => {
                g.push((part, None));
                self.run_part(gpu, part)
            }
            Some(i) => {
                if g[i].1.is_none() {
                    g[i].1 = Some(self.capture(gpu, part)?);
                }
                let graph = g[i].1.as_ref().expect("captured above");
                graph.launch().map_err(drv("CUDA graph launch"))
            }
        }
    }

    /// How many parts have a captured graph (tests: the replay ran).
    pub fn graphs_captured(&self) -> usize {
        self.graphs.as_ref().map_or(0, |g| {
            g.0.lock()
                .map_or(0, |g| g.iter().filter(|(_, x)| x.is_some()).count())
        })
    }

    /// The steps of `part` captured from the compute stream (relaxed mode: the copy thread's
    /// calls meanwhile are on other streams). The capture ends even when a step fails.
    fn capture(&self, gpu: &Gpu, part: Steps) -> Result<CudaGraph> {
        let s = &gpu.stream;
        s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(drv("CUDA graph capture"))?;
        let ran = self.run_part(gpu, part);
        let graph = s.end_capture(sys::CUgraphInstantiate_flags(0));
        ran?;
        graph
            .map_err(drv("CUDA graph capture"))?
            .ok_or_else(|| Error::Backend("the CUDA graph capture was empty".into()))
    }

    /// Fills the activation arena with NaN (`CudaOptions::poison`; an fp32 buffer reads the
    /// fp16 NaN pairs as huge finite values, still nothing a conv's output could be).
    pub fn poison(&self, gpu: &Gpu) -> Result<()> {
        let len = self.arena.bytes / 2;
        gpu.eltwise(
            &gpu.stream,
            FILL_HALF.name,
            len,
            &mut [
                Arg::Ptr(self.arena.ptr),
                Arg::I64(len as i64),
                Arg::F32(f32::NAN),
            ],
        )
    }

    /// Checks this plan runs windows of `roi` in batches of `batch` and maps them to windows
    /// of the same size (sliding-window blending).
    pub fn check_window(&self, roi: [usize; 3], batch: usize) -> Result<()> {
        if self.roi != roi || self.batch < batch {
            return Err(Error::Invalid(format!(
                "the CUDA backend was prepared for window {:?} batch {}, not window {roi:?} batch {batch}",
                self.roi, self.batch
            )));
        }
        if self.out_spatial != roi {
            return Err(Error::Invalid(format!(
                "the model maps window {roi:?} to {:?}; sliding-window blending needs equal sizes",
                self.out_spatial
            )));
        }
        Ok(())
    }
}

/// Profile label of one step: op, input -> output shape (C x D x H x W per sample), fused
/// activation or residual Add and, for convs, the kernel. Steps of one label are summed by [`per_step`].
pub(crate) fn step_label(step: &Step, op: &Op, act: &Act, x: Shape, o: Shape) -> String {
    let sh = |s: Shape| format!("{}x{}x{}x{}", s[0], s[1], s[2], s[3]);
    let res = match step {
        Step::Conv(c) => c.p.res != 0,
        Step::Norm(n) => n.affine.res != 0,
        _ => false,
    };
    let act = match act {
        Act::None => String::new(),
        a => format!(" +{}", format!("{a:?}").split('(').next().unwrap_or("")),
    } + if res { " +Add" } else { "" };
    // Kernel and stride of the op itself (a transposed conv runs as several GEMM steps).
    let ks = |w: &Tensor, st: [usize; 3]| {
        let w = &w.shape;
        format!(
            "k{}{}{} s{}",
            w[2],
            w[3],
            w[4],
            st.iter().max().unwrap_or(&1)
        )
    };
    let what = match (step, op) {
        (Step::Conv(c), Op::Conv(cv)) if c.ksplit > 1 => format!(
            "{} {} [{} split-K {}]",
            op.name(),
            ks(&cv.weight, cv.stride),
            c.func,
            c.ksplit
        ),
        (Step::Conv(c), Op::Conv(cv)) => {
            format!("{} {} [{}]", op.name(), ks(&cv.weight, cv.stride), c.func)
        }
        (Step::Conv(c), Op::ConvTranspose(cv)) => {
            format!("{} {} [{}]", op.name(), ks(&cv.weight, cv.stride), c.func)
        }
        // A norm over a conv's shifted fp16 output: its affine kernel.
        (
            Step::Norm(Norm {
                affine: Affine {
                    shifted: Some(sh), ..
                },
                ..
            }),
            _,
        ) => format!("{} [{}]", op.name(), sh.kernel().0.name),
        (Step::Elt(Elt::Concat { cin, coff, .. }), _) => {
            format!("{} copy {cin}@{coff}", op.name())
        }
        _ => op.name().to_string(),
    };
    // A norm running the conv before it: that conv's kernel and input.
    if let Step::NormRecompute { conv, .. } = step {
        let p = &conv.p;
        let xc = [p.cin as usize, p.di as usize, p.hi as usize, p.wi as usize];
        return format!("{what}{act} +conv [{}] {} -> {}", conv.func, sh(xc), sh(o));
    }
    // A norm with its head: the head's kernel and output.
    if let Step::NormHead { head, .. } = step {
        let p = &head.p;
        let o = [
            p.cout as usize,
            p.do_ as usize,
            p.ho as usize,
            p.wo as usize,
        ];
        return format!(
            "{what}{act} +head [{}] {} -> {}",
            conv::normed_func(head.func).unwrap_or(head.func),
            sh(x),
            sh(o)
        );
    }
    format!("{what}{act} {} -> {}", sh(x), sh(o))
}
