//! Fallible allocation of volume-sized buffers.
//!
//! Rust's ordinary allocations abort the process ("memory allocation of N bytes failed") when the
//! allocator says no, e.g. under `ulimit -v` or a cgroup limit. Every buffer whose size follows
//! the input (volumes, resampled grids, blend accumulators, activations) is made here instead, so
//! running out of memory is one error line naming what did not fit.

use crate::{Error, Result};
use ndarray::{Array, Dimension, ShapeBuilder};

/// The error of a failed allocation: what it was for and how many bytes it needed.
pub fn no_memory(what: &str, bytes: u128) -> Error {
    Error::Invalid(format!(
        "not enough memory for {what} ({})",
        crate::sys::memory::format_bytes(u64::try_from(bytes).unwrap_or(u64::MAX))
    ))
}

/// The same failure as [`Error::OutOfMemory`], for buffers that shrink with the batch: the engine
/// retries with half the batch (never a smaller window) when the CPU backend reports it.
pub fn retryable(e: Error) -> Error {
    match e {
        Error::Invalid(m) => Error::OutOfMemory(format!("host: {m}")),
        e => e,
    }
}

#[cfg(test)]
thread_local! {
    /// Unit-test hook: on this thread, requests of more bytes than this fail, as the allocator
    /// says no under `ulimit -v` (see [`fail_above`]).
    static FAIL_ABOVE: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

/// Unit tests: make every request of more than `bytes` on this thread fail (`usize::MAX`: none).
#[cfg(test)]
pub(crate) fn fail_above(bytes: usize) {
    FAIL_ABOVE.with(|f| f.set(bytes));
}

/// An empty vector with room for `len` elements, or an error naming `what`.
pub fn try_with_capacity<T>(len: usize, what: &str) -> Result<Vec<T>> {
    #[cfg(test)]
    if len.saturating_mul(std::mem::size_of::<T>()) > FAIL_ABOVE.with(|f| f.get()) {
        return Err(no_memory(
            what,
            len as u128 * std::mem::size_of::<T>() as u128,
        ));
    }
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| no_memory(what, len as u128 * std::mem::size_of::<T>() as u128))?;
    Ok(v)
}

/// `vec![value; len]` that returns an error naming `what` instead of aborting.
pub fn try_vec<T: Clone>(len: usize, value: T, what: &str) -> Result<Vec<T>> {
    let mut v = try_with_capacity(len, what)?;
    v.resize(len, value);
    Ok(v)
}

/// An array of `shape` filled with `value` (standard layout), or an error naming `what`.
pub fn try_full<T: Clone, Sh>(shape: Sh, value: T, what: &str) -> Result<Array<T, Sh::Dim>>
where
    Sh: ShapeBuilder,
    Sh::Dim: Dimension,
{
    let shape = shape.into_shape_with_order();
    let len = shape
        .raw_dim()
        .size_checked()
        .ok_or_else(|| no_memory(what, u128::MAX))?;
    let v = try_vec(len, value, what)?;
    Array::from_shape_vec(shape, v).map_err(|e| Error::Invalid(format!("{what}: {e}")))
}

/// [`try_full`] with the default value (zero for numbers).
pub fn try_zeros<T: Clone + Default, Sh>(shape: Sh, what: &str) -> Result<Array<T, Sh::Dim>>
where
    Sh: ShapeBuilder,
    Sh::Dim: Dimension,
{
    try_full(shape, T::default(), what)
}

/// A standard-layout owned copy of `a`, or an error naming `what`.
pub fn try_to_owned<T: Clone, D: Dimension>(
    a: ndarray::ArrayView<'_, T, D>,
    what: &str,
) -> Result<Array<T, D>> {
    let mut v = try_with_capacity(a.len(), what)?;
    match a.as_slice() {
        Some(s) => v.extend_from_slice(s),
        None => v.extend(a.iter().cloned()),
    }
    Array::from_shape_vec(a.raw_dim(), v).map_err(|e| Error::Invalid(format!("{what}: {e}")))
}

/// The soft address-space limit (`ulimit -v`, RLIMIT_AS) in bytes, when one is set.
pub fn address_space_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit struct that we own.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut r) } == 0;
    (ok && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// Address space this process can still map under RLIMIT_AS (limit minus what is mapped now),
/// when a limit is set.
pub fn address_space_left() -> Option<u64> {
    let limit = address_space_limit()?;
    let statm = std::fs::read_to_string("/proc/self/statm").ok();
    let pages: u64 = statm
        .as_deref()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    Some(limit.saturating_sub(pages.saturating_mul(page)))
}

/// Address space one worker thread may take: its stack plus the malloc arena glibc reserves for
/// it (64 MiB on 64-bit).
const PER_THREAD_BYTES: u64 = 64 << 20;

/// How many rayon threads to start: rayon's own default (RAYON_NUM_THREADS, else one per core),
/// lowered under an address-space limit so that the threads' reservations leave room for data.
fn thread_count(default: usize, limit: Option<u64>) -> usize {
    match limit {
        Some(l) => default.min((l / PER_THREAD_BYTES / 2).max(1) as usize),
        None => default,
    }
}

/// Start rayon's global pool with a thread count the process can afford. rayon builds its default
/// pool lazily and panics when a thread cannot be spawned (a small `ulimit -v` on a many-core
/// machine); it cannot be retried, so the count is chosen before the first parallel call.
pub fn init_thread_pool() {
    let default = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1);
    let limit = address_space_limit();
    let n = thread_count(default, limit);
    if limit.is_some() {
        // Under `ulimit -v` every extra glibc arena (64 MiB of address space each, created when
        // threads contend) is taken from the data: one arena, whose sharing costs little since
        // volume-sized buffers are mapped on their own.
        // SAFETY: mallopt only sets an allocator parameter; called before worker threads exist.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    }
    // An error means a pool already exists (a library user built one): keep it.
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impossible_sizes_are_errors_not_aborts() {
        let e = try_vec(usize::MAX / 2, 0f32, "the test buffer").unwrap_err();
        assert!(
            e.to_string()
                .contains("not enough memory for the test buffer"),
            "{e}"
        );
        let e = try_zeros::<f32, _>((1usize << 40, 1 << 40, 4), "the huge grid").unwrap_err();
        assert!(e.to_string().contains("the huge grid"), "{e}");
        let a = try_full((2, 3), 7u16, "small").unwrap();
        assert_eq!(a.shape(), &[2, 3]);
        assert!(a.iter().all(|&v| v == 7));
        let src = ndarray::Array2::from_shape_fn((3, 2), |(i, j)| (i * 2 + j) as f32);
        let t = try_to_owned(src.t(), "copy").unwrap();
        assert_eq!(t, src.t());
        assert!(t.is_standard_layout());
    }

    #[test]
    fn thread_count_follows_the_address_space_limit() {
        assert_eq!(thread_count(64, None), 64);
        // 300 MB: two 64 MiB reservations, half the space, at most.
        assert_eq!(thread_count(64, Some(300_000 * 1024)), 2);
        assert_eq!(thread_count(64, Some(1 << 20)), 1);
        assert_eq!(thread_count(8, Some(64 << 30)), 8);
    }
}
