//! The backend's switches: which kernel variants run (before/after benchmarks, tests that
//! cover every tile) and test aids. `Default` is what production runs.

use crate::backend::cuda::host::catalogue::{HaloConfig, MmaConfig, WgkConfig};

/// Options of one `CudaBackend` (given at construction; `set_options` applies new ones from
/// the next `prepare`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaOptions {
    /// Fill every activation buffer with NaN before each run, so unwritten elements show.
    pub poison: bool,
    /// Run convs on the older wmma implicit GEMM instead of the mma.sync kernels (sm_80+).
    pub legacy_conv: bool,
    /// Run eligible stride-1 3^3 convs (`select::pick_halo`) on the halo-tile kernels rather
    /// than on the `conv_mma_*` tiles. A forced mma tile also turns them off.
    pub halo_conv: bool,
    /// On compute capability 9.0, run the halo convs on the wgmma kernels (`conv_wg_*`,
    /// `select::pick_wgmma`) where one fits, else on `conv_halo_*`.
    pub wgmma_conv: bool,
    /// On compute capability 9.0, run the stride-1 and stride-2 convs with Cin a multiple of 64
    /// and Cout 97..256 that fill the SMs (`select::pick_wgk`) on the wgmma implicit GEMM fed by
    /// tensor loads (`conv_wgk_*`) rather than `conv_mma_*` or a halo kernel.
    pub wgk_conv: bool,
    /// Force this `conv_wgk_*` kernel for every conv of its stride it runs (any Cout, any tile
    /// count); None: the defaults.
    pub wgk_tile: Option<&'static WgkConfig>,
    /// A `conv_wgk_*` conv before a norm runs its `_st` twin, which writes the norm's
    /// statistics (`host::tile_stats`): W1's forward 0.995x on an H100 (PERF_NOTES, session 40).
    pub wgk_stats: bool,
    /// On compute capability 9.0, the fused parity classes of strided transposed convs with Cin
    /// of two or more k-steps a tap (Cin 64k, `select::pick_wgk_up`) on the wgmma implicit GEMM
    /// (`conv_wgk_up_*`) rather than `convt_up_*` on mma.sync: W2's forward 0.985x on an H100
    /// (PERF_NOTES, session 41). A forced `wgk_tile` of theirs takes any Cin 32k.
    pub wgk_convt: bool,
    /// Run Cin-1 3^3 convs (stride 1/2, Cout <= 64) on `CONV_C1_K3`.
    pub c1_conv: bool,
    /// Run kernel == stride transposed convs with Cin, Cout % 8 == 0, and fused parity classes
    /// with Cin % 8 == 0, on `convt_up_*` (staged epilogue) rather than the `conv_mma_*`
    /// scatter epilogue.
    pub upsample_vec: bool,
    /// kernel == stride == 2 transposed convs (Cin 16 / 32 / 64, Cout <= 32) on the persistent
    /// `convt_up2_p`, the next tile's input in flight while a tile is stored, rather than the
    /// upsampling GEMM (`ConvKernel::Up2`).
    pub convt_up2: bool,
    /// Run a strided transposed conv whose parity classes share one grid as one launch over
    /// the union of their taps, rather than one launch per class.
    pub fused_parity: bool,
    /// Force this halo kernel for the halo convs whose Cin it accepts and tile width it matches
    /// (any Cout); None: the defaults.
    pub halo_tile: Option<&'static HaloConfig>,
    /// Force this mma tile for every mma conv; None: by shape. A `_v8` tile still falls back
    /// to `_v1` where Cin % 8 != 0.
    pub conv_tile: Option<&'static MmaConfig>,
    /// Where `segment_windows*` gathers the windows (both give the same bits).
    pub gather_mode: GatherMode,
    /// Keep a conv output that only InstanceNorm / GroupNorm read in fp32 (more activation
    /// bytes, fewer flipped labels: see `BufferPlan::f32_values`). Off only to measure it.
    pub norm_f32: bool,
    /// Split the K of tile-starved mma convs over several blocks (`select::split_k`).
    pub split_k: bool,
    /// With `split_k`: split where the output tiles fill under one block an SM (not half),
    /// to about two blocks an SM: W1's 8³ 320-channel convs (80 m128n64 tiles on 132 SMs,
    /// unsplit at ~75 TF/s) in 3. W1's forward 0.981x on an H200 (session 34).
    pub split_k_fill: bool,
    /// Add a residual that only an Add reads after an InstanceNorm / GroupNorm (and its
    /// activation) in the norm's affine pass (`fusion::fusable_residual`): the Add never runs
    /// (MONAI's residual units: norm, PReLU, then + the shortcut). The same bits as the Add's
    /// own launch (session 31, H200: W2's forward 0.993x, bit for bit).
    pub norm_residual: bool,
    /// Run a 1x1x1 head that reads an InstanceNorm / GroupNorm (after its activation) on the
    /// norm's input, normalised on load (`fusion::fusable_norm_head`): the norm's output is
    /// never written.
    pub norm_head: bool,
    /// Run the launches at the window's full resolution before the first downsampling and after
    /// the last upsampling one window at a time (`host::windowed`), where that lowers the
    /// activation bytes live at once: their own buffers then hold one window, not the batch.
    pub window_segments: bool,
    /// Run the pointwise heads on their `_s` twins, which load the block's voxels through
    /// shared memory in coalesced 16-byte pieces (kernels/conv_small.cu). Off until measured.
    pub head_staged: bool,
    /// Run the pointwise heads of Cin 16 or 32 and Cout <= 16 on mma.sync, 16 voxels a
    /// warp (`conv1x1_mma_n16`, `conv1x1_norm_mma_n16`) rather than one thread per voxel: the
    /// same fp16 inputs, fp16 weights as every other conv's, the sums in another order. W1's
    /// forward 0.982x (H200, session 35), 0.989x (H100, session 37).
    pub head_mma: bool,
    /// Let a conv whose output only an InstanceNorm / GroupNorm right after it reads write that
    /// norm's statistics per output tile in its epilogue (the `_st` kernels,
    /// `host::tile_stats`), so the norm skips its partial-sum pass over the conv's output
    /// (W1's forward 0.973x, PERF_NOTES session 25).
    pub norm_stats: bool,
    /// With `norm_stats`: a Cin-1 conv whose output only an InstanceNorm / GroupNorm reads is
    /// run by the norm's launch twice, once for the statistics (no output) and once more after
    /// them, normalising and activating on store (`conv_c1_k3_sto`, `conv_c1_k3_nrm`): its fp32
    /// output is never written nor read (W1: 128 bytes a voxel, twice). The same bits as conv,
    /// norm and affine pass. Off until measured.
    pub norm_recompute: bool,
    /// With `norm_stats`: a strided transposed conv on the fused parity classes' staged epilogue
    /// also hands the norm after it its statistics (`convt_up_*_st`: W2's 32 -> 14 and 64 -> 16
    /// at 128³ / 64³): W2's forward 0.950x on an H100, W1's ~1.0 (PERF_NOTES, sessions 34, 40).
    pub convt_stats: bool,
    /// Run a conv over a channel concat whose parts the z-pair kernel takes (and the whole does
    /// not) as one launch per part, each on its slice of the weights, the later ones adding to
    /// the fp32 output (`host::concat_split`): the concat is never written (W1's forward 0.970x,
    /// with `norm_stats` 0.932x: PERF_NOTES, session 25).
    pub concat_split: bool,
    /// With `concat_split`: also run a conv (or a concat part) of Cin = k x 32 that a halo kernel
    /// would take whole as k launches of 32 input channels on the z-pair kernel (Cout in
    /// 32-channel tiles), the later ones adding to the fp32 output, where such a launch has a
    /// tile for every SM (W1's Cin-64 convs at 64³ at batch 4): 0.966x of W1's forward on an
    /// H100 (session 33), W2 unchanged.
    pub cin_chunks: bool,
    /// With `norm_head`: a z-pair conv (`conv_wz_*`) that alone reads an InstanceNorm /
    /// GroupNorm (after its activation) also reads the norm's input, normalised and activated
    /// on load (its `_nl` twin), so the norm's output is never written: W1's second conv at
    /// 128³ in the encoder and in the decoder. Off until measured.
    pub norm_load_conv: bool,
    /// Run stride-2 3^3 convs of Cin = k x 32 on a halo kernel (`conv_halo_c32n64_s2`: the
    /// tile's input reach copied once) rather than the implicit GEMM. Off until measured.
    pub halo_s2: bool,
    /// Run stride-2 3^3 convs of Cin 32 and Cout <= 128 on wgmma (`conv_wg_c32n64_s2p`:
    /// persistent, resident weights, the tile's input reach copied once, stored by parity
    /// class) rather than the implicit GEMM: W1's 32 -> 64 layer 0.688x (H100, session 36).
    pub wg_s2: bool,
    /// With `zpair_tma` off: run the z-pair convs on `_h2b` rather than `_h2` (catalogue
    /// `CONV_WZ_C32_Y16_H2B`): the staged planes of an fp32 output stored as staged go out as
    /// bulk copies, not the helper's stores. The same bits; W1's forward 1.017x (session 34).
    pub zpair_bulk: bool,
    /// Run the z-pair convs on `_h2t` (`CONV_WZ_C32_Y16_H2T`): `_h2b` whose slots come in by
    /// tensor loads (TMA), not the helper's copies. The same bits; W1's forward 0.986x on an
    /// H200 (session 34: the plain launches 6-10% faster, the `_st` ones 2.6% slower).
    pub zpair_tma: bool,
    /// With `zpair_tma`: the z-pair convs that write a norm's statistics run `_h2l_st` (tensor
    /// loads, the helper's own stores) rather than `_h2t_st` (bulk stores): their helper reads
    /// the rows for the statistics anyway. The same bits; W1's forward 0.979x (H100, session 35).
    pub zpair_st_staged: bool,
    /// A z-pair or Cin-1 conv handing the norm after it its statistics (`_st` twin, not
    /// accumulating, Cout % 8 == 0) stores fp16 values less its output tile's shift (the statistics' own, the
    /// tile's first voxel) rather than fp32, and the norm adds the shift back
    /// (`affine_act_v8_shifted`): half the bytes of the fp32 output, whose point was that fp16
    /// rounding relative to a value far from 0 grows relative to the normalised result; here it
    /// is relative to the value's distance from its tile's first one. W1's forward 0.976x (H100,
    /// session 35, the z-pair pair alone; the Cin-1 one since session 37).
    pub norm_shifted: bool,
    /// The affine pass over a shifted norm input whose W and tile x fit (`ShiftedOut::runs_fit`)
    /// goes by runs of 4 voxels along x (`affine_act_v8_shifted_runs`), a run's 8 shifts and 8
    /// pairs loaded once rather than once a voxel (192 bytes of L1 loads for 16 of input): the
    /// same bits. W1's forward 1.008x on an H100 (session 44: its 128³ passes -5%, near the copy
    /// ceiling either way; its 64³ ones -34%).
    pub norm_runs: bool,
    /// Replay each batch's launch list as a CUDA graph (`launch_list::Graphs`) rather than
    /// launching its steps one by one (the same kernels on the same buffers either way).
    pub graphs: bool,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            poison: false,
            legacy_conv: false,
            halo_conv: true,
            wgmma_conv: true,
            wgk_conv: true,
            wgk_tile: None,
            wgk_stats: true,
            wgk_convt: true,
            c1_conv: true,
            upsample_vec: true,
            convt_up2: true,
            fused_parity: true,
            halo_tile: None,
            conv_tile: None,
            gather_mode: GatherMode::Auto,
            norm_f32: true,
            split_k: true,
            split_k_fill: true,
            norm_head: true,
            norm_residual: true,
            window_segments: true,
            head_staged: false,
            head_mma: true,
            norm_stats: true,
            norm_recompute: false,
            convt_stats: true,
            concat_split: true,
            cin_chunks: true,
            norm_load_conv: false,
            halo_s2: false,
            wg_s2: true,
            zpair_bulk: false,
            zpair_tma: true,
            zpair_st_staged: true,
            norm_shifted: true,
            norm_runs: true,
            graphs: true,
        }
    }
}

/// Where the windows of a batch are gathered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GatherMode {
    /// `Device` when its plane ring is small next to the accumulator ring or no larger than the
    /// host gather's staging (`stream::device_gather_fits`), else `Host`.
    #[default]
    Auto,
    /// The volume's D-planes are converted to f16 on the host once each, streamed into a device
    /// ring in step with the accumulator ring, and a kernel gathers the windows from it: about
    /// 1/overlap^3 of the host work and copies of `Host`; device memory still independent of D.
    Device,
    /// Every window is gathered on the host into pinned staging and copied in (the reference).
    Host,
}
