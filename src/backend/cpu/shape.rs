//! Output shapes and parameter checks per op, kept local so the backend does not depend on the
//! graph-level shape inference. Errors are plain sentences; the executor prefixes the node name.

use crate::model::graph::{Conv, ConvTranspose, Op, Pool, Resize, Tensor};

pub type Shape = [usize; 5];

fn fmt(s: &Shape) -> String {
    format!("[{}, {}, {}, {}, {}]", s[0], s[1], s[2], s[3], s[4])
}

/// How many activation inputs an op takes (`None` = one or more, for Concat).
pub fn arity(op: &Op) -> Option<usize> {
    match op {
        Op::Add | Op::Mul | Op::Sub | Op::Div => Some(2),
        Op::Concat { .. } => None,
        _ => Some(1),
    }
}

fn check_kernel_params(
    what: &str,
    stride: &[usize; 3],
    dilation: &[usize; 3],
    groups: usize,
) -> Result<(), String> {
    if stride.contains(&0) {
        return Err(format!("{what} has a zero stride {stride:?}"));
    }
    if dilation.contains(&0) {
        return Err(format!("{what} has a zero dilation {dilation:?}"));
    }
    if groups == 0 {
        return Err(format!("{what} has zero groups"));
    }
    Ok(())
}

fn check_bias(what: &str, bias: &Option<Tensor>, cout: usize) -> Result<(), String> {
    if let Some(b) = bias {
        if b.len() != cout || b.data.len() != b.shape.iter().product::<usize>() {
            return Err(format!(
                "{what} bias has {} values for {cout} output channels",
                b.len()
            ));
        }
    }
    Ok(())
}

fn check_weight(what: &str, w: &Tensor) -> Result<[usize; 5], String> {
    if w.shape.len() != 5 || w.data.len() != w.shape.iter().product::<usize>() {
        return Err(format!(
            "{what} weight must be a 5-dim tensor, got shape {:?} with {} values",
            w.shape,
            w.data.len()
        ));
    }
    let s = [w.shape[0], w.shape[1], w.shape[2], w.shape[3], w.shape[4]];
    if s.contains(&0) {
        return Err(format!(
            "{what} weight has an empty dimension {:?}",
            w.shape
        ));
    }
    Ok(s)
}

/// Conv output size along one axis: floor((in + pads - dilated kernel) / stride) + 1.
fn conv_out(input: usize, k: usize, s: usize, d: usize, pb: usize, pe: usize) -> Option<usize> {
    let span = d * (k - 1) + 1;
    let padded = input + pb + pe;
    if padded < span {
        return None;
    }
    Some((padded - span) / s + 1)
}

pub fn conv(x: &Shape, p: &Conv) -> Result<Shape, String> {
    check_kernel_params("Conv", &p.stride, &p.dilation, p.groups)?;
    let w = check_weight("Conv", &p.weight)?;
    let g = p.groups;
    if !w[0].is_multiple_of(g) {
        return Err(format!(
            "Conv has {} output channels, not divisible by {g} groups",
            w[0]
        ));
    }
    if x[1] != w[1] * g {
        return Err(format!(
            "Conv expects {} input channels (weight {:?}, {g} groups) but the input has shape {}",
            w[1] * g,
            p.weight.shape,
            fmt(x)
        ));
    }
    check_bias("Conv", &p.bias, w[0])?;
    let mut out = [x[0], w[0], 0, 0, 0];
    for i in 0..3 {
        out[2 + i] = conv_out(
            x[2 + i],
            w[2 + i],
            p.stride[i],
            p.dilation[i],
            p.pads[i],
            p.pads[3 + i],
        )
        .ok_or_else(|| {
            format!(
                "Conv kernel {:?} (dilation {:?}) is larger than the padded input {}",
                &p.weight.shape[2..],
                p.dilation,
                fmt(x)
            )
        })?;
    }
    Ok(out)
}

pub fn conv_transpose(x: &Shape, p: &ConvTranspose) -> Result<Shape, String> {
    check_kernel_params("ConvTranspose", &p.stride, &p.dilation, p.groups)?;
    let w = check_weight("ConvTranspose", &p.weight)?;
    let g = p.groups;
    if !w[0].is_multiple_of(g) {
        return Err(format!(
            "ConvTranspose has {} input channels, not divisible by {g} groups",
            w[0]
        ));
    }
    if x[1] != w[0] {
        return Err(format!(
            "ConvTranspose expects {} input channels (weight {:?}) but the input has shape {}",
            w[0],
            p.weight.shape,
            fmt(x)
        ));
    }
    let cout = w[1] * g;
    check_bias("ConvTranspose", &p.bias, cout)?;
    let mut out = [x[0], cout, 0, 0, 0];
    for i in 0..3 {
        let full =
            p.stride[i] * (x[2 + i] - 1) + p.output_padding[i] + p.dilation[i] * (w[2 + i] - 1) + 1;
        let cut = p.pads[i] + p.pads[3 + i];
        if full <= cut {
            return Err(format!(
                "ConvTranspose pads {:?} remove the whole output of input {}",
                p.pads,
                fmt(x)
            ));
        }
        out[2 + i] = full - cut;
    }
    Ok(out)
}

