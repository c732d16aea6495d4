//! One volume split across several devices (`cpu,cpu` here: the same engine code as `cuda:0,1`):
//! labels and blended outputs must be bitwise those of one device.

use crate::common::*;
use ndarray::{Array3, Array4};
use std::path::{Path, PathBuf};
use voxtile::engine::{AxisOrder, Device, Engine, Options, Report};
use voxtile::tiling::{PadMode, Placement};

fn smooth(shape: [usize; 3]) -> Array4<f32> {
    Array4::from_shape_fn((1, shape[0], shape[1], shape[2]), |(_, i, j, k)| {
        ((i as f32 * 0.37).sin() * (j as f32 * 0.21).cos() + (k as f32 * 0.29).sin()) * 0.8
            + 0.05 * ((i * 7 + j * 3 + k) % 11) as f32
    })
}

/// The multi-class fixture (argmax path); deepbrain (one sigmoid channel, threshold path).
fn nnunet() -> Option<PathBuf> {
    shared("fixtures/models/nnunet_small.onnx")
}

type Run = (Array3<u16>, Array4<f32>, Report);

fn run(model: &Path, o: &Options, devices: &[Device], vol: &Array4<f32>) -> Run {
    let mut o = o.clone();
    o.set_devices(devices);
    let mut e = Engine::from_file(model, o).unwrap();
    assert_eq!(e.device_count(), devices.len());
    let mut calls = Vec::new();
    let r = e
        .segment_array(vol.view(), &mut |d, t| calls.push((d, t)))
        .map(parts)
        .unwrap();
    // Progress reaches the total once, and never goes back.
    let last = *calls.last().unwrap();
    assert_eq!(last.0, last.1, "progress ends at the total");
    assert!(calls.windows(2).all(|w| w[0].0 <= w[1].0));
    r
}

const CPU1: &[Device] = &[Device::Cpu];
const CPU2: &[Device] = &[Device::Cpu, Device::Cpu];
const CPU3: &[Device] = &[Device::Cpu, Device::Cpu, Device::Cpu];

/// Same labels and logits, bit for bit, and a report that shows the split.
fn same(one: &Run, many: &Run, parts: usize) {
    assert_eq!(one.0, many.0, "labels differ");
    assert_eq!(one.1.shape(), many.1.shape());
    let bits = |a: &Array4<f32>| a.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert!(bits(&one.1) == bits(&many.1), "blended outputs differ");
    let r = &many.2;
    assert_eq!(r.windows, one.2.windows);
    assert_eq!(r.parts.len(), if parts > 1 { parts } else { 0 });
    if parts > 1 {
        // Parts tile the network D axis exactly, each inside its crop.
        let d = r.input_shape[0];
        assert_eq!(r.parts[0].planes[0], 0);
        assert_eq!(r.parts.last().unwrap().planes[1], d);
        for w in r.parts.windows(2) {
            assert_eq!(w[0].planes[1], w[1].planes[0]);
        }
        for p in &r.parts {
            assert!(p.crop[0] <= p.planes[0] && p.planes[1] <= p.crop[1]);
        }
        assert_eq!(
            r.windows_run,
            r.parts.iter().map(|p| p.windows).sum::<usize>()
        );
        assert!(r.windows_run > r.windows, "boundary windows run twice");
    } else {
        assert_eq!(r.windows_run, r.windows);
    }
}

fn opts() -> Options {
    Options {
        roi: Some([16, 16, 16]),
        keep_logits: true,
        ..Options::default()
    }
}

#[test]
fn two_and_three_cpu_workers_are_bitwise_one() {
    let Some(m) = nnunet() else { return };
    // 72 planes of roi 16 at stride 8: 8 D positions.
    let vol = smooth([72, 20, 18]);
    let o = opts();
    let one = run(&m, &o, CPU1, &vol);
    assert_eq!(one.2.windows_run, one.2.windows);
    // The labels are not trivial (so equality means something).
    assert!(one.0.iter().any(|&l| l != one.0[[0, 0, 0]]));
    let two = run(&m, &o, CPU2, &vol);
    same(&one, &two, 2);
    let three = run(&m, &o, CPU3, &vol);
    same(&one, &three, 3);
    // Labels only (no logits kept): the same labels.
    let o = Options {
        keep_logits: false,
        ..opts()
    };
    let two = run(&m, &o, CPU2, &vol);
    assert_eq!(two.0, one.0);
    assert_eq!(two.1.shape()[0], 0);
}

#[test]
fn batches_placement_axis_order_and_padding_along_h_w() {
    let Some(m) = nnunet() else { return };
    // nnU-Net placement, batch 3 (partial last batches differ per part), zyx axes, H and W smaller
    // than the roi (padded), edge padding.
    let vol = smooth([12, 10, 61]);
    let o = Options {
        batch: Some(3),
        placement: Placement::NnUnet,
        axis_order: AxisOrder::Zyx,
        pad: PadMode::Edge,
        ..opts()
    };
    let one = run(&m, &o, CPU1, &vol);
    let two = run(&m, &o, CPU2, &vol);
    same(&one, &two, 2);
    let three = run(&m, &o, CPU3, &vol);
    same(&one, &three, 3);
}

