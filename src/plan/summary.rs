//! The memory summary `voxtile plan` prints.

use super::{format_bytes, Plan, Target};
use crate::model::graph::Graph;

impl Plan {
    /// The memory summary `voxtile plan` prints.
    pub fn summary(&self, graph: &Graph, budget_source: &str) -> String {
        let e = &self.estimate;
        let mut s = String::new();
        let pct = |b: u64| 100.0 * b as f64 / self.budget.max(1) as f64;
        s += &format!(
            "roi {:?}  batch {}  windows {}  ({} plan)\n",
            self.roi, self.batch, self.windows, self.how
        );
        if self.bands > 1 {
            s += &format!(
                "bands {} along H, one after another: {} windows run ({} near the cuts run twice); the memory below is the tallest band's\n",
                self.bands,
                self.windows_run,
                self.windows_run - self.windows
            );
        }
        let what = match e.target {
            Target::Cuda => "device",
            Target::Cpu => "host",
        };
        s += &format!(
            "{:<14}{:>14}{:>10}\n",
            format!("{what} memory"),
            "bytes",
            "budget"
        );
        let b = &e.budgeted;
        for (name, v) in [
            ("weights", b.weights),
            ("activations", b.activations),
            ("workspace", b.workspace),
            ("staging", b.staging),
            ("accumulators", b.accumulators),
        ] {
            s += &format!("{name:<14}{:>14}{:>9.1}%\n", format_bytes(v), pct(v));
        }
        s += &format!("{:-<38}\n", "");
        s += &format!(
            "{:<14}{:>14}{:>9.1}%\n",
            "total",
            format_bytes(b.total()),
            pct(b.total())
        );
        s += &format!(
            "{:<14}{:>14}  ({budget_source})\n",
            "budget",
            format_bytes(self.budget)
        );
        if e.target == Target::Cuda {
            s += &format!(
                "host: {} pinned/working + {} volume and outputs\n",
                format_bytes(e.host.total()),
                format_bytes(e.volume_bytes)
            );
        } else {
            s += &format!(
                "host besides: {} volume and outputs (not budgeted)\n",
                format_bytes(e.volume_bytes)
            );
        }
        let p = &e.peak_node;
        s += &format!(
            "activation peak at node {} '{}' ({}): {} in {} buffers ({} nodes)\n",
            p.index,
            p.name,
            p.op,
            format_bytes(p.live_bytes),
            p.live_values,
            graph.nodes.len()
        );
        if let Some(w) = &self.warning {
            s += &format!("warning: {w}\n");
        }
        s
    }
}
