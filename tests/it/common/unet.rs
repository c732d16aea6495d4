//! An nnU-Net `PlainConvUNet` (dynamic_network_architectures) as `torch.onnx.export` writes it
//! (opset 17, dynamic N,D,H,W), built by hand with cheap weights: the W1 network of the
//! benchmarks without torch. Per stage: Conv(+bias) -> InstanceNormalization(affine) ->
//! LeakyRelu(0.01), twice; the first conv of stages 1.. has stride 2. Decoder per level:
//! ConvTranspose k2 s2 (+bias), Concat(up, skip) as `torch.cat((x, skips[-(s+2)]), 1)`, two conv
//! blocks; a 1x1x1 conv head.
#![allow(dead_code)]

use super::onnx::*;
use voxtile::internals::proto;

/// The W1 network: 6 stages, features 32..320, 14 classes, one input channel.
pub const W1_FEATURES: [usize; 6] = [32, 64, 128, 256, 320, 320];
pub const W1_CLASSES: usize = 14;

struct Builder {
    nodes: Vec<proto::NodeProto>,
    inits: Vec<proto::TensorProto>,
    n: usize,
}

impl Builder {
    fn name(&mut self, what: &str) -> String {
        self.n += 1;
        format!("/{what}_{}", self.n)
    }
    /// A small deterministic weight (values do not matter to the planner; not all equal so a
    /// broken layout would show in a numeric run).
    fn init(&mut self, dims: &[usize], scale: f32) -> String {
        let name = self.name("w");
        let n: usize = dims.iter().product();
        let data: Vec<f32> = (0..n)
            .map(|i| ((i % 17) as f32 - 8.0) * scale / 8.0)
            .collect();
        let d: Vec<i64> = dims.iter().map(|&v| v as i64).collect();
        self.inits.push(ftensor(&name, &d, data));
        name
    }
    fn conv(&mut self, x: &str, cin: usize, cout: usize, k: usize, stride: usize) -> String {
        let w = self.init(&[cout, cin, k, k, k], 1.0 / (cin * k * k * k) as f32);
        let b = self.init(&[cout], 0.01);
        let y = self.name("conv");
        let p = ((k - 1) / 2) as i64;
        self.nodes.push(node_with(
            "Conv",
            &y.clone(),
            &[x, &w, &b],
            &[&y],
            vec![
                ints_attr("dilations", vec![1; 3]),
                ints_attr("kernel_shape", vec![k as i64; 3]),
                ints_attr("pads", vec![p; 6]),
                ints_attr("strides", vec![stride as i64; 3]),
            ],
        ));
        y
    }
    /// Conv -> InstanceNorm -> LeakyRelu (`ConvDropoutNormReLU`).
    fn block(&mut self, x: &str, cin: usize, cout: usize, stride: usize) -> String {
        let c = self.conv(x, cin, cout, 3, stride);
        let s = self.init(&[cout], 1.0);
        let b = self.init(&[cout], 0.1);
        let n = self.name("norm");
        let eps = proto::AttributeProto {
            name: Some("epsilon".into()),
            f: Some(1e-5),
            r#type: Some(1),
            ..Default::default()
        };
        self.nodes.push(node_with(
            "InstanceNormalization",
            &n.clone(),
            &[&c, &s, &b],
            &[&n],
            vec![eps],
        ));
        let a = self.name("lrelu");
        self.nodes.push(node_with(
            "LeakyRelu",
            &a.clone(),
            &[&n],
            &[&a],
            vec![proto::AttributeProto {
                name: Some("alpha".into()),
                f: Some(0.01),
                r#type: Some(1),
                ..Default::default()
            }],
        ));
        a
    }
}

/// `PlainConvUNet(cin, len(features), features, Conv3d, 3, [1, 2, ...], [2]*n, classes,
/// [2]*(n-1), conv_bias=True, InstanceNorm3d(affine), LeakyReLU)` as exported to ONNX.
pub fn plain_conv_unet(cin: usize, features: &[usize], classes: usize) -> proto::ModelProto {
    let mut b = Builder {
        nodes: Vec::new(),
        inits: Vec::new(),
        n: 0,
    };
    let mut x = "image".to_string();
    let mut c = cin;
    let mut skips = Vec::new();
    for (s, &f) in features.iter().enumerate() {
        x = b.block(&x, c, f, if s == 0 { 1 } else { 2 });
        x = b.block(&x, f, f, 1);
        c = f;
        skips.push((x.clone(), f));
    }
    for s in (0..features.len() - 1).rev() {
        let (skip, f) = skips[s].clone();
        let w = b.init(&[c, f, 2, 2, 2], 1.0 / (8 * c) as f32);
        let bias = b.init(&[f], 0.01);
        let up = b.name("convt");
        b.nodes.push(node_with(
            "ConvTranspose",
            &up.clone(),
            &[&x, &w, &bias],
            &[&up],
            vec![
                ints_attr("dilations", vec![1; 3]),
                ints_attr("kernel_shape", vec![2; 3]),
                ints_attr("pads", vec![0; 6]),
                ints_attr("strides", vec![2; 3]),
            ],
        ));
        let cat = b.name("concat");
        b.nodes.push(node_with(
            "Concat",
            &cat.clone(),
            &[&up, &skip],
            &[&cat],
            vec![proto::AttributeProto {
                name: Some("axis".into()),
                i: Some(1),
                r#type: Some(2),
                ..Default::default()
            }],
        ));
        x = b.block(&cat, 2 * f, f, 1);
        x = b.block(&x, f, f, 1);
        c = f;
    }
    b.conv(&x, c, classes, 1, 1);
    // The export names the graph output.
    b.nodes.last_mut().expect("head").output = vec!["logits".into()];
    model_with(
        "main_graph",
        17,
        b.nodes,
        b.inits,
        vec![vi_ncdhw("image", Some(cin as i64))],
        vec![vi_ncdhw("logits", Some(classes as i64))],
    )
}

/// The W1 graph, loaded by voxtile.
pub fn w1_graph() -> voxtile::model::graph::Graph {
    use prost::Message;
    let m = plain_conv_unet(1, &W1_FEATURES, W1_CLASSES);
    voxtile::model::onnx::load_bytes(&m.encode_to_vec(), None, std::path::Path::new("w1.onnx"))
        .expect("the W1 graph loads")
}