#[test]
fn more_workers_than_positions_and_a_thin_volume() {
    let Some(m) = nnunet() else { return };
    // 32 planes: D positions 0, 8, 16; 5 workers make 2 parts (a third would not shorten the
    // slowest part). With 2 positions (24 planes) a cut would not help at all: one part.
    let vol = smooth([24, 18, 16]);
    let one = run(&m, &opts(), CPU1, &vol);
    let two = run(&m, &opts(), CPU2, &vol);
    same(&one, &two, 1);
    let vol = smooth([32, 18, 16]);
    let five = [Device::Cpu; 5];
    let one = run(&m, &opts(), CPU1, &vol);
    let many = run(&m, &opts(), &five, &vol);
    same(&one, &many, 2);
    // 10 planes < roi 16: padded along D, one position, one part.
    let vol = smooth([10, 20, 18]);
    let one = run(&m, &opts(), CPU1, &vol);
    let two = run(&m, &opts(), CPU2, &vol);
    same(&one, &two, 1);
}

#[test]
fn one_channel_threshold_model() {
    let m = data("deepbrain.onnx");
    let vol = smooth([40, 16, 24]).mapv(|v| v * 0.5 + 0.5);
    let one = run(&m, &opts(), CPU1, &vol);
    let two = run(&m, &opts(), CPU2, &vol);
    same(&one, &two, 2);
}

#[test]
fn oom_on_one_device_is_retried_there() {
    let Some(m) = nnunet() else { return };
    let vol = smooth([56, 18, 16]);
    let o = Options {
        batch: Some(2),
        ..opts()
    };
    let one = run(&m, &o, CPU1, &vol);
    // The first device's 2nd backend call fails once: the engine redoes the volume on every
    // device at half the batch (its one retry), and the bits stay those of one device.
    let injected = Options {
        inject_oom: Some(2),
        ..o.clone()
    };
    let two = run(&m, &injected, CPU2, &vol);
    same(&one, &two, 2);
    assert_eq!(two.2.oom_retries.len(), 1, "{:?}", two.2.oom_retries);
    assert!(two.2.oom_retries[0].contains("batch 2 -> 1"));
    assert_eq!(two.2.batch, 1);
    assert_eq!((two.2.parts[0].batch, two.2.parts[1].batch), (1, 1));
}

#[test]
fn device_lists_that_cannot_split_are_refused() {
    let m = data("deepbrain.onnx");
    for list in [
        vec![Device::Auto, Device::Cpu],
        vec![Device::Cpu, Device::Cuda(0)],
    ] {
        let mut o = opts();
        o.set_devices(&list);
        let e = Engine::from_file(&m, o).err().expect("refused");
        assert!(e.to_string().contains("device"), "{e}");
    }
    // The options keep the list in order.
    let mut o = Options::default();
    o.set_devices(&[Device::Cuda(1), Device::Cuda(0)]);
    assert_eq!(o.device, Device::Cuda(1));
    assert_eq!(o.devices(), vec![Device::Cuda(1), Device::Cuda(0)]);
}

#[test]
fn cli_one_file_on_two_cpu_workers_is_the_one_worker_file() {
    use voxtile::volume::{Header, Volume};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let vol = Volume {
        data: smooth([40, 16, 24]).mapv(|v| v * 0.5 + 0.5),
        header: Header::new([40, 16, 24], 1, [1.0; 3]),
    };
    let input = d.join("in.nii.gz");
    voxtile::volume::write_f32(&input, vol.data.view(), &vol.header).unwrap();
    let seg = |devices: &str, name: &str| {
        let (out, logits, report) = (
            d.join(format!("{name}.nii.gz")),
            d.join(format!("{name}_logits.nii.gz")),
            d.join(format!("{name}.json")),
        );
        let o = std::process::Command::new(voxtile_bin())
            .args(["segment", input.to_str().unwrap(), "-m"])
            .arg(data("deepbrain.onnx"))
            .args([
                "-o",
                out.to_str().unwrap(),
                "--logits",
                logits.to_str().unwrap(),
            ])
            .args([
                "--roi",
                "16",
                "--allow-small-roi",
                "--device",
                devices,
                "--report",
            ])
            .arg(&report)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let read = |p: &PathBuf| voxtile::volume::read(p).unwrap().data;
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        (read(&out), read(&logits), r)
    };
    let (l1, g1, _) = seg("cpu", "one");
    let (l2, g2, r2) = seg("cpu,cpu", "two");
    assert_eq!(l1, l2);
    let bits = |a: &Array4<f32>| a.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert!(bits(&g1) == bits(&g2));
    let parts = r2["parts"].as_array().expect("the report lists the parts");
    assert_eq!(parts.len(), 2, "{r2}");
    assert!(r2["windows_run"].as_u64().unwrap() > r2["windows"].as_u64().unwrap());
}
