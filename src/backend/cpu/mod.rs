//! The float32 CPU backend: the reference every other backend is checked against.
