//! The grey window: CT's soft-tissue window on Hounsfield units, else the 0.5–99.5th
//! percentiles (robust to a few hot voxels, as most viewers' auto-contrast).

use crate::volume::intensity::percentile;
use ndarray::ArrayView3;

/// Values from `lo` (black) to `hi` (white).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    /// Value shown black.
    pub lo: f32,
    /// Value shown white.
    pub hi: f32,
}

/// Soft-tissue window W400/L40 (HU -160 to 240), the usual CT default.
pub const CT: Window = Window {
    lo: 40.0 - 200.0,
    hi: 40.0 + 200.0,
};

/// Values spanning at least this low and this high are taken for HU (air -1000, bone > 300).
const HU_MIN: f32 = -500.0;
const HU_MAX: f32 = 300.0;

impl Window {
    /// [`CT`] when `ct` (the manifest normalises as CT) or the finite values look like HU
    /// (min ≤ -500 and max ≥ 300); else the 0.5–99.5th percentiles of the finite values.
    pub fn choose(image: ArrayView3<f32>, ct: bool) -> Window {
        let mut finite: Vec<f32> = image.iter().copied().filter(|v| v.is_finite()).collect();
        let (min, max) = finite
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| {
                (a.min(v), b.max(v))
            });
        if ct || (min <= HU_MIN && max >= HU_MAX) {
            return CT;
        }
        let lo = percentile(&mut finite, 0.5);
        let hi = percentile(&mut finite, 99.5);
        Window { lo, hi }
    }

    /// `v` as a grey level (NaN black; a flat window maps everything to black).
    pub fn grey(&self, v: f32) -> u8 {
        if self.hi > self.lo && v.is_finite() {
            ((v - self.lo) / (self.hi - self.lo) * 255.0)
                .round()
                .clamp(0.0, 255.0) as u8
        } else {
            0
        }
    }
}
