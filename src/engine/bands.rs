//! One attempt at a batch over the bands of a volume ([`crate::tiling::bands`]): the bands run
//! one after another, each on its own copy of the volume's rows and shared among the devices
//! ([`super::parts`]), and each keeps only its own rows of the labels and blended outputs. The
//! device therefore holds one band's accumulators, and the result is bitwise the whole pass's.

use super::parts::{put_own, run_parts, whole_outputs, NetOut, PartRun, Worker};
use super::split::{self, Split};
use crate::backend::{Pass, VolumeRef};
use crate::sys::alloc;
use crate::tiling::{sub_grid, Part};
use crate::Result;
use ndarray::{s, Array4, ArrayView4};
use std::time::Instant;

/// What one band did: its rows, how its grid was shared, each device's run.
pub(super) struct BandRun {
    /// The band's share of H (`planes`: its own rows, `crop`: the rows its windows read).
    pub band: Part,
    /// How its windows were shared among the devices.
    pub split: Split,
    /// Each device's run, in the split's order.
    pub runs: Vec<PartRun>,
}

/// Run `pass` (the whole volume) band by band. The outputs are whole-volume; the first error
/// ends the attempt (the bands run so far are in the returned list).
pub(super) fn run_bands(
    workers: &mut [Worker],
    pass: &Pass<'_>,
    bands: &[Part],
    progress: &mut dyn FnMut(usize, usize),
) -> (Result<NetOut>, Vec<BandRun>) {
    let grids: Vec<_> = bands.iter().map(|b| sub_grid(pass.grid, 1, b)).collect();
    let splits: Vec<Split> = grids
        .iter()
        .map(|g| split::split(g, workers.len()))
        .collect();
    if bands.len() == 1 {
        let (out, runs) = run_parts(workers, pass, &splits[0], progress);
        let split = splits.into_iter().next().expect("one band");
        let band = bands[0].clone();
        return (out, vec![BandRun { band, split, runs }]);
    }
    let total = splits.iter().map(Split::windows_run).sum();
    let mut done = Vec::new();
    let out = (|| {
        let mut whole = whole_outputs(pass)?;
        let mut before = 0;
        for ((band, grid), split) in bands.iter().zip(&grids).zip(splits) {
            let t = Instant::now();
            // A host band is copied (its rows contiguous for the gather); a device volume is
            // read in place, the band a view of its rows.
            let copied;
            let volume = match pass.volume {
                VolumeRef::Host(v) => {
                    copied = band_copy(v, band.crop)?;
                    VolumeRef::Host(copied.view())
                }
                dev => dev.slice_axis(2, band.crop[0]..band.crop[1]).reborrow(),
            };
            let own = band.planes[0] - band.crop[0]..band.planes[1] - band.crop[0];
            let band_pass = Pass {
                volume,
                grid,
                own: [pass.own[0].clone(), own],
                // The hook fires once per pass: in its first band.
                inject_oom: pass.inject_oom.filter(|_| done.is_empty()),
                ..*pass
            };
            let copy = t.elapsed().as_secs_f64();
            let mut prog = |n: usize, _: usize| progress(before + n, total);
            let (r, mut runs) = run_parts(workers, &band_pass, &split, &mut prog);
            before += split.windows_run();
            let t = Instant::now();
            let r = r.map(|out| put_own(&mut whole, out, 1, band));
            if let Some(first) = runs.first_mut() {
                first.seconds.finalize += copy + t.elapsed().as_secs_f64();
            }
            done.push(BandRun {
                band: band.clone(),
                split,
                runs,
            });
            r?;
        }
        Ok(whole)
    })();
    (out, done)
}

/// A standard-layout copy of the volume's rows `[lo, hi)` (network H), plane by plane.
fn band_copy(vol: ArrayView4<f32>, rows: [usize; 2]) -> Result<Array4<f32>> {
    let band = vol.slice(s![.., .., rows[0]..rows[1], ..]);
    let what = "a band of the volume";
    let mut v = alloc::try_with_capacity(band.len(), what)?;
    let (c, d, _, _) = band.dim();
    for ci in 0..c {
        for di in 0..d {
            let p = band.slice(s![ci, di, .., ..]);
            match p.as_slice() {
                Some(sl) => v.extend_from_slice(sl),
                None => v.extend(p.iter().copied()),
            }
        }
    }
    Array4::from_shape_vec(band.raw_dim(), v)
        .map_err(|e| crate::Error::Invalid(format!("{what}: {e}")))
}
