//! The trust issues' regression tests, one per defect: hostile inputs and models, outputs all or
//! nothing, the gate, manifests, the planner's refusals, readers and volumes.

mod commit;
mod gate;
mod hardening;
mod manifest;
mod model;
mod outputs;
mod plan;
mod readers;
mod volume;
