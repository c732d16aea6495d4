//! Activations, binary ops, broadcast constants, Softmax and Concat. Elementwise ops work in
//! place (the executor hands over dying buffers); the out-of-place functions copy first.

use super::{dims, err, make_standard, owned, zeroed};
use crate::backend::cpu::Real;
use crate::model::graph::Shape;
use crate::model::graph::{Op, Tensor};
use crate::Result;
use ndarray::{Array5, ArrayView5, Axis, Slice, Zip};
use rayon::prelude::*;

/// The parameter-free (or scalar-parameter) activations.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unary {
    Relu,
    LeakyRelu(f32),
    Elu(f32),
    Sigmoid,
    Tanh,
}

#[inline(always)]
fn sigmoid1<T: Real>(v: T) -> T {
    // Split by sign so exp never overflows.
    if v >= T::ZERO {
        T::ONE / (T::ONE + (-v).exp())
    } else {
        let e = v.exp();
        e / (T::ONE + e)
    }
}

impl Unary {
    /// The activation of one value (the conv epilogue applies it while writing its output).
    #[inline(always)]
    pub fn eval<T: Real>(self, v: T) -> T {
        match self {
            Unary::Relu => {
                if v > T::ZERO {
                    v
                } else {
                    T::ZERO
                }
            }
            Unary::LeakyRelu(a) => {
                if v >= T::ZERO {
                    v
                } else {
                    T::from_f32(a) * v
                }
            }
            // expm1 like PyTorch: exact near zero.
            Unary::Elu(a) => {
                if v > T::ZERO {
                    v
                } else {
                    T::from_f32(a) * v.exp_m1()
                }
            }
            Unary::Sigmoid => sigmoid1(v),
            Unary::Tanh => v.tanh(),
        }
    }
}

pub fn unary_inplace<T: Real>(x: &mut Array5<T>, op: Unary) -> Result<()> {
    make_standard(x)?;
    let xs = x
        .as_slice_mut()
        .ok_or_else(|| err("activation input is not contiguous".into()))?;
    xs.par_chunks_mut(1 << 14)
        .for_each(|c| super::vmath::activate(c, op));
    Ok(())
}

fn unary<T: Real>(x: ArrayView5<T>, op: Unary) -> Result<Array5<T>> {
    let mut y = owned(x)?;
    unary_inplace(&mut y, op)?;
    Ok(y)
}

pub fn relu<T: Real>(x: ArrayView5<T>) -> Result<Array5<T>> {
    unary(x, Unary::Relu)
}
pub fn leaky_relu<T: Real>(x: ArrayView5<T>, alpha: f32) -> Result<Array5<T>> {
    unary(x, Unary::LeakyRelu(alpha))
}
pub fn elu<T: Real>(x: ArrayView5<T>, alpha: f32) -> Result<Array5<T>> {
    unary(x, Unary::Elu(alpha))
}
pub fn sigmoid<T: Real>(x: ArrayView5<T>) -> Result<Array5<T>> {
    unary(x, Unary::Sigmoid)
}
pub fn tanh<T: Real>(x: ArrayView5<T>) -> Result<Array5<T>> {
    unary(x, Unary::Tanh)
}

/// `x if x >= 0 else slope * x`, slope per channel (`[C]`) or shared (`[1]`).
pub(super) fn prelu_inplace<T: Real>(x: &mut Array5<T>, slope: &Tensor) -> Result<()> {
    let xs = dims(&x.view());
    Op::PRelu {
        slope: slope.clone(),
    }
    .output_shape(&[xs])
    .map_err(err)?;
    make_standard(x)?;
    let s = T::cast_slice(&slope.data);
    let c = xs[1];
    let plane = xs[2] * xs[3] * xs[4];
    let data = x
        .as_slice_mut()
        .ok_or_else(|| err("PRelu input is not contiguous".into()))?;
    data.par_chunks_mut(plane).enumerate().for_each(|(i, p)| {
        let a = if s.len() == 1 { s[0] } else { s[i % c] };
        for v in p {
            if *v < T::ZERO {
                *v *= a;
            }
        }
    });
    Ok(())
}

pub fn prelu<T: Real>(x: ArrayView5<T>, slope: &Tensor) -> Result<Array5<T>> {
    let mut y = owned(x)?;
    prelu_inplace(&mut y, slope)?;
    Ok(y)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
    Pow,
}

#[inline(always)]
pub(super) fn bin<T: Real>(op: Binary, a: T, b: T) -> T {
    match op {
        Binary::Add => a + b,
        Binary::Sub => a - b,
        Binary::Mul => a * b,
        Binary::Div => a / b,
        Binary::Max => a.max(b),
        Binary::Min => {
            if b < a {
                b
            } else {
                a
            }
        }
        Binary::Pow => T::from_f64(a.to_f64().powf(b.to_f64())),
    }
}

