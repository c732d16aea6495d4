//! Small inputs for CLI tests: a ball volume and a one-conv model (what ../shared/checks makes
//! with mkvol.py and mkmodel.py), written by hand.
#![allow(dead_code)]

use super::nifti::nifti_f32;
use super::onnx::{ftensor, ints_attr, model_with, node_with, vi_ncdhw};
use prost::Message;
use std::path::{Path, PathBuf};

/// A blob-like test image of `dims` voxels as a function of the flat file index: a bright ball
/// in the middle, values in [0, 1].
pub fn ball(dims: [usize; 3]) -> impl Fn(usize) -> f32 {
    move |i| {
        let (x, y, z) = (
            i % dims[0],
            (i / dims[0]) % dims[1],
            i / (dims[0] * dims[1]),
        );
        let c = |v: usize, n: usize| (v as f32 + 0.5) / n as f32 - 0.5;
        let r2 = c(x, dims[0]).powi(2) + c(y, dims[1]).powi(2) + c(z, dims[2]).powi(2);
        (1.0 - 3.0 * r2).max(0.0)
    }
}

/// A float32 NIfTI-1 file of [`ball`] at `path`.
pub fn ball_volume(path: &Path, dims: [usize; 3]) -> PathBuf {
    std::fs::write(path, nifti_f32(&dims.map(|d| d as i64), ball(dims))).unwrap();
    path.to_path_buf()
}

/// A model of one 3x3x3 Conv (pads 1), 1 -> `channels`, dynamic N,D,H,W, deterministic weights.
pub fn conv_model(path: &Path, channels: usize) -> PathBuf {
    conv_model_in(path, 1, channels)
}

/// [`conv_model`] with `inputs` input channels.
pub fn conv_model_in(path: &Path, inputs: usize, channels: usize) -> PathBuf {
    let (ci, c) = (inputs as i64, channels as i64);
    let w: Vec<f32> = (0..channels * inputs * 27)
        .map(|i| ((i * 37 % 17) as f32 - 8.0) * 0.05)
        .collect();
    let b: Vec<f32> = (0..channels).map(|i| i as f32 * 0.1 - 0.05).collect();
    let m = model_with(
        "g",
        17,
        vec![node_with(
            "Conv",
            "conv",
            &["x", "w", "b"],
            &["y"],
            vec![ints_attr("pads", vec![1; 6])],
        )],
        vec![ftensor("w", &[c, ci, 3, 3, 3], w), ftensor("b", &[c], b)],
        vec![vi_ncdhw("x", Some(ci))],
        vec![vi_ncdhw("y", Some(c))],
    );
    std::fs::write(path, m.encode_to_vec()).unwrap();
    path.to_path_buf()
}
