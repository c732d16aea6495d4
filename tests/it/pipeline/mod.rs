//! Around the sliding window (`src/pipeline`): manifests, intensity, TTA, ensembles, the library
//! door and the preview.

mod library;
mod preview;
mod steps;
