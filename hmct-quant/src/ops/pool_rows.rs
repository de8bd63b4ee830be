//! 2-D max and average pooling of f32 planes row by row, on AVX-512. Max pooling takes
//! two passes: each input row is reduced along the width once (its maxima over every
//! output column's window), then each output row folds the reduced rows its window
//! covers. Average pooling sums each output's taps in the definition's order straight
//! from the input rows ([`AvgRows`]).
//!
//! The result is the definition's, bit for bit: an output is its window's first tap
//! inside the data, replaced by every later tap greater than it, in row-major order
//! (`v > m ? v : m`, which is `vmaxps v, m` lane by lane). So an output is NaN where
//! its first tap is NaN; otherwise NaN taps are skipped and the first of the largest
//! taps wins (which decides between `-0` and `+0`). Rows first keeps that order once
//! each row's fold starts from its tap 0 with NaN read as `-inf`, which never
//! replaces anything (later NaN taps `v > m` skips anyway): the width pass gives each
//! row's first largest tap, the height pass the first row holding the largest, and
//! where the first tap of the window's first row is NaN (each reduced row keeps its
//! tap 0 as read) the output is that NaN, payload and sign included.
//!
//! Columns left of the row read as its first value and columns right of it as its
//! last: a window (without dilation) that reaches into the padding holds the row's
//! end value, so its padding taps fold that value again, which changes nothing, and
//! the first tap of a window hanging over the left edge is the row's first value, the
//! definition's first tap. Rows outside the data are not folded at all.
//!
//! The width pass loads each input row once, sixteen columns per vector, and builds
//! the taps of sixteen outputs by shifting lanes across two neighbouring vectors (at
//! stride 2, of their even and odd lanes), where [`super::pool`]'s phase planes copy
//! the whole plane first and load every tap again: ResNet-50's 3x3 stride-2 pool
//! alone 0.222 -> 0.157 ms, YOLOv8n's 5x5 SPPF pool 0.092 -> 0.058 (`kernel_table
//! max`; docs/performance.md, session 48).

use super::window::Win3;

/// Where a 2-D window's rows and columns lie, for the passes of both pools.
pub(super) struct Rows {
    g: Win3,
    /// Outputs per row rounded up to whole vectors: the stride of the reduced rows.
    row_vectors: usize,
    /// Per output row, the input rows its window reads: the first, and how many
    /// (`dil` apart).
    out_rows: Vec<(usize, usize)>,
    /// Per vector load `j` of a row (columns `16 j - pad` on): its lanes left of the
    /// row and its lanes inside it.
    load_lanes: Vec<(u16, u16)>,
}

impl Rows {
    /// The rows of this geometry, where the passes apply: a 2-D (or 1-D) window, a
    /// stride of 1 or 2 and no dilation along the width, a window of at most 16
    /// columns, every output row and column with a tap inside the data, and a CPU with
    /// AVX-512.
    fn new(g: &Win3) -> Option<Rows> {
        let two_d = g.input[0] == 1 && g.kernel[0] == 1 && g.out[0] == 1 && g.pad[0] == 0;
        let inside = |a: usize, o: usize| (0..g.kernel[a]).filter_map(move |k| g.src(a, o, k));
        let reads = |a: usize| (0..g.out[a]).all(|o| inside(a, o).next().is_some());
        // (No AVX-512 off x86-64: `features` is all false there.)
        if !(crate::cpu::features().avx512f
            && two_d
            && matches!(g.stride[2], 1 | 2)
            && g.dil[2] == 1
            && g.kernel[2] <= LANES
            && g.out_vol() > 0
            && reads(1)
            && reads(2))
        {
            return None;
        }
        let out_rows: Vec<(usize, usize)> = (0..g.out[1])
            .map(|o| {
                let first = inside(1, o).next().expect("checked above");
                (first, inside(1, o).count())
            })
            .collect();
        let row_vectors = g.out[2].div_ceil(LANES);
        let load_lanes = (0..g.stride[2] * (row_vectors + 1))
            .map(|j| {
                let c = (j * LANES) as isize - g.pad[2];
                let lanes = |cols: std::ops::Range<isize>| {
                    (0..LANES)
                        .filter(|&l| cols.contains(&(c + l as isize)))
                        .fold(0u16, |m, l| m | 1 << l)
                };
                (lanes(isize::MIN..0), lanes(0..g.input[2] as isize))
            })
            .collect();
        Some(Rows {
            g: *g,
            row_vectors,
            out_rows,
            load_lanes,
        })
    }
}

