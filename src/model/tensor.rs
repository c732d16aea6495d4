//! The constants ops own: weights, biases, norm parameters, broadcast operands.

/// A dense, row-major f32 constant (weights, biases, norm parameters, broadcast operands).
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// Elements in row-major order.
    pub data: Vec<f32>,
}

impl Tensor {
    /// A tensor of `shape` over `data` (their sizes must agree).
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Tensor { shape, data }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }
    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
    /// Whether `data` holds exactly the elements `shape` describes (hand-built graphs may not).
    pub fn is_consistent(&self) -> bool {
        self.shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .is_some_and(|n| n == self.data.len())
    }
}
