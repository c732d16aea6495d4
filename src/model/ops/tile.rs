//! Tile of an activation along the channels (`x.repeat(1, r, 1, 1, 1)`, and Expand of a
//! 1-channel tensor to r channels): output channel `c` is input channel `c % C`.

/// Channel tiling: the input's channels repeated `repeats` times.
#[derive(Clone, Debug, PartialEq)]
pub struct Tile {
    /// Copies of the channels (>= 1).
    pub repeats: usize,
}

impl Tile {
    /// Validates the repeats on `cin` channels; returns the output channels.
    pub fn check(&self, cin: usize) -> Result<usize, String> {
        if self.repeats == 0 {
            return Err("tiling with 0 repeats".into());
        }
        cin.checked_mul(self.repeats)
            .ok_or_else(|| format!("{cin} channels x {} repeats overflow", self.repeats))
    }
}
