//! Lowering of Resize and Upsample (scales, or sizes computed from the input's shape).

use super::{
    attr, proto, Const, CoordMode, Ctx, Data, Lowerer, NearestMode, Op, Rc, Resize, ResizeMode,
    Result, Sym, Val, ValueId,
};
use crate::model::decode::node::sattr;

impl Lowerer<'_> {
    pub(super) fn resize(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let x = self.act(ctx, n, 0)?;
        let c = self.values[x].channels;
        let is_upsample = n.op_type() == "Upsample";
        let old = is_upsample || self.opset < 11;
        let mode = match sattr(n, "mode", "nearest").as_str() {
            "nearest" => ResizeMode::Nearest,
            "linear" | "trilinear" => ResizeMode::Linear,
            other => {
                return Err(ctx.err(format!(
                    "attribute mode={other} is not supported (nearest, linear)"
                )))
            }
        };
        let (coord, nearest) = if old {
            (CoordMode::Asymmetric, NearestMode::Floor)
        } else {
            let coord = match sattr(n, "coordinate_transformation_mode", "half_pixel").as_str() {
                "half_pixel" => CoordMode::HalfPixel,
                "pytorch_half_pixel" => CoordMode::PytorchHalfPixel,
                "align_corners" => CoordMode::AlignCorners,
                "asymmetric" => CoordMode::Asymmetric,
                other => {
                    return Err(ctx.err(format!(
                        "attribute coordinate_transformation_mode={other} is not supported"
                    )))
                }
            };
            let nearest = match sattr(n, "nearest_mode", "round_prefer_floor").as_str() {
                "round_prefer_floor" => NearestMode::RoundPreferFloor,
                "round_prefer_ceil" => NearestMode::RoundPreferCeil,
                "floor" => NearestMode::Floor,
                "ceil" => NearestMode::Ceil,
                other => {
                    return Err(ctx.err(format!("attribute nearest_mode={other} is not supported")))
                }
            };
            (coord, nearest)
        };
        if attr(n, "antialias").and_then(|a| a.i).unwrap_or(0) != 0 {
            return Err(ctx.err("attribute antialias=1 is not supported"));
        }
        if attr(n, "axes").is_some() {
            return Err(ctx.err("attribute axes is not supported; export resizing all axes"));
        }
        let policy = sattr(n, "keep_aspect_ratio_policy", "stretch");
        if policy != "stretch" {
            return Err(ctx.err(format!(
                "attribute keep_aspect_ratio_policy={policy} is not supported"
            )));
        }
        // Inputs: Upsample(Elem, scales) / opset 7 attr; Resize-10 (Elem, scales); Resize-11+ (Elem, roi, scales, sizes).
        let (scales_in, sizes_in) = if is_upsample {
            if let Some(a) = attr(n, "scales") {
                (
                    Some(Val::Const(Rc::new(Const {
                        shape: vec![a.floats.len()],
                        data: Data::F(a.floats.clone()),
                    }))),
                    None,
                )
            } else {
                (self.get_opt(ctx, n, 1)?, None)
            }
        } else if self.opset < 11 {
            (self.get_opt(ctx, n, 1)?, None)
        } else {
            (self.get_opt(ctx, n, 2)?, self.get_opt(ctx, n, 3)?)
        };
        let scales_in = scales_in.filter(|v| !matches!(v, Val::Const(c) if c.len() == 0));
        let sizes_in = sizes_in.filter(|v| !matches!(v, Val::Const(c) if c.len() == 0));
        let r = match (scales_in, sizes_in) {
            (Some(s), None) => {
                let s = self.ev().small(ctx, &s)?;
                let v = s.all_known().ok_or_else(|| {
                    ctx.err(
                        "scales depend on the window size; voxtile needs constant scales or sizes",
                    )
                })?;
                if v.len() != 5
                    || v[0] != 1.0
                    || v[1] != 1.0
                    || v[2..].iter().any(|&f| !(f > 0.0 && f.is_finite()))
                {
                    return Err(ctx.err(format!(
                        "scales {v:?} must be 5 positive values with 1 for N and C"
                    )));
                }
                Resize {
                    mode,
                    coord,
                    nearest,
                    scales: [v[2] as f32, v[3] as f32, v[4] as f32],
                    sizes: None,
                }
            }
            (None, Some(sz)) => {
                let s = self.ev().small(ctx, &sz)?;
                if s.elems.len() != 5 {
                    return Err(ctx.err(format!(
                        "sizes has {} elements; expected 5 (NCDHW)",
                        s.elems.len()
                    )));
                }
                self.resize_from_sizes(ctx, x, &s, mode, coord, nearest)?
            }
            (Some(_), Some(_)) => return Err(ctx.err("both scales and sizes are given")),
            (None, None) => return Err(ctx.err("neither scales nor sizes is given")),
        };
        self.emit(ctx, n, Op::Resize(r), vec![x], c);
        Ok(())
    }

    /// Sizes that are constant become `sizes`; sizes computed from shapes become `scales` when they
    /// are a fixed multiple of the input's size on every probe window.
    pub(super) fn resize_from_sizes(
        &self,
        ctx: &Ctx,
        x: ValueId,
        s: &Sym,
        mode: ResizeMode,
        coord: CoordMode,
        nearest: NearestMode,
    ) -> Result<Resize> {
        let c = self.values[x].channels;
        let probes = self.ev().probe(ctx, x)?;
        let evs: Vec<Vec<f64>> = probes
            .iter()
            .map(|(shapes, _)| self.ev().eval(ctx, &s.elems, shapes))
            .collect::<Result<_>>()?;
        let s0 = &evs[0];
        let x0 = probes[0].0[x];
        let mut scales = [0f32; 3];
        for a in 0..3 {
            scales[a] = (s0[a + 2] / x0[a + 2] as f64) as f32;
        }
        let (mut all_const, mut all_ratio) = (true, true);
        for ((shapes, _), ev) in probes.iter().zip(&evs) {
            let xs = shapes[x];
            // A constant N (export with batch 1) is tolerated; a computed one must be the input's.
            if ev[1] != c as f64 || (s.elems[0].known().is_none() && ev[0] != xs[0] as f64) {
                return Err(ctx.err(format!(
                    "sizes {ev:?} must keep N and C unchanged ({}, {c})",
                    xs[0]
                )));
            }
            for a in 0..3 {
                let v = ev[a + 2];
                if !(v >= 1.0 && v.fract() == 0.0) {
                    return Err(ctx.err(format!("sizes evaluate to {ev:?}, not positive integers")));
                }
                if v != s0[a + 2] {
                    all_const = false;
                }
                if ((xs[a + 2] as f32) * scales[a]).floor() as f64 != v {
                    all_ratio = false;
                }
            }
        }
        if all_const && s.elems[2..].iter().all(|e| e.known().is_some()) {
            let sizes = [s0[2] as usize, s0[3] as usize, s0[4] as usize];
            return Ok(Resize {
                mode,
                coord,
                nearest,
                scales,
                sizes: Some(sizes),
            });
        }
        if all_ratio {
            return Ok(Resize {
                mode,
                coord,
                nearest,
                scales,
                sizes: None,
            });
        }
        Err(ctx.err("the output sizes are computed from tensor shapes in a way that is neither constant nor a fixed multiple of the input size; voxtile cannot fold it"))
    }
}
