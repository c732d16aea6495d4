//! The CUDA backend's buffer plan, host only: which fp16 activation buffers exist and their
//! bytes, which launch writes which buffer, the kernel of every conv and the constants it
//! uploads (re-laid fp16 GEMM operands with their padding, biases, norm parameters...), the
//! per-plan norm scratch, and where each buffer sits in the one activation arena.
//! `CudaBackend::prepare` allocates exactly this list and the memory planner (`crate::plan`) sums
//! it, so the prediction cannot drift from what the backend allocates. Device-dependent choices
//! come in as [`ArchCaps`].

use super::plan::{
    concat_slice, consumers, fusable_activation, gather_width, infer_shapes, is_upsampling_convt,
    parity_split, pick_halo, pick_mma, Act, HaloConfig, MmaConfig, ParityClass, Shape, MMA_CONFIGS,
    MMA_N_PAD,
};
use crate::model::graph::{Graph, Op};
use crate::{Error, Result};

/// Every device allocation of the backend takes at least this many bytes (the tracker counts
/// `max(bytes, ALLOC_FLOOR)`, as `DevBuf` allocates).
pub const ALLOC_FLOOR: usize = 256;

/// Bytes one allocation of `bytes` takes.
pub fn alloc_size(bytes: usize) -> u64 {
    bytes.max(ALLOC_FLOOR) as u64
}

/// Device properties and backend switches the launch list depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArchCaps {
    /// Compute capability as major * 10 + minor (90 for sm_90).
    pub sm: u32,
    pub sm_count: usize,
    /// Opt-in shared memory per block (bytes): which halo kernels fit.
    pub smem_optin: usize,
    /// mma.sync conv kernels (sm_80+ unless the legacy wmma path is asked for).
    pub conv_mma: bool,
    /// Stride-1 3^3 convs with Cin 16, 32, 64 or a multiple of 32 (even Cin 10..14 zero-padded
    /// to 16) on `conv_halo_*` (plan::pick_halo).
    pub conv_halo: bool,
    /// Cin-1 3^3 convs (stride 1/2, Cout <= 64) on `conv_c1_k3` (unless a tile is forced).
    pub conv_c1: bool,
    /// kernel == stride transposed convs with Cin, Cout % 8 == 0 on `convt_up_*` (16-byte
    /// staged epilogue) instead of the `conv_mma_*` scatter epilogue.
    pub conv_up_vec: bool,
    /// A forced `conv_mma_*` tile (tests, benchmarks).
    pub conv_tile: Option<&'static str>,
    /// A forced `conv_halo_*` kernel (benchmarks).
    pub halo_tile: Option<&'static str>,
}

impl ArchCaps {
    /// The defaults of a device of compute capability `major.minor`.
    pub fn new(major: u32, minor: u32, sm_count: usize, smem_optin: usize) -> Self {
        ArchCaps {
            sm: major * 10 + minor,
            sm_count,
            smem_optin,
            conv_mma: major >= 8,
            conv_halo: true,
            conv_c1: true,
            conv_up_vec: true,
            conv_tile: None,
            halo_tile: None,
        }
    }

    /// An H200 (sm_90, 132 SMs, 227 KiB opt-in shared memory): what the planner assumes when
    /// the target device is not known.
    pub fn h200() -> Self {
        ArchCaps::new(9, 0, 132, 227 * 1024)
    }

    /// The mma tile for a GEMM of `m` rows, `n` columns (a forced tile unless its gather width
    /// does not divide `vw`).
    pub fn mma_tile(&self, m: usize, n: usize, vw: usize) -> &'static MmaConfig {
        if let Some(c) = self
            .conv_tile
            .and_then(|name| MMA_CONFIGS.iter().find(|c| c.name == name))
        {
            if vw.is_multiple_of(c.vw) {
                return c;
            }
        }
        pick_mma(m, n, vw, self.sm_count)
    }

    /// Blocks per sample of the norm statistics: >= 256 pixels each, at most 2 per SM.
    pub fn norm_blocks(&self, pix: usize) -> usize {
        pix.div_ceil(256).clamp(1, 2 * self.sm_count.max(1))
    }
}

