//! Pad and channel Tile: gathers on NDHWC fp16 (kernels/pad.cu), the index maps of
//! `model::ops::pad` passed per axis.

use super::NodeIo;
use crate::backend::cuda::abi::Shape;
use crate::backend::cuda::host::catalogue::{PAD_NDHWC, TILE_CHANNELS};
use crate::backend::cuda::runtime::launch::{i32a, Arg, Gpu};
use crate::model::graph::{Pad, PadMode};
use crate::model::ops::AxisMap;
use crate::{Error, Result};
use cudarc::driver::CudaStream;

/// A pad launch: per-sample input / output shapes [C, D, H, W] and the axis maps.
pub(crate) struct PadStep {
    pub x: u64,
    pub y: u64,
    pub xshape: Shape,
    pub oshape: Shape,
    /// C, D, H, W.
    pub maps: [AxisMap; 4],
    /// 0 constant, 1 reflect, 2 edge (kernels/pad.cu).
    pub mode: i32,
    pub value: f32,
}

/// A channel tile launch.
pub(crate) struct TileStep {
    pub x: u64,
    pub y: u64,
    /// Voxels per sample.
    pub pix: usize,
    pub cin: usize,
    pub cout: usize,
}

/// The pad of node `p` from the node's input to its output shape. A rank-5 value stored
/// row-major (`tensor_layout`: a `[N, D, H, W, C]` token tensor) is NDHWC storage of the NCDHW
/// value with its axes 4, 1, 2, 3 as C, D, H, W, so the same kernel pads it with the maps
/// taken in that order.
pub(crate) fn pad(p: &Pad, io: &NodeIo) -> Result<PadStep> {
    let order = if io.st[0].ndhwc {
        [1, 2, 3, 4]
    } else {
        [4, 1, 2, 3]
    };
    let (xd, od) = (io.st[0].dims, io.ost.dims);
    let xshape = order.map(|a| xd[a]);
    let oshape = order.map(|a| od[a]);
    let mut maps = [AxisMap {
        lo: 0,
        len: 0,
        shift: 0,
        out: 0,
    }; 4];
    for (m, &a) in maps.iter_mut().zip(&order) {
        *m = p
            .axis(a, xd[a])
            .map_err(|e| Error::Graph(format!("node {}: {e}", io.name)))?;
    }
    if maps.map(|m| m.out) != oshape || io.st[0].ndhwc != io.ost.ndhwc {
        return Err(Error::Graph(format!(
            "node {}: pad maps {xshape:?} to {:?}, the plan says {oshape:?}",
            io.name,
            maps.map(|m| m.out),
        )));
    }
    Ok(PadStep {
        x: io.x,
        y: io.y,
        xshape,
        oshape,
        maps,
        mode: match p.mode {
            PadMode::Constant => 0,
            PadMode::Reflect => 1,
            PadMode::Edge => 2,
        },
        value: p.value,
    })
}

/// The channel tile from the node's input to its output channels.
pub(crate) fn tile(io: &NodeIo) -> TileStep {
    TileStep {
        x: io.x,
        y: io.y,
        pix: io.pix,
        cin: io.xshape[0],
        cout: io.oshape[0],
    }
}

impl PadStep {
    /// Launches the pad for `n` samples.
    pub fn launch(&self, gpu: &Gpu, s: &CudaStream, n: usize) -> Result<()> {
        let total = n * self.oshape.iter().product::<usize>();
        let mut args = vec![
            Arg::Ptr(self.x),
            Arg::Ptr(self.y),
            Arg::I64(total as i64),
            Arg::I32(self.mode),
            Arg::F32(self.value),
        ];
        args.extend(self.xshape.iter().map(|&v| i32a(v)));
        args.extend(self.oshape.iter().map(|&v| i32a(v)));
        for m in &self.maps {
            args.extend([i32a(m.lo), i32a(m.len), i32a(m.shift)]);
        }
        gpu.eltwise(s, PAD_NDHWC.name, total, &mut args)
    }
}

impl TileStep {
    /// Launches the tile for `n` samples.
    pub fn launch(&self, gpu: &Gpu, s: &CudaStream, n: usize) -> Result<()> {
        let p = n * self.pix;
        gpu.eltwise(
            s,
            TILE_CHANNELS.name,
            p * self.cout,
            &mut [
                Arg::Ptr(self.x),
                Arg::Ptr(self.y),
                Arg::I64(p as i64),
                i32a(self.cin),
                i32a(self.cout),
            ],
        )
    }
}