/// Max pooling's passes for one geometry.
pub(super) struct MaxRows {
    rows: Rows,
    /// Input rows any window reads: rows from here on are never reduced.
    needed_rows: usize,
}

/// Scratch of one task: the plane's rows reduced along the width, and each reduced
/// row's tap 0 as read.
#[derive(Default)]
pub(super) struct Scratch {
    reduced: Vec<f32>,
    first_taps: Vec<f32>,
}

/// Lanes of one AVX-512 vector of f32.
const LANES: usize = 16;

impl MaxRows {
    /// The passes for this geometry, where they apply (see [`Rows::new`]).
    pub(super) fn new(g: &Win3) -> Option<MaxRows> {
        let rows = Rows::new(g)?;
        let needed_rows = rows
            .out_rows
            .iter()
            .map(|&(first, n)| first + (n - 1) * g.dil[1] + 1)
            .max()
            .unwrap_or(0);
        Some(MaxRows { rows, needed_rows })
    }

    /// Pools plane `x` into `out` (its `out[1] * out[2]` outputs).
    pub(super) fn plane(&self, x: &[f32], out: &mut [f32], scratch: &mut Scratch) {
        let g = &self.rows.g;
        let [_, ih_n, iw_n] = g.input;
        assert!(x.len() >= ih_n * iw_n && out.len() >= g.out[1] * g.out[2]);
        let len = self.needed_rows * self.rows.row_vectors * LANES;
        scratch.reduced.resize(len, 0.0);
        scratch.first_taps.resize(len, 0.0);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX-512, and the stride and window are the ones
        // `avx512::max_plane` handles (`Rows::new`).
        unsafe {
            avx512::max_plane(self, x, out, scratch)
        };
    }
}

/// Average pooling's pass for one geometry: each output row sums its window's taps
/// in row-major order from +0, sixteen outputs a vector, the taps of a row built from
/// its loads as max pooling's are (columns outside the row read as +0, which changes
/// no sum started from +0), then divides by the output's divisor. The same taps in
/// the same order as [`super::pool`]'s other paths: the same bits.
pub(super) struct AvgRows {
    rows: Rows,
}

impl AvgRows {
    /// The pass for this geometry, where it applies (see [`Rows::new`]).
    pub(super) fn new(g: &Win3) -> Option<AvgRows> {
        Some(AvgRows {
            rows: Rows::new(g)?,
        })
    }