fn check_channel_tensor(what: &str, t: &Tensor, c: usize) -> Result<(), String> {
    if t.len() != c || t.data.len() != t.shape.iter().product::<usize>() {
        return Err(format!("{what} has {} values for {c} channels", t.len()));
    }
    Ok(())
}

/// Pool output size along one axis, PyTorch's rule: with ceil_mode the last window must start
/// inside the input or the left padding.
pub fn pool_out(
    input: usize,
    k: usize,
    s: usize,
    d: usize,
    pb: usize,
    pe: usize,
    ceil: bool,
) -> Option<usize> {
    let span = d * (k - 1) + 1;
    let padded = input + pb + pe;
    if padded < span {
        return None;
    }
    let num = padded - span;
    let mut out = if ceil { num.div_ceil(s) } else { num / s } + 1;
    if ceil && (out - 1) * s >= input + pb {
        out -= 1;
    }
    Some(out)
}

pub fn pool(what: &str, x: &Shape, p: &Pool) -> Result<Shape, String> {
    check_kernel_params(what, &p.stride, &p.dilation, 1)?;
    if p.kernel.contains(&0) {
        return Err(format!("{what} has a zero kernel size {:?}", p.kernel));
    }
    let mut out = *x;
    for i in 0..3 {
        out[2 + i] = pool_out(
            x[2 + i],
            p.kernel[i],
            p.stride[i],
            p.dilation[i],
            p.pads[i],
            p.pads[3 + i],
            p.ceil_mode,
        )
        .ok_or_else(|| {
            format!(
                "{what} kernel {:?} is larger than the padded input {}",
                p.kernel,
                fmt(x)
            )
        })?;
    }
    Ok(out)
}

/// The scale that maps output coordinates back (ONNX: output/input when sizes are given).
pub fn resize_sizes(x: &Shape, p: &Resize) -> Result<[usize; 3], String> {
    match p.sizes {
        Some(s) => {
            if s.contains(&0) {
                return Err(format!("Resize sizes {s:?} contain a zero"));
            }
            Ok(s)
        }
        None => {
            let mut out = [0; 3];
            for i in 0..3 {
                let sc = p.scales[i];
                if !(sc.is_finite() && sc > 0.0) {
                    return Err(format!("Resize scale {sc} is not a positive number"));
                }
                out[i] = (x[2 + i] as f32 * sc).floor() as usize;
                if out[i] == 0 {
                    return Err(format!(
                        "Resize scales {:?} shrink input {} to nothing",
                        p.scales,
                        fmt(x)
                    ));
                }
            }
            Ok(out)
        }
    }
}

fn broadcast_const(what: &str, x: &Shape, t: &Tensor) -> Result<(), String> {
    if t.shape.len() != 5 || t.data.len() != t.shape.iter().product::<usize>() {
        return Err(format!(
            "{what} constant must be 5-dim, got shape {:?}",
            t.shape
        ));
    }
    for i in 0..5 {
        if t.shape[i] != 1 && t.shape[i] != x[i] {
            return Err(format!(
                "{what} constant of shape {:?} does not broadcast to {}",
                t.shape,
                fmt(x)
            ));
        }
    }
    Ok(())
}

