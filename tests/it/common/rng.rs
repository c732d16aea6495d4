//! The tests' one random generator (SplitMix64): deterministic from a number, or fresh per run
//! from a tag (VOXTILE_SEED replays a run) where a test wants new inputs every time.
#![allow(dead_code)]

/// A SplitMix64 stream; no `rand` dependency, the same numbers on every platform.
pub struct Rng(u64);

impl Rng {
    /// A stream fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// A stream seeded from VOXTILE_SEED (else the clock) mixed with `tag`, so the tests of one
    /// run draw different inputs; the seed is printed so a failure can be replayed.
    pub fn tagged(tag: &str) -> Self {
        let base = std::env::var("VOXTILE_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
        let s = base
            ^ tag
                .bytes()
                .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
        println!("[{tag}] seed {s} (VOXTILE_SEED={base} replays it)");
        Rng(s)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1), on a 2^-23 grid.
    pub fn uni(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// An integer uniform in [0, n).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// `n` draws of [`Rng::uni`].
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uni()).collect()
    }

    /// `n` draws of [`Rng::uni`] times `scale`.
    pub fn scaled(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uni() * scale).collect()
    }

    /// Shuffles `v` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }

    /// An array of shape `s` of [`Rng::uni`] draws.
    pub fn arr(&mut self, s: [usize; 5]) -> ndarray::Array5<f32> {
        ndarray::Array5::from_shape_vec(s, self.vec(s.iter().product())).unwrap()
    }

    /// A graph tensor of shape `s` of [`Rng::uni`] draws.
    pub fn tensor(&mut self, s: &[usize]) -> voxtile::model::graph::Tensor {
        voxtile::model::graph::Tensor::new(s.to_vec(), self.vec(s.iter().product()))
    }
}
