//! Reading ONNX attributes: axes, integers, strings, and the window attributes of convs and pools.

use super::{proto, Ctx, Lowerer, Result, ATTR_LIMIT};

/// Strides, dilations, pads (ONNX order) and auto_pad of a Conv / pool node.
pub(super) type WindowAttrs = ([usize; 3], [usize; 3], [i64; 6], String);

pub(super) fn attr<'n>(n: &'n proto::NodeProto, name: &str) -> Option<&'n proto::AttributeProto> {
    n.attribute.iter().find(|a| a.name() == name)
}

pub(super) fn norm_axis(ctx: &Ctx, axis: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        return Err(ctx.err(format!("axis {axis} is out of range for rank {rank}")));
    }
    Ok(a as usize)
}

/// The shape after ONNX Unsqueeze (`unsqueeze`) or Squeeze of `axes` (Squeeze without axes drops
/// every 1): one rule for constants, shape values and activations.
pub(super) fn squeeze_shape(
    ctx: &Ctx,
    shape: &[usize],
    unsqueeze: bool,
    axes: Option<&[i64]>,
) -> Result<Vec<usize>> {
    let mut s = shape.to_vec();
    if unsqueeze {
        let axes = axes.ok_or_else(|| ctx.err("axes are missing"))?;
        let r = s.len() + axes.len();
        let mut ax: Vec<usize> = axes
            .iter()
            .map(|&a| norm_axis(ctx, a, r))
            .collect::<Result<_>>()?;
        ax.sort_unstable();
        for a in ax {
            s.insert(a, 1);
        }
        return Ok(s);
    }
    let Some(axes) = axes else {
        s.retain(|&d| d != 1);
        return Ok(s);
    };
    let r = s.len();
    let mut ax: Vec<usize> = axes
        .iter()
        .map(|&a| norm_axis(ctx, a, r))
        .collect::<Result<_>>()?;
    ax.sort_unstable();
    ax.dedup();
    for a in ax.into_iter().rev() {
        if s[a] != 1 {
            return Err(ctx.err(format!("cannot squeeze axis {a} of size {}", s[a])));
        }
        s.remove(a);
    }
    Ok(s)
}

/// Length of the index tuples of a ScatterND / GatherND `indices` of shape `idx` (its last axis)
/// into data of rank `rank`.
pub(super) fn index_tuple_len(ctx: &Ctx, idx: &[usize], rank: usize) -> Result<usize> {
    let k = *idx.last().ok_or_else(|| ctx.err("indices are a scalar"))?;
    if k == 0 || k > rank {
        return Err(ctx.err(format!(
            "index tuples of length {k} for data of rank {rank}"
        )));
    }
    Ok(k)
}

pub(super) fn to_i64(ctx: &Ctx, v: f64, what: &str) -> Result<i64> {
    if v.fract() != 0.0 || !v.is_finite() {
        return Err(ctx.err(format!("{what} value {v} is not an integer")));
    }
    Ok(v as i64)
}

impl Lowerer<'_> {
    /// A Transpose's `perm` on rank `r` (reversed axes by default), checked to be a permutation.
    pub(super) fn perm_of(&self, n: &proto::NodeProto, ctx: &Ctx, r: usize) -> Result<Vec<usize>> {
        let perm: Vec<usize> = match self.ints(n, "perm") {
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

    pub(super) fn ints(&self, n: &proto::NodeProto, name: &str) -> Option<Vec<i64>> {
        attr(n, name).map(|a| a.ints.clone())
    }

    pub(super) fn sattr(n: &proto::NodeProto, name: &str, default: &str) -> String {
        attr(n, name)
            .and_then(|a| a.s.as_ref())
            .map(|s| String::from_utf8_lossy(s).to_string())
            .unwrap_or_else(|| default.to_string())
    }

    /// Parse kernel-window attributes shared by Conv, ConvTranspose and the pools.
    pub(super) fn window_attrs(
        &self,
        ctx: &Ctx,
        n: &proto::NodeProto,
        kernel: [usize; 3],
    ) -> Result<WindowAttrs> {
        let three = |name: &str, default: usize| -> Result<[usize; 3]> {
            match self.ints(n, name) {
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
        let pads = match self.ints(n, "pads") {
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
        if let Some(k) = self.ints(n, "kernel_shape") {
            if k.len() != 3 || (0..3).any(|a| k[a] != kernel[a] as i64) {
                return Err(ctx.err(format!(
                    "attribute kernel_shape={k:?} disagrees with the kernel {kernel:?}"
                )));
            }
        }
        let auto_pad = attr(n, "auto_pad")
            .and_then(|a| a.s.as_ref())
            .map(|s| String::from_utf8_lossy(s).to_string())
            .unwrap_or_else(|| "NOTSET".into());
        Ok((stride, dilation, pads, auto_pad))
    }

    /// Resolve auto_pad for Conv/pools. SAME with stride s pads k_eff - s in total, which matches
    /// ONNX whenever the input size is a multiple of s (guaranteed by the spatial divisor).
    pub(super) fn resolve_pads(
        &self,
        ctx: &Ctx,
        auto_pad: &str,
        pads: [i64; 6],
        kernel: [usize; 3],
        stride: [usize; 3],
        dilation: [usize; 3],
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
                    let total = keff.saturating_sub(stride[a]);
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
}
