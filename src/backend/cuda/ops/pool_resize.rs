//! Max / average pooling and nearest / linear resize.

use super::NodeIo;
use crate::backend::cuda::abi::PoolParams;
use crate::backend::cuda::host::catalogue::{POOL_KERNEL, RESIZE_KERNEL};
use crate::backend::cuda::host::fusion::is_linear;
use crate::backend::cuda::runtime::launch::{i32a, Arg, Gpu};
use crate::model::graph::{CoordMode, NearestMode, Op, Pool, Resize};
use crate::Result;
use cudarc::driver::CudaStream;

/// A resize launch: input / output sizes per sample and the kernel's mode codes.
pub(crate) struct ResizeStep {
    pub x: u64,
    pub y: u64,
    pub c: usize,
    pub i: [usize; 3],
    pub o: [usize; 3],
    pub scales: [f32; 3],
    pub linear: bool,
    pub coord: i32,
    pub nmode: i32,
}

/// The parameter block of pool node `op` for `batch` samples.
pub(crate) fn pool_params(op: &Op, p: &Pool, io: &NodeIo, batch: usize) -> PoolParams {
    let (xs, os) = (io.xshape, io.oshape);
    PoolParams {
        n: batch as i32,
        di: xs[1] as i32,
        hi: xs[2] as i32,
        wi: xs[3] as i32,
        c: xs[0] as i32,
        do_: os[1] as i32,
        ho: os[2] as i32,
        wo: os[3] as i32,
        kd: p.kernel[0] as i32,
        kh: p.kernel[1] as i32,
        kw: p.kernel[2] as i32,
        sd: p.stride[0] as i32,
        sh: p.stride[1] as i32,
        sw: p.stride[2] as i32,
        dd: p.dilation[0] as i32,
        dh: p.dilation[1] as i32,
        dw: p.dilation[2] as i32,
        pd: p.pads[0] as i32,
        ph: p.pads[1] as i32,
        pw: p.pads[2] as i32,
        ped: p.pads[3] as i32,
        peh: p.pads[4] as i32,
        pew: p.pads[5] as i32,
        is_max: matches!(op, Op::MaxPool(_)) as i32,
        count_include_pad: p.count_include_pad as i32,
    }
}

/// The resize of node `r` from the node's input to its output size.
pub(crate) fn resize(r: &Resize, io: &NodeIo) -> ResizeStep {
    let (xs, os) = (io.xshape, io.oshape);
    let i = [xs[1], xs[2], xs[3]];
    let o = [os[1], os[2], os[3]];
    let coord = match r.coord {
        CoordMode::HalfPixel => 0,
        CoordMode::PytorchHalfPixel => 1,
        CoordMode::AlignCorners => 2,
        CoordMode::Asymmetric => 3,
    };
    let nmode = match r.nearest {
        NearestMode::RoundPreferFloor => 0,
        NearestMode::RoundPreferCeil => 1,
        NearestMode::Floor => 2,
        NearestMode::Ceil => 3,
    };
    ResizeStep {
        x: io.x,
        y: io.y,
        c: xs[0],
        i,
        o,
        scales: r.coord_scales(i, o),
        linear: is_linear(r),
        coord,
        nmode,
    }
}

/// Launches a pool for `n` samples.
pub(crate) fn launch_pool(
    gpu: &Gpu,
    s: &CudaStream,
    p: &PoolParams,
    [x, y]: [u64; 2],
    n: usize,
) -> Result<()> {
    let mut p = *p;
    p.n = n as i32;
    let total = n * (p.do_ * p.ho * p.wo * p.c) as usize;
    gpu.eltwise(
        s,
        POOL_KERNEL.name,
        total,
        &mut [Arg::Pool(p), Arg::Ptr(x), Arg::Ptr(y)],
    )
}

impl ResizeStep {
    /// Launches the resize for `n` samples.
    pub fn launch(&self, gpu: &Gpu, s: &CudaStream, n: usize) -> Result<()> {
        let (i, o) = (self.i, self.o);
        let total = n * self.c * o.iter().product::<usize>();
        gpu.eltwise(
            s,
            RESIZE_KERNEL.name,
            total,
            &mut [
                Arg::Ptr(self.x),
                Arg::Ptr(self.y),
                i32a(n),
                i32a(self.c),
                i32a(i[0]),
                i32a(i[1]),
                i32a(i[2]),
                i32a(o[0]),
                i32a(o[1]),
                i32a(o[2]),
                Arg::F32(self.scales[0]),
                Arg::F32(self.scales[1]),
                Arg::F32(self.scales[2]),
                Arg::I32(self.linear as i32),
                Arg::I32(self.coord),
                Arg::I32(self.nmode),
            ],
        )
    }
}
