//! The CUDA backend's buffer plan, host only: which fp16 activation buffers exist (fp32 for a
//! conv output only norms read) and their bytes, which launch writes which buffer, the kernel
//! of every conv and the constants it
//! uploads (re-laid fp16 GEMM operands with their padding, biases, norm parameters...), the
//! per-plan norm scratch, and where each buffer sits in the one activation arena.
//! `CudaBackend::prepare` allocates exactly this list and the memory planner (`crate::plan`) sums
//! it, so the prediction cannot drift from what the backend allocates. Device-dependent choices
//! come in as [`ArchCaps`].

use crate::backend::cuda::abi::{alloc_size, elem_bytes, Act, Shape};
use crate::backend::cuda::host::attention_table::{node_table, terms, uploaded_len};
use crate::backend::cuda::host::catalogue::norm_load_twin;
use crate::backend::cuda::host::concat_split::{self, Part, Split};
use crate::backend::cuda::host::conv_kernel::{ArchCaps, ConvKernel};
use crate::backend::cuda::host::fusion::{
    concat_slice, consumers, fusable_activation, fusable_norm_head, fusable_residual, keeps_f32,
    recomputable_norm,
};
use crate::backend::cuda::host::launch::{Launch, NormHead};
use crate::backend::cuda::host::select::ConvGeom;
use crate::backend::cuda::host::tensor_layout::{
    aliases, is_standard, paths, tensor_supported, Paths, Stored,
};
use crate::backend::cuda::host::tile_stats;
use crate::backend::cuda::host::windowed::{self, Segments};
use crate::model::graph::{Graph, Op};
use crate::model::ops::Dims;
use crate::{Error, Result};

/// One constant upload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConstBuf {
    pub node: usize,
    pub bytes: usize,
    pub what: &'static str,
}

/// Everything `CudaBackend::prepare` allocates on the device for (graph, batch, roi).
#[derive(Clone, Debug, PartialEq)]
pub struct BufferPlan {
    pub batch: usize,
    pub roi: [usize; 3],
    /// Per-sample shapes of every value ([1, 1, 1, elements] for a value only the tensor path
    /// handles: any rank but 5, or a rank-5 value whose dim 0 is not the batch).
    pub shapes: Vec<Shape>,
    /// Dims of every value at the plan's batch (what the tensor path plans with).
    pub dims: Vec<Dims>,
    /// Per node: whether it runs on the tensor path (`tensor_layout::paths`).
    pub tensor: Vec<bool>,
    /// Per value: whether a rank-5 value is stored NDHWC (else row-major).
    pub ndhwc: Vec<bool>,
    /// Requested bytes of each fp16 activation buffer, allocation order. A buffer holds one
    /// value, or the values of one channel concat (its slices and output).
    pub bufs: Vec<usize>,
    /// Byte offset of each buffer in the one activation arena (multiples of [`ARENA_ALIGN`]);
    /// buffers whose lifetimes overlap never overlap in memory.
    pub offsets: Vec<usize>,
    /// Launch indices `[first, last]` during which each buffer is in use (`usize::MAX`: to the
    /// end, the graph output).
    pub lifetimes: Vec<(usize, usize)>,
    /// Bytes of the arena (what `prepare` allocates for all activations).
    pub arena: usize,
    /// The launches run one window at a time ([`windowed`]; none at batch 1 or where it would
    /// not lower the bytes live at once).
    pub windows: Segments,
    /// Per buffer, the bytes from one window's slice to the next where a window segment
    /// touches it and it holds the batch; 0 otherwise (a buffer of one window, or one only
    /// the batched launches touch).
    pub window_stride: Vec<usize>,
    /// Buffer holding each value (None: never materialised: fused, dead or not computed).
    pub value_buf: Vec<Option<usize>>,
    /// Values written in place into their concat's slice (the concat copies nothing for them).
    pub in_place: Vec<bool>,
    /// Values held in fp32 rather than fp16: conv outputs whose every reader is an
    /// InstanceNorm / GroupNorm ([`keeps_f32`]).
    pub f32_values: Vec<bool>,
    pub launches: Vec<Launch>,
    /// Constant uploads in the order the launch list makes them.
    pub consts: Vec<ConstBuf>,
    pub input_buf: usize,
    pub output_buf: usize,
    /// f32 NCDHW staging of the window batch in and out: allocated only by the single-window
    /// API (`Backend::run`) on its first call, not by `prepare` nor the streamed pipeline.
    pub stage_in: usize,
    pub stage_out: usize,
    /// Norm partial sums (also the fp32 partial sums of a split-K conv: the larger) and
    /// per-(sample, channel) scale/shift.
    pub norm_sums: usize,
    pub norm_ab: usize,
    /// Widest output channel count.
    pub cmax: usize,
}