/// How one conv / transposed conv runs; fixes its weight layout (and so its bytes).
#[derive(Clone)]
pub enum ConvKernel {
    /// A strided transposed conv as one dense mma GEMM per output parity class.
    Parity(Vec<(ParityClass, &'static MmaConfig)>),
    /// 1x1x1 conv with few outputs, one thread per voxel (`conv1x1_n16` / `_n32`).
    Pointwise {
        nc: usize,
    },
    Halo(&'static HaloConfig),
    /// kernel == stride transposed conv as a GEMM with a scatter epilogue.
    Upsample(&'static MmaConfig),
    /// The same GEMM and weights on `convt_up_*` (the tile's 16-byte staged epilogue).
    UpsampleVec(&'static MmaConfig),
    /// Cin-1 3^3 conv on `conv_c1_k3` (mma weight layout).
    Cin1,
    Mma(&'static MmaConfig),
    /// The wmma implicit GEMM (`conv_igemm_*`) or, for grouped convs, `conv_direct`.
    Legacy {
        func: &'static str,
        bn: usize,
    },
}

/// Shape facts of one conv node the kernel choice needs.
#[derive(Clone, Copy, Debug)]
pub struct ConvGeom {
    pub xs: Shape,
    pub os: Shape,
    pub k: [usize; 3],
    pub stride: [usize; 3],
    pub dil: [usize; 3],
    /// Begin pads.
    pub pads: [usize; 3],
    pub groups: usize,
    pub transposed: bool,
    pub upsample: bool,
}

impl ConvKernel {
    /// Kernel name of each launch (one per parity class, else one).
    pub fn funcs(&self) -> Vec<&'static str> {
        match self {
            ConvKernel::Parity(cl) => cl.iter().map(|(_, c)| c.name).collect(),
            ConvKernel::Pointwise { nc: 16 } => vec!["conv1x1_n16"],
            ConvKernel::Pointwise { .. } => vec!["conv1x1_n32"],
            ConvKernel::Halo(c) => vec![c.name],
            ConvKernel::Upsample(c) | ConvKernel::Mma(c) => vec![c.name],
            ConvKernel::UpsampleVec(c) => vec![upsample_vec_name(c.name).unwrap_or(c.name)],
            ConvKernel::Cin1 => vec!["conv_c1_k3"],
            ConvKernel::Legacy { func, .. } => vec![func],
        }
    }
}

/// `conv_mma_*` tile -> its `convt_up_*` twin (same tile and shared memory, staged epilogue).
pub const UPSAMPLE_VEC: &[(&str, &str)] = &[
    ("conv_mma_m256n32_v8", "convt_up_m256n32_v8"),
    ("conv_mma_m128n32_v8", "convt_up_m128n32_v8"),
    ("conv_mma_m128n64_v8", "convt_up_m128n64_v8"),
    ("conv_mma_m128n128_v8", "convt_up_m128n128_v8"),
];

/// The `convt_up_*` twin of an mma tile, if it has one.
pub fn upsample_vec_name(mma: &str) -> Option<&'static str> {
    UPSAMPLE_VEC
        .iter()
        .find(|(m, _)| *m == mma)
        .map(|(_, u)| *u)
}

impl std::fmt::Debug for ConvKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            ConvKernel::Parity(_) => "Parity",
            ConvKernel::Pointwise { .. } => "Pointwise",
            ConvKernel::Halo(_) => "Halo",
            ConvKernel::Upsample(_) => "Upsample",
            ConvKernel::UpsampleVec(_) => "UpsampleVec",
            ConvKernel::Cin1 => "Cin1",
            ConvKernel::Mma(_) => "Mma",
            ConvKernel::Legacy { .. } => "Legacy",
        };
        write!(f, "{kind}{:?}", self.funcs())
    }
}

impl PartialEq for ConvKernel {
    fn eq(&self, o: &Self) -> bool {
        let classes = |k: &ConvKernel| match k {
            ConvKernel::Parity(c) => c.iter().map(|(cl, _)| cl.clone()).collect(),
            _ => Vec::new(),
        };
        std::mem::discriminant(self) == std::mem::discriminant(o)
            && self.funcs() == o.funcs()
            && classes(self) == classes(o)
    }
}

fn kpad(k: usize) -> usize {
    k.div_ceil(32) * 32
}

impl ConvKernel {
    /// Picks the kernel of a conv for `batch` windows, as the launch list runs it.
    pub fn choose(caps: &ArchCaps, batch: usize, g: &ConvGeom) -> ConvKernel {
        let (xs, os) = (g.xs, g.os);
        let cout = os[0];
        let cin = xs[0];
        let direct = g.groups != 1;
        let vw = gather_width(cin);
        let osp = [os[1], os[2], os[3]];
        // GEMM rows: output voxels, or input voxels for the upsampling transposed conv.
        let rows = batch
            * if g.upsample {
                xs[1] * xs[2] * xs[3]
            } else {
                os[1] * os[2] * os[3]
            };
        // The mma kernels index rows with 32-bit ints; the wmma kernel handles the rest.
        let mma = caps.conv_mma && !direct && (!g.transposed || g.upsample) && rows < (1 << 31);
        if caps.conv_mma && !direct && g.transposed && !g.upsample && g.dil == [1; 3] {
            if let Some(classes) = parity_split(g.k, g.stride, g.pads, osp) {
                let rows_of = |cl: &ParityClass| batch * cl.grid.iter().product::<usize>();
                if !classes.is_empty() && classes.iter().all(|cl| rows_of(cl) < 1 << 31) {
                    return ConvKernel::Parity(
                        classes
                            .into_iter()
                            .map(|cl| {
                                let t = caps.mma_tile(rows_of(&cl), cout, vw);
                                (cl, t)
                            })
                            .collect(),
                    );
                }
            }
        }
        if caps.conv_mma
            && !direct
            && !g.transposed
            && g.k == [1; 3]
            && g.stride == [1; 3]
            && g.pads == [0; 3]
            && osp == [xs[1], xs[2], xs[3]]
            && cin % 8 == 0
            && cin <= 256
            && cout <= 32
        {
            return ConvKernel::Pointwise {
                nc: if cout <= 16 { 16 } else { 32 },
            };
        }
        // (A forced mma tile keeps Cin-1 convs on that tile, as it does the halo convs.)
        if mma
            && caps.conv_c1
            && caps.conv_tile.is_none()
            && !g.transposed
            && cin == 1
            && cout <= 64
            && g.k == [3; 3]
            && g.dil == [1; 3]
            && g.stride.iter().all(|&s| s == 1 || s == 2)
        {
            return ConvKernel::Cin1;
        }
        if mma && !g.upsample && caps.conv_halo && caps.conv_tile.is_none() {
            if let Some(c) = pick_halo(
                cin,
                cout,
                g.k,
                g.stride,
                g.dil,
                g.groups,
                g.transposed,
                caps.smem_optin,
                caps.halo_tile,
            ) {
                return ConvKernel::Halo(c);
            }
        }
        if mma && g.upsample {
            let taps = g.k[0] * g.k[1] * g.k[2];
            let t = caps.mma_tile(rows, taps * cout, vw);
            if caps.conv_up_vec && cout % 8 == 0 && upsample_vec_name(t.name).is_some() {
                return ConvKernel::UpsampleVec(t);
            }
            return ConvKernel::Upsample(t);
        }
        if mma {
            return ConvKernel::Mma(caps.mma_tile(rows, cout, vw));
        }
        let bn = if cout <= 32 { 32 } else { 64 };
        let func = match (direct, bn, cin % 8 == 0) {
            (true, _, _) => "conv_direct",
            (false, 64, true) => "conv_igemm_n64_v8",
            (false, 64, false) => "conv_igemm_n64_v1",
            (false, _, true) => "conv_igemm_n32_v8",
            (false, _, false) => "conv_igemm_n32_v1",
        };
        ConvKernel::Legacy { func, bn }
    }

