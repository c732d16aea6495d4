//! The report's kernel per layer: each distinct step of the prepared launch list (its profile
//! label: op, fused activation or head, kernel, shapes) in running order, with its launches per
//! pass over a batch and its kernel's family (`conv_wgmma`: the Hopper wgmma path), so a run's
//! `--report` says what each layer ran on.

use crate::backend::cuda::host::catalogue::family_of;
use serde::Serialize;

/// One layer of the launch list as the report shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerKernel {
    /// The step's profile label (`Conv k333 s1 [conv_wz_c32_y16_h2] 32x128x128x128 -> ...`).
    pub layer: String,
    /// Its launches in one pass over a batch (a window segment's steps run once per window).
    pub launches: usize,
    /// The family of its kernel (`kernels/<family>.cu`), where the label names one.
    pub family: Option<&'static str>,
}

/// The layers of a launch list from its steps' labels, first appearance first.
pub fn layer_kernels(labels: &[String]) -> Vec<LayerKernel> {
    let mut out: Vec<LayerKernel> = Vec::new();
    for label in labels {
        if let Some(l) = out.iter_mut().find(|l| &l.layer == label) {
            l.launches += 1;
            continue;
        }
        // The kernel between the brackets (a split-K conv adds " split-K n" after it).
        let kernel = label
            .split_once('[')
            .and_then(|(_, r)| r.split([']', ' ']).next());
        out.push(LayerKernel {
            layer: label.clone(),
            launches: 1,
            family: kernel.and_then(family_of).map(|f| f.name()),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_name_their_kernel_family() {
        let labels: Vec<String> = [
            "Conv k333 s1 [conv_c1_k3_st] 1x128x128x128 -> 32x128x128x128",
            "InstanceNormalization +Leaky 32x128x128x128 -> 32x128x128x128",
            "Conv k333 s1 [conv_wz_c32_y16_h2] 32x128x128x128 -> 32x128x128x128",
            "Conv k333 s1 [conv_c1_k3_st] 1x128x128x128 -> 32x128x128x128",
            "Conv k333 s2 [conv_mma_m128n64_v8 split-K 8] 320x8x8x8 -> 320x4x4x4",
            "InstanceNormalization +Leaky +head [conv1x1_norm_n16] 32x8x8x8 -> 14x8x8x8",
            "Conv k333 s1 [no_such_kernel] 2x2x2x2 -> 2x2x2x2",
        ]
        .map(String::from)
        .to_vec();
        let l = layer_kernels(&labels);
        let got: Vec<(usize, Option<&str>)> = l.iter().map(|l| (l.launches, l.family)).collect();
        assert_eq!(
            got,
            [
                (2, Some("conv_small")),
                (1, None),
                (1, Some("conv_wgmma")),
                (1, Some("conv_mma")),
                (1, Some("conv_small")),
                (1, None),
            ]
        );
        assert_eq!(l[2].layer, labels[2]);
    }
}