impl BufferPlan {
    /// Value `v` as the kernels address it.
    pub fn stored(&self, v: usize) -> Stored {
        Stored {
            dims: self.dims[v],
            ndhwc: self.ndhwc[v],
        }
    }
    /// Activation arena bytes as requested (= `CudaBackend::activation_bytes()`).
    pub fn activation_bytes(&self) -> u64 {
        self.arena as u64
    }
    /// Activation arena bytes as allocated.
    pub fn activation_alloc(&self) -> u64 {
        alloc_size(self.arena)
    }
    /// Constant bytes as allocated.
    pub fn const_alloc(&self) -> u64 {
        self.consts.iter().map(|c| alloc_size(c.bytes)).sum()
    }
    /// Norm scratch bytes as allocated.
    pub fn scratch_alloc(&self) -> u64 {
        [self.norm_sums, self.norm_ab]
            .into_iter()
            .map(alloc_size)
            .sum()
    }
    /// The f32 in/out staging the single-window API adds on its first call.
    pub fn single_window_alloc(&self) -> u64 {
        alloc_size(self.stage_in) + alloc_size(self.stage_out)
    }
    /// Every device byte the prepared plan holds (the tracker's count after `prepare`).
    pub fn device_bytes(&self) -> u64 {
        self.activation_alloc() + self.const_alloc() + self.scratch_alloc()
    }
    /// The launch with the most activation bytes live (first on ties), if any.
    pub fn peak_launch(&self) -> Option<&Launch> {
        self.launches
            .iter()
            .fold(None, |best: Option<&Launch>, l| match best {
                Some(b) if b.live_bytes >= l.live_bytes => Some(b),
                _ => Some(l),
            })
    }
}

/// (bytes, buffers) in use at launch `t` by lifetimes `life`.
fn live_at(sizes: &[usize], life: &[(usize, usize)], t: usize) -> (usize, usize) {
    let live = (0..sizes.len()).filter(|&b| life[b].0 <= t && t <= life[b].1);
    live.fold((0, 0), |(by, k), b| (by + sizes[b], k + 1))
}

/// Alignment of every buffer's offset in the activation arena (what `cuMemAlloc` guarantees).
pub const ARENA_ALIGN: usize = 256;

/// Offsets in one arena for buffers of `sizes` used during launch intervals `life` (inclusive),
/// each buffer at the lowest aligned offset where it overlaps no placed buffer whose interval
/// meets its own. Returns the offsets and the arena size. Memory is then the peak of what is
/// live at once up to fragmentation, not the sum of every size a buffer ever had, as separate
/// allocations reused by liveness would cost. The placement order decides the fragmentation:
/// largest first is tried, then up to [`ARENA_TRIES`] seeded shuffles (fewer for long lists),
/// and the smallest arena wins. Largest-first alone left 128 MiB of holes in W1's decoder once
/// its norm inputs became fp32 (640 MiB for 512 live); a shuffle finds 512 about one time in
/// five.
pub fn arena_offsets(sizes: &[usize], life: &[(usize, usize)]) -> (Vec<usize>, usize) {
    let n = sizes.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&b| (std::cmp::Reverse(sizes[b]), life[b].0, b));
    let mut best = first_fit(sizes, life, &order);
    let tries = ((1usize << 26) / (n * n).max(1)).min(ARENA_TRIES);
    let mut rng = 0x5eed_u64;
    for _ in 0..tries {
        for i in (1..n).rev() {
            let j = crate::backend::cuda::lcg_next(&mut rng) as usize % (i + 1);
            order.swap(i, j);
        }
        let cand = first_fit(sizes, life, &order);
        if cand.1 < best.1 {
            best = cand;
        }
    }
    best
}

/// Most shuffled placement orders [`arena_offsets`] tries.
pub const ARENA_TRIES: usize = 64;

/// [`arena_offsets`] for one placement order.
fn first_fit(sizes: &[usize], life: &[(usize, usize)], order: &[usize]) -> (Vec<usize>, usize) {
    let al = |b: usize| b.max(1).div_ceil(ARENA_ALIGN) * ARENA_ALIGN;
    let mut offsets = vec![0usize; sizes.len()];
    let mut placed: Vec<usize> = Vec::new();
    let mut arena = 0;
    for &b in order {
        let meets = |o: usize| life[o].0 <= life[b].1 && life[b].0 <= life[o].1;
        let mut busy: Vec<(usize, usize)> = placed
            .iter()
            .filter(|&&o| meets(o))
            .map(|&o| (offsets[o], offsets[o] + al(sizes[o])))
            .collect();
        busy.sort_unstable();
        let mut at = 0;
        for (lo, hi) in busy {
            if lo >= at + al(sizes[b]) {
                break;
            }
            at = at.max(hi);
        }
        offsets[b] = at;
        arena = arena.max(at + al(sizes[b]));
        placed.push(b);
    }
    (offsets, arena)
}

