//! `voxtile plan`: the memory planner's choice for a model and a volume (a file or a size), without
//! running; the model arguments (manifest, spacing, window flags) are read as `segment` reads them.

use super::window::WindowArgs;
use crate::backend::{self, Device};
use crate::pipeline::{resample, ModelSetup};
use crate::plan::{self, Request, Workload};
use crate::volume::Reorientation;
use crate::{Error, Result};
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Input volume (as `segment` takes it): its size, resampled to the spacing in effect, is
    /// planned for; or give --volume
    #[arg(required_unless_present = "volume", conflicts_with = "volume")]
    pub input: Option<PathBuf>,
    #[command(flatten)]
    pub window: WindowArgs,
    /// Volume size in network axes D x H x W (the file's i x j x k), e.g. 512x512x128, as the
    /// network sees it (after any resampling)
    #[arg(long)]
    pub volume: Option<String>,
    /// Plan for keeping the blended outputs (--logits of segment)
    #[arg(long)]
    pub logits: bool,
    /// Print the plan as JSON
    #[arg(long)]
    pub json: bool,
}

/// The one model planned (an ensemble is planned model by model, each with its own -m).
fn model(args: &PlanArgs) -> Result<&Path> {
    match args.window.model.as_slice() {
        [m] => Ok(m),
        _ => Err(Error::Invalid(
            "plan takes one model: plan each model of an ensemble with its own -m".into(),
        )),
    }
}

/// The one device planned (`--device` as `segment` reads it; a list is refused).
fn device(args: &PlanArgs) -> Result<Device> {
    match args.window.devices()?.as_slice() {
        [d] => Ok(*d),
        _ => Err(Error::Invalid(format!(
            "--device {}: plan plans one device; give one of the list",
            args.window.device
        ))),
    }
}

/// The model's manifest merged with the flags typed here, by the merge `segment` uses (typed
/// flags beat the manifest; absent ones take it, else the defaults).
fn model_setup(args: &PlanArgs, model: &Path) -> Result<ModelSetup> {
    let w = &args.window;
    ModelSetup::new(
        &[model],
        w.options(args.logits)?,
        &w.overrides(args.logits)?,
    )
}

/// "cpu" or "cuda:N": the device planned for.
fn device_name(device: Device) -> String {
    match device {
        Device::Cuda(i) => format!("cuda:{i}"),
        _ => "cpu".to_string(),
    }
}

/// Parse "512x512x128" (or "512,512,128").
pub fn parse_volume(s: &str) -> Result<[usize; 3]> {
    let bad = || {
        Error::Invalid(format!(
            "--volume '{s}' is not three positive sizes like 512x512x128"
        ))
    };
    let v: Vec<usize> = s
        .split(['x', 'X', ','])
        .map(|t| t.trim().parse::<usize>().map_err(|_| bad()))
        .collect::<Result<_>>()?;
    match v.as_slice() {
        &[d, h, w] if d > 0 && h > 0 && w > 0 => Ok([d, h, w]),
        _ => Err(bad()),
    }
}

/// The planner's answer for `voxtile plan`'s arguments, with what its JSON names beside it.
pub struct Planned {
    /// The plan.
    pub plan: plan::Plan,
    graph: crate::model::Graph,
    /// Where the budget came from.
    pub source: String,
    /// The volume planned for (network axes).
    pub shape: [usize; 3],
    /// The device planned for.
    pub device: Device,
}

impl Planned {
    /// The JSON `voxtile plan --json` prints.
    pub fn json(&self) -> Result<serde_json::Value> {
        json(&self.plan, &self.source, self.shape, self.device)
    }
}

/// A plan as `voxtile plan --json` prints it: the plan's fields, where the budget came from, the
/// volume and the device.
pub fn json(
    p: &plan::Plan,
    source: &str,
    shape: [usize; 3],
    device: Device,
) -> Result<serde_json::Value> {
    let mut v = serde_json::to_value(p).map_err(|e| Error::Invalid(format!("json: {e}")))?;
    v["budget_source"] = serde_json::Value::String(source.to_string());
    v["volume"] = serde_json::json!(shape);
    v["device"] = serde_json::Value::String(device_name(device));
    Ok(v)
}

pub fn run(args: PlanArgs) -> Result<()> {
    let planned = planned(&args)?;
    let model = model(&args)?;
    if args.json {
        super::print_stdout(&format!("{}\n", planned.json()?))?;
    } else {
        let shape = planned.shape;
        super::print_stdout(&format!(
            "{} on a {}x{}x{} volume, {}:\n{}",
            model.display(),
            shape[0],
            shape[1],
            shape[2],
            device_name(planned.device),
            planned.plan.summary(&planned.graph, &planned.source)
        ))?;
    }
    Ok(())
}

/// Plan for `args` without printing.
pub fn planned(args: &PlanArgs) -> Result<Planned> {
    let model = model(args)?;
    let graph = crate::model::onnx::load(model)?;
    graph.validate()?;
    let setup = model_setup(args, model)?;
    let o = &setup.options;
    let shape = match (&args.input, &args.volume) {
        (Some(input), _) => {
            let header = crate::volume::read_header(input)?;
            // Turned to the models' orientation first, as `segment` turns the volume.
            let header = Reorientation::to(&header.affine(), setup.settings.orientation)
                .map_err(|m| Error::Invalid(format!("{}: {m}", input.display())))?
                .header(&header);
            let grid = resample::model_grid(&header, o.axis_order, setup.settings.spacing)
                .map_err(|e| match e {
                    Error::Invalid(m) => Error::Invalid(format!("{}: {m}", input.display())),
                    e => e,
                })?;
            o.axis_order.network(grid)
        }
        (None, Some(v)) => parse_volume(v)?,
        (None, None) => unreachable!("clap requires an input or --volume"),
    };
    let device = match device(args)? {
        Device::Auto => backend::open(Device::Auto)?.1,
        d => d,
    };
    let memory = backend::memory_model(device);
    let (budget, source) = match o.memory_budget {
        Some(b) => (b, "--memory-budget".to_string()),
        None => memory.default_budget(),
    };
    let req = Request {
        budget,
        budget_explicit: o.memory_budget.is_some(),
        user_roi: o.roi,
        user_batch: o.batch,
        workload: Workload {
            shape,
            overlap: o.overlap,
            placement: o.placement,
            keep_logits: o.keep_logits,
            copy_input: false,
        },
    };
    if o.refuse_small_roi {
        plan::refuse_small_roi(&graph, req.user_roi, shape)
            .map_err(|e| Error::Invalid(format!("{}: {e}", model.display())))?;
    }
    let p = plan::choose(&graph, memory.as_ref(), &req)
        .map_err(|e| {
            if req.budget_explicit {
                e
            } else {
                plan::with_budget_source(e, &source)
            }
        })
        .map_err(|e| match e {
            Error::Invalid(m) | Error::Graph(m) => {
                Error::Invalid(format!("{}: {m}", model.display()))
            }
            e => e.with_model(model),
        })?;
    if let Some(w) = &p.warning {
        tracing::warn!("{w}");
    }
    Ok(Planned {
        plan: p,
        graph,
        source,
        shape,
        device,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_sizes() {
        assert_eq!(parse_volume("512x512x128").unwrap(), [512, 512, 128]);
        assert_eq!(parse_volume("8,9,10").unwrap(), [8, 9, 10]);
        for bad in ["512x512", "0x1x1", "axbxc", ""] {
            assert!(parse_volume(bad).is_err(), "{bad}");
        }
    }
}