    /// Averages plane `x` into `out`: each output's sum over `divisors` at its place
    /// (zero where that is zero).
    pub(super) fn plane(&self, x: &[f32], out: &mut [f32], divisors: &[f32]) {
        let g = &self.rows.g;
        let [_, ih_n, iw_n] = g.input;
        let out_vol = g.out[1] * g.out[2];
        assert!(x.len() >= ih_n * iw_n && out.len() >= out_vol && divisors.len() >= out_vol);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX-512, and the stride and window are the ones
        // `avx512::avg_plane` handles (`Rows::new`).
        unsafe {
            avx512::avg_plane(&self.rows, x, out, divisors)
        };
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::super::pool::lanes_below;
    use super::{LANES, MaxRows, Rows, Scratch};
    use std::arch::x86_64::*;

    /// `$run($args.., f)` with `f` calling `$at_stride1::<K>` or `$at_stride2::<K>`
    /// for geometry `$g`'s stride and window width `K`: one loop per width, the taps
    /// unrolled.
    macro_rules! by_width {
        ($g:expr, $run:ident $args:tt, $at_stride1:ident, $at_stride2:ident) => {
            by_width!(@ $g, $run, $args, $at_stride1, $at_stride2,
                1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
        };
        (@ $g:expr, $run:ident, $args:tt, $at_stride1:ident, $at_stride2:ident,
            $($k:literal)*) => {
            match ($g.stride[2], $g.kernel[2]) {
                $((1, $k) => by_width!(@call $run, $args, |a, b, c| $at_stride1::<$k>(a, b, c)),)*
                $((2, $k) => by_width!(@call $run, $args, |a, b, c| $at_stride2::<$k>(a, b, c)),)*
                _ => unreachable!("Rows::new takes strides 1 and 2, up to 16 taps"),
            }
        };
        (@call $run:ident, ($($arg:expr),*), $f:expr) => {
            $run($($arg),*, $f)
        };
    }

    /// [`MaxRows::plane`]: each input row reduced along the width once, as the first
    /// output row that reads it comes up, then each output row folded from the
    /// reduced rows. Each window width gets its own loop, the taps unrolled.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `pool` comes from `MaxRows::new` (stride 1 or 2, 1 to
    /// 16 taps), `x` holds the plane and `scratch` its needed rows.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn max_plane(
        pool: &MaxRows,
        x: &[f32],
        out: &mut [f32],
        scratch: &mut Scratch,
    ) {
        let g = &pool.rows.g;
        by_width!(g, max_with(pool, x, out, scratch), stride1, stride2)
    }

    /// [`max_plane`] with `reduce_row` for the window's width.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn max_with(
        pool: &MaxRows,
        x: &[f32],
        out: &mut [f32],
        scratch: &mut Scratch,
        reduce_row: impl Fn(&Row, &mut [f32], &mut [f32]),
    ) {
        let rows = &pool.rows;
        let g = &rows.g;
        let (iw_n, ow_n) = (g.input[2], g.out[2]);
        let len = rows.row_vectors * LANES;
        // Input rows reduced so far (rows are needed in increasing order).
        let mut done = 0;
        for (oh, &(first, count)) in rows.out_rows.iter().enumerate() {
            let last = first + (count - 1) * g.dil[1];
            for h in done..last + 1 {
                reduce_row(
                    &Row::new(&x[h * iw_n..][..iw_n], g.pad[2], &rows.load_lanes),
                    &mut scratch.reduced[h * len..][..len],
                    &mut scratch.first_taps[h * len..][..len],
                );
            }
            done = done.max(last + 1);
            fold_rows(
                &scratch.reduced[first * len..],
                &scratch.first_taps[first * len..][..len],
                len * g.dil[1],
                count,
                &mut out[oh * ow_n..][..ow_n],
            );
        }
    }