/// The dims of every value at `batch` windows, given those at batch 1 (`dims1`) and which
/// nodes take the tensor path: every value a rank-5 kernel touches (and the graph's input and
/// output) must hold the batch as its axis 0, and no value may grow faster than the batch (a
/// buffer holds `batch` times its batch-1 elements). Exports whose batch `passes::batch` could
/// not free do not infer at batch 2 and are refused here (the planners cap them at 1).
fn batch_dims(
    graph: &Graph,
    roi: [usize; 3],
    batch: usize,
    dims1: Vec<Dims>,
    tensor: &[bool],
) -> Result<Vec<Dims>> {
    if batch == 1 {
        return Ok(dims1);
    }
    let dims = graph.infer_shapes(batch, roi).map_err(|e| {
        Error::Invalid(format!(
            "the graph does not run {batch} windows per call on CUDA: {e}"
        ))
    })?;
    let mut kernel = vec![false; dims.len()];
    kernel[graph.input] = true;
    kernel[graph.output] = true;
    for (n, _) in graph.nodes.iter().zip(tensor).filter(|(_, &t)| !t) {
        for &v in n.inputs.iter().chain([&n.output]) {
            kernel[v] = true;
        }
    }
    for (v, (d1, dn)) in dims1.iter().zip(&dims).enumerate() {
        let batched = dn.rank() == d1.rank()
            && dn[0] == batch * d1[0]
            && (1..d1.rank()).all(|a| dn[a] == d1[a]);
        if dn.numel() > batch * d1.numel() || (kernel[v] && !batched) {
            return Err(Error::Invalid(format!(
                "value \"{}\" is {d1:?} at batch 1 but {dn:?} at batch {batch}: the CUDA backend runs this graph one window per call",
                graph.values[v].name
            )));
        }
    }
    Ok(dims)
}

/// Per-sample shapes [C, D, H, W] of every value at window `roi` (the model's shape
/// inference at batch 1; `[1, 1, 1, elements]` for values only the tensor path handles), the
/// dims themselves, which nodes take the tensor path and how values are stored, after checking
/// the graph only asks for what the kernels implement.
pub fn cuda_shapes(graph: &Graph, roi: [usize; 3]) -> Result<(Vec<Shape>, Vec<Dims>, Paths)> {
    let dims = graph.infer_shapes(1, roi)?;
    let p = paths(graph, &dims);
    for (node, _) in graph.nodes.iter().zip(&p.tensor).filter(|(_, &t)| t) {
        let ins: Vec<Dims> = node.inputs.iter().map(|&v| dims[v]).collect();
        if let Op::Attention(a) = &node.op {
            let st: Vec<Stored> = node.inputs.iter().map(|&v| p.stored(v, dims[v])).collect();
            node_table(a, &st, p.ndhwc[node.output])
                .map_err(|e| Error::Graph(format!("node {} (Attention): {e}", node.name)))?;
        }
        if !tensor_supported(&node.op) {
            return Err(Error::Graph(format!(
                "node {} ({}): the CUDA backend runs it on NCDHW activations of batch 1 only, not on {ins:?}",
                node.name,
                node.op.name()
            )));
        }
    }
    for v in [graph.input, graph.output] {
        if !is_standard(&dims[v]) {
            return Err(Error::Graph(format!(
                "value \"{}\" has shape {:?} at batch 1; the CUDA backend needs an NCDHW input and output of the same batch",
                graph.values[v].name, dims[v]
            )));
        }
    }
    let shapes = dims
        .iter()
        .zip(&p.ndhwc)
        .map(|(d, &nd)| match d.ncdhw() {
            Some(s) if nd && is_standard(d) => [s[1], s[2], s[3], s[4]],
            _ => [1, 1, 1, d.numel()],
        })
        .collect();
    Ok((shapes, dims, p))
}

fn numel(s: &Shape) -> usize {
    s.iter().product()
}

/// The buffers being placed: requested bytes, launch lifetimes, the freed ones.
#[derive(Default)]
struct Buffers {
    bufs: Vec<usize>,
    /// `life[b]` = launches [first, last] buffer b is in use.
    life: Vec<(usize, usize)>,
    free: Vec<usize>,
}

impl Buffers {
    fn alloc(&mut self, bytes: usize, at: usize) -> usize {
        self.bufs.push(bytes);
        self.life.push((at, usize::MAX));
        self.bufs.len() - 1
    }
}

/// What the walk over the nodes has built so far.
struct Walk<'g> {
    graph: &'g Graph,
    batch: usize,
    shapes: Vec<Shape>,
    /// Every value as stored.
    stored: Vec<Stored>,
    tensor: Vec<bool>,
    cons: Vec<Vec<usize>>,
    b: Buffers,
    /// live[v]: the buffer of a value not yet released; value_buf keeps it for the launches.
    live: Vec<Option<usize>>,
    value_buf: Vec<Option<usize>>,
    in_place: Vec<bool>,
    concat_buf: Vec<Option<usize>>,
    /// Per node: a conv that runs split ([`concat_split`]), and whether a concat is one such
    /// conv's (never written).
    splits: Vec<Option<Split>>,
    split_concat: Vec<bool>,
    launches: Vec<Launch>,
    consts: Vec<ConstBuf>,
    norm_part: usize,
    /// Per node: launched, or fused into a launch, so far.
    ran: Vec<bool>,
}

