//! `voxtile` end to end through the binary (`src/cli`): basics, the model contract, the inputs
//! users bring, what a run leaves behind, and what the CLI says.

mod basics;
mod contract;
mod inputs;
mod outputs;
mod talk;
