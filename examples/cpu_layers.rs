//! Times every node of a model on the CPU backend's ops, one window: `cpu_layers MODEL.onnx D,H,W`.
//! Prints per node the milliseconds and, for convolutions, GFLOP/s (2 flops per multiply-add),
//! then the total. Used by `bench/cpu_vs_ort.py` for the per-layer table of BENCHMARKS.md;
//! `RAYON_NUM_THREADS` sets the thread count.

use ndarray::{Array5, ArrayView5};
use std::time::Instant;
use voxtile::internals::cpu::ops;
use voxtile::model::Op;

/// Multiply-adds × 2 of a (transposed) convolution from its weight and the larger activation.
fn flops(op: &Op, x: &[usize], y: &[usize]) -> Option<f64> {
    let per = |w: &[usize], g: usize| (w.iter().product::<usize>() / g.max(1)) as f64;
    match op {
        Op::Conv(c) => {
            let g = c.groups.max(1);
            Some(
                2.0 * per(&c.weight.shape, 1) / g as f64
                    * g as f64
                    * y[0] as f64
                    * (y[2] * y[3] * y[4]) as f64,
            )
        }
        Op::ConvTranspose(c) => {
            Some(2.0 * per(&c.weight.shape, 1) * x[0] as f64 * (x[2] * x[3] * x[4]) as f64)
        }
        _ => None,
    }
}

/// CPU seconds of the whole process (all threads): on a loaded machine this, not wall time,
/// says what the work costs.
fn cpu_s() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer for clock_gettime.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 3 {
        return Err("usage: cpu_layers MODEL.onnx D,H,W".into());
    }
    let g = voxtile::model::load(&a[1])?;
    let r: Vec<usize> = a[2]
        .split(',')
        .map(|s| s.parse())
        .collect::<Result<_, _>>()?;
    let c = g.input_channels();
    let x = Array5::from_shape_fn((1, c, r[0], r[1], r[2]), |(_, ch, i, j, k)| {
        ((i as f32 * 0.05 + ch as f32).sin() + (j as f32 * 0.07).cos() * (k as f32 * 0.03).sin())
            * 0.7
    });
    let mut last = vec![0usize; g.values.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        for &v in &n.inputs {
            last[v] = i;
        }
    }
    let mut vals: Vec<Option<Array5<f32>>> = (0..g.values.len()).map(|_| None).collect();
    vals[g.input] = Some(x);
    let (t_all, c_all) = (Instant::now(), cpu_s());
    for (i, n) in g.nodes.iter().enumerate() {
        let ins: Vec<ArrayView5<f32>> = n
            .inputs
            .iter()
            .map(|&v| vals[v].as_ref().expect("computed").view())
            .collect();
        let (t, c0) = (Instant::now(), cpu_s());
        let y = ops::apply(&n.op, &ins)?;
        let (s, cpu) = (t.elapsed().as_secs_f64(), cpu_s() - c0);
        let f = flops(&n.op, ins[0].shape(), y.shape());
        let rate = f.map_or(String::new(), |f| {
            format!(
                "{:8.1} GFLOP/s {:8.1} per CPU-s",
                f / s / 1e9,
                f / cpu / 1e9
            )
        });
        println!(
            "{:>3} {:<14} {:>26} {:9.1} ms wall {:9.1} ms CPU {rate}",
            i,
            n.op.name(),
            format!("{:?}", y.shape()),
            s * 1e3,
            cpu * 1e3
        );
        drop(ins);
        for &v in &n.inputs {
            if last[v] == i {
                vals[v] = None;
            }
        }
        vals[n.output] = Some(y);
    }
    println!(
        "total {:.3} s wall, {:.3} s CPU",
        t_all.elapsed().as_secs_f64(),
        cpu_s() - c_all
    );
    Ok(())
}
