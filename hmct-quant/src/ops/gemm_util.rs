//! Matrix products on the `gemm` crate, shared by Conv, ConvTranspose, MatMul, Gemm,
//! Einsum and the RNNs.
//!
//! `gemm` is always called single-threaded; parallel work is cut into tiles whose
//! bounds depend only on the matrix sizes, never on the thread count, so every output
//! element is computed by the same sequence of operations whatever the pool size.

use gemm::Parallelism;
use rayon::prelude::*;

/// Element types the GEMM kernels handle.
pub(crate) trait Scalar:
    Copy
    + Send
    + Sync
    + 'static
    + Default
    + PartialEq
    + num_traits::Zero
    + num_traits::One
    + std::ops::Add<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::AddAssign
{
    /// Runs `f` on a per-thread scratch buffer of `len` elements (unspecified
    /// contents). Kept between calls so large temporaries do not fault in fresh pages
    /// on every run; a nested call gets a buffer of its own.
    fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R;

    /// `self * a + b` with one rounding. Only for code compiled with the FMA target
    /// feature: elsewhere it is a slow library call.
    fn mul_add(self, a: Self, b: Self) -> Self;
}

macro_rules! scalar_with_scratch {
    ($t:ty, $cell:ident) => {
        thread_local! {
            static $cell: std::cell::RefCell<Vec<$t>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        impl Scalar for $t {
            #[inline(always)]
            fn mul_add(self, a: Self, b: Self) -> Self {
                <$t>::mul_add(self, a, b)
            }

            fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R {
                let mut v = $cell.with(|c| c.take());
                if v.len() < len {
                    v.resize(len, 0.0);
                }
                let r = f(&mut v[..len]);
                $cell.with(|c| {
                    if c.borrow().len() < v.len() {
                        c.replace(v);
                    }
                });
                r
            }
        }
    };
}
scalar_with_scratch!(f32, F32_SCRATCH);
scalar_with_scratch!(f64, F64_SCRATCH);

/// A read-only strided matrix: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub(crate) struct MatRef<'a, T> {
    pub data: &'a [T],
    pub rs: usize,
    pub cs: usize,
}

impl<'a, T> MatRef<'a, T> {
    /// A row-major matrix with `cols` columns.
    pub fn row_major(data: &'a [T], cols: usize) -> Self {
        MatRef {
            data,
            rs: cols,
            cs: 1,
        }
    }
    /// The transpose of a row-major matrix with `cols` columns.
    pub fn transposed(data: &'a [T], cols: usize) -> Self {
        MatRef {
            data,
            rs: 1,
            cs: cols,
        }
    }
    fn covers(&self, rows: usize, cols: usize) -> bool {
        rows == 0 || cols == 0 || (rows - 1) * self.rs + (cols - 1) * self.cs < self.data.len()
    }
    fn offset(&self, i: usize, j: usize) -> *const T {
        // In bounds by `covers` for every (i, j) a caller passes.
        self.data[i * self.rs + j * self.cs..].as_ptr()
    }
}

/// Work (multiply-adds) below which a product runs on the calling thread.
const PAR_WORK: usize = 1 << 21;
/// Tile edges of parallel products. Fixed so results do not depend on thread count.
const TILE_M: usize = 256;
const TILE_N: usize = 256;

/// `c[i * ldc + j] = (c[i * ldc + j] if accumulate) + alpha * sum_k a(i, k) b(k, j)`
/// for `i < m`, `j < n`, single-threaded.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_serial<T: Scalar>(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<T>,
    b: MatRef<T>,
    c: &mut [T],
    ldc: usize,
    accumulate: bool,
    alpha: T,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(a.covers(m, k) && b.covers(k, n) && (m - 1) * ldc + n <= c.len() && n <= ldc);
    // SAFETY: the bounds of all three matrices were checked just above.
    unsafe { gemm_raw(m, n, k, a, b, c.as_mut_ptr(), ldc, accumulate, alpha) }
}

