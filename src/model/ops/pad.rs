//! Pad on an NCDHW activation (constant, reflect, edge; negative pads crop), defined once:
//! parameters, validation, output size and the index map both backends follow.

use super::ncdhw;

/// Largest pad (or crop) magnitude accepted: keeps the size arithmetic far from overflow.
pub const PAD_LIMIT: i64 = 1 << 20;

/// How padded elements are filled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PadMode {
    /// A constant value.
    Constant,
    /// Mirrored about the edge element, which is not repeated (ONNX `reflect`).
    Reflect,
    /// The edge element repeated (ONNX `edge`, PyTorch `replicate`).
    Edge,
}

/// Pads per NCDHW axis. A negative pad crops that many elements first (as onnxruntime does);
/// the positive pads are then filled from the cropped tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Pad {
    /// Fill mode.
    pub mode: PadMode,
    /// Elements added before the start of each NCDHW axis (negative: removed). N must be 0.
    pub begin: [i64; 5],
    /// Elements added after the end of each NCDHW axis (negative: removed). N must be 0.
    pub end: [i64; 5],
    /// The fill value of [`PadMode::Constant`].
    pub value: f32,
}

/// Where the output elements of one axis come from: input `[lo, lo + len)` is kept, shifted
/// by `shift` (the output index of input `lo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AxisMap {
    /// First kept input index.
    pub lo: usize,
    /// Kept input elements.
    pub len: usize,
    /// Output index of input element `lo` (the positive begin pad).
    pub shift: usize,
    /// Output size along the axis.
    pub out: usize,
}

impl AxisMap {
    /// The input index output index `o` reads, or None where the constant is written.
    pub fn source(&self, o: usize, mode: PadMode) -> Option<usize> {
        let j = o as i64 - self.shift as i64;
        let m = self.len as i64;
        let k = match mode {
            _ if (0..m).contains(&j) => j,
            PadMode::Constant => return None,
            PadMode::Edge => j.clamp(0, m - 1),
            PadMode::Reflect if m == 1 => 0,
            PadMode::Reflect => {
                let p = 2 * (m - 1);
                let r = j.rem_euclid(p);
                if r < m {
                    r
                } else {
                    p - r
                }
            }
        };
        Some(self.lo + k as usize)
    }
}

impl Pad {
    /// Whether the op changes nothing (all pads zero).
    pub fn is_noop(&self) -> bool {
        self.begin.iter().chain(&self.end).all(|&p| p == 0)
    }

    /// The index map of NCDHW axis `a` for an input of `n` elements along it, or why the pads
    /// do not fit (crops that leave nothing, reflect pads not smaller than the size).
    pub fn axis(&self, a: usize, n: usize) -> Result<AxisMap, String> {
        let (b, e) = (self.begin[a], self.end[a]);
        if b.abs() > PAD_LIMIT || e.abs() > PAD_LIMIT {
            return Err(format!(
                "pads ({b}, {e}) along {} exceed {PAD_LIMIT}",
                ncdhw(a)
            ));
        }
        let n = n as i64;
        let (lo, hi) = ((-b).max(0), n - (-e).max(0));
        if hi <= lo {
            return Err(format!(
                "pads ({b}, {e}) along {} crop all {n} elements",
                ncdhw(a)
            ));
        }
        let len = hi - lo;
        if self.mode == PadMode::Reflect && (b >= len || e >= len) {
            return Err(format!(
                "reflect pads ({b}, {e}) along {} must be smaller than its size {len}",
                ncdhw(a)
            ));
        }
        Ok(AxisMap {
            lo: lo as usize,
            len: len as usize,
            shift: b.max(0) as usize,
            out: (len + b.max(0) + e.max(0)) as usize,
        })
    }

    /// Validates the pads that do not depend on the window (none on N, a finite value) and
    /// the channel axis on `cin` channels; returns the output channels.
    pub fn check(&self, cin: usize) -> Result<usize, String> {
        if self.begin[0] != 0 || self.end[0] != 0 {
            return Err(format!(
                "pads ({}, {}) on the batch axis N are not supported (the batch is the windows)",
                self.begin[0], self.end[0]
            ));
        }
        if !self.value.is_finite() {
            return Err(format!("constant value {} is not finite", self.value));
        }
        for a in 2..5 {
            if self.begin[a].abs() > PAD_LIMIT || self.end[a].abs() > PAD_LIMIT {
                return Err(format!("pads along {} exceed {PAD_LIMIT}", ncdhw(a)));
            }
        }
        Ok(self.axis(1, cin)?.out)
    }

    /// Output D, H, W for an input of `sp` voxels.
    pub fn out_spatial(&self, sp: [usize; 3]) -> Result<[usize; 3], String> {
        let mut o = [0; 3];
        for a in 0..3 {
            o[a] = self.axis(a + 2, sp[a])?.out;
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pad(mode: PadMode, b: i64, e: i64) -> Pad {
        Pad {
            mode,
            begin: [0, 0, 0, 0, b],
            end: [0, 0, 0, 0, e],
            value: 0.0,
        }
    }

    fn row(p: &Pad, n: usize) -> Vec<Option<usize>> {
        let m = p.axis(4, n).unwrap();
        (0..m.out).map(|o| m.source(o, p.mode)).collect()
    }

    #[test]
    fn index_maps_follow_numpy() {
        // np.pad(arange(4), (2, 3), 'reflect') = [2 1 0 1 2 3 2 1 0]
        let r = row(&pad(PadMode::Reflect, 2, 3), 4);
        assert_eq!(r, [2, 1, 0, 1, 2, 3, 2, 1, 0].map(Some));
        let e = row(&pad(PadMode::Edge, 2, 1), 3);
        assert_eq!(e, [0, 0, 0, 1, 2, 2].map(Some));
        let c = row(&pad(PadMode::Constant, 1, -2), 4);
        assert_eq!(c, vec![None, Some(0), Some(1)]);
        // Crop 1 at the start, then reflect 2 at the end within [1, 4).
        let rc = row(&pad(PadMode::Reflect, -1, 2), 4);
        assert_eq!(rc, [1, 2, 3, 2, 1].map(Some));
    }

    #[test]
    fn bad_pads_are_refused() {
        assert!(pad(PadMode::Reflect, 4, 0).axis(4, 4).is_err());
        assert!(pad(PadMode::Reflect, 3, 3).axis(4, 4).is_ok());
        assert!(pad(PadMode::Constant, -2, -2).axis(4, 4).is_err());
        let mut p = pad(PadMode::Constant, 0, 0);
        p.begin[0] = 1;
        assert!(p.check(3).unwrap_err().contains("batch"));
        p.begin = [0, 2, 0, 0, 0];
        assert_eq!(p.check(3), Ok(5));
    }
}
