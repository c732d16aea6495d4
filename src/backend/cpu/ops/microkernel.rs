//! The register-blocked inner loop of the direct convolution: one tile of `co` output channels ×
//! [`PIX`] consecutive pixels, accumulated over a list of K taps. Tap k reads the pixels at
//! `src[offs[k] ..][.. PIX]` and the weights at `w[k * co ..][.. co]` (packed `[K][co]`), so the
//! caller (`direct.rs`) expresses any kernel size, dilation, stride and padding through `offs`.
//!
//! f32 runs AVX-512 or AVX2+FMA kernels chosen at run time (the chosen ISA is fixed per process,
//! so results are bitwise reproducible); f64 (the reference) and other CPUs run a portable loop.

use crate::backend::cpu::Real;
use std::any::TypeId;

/// Pixels per tile (two AVX-512 vectors, four AVX2 vectors).
pub const PIX: usize = 32;

/// The instruction set the f32 tiles run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Isa {
    Avx512,
    Avx2,
    Portable,
}

fn isa<T: Real>() -> Isa {
    if TypeId::of::<T>() != TypeId::of::<f32>() {
        return Isa::Portable;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return Isa::Avx512;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return Isa::Avx2;
        }
    }
    Isa::Portable
}

/// Most output channels one tile holds in registers for T on this CPU.
pub fn max_co<T: Real>() -> usize {
    match isa::<T>() {
        Isa::Avx512 => 12,
        Isa::Avx2 => 3,
        Isa::Portable => 8,
    }
}

/// The start of each tap's pixel run, with its maximum (so a tile checks bounds in O(1)).
pub struct Taps {
    offs: Vec<usize>,
    max: usize,
}

impl Taps {
    /// Wraps the per-tap offsets.
    pub fn new(offs: Vec<usize>) -> Self {
        let max = offs.iter().copied().max().unwrap_or(0);
        Self { offs, max }
    }

    /// The `src` length every tile over these taps needs.
    pub fn span(&self) -> usize {
        self.max + PIX
    }
}

/// The operands of one tile.
pub struct Tile<'a, T> {
    /// The pixels every tap reads from (must hold [`Taps::span`] values).
    pub src: &'a [T],
    /// Where each tap reads in `src`.
    pub taps: &'a Taps,
    /// Weights packed `[K][co]`.
    pub w: &'a [T],
    /// Output channels of this tile, `1..=max_co::<T>()`.
    pub co: usize,
}

/// `out[c * PIX + p] = Σ_k w[k * co + c] · src[offs[k] + p]` for `c < co`, `p < PIX`.
pub fn run<T: Real>(t: &Tile<T>, out: &mut [T]) {
    let k = t.taps.offs.len();
    assert!(
        t.co >= 1 && t.co <= max_co::<T>(),
        "tile: bad channel count"
    );
    assert!(
        t.w.len() >= k * t.co && out.len() >= t.co * PIX,
        "tile: short operands"
    );
    assert!(
        k == 0 || t.taps.span() <= t.src.len(),
        "tile: taps out of bounds"
    );
    match isa::<T>() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx2 => {
            // SAFETY: T is f32 (checked by `isa`); every read and write was bounds-checked above;
            // the CPU supports the ISA (run-time detection).
            unsafe { x86::dispatch(isa::<T>() == Isa::Avx512, t, out) }
        }
        _ => portable(t, out),
    }
}

fn portable<T: Real>(t: &Tile<T>, out: &mut [T]) {
    let co = t.co;
    let out = &mut out[..co * PIX];
    out.fill(T::ZERO);
    for (k, &o) in t.taps.offs.iter().enumerate() {
        let x = &t.src[o..o + PIX];
        for (c, acc) in out.chunks_exact_mut(PIX).enumerate() {
            let wv = t.w[k * co + c];
            for (a, &xv) in acc.iter_mut().zip(x) {
                *a += wv * xv;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Tile, PIX};
    use crate::backend::cpu::Real;
    use std::arch::x86_64::*;

    /// Instantiates the tile for every channel count up to the ISA's maximum.
    ///
    /// # Safety
    /// T must be f32, the operands bounds-checked as in [`super::run`], the ISA available.
    pub(super) unsafe fn dispatch<T: Real>(avx512: bool, t: &Tile<T>, out: &mut [T]) {
        let src = t.src.as_ptr() as *const f32;
        let w = t.w.as_ptr() as *const f32;
        let o = out.as_mut_ptr() as *mut f32;
        let offs = t.taps.offs.as_slice();
        macro_rules! go {
            ($f:ident, $($n:literal)*) => {
                match t.co {
                    $($n => $f::<$n>(src, offs, w, o),)*
                    _ => unreachable!("tile: channel count checked by the caller"),
                }
            };
        }
        // SAFETY: forwarded contract.
        unsafe {
            if avx512 {
                go!(tile512, 1 2 3 4 5 6 7 8 9 10 11 12)
            } else {
                go!(tile256, 1 2 3)
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn tile512<const CO: usize>(
        src: *const f32,
        offs: &[usize],
        w: *const f32,
        out: *mut f32,
    ) {
        let mut acc = [[_mm512_setzero_ps(); 2]; CO];
        for (k, &o) in offs.iter().enumerate() {
            // SAFETY: bounds checked by `run`.
            unsafe {
                let p = src.add(o);
                let x0 = _mm512_loadu_ps(p);
                let x1 = _mm512_loadu_ps(p.add(16));
                let wk = w.add(k * CO);
                for (c, a) in acc.iter_mut().enumerate() {
                    let b = _mm512_set1_ps(*wk.add(c));
                    a[0] = _mm512_fmadd_ps(x0, b, a[0]);
                    a[1] = _mm512_fmadd_ps(x1, b, a[1]);
                }
            }
        }
        for (c, a) in acc.iter().enumerate() {
            // SAFETY: `out` holds CO * PIX values (checked by `run`).
            unsafe {
                _mm512_storeu_ps(out.add(c * PIX), a[0]);
                _mm512_storeu_ps(out.add(c * PIX + 16), a[1]);
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile256<const CO: usize>(
        src: *const f32,
        offs: &[usize],
        w: *const f32,
        out: *mut f32,
    ) {
        let mut acc = [[_mm256_setzero_ps(); 4]; CO];
        for (k, &o) in offs.iter().enumerate() {
            // SAFETY: bounds checked by `run`.
            unsafe {
                let p = src.add(o);
                let x = [
                    _mm256_loadu_ps(p),
                    _mm256_loadu_ps(p.add(8)),
                    _mm256_loadu_ps(p.add(16)),
                    _mm256_loadu_ps(p.add(24)),
                ];
                let wk = w.add(k * CO);
                for (c, a) in acc.iter_mut().enumerate() {
                    let b = _mm256_set1_ps(*wk.add(c));
                    for v in 0..4 {
                        a[v] = _mm256_fmadd_ps(x[v], b, a[v]);
                    }
                }
            }
        }
        for (c, a) in acc.iter().enumerate() {
            for (v, av) in a.iter().enumerate() {
                // SAFETY: `out` holds CO * PIX values (checked by `run`).
                unsafe { _mm256_storeu_ps(out.add(c * PIX + v * 8), *av) };
            }
        }
    }
}
