//! How one conv runs (host only): the device facts and option switches the choice depends on
//! ([`ArchCaps`]), the chosen kernel ([`ConvKernel`]) and the bytes of its re-laid weights.

use crate::backend::cuda::abi::norm_blocks;
use crate::backend::cuda::host::catalogue::{
    box_tiles, has_wgmma, stats_twin, upsample_vec_name, upsample_vec_st_name, wgk_stats_twin,
    zpair_variant, HaloConfig, MmaConfig, WgkConfig, C1X1_STAGE_BYTES, C1_TILE, CONV1X1_MMA_N16,
    CONV1X1_N16, CONV1X1_N16_S, CONV1X1_N32, CONV1X1_N32_S, CONVT_UP2_P, CONV_C1_K3, CONV_C1_K3_ST,
    CONV_DIRECT, CONV_IGEMM_N32_V1, CONV_IGEMM_N32_V8, CONV_IGEMM_N64_V1, CONV_IGEMM_N64_V8,
    CONV_SPLITK_REDUCE,
};
use crate::backend::cuda::host::options::CudaOptions;
use crate::backend::cuda::host::relayout::{parity_split, FusedParity, ParityClass};
use crate::backend::cuda::host::select::{
    gather_width, pick_halo, pick_mma, pick_wgk, pick_wgk_up, pick_wgmma, split_k, ConvGeom,
    MMA_N_PAD,
};

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
    /// The halo convs on wgmma where a `conv_wg_*` kernel fits (compute capability 9.0 only:
    /// the kernels are built for sm_90a).
    pub conv_wgmma: bool,
    /// Stride-1 and stride-2 convs with Cin a multiple of 64 on `conv_wgk_*` by [`pick_wgk`]'s
    /// rules (`CudaOptions::wgk_conv`; with `conv_wgmma` only).
    pub conv_wgk: bool,
    /// A forced `conv_wgk_*` kernel (tests, benchmarks).
    pub wgk_tile: Option<&'static WgkConfig>,
    /// A `conv_wgk_*` conv before a norm hands it the statistics (`CudaOptions::wgk_stats`).
    pub wgk_stats: bool,
    /// The fused parity classes of strided transposed convs with Cin 64k on `conv_wgk_up_*`
    /// (`CudaOptions::wgk_convt`; with `conv_wgmma` only).
    pub wgk_convt: bool,
    /// Cin-1 3^3 convs (stride 1/2, Cout <= 64) on `CONV_C1_K3` (unless a tile is forced).
    pub conv_c1: bool,
    /// kernel == stride transposed convs with Cin, Cout % 8 == 0, and fused parity classes
    /// with Cin % 8 == 0, on `convt_up_*` (staged epilogue) instead of the `conv_mma_*`
    /// scatter epilogue.
    pub conv_up_vec: bool,
    /// kernel == stride == 2 transposed convs with Cin 16, 32 or 64 and Cout <= 32 (a multiple
    /// of 8) on the persistent `CONVT_UP2_P` (`CudaOptions::convt_up2`).
    pub convt_up2: bool,
    /// Strided transposed convs whose parity classes share one grid as one fused launch
    /// ([`FusedParity`]) rather than one launch per class.
    pub parity_fused: bool,
    /// A forced `conv_mma_*` tile (tests, benchmarks).
    pub conv_tile: Option<&'static MmaConfig>,
    /// A forced `conv_halo_*` kernel (benchmarks).
    pub halo_tile: Option<&'static HaloConfig>,
    /// Conv outputs only norms read kept in fp32 (`CudaOptions::norm_f32`).
    pub norm_f32: bool,
    /// Split the K of tile-starved mma convs over several blocks ([`split_k`]).
    pub split_k: bool,
    /// With `split_k`: split to about two blocks an SM, where the output tiles fill under one
    /// (`CudaOptions::split_k_fill`).
    pub split_k_fill: bool,
    /// A pointwise head reads the norm before it, normalised on load (`CudaOptions::norm_head`).
    pub norm_head: bool,
    /// A norm's affine pass adds the residual of the Add after it (`CudaOptions::norm_residual`).
    pub norm_residual: bool,
    /// The full-resolution ends of the list run one window at a time
    /// (`CudaOptions::window_segments`).
    pub window_segments: bool,
    /// The pointwise heads load their input through shared memory (`CudaOptions::head_staged`).
    pub head_staged: bool,
    /// The pointwise heads run on mma.sync (`CudaOptions::head_mma`).
    pub head_mma: bool,
    /// A conv hands the norm after it the statistics of its output (`CudaOptions::norm_stats`).
    pub norm_stats: bool,
    /// A norm reruns the Cin-1 conv before it rather than read its output
    /// (`CudaOptions::norm_recompute`).
    pub norm_recompute: bool,
    /// The fused parity classes hand a norm its statistics (`CudaOptions::convt_stats`).
    pub convt_stats: bool,
    /// A conv over a channel concat runs as one launch per part (`CudaOptions::concat_split`).
    pub concat_split: bool,
    /// With `concat_split`, a conv of Cin = k x 32 also runs in 32-channel chunks
    /// (`CudaOptions::cin_chunks`).
    pub cin_chunks: bool,
    /// A z-pair conv reads the norm before it normalised on load
    /// (`CudaOptions::norm_load_conv`).
    pub norm_load_conv: bool,
    /// Stride-2 convs may take a stride-2 halo kernel (`CudaOptions::halo_s2`).
    pub halo_s2: bool,
    /// Stride-2 convs may take the stride-2 wgmma kernel (`CudaOptions::wg_s2`).
    pub wg_s2: bool,
    /// The z-pair kernel's staged planes go out as bulk copies (`CudaOptions::zpair_bulk`).
    pub zpair_bulk: bool,
    /// ... and its slots come in by tensor loads (`CudaOptions::zpair_tma`).
    pub zpair_tma: bool,
    /// ... whose `_st` twin stores as the helper did (`CudaOptions::zpair_st_staged`).
    pub zpair_st_staged: bool,
    /// ... and stores fp16 less each tile's shift for the norm (`CudaOptions::norm_shifted`).
    pub norm_shifted: bool,
    /// ... which its norm reads in runs of voxels where they fit (`CudaOptions::norm_runs`).
    pub norm_runs: bool,
}

