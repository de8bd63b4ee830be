//! f32 vector × matrix products with a constant matrix: a classifier's Gemm or MatMul
//! on one row (`1 × k` by `k × n`), or a 1x1 conv on one position (squeeze-excitation
//! blocks), which reads each weight once, so its speed is the speed at which the
//! weight streams from memory.
//!
//! The weight is packed once into panels of [`LANES`] columns, each column's `k`
//! values interleaved with its panel's (`k` lines of 64 values), so that a product
//! reads the weight as one sequential stream, which the hardware prefetchers follow,
//! and prefetches 16 KiB ahead of it across page boundaries. The `gemm` crate,
//! which ran these before, packs its operands on every call and read a `transB`
//! weight row by row. `run --profile`, one thread, two alternating rounds, ms per run
//! (onnxruntime's): ResNet-50's 2048 -> 1000 classifier 0.85 -> 0.66-0.69 (0.66),
//! DenseNet-121's 1024 -> 1000 0.43-0.51 -> 0.40-0.42 (0.36).
//!
//! Each output is `start + Σ_k a[k]·w[k][j]`, summed in order of `k` with fused
//! multiply-adds where the CPU has them; panels are independent tasks, so results do
//! not depend on the thread count.

use rayon::prelude::*;

use super::gemm_util::MatRef;
use super::packed_gemm::Start;

/// Columns per panel: four AVX-512 vectors (eight AVX2 ones) of independent sums.
const LANES: usize = 64;
/// Weight values from which a product splits its panels across threads: streaming
/// them takes longer than a task's handoff (the channel-lanes kernel's
/// `PARALLEL_WEIGHTS`, for the same reason). (At 1 << 18, MobileNetV3's SE convs, of
/// 230,400 values at most, ran on one thread: `run --profile --threads 2`, 0.21-0.22
/// ms per run on the channel-lanes kernel, 0.25-0.27 here, 0.20-0.22 at 1 << 16.)
const PARALLEL_VALUES: usize = 1 << 16;
/// How far ahead of the line it reads a product prefetches the weight (values).
const AHEAD: usize = 4096;

/// A `k × n` weight in panels of [`LANES`] columns: panel `p`'s line `kk` holds
/// `w[kk][64p .. 64p + 64]` (zero past `n`).
pub(crate) struct PackedRows {
    data: Vec<f32>,
    k: usize,
    n: usize,
}

impl PackedRows {
    pub(crate) fn new(b: MatRef<f32>, k: usize, n: usize) -> PackedRows {
        let panels = n.div_ceil(LANES);
        let mut data = vec![0.0f32; panels * k * LANES];
        for (p, panel) in data.chunks_exact_mut(k * LANES).enumerate() {
            for (kk, line) in panel.chunks_exact_mut(LANES).enumerate() {
                for (l, v) in line.iter_mut().enumerate().take(n - (p * LANES).min(n)) {
                    *v = b.data[kk * b.rs + (p * LANES + l) * b.cs];
                }
            }
        }
        PackedRows { data, k, n }
    }

    /// `y = start + a · self` for the `m × k` matrix `a` (`y` is `m × n`), row by row.
    pub(crate) fn matmul(&self, a: MatRef<f32>, m: usize, start: Start, y: &mut [f32]) {
        let (k, n) = (self.k, self.n);
        assert!(y.len() >= m * n);
        assert!(m == 0 || k == 0 || (m - 1) * a.rs + (k - 1) * a.cs < a.data.len());
        for (i, yi) in y.chunks_exact_mut(n).take(m).enumerate() {
            let row: Vec<f32> = (0..k).map(|kk| a.data[i * a.rs + kk * a.cs]).collect();
            let from = |j: usize, out: &[f32]| match start {
                Start::Zero => 0.0,
                Start::Output => out[j],
                Start::Bias(b) => b[i],
            };
            let task = |(p, out): (usize, &mut [f32])| {
                let mut sums = [0.0f32; LANES];
                for (l, s) in sums.iter_mut().enumerate().take(out.len()) {
                    *s = from(l, out);
                }
                let panel = &self.data[p * k * LANES..][..k * LANES];
                panel_sums(&row, panel, &mut sums);
                let len = out.len();
                out.copy_from_slice(&sums[..len]);
            };
            if k * n < PARALLEL_VALUES || !crate::par::enabled() {
                yi.chunks_mut(LANES).enumerate().for_each(task);
            } else {
                yi.par_chunks_mut(LANES).enumerate().for_each(task);
            }
        }
    }
}

