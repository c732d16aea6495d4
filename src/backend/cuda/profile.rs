//! Profiling of the prepared launch list: whole-forward timing and per-step CUDA events
//! aggregated by a label that names the op, its shapes and its conv kernel.

use super::launch_list::{Prepared, Steps};
use crate::backend::cuda::runtime::device::drv;
use crate::backend::cuda::runtime::launch::{ev, Gpu};
use crate::{Error, Result};

fn check_batch(prep: &Prepared, n: usize) -> Result<()> {
    if n == 0 || n > prep.batch {
        return Err(Error::Invalid(format!(
            "batch {n} outside 1..={}",
            prep.batch
        )));
    }
    Ok(())
}

/// ms per run of the list on `n` windows over `reps` runs (events), after one warm-up.
pub(crate) fn time_forward(gpu: &Gpu, prep: &Prepared, n: usize, reps: usize) -> Result<f64> {
    check_batch(prep, n)?;
    prep.run_steps(gpu, n)?;
    let e0 = ev(&gpu.stream)?;
    for _ in 0..reps {
        prep.run_steps(gpu, n)?;
    }
    let e1 = ev(&gpu.stream)?;
    e1.synchronize().map_err(drv("synchronize"))?;
    Ok(e0.elapsed_ms(&e1).map_err(drv("event timing"))? as f64 / reps.max(1) as f64)
}

/// (label, ms per forward, launches per forward) over `reps` runs after one warm-up, summed
/// over steps of one label, largest first.
pub(crate) fn per_step(
    gpu: &Gpu,
    prep: &Prepared,
    n: usize,
    reps: usize,
) -> Result<Vec<(String, f64, usize)>> {
    if n == 0 || n > prep.batch || reps == 0 {
        return Err(Error::Invalid(format!(
            "batch {n} outside 1..={} or no repetitions",
            prep.batch
        )));
    }
    prep.run_steps(gpu, n)?;
    // Each step on its samples, in running order (a window segment's copies run for windows
    // below n only, one window each).
    let ran: Vec<(usize, usize)> = (0..prep.steps.len())
        .filter_map(|i| {
            let back = (0..n).find_map(|s| prep.samples(i, Steps::Back(s)));
            prep.samples(i, Steps::Front(n)).or(back).map(|m| (i, m))
        })
        .collect();
    let mut times = vec![0f64; ran.len()];
    for _ in 0..reps {
        let mut evs = Vec::with_capacity(ran.len() + 1);
        evs.push(ev(&gpu.stream)?);
        for &(i, m) in &ran {
            prep.run_step(gpu, &prep.steps[i], m)?;
            evs.push(ev(&gpu.stream)?);
        }
        evs.last()
            .expect("one event at least")
            .synchronize()
            .map_err(drv("synchronize"))?;
        for (k, t) in times.iter_mut().enumerate() {
            *t += evs[k]
                .elapsed_ms(&evs[k + 1])
                .map_err(drv("event timing"))? as f64;
        }
    }
    let mut agg: Vec<(String, f64, usize)> = Vec::new();
    for (&(i, _), t) in ran.iter().zip(&times) {
        let label = &prep.labels[i];
        match agg.iter_mut().find(|a| &a.0 == label) {
            Some(a) => {
                a.1 += t / reps as f64;
                a.2 += 1;
            }
            None => agg.push((label.clone(), t / reps as f64, 1)),
        }
    }
    agg.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok(agg)
}
