//! Post-processing of a label map, per class, as users of TotalSegmentator and MONAI expect:
//! keep the largest connected component, remove components under a volume, fill enclosed
//! holes; and per-class statistics. Connectivity is 6 (face neighbours), scipy.ndimage.label's
//! default. Buffers of the volume's size are allocated fallibly.

mod classes;
mod components;
mod holes;
mod statistics;

pub use classes::Classes;
pub use components::{label, remove, Components, Region};
pub use holes::fill;
pub use statistics::{statistics, ClassStatistics};

use crate::volume::LabelNames;
use crate::{Error, Result};
use ndarray::Array3;

/// The post-processing steps of a run, applied in this order: keep-largest and the minimum
/// component size (together, on the components of the label map as predicted), then holes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Postprocess {
    /// Keep only the largest component of these classes.
    pub keep_largest: Classes,
    /// Remove components of these classes smaller than this many mL.
    pub min_component: Option<(f64, Classes)>,
    /// Fill the enclosed holes of these classes.
    pub fill_holes: Classes,
}

impl Postprocess {
    /// Whether any step is on.
    pub fn is_on(&self) -> bool {
        self.keep_largest != Classes::Off
            || self.min_component.is_some()
            || self.fill_holes != Classes::Off
    }

    /// Apply every step to `labels` (`names`: the label map's class names; `voxel_ml`: the
    /// volume of one voxel). Returns the voxels changed.
    pub fn apply(
        &self,
        labels: &mut Array3<u16>,
        names: &LabelNames,
        voxel_ml: f64,
    ) -> Result<u64> {
        if !self.is_on() {
            return Ok(0);
        }
        if !labels.is_standard_layout() {
            let mut s = crate::sys::alloc::try_zeros(labels.raw_dim(), "the label map")?;
            s.assign(labels);
            *labels = s;
        }
        let dims = [labels.shape()[0], labels.shape()[1], labels.shape()[2]];
        let flat = labels
            .as_slice_mut()
            .ok_or_else(|| Error::Invalid("post-processing: label map not contiguous".into()))?;
        let largest = self.keep_largest.mask(names, "keep-largest")?;
        let (min, min_voxels) = match &self.min_component {
            Some((ml, c)) => (c.mask(names, "min-component-ml")?, ml / voxel_ml),
            None => (Vec::new(), 0.0),
        };
        let mut changed = 0;
        if self.keep_largest != Classes::Off || self.min_component.is_some() {
            changed += remove(flat, dims, &largest, (&min, min_voxels))?;
        }
        if self.fill_holes != Classes::Off {
            changed += fill(flat, dims, &self.fill_holes.mask(names, "fill-holes")?)?;
        }
        Ok(changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_apply_in_order_with_the_voxel_volume() {
        // Class 1: a 3x3x3 cube with a hole at its centre and a 2-voxel speck; class 2: one voxel.
        let mut l = Array3::<u16>::zeros((8, 8, 8));
        l.slice_mut(ndarray::s![1..4, 1..4, 1..4]).fill(1);
        l[[2, 2, 2]] = 0;
        l[[6, 6, 6]] = 1;
        l[[6, 6, 5]] = 1;
        l[[6, 1, 6]] = 2;
        let names = LabelNames::default();
        let p = Postprocess {
            min_component: Some((0.5, Classes::All)),
            fill_holes: Classes::Listed(vec!["1".into()]),
            ..Default::default()
        };
        // 0.2 mL voxels: the speck (0.4 mL) and class 2 (0.2 mL) go, the cube (5.2 mL) stays.
        let changed = p.apply(&mut l, &names, 0.2).unwrap();
        assert_eq!(changed, 3 + 1);
        assert_eq!(l.iter().filter(|&&v| v == 1).count(), 27);
        assert_eq!(l.iter().filter(|&&v| v == 2).count(), 0);
        // Off does nothing; one 1 mL voxel is not under 0.5 mL.
        let mut k = Array3::<u16>::zeros((4, 4, 4));
        k[[0, 0, 0]] = 1;
        let off = Postprocess::default();
        assert_eq!(off.apply(&mut k, &names, 1.0).unwrap(), 0);
        let p = Postprocess {
            min_component: Some((0.5, Classes::All)),
            ..Default::default()
        };
        assert_eq!(p.apply(&mut k, &names, 1.0).unwrap(), 0, "1 mL voxel kept");
    }
}
