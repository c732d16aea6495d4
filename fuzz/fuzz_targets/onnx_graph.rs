//! Structured ONNX graphs → load + the analyses of `voxtile inspect`. The bytes drive a small
//! generator of shape plumbing (Shape, arithmetic, Gather, Concat, Slice, Cast, Floor,
//! ConstantOfShape, Resize by computed sizes, Reshape, pooling, long Add/Sub chains and doubling
//! DAGs), the kind of graph a raw-bytes fuzzer rarely reaches. Errors are fine; panics, hangs and
//! OOM are bugs.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use voxtile::internals::proto;

// The tests' ONNX builder (tests/it/common/onnx.rs), shared by path: the fuzz crate is its own
// workspace and cannot name the test helpers as a crate.
#[path = "../../tests/it/common/onnx.rs"]
mod onnx;
use onnx::{int_attr, ints_attr, itensor, model_with, node_with, vi_with};

/// Reads the fuzz input as a stream of small choices (zeros once exhausted).
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn pick(&mut self, n: usize) -> usize {
        self.u8() as usize % n.max(1)
    }
    fn done(&self) -> bool {
        self.0.is_empty()
    }
}

/// A node named after its one output.
fn node(
    op: &str,
    ins: &[&str],
    out: &str,
    attribute: Vec<proto::AttributeProto>,
) -> proto::NodeProto {
    node_with(op, out, ins, &[out], attribute)
}

/// A 5D float ValueInfo with `c` channels, the other dims symbolic (d0, d2, ...).
fn vi(name: &str, c: i64) -> proto::ValueInfoProto {
    vi_with(name, &[None, Some(c), None, None, None], |i| {
        format!("d{i}")
    })
}

