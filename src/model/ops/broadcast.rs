//! numpy broadcasting of the two-activation elementwise ops (Add, Sub, Mul, Div, Max, Min,
//! Pow): per-voxel gates `[N,1,D,H,W]`, per-channel vectors `[N,C,1,1,1]`, scalars, in either
//! operand order.

use super::Shape;

/// Output channels of two operands with `a` and `b` channels: equal, or one of them 1.
pub fn broadcast_channels(a: usize, b: usize) -> Result<usize, String> {
    match (a, b) {
        _ if a == b => Ok(a),
        (1, c) | (c, 1) => Ok(c),
        _ => Err(format!(
            "operands have {a} and {b} channels, which do not broadcast (equal, or one of them 1)"
        )),
    }
}

/// The numpy broadcast of two NCDHW shapes: along each axis equal sizes, or 1 against any.
pub fn broadcast_shape(a: &Shape, b: &Shape) -> Result<Shape, String> {
    let mut out = *a;
    for ax in 0..5 {
        out[ax] = match (a[ax], b[ax]) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                let hint = if ax >= 2 {
                    " (the window may not be divisible by the model's spatial divisor)"
                } else {
                    ""
                };
                return Err(format!(
                    "operands have shapes {a:?} and {b:?}, which do not broadcast along {}: sizes must be equal or 1{hint}",
                    super::ncdhw(ax)
                ));
            }
        };
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_and_channels() {
        let big = [2, 4, 3, 5, 6];
        assert_eq!(broadcast_shape(&[2, 1, 3, 5, 6], &big), Ok(big));
        assert_eq!(broadcast_shape(&big, &[2, 4, 1, 1, 1]), Ok(big));
        assert_eq!(broadcast_shape(&[1, 1, 1, 1, 1], &big), Ok(big));
        let e = broadcast_shape(&big, &[2, 3, 3, 5, 6]).unwrap_err();
        assert!(e.contains("along C"), "{e}");
        assert!(broadcast_shape(&big, &[2, 4, 3, 5, 7])
            .unwrap_err()
            .contains("divisor"));
        assert_eq!(broadcast_channels(1, 7), Ok(7));
        assert!(broadcast_channels(2, 7).is_err());
    }
}