    /// Rows the re-laid weight is padded to (B matrix rows: output channels, or taps x Cout for
    /// the upsampling GEMM).
    pub fn weight_rows(&self, wshape: &[usize], groups: usize, transposed: bool) -> usize {
        let cout = if transposed {
            wshape[1] * groups
        } else {
            wshape[0]
        };
        match self {
            ConvKernel::Pointwise { .. } => 64,
            ConvKernel::Legacy { .. } => cout.div_ceil(64) * 64,
            ConvKernel::Upsample(_) | ConvKernel::UpsampleVec(_) => {
                let taps = wshape[2] * wshape[3] * wshape[4];
                (taps * cout).div_ceil(MMA_N_PAD) * MMA_N_PAD
            }
            _ => cout.div_ceil(MMA_N_PAD) * MMA_N_PAD,
        }
    }

    /// fp16 elements of each weight upload, in upload order (one per parity class, else one).
    pub fn weight_halves(&self, wshape: &[usize], groups: usize, transposed: bool) -> Vec<usize> {
        let rows = self.weight_rows(wshape, groups, transposed);
        let taps = wshape[2] * wshape[3] * wshape[4];
        match self {
            ConvKernel::Parity(classes) => classes
                .iter()
                .map(|(cl, _)| {
                    let nt: usize = cl.taps.iter().map(|t| t.len()).product();
                    rows * kpad(nt * wshape[0])
                })
                .collect(),
            ConvKernel::Upsample(_) | ConvKernel::UpsampleVec(_) => vec![rows * kpad(wshape[0])],
            _ => {
                let cin_g = if transposed {
                    wshape[0] / groups.max(1)
                } else {
                    wshape[1]
                };
                vec![rows * kpad(taps * cin_g)]
            }
        }
    }
}

/// One launched node of the list (a fused activation rides with its producer).
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    /// Index in `Graph::nodes`.
    pub node: usize,
    /// The activation node fused into this one's epilogue.
    pub fuse: Option<usize>,
    /// The value written (the fused activation's output when fused).
    pub out_v: usize,
    /// Buffer written, its channel stride and channel offset (a concat slice, else C and 0).
    pub out_buf: usize,
    pub ldc: usize,
    pub coff: usize,
    /// Kernel of a conv / transposed conv.
    pub conv: Option<ConvKernel>,
    /// Activation bytes (buffers not free) right after the output is placed, and how many.
    pub live_bytes: usize,
    pub live_bufs: usize,
}

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
    /// Per-sample shapes of every value.
    pub shapes: Vec<Shape>,
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
    /// Buffer holding each value (None: never materialised: fused, dead or not computed).
    pub value_buf: Vec<Option<usize>>,
    /// Values written in place into their concat's slice (the concat copies nothing for them).
    pub in_place: Vec<bool>,
    pub launches: Vec<Launch>,
    /// Constant uploads in the order the launch list makes them.
    pub consts: Vec<ConstBuf>,
    pub input_buf: usize,
    pub output_buf: usize,
    /// f32 NCDHW staging of the window batch in and out: allocated only by the single-window
    /// API (`Backend::run`) on its first call, not by `prepare` nor the streamed pipeline.
    pub stage_in: usize,
    pub stage_out: usize,
    /// Norm partial sums and per-(sample, channel) scale/shift.
    pub norm_sums: usize,
    pub norm_ab: usize,
    /// Widest output channel count.
    pub cmax: usize,
}

