//! Elementwise ops: activations, binaries (two tensors or a broadcast constant), channel concat
//! copies, identity copies and the channel softmax.

use super::norm::slope_n;
use super::{Build, NodeIo};
use crate::backend::cuda::abi::{Act, Shape};
use crate::backend::cuda::host::catalogue::{
    ACT_KERNEL, ACT_V8, BINARY_CONST_KERNEL, BINARY_KERNEL, BINARY_V8, CONCAT_COPY, CONCAT_COPY_V8,
    COPY_HALF, SOFTMAX_CHANNELS,
};
use crate::backend::cuda::runtime::launch::{Arg, Gpu};
use crate::model::graph::{Op, Tensor};
use crate::{Error, Result};
use cudarc::driver::CudaStream;

/// Binary op codes of kernels/eltwise.cu.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Bin {
    Add = 0,
    Mul = 1,
    Sub = 2,
    Div = 3,
}

/// One elementwise launch. Pointers are final; sizes are per sample (times n at run).
pub(crate) enum Elt {
    Act {
        x: u64,
        y: u64,
        len: usize,
        c: usize,
        act: Act,
        slope: u64,
    },
    Binary {
        a: u64,
        b: u64,
        y: u64,
        len: usize,
        op: Bin,
        /// Channels of a and b; y's channel stride and offset (a concat slice, else c and 0).
        c: usize,
        ldc: usize,
        coff: usize,
    },
    BinaryConst {
        x: u64,
        k: u64,
        y: u64,
        shape: Shape,
        ks: [i64; 5],
        op: Bin,
    },
    Concat {
        x: u64,
        y: u64,
        pix: usize,
        cin: usize,
        ctot: usize,
        coff: usize,
    },
    Copy {
        x: u64,
        y: u64,
        len: usize,
    },
    Softmax {
        x: u64,
        y: u64,
        pix: usize,
        c: usize,
    },
}

/// The launches of elementwise node `op` (`in_place[v]`: input v already sits in the concat's
/// slice, so the concat copies nothing for it).
pub(crate) fn build(b: &mut Build, op: &Op, io: &NodeIo, in_place: &[bool]) -> Result<Vec<Elt>> {
    let (x, y, xshape) = (io.x, io.y, io.xshape);
    let len = xshape.iter().product::<usize>();
    Ok(match op {
        Op::Relu
        | Op::LeakyRelu { .. }
        | Op::PRelu { .. }
        | Op::Elu { .. }
        | Op::Sigmoid
        | Op::Tanh => {
            let act = Act::of(op).expect("activation");
            let slope = b.act_slope(&act)?;
            vec![Elt::Act {
                x,
                y,
                len,
                c: xshape[0],
                act,
                slope,
            }]
        }
        Op::Add | Op::Mul | Op::Sub | Op::Div => vec![Elt::Binary {
            a: x,
            b: io.xs[1],
            y,
            len,
            op: bin(op),
            c: xshape[0],
            ldc: io.ldc,
            coff: io.coff,
        }],
        Op::AddConst(t) | Op::MulConst(t) => {
            let ks = const_strides(t, &xshape).ok_or_else(|| {
                Error::Graph(format!(
                    "node {}: constant of shape {:?} does not broadcast to [N,{:?}]",
                    io.name, t.shape, xshape
                ))
            })?;
            let k = b.upload_const(&t.data)?;
            vec![Elt::BinaryConst {
                x,
                k,
                y,
                shape: xshape,
                ks,
                op: bin(op),
            }]
        }
        Op::Concat { .. } => {
            let mut out = Vec::new();
            let mut coff = 0;
            for (&cin, (&xp, &done)) in io.cins.iter().zip(io.xs.iter().zip(in_place)) {
                if !done {
                    out.push(Elt::Concat {
                        x: xp,
                        y,
                        pix: io.pix,
                        cin,
                        ctot: io.oshape[0],
                        coff,
                    });
                }
                coff += cin;
            }
            out
        }
        Op::Identity => vec![Elt::Copy { x, y, len }],
        Op::Softmax { .. } => vec![Elt::Softmax {
            x,
            y,
            pix: io.pix,
            c: xshape[0],
        }],
        _ => unreachable!("an elementwise op"),
    })
}

fn bin(op: &Op) -> Bin {
    match op {
        Op::Add | Op::AddConst(_) => Bin::Add,
        Op::Mul | Op::MulConst(_) => Bin::Mul,
        Op::Sub => Bin::Sub,
        _ => Bin::Div,
    }
}

/// Element strides (N, C, D, H, W) of an NCDHW-broadcast constant, 0 on broadcast axes; None
/// when its shape does not broadcast to [N, x] with N broadcast (a constant over N would depend
/// on the batch size).
pub(crate) fn const_strides(t: &Tensor, x: &Shape) -> Option<[i64; 5]> {
    let full = [1, x[0], x[1], x[2], x[3]];
    let mut shape = t.shape.clone();
    if shape.len() > 5 {
        return None;
    }
    while shape.len() < 5 {
        shape.insert(0, 1);
    }
    let mut strides = [0i64; 5];
    let mut acc = 1i64;
    for a in (0..5).rev() {
        if shape[a] == full[a] && shape[a] != 1 {
            strides[a] = acc;
        } else if shape[a] != 1 {
            return None;
        }
        acc *= shape[a] as i64;
    }
    Some(strides)
}