impl Walk<'_> {
    /// Buffer, channel stride and offset of node `i`'s output `out_v` of `elem` bytes an
    /// element: a slice of the concat it feeds (the concat's buffer made at its first producer),
    /// the concat's own buffer, or a new one.
    fn place(
        &mut self,
        i: usize,
        out_v: usize,
        oshape: Shape,
        elem: usize,
    ) -> (usize, usize, usize) {
        let graph = self.graph;
        let target = match &graph.nodes[i].op {
            _ if self.tensor[i] => None,
            Op::Conv(_) | Op::ConvTranspose(_) | Op::Add | Op::Mul | Op::Sub | Op::Div => {
                concat_slice(graph, &self.cons, &self.shapes, out_v)
                    .filter(|&(j, _, _)| !self.tensor[j] && !self.split_concat[j])
            }
            _ => None,
        };
        let at = self.launches.len();
        if let Some((j, coff, ctot)) = target {
            let cb = match self.concat_buf[j] {
                Some(b) => b,
                None => {
                    let cs = self.shapes[graph.nodes[j].output];
                    let b = self.b.alloc(self.batch * numel(&cs) * 2, at);
                    self.concat_buf[j] = Some(b);
                    b
                }
            };
            self.in_place[out_v] = true;
            (cb, ctot, coff)
        } else if let Some(b) = self.concat_buf[i] {
            (b, oshape[0], 0)
        } else {
            (
                self.b.alloc(self.batch * numel(&oshape) * elem, at),
                oshape[0],
                0,
            )
        }
    }

    /// The geometry of conv / transposed conv node `i` (None for other ops).
    fn conv_geom(&self, i: usize) -> Option<ConvGeom> {
        let node = &self.graph.nodes[i];
        let (xs, os) = (self.shapes[node.inputs[0]], self.shapes[node.output]);
        ConvGeom::of(&node.op, xs, os)
    }

    /// The head that norm node `i` (output `out_v` after its activation) hands its input to,
    /// where that head runs on the pointwise kernel, or (`caps.norm_load_conv`) on a z-pair
    /// kernel's `_nl` twin, which it then runs on (the norm's input stored NDHWC, not in a
    /// concat slice, the conv not split): its constants listed (after the norm's), it and its
    /// own activation marked as run.
    fn norm_head(&mut self, caps: &ArchCaps, i: usize, out_v: usize) -> Option<NormHead> {
        let (j, kernel) = self.head_kernel(caps, i, out_v)?;
        let fuse = fusable_activation(self.graph, &self.cons, j);
        let act = fuse.map_or(Act::None, |f| {
            Act::of(&self.graph.nodes[f].op).unwrap_or(Act::None)
        });
        self.node_consts(caps, j, &act);
        self.ran[j] = true;
        if let Some(f) = fuse {
            self.ran[f] = true;
        }
        Some(NormHead {
            conv: j,
            fuse,
            kernel,
        })
    }

    /// [`norm_head`](Self::norm_head)'s conv node and kernel, nothing listed or marked.
    fn head_kernel(&self, caps: &ArchCaps, i: usize, out_v: usize) -> Option<(usize, ConvKernel)> {
        let j = fusable_norm_head(self.graph, &self.cons, &self.tensor, i, out_v)?;
        let kernel = match ConvKernel::choose(caps, self.batch, &self.conv_geom(j)?) {
            k @ ConvKernel::Pointwise { .. } => k,
            ConvKernel::Halo(c) if caps.norm_load_conv => {
                let x = self.graph.nodes[i].inputs[0];
                let plain = self.stored[x].ndhwc && !self.in_place[x] && self.splits[j].is_none();
                ConvKernel::Halo(norm_load_twin(c).filter(|_| plain)?)
            }
            _ => return None,
        };
        Some((j, kernel))
    }

    /// The norm node that runs Cin-1 conv node `i` itself (`caps.norm_recompute`, see
    /// [`Launch::recompute`]): [`recomputable_norm`], the conv on `conv_c1_k3` with a statistics
    /// twin for its output, and no residual Add or head after the norm (its activation), which
    /// the recomputing kernel neither adds nor hands on. Returns the norm and the conv's kernel.
    fn recompute_norm(&self, caps: &ArchCaps, i: usize) -> Option<(usize, ConvKernel)> {
        if !(caps.norm_recompute && caps.norm_stats) || self.splits[i].is_some() {
            return None;
        }
        let graph = self.graph;
        let j = recomputable_norm(graph, &self.cons, &self.tensor, i)?;
        let k = ConvKernel::choose(caps, self.batch, &self.conv_geom(i)?);
        let os = self.shapes[graph.nodes[i].output];
        let twin = matches!(k, ConvKernel::Cin1 { stats: false })
            && k.with_norm_stats(os, os[0], 0).is_some();
        let last = fusable_activation(graph, &self.cons, j).unwrap_or(j);
        let out_v = graph.nodes[last].output;
        let residual = caps.norm_residual
            && fusable_residual(
                graph,
                &self.cons,
                &self.shapes,
                &self.tensor,
                (j, last),
                |_| true,
            )
            .is_some();
        let head = caps.norm_head && self.head_kernel(caps, j, out_v).is_some();
        (twin && !residual && !head).then_some((j, k))
    }

    /// Node `i`'s constant uploads, in the order the launch list makes them, and its conv
    /// kernel.
    fn node_consts(&mut self, caps: &ArchCaps, i: usize, act: &Act) -> Option<ConvKernel> {
        let node = &self.graph.nodes[i];
        let xshape = self.shapes[node.inputs[0]];
        let oshape = self.shapes[node.output];
        let kernel = self
            .conv_geom(i)
            .map(|g| ConvKernel::choose(caps, self.batch, &g));
        let f32s = |n: usize| n * 4;
        let consts = &mut self.consts;
        let mut push = |bytes: usize, what: &'static str| {
            consts.push(ConstBuf {
                node: i,
                bytes,
                what,
            })
        };
        if let Act::PRelu(s) = act {
            push(f32s(s.len()), "fused PRelu slope");
        }
        let mut conv = None;
        match &node.op {
            Op::Conv(_) | Op::ConvTranspose(_) => {
                let k = kernel.expect("a conv has a geometry");
                self.conv_consts(i, &k, None);
                conv = Some(k);
            }
            Op::InstanceNorm { scale, bias, .. } | Op::GroupNorm { scale, bias, .. } => {
                let pix = oshape[1] * oshape[2] * oshape[3];
                self.norm_part = self.norm_part.max(caps.norm_blocks(pix) * xshape[0]);
                push(f32s(scale.len()), "norm scale");
                push(f32s(bias.len()), "norm bias");
            }
            Op::ChannelAffine { scale, .. } => push(f32s(2 * scale.len()), "affine scale/shift"),
            Op::PRelu { slope } => push(f32s(slope.len()), "PRelu slope"),
            Op::AddConst(t) | Op::MulConst(t) => push(f32s(t.len()), "broadcast constant"),
            Op::Linear(l) => {
                push(l.weight.len() * 2, "linear weight (fp16)");
                if let Some(b) = &l.bias {
                    push(f32s(b.len()), "linear bias");
                }
            }
            Op::Attention(a) => {
                let st: Vec<Stored> = node.inputs.iter().map(|&v| self.stored[v]).collect();
                // `cuda_shapes` checked the table builds.
                let rows =
                    node_table(a, &st, self.stored[node.output].ndhwc).map_or(0, |t| t.offs.len());
                push(rows * 8, "attention offset table (i64)");
                let what = ["attention bias (fp32)", "attention mask (fp32)"];
                for (b, what) in terms(a).into_iter().zip(what) {
                    if let Some(b) = b {
                        push(f32s(uploaded_len(b)), what);
                    }
                }
            }
            Op::LayerNorm(l) => {
                push(f32s(l.scale.len()), "layer norm scale");
                if let Some(b) = &l.bias {
                    push(f32s(b.len()), "layer norm bias");
                }
            }
            _ => {}
        }
        conv
    }

    /// The bias and re-laid weight uploads of conv node `i` on kernel `k`; with `part`, of that
    /// part's slice of the weights ([`concat_split`]), the bias only where it does not add to
    /// an earlier part's output.
    fn conv_consts(&mut self, i: usize, k: &ConvKernel, part: Option<&Part>) {
        let node = &self.graph.nodes[i];
        let (weight, b, groups, t) = match &node.op {
            Op::Conv(c) => (&c.weight, &c.bias, c.groups, false),
            Op::ConvTranspose(c) => (&c.weight, &c.bias, c.groups, true),
            _ => return,
        };
        let mut wshape = weight.shape.clone();
        if let Some(p) = part {
            wshape[1] = p.cin;
        }
        let mut push = |bytes: usize, what: &'static str| {
            self.consts.push(ConstBuf {
                node: i,
                bytes,
                what,
            })
        };
        if let Some(b) = b.as_ref().filter(|_| part.is_none_or(|p| !p.accumulate)) {
            let what = if t {
                "transposed conv bias"
            } else {
                "conv bias"
            };
            push(b.len() * 4, what);
        }
        for h in k.weight_halves(&wshape, groups, t) {
            let what = if t {
                "transposed conv weight (fp16 GEMM operand)"
            } else {
                "conv weight (fp16 GEMM operand)"
            };
            push(h * 2, what);
        }
    }

    /// Conv node `i` run split ([`concat_split`]): one launch per part into one fp32 output
    /// buffer, the first writing it, the later ones adding to it; then the concat it reads in
    /// place of its input (if any) counts as run, and what it read is released where nothing
    /// else reads it.
    fn split_conv(&mut self, i: usize, s: &Split) {
        let out_v = self.graph.nodes[i].output;
        let oshape = self.shapes[out_v];
        let (ob, ldc, coff) = self.place(i, out_v, oshape, elem_bytes(true));
        self.live[out_v] = Some(ob);
        self.value_buf[out_v] = Some(ob);
        for (part, kernel) in &s.parts {
            self.conv_consts(i, kernel, Some(part));
            let (live_bytes, live_bufs) = live_at(&self.b.bufs, &self.b.life, self.launches.len());
            self.launches.push(Launch {
                node: i,
                fuse: None,
                residual: None,
                head: None,
                recompute: None,
                part: Some(*part),
                out_v,
                out_buf: ob,
                ldc,
                coff,
                conv: Some(kernel.clone()),
                tile_stats: None,
                shifted: None,
                live_bytes,
                live_bufs,
            });
        }
        self.ran[i] = true;
        if let Some(c) = s.concat {
            self.ran[c] = true;
            self.release_read(c, out_v, None);
        }
        self.release_read(i, out_v, None);
    }

    /// Releases the inputs of node `i` and the residual `r` of its launch, where every node
    /// that reads them has run (`ran`: in an earlier launch, or fused into this one). A node
    /// between a producer and the activation fused into it may still read them.
    fn release_read(&mut self, i: usize, out_v: usize, r: Option<usize>) {
        let node = &self.graph.nodes[i];
        for v in node.inputs.iter().copied().chain(r) {
            let read = self.cons[v].iter().all(|&k| self.ran[k]);
            if read && v != out_v && v != self.graph.output {
                self.release(v);
            }
        }
    }

    /// Frees value `v`'s buffer at the last launch, unless another live value holds it.
    fn release(&mut self, v: usize) {
        if let Some(b) = self.live[v].take() {
            if !self.live.contains(&Some(b)) && !self.b.free.contains(&b) {
                self.b.free.push(b);
                self.b.life[b].1 = self.launches.len() - 1;
            }
        }
    }
}