impl BufferPlan {
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

/// Alignment of every buffer's offset in the activation arena (what `cuMemAlloc` guarantees).
pub const ARENA_ALIGN: usize = 256;

/// Offsets in one arena for buffers of `sizes` used during launch intervals `life` (inclusive):
/// largest first (then earliest), each at the lowest aligned offset where it overlaps no placed
/// buffer whose interval meets its own. Returns the offsets and the arena size. Memory is then
/// the peak of what is live at once (up to fragmentation), not the sum of every size a
/// buffer ever had, as separate allocations reused by liveness would cost.
pub fn arena_offsets(sizes: &[usize], life: &[(usize, usize)]) -> (Vec<usize>, usize) {
    let al = |b: usize| b.max(1).div_ceil(ARENA_ALIGN) * ARENA_ALIGN;
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by_key(|&b| (std::cmp::Reverse(sizes[b]), life[b].0, b));
    let mut offsets = vec![0usize; sizes.len()];
    let mut placed: Vec<usize> = Vec::new();
    let mut arena = 0;
    for b in order {
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

/// The buffer plan of `graph` for `batch` windows of `roi` on a device with `caps`: fp16 NDHWC
/// activations, a following activation fused into conv / norm / affine epilogues, convs and
/// binaries whose only consumer is a channel concat written into its slice (the concat's buffer
/// taken at its first producer), every other output in a buffer of its own, inputs freed after
/// their last reader (after the output is placed, so no kernel reads and writes one buffer);
/// then every buffer gets an offset in one arena by [`arena_offsets`] over those lifetimes.
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
    let shapes = infer_shapes(graph, roi)?;
    let cons = consumers(graph);
    let nv = graph.values.len();
    let mut last_use = vec![0usize; nv];
    for (i, n) in graph.nodes.iter().enumerate() {
        for &v in &n.inputs {
            last_use[v] = last_use[v].max(i);
        }
    }
    last_use[graph.output] = usize::MAX;
    let numel = |s: &Shape| s.iter().product::<usize>();
    let mut bufs: Vec<usize> = Vec::new();
    // Freed buffers; `life[b]` = launches [first, last] buffer b is in use.
    let mut free: Vec<usize> = Vec::new();
    let mut life: Vec<(usize, usize)> = Vec::new();
    let alloc = |bufs: &mut Vec<usize>, life: &mut Vec<(usize, usize)>, bytes: usize, at: usize| {
        bufs.push(bytes);
        life.push((at, usize::MAX));
        bufs.len() - 1
    };
    let in_shape = shapes[graph.input];
    let input_buf = alloc(&mut bufs, &mut life, batch * numel(&in_shape) * 2, 0);
    // live[v]: the buffer of a value not yet released; value_buf keeps it for the launches.
    let mut live: Vec<Option<usize>> = vec![None; nv];
    let mut value_buf: Vec<Option<usize>> = vec![None; nv];
    live[graph.input] = Some(input_buf);
    value_buf[graph.input] = Some(input_buf);
    let mut in_place = vec![false; nv];
    let mut concat_buf: Vec<Option<usize>> = vec![None; graph.nodes.len()];
    let mut fused_into = vec![false; graph.nodes.len()];
    let mut launches = Vec::new();
    let mut consts = Vec::new();
    let mut cmax = 1;
    let mut norm_part = 0usize;
    let f32s = |n: usize| n * 4;
    for (i, node) in graph.nodes.iter().enumerate() {
        if fused_into[i] {
            continue;
        }
        if let Some(&v) = node.inputs.iter().find(|&&v| live[v].is_none()) {
            return Err(Error::Graph(format!(
                "node {}: input value {v} was never computed",
                node.name
            )));
        }
        let fuse = match &node.op {
            Op::Conv(_)
            | Op::ConvTranspose(_)
            | Op::InstanceNorm { .. }
            | Op::GroupNorm { .. }
            | Op::ChannelAffine { .. } => fusable_activation(graph, &cons, i),
            _ => None,
        };
        let (act, out_v) = match fuse {
            Some(j) => {
                fused_into[j] = true;
                (
                    Act::of(&graph.nodes[j].op).unwrap_or(Act::None),
                    graph.nodes[j].output,
                )
            }
            None => (Act::None, node.output),
        };
        let xshape = shapes[node.inputs[0]];
        let oshape = shapes[node.output];
        cmax = cmax.max(oshape[0]);
        let target = match &node.op {
            Op::Conv(_) | Op::ConvTranspose(_) | Op::Add | Op::Mul | Op::Sub | Op::Div => {
                concat_slice(graph, &cons, &shapes, out_v)
            }
            _ => None,
        };
        let (ob, ldc, coff) = if let Some((j, coff, ctot)) = target {
            let cb = match concat_buf[j] {
                Some(b) => b,
                None => {
                    let cs = shapes[graph.nodes[j].output];
                    let b = alloc(&mut bufs, &mut life, batch * numel(&cs) * 2, launches.len());
                    concat_buf[j] = Some(b);
                    b
                }
            };
            in_place[out_v] = true;
            (cb, ctot, coff)
        } else if let Some(b) = concat_buf[i] {
            (b, oshape[0], 0)
        } else {
            (
                alloc(
                    &mut bufs,
                    &mut life,
                    batch * numel(&oshape) * 2,
                    launches.len(),
                ),
                oshape[0],
                0,
            )
        };
        live[out_v] = Some(ob);
        value_buf[out_v] = Some(ob);
        let (mut live_bytes, mut live_bufs) = (0, 0);
        for (b, &sz) in bufs.iter().enumerate() {
            if !free.contains(&b) {
                live_bytes += sz;
                live_bufs += 1;
            }
        }
        // Constants, in the order the launch list uploads them.
        let mut push = |bytes: usize, what: &'static str| {
            consts.push(ConstBuf {
                node: i,
                bytes,
                what,
            })
        };
        if let Act::PRelu(s) = &act {
            push(f32s(s.len()), "fused PRelu slope");
        }
        let mut conv = None;
        match &node.op {
            Op::Conv(c) => {
                let w = &c.weight.shape;
                let g = ConvGeom {
                    xs: xshape,
                    os: oshape,
                    k: [w[2], w[3], w[4]],
                    stride: c.stride,
                    dil: c.dilation,
                    pads: [c.pads[0], c.pads[1], c.pads[2]],
                    groups: c.groups,
                    transposed: false,
                    upsample: false,
                };
                let k = ConvKernel::choose(caps, batch, &g);
                if let Some(b) = &c.bias {
                    push(f32s(b.len()), "conv bias");
                }
                for h in k.weight_halves(w, c.groups, false) {
                    push(h * 2, "conv weight (fp16 GEMM operand)");
                }
                conv = Some(k);
            }
            Op::ConvTranspose(c) => {
                let w = &c.weight.shape;
                let k3 = [w[2], w[3], w[4]];
                let g = ConvGeom {
                    xs: xshape,
                    os: oshape,
                    k: k3,
                    stride: c.stride,
                    dil: c.dilation,
                    pads: [c.pads[0], c.pads[1], c.pads[2]],
                    groups: c.groups,
                    transposed: true,
                    upsample: is_upsampling_convt(
                        k3,
                        c.stride,
                        c.dilation,
                        &c.pads,
                        c.output_padding,
                        c.groups,
                    ),
                };
                let k = ConvKernel::choose(caps, batch, &g);
                if let Some(b) = &c.bias {
                    push(f32s(b.len()), "transposed conv bias");
                }
                for h in k.weight_halves(w, c.groups, true) {
                    push(h * 2, "transposed conv weight (fp16 GEMM operand)");
                }
                conv = Some(k);
            }
            Op::InstanceNorm { scale, bias, .. } | Op::GroupNorm { scale, bias, .. } => {
                let pix = oshape[1] * oshape[2] * oshape[3];
                norm_part = norm_part.max(caps.norm_blocks(pix) * xshape[0]);
                push(f32s(scale.len()), "norm scale");
                push(f32s(bias.len()), "norm bias");
            }
            Op::ChannelAffine { scale, .. } => push(f32s(2 * scale.len()), "affine scale/shift"),
            Op::PRelu { slope } => push(f32s(slope.len()), "PRelu slope"),
            Op::AddConst(t) | Op::MulConst(t) => push(f32s(t.len()), "broadcast constant"),
            _ => {}
        }
        launches.push(Launch {
            node: i,
            fuse,
            out_v,
            out_buf: ob,
            ldc,
            coff,
            conv,
            live_bytes,
            live_bufs,
        });
        let end = fuse.unwrap_or(i);
        for &v in &node.inputs {
            if last_use[v] <= end && v != out_v {
                if let Some(b) = live[v].take() {
                    if !live.contains(&Some(b)) && !free.contains(&b) {
                        free.push(b);
                        life[b].1 = launches.len() - 1;
                    }
                }
            }
        }
    }
    let output_buf = value_buf[graph.output]
        .ok_or_else(|| Error::Graph("the graph output is never computed".into()))?;
    let out_shape = shapes[graph.output];
    let (offsets, arena) = arena_offsets(&bufs, &life);
    Ok(BufferPlan {
        batch,
        roi,
        bufs,
        offsets,
        lifetimes: life,
        arena,
        value_buf,
        in_place,
        launches,
        consts,
        input_buf,
        output_buf,
        stage_in: batch * numel(&in_shape) * 4,
        stage_out: batch * numel(&out_shape) * 4,
        norm_sums: batch * norm_part.max(cmax) * 2 * 4,
        norm_ab: batch * cmax * 2 * 4,
        cmax,
        shapes,
    })
}

#[cfg(test)]
mod tests {
    use super::super::plan::{
        relayout_parity_weight, relayout_upsampling_weight, relayout_weight, HALO_CONFIGS,
    };
    use super::*;

