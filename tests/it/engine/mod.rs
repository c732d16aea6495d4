//! The engine (`src/engine`): options, bands along H, devices splitting one volume, and the
//! out-of-memory retry.

mod bands;
mod basics;
mod batched_transformer;
mod multi_device;
mod oom;
