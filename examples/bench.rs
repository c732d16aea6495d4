//! Times the engine on one volume: `bench MODEL.onnx VOLUME.npy|DxHxW ROI OVERLAP BATCH REPS DEVICE [LABELS_OUT.npy|-] [BUDGET]`.
//! ROI and BATCH may be `auto` (or 0): the memory planner chooses them under BUDGET (e.g. 4GiB;
//! default: 80% of free device memory). The report in the JSON carries `predicted_peak_bytes`
//! next to `peak_device_bytes` / `peak_host_bytes`.
//! DEVICE may be a list (`cuda:0,1`): the volume's windows are split across the devices.
//! Prints one JSON line (median seconds, windows, stage times, peak memory) for tests/gpu/bench.py,
//! which runs it next to the PyTorch peer in the same device session.

use ndarray::{Array4, Axis};
use std::time::Instant;
use voxtile::engine::{Engine, Options};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 8 {
        return Err(
            "usage: bench MODEL VOLUME.npy|DxHxW ROI|auto OVERLAP BATCH|auto REPS DEVICE [LABELS_OUT.npy|-] [BUDGET]"
                .into(),
        );
    }
    let vol: Array4<f32> = if a[2].ends_with(".npy") {
        let v = voxtile::internals::npy::read_f32(a[2].as_ref())?;
        let v = v.into_dimensionality::<ndarray::Ix3>()?;
        v.insert_axis(Axis(0))
    } else {
        let d: Vec<usize> = a[2]
            .split('x')
            .map(|s| s.parse())
            .collect::<Result<_, _>>()?;
        // Smooth structured data, not zeros.
        Array4::from_shape_fn((1, d[0], d[1], d[2]), |(_, i, j, k)| {
            ((i as f32 * 0.05).sin() + (j as f32 * 0.07).cos() * (k as f32 * 0.03).sin()) * 0.7
        })
    };
    let auto = |s: &str| -> Result<Option<usize>, std::num::ParseIntError> {
        if s == "auto" {
            return Ok(None);
        }
        s.parse::<usize>().map(|v| (v > 0).then_some(v))
    };
    let mut options = Options {
        roi: auto(&a[3])?.map(|r| [r; 3]),
        overlap: [a[4].parse()?; 3],
        batch: auto(&a[5])?,
        memory_budget: a
            .get(9)
            .map(|b| voxtile::plan::parse_bytes(b))
            .transpose()?,
        ..Options::default()
    };
    options.set_devices(&voxtile::internals::cli::dataset::parse_devices(&a[7])?);
    let reps: usize = a[6].parse()?;
    let t = Instant::now();
    let mut engine = Engine::from_file(&a[1], options)?;
    let load = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let seg = engine.segment_array(vol.view(), &mut |_, _| {})?;
    let (labels, first) = (seg.labels, seg.report);
    let first_s = t.elapsed().as_secs_f64();
    let mut times = Vec::new();
    let mut last = first;
    for _ in 0..reps {
        let t = Instant::now();
        let seg = engine.segment_array(vol.view(), &mut |_, _| {})?;
        times.push(t.elapsed().as_secs_f64());
        // Time to the labels, as the peer's timing ends when its output exists: freeing the
        // label map (a 512x512x128 one's 64 MiB of pages: ~5 ms) is the caller's, after.
        last = seg.report;
    }
    times.sort_by(|x, y| x.partial_cmp(y).unwrap());
    let median = if times.is_empty() {
        first_s
    } else {
        times[times.len() / 2]
    };
    if let Some(p) = a.get(8).filter(|p| !p.is_empty() && p.as_str() != "-") {
        let l = labels.mapv(|v| v as f32).into_dyn();
        voxtile::internals::npy::write_f32(p.as_ref(), &l)?;
    }
    let out = serde_json::json!({
        "device": engine.device_name(), "load_s": load, "first_s": first_s, "median_s": median,
        "times": times, "report": last,
    });
    println!("{out}");
    Ok(())
}
