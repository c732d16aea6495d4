//! The float types a model file stores its weights and its input and output in, for `voxtile
//! inspect`: every backend computes from f32 copies of the weights, so an fp16 or bf16 file
//! loads like an fp32 one, and this is where that is said rather than silent.

use super::decode::proto;
use std::collections::BTreeMap;

/// Storage precision of one model file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Storage {
    /// Elements of the float initializers, by type name ("float32", "float16", ...).
    pub weights: BTreeMap<&'static str, usize>,
    /// Element type name of the graph input.
    pub input: &'static str,
    /// Element type name of the (first) graph output.
    pub output: &'static str,
}

/// The name of ONNX element type `t` (those a weight or a voxtile input may have, else "other").
fn type_name(t: i32) -> &'static str {
    match t {
        1 => "float32",
        10 => "float16",
        11 => "double",
        16 => "bfloat16",
        _ => "other",
    }
}

impl Storage {
    /// The storage of graph `g` (its input: the first activation input).
    pub(crate) fn of(g: &proto::GraphProto) -> Storage {
        use proto::type_proto::Value as TV;
        let mut weights = BTreeMap::new();
        for t in g
            .initializer
            .iter()
            .filter(|t| matches!(t.data_type(), 1 | 10 | 11 | 16))
        {
            let n = t
                .dims
                .iter()
                .map(|&d| d.max(0) as usize)
                .fold(1usize, usize::saturating_mul);
            // Saturating: a hostile file's dims are only checked later, by the decoder.
            let e: &mut usize = weights.entry(type_name(t.data_type())).or_default();
            *e = e.saturating_add(n);
        }
        let elem = |v: Option<&proto::ValueInfoProto>| match v
            .and_then(|v| v.r#type.as_ref()?.value.as_ref())
        {
            Some(TV::TensorType(t)) => type_name(t.elem_type()),
            _ => "other",
        };
        Storage {
            weights,
            input: elem(super::decode::activation_inputs(g).first().copied()),
            output: elem(g.output.first()),
        }
    }

    /// One line: "float16 weights, float16 I/O", "float32 weights (99.2% of 1204; also
    /// float16), float32 input, float16 output".
    pub fn describe(&self) -> String {
        let total = self
            .weights
            .values()
            .fold(0usize, |t, &n| t.saturating_add(n));
        let mut by_size: Vec<(&str, usize)> = self.weights.iter().map(|(k, v)| (*k, *v)).collect();
        by_size.sort_by_key(|&(k, v)| (std::cmp::Reverse(v), k));
        let weights = match by_size.as_slice() {
            [] => "no float weights".to_string(),
            [(t, _)] => format!("{t} weights"),
            [(t, n), rest @ ..] => {
                let others: Vec<&str> = rest.iter().map(|(k, _)| *k).collect();
                format!(
                    "{t} weights ({:.1}% of {total}; also {})",
                    100.0 * *n as f64 / total as f64,
                    others.join(", ")
                )
            }
        };
        let io = if self.input == self.output {
            format!("{} I/O", self.input)
        } else {
            format!("{} input, {} output", self.input, self.output)
        };
        format!("{weights}, {io}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_one_type_and_a_mix() {
        let mut s = Storage {
            weights: BTreeMap::from([("float16", 300)]),
            input: "float16",
            output: "float16",
        };
        assert_eq!(s.describe(), "float16 weights, float16 I/O");
        s.weights.insert("float32", 100);
        s.input = "float32";
        assert_eq!(
            s.describe(),
            "float16 weights (75.0% of 400; also float32), float32 input, float16 output"
        );
    }
}
