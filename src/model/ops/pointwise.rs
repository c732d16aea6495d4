//! One-input elementwise math beyond the classic activations (GELU and its Erf, Softplus, Mish,
//! the hard activations, Exp/Log/Sqrt/Abs/Neg/Reciprocal, Pow by a constant, Clip): one op
//! family with its value defined once, in f64, here. The CPU backend evaluates [`Pointwise::eval`]
//! in double precision for both its f32 and f64 runs (each f32 result is the f64 one rounded,
//! within an ulp of PyTorch's fp32 kernels), the importer folds constants with it, and the CUDA
//! kernels mirror it in fp32 (`pointwise_kernel` in kernels/eltwise.cu).

/// A one-input elementwise function of the IR (see [`super::Op::Pointwise`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pointwise {
    /// The Gauss error function.
    Erf,
    /// `x Φ(x)`; with `tanh`, PyTorch's `approximate="tanh"` form.
    Gelu {
        /// The tanh approximation instead of the exact erf form.
        tanh: bool,
    },
    /// `ln(1 + e^x)`.
    Softplus,
    /// `x tanh(softplus(x))`.
    Mish,
    /// `x clamp(x/6 + 1/2, 0, 1)`.
    HardSwish,
    /// `clamp(alpha x + beta, 0, 1)`.
    HardSigmoid {
        /// Slope.
        alpha: f32,
        /// Offset.
        beta: f32,
    },
    /// `e^x`.
    Exp,
    /// Natural logarithm.
    Log,
    /// Square root.
    Sqrt,
    /// Absolute value.
    Abs,
    /// `-x`.
    Neg,
    /// `1 / x`.
    Reciprocal,
    /// `x^e` for a constant exponent.
    Pow(f32),
    /// `min(max(x, min), max)` (ReLU6 is `Clip(0, 6)`).
    Clip {
        /// Lower bound (may be -inf).
        min: f32,
        /// Upper bound (may be +inf).
        max: f32,
    },
    /// The value rounded to IEEE half precision and back (round to nearest even): where an fp16
    /// model stores an activation (a half graph input or output, a `Cast` to or from float16),
    /// so that computing in f32 between those points gives what the model's own runtime gives.
    RoundF16,
    /// The value rounded to bfloat16 and back (round to nearest even), as [`Pointwise::RoundF16`].
    RoundBf16,
}

/// `sqrt(2 / pi)`, the tanh-GELU constant.
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;

/// `ln(1 + e^x)` without overflow.
fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

