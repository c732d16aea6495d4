//! Human-readable model summary for `voxtile inspect`.

use super::graph::{Graph, OutputActivation};
use std::collections::BTreeMap;
use std::fmt::Write;

impl Graph {
    /// Multi-line summary: input/output, op counts, parameters, receptive field, output activation,
    /// spatial divisor.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let dims: Vec<String> = self
            .fixed_input_spatial
            .iter()
            .zip(["D", "H", "W"])
            .map(|(f, n)| f.map_or(n.to_string(), |v| v.to_string()))
            .collect();
        let name = if self.name.is_empty() {
            "(unnamed)"
        } else {
            &self.name
        };
        let _ = writeln!(s, "graph:             {name}");
        let _ = writeln!(
            s,
            "input:             \"{}\" [N, {}, {}] ({})",
            self.values[self.input].name,
            self.input_channels(),
            dims.join(", "),
            if self.fixed_input_spatial.iter().all(Option::is_none) {
                "spatial dims symbolic"
            } else {
                "some spatial dims fixed"
            }
        );
        let _ = writeln!(
            s,
            "output:            \"{}\" [N, {}, D', H', W']",
            self.values[self.output].name,
            self.output_channels()
        );
        let ops: Vec<String> = self
            .op_counts()
            .iter()
            .map(|(k, v)| format!("{k} x{v}"))
            .collect();
        let _ = writeln!(
            s,
            "nodes:             {} ({})",
            self.nodes.len(),
            ops.join(", ")
        );
        let _ = writeln!(s, "parameters:        {}", self.param_count());
        let rf = self.receptive_field();
        let _ = writeln!(
            s,
            "receptive field:   {}x{}x{} voxels (D,H,W)",
            rf[0], rf[1], rf[2]
        );
        let act = match self.output_activation() {
            OutputActivation::None => "none (logits)",
            OutputActivation::Softmax => "softmax over channels",
            OutputActivation::Sigmoid => "sigmoid",
        };
        let _ = writeln!(s, "output activation: {act}");
        let d = self.spatial_divisor();
        let _ = writeln!(
            s,
            "spatial divisor:   {}x{}x{} (window sizes must be multiples)",
            d[0], d[1], d[2]
        );
        s
    }
}

impl Graph {
    /// How many nodes of each op, by op name (for `inspect` and `inspect --json`).
    pub fn op_counts(&self) -> BTreeMap<&'static str, usize> {
        let mut counts = BTreeMap::new();
        for n in &self.nodes {
            *counts.entry(n.op.name()).or_default() += 1;
        }
        counts
    }
}