impl ArchCaps {
    /// The defaults of a device of compute capability `major.minor`: its switches those of
    /// `CudaOptions::default()` (defined there once).
    pub fn new(major: u32, minor: u32, sm_count: usize, smem_optin: usize) -> Self {
        ArchCaps::with_options(major, minor, sm_count, smem_optin, &CudaOptions::default())
    }

    /// A device of compute capability `major.minor` with the switches of `opts`.
    pub fn with_options(
        major: u32,
        minor: u32,
        sm_count: usize,
        smem_optin: usize,
        opts: &CudaOptions,
    ) -> Self {
        ArchCaps {
            sm: major * 10 + minor,
            sm_count,
            smem_optin,
            conv_mma: major >= 8 && !opts.legacy_conv,
            conv_halo: opts.halo_conv,
            conv_wgmma: has_wgmma(&format!("sm_{major}{minor}")) && opts.wgmma_conv,
            conv_wgk: opts.wgk_conv,
            wgk_tile: opts.wgk_tile,
            wgk_stats: opts.wgk_stats,
            wgk_convt: opts.wgk_convt,
            conv_c1: opts.c1_conv,
            conv_up_vec: opts.upsample_vec,
            convt_up2: opts.convt_up2,
            parity_fused: opts.fused_parity,
            norm_f32: opts.norm_f32,
            split_k: opts.split_k,
            split_k_fill: opts.split_k_fill,
            norm_head: opts.norm_head,
            norm_residual: opts.norm_residual,
            window_segments: opts.window_segments,
            norm_stats: opts.norm_stats,
            norm_recompute: opts.norm_recompute,
            convt_stats: opts.convt_stats,
            concat_split: opts.concat_split,
            cin_chunks: opts.cin_chunks,
            norm_load_conv: opts.norm_load_conv,
            halo_s2: opts.halo_s2,
            wg_s2: opts.wg_s2,
            zpair_bulk: opts.zpair_bulk,
            zpair_tma: opts.zpair_tma,
            zpair_st_staged: opts.zpair_st_staged,
            norm_shifted: opts.norm_shifted,
            norm_runs: opts.norm_runs,
            head_staged: opts.head_staged,
            head_mma: opts.head_mma,
            conv_tile: opts.conv_tile,
            halo_tile: opts.halo_tile,
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
        if let Some(c) = self.conv_tile {
            if vw.is_multiple_of(c.vw) {
                return c;
            }
        }
        pick_mma(m, n, vw, self.sm_count)
    }

    /// Blocks per sample of the norm statistics: >= 256 pixels each, at most 2 per SM.
    pub fn norm_blocks(&self, pix: usize) -> usize {
        norm_blocks(self.sm_count, pix)
    }
}

/// How one conv / transposed conv runs; fixes its weight layout (and so its bytes).
#[derive(Clone)]
pub enum ConvKernel {
    /// A strided transposed conv as one dense mma GEMM per output parity class.
    Parity(Vec<(ParityClass, &'static MmaConfig)>),
    /// The same classes as one mma GEMM over the union of their taps (one column block per
    /// class, the scatter epilogue writes each class's outputs).
    ParityFused(FusedParity, &'static MmaConfig),
    /// The same GEMM and weights on the tile's `convt_up_*` twin (staged scatter epilogue, any
    /// Cout: coalesced runs of voxels x channels rather than `conv_store`'s 4-byte pairs);
    /// `true`: its `_st` twin, which also writes a following norm's statistics
    /// ([`with_norm_stats`](Self::with_norm_stats)).
    ParityFusedVec(FusedParity, &'static MmaConfig, bool),
    /// The same GEMM and weights on the wgmma implicit GEMM (`conv_wgk_up_*`, tiles of the
    /// input grid, the staged scatter epilogue; its `_st` twin writes a following norm's
    /// statistics). `CudaOptions::wgk_convt`.
    ParityFusedWgk(FusedParity, &'static WgkConfig),
    /// 1x1x1 conv with few outputs, one thread per voxel (`CONV1X1_N16` / `_n32`); `staged`:
    /// the `_s` twins, which load the block's voxels through shared memory; `mma`: 16 voxels a
    /// warp on mma.sync (`CONV1X1_MMA_N16`, nc 16).
    Pointwise {
        nc: usize,
        staged: bool,
        mma: bool,
    },
    Halo(&'static HaloConfig),
    /// kernel == stride transposed conv as a GEMM with a scatter epilogue.
    Upsample(&'static MmaConfig),
    /// The same GEMM and weights on `convt_up_*` (the tile's 16-byte staged epilogue).
    UpsampleVec(&'static MmaConfig),
    /// The same weights on the persistent `CONVT_UP2_P` (kernel == stride == 2, Cin 16 / 32 /
    /// 64, Cout <= 32 a multiple of 8).
    Up2,
    /// Cin-1 3^3 conv on `CONV_C1_K3` (mma weight layout); `stats`: its twin `CONV_C1_K3_ST`,
    /// which also writes a following norm's statistics.
    Cin1 {
        stats: bool,
    },
    Mma(&'static MmaConfig),
    /// The implicit GEMM on wgmma fed by tensor loads (`conv_wgk_*`; the mma weight layout).
    Wgk(&'static WgkConfig),
    /// The same tile with its K tiles split over grid.z in this many parts (a conv whose
    /// output tiles would leave most SMs idle while each streams a long K): fp32 partial sums
    /// in the plan's scratch, then `CONV_SPLITK_REDUCE` (bias, activation, store).
    SplitK(&'static MmaConfig, usize),
    /// The wmma implicit GEMM (`conv_igemm_*`) or, for grouped convs, `CONV_DIRECT`.
    Legacy {
        func: &'static str,
        bn: usize,
    },
}

impl ConvKernel {
    /// Whether its epilogue can store fp32 (`ConvParams::out_f32`): all but the pointwise
    /// head, whose output no norm reads in the nets voxtile runs.
    pub fn writes_f32(&self) -> bool {
        !matches!(self, ConvKernel::Pointwise { .. })
    }

    /// Whether its epilogue adds a fused residual (`ConvParams::res`): the `conv_wg_*` kernels
    /// only. A never-taken residual branch in the shared `out_store*` slowed the mma kernels'
    /// out-of-line `conv_store` by half (PERF_NOTES, session 21).
    pub fn adds_residual(&self) -> bool {
        matches!(self, ConvKernel::Halo(c) if c.wgmma && !c.zpair)
    }

    /// The fused parity classes it runs, on whichever kernel (None: not a fused transposed
    /// conv).
    pub fn fused_parity(&self) -> Option<&FusedParity> {
        match self {
            ConvKernel::ParityFused(f, _)
            | ConvKernel::ParityFusedVec(f, _, _)
            | ConvKernel::ParityFusedWgk(f, _) => Some(f),
            _ => None,
        }
    }

    /// Whether it is a twin that writes a following norm's statistics
    /// ([`with_norm_stats`](Self::with_norm_stats)'s kernels).
    pub fn writes_stats(&self) -> bool {
        match self {
            ConvKernel::Halo(h) => h.stats,
            ConvKernel::Wgk(c) | ConvKernel::ParityFusedWgk(_, c) => c.stats,
            ConvKernel::Cin1 { stats } | ConvKernel::ParityFusedVec(_, _, stats) => *stats,
            _ => false,
        }
    }

    /// The kernel that also writes the statistics of a norm reading this conv's output (per
    /// sample shape `os`, at channel stride `ldc` and offset `coff`), with the entries it writes
    /// per sample (kernels/tile_stats.cuh's layout): the `_st` twin ([`stats_twin`]) of the
    /// z-pair kernel (its helper's stores) or of a `conv_wgk_*` kernel ([`wgk_stats_twin`]),
    /// one entry per output tile; or `CONV_C1_K3_ST` for Cout 8, 16 or 32 on its 16-byte
    /// stores, one per block (a `C1_TILE` tile).
    pub fn with_norm_stats(
        &self,
        os: [usize; 4],
        ldc: usize,
        coff: usize,
    ) -> Option<(ConvKernel, usize)> {
        let [cout, d, h, w] = os;
        match self {
            ConvKernel::Halo(c) => {
                let twin = stats_twin(c)?;
                Some((ConvKernel::Halo(twin), twin.tiles(1, [d, h, w])))
            }
            // The fused parity classes' GEMM: one entry per M tile, where a sample's rows are
            // whole tiles and every column (classes x Cout) is in one column tile.
            ConvKernel::ParityFusedVec(f, t, false) => {
                let rows = f.grid.iter().product::<usize>();
                let up = upsample_vec_name(t.name)?;
                upsample_vec_st_name(up)?;
                let fits = rows.is_multiple_of(t.bm) && f.classes.len() * cout <= t.bn;
                fits.then(|| (ConvKernel::ParityFusedVec(f.clone(), t, true), rows / t.bm))
            }
            // One entry per tile of the input grid, where every column is in one column tile.
            ConvKernel::ParityFusedWgk(f, c) => {
                let twin = wgk_stats_twin(c)?;
                let fits = f.classes.len() * cout <= twin.bn;
                fits.then(|| {
                    let tiles = box_tiles(1, f.grid, twin.tile);
                    (ConvKernel::ParityFusedWgk(f.clone(), twin), tiles)
                })
            }
            // One entry per output tile; each block writes its own channels' entries.
            ConvKernel::Wgk(c) => {
                let twin = wgk_stats_twin(c)?;
                Some((ConvKernel::Wgk(twin), twin.tiles(1, [d, h, w])))
            }
            ConvKernel::Cin1 { stats: false } => {
                let fits =
                    [8, 16, 32].contains(&cout) && [ldc, coff].iter().all(|v| v.is_multiple_of(4));
                let blocks = box_tiles(1, [d, h, w], C1_TILE);
                fits.then_some((ConvKernel::Cin1 { stats: true }, blocks))
            }
            _ => None,
        }
    }

    /// Dynamic shared memory of a pointwise head over `cin` input channels: the fp32 weights
    /// [cin][nc], the block's fp16 outputs, and (staged) its input rows; 0 for other kernels.
    pub fn pointwise_smem(&self, cin: usize) -> usize {
        match self {
            // (The mma heads' staging is static.)
            ConvKernel::Pointwise { mma: true, .. } => 0,
            ConvKernel::Pointwise { nc, staged, .. } => {
                cin * nc * 4 + 256 * nc * 2 + if *staged { C1X1_STAGE_BYTES } else { 0 }
            }
            _ => 0,
        }
    }

    /// The parts its K is split into (`SplitK`), else 1.
    pub fn k_splits(&self) -> usize {
        match self {
            ConvKernel::SplitK(_, ks) => *ks,
            _ => 1,
        }
    }

    /// Bytes of the fp32 partial sums it writes for `rows` GEMM rows (all the plan's windows)
    /// and `cout` channels, 0 unless its K is split: the plan's scratch holds the largest.
    pub fn partial_bytes(&self, rows: usize, cout: usize) -> usize {
        match self.k_splits() {
            1 => 0,
            ks => ks * rows * cout * 4,
        }
    }

    /// Kernel name of each launch (one per parity class, else one).
    pub fn funcs(&self) -> Vec<&'static str> {
        match self {
            ConvKernel::Parity(cl) => cl.iter().map(|(_, c)| c.name).collect(),
            ConvKernel::ParityFused(_, c) => vec![c.name],
            ConvKernel::ParityFusedWgk(_, c) => vec![c.name],
            ConvKernel::ParityFusedVec(_, c, stats) => {
                let up = upsample_vec_name(c.name).unwrap_or(c.name);
                vec![match upsample_vec_st_name(up) {
                    Some(t) if *stats => t,
                    _ => up,
                }]
            }
            ConvKernel::Pointwise { mma: true, .. } => vec![CONV1X1_MMA_N16.name],
            ConvKernel::Pointwise { nc, staged, .. } => vec![match (nc, staged) {
                (16, false) => CONV1X1_N16.name,
                (16, true) => CONV1X1_N16_S.name,
                (_, false) => CONV1X1_N32.name,
                (_, true) => CONV1X1_N32_S.name,
            }],
            ConvKernel::Halo(c) => vec![c.name],
            ConvKernel::Upsample(c) | ConvKernel::Mma(c) => vec![c.name],
            ConvKernel::Wgk(c) => vec![c.name],
            ConvKernel::SplitK(c, _) => vec![c.name, CONV_SPLITK_REDUCE.name],
            ConvKernel::UpsampleVec(c) => vec![upsample_vec_name(c.name).unwrap_or(c.name)],
            ConvKernel::Up2 => vec![CONVT_UP2_P.name],
            ConvKernel::Cin1 { stats: false } => vec![CONV_C1_K3.name],
            ConvKernel::Cin1 { stats: true } => vec![CONV_C1_K3_ST.name],
            ConvKernel::Legacy { func, .. } => vec![func],
        }
    }
}

impl std::fmt::Debug for ConvKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            ConvKernel::Parity(_) => "Parity",
            ConvKernel::ParityFused(..) => "ParityFused",
            ConvKernel::ParityFusedVec(..) => "ParityFusedVec",
            ConvKernel::ParityFusedWgk(..) => "ParityFusedWgk",
            ConvKernel::Pointwise { .. } => "Pointwise",
            ConvKernel::Halo(_) => "Halo",
            ConvKernel::Upsample(_) => "Upsample",
            ConvKernel::UpsampleVec(_) => "UpsampleVec",
            ConvKernel::Up2 => "Up2",
            ConvKernel::Cin1 { .. } => "Cin1",
            ConvKernel::Mma(_) => "Mma",
            ConvKernel::Wgk(_) => "Wgk",
            ConvKernel::SplitK(..) => "SplitK",
            ConvKernel::Legacy { .. } => "Legacy",
        };
        write!(f, "{kind}{:?}", self.funcs())
    }
}

impl PartialEq for ConvKernel {
    fn eq(&self, o: &Self) -> bool {
        let classes = |k: &ConvKernel| match (k, k.fused_parity()) {
            (ConvKernel::Parity(c), _) => c.iter().map(|(cl, _)| cl.clone()).collect(),
            (_, Some(f)) => f.classes.clone(),
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
                let fused = FusedParity::of(&classes, g.stride, osp).filter(|f| {
                    caps.parity_fused && batch * f.grid.iter().product::<usize>() < 1 << 31
                });
                if let Some(f) = fused {
                    let rows = batch * f.grid.iter().product::<usize>();
                    let forced = caps.wgk_tile.filter(|c| c.up);
                    if caps.conv_wgmma && (caps.wgk_convt || forced.is_some()) {
                        let columns = f.classes.len() * cout;
                        if let Some(c) = pick_wgk_up(cin, columns, caps.smem_optin, forced) {
                            return ConvKernel::ParityFusedWgk(f, c);
                        }
                    }
                    let t = caps.mma_tile(rows, f.classes.len() * cout, vw);
                    if caps.conv_up_vec && upsample_vec_name(t.name).is_some() {
                        return ConvKernel::ParityFusedVec(f, t, false);
                    }
                    return ConvKernel::ParityFused(f, t);
                }
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
            // The mma heads index voxels in 32 bits.
            let voxels = batch * osp.iter().product::<usize>();
            let mma = caps.head_mma && (cin == 16 || cin == 32) && cout <= 16 && voxels < 1 << 31;
            return ConvKernel::Pointwise {
                nc: if cout <= 16 { 16 } else { 32 },
                staged: caps.head_staged && !mma,
                mma,
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
            return ConvKernel::Cin1 { stats: false };
        }
        // The halo kernel that takes the conv, if one does (wgmma first unless a plain halo
        // kernel is forced); a strided conv only with the switch of that kernel kind.
        let strided = g.stride != [1; 3];
        let halo = (mma && !g.upsample && caps.conv_halo && caps.conv_tile.is_none())
            .then(|| {
                let force = caps.halo_tile.map(|c| c.name);
                let wg = caps.conv_wgmma
                    && caps.halo_tile.is_none_or(|c| c.wgmma)
                    && (!strided || caps.wg_s2);
                // The persistent stride-2 kernel loads its 108 KB of weights once a block: only
                // where each warpgroup gets two tiles or more (not measured below that: W2's
                // 32 -> 64 at 16³ keeps the GEMM).
                let out = [g.os[1], g.os[2], g.os[3]];
                let amortised = |c: &&HaloConfig| {
                    c.stride == 1
                        || c.persist == 0
                        || force == Some(c.name)
                        || c.tiles(batch, out) >= 4 * caps.sm_count
                };
                wg.then(|| pick_wgmma(g, caps.smem_optin, force).filter(amortised))
                    .flatten()
                    .or_else(|| {
                        (!strided || caps.halo_s2)
                            .then(|| pick_halo(g, caps.smem_optin, force))
                            .flatten()
                    })
            })
            .flatten();
        // The wgmma implicit GEMM where it fills the SMs (before a halo kernel: measured faster
        // on every conv its rule takes), or forced.
        let wgk = (mma && caps.conv_wgmma && caps.conv_tile.is_none())
            .then(|| pick_wgk(g, batch, caps.sm_count, caps.smem_optin, caps.wgk_tile))
            .flatten()
            .filter(|_| caps.wgk_tile.is_some() || caps.conv_wgk);
        if let Some(c) = wgk {
            return ConvKernel::Wgk(c);
        }
        // A conv whose output tiles leave most SMs idle while each streams a long K (also one
        // the halo kernels take: their tiles starve the same way on a few voxels). A forced
        // halo kernel keeps the convs it takes, as a forced mma tile does.
        let forced_halo = caps
            .halo_tile
            .is_some_and(|f| halo.is_some_and(|c| c.name == f.name));
        if mma
            && !g.upsample
            && !g.transposed
            && caps.split_k
            && caps.conv_tile.is_none()
            && !forced_halo
        {
            let t = caps.mma_tile(rows, cout, vw);
            let ks = split_k(
                caps.sm_count,
                rows,
                cout,
                g.k.iter().product::<usize>() * cin,
                t,
                if caps.split_k_fill { 2 } else { 1 },
            );
            if ks > 1 {
                return ConvKernel::SplitK(t, ks);
            }
        }
        if let Some(c) = halo {
            // (After the forced-kernel test above: a forced `_h2t` may run as `_h2`.)
            return ConvKernel::Halo(zpair_variant(c, caps.zpair_tma, caps.zpair_bulk));
        }
        if mma && g.upsample {
            if caps.convt_up2
                && caps.conv_tile.is_none()
                && g.k == [2; 3]
                && [16, 32, 64].contains(&cin)
                && cout % 8 == 0
                && cout <= 32
            {
                return ConvKernel::Up2;
            }
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
            (true, _, _) => CONV_DIRECT.name,
            (false, 64, true) => CONV_IGEMM_N64_V8.name,
            (false, 64, false) => CONV_IGEMM_N64_V1.name,
            (false, _, true) => CONV_IGEMM_N32_V8.name,
            (false, _, false) => CONV_IGEMM_N32_V1.name,
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
        if let Some(f) = self.fused_parity() {
            return (f.classes.len() * cout).div_ceil(MMA_N_PAD) * MMA_N_PAD;
        }
        match self {
            ConvKernel::Pointwise { .. } => 64,
            ConvKernel::Legacy { .. } => cout.div_ceil(64) * 64,
            ConvKernel::Upsample(_) | ConvKernel::UpsampleVec(_) | ConvKernel::Up2 => {
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
        if let Some(f) = self.fused_parity() {
            return vec![rows * kpad(f.k.iter().product::<usize>() * wshape[0])];
        }
        match self {
            ConvKernel::Parity(classes) => classes
                .iter()
                .map(|(cl, _)| {
                    let nt: usize = cl.taps.iter().map(|t| t.len()).product();
                    rows * kpad(nt * wshape[0])
                })
                .collect(),
            ConvKernel::Upsample(_) | ConvKernel::UpsampleVec(_) | ConvKernel::Up2 => {
                vec![rows * kpad(wshape[0])]
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::abi::Shape;
    use crate::backend::cuda::host::catalogue::*;
    use crate::backend::cuda::host::relayout::{
        relayout_fused_parity_weight, relayout_parity_weight, relayout_upsampling_weight,
        relayout_weight,
    };

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
            // Cin 128 / Cout 128 : Cin chunks and 2 channel tiles, the same weights.
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
            // 3^3 stride 2, Cin 32: the implicit GEMM without `wg_s2`, the stride-2 halo kernel
            // with `halo_s2` (the same weight layout).
            (
                ArchCaps {
                    wg_s2: false,
                    ..h200
                },
                geom([32, 16, 16, 16], [64, 8, 8, 8], 3, 2, 1, false),
                vec![64, 32, 3, 3, 3],
                "Mma",
            ),
            (
                ArchCaps {
                    halo_s2: true,
                    wg_s2: false,
                    ..h200
                },
                geom([32, 16, 16, 16], [64, 8, 8, 8], 3, 2, 1, false),
                vec![64, 32, 3, 3, 3],
                "Halo",
            ),
            // ... and with `wg_s2` (the default) the stride-2 wgmma kernel (same layout again)
            // where each persistent warpgroup gets two tiles or more, else the GEMM.
            (
                h200,
                geom([32, 64, 64, 64], [64, 32, 32, 32], 3, 2, 1, false),
                vec![64, 32, 3, 3, 3],
                "Halo",
            ),
            (
                h200,
                geom([32, 16, 16, 16], [64, 8, 8, 8], 3, 2, 1, false),
                vec![64, 32, 3, 3, 3],
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
                "Up2",
            ),
            // Cout 64 (past `convt_up2_p`'s 32): the GEMM's staged epilogue.
            (
                h200,
                geom([64, 4, 4, 4], [64, 8, 8, 8], 2, 2, 1, true),
                vec![64, 64, 2, 2, 2],
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
                    convt_up2: false,
                    ..h200
                },
                geom([64, 4, 4, 4], [32, 8, 8, 8], 2, 2, 1, true),
                vec![64, 32, 2, 2, 2],
                "Upsample",
            ),
            // Cin 256 -> 256, 3^3 over 32 x 16 x 16 (128 tiles at batch 2): the wgmma
            // implicit GEMM; switch off: the mma tile (the same weight layout).
            (
                h200,
                geom([256, 32, 16, 16], [256, 32, 16, 16], 3, 1, 1, false),
                vec![256, 256, 3, 3, 3],
                "Wgk",
            ),
            (
                ArchCaps {
                    conv_wgk: false,
                    ..h200
                },
                geom([256, 32, 16, 16], [256, 32, 16, 16], 3, 1, 1, false),
                vec![256, 256, 3, 3, 3],
                "Mma",
            ),
            // Cin 1, 3^3, stride 1 / 2: CONV_C1_K3 (mma weight layout); switch off: mma tile.
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
                    conv_tile: Some(&CONV_MMA_M128N32_V1),
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
            // k3 s2: an even output fuses the 8 classes (on the staged twin; the scatter
            // epilogue with the switch off), an odd one (or the fusion off) not.
            (
                h200,
                geom([40, 4, 4, 4], [20, 8, 8, 8], 3, 2, 1, true),
                vec![40, 20, 3, 3, 3],
                "ParityFusedVec",
            ),
            (
                ArchCaps {
                    conv_up_vec: false,
                    ..h200
                },
                geom([40, 4, 4, 4], [20, 8, 8, 8], 3, 2, 1, true),
                vec![40, 20, 3, 3, 3],
                "ParityFused",
            ),
            // With `wgk_convt`, Cin 64k: the same classes on the wgmma implicit GEMM (the same
            // weight layout); Cin 32 (one k-step a tap) and Cin 40 keep mma.sync, and the up
            // kernel forced takes Cin 32.
            (
                h200,
                geom([64, 4, 4, 4], [20, 8, 8, 8], 3, 2, 1, true),
                vec![64, 20, 3, 3, 3],
                "ParityFusedWgk",
            ),
            (
                ArchCaps {
                    wgk_convt: false,
                    ..h200
                },
                geom([64, 4, 4, 4], [20, 8, 8, 8], 3, 2, 1, true),
                vec![64, 20, 3, 3, 3],
                "ParityFusedVec",
            ),
            (
                h200,
                geom([32, 4, 4, 4], [20, 8, 8, 8], 3, 2, 1, true),
                vec![32, 20, 3, 3, 3],
                "ParityFusedVec",
            ),
            (
                ArchCaps {
                    wgk_tile: Some(&CONV_WGK_UP_N128),
                    ..h200
                },
                geom([32, 4, 4, 4], [20, 8, 8, 8], 3, 2, 1, true),
                vec![32, 20, 3, 3, 3],
                "ParityFusedWgk",
            ),
            (
                h200,
                geom([40, 4, 4, 4], [20, 8, 8, 8], 3, 2, 1, true),
                vec![40, 20, 3, 3, 3],
                "ParityFusedVec",
            ),
            (
                h200,
                geom([40, 4, 4, 4], [20, 7, 7, 7], 3, 2, 1, true),
                vec![40, 20, 3, 3, 3],
                "Parity",
            ),
            (
                ArchCaps {
                    parity_fused: false,
                    ..h200
                },
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
                ConvKernel::Upsample(_) | ConvKernel::UpsampleVec(_) | ConvKernel::Up2 => {
                    vec![relayout_upsampling_weight(&data, &ws, rows).0.len()]
                }
                ConvKernel::ParityFused(f, _)
                | ConvKernel::ParityFusedVec(f, _, _)
                | ConvKernel::ParityFusedWgk(f, _) => {
                    assert_eq!((f.k, f.grid, f.classes.len()), ([2; 3], [4; 3], 8));
                    vec![relayout_fused_parity_weight(&data, &ws, f, rows).0.len()]
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
        assert_eq!(upsample_vec_name(CONV_MMA_M128N32_V2.name), None);
        let k = ConvKernel::UpsampleVec(
            MMA_CONFIGS
                .iter()
                .find(|c| c.name == CONV_MMA_M128N64_V8.name)
                .unwrap(),
        );
        assert!(k.funcs()[0].starts_with("convt_up_"), "{k:?}");
    }

    /// The H200 defaults and a forced mma tile.
    #[test]
    fn caps_and_forced_tiles() {
        let c = ArchCaps::h200();
        assert_eq!((c.sm, c.sm_count, c.conv_mma), (90, 132, true));
        assert!(!ArchCaps::new(7, 5, 40, 65536).conv_mma);
        assert_eq!(c.norm_blocks(1), 1);
        assert_eq!(c.norm_blocks(1 << 30), 264);
        // A forced tile applies only where its gather width divides the conv's.
        let forced = ArchCaps {
            conv_tile: Some(&CONV_MMA_M128N64_V8),
            ..c
        };
        assert_eq!(forced.mma_tile(1000, 32, 8).name, CONV_MMA_M128N64_V8.name);
        assert_eq!(forced.mma_tile(1000, 32, 2).name, CONV_MMA_M128N32_V2.name);
    }

    /// Split-K: SwinUNETR's 768-channel 3^3 conv on 3^3 voxels (its output tiles fill under a
    /// tenth of the H200) splits into at most as many parts as fill the SMs; a short K (the
    /// 1x1 768 -> 384), a forced tile or the switch off does not split; the partials' bytes
    /// follow the split.
    #[test]
    fn split_k_where_tiles_starve() {
        // The default rule before `split_k_fill` (on by default), then with it.
        let h = ArchCaps {
            split_k_fill: false,
            ..ArchCaps::h200()
        };
        let g = geom([768, 3, 3, 3], [768, 3, 3, 3], 3, 1, 1, false);
        let k = ConvKernel::choose(&h, 2, &g);
        let ConvKernel::SplitK(t, ks) = k else {
            panic!("768 -> 768 at 3^3: {k:?}")
        };
        let tiles = 54usize.div_ceil(t.bm) * 768usize.div_ceil(t.bn);
        assert!(ks > 1 && tiles * ks <= 132, "{tiles} tiles x {ks}");
        assert_eq!(ks, split_k(132, 54, 768, 768 * 27, t, 1));
        assert_eq!(k.partial_bytes(54, 768), ks * 54 * 768 * 4);
        assert_eq!(ConvKernel::Mma(t).partial_bytes(54, 768), 0);
        let short = geom([768, 6, 6, 6], [384, 6, 6, 6], 1, 1, 1, false);
        assert!(matches!(
            ConvKernel::choose(&h, 2, &short),
            ConvKernel::Mma(_)
        ));
        let off = ArchCaps {
            split_k: false,
            ..h
        };
        assert!(matches!(
            ConvKernel::choose(&off, 2, &g),
            ConvKernel::Mma(_)
        ));
        let forced = ArchCaps {
            conv_tile: Some(&CONV_MMA_M128N64_V8),
            ..h
        };
        assert!(matches!(
            ConvKernel::choose(&forced, 2, &g),
            ConvKernel::Mma(_)
        ));
        // Enough tiles to fill half the SMs, or fewer than 128 K tiles: no split.
        assert_eq!(split_k(132, t.bm * 67, t.bn, 768 * 27, t, 1), 1);
        assert_eq!(split_k(132, 54, 768, 127 * 32, t, 1), 1);
        assert_eq!(split_k(132, 1, 64, 1 << 20, t, 1), 16);
        // Two blocks an SM (`split_k_fill`): W1's 8³ 320 -> 320 convs at batch 4 (16 x 5
        // tiles of m128n64) split in 3, over 2 x 132 / 80; 67 tiles now split too, 133 do not.
        let w1_8 = ArchCaps {
            split_k_fill: true,
            ..h
        };
        let g8 = geom([320, 8, 8, 8], [320, 8, 8, 8], 3, 1, 1, false);
        assert!(matches!(
            ConvKernel::choose(&h, 4, &g8),
            ConvKernel::Mma(t) if t.name == CONV_MMA_M128N64_V8.name
        ));
        assert!(matches!(
            ConvKernel::choose(&w1_8, 4, &g8),
            ConvKernel::SplitK(t, 3) if t.name == CONV_MMA_M128N64_V8.name
        ));
        assert_eq!(split_k(132, t.bm * 67, t.bn, 768 * 27, t, 2), 3);
        assert_eq!(split_k(132, t.bm * 133, t.bn, 768 * 27, t, 2), 1);
    }

    /// One conv layer per sample: Cin, Cout, input and output edge (cubes), kernel, stride,
    /// transposed.
    type Layer = (usize, usize, usize, usize, usize, usize, bool);

    /// W1 (nnU-Net PlainConvUNet 32..320, 14 classes) at its 128^3 window: encoder, decoder
    /// (k2 s2 transposed convs, then two 3^3 convs on the concat), head.
    const W1: &[Layer] = &[
        (1, 32, 128, 128, 3, 1, false),
        (32, 32, 128, 128, 3, 1, false),
        (32, 64, 128, 64, 3, 2, false),
        (64, 64, 64, 64, 3, 1, false),
        (64, 128, 64, 32, 3, 2, false),
        (128, 128, 32, 32, 3, 1, false),
        (128, 256, 32, 16, 3, 2, false),
        (256, 256, 16, 16, 3, 1, false),
        (256, 320, 16, 8, 3, 2, false),
        (320, 320, 8, 8, 3, 1, false),
        (320, 320, 8, 4, 3, 2, false),
        (320, 320, 4, 4, 3, 1, false),
        (320, 320, 4, 8, 2, 2, true),
        (640, 320, 8, 8, 3, 1, false),
        (320, 256, 8, 16, 2, 2, true),
        (512, 256, 16, 16, 3, 1, false),
        (256, 128, 16, 32, 2, 2, true),
        (256, 128, 32, 32, 3, 1, false),
        (128, 64, 32, 64, 2, 2, true),
        (128, 64, 64, 64, 3, 1, false),
        (64, 32, 64, 128, 2, 2, true),
        (64, 32, 128, 128, 3, 1, false),
        (32, 14, 128, 128, 1, 1, false),
    ];

    /// W2 (MONAI UNet 16..256, two residual units, 14 classes) at its 128^3 window: the
    /// stride-2 units (two convs and the k3 s2 residual), the bottom unit (1x1 residual), the
    /// k3 s2 transposed convs (parity classes) and their one-conv units.
    const W2: &[Layer] = &[
        (1, 16, 128, 64, 3, 2, false),
        (16, 16, 64, 64, 3, 1, false),
        (16, 32, 64, 32, 3, 2, false),
        (32, 32, 32, 32, 3, 1, false),
        (32, 64, 32, 16, 3, 2, false),
        (64, 64, 16, 16, 3, 1, false),
        (64, 128, 16, 8, 3, 2, false),
        (128, 128, 8, 8, 3, 1, false),
        (128, 256, 8, 8, 3, 1, false),
        (256, 256, 8, 8, 3, 1, false),
        (128, 256, 8, 8, 1, 1, false),
        (384, 64, 8, 16, 3, 2, true),
        (128, 32, 16, 32, 3, 2, true),
        (64, 16, 32, 64, 3, 2, true),
        (32, 14, 64, 128, 3, 2, true),
        (14, 14, 128, 128, 3, 1, false),
    ];

    /// The wgmma kernels are chosen on compute capability 9.0 only (their sm_90a build runs
    /// nowhere else), and never when the option turns them off.
    #[test]
    fn wgmma_only_on_sm_90() {
        assert!(ArchCaps::h200().conv_wgmma);
        for (ma, mi) in [(8, 0), (8, 6), (8, 9), (10, 0), (12, 0)] {
            assert!(
                !ArchCaps::new(ma, mi, 100, 227 * 1024).conv_wgmma,
                "sm_{ma}{mi}"
            );
        }
        let off = CudaOptions {
            wgmma_conv: false,
            ..CudaOptions::default()
        };
        assert!(!ArchCaps::with_options(9, 0, 132, 227 * 1024, &off).conv_wgmma);
    }

    /// The z-pair convs run on `_h2t` by default (its `_st` twin with the statistics), the Cin
    /// chunks' forced z-pair kernel too; with `zpair_tma` off on `_h2b` (`zpair_bulk`) or `_h2`;
    /// nothing else changes kernel.
    #[test]
    fn zpair_variants() {
        let g = geom([32, 64, 64, 64], [32, 64, 64, 64], 3, 1, 1, false);
        let g64 = geom([32, 64, 64, 64], [64, 64, 64, 64], 3, 1, 1, false);
        let h = ArchCaps::h200();
        assert!(h.zpair_tma);
        for (tma, bulk, want) in [
            (true, false, "conv_wz_c32_y16_h2t"),
            (true, true, "conv_wz_c32_y16_h2t"),
            (false, true, "conv_wz_c32_y16_h2b"),
            (false, false, "conv_wz_c32_y16_h2"),
        ] {
            let caps = ArchCaps {
                zpair_tma: tma,
                zpair_bulk: bulk,
                ..h
            };
            let k = ConvKernel::choose(&caps, 4, &g);
            assert_eq!(k.funcs(), [want]);
            let (st, _) = k.with_norm_stats([32, 64, 64, 64], 32, 0).unwrap();
            assert_eq!(st.funcs(), [format!("{want}_st")]);
            let forced = ArchCaps {
                halo_tile: crate::backend::cuda::host::select::zpair_config(32),
                ..caps
            };
            assert_eq!(ConvKernel::choose(&forced, 4, &g64).funcs(), [want]);
            for (ci, co, i, o, k, s, t) in W1.iter().chain(W2) {
                let g = geom([*ci, *i, *i, *i], [*co, *o, *o, *o], *k, *s, 1, *t);
                let (a, b) = (
                    ConvKernel::choose(&h, 4, &g),
                    ConvKernel::choose(&caps, 4, &g),
                );
                match (&a, &b) {
                    (ConvKernel::Halo(x), ConvKernel::Halo(y)) if x.name != y.name => {
                        assert_eq!((x.name, y.name), (CONV_WZ_C32_Y16_H2T.name, want))
                    }
                    _ => assert_eq!(a, b),
                }
            }
        }
    }

    /// The kernels of every W1 / W2 layer on the H200 at batch 2 and 4, pinned: a change to
    /// the catalogue, its order or the selection that moves a benchmark layer shows here. (W2's
    /// width-16 convs, the 32->32 convs and the stride-2 Cin-32 convs take wgmma kernels, and
    /// so do W1's Cin-64k convs to Cout 128 and 256 where their tiles fill the SMs (the
    /// implicit GEMM, `conv_wgk_*`); everything else the mma.sync ones, W1's 8^3 / 4^3 layers
    /// with their K split where their tiles leave most SMs idle.)
    #[test]
    fn w1_w2_kernels_are_pinned() {
        let pick = |net: &[Layer], batch: usize| -> Vec<String> {
            net.iter()
                .map(|&(ci, co, i, o, k, s, t)| {
                    let g = geom([ci, i, i, i], [co, o, o, o], k, s, 1, t);
                    let kern = ConvKernel::choose(&ArchCaps::h200(), batch, &g);
                    let kind = format!("{kern:?}");
                    let kind = kind.split('[').next().unwrap_or("");
                    format!("{kind} {}", kern.funcs().join(" "))
                })
                .collect()
        };
        // W1 at batch 2; at batch 4 the layers listed in `w1_b4` change tile.
        let w1_b2 = [
            "Cin1 conv_c1_k3",
            "Halo conv_wz_c32_y16_h2t",
            "Halo conv_wg_c32n64_s2p",
            "Halo conv_halo_c64n64",
            "Wgk conv_wgk_n128_s2",
            "Wgk conv_wgk_n128",
            "Mma conv_mma_m128n64_v8",
            "Mma conv_mma_m128n64_v8",
            "SplitK conv_mma_m128n64_v8 conv_splitk_reduce",
            "SplitK conv_mma_m128n64_v8 conv_splitk_reduce",
            "SplitK conv_mma_m128n64_v8 conv_splitk_reduce",
            "SplitK conv_mma_m128n64_v8 conv_splitk_reduce",
            "UpsampleVec convt_up_m128n64_v8",
            "SplitK conv_mma_m128n64_v8 conv_splitk_reduce",
            "UpsampleVec convt_up_m128n64_v8",
            "Mma conv_mma_m128n64_v8",
            "UpsampleVec convt_up_m128n128_v8",
            "Wgk conv_wgk_n128",
            "UpsampleVec convt_up_m128n128_v8",
            "Halo conv_halo_c64n64",
            "Up2 convt_up2_p",
            "Halo conv_halo_c32n32_w4",
            "Pointwise conv1x1_mma_n16",
        ];
        // (The 8^3 layers' tiles fill under one block an SM at batch 4 too: their K splits,
        // `split_k_fill`, as the 4^3 ones' does.)
        let w1_b4: &[(usize, &str)] = &[
            (6, "Wgk conv_wgk_n256_s2"),
            (7, "Wgk conv_wgk_n256"),
            (14, "UpsampleVec convt_up_m128n128_v8"),
            (15, "Wgk conv_wgk_n256"),
        ];
        // W2 at batch 2; at batch 4 the layers listed in `w2_b4` change tile (none today).
        let w2_b2 = [
            "Cin1 conv_c1_k3",
            "Halo conv_wg_c16n16_r8",
            "Mma conv_mma_m128n32_v8",
            "Halo conv_wz_c32_y16_h2t",
            "Mma conv_mma_m128n64_v8",
            "Halo conv_halo_c64n64",
            "Mma conv_mma_m128n64_v8",
            "Halo conv_halo_c64n64",
            "Mma conv_mma_m128n64_v8",
            "SplitK conv_mma_m128n64_v8 conv_splitk_reduce",
            "Mma conv_mma_m128n64_v8",
            "ParityFusedWgk conv_wgk_up_n128",
            "ParityFusedWgk conv_wgk_up_n128",
            "ParityFusedWgk conv_wgk_up_n128",
            "ParityFusedVec convt_up_m128n128_v8",
            "Halo conv_wg_c16n16_r8",
        ];
        let w2_b4: &[(usize, &str)] = &[];
        // The batch-4 list: batch 2's with the changes applied.
        let at_b4 = |b2: &[&str], changes: &[(usize, &str)]| -> Vec<String> {
            let mut v: Vec<String> = b2.iter().map(|k| k.to_string()).collect();
            for &(i, k) in changes {
                v[i] = k.to_string();
            }
            v
        };
        assert_eq!(pick(W1, 2), w1_b2);
        assert_eq!(pick(W1, 4), at_b4(&w1_b2, w1_b4));
        assert_eq!(pick(W2, 2), w2_b2);
        assert_eq!(pick(W2, 4), at_b4(&w2_b2, w2_b4));
    }
}