impl Pointwise {
    /// The ONNX name, for messages and `voxtile inspect`.
    pub fn name(&self) -> &'static str {
        match self {
            Pointwise::Erf => "Erf",
            Pointwise::Gelu { .. } => "Gelu",
            Pointwise::Softplus => "Softplus",
            Pointwise::Mish => "Mish",
            Pointwise::HardSwish => "HardSwish",
            Pointwise::HardSigmoid { .. } => "HardSigmoid",
            Pointwise::Exp => "Exp",
            Pointwise::Log => "Log",
            Pointwise::Sqrt => "Sqrt",
            Pointwise::Abs => "Abs",
            Pointwise::Neg => "Neg",
            Pointwise::Reciprocal => "Reciprocal",
            Pointwise::Pow(_) => "Pow",
            Pointwise::Clip { .. } => "Clip",
            Pointwise::RoundF16 => "Cast(float16)",
            Pointwise::RoundBf16 => "Cast(bfloat16)",
        }
    }

    /// Parameters are numbers (Clip's bounds ordered; infinite bounds allowed).
    pub fn check(&self) -> Result<(), String> {
        match *self {
            Pointwise::HardSigmoid { alpha, beta } if !(alpha.is_finite() && beta.is_finite()) => {
                Err(format!("alpha {alpha} and beta {beta} must be finite"))
            }
            Pointwise::Pow(e) if e.is_nan() => Err("exponent is NaN".into()),
            Pointwise::Clip { min, max } if min.is_nan() || max.is_nan() || min > max => {
                Err(format!("bounds [{min}, {max}] are not an interval"))
            }
            _ => Ok(()),
        }
    }

    /// The function's value at `x`, in double precision (the definition every backend follows).
    pub fn eval(&self, x: f64) -> f64 {
        match *self {
            Pointwise::Erf => libm::erf(x),
            Pointwise::Gelu { tanh: false } => {
                0.5 * x * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2))
            }
            Pointwise::Gelu { tanh: true } => {
                0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
            }
            Pointwise::Softplus => softplus(x),
            Pointwise::Mish => x * softplus(x).tanh(),
            Pointwise::HardSwish => x * (x / 6.0 + 0.5).clamp(0.0, 1.0),
            Pointwise::HardSigmoid { alpha, beta } => {
                (alpha as f64 * x + beta as f64).clamp(0.0, 1.0)
            }
            Pointwise::Exp => x.exp(),
            Pointwise::Log => x.ln(),
            Pointwise::Sqrt => x.sqrt(),
            Pointwise::Abs => x.abs(),
            Pointwise::Neg => -x,
            Pointwise::Reciprocal => 1.0 / x,
            Pointwise::Pow(e) => x.powf(e as f64),
            // NaN stays NaN, as PyTorch's clamp.
            Pointwise::Clip { min, max } => {
                if x.is_nan() {
                    x
                } else {
                    x.max(min as f64).min(max as f64)
                }
            }
            Pointwise::RoundF16 => half::f16::from_f32(x as f32).to_f64(),
            Pointwise::RoundBf16 => half::bf16::from_f32(x as f32).to_f64(),
        }
    }

    /// Rough floating point operations per element (transcendentals ~8, the rest 1-2).
    pub fn flops_per_element(&self) -> u64 {
        match self {
            Pointwise::Erf
            | Pointwise::Gelu { .. }
            | Pointwise::Softplus
            | Pointwise::Exp
            | Pointwise::Log
            | Pointwise::Pow(_) => 8,
            Pointwise::Mish => 16,
            Pointwise::Sqrt | Pointwise::Reciprocal => 4,
            _ => 2,
        }
    }

    /// The kernel's function code and its two float parameters (kernels/eltwise.cu
    /// `pointwise_apply`).
    pub fn code(&self) -> (i32, f32, f32) {
        match *self {
            Pointwise::Erf => (0, 0.0, 0.0),
            Pointwise::Gelu { tanh } => (1, f32::from(u8::from(tanh)), 0.0),
            Pointwise::Softplus => (2, 0.0, 0.0),
            Pointwise::Mish => (3, 0.0, 0.0),
            Pointwise::HardSwish => (4, 0.0, 0.0),
            Pointwise::HardSigmoid { alpha, beta } => (5, alpha, beta),
            Pointwise::Exp => (6, 0.0, 0.0),
            Pointwise::Log => (7, 0.0, 0.0),
            Pointwise::Sqrt => (8, 0.0, 0.0),
            Pointwise::Abs => (9, 0.0, 0.0),
            Pointwise::Neg => (10, 0.0, 0.0),
            Pointwise::Reciprocal => (11, 0.0, 0.0),
            Pointwise::Pow(e) => (12, e, 0.0),
            Pointwise::Clip { min, max } => (13, min, max),
            Pointwise::RoundF16 => (14, 0.0, 0.0),
            Pointwise::RoundBf16 => (15, 0.0, 0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_at_known_points() {
        assert!((Pointwise::Erf.eval(0.5) - 0.520_499_877_813_046_5).abs() < 1e-15);
        let g = Pointwise::Gelu { tanh: false }.eval(1.0);
        assert!((g - 0.841_344_746_068_542_9).abs() < 1e-15);
        assert!((Pointwise::Softplus.eval(-800.0)).abs() < 1e-300);
        assert_eq!(Pointwise::Softplus.eval(800.0), 800.0);
        assert_eq!(Pointwise::HardSwish.eval(3.0), 3.0);
        assert_eq!(Pointwise::Clip { min: 0.0, max: 6.0 }.eval(7.5), 6.0);
        assert!(Pointwise::Clip { min: 1.0, max: 0.0 }.check().is_err());
        // 1 + 2^-11 is the tie between 1 and the next half (1 + 2^-10): to even, 1.
        assert_eq!(Pointwise::RoundF16.eval(1.0 + 2f64.powi(-11)), 1.0);
        assert_eq!(
            Pointwise::RoundF16.eval(1.0 + 3.0 * 2f64.powi(-11)),
            1.0 + 2f64.powi(-9)
        );
        assert_eq!(Pointwise::RoundF16.eval(70000.0), f64::INFINITY);
        assert_eq!(Pointwise::RoundBf16.eval(1.0 + 2f64.powi(-8)), 1.0);
        assert_eq!(Pointwise::RoundBf16.eval(70000.0), 70144.0);
        assert!(Pointwise::RoundBf16.eval(f64::NAN).is_nan());
    }
}