/// `sums[l] += Σ_kk a[kk]·panel[kk·64 + l]`, in order of `kk`.
#[multiversion::multiversion(targets("x86_64+avx512f+avx2+fma", "x86_64+avx2+fma"))]
fn panel_sums(a: &[f32], panel: &[f32], sums: &mut [f32; LANES]) {
    let fma = multiversion::target::target_cfg_f!(target_feature = "fma");
    let mut acc = *sums;
    for (kk, (&ak, line)) in a.iter().zip(panel.chunks_exact(LANES)).enumerate() {
        // One line in four: the hardware prefetchers follow the stream within a page,
        // and the hint carries them over the next pages. (Every line: ResNet-50's
        // classifier 0.67 -> 0.69-0.71 ms, MobileNetV3's two 0.67-0.69 -> 0.74-0.81,
        // `run --profile`, two alternating rounds.)
        if kk % 4 == 0 {
            prefetch(panel.as_ptr().wrapping_add(kk * LANES + AHEAD));
        }
        let line: &[f32; LANES] = line.try_into().expect("a line of 64");
        if fma {
            for (s, &w) in acc.iter_mut().zip(line) {
                *s = ak.mul_add(w, *s);
            }
        } else {
            for (s, &w) in acc.iter_mut().zip(line) {
                *s += ak * w;
            }
        }
    }
    *sums = acc;
}

/// A hint to bring the 256 bytes at `at` into cache (any address will do).
#[inline(always)]
fn prefetch(at: *const f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it does not fault on any address.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        for line in 0..4 {
            _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(16 * line).cast());
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each output is the in-order sum of its products from its start, bit for bit,
    /// for a transposed and a row-major weight, a partial panel and every start.
    #[test]
    fn sums_in_order_from_the_start() {
        // The products' rounding: fused where the CPU has FMA (as `panel_sums`).
        #[cfg(target_arch = "x86_64")]
        let fma = is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx2");
        #[cfg(not(target_arch = "x86_64"))]
        let fma = false;
        let (m, k, n) = (2, 37, 150);
        let val = |i: usize| ((i * 7919 % 1000) as f32 - 500.0) / 97.0;
        let a: Vec<f32> = (0..m * k).map(val).collect();
        let w: Vec<f32> = (0..k * n).map(|i| val(i + 13)).collect();
        let bias = [0.25f32, -3.5];
        let c: Vec<f32> = (0..m * n).map(|i| val(i + 101)).collect();
        for transposed in [false, true] {
            let wt: Vec<f32> = match transposed {
                false => w.clone(),
                true => (0..n * k).map(|i| w[i % k * n + i / k]).collect(),
            };
            let wm = match transposed {
                false => MatRef::row_major(&wt, n),
                true => MatRef::transposed(&wt, k),
            };
            let packed = PackedRows::new(wm, k, n);
            for start in [Start::Zero, Start::Bias(&bias), Start::Output] {
                let mut y = c.clone();
                packed.matmul(MatRef::row_major(&a, k), m, start, &mut y);
                for i in 0..m {
                    for j in 0..n {
                        let mut s = match start {
                            Start::Zero => 0.0f32,
                            Start::Bias(b) => b[i],
                            Start::Output => c[i * n + j],
                        };
                        for kk in 0..k {
                            let (x, v) = (a[i * k + kk], w[kk * n + j]);
                            s = if fma { x.mul_add(v, s) } else { s + x * v };
                        }
                        assert_eq!(y[i * n + j].to_bits(), s.to_bits(), "({i}, {j})");
                    }
                }
            }
        }
    }
}
