//! The `voxtile` command line: segment, info, inspect.

pub fn run() -> i32 {
    0
}