/// The buffer plan of `graph` for `batch` windows of `roi` on a device with `caps`: fp16 NDHWC
/// activations (fp32 where [`keeps_f32`] says so and `caps.norm_f32`), a following activation fused into conv / norm / affine epilogues, a conv's
/// residual Add fused into its epilogue ([`fusable_residual`], on kernels that add one) and a
/// norm's into its affine pass (`caps.norm_residual`), a norm's
/// pointwise head (or `_nl` z-pair conv) run on the norm's input ([`fusable_norm_head`]: the
/// norm's output never exists), a Cin-1 conv run by the norm after it (`caps.norm_recompute`,
/// [`Launch::recompute`]: the conv's output never exists), convs and
/// binaries whose only consumer is a channel concat written into its slice (the concat's buffer
/// taken at its first producer), every other output in a buffer of its own, inputs freed after
/// their last reader (after the output is placed, so no kernel reads and writes one buffer);
/// then every buffer gets an offset in one arena by [`arena_offsets`] over those lifetimes. At
/// batch > 1 the full-resolution ends of the list may run one window at a time
/// ([`windowed`]): kept where that makes fewer bytes live at once.
pub fn buffer_plan(
    graph: &Graph,
    batch: usize,
    roi: [usize; 3],
    caps: &ArchCaps,
) -> Result<BufferPlan> {
    if batch == 0 || roi.contains(&0) {
        return Err(Error::Invalid(format!(
            "batch {batch} and window {roi:?} must be non-zero"
        )));
    }
    let (shapes, dims1, Paths { tensor, ndhwc }) = cuda_shapes(graph, roi)?;
    let dims = batch_dims(graph, roi, batch, dims1, &tensor)?;
    let stored: Vec<Stored> = dims
        .iter()
        .zip(&ndhwc)
        .map(|(&dims, &ndhwc)| Stored { dims, ndhwc })
        .collect();
    let nv = graph.values.len();
    let in_shape = shapes[graph.input];
    let cons = consumers(graph);
    let splits = concat_split::splits(graph, &cons, &shapes, &tensor, &ndhwc, caps, batch);
    let mut split_concat = vec![false; graph.nodes.len()];
    for c in splits.iter().flatten().filter_map(|s| s.concat) {
        split_concat[c] = true;
    }
    let mut w = Walk {
        graph,
        batch,
        cons,
        shapes,
        stored: stored.clone(),
        tensor,
        b: Buffers::default(),
        live: vec![None; nv],
        value_buf: vec![None; nv],
        in_place: vec![false; nv],
        concat_buf: vec![None; graph.nodes.len()],
        splits,
        split_concat,
        launches: Vec::new(),
        consts: Vec::new(),
        norm_part: 0,
        ran: vec![false; graph.nodes.len()],
    };
    let input_buf = w.b.alloc(batch * numel(&in_shape) * 2, 0);
    w.live[graph.input] = Some(input_buf);
    w.value_buf[graph.input] = Some(input_buf);
    let mut f32_values = vec![false; nv];
    let mut cmax = 1;
    for (i, node) in graph.nodes.iter().enumerate() {
        if w.ran[i] {
            continue;
        }
        // A Cin-1 conv its norm runs (`Launch::recompute`): this is the norm's launch.
        let (i, node, recompute, recomputed) = match w.recompute_norm(caps, i) {
            Some((j, k)) => (j, &graph.nodes[j], Some(i), Some(k)),
            None => (i, node, None, None),
        };
        // A split conv reads its concat's inputs, not the concat (which runs with it); a
        // recomputing norm the conv's.
        let reads = match (recompute, w.splits[i].as_ref().and_then(|s| s.concat)) {
            (Some(c), _) | (None, Some(c)) => &graph.nodes[c].inputs,
            (None, None) => &node.inputs,
        };
        if let Some(&v) = reads.iter().find(|&&v| w.live[v].is_none()) {
            return Err(Error::Graph(format!(
                "node {}: input value {v} was never computed",
                node.name
            )));
        }
        if w.split_concat[i] {
            continue;
        }
        if let Some(s) = w.splits[i].clone() {
            cmax = cmax.max(w.shapes[node.output][0]);
            f32_values[node.output] = true;
            w.split_conv(i, &s);
            continue;
        }
        let fuse = match &node.op {
            Op::Conv(_)
            | Op::ConvTranspose(_)
            | Op::InstanceNorm { .. }
            | Op::GroupNorm { .. }
            | Op::ChannelAffine { .. } => fusable_activation(graph, &w.cons, i),
            _ => None,
        };
        let (act, mut out_v) = match fuse {
            Some(j) => {
                w.ran[j] = true;
                (
                    Act::of(&graph.nodes[j].op).unwrap_or(Act::None),
                    graph.nodes[j].output,
                )
            }
            None => (Act::None, node.output),
        };
        cmax = cmax.max(w.shapes[node.output][0]);
        // The recomputed conv's constants come first (its launch builds the conv first).
        if let (Some(c), Some(k)) = (recompute, &recomputed) {
            w.conv_consts(c, k, None);
        }
        let conv = w.node_consts(caps, i, &act);
        // The Add after a conv whose kernel adds a residual (no activation), or after a norm
        // (and its activation): the affine pass adds it.
        let ready = |r: usize| w.live[r].is_some() && w.stored[r].ndhwc && !f32_values[r];
        let norm = matches!(node.op, Op::InstanceNorm { .. } | Op::GroupNorm { .. });
        let residual = match &conv {
            Some(k) if fuse.is_none() && k.adds_residual() => {
                fusable_residual(graph, &w.cons, &w.shapes, &w.tensor, (i, i), ready)
            }
            None if norm && caps.norm_residual => fusable_residual(
                graph,
                &w.cons,
                &w.shapes,
                &w.tensor,
                (i, fuse.unwrap_or(i)),
                ready,
            ),
            _ => None,
        };
        if let Some((j, _)) = residual {
            w.ran[j] = true;
            out_v = graph.nodes[j].output;
        }
        // (A norm whose Add is fused has no head: the Add's output is what a head would read.)
        let head = if caps.norm_head && residual.is_none() {
            w.norm_head(caps, i, out_v)
        } else {
            None
        };
        if let Some(h) = &head {
            out_v = graph.nodes[h.fuse.unwrap_or(h.conv)].output;
        }
        let oshape = w.shapes[out_v];
        cmax = cmax.max(oshape[0]);
        // A head writes its conv's output (fp32 where only norms read it, as the conv would).
        let (wi, wk) = match &head {
            Some(h) => (h.conv, Some(&h.kernel)),
            None => (i, conv.as_ref()),
        };
        let f32_out = caps.norm_f32 && keeps_f32(graph, &w.cons, &w.tensor, wi, out_v, wk);
        f32_values[out_v] = f32_out;
        let (ob, ldc, coff) = if aliases(graph, &stored, i) {
            let b = w.live[node.inputs[0]].expect("checked live above");
            (b, oshape[0], 0)
        } else {
            w.place(i, out_v, oshape, elem_bytes(f32_out))
        };
        w.live[out_v] = Some(ob);
        w.value_buf[out_v] = Some(ob);
        // Buffers not freed: every lifetime that has not ended before this launch.
        let (live_bytes, live_bufs) = live_at(&w.b.bufs, &w.b.life, w.launches.len());
        w.launches.push(Launch {
            node: i,
            fuse,
            residual,
            head,
            recompute,
            part: None,
            out_v,
            out_buf: ob,
            ldc,
            coff,
            conv: conv.or(recomputed),
            tile_stats: None,
            shifted: None,
            live_bytes,
            live_bufs,
        });
        w.ran[i] = true;
        if let Some(c) = recompute {
            w.ran[c] = true;
            w.release_read(c, out_v, None);
        }
        w.release_read(i, out_v, residual.map(|(_, r)| r));
    }
    let output_buf = w.value_buf[graph.output]
        .ok_or_else(|| Error::Graph("the graph output is never computed".into()))?;
    let out_shape = w.shapes[graph.output];
    let (mut bufs, mut life) = (w.b.bufs, w.b.life);
    let n = w.launches.len();
    let mut windows = Segments { pre: 0, post: n };
    let mut window_stride = vec![0; bufs.len()];
    if caps.window_segments && batch > 1 {
        let voxels = |v: usize| w.shapes[v][1..].iter().product::<usize>();
        let spatial: Vec<usize> = w.launches.iter().map(|l| voxels(l.out_v)).collect();
        let out_launch = w.launches.iter().position(|l| l.out_v == graph.output);
        let nodes: Vec<Vec<usize>> = w.launches.iter().map(Launch::nodes).collect();
        let reads: Vec<Vec<usize>> = w.launches.iter().map(|l| l.reads(graph)).collect();
        let seg = windowed::segments(
            graph,
            &w.tensor,
            &nodes,
            &spatial,
            roi.iter().product(),
            out_launch,
        );
        if seg.any(n) {
            let out_bufs: Vec<usize> = w.launches.iter().map(|l| l.out_buf).collect();
            let touched = windowed::touched(&reads, &out_bufs, &w.value_buf, bufs.len());
            let (mut sizes, mut lf) = (bufs.clone(), life.clone());
            let stride = windowed::adjust(
                seg,
                n,
                batch,
                &touched,
                [input_buf, output_buf],
                &mut sizes,
                &mut lf,
            );
            // Judged by the bytes live at once (what the arena comes to, up to holes), so the
            // arena is placed once.
            let peak = |sizes: &[usize], life: &[(usize, usize)]| {
                (0..n).map(|t| live_at(sizes, life, t).0).max().unwrap_or(0)
            };
            if peak(&sizes, &lf) < peak(&bufs, &life) {
                (bufs, life) = (sizes, lf);
                (windows, window_stride) = (seg, stride);
                for (t, l) in w.launches.iter_mut().enumerate() {
                    (l.live_bytes, l.live_bufs) = live_at(&bufs, &life, t);
                }
            }
        }
    }
    let (offsets, arena) = arena_offsets(&bufs, &life);
    let stat_bytes = if caps.norm_stats {
        let shapes = &w.shapes;
        tile_stats::pair(
            caps,
            graph,
            &w.cons,
            shapes,
            &w.tensor,
            &mut w.launches,
            &windows,
            batch,
        )
    } else {
        0
    };
    // The scratch also holds a split-K conv's partial sums and a conv's tile statistics for
    // the norm after it (one launch at a time).
    let split = w
        .launches
        .iter()
        .filter_map(|l| {
            let o = w.shapes[graph.nodes[l.node].output];
            let rows = batch * o[1] * o[2] * o[3];
            l.conv.as_ref().map(|k| k.partial_bytes(rows, o[0]))
        })
        .max()
        .unwrap_or(0);
    Ok(BufferPlan {
        batch,
        roi,
        bufs,
        offsets,
        lifetimes: life,
        arena,
        windows,
        window_stride,
        value_buf: w.value_buf,
        in_place: w.in_place,
        f32_values,
        launches: w.launches,
        consts: w.consts,
        input_buf,
        output_buf,
        stage_in: batch * numel(&in_shape) * 4,
        stage_out: batch * numel(&out_shape) * 4,
        norm_sums: (batch * w.norm_part.max(cmax) * 2 * 4)
            .max(split)
            .max(stat_bytes),
        norm_ab: batch * cmax * 2 * 4,
        cmax,
        shapes: w.shapes,
        dims,
        tensor: w.tensor,
        ndhwc,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_floor() {
        assert_eq!(alloc_size(0), 256);
        assert_eq!(alloc_size(255), 256);
        assert_eq!(alloc_size(257), 257);
    }

    #[test]
    fn arena_offsets_never_overlap_live_buffers() {
        let mut rng = 99u64;
        let mut next = |m: usize| crate::backend::cuda::lcg_next(&mut rng) as usize % m;
        for _ in 0..200 {
            let n = 1 + next(30);
            let sizes: Vec<usize> = (0..n).map(|_| 1 + next(5000)).collect();
            let life: Vec<(usize, usize)> = (0..n)
                .map(|_| {
                    let a = next(20);
                    (
                        a,
                        if next(8) == 0 {
                            usize::MAX
                        } else {
                            a + next(6)
                        },
                    )
                })
                .collect();
            let (off, arena) = arena_offsets(&sizes, &life);
            let al = |b: usize| b.div_ceil(ARENA_ALIGN) * ARENA_ALIGN;
            for a in 0..n {
                assert_eq!(off[a] % ARENA_ALIGN, 0);
                assert!(off[a] + sizes[a] <= arena);
                for b in 0..a {
                    let meet = life[a].0 <= life[b].1 && life[b].0 <= life[a].1;
                    let share = off[a] < off[b] + sizes[b] && off[b] < off[a] + sizes[a];
                    assert!(!(meet && share), "{a} and {b} overlap");
                }
            }
            let peak = (0..30)
                .map(|t| {
                    (0..n)
                        .filter(|&b| life[b].0 <= t && t <= life[b].1)
                        .map(|b| al(sizes[b]))
                        .sum::<usize>()
                })
                .max()
                .unwrap();
            assert!(arena >= peak);
        }
        let sizes = [4096usize, 1024, 8192, 512, 2048];
        let life: Vec<(usize, usize)> = (0..5).map(|i| (i, i + 1)).collect();
        assert_eq!(arena_offsets(&sizes, &life).1, 1024 + 8192);
    }
}