/// Build a model from the choices in `b`.
fn generate(b: &mut Bytes) -> proto::ModelProto {
    let mut nodes = vec![];
    let mut inits = vec![
        proto::TensorProto {
            name: Some("w".into()),
            dims: vec![2, 2, 1, 1, 1],
            data_type: Some(1),
            float_data: vec![0.5, -0.25, 1.0, 0.75],
            ..Default::default()
        },
        proto::TensorProto {
            name: Some("w0".into()),
            dims: vec![2, 1, 3, 3, 3],
            data_type: Some(1),
            float_data: vec![0.1; 54],
            ..Default::default()
        },
        itensor("one", &[], vec![1]),
        itensor("two", &[1], vec![2]),
        itensor("idx", &[3], vec![2, 3, 4]),
        itensor("nc", &[2], vec![1, 2]),
    ];
    nodes.push(node(
        "Conv",
        &["x", "w0"],
        "a0",
        vec![ints_attr("pads", vec![1; 6])],
    ));
    let mut acts = vec!["a0".to_string()];
    let mut syms: Vec<String> = vec![];
    let mut k = 0usize;
    let mut fresh = |p: &str| {
        k += 1;
        format!("{p}{k}")
    };
    let steps = 1 + b.pick(48);
    for _ in 0..steps {
        if b.done() || nodes.len() > 20_000 {
            break;
        }
        let act = acts[b.pick(acts.len())].clone();
        let sym = if syms.is_empty() {
            None
        } else {
            Some(syms[b.pick(syms.len())].clone())
        };
        match (b.pick(14), sym) {
            (0, _) | (_, None) => {
                let o = fresh("s");
                nodes.push(node("Shape", &[&act], &o, vec![]));
                syms.push(o);
            }
            (1, Some(s)) => {
                let ops = ["Add", "Sub", "Mul", "Div", "Min", "Max"];
                let op = ops[b.pick(ops.len())];
                let other = match b.pick(3) {
                    0 => "one".to_string(),
                    1 => "two".to_string(),
                    _ => syms[b.pick(syms.len())].clone(),
                };
                let o = fresh("s");
                nodes.push(node(op, &[&s, &other], &o, vec![]));
                syms.push(o);
            }
            (2, Some(s)) => {
                // A long chain s = (s + 1) - 1 or a doubling DAG s = (s + s) - s.
                // Long enough to overflow a recursive evaluator, short enough for 2 s under ASan.
                let len = 1 + b.pick(64) * (1 + b.pick(32));
                let double = b.u8() & 1 == 1;
                let mut cur = s;
                for _ in 0..len {
                    let t = fresh("t");
                    let rhs = if double { cur.clone() } else { "one".into() };
                    nodes.push(node("Add", &[&cur, &rhs], &t, vec![]));
                    let o = fresh("s");
                    nodes.push(node("Sub", &[&t, &rhs], &o, vec![]));
                    cur = o;
                }
                syms.push(cur);
            }
            (3, Some(s)) => {
                let idx = ["idx", "one", "two", "nc"][b.pick(4)];
                let o = fresh("s");
                nodes.push(node("Gather", &[&s, idx], &o, vec![int_attr("axis", 0)]));
                syms.push(o);
            }
            (4, Some(s)) => {
                let other = syms[b.pick(syms.len())].clone();
                let o = fresh("s");
                nodes.push(node("Concat", &[&s, &other], &o, vec![int_attr("axis", 0)]));
                syms.push(o);
            }
            (5, Some(s)) => {
                let o = fresh("s");
                let shp = fresh("k");
                let dims: Vec<i64> = (0..1 + b.pick(4)).map(|_| b.u8() as i64 * 37).collect();
                let src = if b.u8() & 1 == 0 {
                    inits.push(itensor(&shp, &[dims.len() as i64], dims));
                    shp
                } else {
                    s
                };
                nodes.push(node("ConstantOfShape", &[&src], &o, vec![]));
                syms.push(o);
            }
            (6, Some(s)) => {
                let o = fresh("a");
                let mode = if b.u8() & 1 == 0 { "nearest" } else { "linear" };
                let mode = proto::AttributeProto {
                    name: Some("mode".into()),
                    s: Some(mode.as_bytes().to_vec()),
                    r#type: Some(3),
                    ..Default::default()
                };
                nodes.push(node("Resize", &[&act, "", "", &s], &o, vec![mode]));
                acts.push(o);
            }
            (7, Some(s)) => {
                let o = fresh("a");
                nodes.push(node("Reshape", &[&act, &s], &o, vec![]));
                acts.push(o);
            }
            (8, Some(s)) => {
                let o = fresh("s");
                let op = ["Cast", "Floor", "Ceil", "Neg"][b.pick(4)];
                let attrs = if op == "Cast" {
                    vec![int_attr("to", [1, 7, 6, 9][b.pick(4)])]
                } else {
                    vec![]
                };
                nodes.push(node(op, &[&s], &o, attrs));
                syms.push(o);
            }
            (9, Some(s)) => {
                let o = fresh("s");
                let st = b.u8() as i64 % 7 - 3;
                let en = b.u8() as i64 % 9 - 4;
                nodes.push(node(
                    "Slice",
                    &[&s],
                    &o,
                    vec![
                        ints_attr("starts", vec![st]),
                        ints_attr("ends", vec![en]),
                        ints_attr("axes", vec![0]),
                    ],
                ));
                syms.push(o);
            }
            (10, Some(s)) => {
                let o = fresh("s");
                nodes.push(node(
                    "Unsqueeze",
                    &[&s],
                    &o,
                    vec![ints_attr("axes", vec![0])],
                ));
                syms.push(o);
            }
            (11, _) => {
                let o = fresh("a");
                let s = 1 + b.pick(3) as i64;
                nodes.push(node(
                    "MaxPool",
                    &[&act],
                    &o,
                    vec![
                        ints_attr("kernel_shape", vec![s; 3]),
                        ints_attr("strides", vec![s; 3]),
                    ],
                ));
                acts.push(o);
            }
            (12, _) => {
                let o = fresh("a");
                nodes.push(node("Conv", &[&act, "w"], &o, vec![]));
                acts.push(o);
            }
            _ => {
                let o = fresh("a");
                let other = acts[b.pick(acts.len())].clone();
                nodes.push(node("Add", &[&act, &other], &o, vec![]));
                acts.push(o);
            }
        }
    }
    // The output: the last activation (whatever was built after it stays unused).
    let last = acts.last().cloned().unwrap_or_default();
    nodes.push(node("Relu", &[&last], "y", vec![]));
    model_with("fuzz", 13, nodes, inits, vec![vi("x", 1)], vec![vi("y", 2)])
}

fuzz_target!(|data: &[u8]| {
    use prost::Message;
    let m = generate(&mut Bytes(data));
    let Ok(g) = voxtile::model::onnx::load_bytes(&m.encode_to_vec(), None, Path::new("g.onnx"))
    else {
        return;
    };
    let div = g.spatial_divisor();
    let w = div.map(|d| {
        if d == 0 || d > 64 {
            8
        } else {
            d * 8_usize.div_ceil(d)
        }
    });
    let _ = g.infer_shapes(1, w);
    let _ = g.receptive_field();
    let _ = g.flops(1, w);
    let _ = g.summary();
});
