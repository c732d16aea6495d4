//! Activations over slices, shared by the activation ops and the conv epilogue (so a fused
//! activation is bitwise the unfused one). f32 Elu uses a branch-free expm1 that vectorises
//! (libm's scalar `expm1f` cost as much as the conv before it); f64 keeps libm (the reference).

use super::eltwise::Unary;
use crate::backend::cpu::Real;
use std::any::TypeId;

/// `act` on every value of `xs`, in place.
pub fn activate<T: Real>(xs: &mut [T], act: Unary) {
    if let Unary::Elu(alpha) = act {
        if TypeId::of::<T>() == TypeId::of::<f32>() {
            // SAFETY: T is f32 (checked above), so the slice is reinterpreted as itself.
            let x32 =
                unsafe { std::slice::from_raw_parts_mut(xs.as_mut_ptr() as *mut f32, xs.len()) };
            elu_f32(x32, alpha);
            return;
        }
    }
    xs.iter_mut().for_each(|v| *v = act.eval(*v));
}

fn elu_f32(xs: &mut [f32], alpha: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F. The wide copy runs the same IEEE operations (no FMA
        // contraction), so its results equal the baseline loop's bit for bit.
        unsafe { elu_avx512(xs, alpha) };
        return;
    }
    elu_loop(xs, alpha);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn elu_avx512(xs: &mut [f32], alpha: f32) {
    elu_loop(xs, alpha)
}

#[inline(always)]
fn elu_loop(xs: &mut [f32], alpha: f32) {
    for v in xs {
        let e = alpha * expm1(v.min(0.0));
        *v = if *v > 0.0 { *v } else { e };
    }
}

/// `exp(x) - 1` for `x <= 0` within a few ulp, branch-free: x = n ln2 + r with |r| <= ln2/2,
/// expm1(r) by its Taylor series to r^8 (error < 2e-8 relative), then
/// `2^n expm1(r) + (2^n - 1)`, exact in r when n = 0 (no cancellation near zero).
#[inline(always)]
pub fn expm1(x: f32) -> f32 {
    const SHIFTER: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let x = x.max(-87.0);
    let n = (x * std::f32::consts::LOG2_E + SHIFTER) - SHIFTER;
    // ln 2 split in a part exact in f32 and the rest (Cody-Waite).
    let r = (x - n * 0.693_145_75) - n * 1.428_606_8e-6;
    let mut p = 1.0 / 40320.0;
    for c in [
        1.0 / 5040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
    ] {
        p = p * r + c;
    }
    let em1 = r + r * r * p;
    let scale = f32::from_bits(((n as i32 + 127) << 23) as u32);
    scale * em1 + (scale - 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expm1_is_within_a_few_ulp_of_libm() {
        let mut worst = 0f64;
        let mut x = -100f32;
        while x <= 0.0 {
            let want = (x as f64).exp_m1();
            let got = expm1(x) as f64;
            let ulp = (want.abs() * f32::EPSILON as f64).max(f32::MIN_POSITIVE as f64);
            worst = worst.max((got - want).abs() / ulp);
            x += if x < -1.0 { 0.0137 } else { 1.3e-4 };
        }
        assert!(worst <= 4.0, "expm1 is {worst} ulp off");
    }

    #[test]
    fn elu_slice_matches_definition() {
        let mut xs: Vec<f32> = (-50..50).map(|i| i as f32 * 0.173).collect();
        let want: Vec<f64> = xs
            .iter()
            .map(|&v| {
                if v > 0.0 {
                    v as f64
                } else {
                    0.7 * (v as f64).exp_m1()
                }
            })
            .collect();
        activate(&mut xs, Unary::Elu(0.7));
        for (g, w) in xs.iter().zip(&want) {
            assert!(
                (*g as f64 - w).abs() <= 1e-6 * w.abs().max(1e-3),
                "{g} vs {w}"
            );
        }
    }
}
