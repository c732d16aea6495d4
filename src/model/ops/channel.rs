//! Checks of the per-channel constants that norms, affines, PRelu and broadcast operands carry.

use crate::model::tensor::Tensor;

/// `t` must hold one value per channel.
pub fn per_channel(t: &Tensor, what: &str, c: usize) -> Result<(), String> {
    if t.len() != c || !t.is_consistent() {
        return Err(format!("{what} has {} elements for {c} channels", t.len()));
    }
    Ok(())
}

/// A norm's epsilon must be a non-negative number.
pub fn epsilon(eps: f32) -> Result<(), String> {
    if eps.is_nan() || eps < 0.0 {
        return Err(format!("epsilon {eps} is negative"));
    }
    Ok(())
}

/// A broadcast operand is 5-dim with 1 or `cin` channels; with `any_batch`, batch 1 (a graph
/// must run at whatever batch the planner picks).
pub fn broadcast_channels(t: &Tensor, cin: usize, any_batch: bool) -> Result<(), String> {
    let s = &t.shape;
    // Other ranks (token tensors): sizes are checked against the input's dims by shape inference.
    if s.len() != 5 && !s.is_empty() {
        if !t.is_consistent() || (any_batch && s.len() > 1 && s[0] != 1) {
            return Err(format!(
                "constant of shape {s:?} does not broadcast with batch 1"
            ));
        }
        return Ok(());
    }
    if !t.is_consistent() || s.len() != 5 || (s[1] != 1 && s[1] != cin) || (any_batch && s[0] != 1)
    {
        return Err(format!(
            "constant of shape {s:?} does not broadcast over {cin} channels"
        ));
    }
    Ok(())
}

/// A broadcast operand's dims are each 1 or the activation's.
pub fn broadcast_to(t: &Tensor, x: &[usize; 5]) -> Result<(), String> {
    if t.shape.len() != 5 || (0..5).any(|a| t.shape[a] != 1 && t.shape[a] != x[a]) {
        return Err(format!(
            "constant of shape {:?} does not broadcast to {x:?}",
            t.shape
        ));
    }
    Ok(())
}
