//! Lowering of Pad, Expand and Tile on activations. Their pads / shapes / repeats must fold to
//! constants; values computed from shapes are evaluated on the probe windows and accepted when
//! they are the same on all of them (the IR's ops do not change with the window).

use super::{
    attr, norm_axis, proto, to_i64, Ctx, Lowerer, Op, Result, Sym, Val, ValueId, ATTR_LIMIT,
};
use crate::model::decode::node::{ints, sattr};
use crate::model::ops::{Pad, PadMode, Tile, PAD_LIMIT};

impl Lowerer<'_> {
    /// The values of `s` as constants: known elements directly, shape-derived ones evaluated
    /// on every probe window, which must all agree.
    fn fold_per_window(&self, ctx: &Ctx, x: ValueId, s: &Sym, what: &str) -> Result<Vec<f64>> {
        if let Some(v) = s.all_known() {
            return Ok(v);
        }
        let probes = self.ev().probe(ctx, x)?;
        let mut first: Option<(Vec<f64>, [usize; 3])> = None;
        for (shapes, w) in probes.iter() {
            let v = self.ev().eval(ctx, &s.elems, shapes)?;
            if v.iter().any(|e| !e.is_finite()) {
                return Err(ctx.err(format!("{what} cannot be evaluated from the shapes")));
            }
            match &first {
                None => first = Some((v, *w)),
                Some((f, w0)) if *f != v => {
                    return Err(ctx.err(format!(
                        "{what} depend on the window size ({f:?} for window {w0:?}, {v:?} for \
                         {w:?}); voxtile needs them the same for every window"
                    )))
                }
                Some(_) => {}
            }
        }
        first
            .map(|(v, _)| v)
            .ok_or_else(|| ctx.err(format!("{what} cannot be evaluated")))
    }

    /// Integers of `v` (a constant or shape value), folded per window when shape-derived.
    fn fold_ints(&self, ctx: &Ctx, x: ValueId, v: &Val, what: &str) -> Result<Vec<i64>> {
        let s = self.ev().small(ctx, v)?;
        self.fold_per_window(ctx, x, &s, what)?
            .into_iter()
            .map(|f| to_i64(ctx, f, what))
            .collect()
    }

    pub(super) fn pad(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let x = match self.get(ctx, n, 0)? {
            Val::Act(x) => x,
            _ => return Err(ctx.err("Pad of a constant or shape value is not supported")),
        };
        let mode = match sattr(n, "mode", "constant").as_str() {
            "constant" => PadMode::Constant,
            "reflect" => PadMode::Reflect,
            "edge" => PadMode::Edge,
            other => {
                return Err(ctx.err(format!(
                    "mode={other} is not supported (constant, reflect, edge)"
                )))
            }
        };
        let (pads, value, axes) = if self.opset < 11 {
            let pads = ints(n, "pads").ok_or_else(|| ctx.err("attribute pads is missing"))?;
            let value = attr(n, "value").and_then(|a| a.f).unwrap_or(0.0);
            (pads, value, None)
        } else {
            let pads = self.fold_ints(ctx, x, &self.get(ctx, n, 1)?, "pads")?;
            let value = match self.get_opt(ctx, n, 2)? {
                None => 0.0,
                Some(v) => match self.ev().small(ctx, &v)?.all_known().as_deref() {
                    Some([]) => 0.0,
                    Some([v]) => *v as f32,
                    _ => return Err(ctx.err("constant_value must be one constant number")),
                },
            };
            let axes = match self.get_opt(ctx, n, 3)? {
                None => None,
                Some(v) => Some(self.fold_ints(ctx, x, &v, "axes")?),
            };
            (pads, value, axes)
        };
        let axes: Vec<usize> = match axes {
            None => (0..5).collect(),
            Some(a) => a
                .iter()
                .map(|&v| norm_axis(ctx, v, 5))
                .collect::<Result<_>>()?,
        };
        if pads.len() != 2 * axes.len() {
            return Err(ctx.err(format!(
                "pads has {} values for {} axes; expected {} (begins then ends)",
                pads.len(),
                axes.len(),
                2 * axes.len()
            )));
        }
        let (mut begin, mut end) = ([0i64; 5], [0i64; 5]);
        for (i, &a) in axes.iter().enumerate() {
            let (b, e) = (pads[i], pads[i + axes.len()]);
            if b.abs() > PAD_LIMIT || e.abs() > PAD_LIMIT {
                return Err(ctx.err(format!("pads {pads:?} are absurdly large")));
            }
            begin[a] += b;
            end[a] += e;
        }
        let p = Pad {
            mode,
            begin,
            end,
            value,
        };
        if p.is_noop() {
            return self.set(n, Val::Act(x));
        }
        let c = p.check(self.values[x].channels).map_err(|e| ctx.err(e))?;
        self.emit(ctx, n, Op::Pad(p), vec![x], c);
        Ok(())
    }

    /// Expand and Tile: on an activation, channel repeats become [`Op::Tile`] and the rest must
    /// be a no-op; on constants and shape values, Expand folds (Tile of those is refused).
    pub(super) fn expand_tile(&mut self, n: &proto::NodeProto, ctx: &Ctx) -> Result<()> {
        let x = match self.get(ctx, n, 0)? {
            Val::Act(x) => x,
            _ if n.op_type() == "Expand" => return self.plumbing(n, ctx),
            _ => return Err(ctx.err("Tile of a constant or shape value is not supported")),
        };
        let c = self.values[x].channels;
        let repeats = if n.op_type() == "Tile" {
            self.tile_repeats(n, ctx, x)?
        } else {
            self.expand_repeats(n, ctx, x)?
        };
        if repeats == 1 {
            return self.set(n, Val::Act(x));
        }
        let t = Tile { repeats };
        let cout = t.check(c).map_err(|e| ctx.err(e))?;
        self.emit(ctx, n, Op::Tile(t), vec![x], cout);
        Ok(())
    }

    /// Tile's channel repeats; repeats of N, D, H, W must be 1.
    fn tile_repeats(&self, n: &proto::NodeProto, ctx: &Ctx, x: ValueId) -> Result<usize> {
        let r = self.fold_ints(ctx, x, &self.get(ctx, n, 1)?, "repeats")?;
        if r.len() != 5 || r.iter().any(|v| !(1..=ATTR_LIMIT).contains(v)) {
            return Err(ctx.err(format!("repeats {r:?} must be 5 positive numbers (NCDHW)")));
        }
        if r[0] != 1 || r[2..].iter().any(|&v| v != 1) {
            return Err(ctx.err(format!(
                "repeats {r:?}: tiling an activation along N, D, H or W is not supported \
                 (only along the channels)"
            )));
        }
        Ok(r[1] as usize)
    }

    /// Expand's channel repeats: a 1-channel activation expanded to C channels gives C; every
    /// other axis must keep its size (target 1 or the size itself) on every probe window.
    fn expand_repeats(&self, n: &proto::NodeProto, ctx: &Ctx, x: ValueId) -> Result<usize> {
        let s = self.ev().small(ctx, &self.get(ctx, n, 1)?)?;
        if s.elems.len() > 5 || s.shape.len() != 1 {
            return Err(ctx.err(format!(
                "target shape {:?} must be a list of at most 5 sizes (NCDHW)",
                s.shape
            )));
        }
        let c = self.values[x].channels;
        let off = 5 - s.elems.len();
        let t = |a: usize| (a >= off).then(|| s.elems[a - off]);
        // The channel target must not depend on the window.
        let tc = match t(1) {
            None => 1.0,
            Some(e) => e.known().ok_or_else(|| {
                ctx.err("the channel count of the target shape depends on the window size")
            })?,
        };
        let rest_is_ones = [0, 2, 3, 4]
            .iter()
            .all(|&a| t(a).is_none_or(|e| e.known() == Some(1.0)));
        if !rest_is_ones {
            let probes = self.ev().probe(ctx, x)?;
            for (shapes, w) in probes.iter() {
                let ev = self.ev().eval(ctx, &s.elems, shapes)?;
                let xs = shapes[x];
                for a in [0, 2, 3, 4] {
                    let Some(v) = (a >= off).then(|| ev[a - off]) else {
                        continue;
                    };
                    if v != 1.0 && v != xs[a] as f64 {
                        return Err(ctx.err(format!(
                            "expanding an activation of shape {xs:?} to {ev:?} (window {w:?}) \
                             is not supported: only the channels of a 1-channel tensor expand"
                        )));
                    }
                }
            }
        }
        match tc {
            v if v == 1.0 || v == c as f64 => Ok(1),
            v if c == 1 && v >= 1.0 && v.fract() == 0.0 && v <= ATTR_LIMIT as f64 => Ok(v as usize),
            v => Err(ctx.err(format!(
                "cannot expand {c} channels to {v} (numpy broadcasting needs 1 or {c})"
            ))),
        }
    }
}