    fn geom(xs: Shape, os: Shape, k: usize, s: usize, groups: usize, t: bool) -> ConvGeom {
        ConvGeom {
            xs,
            os,
            k: [k; 3],
            stride: [s; 3],
            dil: [1; 3],
            pads: [if k == 3 && !(t && s == k) { 1 } else { 0 }; 3],
            groups,
            transposed: t,
            upsample: t && k == s,
        }
    }

    /// The bytes the plan lists for a conv's weight equal what the re-layout functions the
    /// backend uploads produce, for every kernel kind.
    #[test]
    fn weight_bytes_match_the_relayouts() {
        let h200 = ArchCaps::h200();
        let legacy = ArchCaps {
            conv_mma: false,
            ..ArchCaps::new(7, 5, 40, 64 * 1024)
        };
        // (caps, geometry, weight shape, expected kind)
        let cases: Vec<(ArchCaps, ConvGeom, Vec<usize>, &str)> = vec![
            // 3^3 stride 1, Cin 32: halo on sm_90, mma tile with a small smem limit.
            (
                h200,
                geom([32, 16, 16, 16], [32, 16, 16, 16], 3, 1, 1, false),
                vec![32, 32, 3, 3, 3],
                "Halo",
            ),
            // Cin 128 / Cout 128 (phase 7): Cin chunks and 2 channel tiles, the same weights.
            (
                h200,
                geom([128, 8, 8, 8], [128, 8, 8, 8], 3, 1, 1, false),
                vec![128, 128, 3, 3, 3],
                "Halo",
            ),
            (
                ArchCaps::new(8, 6, 84, 48 * 1024),
                geom([32, 16, 16, 16], [32, 16, 16, 16], 3, 1, 1, false),
                vec![32, 32, 3, 3, 3],
                "Mma",
            ),
            (
                h200,
                geom([3, 16, 16, 16], [24, 8, 8, 8], 3, 2, 1, false),
                vec![24, 3, 3, 3, 3],
                "Mma",
            ),
            (
                h200,
                geom([32, 8, 8, 8], [14, 8, 8, 8], 1, 1, 1, false),
                vec![14, 32, 1, 1, 1],
                "Pointwise",
            ),
            (
                h200,
                geom([64, 4, 4, 4], [32, 8, 8, 8], 2, 2, 1, true),
                vec![64, 32, 2, 2, 2],
                "UpsampleVec",
            ),
            // Cout 14 (no 8-channel chunks) or the switch off: the scatter epilogue.
            (
                h200,
                geom([32, 4, 4, 4], [14, 8, 8, 8], 2, 2, 1, true),
                vec![32, 14, 2, 2, 2],
                "Upsample",
            ),
            (
                ArchCaps {
                    conv_up_vec: false,
                    ..h200
                },
                geom([64, 4, 4, 4], [32, 8, 8, 8], 2, 2, 1, true),
                vec![64, 32, 2, 2, 2],
                "Upsample",
            ),
            // Cin 1, 3^3, stride 1 / 2: conv_c1_k3 (mma weight layout); switch off: mma tile.
            (
                h200,
                geom([1, 16, 16, 16], [32, 16, 16, 16], 3, 1, 1, false),
                vec![32, 1, 3, 3, 3],
                "Cin1",
            ),
            (
                h200,
                geom([1, 15, 15, 15], [20, 8, 8, 8], 3, 2, 1, false),
                vec![20, 1, 3, 3, 3],
                "Cin1",
            ),
            (
                ArchCaps {
                    conv_c1: false,
                    ..h200
                },
                geom([1, 16, 16, 16], [32, 16, 16, 16], 3, 1, 1, false),
                vec![32, 1, 3, 3, 3],
                "Mma",
            ),
            (
                ArchCaps {
                    conv_tile: Some("conv_mma_m128n32_v1"),
                    ..h200
                },
                geom([1, 16, 16, 16], [32, 16, 16, 16], 3, 1, 1, false),
                vec![32, 1, 3, 3, 3],
                "Mma",
            ),
            // Cout 72 > 64: not the Cin-1 kernel.
            (
                h200,
                geom([1, 16, 16, 16], [72, 16, 16, 16], 3, 1, 1, false),
                vec![72, 1, 3, 3, 3],
                "Mma",
            ),
            (
                h200,
                geom([40, 4, 4, 4], [20, 8, 8, 8], 3, 2, 1, true),
                vec![40, 20, 3, 3, 3],
                "Parity",
            ),
            (
                h200,
                geom([32, 8, 8, 8], [32, 8, 8, 8], 3, 1, 4, false),
                vec![32, 8, 3, 3, 3],
                "Legacy",
            ),
            (
                legacy,
                geom([40, 4, 4, 4], [20, 8, 8, 8], 3, 2, 1, true),
                vec![40, 20, 3, 3, 3],
                "Legacy",
            ),
        ];
        for (caps, g, ws, kind) in cases {
            let k = ConvKernel::choose(&caps, 2, &g);
            assert!(
                format!("{k:?}").starts_with(&format!("{kind}[")),
                "{k:?} for {ws:?}"
            );
            let data: Vec<f32> = (0..ws.iter().product::<usize>())
                .map(|i| i as f32)
                .collect();
            let rows = k.weight_rows(&ws, g.groups, g.transposed);
            let got: Vec<usize> = match &k {
                ConvKernel::Parity(cl) => cl
                    .iter()
                    .map(|(c, _)| relayout_parity_weight(&data, &ws, &c.taps, rows).0.len())
                    .collect(),
                ConvKernel::Upsample(_) | ConvKernel::UpsampleVec(_) => {
                    vec![relayout_upsampling_weight(&data, &ws, rows).0.len()]
                }
                _ => vec![relayout_weight(&data, &ws, g.groups, g.transposed, rows)
                    .0
                    .len()],
            };
            assert_eq!(k.weight_halves(&ws, g.groups, g.transposed), got, "{k:?}");
            if let ConvKernel::Parity(cl) = &k {
                assert_eq!(cl.len(), 8, "stride 2: 8 parity classes");
            }
        }
        assert!(HALO_CONFIGS
            .iter()
            .any(|c| c.smem_bytes() as usize <= h200.smem_optin));
    }

