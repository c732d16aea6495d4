//! Elementwise math beyond `eltwise`: the [`Pointwise`] functions and two-activation binaries
//! whose shapes differ (numpy broadcasting) or that `eltwise` has no code for (Max, Min, Pow).
//! Equal-shape Add/Sub/Mul/Div stay on `eltwise`'s vectorised kernels.

use super::eltwise::Bin;
use super::NodeIo;
use crate::backend::cuda::abi::Shape;
use crate::backend::cuda::host::catalogue::{BINARY_BCAST_KERNEL, POINTWISE_KERNEL};
use crate::backend::cuda::runtime::launch::{Arg, Gpu};
use crate::model::graph::Op;
use crate::{Error, Result};
use cudarc::driver::CudaStream;

/// One launch. Pointers are final; sizes are per sample (times n at run).
pub(crate) enum MathStep {
    Pointwise {
        x: u64,
        y: u64,
        len: usize,
        /// `Pointwise::code`: function and its two parameters.
        code: (i32, f32, f32),
    },
    Broadcast {
        a: u64,
        b: u64,
        y: u64,
        /// The output's per-sample shape [C, D, H, W].
        out: Shape,
        /// Element strides of a and b along (N, D, H, W, C), 0 where broadcast.
        sa: [i64; 5],
        sb: [i64; 5],
        op: i32,
        /// y's channel stride and offset (a concat slice, else C and 0).
        ldc: usize,
        coff: usize,
    },
}

/// Binary op codes of `bin_any` in kernels/eltwise.cu (`Bin`'s, then these).
pub(crate) fn code(op: &Op) -> Option<i32> {
    Some(match op {
        Op::Add => Bin::Add as i32,
        Op::Mul => Bin::Mul as i32,
        Op::Sub => Bin::Sub as i32,
        Op::Div => Bin::Div as i32,
        Op::Max => 4,
        Op::Min => 5,
        Op::Pow => 6,
        _ => return None,
    })
}

/// Whether node `op` with these inputs runs here rather than in `eltwise`.
pub(crate) fn handles(op: &Op, io: &NodeIo) -> bool {
    match op {
        Op::Pointwise(_) | Op::Max | Op::Min | Op::Pow => true,
        Op::Add | Op::Mul | Op::Sub | Op::Div => io.shapes.iter().any(|s| *s != io.oshape),
        _ => false,
    }
}

/// NDHWC element strides (N, D, H, W, C) of an operand of per-sample shape `s` read at the
/// positions of `out`: 0 along broadcast axes; None when `s` does not broadcast to `out`.
pub(crate) fn ndhwc_strides(s: &Shape, out: &Shape) -> Option<[i64; 5]> {
    // Layout order innermost first: C, W, H, D.
    let axes = [0usize, 3, 2, 1];
    let mut st = [0i64; 5];
    let mut acc = 1i64;
    for (k, &ax) in axes.iter().enumerate() {
        if s[ax] == out[ax] {
            st[4 - k] = if s[ax] == 1 { 0 } else { acc };
        } else if s[ax] != 1 {
            return None;
        }
        acc *= s[ax] as i64;
    }
    st[0] = acc;
    Some(st)
}

/// The launch of math node `op` (see [`handles`]).
pub(crate) fn build(op: &Op, io: &NodeIo) -> Result<MathStep> {
    if let Op::Pointwise(f) = op {
        return Ok(MathStep::Pointwise {
            x: io.x,
            y: io.y,
            len: io.xshape.iter().product(),
            code: f.code(),
        });
    }
    let bad = || {
        Error::Graph(format!(
            "node {}: operands {:?} do not broadcast to [N,{:?}] on CUDA",
            io.name, io.shapes, io.oshape
        ))
    };
    let op_code = code(op).ok_or_else(bad)?;
    let (Some(sa), Some(sb)) = (
        io.shapes.first().and_then(|s| ndhwc_strides(s, &io.oshape)),
        io.shapes.get(1).and_then(|s| ndhwc_strides(s, &io.oshape)),
    ) else {
        return Err(bad());
    };
    Ok(MathStep::Broadcast {
        a: io.xs[0],
        b: io.xs[1],
        y: io.y,
        out: io.oshape,
        sa,
        sb,
        op: op_code,
        ldc: io.ldc,
        coff: io.coff,
    })
}

impl MathStep {
    /// Launches the step for `n` samples on `s`.
    pub fn launch(&self, gpu: &Gpu, s: &CudaStream, n: usize) -> Result<()> {
        match self {
            MathStep::Pointwise { x, y, len, code } => gpu.eltwise(
                s,
                POINTWISE_KERNEL.name,
                n * len,
                &mut [
                    Arg::Ptr(*x),
                    Arg::Ptr(*y),
                    Arg::I64((n * len) as i64),
                    Arg::I32(code.0),
                    Arg::F32(code.1),
                    Arg::F32(code.2),
                ],
            ),
            MathStep::Broadcast {
                a,
                b,
                y,
                out,
                sa,
                sb,
                op,
                ldc,
                coff,
            } => {
                let total = n * out.iter().product::<usize>();
                let mut args = vec![
                    Arg::Ptr(*a),
                    Arg::Ptr(*b),
                    Arg::Ptr(*y),
                    Arg::I64(total as i64),
                    Arg::I32(out[1] as i32),
                    Arg::I32(out[2] as i32),
                    Arg::I32(out[3] as i32),
                    Arg::I32(out[0] as i32),
                ];
                args.extend(sa.iter().chain(sb).map(|&v| Arg::I64(v)));
                args.extend([Arg::I32(*op), Arg::I32(*ldc as i32), Arg::I32(*coff as i32)]);
                gpu.eltwise(s, BINARY_BCAST_KERNEL.name, total, &mut args)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ndhwc_strides_of_gates_and_channel_vectors() {
        let out = [4, 3, 5, 6];
        assert_eq!(ndhwc_strides(&out, &out), Some([360, 120, 24, 4, 1]));
        // A gate [1, D, H, W]: C broadcast.
        assert_eq!(ndhwc_strides(&[1, 3, 5, 6], &out), Some([90, 30, 6, 1, 0]));
        // A channel vector [C, 1, 1, 1].
        assert_eq!(ndhwc_strides(&[4, 1, 1, 1], &out), Some([4, 0, 0, 0, 1]));
        assert_eq!(ndhwc_strides(&[1, 1, 1, 1], &out), Some([1, 0, 0, 0, 0]));
        assert_eq!(ndhwc_strides(&[2, 3, 5, 6], &out), None);
    }
}