    /// An input row as vectors of sixteen columns, those left of it reading as its
    /// first value and those right of it as its last (or all of them as +0).
    /// `load_lanes` comes from the [`Rows`] of a geometry whose input rows are `row`'s
    /// length: the unmasked loads rely on it.
    struct Row<'a> {
        row: &'a [f32],
        pad: isize,
        load_lanes: &'a [(u16, u16)],
        first: __m512,
        last: __m512,
    }

    impl<'a> Row<'a> {
        #[inline]
        #[target_feature(enable = "avx512f")]
        fn new(row: &'a [f32], pad: isize, load_lanes: &'a [(u16, u16)]) -> Row<'a> {
            Row {
                row,
                pad,
                load_lanes,
                first: _mm512_set1_ps(row[0]),
                last: _mm512_set1_ps(row[row.len() - 1]),
            }
        }

        /// The row with columns outside it reading as +0.
        #[inline]
        #[target_feature(enable = "avx512f")]
        fn zero_padded(row: &'a [f32], pad: isize, load_lanes: &'a [(u16, u16)]) -> Row<'a> {
            Row {
                row,
                pad,
                load_lanes,
                first: _mm512_setzero_ps(),
                last: _mm512_setzero_ps(),
            }
        }

        /// Load `j`: columns `16 j - pad .. 16 j - pad + 16`.
        #[inline]
        #[target_feature(enable = "avx512f")]
        fn load(&self, j: usize) -> __m512 {
            let (left, inside) = self.load_lanes[j];
            let at = self
                .row
                .as_ptr()
                .wrapping_offset((j * LANES) as isize - self.pad);
            if left == 0 && inside == !0 {
                // SAFETY: all sixteen columns are inside the row (`load_lanes`).
                return unsafe { _mm512_loadu_ps(at) };
            }
            let ends = _mm512_mask_mov_ps(self.last, left, self.first);
            // SAFETY: the mask keeps only lanes inside the row; the others are not
            // read, so the address may lie outside it.
            unsafe { _mm512_mask_loadu_ps(ends, inside, at) }
        }
    }

    /// The lanes of `v` that are NaN.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn nan_lanes(v: __m512) -> __mmask16 {
        _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v)
    }

    /// `v` with NaN read as `-inf`, which `v > m` never takes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn nan_low(v: __m512) -> __m512 {
        _mm512_mask_mov_ps(v, nan_lanes(v), _mm512_set1_ps(f32::NEG_INFINITY))
    }

    /// Lanes `j .. j + 16` of the 32 lanes of `lo` then `hi`, for `j < 16`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn shifted(lo: __m512, hi: __m512, j: usize) -> __m512 {
        if j == 0 {
            return lo;
        }
        let at = _mm512_add_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(j as i32),
        );
        _mm512_permutex2var_ps(lo, at, hi)
    }

    /// Stride 1, `K` taps: output `ow` of `dst` is the first largest of the columns
    /// from `ow - pad` on (from tap 0 with NaN read as `-inf`), and of `first` its
    /// tap 0 as read. Tap `k` of sixteen outputs is lanes `k..k + 16` of two
    /// neighbouring loads.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn stride1<const K: usize>(row: &Row, dst: &mut [f32], first: &mut [f32]) {
        let mut lo = row.load(0);
        let outs = dst
            .chunks_exact_mut(LANES)
            .zip(first.chunks_exact_mut(LANES));
        for (v, (out, first)) in outs.enumerate() {
            let hi = row.load(v + 1);
            let mut m = nan_low(lo);
            for k in 1..K {
                m = _mm512_max_ps(shifted(lo, hi, k), m);
            }
            // SAFETY: `out` and `first` hold sixteen values.
            unsafe {
                _mm512_storeu_ps(out.as_mut_ptr(), m);
                _mm512_storeu_ps(first.as_mut_ptr(), lo);
            }
            lo = hi;
        }
    }

    /// Stride 2, `K` taps, as [`stride1`]: the even and odd columns of each 32 are
    /// split into two vectors; tap `2j` of sixteen outputs is lanes `j..j + 16` of two
    /// neighbouring even vectors, tap `2j + 1` of the odd ones.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn stride2<const K: usize>(row: &Row, dst: &mut [f32], first: &mut [f32]) {
        let (mut even, mut odd) = split_even_odd(row, 0);
        let outs = dst
            .chunks_exact_mut(LANES)
            .zip(first.chunks_exact_mut(LANES));
        for (v, (out, first)) in outs.enumerate() {
            let (even_hi, odd_hi) = split_even_odd(row, 2 * (v + 1));
            let mut m = nan_low(even);
            for k in 1..K {
                let tap = match k % 2 {
                    0 => shifted(even, even_hi, k / 2),
                    _ => shifted(odd, odd_hi, k / 2),
                };
                m = _mm512_max_ps(tap, m);
            }
            // SAFETY: `out` and `first` hold sixteen values.
            unsafe {
                _mm512_storeu_ps(out.as_mut_ptr(), m);
                _mm512_storeu_ps(first.as_mut_ptr(), even);
            }
            (even, odd) = (even_hi, odd_hi);
        }
    }

    /// [`AvgRows::plane`](super::AvgRows::plane): per output row, sixteen outputs at
    /// a time, the sum from +0 over the window's rows inside the data and each row's
    /// taps in order, then the quotient by the divisors. Each window width gets its
    /// own loop, the taps unrolled.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `rows` comes from `Rows::new` (stride 1 or 2, 1 to 16
    /// taps), `x` holds the plane, `out` and `divisors` its outputs.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn avg_plane(rows: &Rows, x: &[f32], out: &mut [f32], divisors: &[f32]) {
        by_width!(rows.g, avg_with(rows, x, out, divisors), sum1, sum2)
    }

    /// [`avg_plane`] with `add_row`, which adds one row's taps of output vector `v`
    /// to a sum, for the window's width.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn avg_with(
        rows: &Rows,
        x: &[f32],
        out: &mut [f32],
        divisors: &[f32],
        add_row: impl Fn(&Row, usize, __m512) -> __m512,
    ) {
        let g = &rows.g;
        let (iw_n, ow_n) = (g.input[2], g.out[2]);
        for (oh, &(first, count)) in rows.out_rows.iter().enumerate() {
            let at = oh * ow_n;
            assert!(at + ow_n <= out.len() && at + ow_n <= divisors.len());
            for v in 0..rows.row_vectors {
                let mut sum = _mm512_setzero_ps();
                for i in 0..count {
                    let h = first + i * g.dil[1];
                    let row = Row::zero_padded(&x[h * iw_n..][..iw_n], g.pad[2], &rows.load_lanes);
                    sum = add_row(&row, v, sum);
                }
                let kept = lanes_below(ow_n - v * LANES);
                // SAFETY: the kept lanes are outputs of row `oh`, inside `out` and
                // `divisors` (asserted); the CPU has AVX-512F.
                unsafe {
                    let q = super::super::pool::quotient_avx512(
                        sum,
                        divisors.as_ptr().add(at + v * LANES),
                        kept,
                    );
                    _mm512_mask_storeu_ps(out.as_mut_ptr().add(at + v * LANES), kept, q);
                }
            }
        }
    }

    /// Adds the `K` taps of output vector `v` at stride 1 from `row` to `sum`, in
    /// order.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn sum1<const K: usize>(row: &Row, v: usize, mut sum: __m512) -> __m512 {
        let lo = row.load(v);
        let hi = match K > 1 {
            true => row.load(v + 1),
            false => lo,
        };
        sum = _mm512_add_ps(sum, lo);
        for k in 1..K {
            sum = _mm512_add_ps(sum, shifted(lo, hi, k));
        }
        sum
    }

    /// Adds the `K` taps of output vector `v` at stride 2 from `row` to `sum`, in
    /// order.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn sum2<const K: usize>(row: &Row, v: usize, mut sum: __m512) -> __m512 {
        let (even, odd) = split_even_odd(row, 2 * v);
        // Taps 0 and 1 lie in this pair of loads; wider windows reach the next.
        let (even_hi, odd_hi) = match K > 2 {
            true => split_even_odd(row, 2 * v + 2),
            false => (even, odd),
        };
        for k in 0..K {
            let tap = match k % 2 {
                0 => shifted(even, even_hi, k / 2),
                _ => shifted(odd, odd_hi, k / 2),
            };
            sum = _mm512_add_ps(sum, tap);
        }
        sum
    }

    /// The even and odd columns of loads `j` and `j + 1`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn split_even_odd(row: &Row, j: usize) -> (__m512, __m512) {
        let evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odds = _mm512_add_epi32(evens, _mm512_set1_epi32(1));
        let (a, b) = (row.load(j), row.load(j + 1));
        (
            _mm512_permutex2var_ps(a, evens, b),
            _mm512_permutex2var_ps(a, odds, b),
        )
    }

    /// `dst` = the fold over `count` reduced rows `step` values apart from the start
    /// of `rows` (first, then any greater), or the first row's tap 0 (`first`) where
    /// that is NaN.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn fold_rows(rows: &[f32], first: &[f32], step: usize, count: usize, dst: &mut [f32]) {
        let n = dst.len();
        assert!(count > 0 && (count - 1) * step + n.div_ceil(LANES) * LANES <= rows.len());
        assert!(first.len() >= n.div_ceil(LANES) * LANES);
        let (src, out) = (rows.as_ptr(), dst.as_mut_ptr());
        for v in (0..n).step_by(LANES) {
            // SAFETY: by the assert, every row's vector is inside `rows`; the store
            // is masked to `dst`.
            unsafe {
                let at = src.add(v);
                let mut m = _mm512_loadu_ps(at);
                for r in 1..count {
                    m = _mm512_max_ps(_mm512_loadu_ps(at.add(r * step)), m);
                }
                let tap0 = _mm512_loadu_ps(first.as_ptr().add(v));
                m = _mm512_mask_mov_ps(m, nan_lanes(tap0), tap0);
                _mm512_mask_storeu_ps(out.add(v), lanes_below(n - v), m);
            }
        }
    }
}