impl Elt {
    /// Launches the op for `n` samples on `s`.
    pub fn launch(&self, gpu: &Gpu, s: &CudaStream, n: usize) -> Result<()> {
        match self {
            Elt::Act {
                x,
                y,
                len,
                c,
                act,
                slope,
            } => {
                let total = n * len;
                let (k, items) = if c % 8 == 0 {
                    (ACT_V8, total / 8)
                } else {
                    (ACT_KERNEL, total)
                };
                gpu.eltwise(
                    s,
                    k.name,
                    items,
                    &mut [
                        Arg::Ptr(*x),
                        Arg::Ptr(*y),
                        Arg::I64(total as i64),
                        Arg::I32(*c as i32),
                        Arg::I32(act.code()),
                        Arg::F32(act.alpha()),
                        Arg::Ptr(*slope),
                        Arg::I32(slope_n(act)),
                    ],
                )
            }
            Elt::Binary {
                a,
                b,
                y,
                len,
                op,
                c,
                ldc,
                coff,
            } => {
                let total = n * len;
                // A whole contiguous output is one flat run of 16-byte vectors whatever C is.
                let flat = ldc == c && *coff == 0 && total.is_multiple_of(8);
                let (c, ldc) = if flat { (8, 8) } else { (*c, *ldc) };
                let (k, items) = if (c | ldc | *coff) % 8 == 0 {
                    (BINARY_V8, total / 8)
                } else {
                    (BINARY_KERNEL, total)
                };
                gpu.eltwise(
                    s,
                    k.name,
                    items,
                    &mut [
                        Arg::Ptr(*a),
                        Arg::Ptr(*b),
                        Arg::Ptr(*y),
                        Arg::I64(total as i64),
                        Arg::I32(*op as i32),
                        Arg::I32(c as i32),
                        Arg::I32(ldc as i32),
                        Arg::I32(*coff as i32),
                    ],
                )
            }
            Elt::BinaryConst {
                x,
                k,
                y,
                shape,
                ks,
                op,
            } => {
                let total = n * shape.iter().product::<usize>();
                gpu.eltwise(
                    s,
                    BINARY_CONST_KERNEL.name,
                    total,
                    &mut [
                        Arg::Ptr(*x),
                        Arg::Ptr(*k),
                        Arg::Ptr(*y),
                        Arg::I32(shape[1] as i32),
                        Arg::I32(shape[2] as i32),
                        Arg::I32(shape[3] as i32),
                        Arg::I32(shape[0] as i32),
                        Arg::I64(total as i64),
                        Arg::I64(ks[0]),
                        Arg::I64(ks[1]),
                        Arg::I64(ks[2]),
                        Arg::I64(ks[3]),
                        Arg::I64(ks[4]),
                        Arg::I32(*op as i32),
                    ],
                )
            }
            Elt::Concat {
                x,
                y,
                pix,
                cin,
                ctot,
                coff,
            } => {
                let p = n * pix;
                let (k, items) = if (cin | ctot | coff) % 8 == 0 {
                    (CONCAT_COPY_V8, p * cin / 8)
                } else {
                    (CONCAT_COPY, p * cin)
                };
                gpu.eltwise(
                    s,
                    k.name,
                    items,
                    &mut [
                        Arg::Ptr(*x),
                        Arg::Ptr(*y),
                        Arg::I64(p as i64),
                        Arg::I32(*cin as i32),
                        Arg::I32(*ctot as i32),
                        Arg::I32(*coff as i32),
                    ],
                )
            }
            Elt::Copy { x, y, len } => gpu.eltwise(
                s,
                COPY_HALF.name,
                n * len,
                &mut [Arg::Ptr(*x), Arg::Ptr(*y), Arg::I64((n * len) as i64)],
            ),
            Elt::Softmax { x, y, pix, c } => gpu.eltwise(
                s,
                SOFTMAX_CHANNELS.name,
                n * pix,
                &mut [
                    Arg::Ptr(*x),
                    Arg::Ptr(*y),
                    Arg::I64((n * pix) as i64),
                    Arg::I32(*c as i32),
                ],
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn const_strides_broadcast() {
        let t = Tensor::new(vec![1, 4, 1, 1, 1], vec![0.0; 4]);
        assert_eq!(const_strides(&t, &[4, 3, 3, 3]), Some([0, 1, 0, 0, 0]));
        let t = Tensor::new(vec![1, 1, 1, 1, 1], vec![0.0]);
        assert_eq!(const_strides(&t, &[4, 3, 3, 3]), Some([0; 5]));
        let t = Tensor::new(vec![1, 4, 3, 1, 1], vec![0.0; 12]);
        assert_eq!(const_strides(&t, &[4, 3, 5, 5]), Some([0, 3, 1, 0, 0]));
        let t = Tensor::new(vec![1, 3, 1, 1, 1], vec![0.0; 3]);
        assert_eq!(const_strides(&t, &[4, 3, 3, 3]), None);
        let t = Tensor::new(vec![2, 4, 1, 1, 1], vec![0.0; 8]);
        assert_eq!(const_strides(&t, &[4, 3, 3, 3]), None);
    }
}
