//! An ONNX node as the import reads it: its context for error messages ([`Ctx`]) and its
//! attributes (axes, integers, strings, and the window attributes of convs and pools).

use super::proto;
use crate::error::UnsupportedOp;
use crate::{Error, Result};
use std::path::Path;

/// Ceiling for strides, dilations and pads: keeps all size arithmetic far from overflow.
pub(crate) const ATTR_LIMIT: i64 = 1 << 20;

/// Context for error messages: `node "name" (Op)`.
pub(crate) struct Ctx<'a> {
    pub path: &'a Path,
    pub name: String,
    pub op: String,
}

impl Ctx<'_> {
    /// This node as an unsupported one (its domain named when not the default).
    pub(crate) fn unsupported(&self, why: String) -> UnsupportedOp {
        UnsupportedOp {
            op: self.op.clone(),
            node: self.name.clone(),
            why,
        }
    }
    pub(crate) fn err(&self, msg: impl std::fmt::Display) -> Error {
        Error::model(
            self.path,
            format!("node \"{}\" ({}): {msg}", self.name, self.op),
        )
    }
}

/// Strides, dilations, pads (ONNX order) and auto_pad of a Conv / pool node.
pub(crate) type WindowAttrs = ([usize; 3], [usize; 3], [i64; 6], String);

pub(crate) fn attr<'n>(n: &'n proto::NodeProto, name: &str) -> Option<&'n proto::AttributeProto> {
    n.attribute.iter().find(|a| a.name() == name)
}

pub(crate) fn norm_axis(ctx: &Ctx, axis: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        return Err(ctx.err(format!("axis {axis} is out of range for rank {rank}")));
    }
    Ok(a as usize)
}

pub(crate) fn to_i64(ctx: &Ctx, v: f64, what: &str) -> Result<i64> {
    if v.fract() != 0.0 || !v.is_finite() {
        return Err(ctx.err(format!("{what} value {v} is not an integer")));
    }
    Ok(v as i64)
}

/// A Transpose's `perm` on rank `r` (reversed axes by default), checked to be a permutation.
pub(crate) fn perm_of(n: &proto::NodeProto, ctx: &Ctx, r: usize) -> Result<Vec<usize>> {
    let perm: Vec<usize> = match ints(n, "perm") {
        Some(p) => p
            .iter()
            .map(|&a| norm_axis(ctx, a, r))
            .collect::<Result<_>>()?,
        None => (0..r).rev().collect(),
    };
    let mut seen = perm.clone();
    seen.sort_unstable();
    if seen != (0..r).collect::<Vec<_>>() {
        return Err(ctx.err(format!("perm {perm:?} is not a permutation")));
    }
    Ok(perm)
}

pub(crate) fn ints(n: &proto::NodeProto, name: &str) -> Option<Vec<i64>> {
    attr(n, name).map(|a| a.ints.clone())
}

pub(crate) fn sattr(n: &proto::NodeProto, name: &str, default: &str) -> String {
    attr(n, name)
        .and_then(|a| a.s.as_ref())
        .map(|s| String::from_utf8_lossy(s).to_string())
        .unwrap_or_else(|| default.to_string())
}

/// Parse kernel-window attributes shared by Conv, ConvTranspose and the pools.
pub(crate) fn window_attrs(
    ctx: &Ctx,
    n: &proto::NodeProto,
    kernel: [usize; 3],
) -> Result<WindowAttrs> {
    let three = |name: &str, default: usize| -> Result<[usize; 3]> {
        match ints(n, name) {
            None => Ok([default; 3]),
            Some(v) if v.len() == 3 => {
                let mut o = [0; 3];
                for a in 0..3 {
                    if v[a] <= 0 || v[a] > ATTR_LIMIT {
                        return Err(ctx.err(format!(
                            "attribute {name}={v:?} must be positive (and at most {ATTR_LIMIT})"
                        )));
                    }
                    o[a] = v[a] as usize;
                }
                Ok(o)
            }
            Some(v) => Err(ctx.err(format!(
                "attribute {name}={v:?} must have 3 values (voxtile supports 3D only)"
            ))),
        }
    };
    let stride = three("strides", 1)?;
    let dilation = three("dilations", 1)?;
    let pads = match ints(n, "pads") {
        None => [0i64; 6],
        Some(v) if v.len() == 6 => {
            if v.iter().any(|&p| p < 0) {
                return Err(ctx.err(format!("attribute pads={v:?} has negative values")));
            }
            if v.iter().any(|&p| p > ATTR_LIMIT) {
                return Err(ctx.err(format!("attribute pads={v:?} is absurdly large")));
            }
            [v[0], v[1], v[2], v[3], v[4], v[5]]
        }
        Some(v) => return Err(ctx.err(format!("attribute pads={v:?} must have 6 values"))),
    };
    if let Some(k) = ints(n, "kernel_shape") {
        if k.len() != 3 || (0..3).any(|a| k[a] != kernel[a] as i64) {
            return Err(ctx.err(format!(
                "attribute kernel_shape={k:?} disagrees with the kernel {kernel:?}"
            )));
        }
    }
    Ok((stride, dilation, pads, sattr(n, "auto_pad", "NOTSET")))
}

/// Resolve auto_pad for convs and pools: `total(a, k_eff)` is the padding SAME needs along axis
/// `a` for a kernel of dilated extent `k_eff` (split evenly, the odd one at the end for SAME_UPPER).
pub(crate) fn resolve_pads(
    ctx: &Ctx,
    auto_pad: &str,
    pads: [i64; 6],
    kernel: [usize; 3],
    dilation: [usize; 3],
    total: impl Fn(usize, usize) -> Result<usize>,
) -> Result<[usize; 6]> {
    let mut p = [0usize; 6];
    match auto_pad {
        "NOTSET" | "" => {
            for i in 0..6 {
                p[i] = pads[i] as usize;
            }
        }
        "VALID" => {}
        "SAME_UPPER" | "SAME_LOWER" => {
            for a in 0..3 {
                let keff = dilation[a] * (kernel[a] - 1) + 1;
                let total = total(a, keff)?;
                let small = total / 2;
                let (b, e) = if auto_pad == "SAME_UPPER" {
                    (small, total - small)
                } else {
                    (total - small, small)
                };
                p[a] = b;
                p[a + 3] = e;
            }
        }
        other => return Err(ctx.err(format!("attribute auto_pad={other} is not supported"))),
    }
    Ok(p)
}
