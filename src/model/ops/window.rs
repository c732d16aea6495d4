//! Sliding-window arithmetic, written once for Conv, ConvTranspose and the pools. Every step is
//! checked: hostile models carry sizes near `usize::MAX`.

/// The three spatial axes' letters, for messages.
pub const AXES: &[u8; 3] = b"DHW";

/// Letter of spatial axis `a` (0..3).
pub fn axis_name(a: usize) -> char {
    AXES.get(a).map_or('?', |&c| c as char)
}

/// Input voxels a dilated kernel spans: d·(k−1)+1 (None on overflow or an empty kernel).
pub fn dilated_extent(k: usize, d: usize) -> Option<usize> {
    d.checked_mul(k.checked_sub(1)?)?.checked_add(1)
}

/// The geometry of a sliding window along D, H, W (a conv's or a pool's), ONNX conventions:
/// `pads` is [d_begin, h_begin, w_begin, d_end, h_end, w_end].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Window size, per D, H, W.
    pub kernel: [usize; 3],
    /// Step between windows, per D, H, W.
    pub stride: [usize; 3],
    /// Spacing between taps, per D, H, W.
    pub dilation: [usize; 3],
    /// Padding, ONNX order (begins then ends).
    pub pads: [usize; 6],
    /// Pools' `ceil_mode`; convolutions floor.
    pub ceil: bool,
}

impl Window {
    /// Output size along axis `a` for `inp` input voxels; None when the window does not fit.
    /// With `ceil`, PyTorch's and ONNX's rule: the last window must start inside the input or the
    /// begin padding.
    pub fn out_len(&self, a: usize, inp: usize) -> Option<usize> {
        let (s, pb) = (self.stride[a], self.pads[a]);
        let keff = dilated_extent(self.kernel[a], self.dilation[a])?;
        let padded = inp.checked_add(pb)?.checked_add(self.pads[a + 3])?;
        if padded < keff || s == 0 {
            return None;
        }
        let span = padded - keff;
        let mut out = if self.ceil {
            span.div_ceil(s) + 1
        } else {
            span / s + 1
        };
        if self.ceil && (out - 1) * s >= inp + pb {
            out -= 1;
        }
        Some(out)
    }

    /// Output sizes along D, H, W, or the first axis (0..3) where the window does not fit.
    pub fn out_spatial(&self, inp: [usize; 3]) -> Result<[usize; 3], usize> {
        let mut o = [0; 3];
        for a in 0..3 {
            o[a] = self.out_len(a, inp[a]).ok_or(a)?;
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(k: usize, s: usize, d: usize, pb: usize, pe: usize, ceil: bool) -> Window {
        Window {
            kernel: [k; 3],
            stride: [s; 3],
            dilation: [d; 3],
            pads: [pb, pb, pb, pe, pe, pe],
            ceil,
        }
    }

    #[test]
    fn conv_sizes() {
        assert_eq!(w(3, 2, 1, 1, 1, false).out_len(0, 64), Some(32));
        assert_eq!(w(3, 1, 4, 4, 4, false).out_len(0, 64), Some(64));
        assert_eq!(w(5, 1, 1, 0, 0, false).out_len(0, 2), None);
        assert_eq!(w(3, 0, 1, 0, 0, false).out_len(0, 8), None);
        assert_eq!(w(3, 1, usize::MAX, 0, 0, false).out_len(0, 8), None);
    }

    #[test]
    fn pool_follows_pytorch_ceil_rule() {
        assert_eq!(w(2, 2, 1, 0, 0, false).out_len(0, 7), Some(3));
        assert_eq!(w(2, 2, 1, 0, 0, true).out_len(0, 7), Some(4));
        // ceil would start a window in the end padding only: dropped (PyTorch/ORT).
        assert_eq!(w(2, 2, 1, 1, 1, true).out_len(0, 4), Some(3));
        assert_eq!(w(3, 2, 1, 1, 1, true).out_len(0, 5), Some(3));
        assert_eq!(w(3, 1, 1, 0, 0, false).out_len(0, 1), None);
        assert_eq!(w(2, 2, 1, 0, 0, true).out_spatial([5, 4, 1]), Err(2));
    }
}
