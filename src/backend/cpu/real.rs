//! The scalar abstraction that lets every op run in f32 (the backend) and f64 (the reference the
//! fp16 kernels are checked against) with one algorithm.

use std::borrow::Cow;
use std::fmt::Debug;
use std::ops::{Add, AddAssign, Div, DivAssign, Mul, MulAssign, Neg, Sub, SubAssign};

/// A float the CPU ops compute in: f32 or f64.
pub trait Real:
    Copy
    + Send
    + Sync
    + Debug
    + Default
    + PartialOrd
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + DivAssign
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INFINITY: Self;
    fn from_f32(x: f32) -> Self;
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
    fn exp(self) -> Self;
    fn exp_m1(self) -> Self;
    fn sqrt(self) -> Self;
    fn tanh(self) -> Self;
    fn floor(self) -> Self;
    /// Max that propagates the left operand on NaN comparisons like `f32::max` does not matter here:
    /// NaN inputs are not part of the contract.
    fn max(self, other: Self) -> Self;
    /// The graph's f32 constants in this precision: borrowed for f32, converted (exactly) for f64.
    fn cast_slice(s: &[f32]) -> Cow<'_, [Self]>;
    /// `C ← α A B + β C` through `matrixmultiply` (threaded), with arbitrary strides.
    ///
    /// # Safety
    /// The pointers with the given dimensions and strides must address valid memory; `c` must not
    /// alias `a` or `b`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm_raw(
        m: usize,
        k: usize,
        n: usize,
        alpha: Self,
        a: *const Self,
        rsa: isize,
        csa: isize,
        b: *const Self,
        rsb: isize,
        csb: isize,
        beta: Self,
        c: *mut Self,
        rsc: isize,
        csc: isize,
    );
}

macro_rules! impl_real {
    ($t:ty, $gemm:path, $cast:expr) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
            #[inline(always)]
            fn from_f32(x: f32) -> Self {
                x as $t
            }
            #[inline(always)]
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            #[inline(always)]
            fn exp_m1(self) -> Self {
                <$t>::exp_m1(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            #[inline(always)]
            fn floor(self) -> Self {
                <$t>::floor(self)
            }
            #[inline(always)]
            fn max(self, other: Self) -> Self {
                if other > self {
                    other
                } else {
                    self
                }
            }
            fn cast_slice(s: &[f32]) -> Cow<'_, [Self]> {
                let f: fn(&[f32]) -> Cow<'_, [Self]> = $cast;
                f(s)
            }
            unsafe fn gemm_raw(
                m: usize,
                k: usize,
                n: usize,
                alpha: Self,
                a: *const Self,
                rsa: isize,
                csa: isize,
                b: *const Self,
                rsb: isize,
                csb: isize,
                beta: Self,
                c: *mut Self,
                rsc: isize,
                csc: isize,
            ) {
                // SAFETY: forwarded contract of the caller.
                unsafe { $gemm(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc) }
            }
        }
    };
}

impl_real!(f32, matrixmultiply::sgemm, |s| Cow::Borrowed(s));
impl_real!(f64, matrixmultiply::dgemm, |s| Cow::Owned(
    s.iter().map(|&v| v as f64).collect()
));
