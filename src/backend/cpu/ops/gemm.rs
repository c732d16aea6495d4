//! A bounds-checked front to `matrixmultiply`, so the conv code stays free of `unsafe`.

use super::super::Real;

/// A matrix inside a slice: element (i, j) is `data[off + i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub struct Mat {
    pub off: usize,
    pub rs: usize,
    pub cs: usize,
}

fn last_index(m: &Mat, rows: usize, cols: usize) -> usize {
    m.off + (rows - 1) * m.rs + (cols - 1) * m.cs
}

/// `C ← A B + β C` with A `[m, k]`, B `[k, n]`, C `[m, n]` (threaded by matrixmultiply).
#[allow(clippy::too_many_arguments)]
pub fn gemm<T: Real>(
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    am: Mat,
    b: &[T],
    bm: Mat,
    beta: T,
    c: &mut [T],
    cm: Mat,
) {
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    // These are internal invariants of the callers (shapes were validated before), so a
    // violation is a bug: panic rather than read out of bounds.
    assert!(last_index(&am, m, k) < a.len(), "gemm: A out of bounds");
    assert!(last_index(&bm, k, n) < b.len(), "gemm: B out of bounds");
    assert!(last_index(&cm, m, n) < c.len(), "gemm: C out of bounds");
    // SAFETY: every index the GEMM touches was bounds-checked above; `c` is a unique borrow
    // distinct from the shared `a` and `b`.
    unsafe {
        T::gemm_raw(
            m,
            k,
            n,
            T::ONE,
            a.as_ptr().add(am.off),
            am.rs as isize,
            am.cs as isize,
            b.as_ptr().add(bm.off),
            bm.rs as isize,
            bm.cs as isize,
            beta,
            c.as_mut_ptr().add(cm.off),
            cm.rs as isize,
            cm.cs as isize,
        );
    }
}
