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

    /// `y = start + a · self` for the `m × k` matrix `a` (`y` is `m × n`). Each row's
    /// sums are those of a product of that row alone, bit for bit; up to [`ROWS`] rows
    /// share one pass over each panel, so several samples' rows (see
    /// `Kernel::run_rows`) read the weight once rather than once each.
    pub(crate) fn matmul(&self, a: MatRef<f32>, m: usize, start: Start, y: &mut [f32]) {
        let (k, n) = (self.k, self.n);
        assert!(y.len() >= m * n);
        assert!(m == 0 || k == 0 || (m - 1) * a.rs + (k - 1) * a.cs < a.data.len());
        if m == 0 || n == 0 {
            return;
        }
        let rows: Vec<Vec<f32>> = (0..m)
            .map(|i| (0..k).map(|kk| a.data[i * a.rs + kk * a.cs]).collect())
            .collect();
        let panels = n.div_ceil(LANES);
        // Per panel, its `m` rows of sums (64 each), written back to `y` after.
        let mut out = vec![[0.0f32; LANES]; panels * m];
        let task = |(p, sums): (usize, &mut [[f32; LANES]])| {
            let cols = (n - p * LANES).min(LANES);
            for (i, row_sums) in sums.iter_mut().enumerate() {
                for (l, v) in row_sums.iter_mut().enumerate().take(cols) {
                    *v = match start {
                        Start::Zero => 0.0,
                        Start::Output => y[i * n + p * LANES + l],
                        Start::Bias(b) => b[i],
                    };
                }
            }
            let panel = &self.data[p * k * LANES..][..k * LANES];
            let mut i = 0;
            while m - i >= ROWS {
                let group: &mut [[f32; LANES]; ROWS] = (&mut sums[i..i + ROWS])
                    .try_into()
                    .expect("a group of ROWS rows");
                #[cfg(target_arch = "x86_64")]
                if avx512_rows() {
                    // SAFETY: AVX-512F is present; rows hold `k` values, the panel `k` lines.
                    unsafe { panel_sums_rows_avx512(&rows[i..i + ROWS], panel, group) };
                    i += ROWS;
                    continue;
                }
                panel_sums_rows(&rows[i..i + ROWS], panel, group);
                i += ROWS;
            }
            for (row, row_sums) in rows[i..].iter().zip(&mut sums[i..]) {
                panel_sums(row, panel, row_sums);
            }
        };
        if k * n < PARALLEL_VALUES || !crate::par::enabled() {
            out.chunks_mut(m).enumerate().for_each(task);
        } else {
            out.par_chunks_mut(m).enumerate().for_each(task);
        }
        for (p, sums) in out.chunks(m).enumerate() {
            let cols = (n - p * LANES).min(LANES);
            for (i, row_sums) in sums.iter().enumerate() {
                y[i * n + p * LANES..][..cols].copy_from_slice(&row_sums[..cols]);
            }
        }
    }
}

/// Rows that share one pass over a panel: four rows of four AVX-512 vectors of sums
/// are half the registers.
const ROWS: usize = 4;