    /// Every `convt_up_*` twin names a v8 mma tile whose operand stages can hold the staged
    /// fp32 tile (bm x (bn + 8) floats), as the kernel's static_assert requires.
    #[test]
    fn upsample_vec_twins_fit() {
        for (mma, up) in UPSAMPLE_VEC {
            let c = MMA_CONFIGS.iter().find(|c| c.name == *mma).unwrap();
            assert_eq!(c.vw, 8, "{mma}");
            assert!(c.bm * (c.bn + 8) * 4 <= c.smem_bytes() as usize, "{mma}");
            assert_eq!(up.replace("convt_up_", "conv_mma_"), *mma);
            assert_eq!(upsample_vec_name(mma), Some(*up));
        }
        assert_eq!(upsample_vec_name("conv_mma_m128n32_v2"), None);
        let k = ConvKernel::UpsampleVec(
            MMA_CONFIGS
                .iter()
                .find(|c| c.name == "conv_mma_m128n64_v8")
                .unwrap(),
        );
        assert!(k.funcs()[0].starts_with("convt_up_"), "{k:?}");
    }

    /// Arena offsets: aligned, buffers whose lifetimes meet never share a byte, the arena is at
    /// least the most bytes live at one launch (brute force over launches) and, for a chain of
    /// values each read by the next launch only, exactly the largest neighbouring pair.
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

    #[test]
    fn alloc_floor_and_caps() {
        assert_eq!(alloc_size(0), 256);
        assert_eq!(alloc_size(255), 256);
        assert_eq!(alloc_size(257), 257);
        let c = ArchCaps::h200();
        assert_eq!((c.sm, c.sm_count, c.conv_mma), (90, 132, true));
        assert!(!ArchCaps::new(7, 5, 40, 65536).conv_mma);
        assert_eq!(c.norm_blocks(1), 1);
        assert_eq!(c.norm_blocks(1 << 30), 264);
        // A forced tile applies only where its gather width divides the conv's.
        let forced = ArchCaps {
            conv_tile: Some("conv_mma_m128n64_v8"),
            ..c
        };
        assert_eq!(forced.mma_tile(1000, 32, 8).name, "conv_mma_m128n64_v8");
        assert_eq!(forced.mma_tile(1000, 32, 2).name, "conv_mma_m128n32_v2");
    }
}