/// `x ← x op y` for two activations of the same shape.
pub fn binary_inplace<T: Real>(x: &mut Array5<T>, y: ArrayView5<T>, op: Binary) -> Result<()> {
    if x.shape() != y.shape() {
        return Err(err(format!(
            "{op:?} needs two inputs of the same shape, got {:?} and {:?}",
            x.shape(),
            y.shape()
        )));
    }
    Zip::from(x)
        .and(&y)
        .par_for_each(|a, &b| *a = bin(op, *a, b));
    Ok(())
}

fn binary<T: Real>(x: ArrayView5<T>, y: ArrayView5<T>, op: Binary) -> Result<Array5<T>> {
    let mut z = owned(x)?;
    binary_inplace(&mut z, y, op)?;
    Ok(z)
}
pub fn add<T: Real>(x: ArrayView5<T>, y: ArrayView5<T>) -> Result<Array5<T>> {
    binary(x, y, Binary::Add)
}
pub fn sub<T: Real>(x: ArrayView5<T>, y: ArrayView5<T>) -> Result<Array5<T>> {
    binary(x, y, Binary::Sub)
}
pub fn mul<T: Real>(x: ArrayView5<T>, y: ArrayView5<T>) -> Result<Array5<T>> {
    binary(x, y, Binary::Mul)
}
pub fn div<T: Real>(x: ArrayView5<T>, y: ArrayView5<T>) -> Result<Array5<T>> {
    binary(x, y, Binary::Div)
}

/// `x ← x op c` with a 5-dim constant broadcast to x (each dim 1 or full).
pub fn const_inplace<T: Real>(x: &mut Array5<T>, c: &Tensor, op: Binary) -> Result<()> {
    let what = if op == Binary::Add {
        "Add(const)"
    } else {
        "Mul(const)"
    };
    let xs = dims(&x.view());
    if c.shape.len() != 5 || c.data.len() != c.shape.iter().product::<usize>() {
        return Err(err(format!(
            "{what} constant must be 5-dim, got shape {:?}",
            c.shape
        )));
    }
    let data = T::cast_slice(&c.data);
    let cs = [c.shape[0], c.shape[1], c.shape[2], c.shape[3], c.shape[4]];
    let view =
        ArrayView5::from_shape(cs, &data).map_err(|e| err(format!("{what} constant: {e}")))?;
    let b = view.broadcast(xs).ok_or_else(|| {
        err(format!(
            "{what} constant of shape {:?} does not broadcast to {xs:?}",
            c.shape
        ))
    })?;
    Zip::from(x)
        .and(&b)
        .par_for_each(|a, &v| *a = bin(op, *a, v));
    Ok(())
}

pub fn add_const<T: Real>(x: ArrayView5<T>, c: &Tensor) -> Result<Array5<T>> {
    let mut y = owned(x)?;
    const_inplace(&mut y, c, Binary::Add)?;
    Ok(y)
}
pub fn mul_const<T: Real>(x: ArrayView5<T>, c: &Tensor) -> Result<Array5<T>> {
    let mut y = owned(x)?;
    const_inplace(&mut y, c, Binary::Mul)?;
    Ok(y)
}

/// Max-subtracted softmax along `axis` (numerically safe for large logits).
pub fn softmax_inplace<T: Real>(x: &mut Array5<T>, axis: usize) -> Result<()> {
    if axis >= 5 {
        return Err(err(format!(
            "Softmax axis {axis} is out of range for a 5-dim tensor"
        )));
    }
    Zip::from(x.lanes_mut(Axis(axis))).par_for_each(|mut lane| {
        let mut m = T::NEG_INFINITY;
        for &v in lane.iter() {
            m = m.max(v);
        }
        let mut s = T::ZERO;
        for v in lane.iter_mut() {
            *v = (*v - m).exp();
            s += *v;
        }
        for v in lane.iter_mut() {
            *v /= s;
        }
    });
    Ok(())
}

pub fn softmax<T: Real>(x: ArrayView5<T>, axis: usize) -> Result<Array5<T>> {
    let mut y = owned(x)?;
    softmax_inplace(&mut y, axis)?;
    Ok(y)
}

/// Concatenation along `axis` of inputs equal in every other dimension.
pub fn concat<T: Real>(inputs: &[ArrayView5<T>], axis: usize) -> Result<Array5<T>> {
    let shapes: Vec<Shape> = inputs.iter().map(dims).collect();
    let os = Op::Concat { axis }.output_shape(&shapes).map_err(err)?;
    let mut out = Array5::from_shape_vec(os, zeroed(os.iter().product(), "a Concat output")?)
        .map_err(|e| err(e.to_string()))?;
    let mut off = 0;
    for x in inputs {
        let len = x.len_of(Axis(axis));
        let dst = out.slice_axis_mut(Axis(axis), Slice::from(off..off + len));
        Zip::from(dst).and(x).par_for_each(|d, &s| *d = s);
        off += len;
    }
    Ok(out)
}