/// The output shape of `op` on inputs of the given shapes, or why the op cannot run on them.
pub fn output_shape(op: &Op, inputs: &[Shape]) -> Result<Shape, String> {
    match arity(op) {
        Some(n) if inputs.len() != n => {
            return Err(format!(
                "{} takes {n} input(s), got {}",
                op.name(),
                inputs.len()
            ))
        }
        None if inputs.is_empty() => return Err(format!("{} takes at least one input", op.name())),
        _ => {}
    }
    let x = &inputs[0];
    if x.contains(&0) {
        return Err(format!("{} got an empty input {}", op.name(), fmt(x)));
    }
    match op {
        Op::Conv(p) => conv(x, p),
        Op::ConvTranspose(p) => conv_transpose(x, p),
        Op::InstanceNorm { eps, scale, bias } => {
            check_channel_tensor("InstanceNormalization scale", scale, x[1])?;
            check_channel_tensor("InstanceNormalization bias", bias, x[1])?;
            if eps.is_nan() || *eps < 0.0 {
                return Err(format!("InstanceNormalization epsilon {eps} is negative"));
            }
            Ok(*x)
        }
        Op::GroupNorm {
            groups,
            eps,
            scale,
            bias,
        } => {
            if *groups == 0 || !x[1].is_multiple_of(*groups) {
                return Err(format!(
                    "GroupNormalization: {} channels are not divisible into {groups} groups",
                    x[1]
                ));
            }
            check_channel_tensor("GroupNormalization scale", scale, x[1])?;
            check_channel_tensor("GroupNormalization bias", bias, x[1])?;
            if eps.is_nan() || *eps < 0.0 {
                return Err(format!("GroupNormalization epsilon {eps} is negative"));
            }
            Ok(*x)
        }
        Op::ChannelAffine { scale, shift } => {
            check_channel_tensor("ChannelAffine scale", scale, x[1])?;
            check_channel_tensor("ChannelAffine shift", shift, x[1])?;
            Ok(*x)
        }
        Op::PRelu { slope } => {
            if slope.len() != 1 {
                check_channel_tensor("PRelu slope", slope, x[1])?;
            }
            Ok(*x)
        }
        Op::Relu
        | Op::LeakyRelu { .. }
        | Op::Elu { .. }
        | Op::Sigmoid
        | Op::Tanh
        | Op::Identity => Ok(*x),
        Op::Softmax { axis } => {
            if *axis >= 5 {
                return Err(format!(
                    "Softmax axis {axis} is out of range for a 5-dim tensor"
                ));
            }
            Ok(*x)
        }
        Op::Add | Op::Mul | Op::Sub | Op::Div => {
            if inputs[0] != inputs[1] {
                return Err(format!(
                    "{} needs two inputs of the same shape, got {} and {}",
                    op.name(),
                    fmt(&inputs[0]),
                    fmt(&inputs[1])
                ));
            }
            Ok(*x)
        }
        Op::AddConst(t) | Op::MulConst(t) => {
            broadcast_const(op.name(), x, t)?;
            Ok(*x)
        }
        Op::Concat { axis } => {
            if *axis >= 5 {
                return Err(format!(
                    "Concat axis {axis} is out of range for a 5-dim tensor"
                ));
            }
            let mut out = *x;
            for s in &inputs[1..] {
                for i in 0..5 {
                    if i != *axis && s[i] != x[i] {
                        return Err(format!(
                            "Concat on axis {axis} got inputs of shapes {} and {}",
                            fmt(x),
                            fmt(s)
                        ));
                    }
                }
                out[*axis] += s[*axis];
            }
            Ok(out)
        }
        Op::MaxPool(p) => pool("MaxPool", x, p),
        Op::AveragePool(p) => pool("AveragePool", x, p),
        Op::Resize(p) => {
            let s = resize_sizes(x, p)?;
            Ok([x[0], x[1], s[0], s[1], s[2]])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_out_follows_pytorch_ceil_rule() {
        // floor vs ceil on an odd size.
        assert_eq!(pool_out(7, 2, 2, 1, 0, 0, false), Some(3));
        assert_eq!(pool_out(7, 2, 2, 1, 0, 0, true), Some(4));
        // ceil would start a window in the end padding only: dropped (PyTorch/ORT).
        assert_eq!(pool_out(4, 2, 2, 1, 1, 1, true), Some(3));
        assert_eq!(pool_out(5, 3, 2, 1, 1, 1, true), Some(3));
        assert_eq!(pool_out(1, 3, 1, 1, 0, 0, false), None);
    }

    #[test]
    fn conv_transpose_shape_with_asymmetric_pads() {
        let p = ConvTranspose {
            weight: Tensor::new(vec![4, 2, 3, 3, 3], vec![0.0; 216]),
            bias: None,
            stride: [2; 3],
            dilation: [1; 3],
            pads: [0, 0, 0, 1, 1, 1],
            output_padding: [0; 3],
            groups: 1,
        };
        // TF SAME upsampling doubles the size: 2*(8-1) + 3 - 1 = 16.
        assert_eq!(conv_transpose(&[1, 4, 8, 8, 8], &p), Ok([1, 2, 16, 16, 16]));
        assert!(conv_transpose(&[1, 3, 8, 8, 8], &p).is_err());
    }
}