/// # Safety
/// `a` covers `m×k`, `b` covers `k×n`, and `c` points to an `m×n` block with row stride
/// `ldc` that nothing else accesses during the call.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_raw<T: Scalar>(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<T>,
    b: MatRef<T>,
    c: *mut T,
    ldc: usize,
    accumulate: bool,
    alpha: T,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                for j in 0..n {
                    // SAFETY: inside the m×n block the caller owns.
                    unsafe { *c.add(i * ldc + j) = T::zero() };
                }
            }
        }
        return;
    }
    // SAFETY: forwarded from the caller; `gemm` reads `a`, `b` inside their bounds and
    // writes only the m×n block of `c`. `dst := 1·dst + alpha·a·b`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            1,
            ldc as isize,
            accumulate,
            a.offset(0, 0),
            a.cs as isize,
            a.rs as isize,
            b.offset(0, 0),
            b.cs as isize,
            b.rs as isize,
            T::one(),
            alpha,
            false,
            false,
            false,
            Parallelism::None,
        )
    }
}

/// A pointer that may cross threads; users guarantee disjoint access.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr<T>(pub *mut T);
// SAFETY: only used to hand out provably disjoint regions to parallel tasks.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SendPtr<T> {}

/// Like [`gemm_serial`], split into fixed tiles run in parallel when large.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<T: Scalar>(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<T>,
    b: MatRef<T>,
    c: &mut [T],
    ldc: usize,
    accumulate: bool,
    alpha: T,
) {
    // Short products (small k) pay per-call packing overhead: give them wider tiles.
    let tile_n = ((1usize << 18) / k.max(1)).clamp(TILE_N, 16 * TILE_N);
    if m.saturating_mul(n).saturating_mul(k) < PAR_WORK || (m <= TILE_M && n <= tile_n) {
        gemm_serial(m, n, k, a, b, c, ldc, accumulate, alpha);
        return;
    }
    assert!(a.covers(m, k) && b.covers(k, n) && (m - 1) * ldc + n <= c.len() && n <= ldc);
    let tm = m.div_ceil(TILE_M);
    let tn = n.div_ceil(tile_n);
    let cp = SendPtr(c.as_mut_ptr());
    let tile = |t: usize| {
        let (ti, tj) = (t / tn, t % tn);
        let (i0, j0) = (ti * TILE_M, tj * tile_n);
        let (mi, nj) = (TILE_M.min(m - i0), tile_n.min(n - j0));
        let at = MatRef {
            data: &a.data[i0 * a.rs..],
            rs: a.rs,
            cs: a.cs,
        };
        let bt = MatRef {
            data: &b.data[j0 * b.cs..],
            rs: b.rs,
            cs: b.cs,
        };
        let cp = cp;
        // SAFETY: tiles are disjoint blocks of `c`, whose bounds were checked above;
        // `at`/`bt` are sub-views of checked matrices.
        unsafe {
            gemm_raw(
                mi,
                nj,
                k,
                at,
                bt,
                cp.0.add(i0 * ldc + j0),
                ldc,
                accumulate,
                alpha,
            )
        };
    };
    // The same tiles either way: a tile's values do not depend on who computes it.
    if crate::par::enabled() {
        (0..tm * tn).into_par_iter().for_each(tile);
    } else {
        (0..tm * tn).for_each(tile);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
        let mut c = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0f64;
                for p in 0..k {
                    s += a[i * k + p] as f64 * b[p * n + j] as f64;
                }
                c[i * n + j] = s as f32;
            }
        }
        c
    }

    #[test]
    fn tiled_matches_naive_and_is_thread_count_independent() {
        let (m, n, k) = (300, 530, 70);
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 104_729) % 97) as f32 / 48.0 - 1.0)
            .collect();
        let want = naive(m, n, k, &a, &b);
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut c = vec![0.0f32; m * n];
            pool.install(|| {
                gemm(
                    m,
                    n,
                    k,
                    MatRef::row_major(&a, k),
                    MatRef::row_major(&b, n),
                    &mut c,
                    n,
                    false,
                    1.0,
                )
            });
            c
        };
        let c1 = run(1);
        let c3 = run(3);
        assert_eq!(c1, c3);
        for (x, y) in c1.iter().zip(&want) {
            assert!((x - y).abs() < 1e-3, "{x} vs {y}");
        }
        // Transposed operands and accumulation.
        let at: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
        let mut c = vec![1.0f32; m * n];
        gemm(
            m,
            n,
            k,
            MatRef::transposed(&at, m),
            MatRef::row_major(&b, n),
            &mut c,
            n,
            true,
            2.0,
        );
        for (x, y) in c.iter().zip(&want) {
            assert!((x - (1.0 + 2.0 * y)).abs() < 2e-3);
        }
    }
}
