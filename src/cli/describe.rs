//! `voxtile info` and `voxtile inspect`: the text views, and with `--json` the same facts as one
//! JSON object on standard output (for scripts and pipelines).

use crate::model::graph::{Graph, OutputActivation};
use crate::pipeline::Manifest;
use crate::volume::{AffineSource, Format, Header, Stats};
use crate::{Error, Result};
use serde_json::{json, Value};
use std::path::Path;

/// Print what `voxtile info FILE [--json]` shows. The voxels are streamed for their statistics
/// ([`crate::volume::summarize`]), never held whole as f32.
pub fn info(input: &Path, series: Option<&str>, as_json: bool) -> Result<()> {
    let (h, st) = crate::volume::summarize(input, series)?;
    if as_json {
        print_json(&info_json(input, &h, &st))
    } else {
        super::print_stdout(&format!(
            "{}\n",
            crate::volume::describe_with(input, &h, &st)
        ))
    }
}

/// Print what `voxtile inspect MODEL [--json]` shows: the graph, and the manifest beside it.
/// A model voxtile cannot import gets the list of every construct it lacks on standard output
/// (one per line, or as JSON), and the error.
pub fn inspect(model: &Path, as_json: bool) -> Result<()> {
    let (g, storage) = match crate::model::onnx::load_with_storage(model) {
        Err(Error::UnsupportedOps { path, ops }) => {
            let listed = if as_json {
                let items: Vec<Value> = ops
                    .iter()
                    .map(|o| json!({"op": o.op, "node": o.node, "why": o.why}))
                    .collect();
                print_json(&json!({"path": path.display().to_string(), "unsupported": items}))
            } else {
                let lines: Vec<String> = ops
                    .iter()
                    .map(|o| format!("  node \"{}\" ({}): {}\n", o.node, o.op, o.why))
                    .collect();
                super::print_stdout(&format!(
                    "{}: {} construct(s) voxtile does not support:\n{}",
                    path.display(),
                    ops.len(),
                    lines.concat()
                ))
            };
            listed?;
            return Err(Error::UnsupportedOps { path, ops });
        }
        other => other?,
    };
    let manifest = match Manifest::beside(model) {
        Some(p) => Some((Manifest::load(&p)?, p)),
        None => None,
    };
    if as_json {
        let mut j = graph_json(model, &g);
        j["storage"] = json!({
            "weights": storage.weights,
            "input": storage.input,
            "output": storage.output,
        });
        j["manifest"] = match &manifest {
            Some((m, p)) => {
                let mut v = serde_json::to_value(m).map_err(json_error)?;
                v["path"] = p.display().to_string().into();
                v
            }
            None => Value::Null,
        };
        return print_json(&j);
    }
    let mut text = format!(
        "{}: {}storage:           {}\n",
        model.display(),
        g.summary(),
        storage.describe()
    );
    if let Some((m, p)) = manifest {
        text += &format!("{}\n", m.describe(&p));
    }
    super::print_stdout(&text)
}

fn json_error(e: serde_json::Error) -> Error {
    Error::Invalid(format!("JSON: {e}"))
}

fn print_json(v: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(v).map_err(json_error)?;
    super::print_stdout(&(text + "\n"))
}

/// The facts of [`crate::volume::describe`], as JSON.
fn info_json(path: &Path, h: &Header, st: &Stats) -> Value {
    let (affine, source) = h.affine_with_source();
    let values = (st.finite > 0)
        .then(|| json!({"min": st.min, "max": st.max, "mean": st.sum / st.finite as f64}));
    let nifti = matches!(h.format, Format::Nifti | Format::NiftiPair);
    json!({
        "file": path.display().to_string(),
        "format": if nifti { format!("NIfTI-{}", h.version) } else { h.format.name().to_string() },
        "nifti_pair": h.format == Format::NiftiPair,
        "gzipped": h.gzipped,
        "big_endian": h.big_endian,
        "shape": h.shape(),
        "channels": h.channels(),
        "dtype": h.dtype_name(),
        "scaling": h.scaling().map(|(slope, inter)| json!({"slope": slope, "intercept": inter})),
        "spacing": h.spacing(),
        "spacing_unit": crate::volume::space_unit(h.xyzt_units),
        "orientation": h.orientation(),
        "affine": affine,
        "affine_source": match source {
            AffineSource::Sform => "sform",
            AffineSource::Qform => "qform",
            AffineSource::Pixdim => "pixdim",
        },
        "sform_code": h.sform_code,
        "qform_code": h.qform_code,
        "values": values,
        "nan": st.nan,
        "inf": st.inf,
    })
}

/// The facts of [`Graph::summary`], as JSON.
pub(crate) fn graph_json(path: &Path, g: &Graph) -> Value {
    json!({
        "model": path.display().to_string(),
        "graph": g.name,
        "input": {
            "name": g.values[g.input].name,
            "channels": g.input_channels(),
            "spatial": g.fixed_input_spatial,
        },
        "output": {
            "name": g.values[g.output].name,
            "channels": g.output_channels(),
        },
        "nodes": g.nodes.len(),
        "ops": g.op_counts(),
        "parameters": g.param_count(),
        "receptive_field": g.receptive_field(),
        "output_activation": match g.output_activation() {
            OutputActivation::None => "none",
            OutputActivation::Softmax => "softmax",
            OutputActivation::Sigmoid => "sigmoid",
        },
        "spatial_divisor": g.spatial_divisor(),
    })
}