/// [`panel_sums`] for [`ROWS`] rows at once, each row's sums in the same order.
#[multiversion::multiversion(targets("x86_64+avx512f+avx2+fma", "x86_64+avx2+fma"))]
fn panel_sums_rows(a: &[Vec<f32>], panel: &[f32], sums: &mut [[f32; LANES]; ROWS]) {
    let fma = multiversion::target::target_cfg_f!(target_feature = "fma");
    let k = panel.len() / LANES;
    let a: [&[f32]; ROWS] = std::array::from_fn(|r| &a[r][..k]);
    let mut acc = *sums;
    for kk in 0..k {
        if kk % 4 == 0 {
            prefetch(panel.as_ptr().wrapping_add(kk * LANES + AHEAD));
        }
        let line: &[f32; LANES] = panel[kk * LANES..][..LANES]
            .try_into()
            .expect("a line of 64");
        for (row, acc) in a.iter().zip(acc.iter_mut()) {
            let ak = row[kk];
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
    }
    *sums = acc;
}

/// Whether [`panel_sums_rows_avx512`] runs: where the CPU has what `panel_sums`'s
/// AVX-512 version needs, whose fused multiply-adds it must match.
#[cfg(target_arch = "x86_64")]
fn avx512_rows() -> bool {
    let f = crate::cpu::features();
    f.avx512f && f.avx2 && f.fma
}

/// [`panel_sums_rows`] with AVX-512 intrinsics: each line loaded once into registers
/// for the four rows, where the compiler's code reloaded it per row and checked each
/// row's bounds: on a Xeon, four rows of a 1280 x 1000 weight in L3 0.19 -> 0.17 ms
/// (one row alone 0.17), of a 256 x 1000 weight in L2 0.029 -> 0.017 (a scratch loop).
/// `kernel_table rows_` times one, four and eight rows through `run_rows`.
///
/// # Safety
/// The CPU must have AVX-512F; each row of `a` holds at least `panel.len() / 64` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn panel_sums_rows_avx512(a: &[Vec<f32>], panel: &[f32], sums: &mut [[f32; LANES]; ROWS]) {
    use std::arch::x86_64::*;
    let k = panel.len() / LANES;
    let a: [&[f32]; ROWS] = std::array::from_fn(|r| &a[r][..k]);
    unsafe {
        let mut acc: [[__m512; 4]; ROWS] = std::array::from_fn(|r| {
            std::array::from_fn(|j| _mm512_loadu_ps(sums[r][16 * j..].as_ptr()))
        });
        let p = panel.as_ptr();
        for kk in 0..k {
            if kk % 4 == 0 {
                prefetch(p.wrapping_add(kk * LANES + AHEAD));
            }
            let l: [__m512; 4] =
                std::array::from_fn(|j| _mm512_loadu_ps(p.add(kk * LANES + 16 * j)));
            for r in 0..ROWS {
                let b = _mm512_set1_ps(*a[r].get_unchecked(kk));
                for j in 0..4 {
                    acc[r][j] = _mm512_fmadd_ps(b, l[j], acc[r][j]);
                }
            }
        }
        for r in 0..ROWS {
            for j in 0..4 {
                _mm512_storeu_ps(sums[r][16 * j..].as_mut_ptr(), acc[r][j]);
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
    /// for a transposed and a row-major weight, a partial panel, every start, and rows
    /// summed alone and in groups.
    #[test]
    fn sums_in_order_from_the_start() {
        // The products' rounding: fused where the CPU has FMA (as `panel_sums`).
        #[cfg(target_arch = "x86_64")]
        let fma = is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx2");
        #[cfg(not(target_arch = "x86_64"))]
        let fma = false;
        // Seven rows: a group of four, then three alone.
        let (m, k, n) = (7, 37, 150);
        let val = |i: usize| ((i * 7919 % 1000) as f32 - 500.0) / 97.0;
        let a: Vec<f32> = (0..m * k).map(val).collect();
        let w: Vec<f32> = (0..k * n).map(|i| val(i + 13)).collect();
        let bias = [0.25f32, -3.5, 1.0, 0.0, -0.125, 7.0, 2.5];
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

    /// Four rows at once (the portable kernel and the AVX-512 one) sum each row as
    /// the one-row kernel does, bit for bit.
    #[test]
    fn four_rows_sum_as_one_row() {
        let k = 29;
        let val = |i: usize| ((i * 7919 % 1000) as f32 - 500.0) / 97.0;
        let panel: Vec<f32> = (0..k * LANES).map(|i| val(i + 5)).collect();
        let rows: Vec<Vec<f32>> = (0..ROWS)
            .map(|r| (0..k).map(|i| val(i * 3 + r)).collect())
            .collect();
        let start: [[f32; LANES]; ROWS] =
            std::array::from_fn(|r| std::array::from_fn(|l| val(r * 64 + l + 9)));
        let mut want = start;
        for (row, sums) in rows.iter().zip(&mut want) {
            panel_sums(row, &panel, sums);
        }
        let mut got = start;
        panel_sums_rows(&rows, &panel, &mut got);
        assert_eq!(
            got.map(|r| r.map(f32::to_bits)),
            want.map(|r| r.map(f32::to_bits))
        );
        #[cfg(target_arch = "x86_64")]
        if avx512_rows() {
            let mut got = start;
            // SAFETY: AVX-512F is present; rows hold `k` values.
            unsafe { panel_sums_rows_avx512(&rows, &panel, &mut got) };
            assert_eq!(
                got.map(|r| r.map(f32::to_bits)),
                want.map(|r| r.map(f32::to_bits))
            );
        }
    }
}
