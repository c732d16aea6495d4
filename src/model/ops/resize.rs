//! Spatial resizing (ONNX Resize / Upsample): parameters, validation and output geometry.

use super::window::axis_name;

/// Nearest-neighbour or (tri)linear interpolation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResizeMode {
    /// Nearest neighbour, rounded as `NearestMode` says.
    Nearest,
    /// Trilinear interpolation.
    Linear,
}

/// ONNX Resize's `coordinate_transformation_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoordMode {
    /// `(x_out + 0.5) / scale - 0.5`.
    HalfPixel,
    /// As `HalfPixel`, but 0 where the output axis has one voxel.
    PytorchHalfPixel,
    /// Corner voxels of input and output coincide.
    AlignCorners,
    /// `x_out / scale`.
    Asymmetric,
}

/// ONNX Resize's `nearest_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NearestMode {
    /// Round halves down.
    RoundPreferFloor,
    /// Round halves up.
    RoundPreferCeil,
    /// Round down.
    Floor,
    /// Round up.
    Ceil,
}

/// Spatial resize; the output size is `sizes` if given, else floor(input · scales).
#[derive(Clone, Debug, PartialEq)]
pub struct Resize {
    /// Interpolation.
    pub mode: ResizeMode,
    /// How output coordinates map to input coordinates.
    pub coord: CoordMode,
    /// Rounding of `ResizeMode::Nearest`.
    pub nearest: NearestMode,
    /// D,H,W scale factors (also used for coordinate mapping when sizes are given: ONNX uses
    /// output/input then).
    pub scales: [f32; 3],
    /// Explicit D,H,W output size; None: from `scales`.
    pub sizes: Option<[usize; 3]>,
}

impl Resize {
    /// Refuses scales that are not positive finite numbers (when they decide the size).
    pub fn check(&self) -> Result<(), String> {
        if self.sizes.is_none() {
            if let Some(s) = self.scales.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
                return Err(format!("scale {s} is not a positive number"));
            }
        }
        Ok(())
    }

    /// Output D,H,W for an input of `inp` voxels: `sizes`, or floor(input · scale).
    pub fn out_size(&self, inp: [usize; 3]) -> Result<[usize; 3], String> {
        self.check()?;
        let mut o = [0; 3];
        for a in 0..3 {
            o[a] = match self.sizes {
                Some(s) => s[a],
                None => (inp[a] as f32 * self.scales[a]).floor() as usize,
            };
            if o[a] == 0 {
                return Err(format!(
                    "resizing {} voxels by {} along {} gives an empty output",
                    inp[a],
                    self.scales[a],
                    axis_name(a)
                ));
            }
        }
        Ok(o)
    }

    /// Scales that map output coordinates back to the input: `scales`, or output/input when
    /// `sizes` are given (as ONNX specifies).
    pub fn coord_scales(&self, inp: [usize; 3], out: [usize; 3]) -> [f32; 3] {
        match self.sizes {
            Some(_) => [0, 1, 2].map(|a| out[a] as f32 / inp[a].max(1) as f32),
            None => self.scales,
        }
    }

    /// Output size and coordinate-mapping scales for an input of `inp` voxels.
    pub fn geometry(&self, inp: [usize; 3]) -> Result<([usize; 3], [f32; 3]), String> {
        let out = self.out_size(inp)?;
        Ok((out, self.coord_scales(inp, out)))
    }

    /// Interpolation taps per output voxel, as a rough cost: 16 for linear, 1 for nearest.
    pub fn cost_per_output(&self) -> u64 {
        match self.mode {
            ResizeMode::Linear => 16,
            ResizeMode::Nearest => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(scales: [f32; 3], sizes: Option<[usize; 3]>) -> Resize {
        Resize {
            mode: ResizeMode::Linear,
            coord: CoordMode::HalfPixel,
            nearest: NearestMode::Floor,
            scales,
            sizes,
        }
    }

    #[test]
    fn sizes_and_scales() {
        assert_eq!(
            r([2.0, 0.5, 1.5], None).geometry([4, 5, 3]),
            Ok(([8, 2, 4], [2.0, 0.5, 1.5]))
        );
        assert_eq!(
            r([1.0; 3], Some([8, 4, 2])).geometry([4, 4, 4]),
            Ok(([8, 4, 2], [2.0, 1.0, 0.5]))
        );
        assert!(r([0.1, 1.0, 1.0], None).out_size([4, 4, 4]).is_err());
        assert!(r([f32::NAN, 1.0, 1.0], None).check().is_err());
        assert!(r([0.0; 3], Some([1; 3])).check().is_ok());
    }
}
