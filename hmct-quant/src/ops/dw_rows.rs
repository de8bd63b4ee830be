//! Depthwise 2-D convs of stride 1 or 2 with AVX-512, one plane at a time, on planes
//! at least 16 outputs wide: blocks of up to four output rows by 32 columns are
//! summed in registers, and each input vector loaded serves every output row of the
//! block that reads it. At stride 2, each input row loaded is split into its even
//! and odd columns in registers.
//!
//! A depthwise conv does one multiply-add per value loaded when each output row is
//! summed on its own, and unaligned loads (every tap but one per row is unaligned)
//! take two load slots on Zen 4: the per-row sums ran at a quarter of the FMA peak.
//! Here a 3x3 kernel needs half a load per multiply-add.
//!
//! Loads are masked to the input's values, so the plane is read where it lies,
//! without a zero-padded copy. The sums are those of the per-row path
//! (`conv::dw_row`): each output starts at the bias and adds its taps in (kernel row,
//! kernel column) order with fused multiply-adds, padding included as `w·0`.

use std::arch::x86_64::*;

const LANES: usize = 16;
/// Output rows per register block.
const ROWS: usize = 4;

/// A depthwise plane's taps: `w` row-major over `kh x kw`, dilations `dh`, `dw`.
pub(crate) struct Taps<'a> {
    pub w: &'a [f32],
    pub kh: usize,
    pub kw: usize,
    pub dh: usize,
    pub dw: usize,
}

/// Whether [`plane`] runs planes `ow` outputs wide of this kernel (`taps_len` taps,
/// `kw` columns `dw` apart) at this stride on this CPU.
pub(crate) fn fits(ow: usize, taps_len: usize, kw: usize, dw: usize, stride: usize) -> bool {
    ow >= LANES
        && taps_len <= MAX_TAPS
        && kw <= MAX_KW
        // At stride 2 a tap's columns are one column phase shifted by under a vector.
        && (stride == 1 || (stride == 2 && (kw - 1) * dw / 2 < LANES))
        && crate::cpu::conv_isa() == Some(crate::cpu::Isa::Avx512)
}

/// Kernels of up to 49 taps (the weights are broadcast once per plane into a fixed
/// array) and 7 columns.
const MAX_TAPS: usize = 49;
const MAX_KW: usize = 7;

/// A depthwise plane's input: `ih x iw` values, row-major, read as if padded with
/// `top` zero rows above and `left` zero columns to the left (and zeros past its
/// right and bottom edges).
pub(crate) struct Input<'a> {
    pub x: &'a [f32],
    /// At least `iw` zeros: the rows above and below the input read these.
    pub zeros: &'a [f32],
    pub ih: usize,
    pub iw: usize,
    pub top: usize,
    pub left: usize,
}

/// `out` (`ow` wide, row-major) = `start` plus every tap: output `(h, x)` adds
/// `w[b, c] · input(s·h + b·dh - top, s·x + c·dw - left)` for each tap `(b, c)`,
/// at stride `s` of 1 or 2.
pub(crate) fn plane(
    input: &Input,
    taps: &Taps,
    stride: usize,
    start: f32,
    out: &mut [f32],
    ow: usize,
) {
    assert!(fits(ow, taps.w.len(), taps.kw, taps.dw, stride));
    assert!(taps.w.len() == taps.kh * taps.kw);
    assert!(taps.kh > 0 && taps.kw > 0 && taps.dh > 0 && taps.dw > 0);
    assert!(!out.is_empty() && out.len().is_multiple_of(ow));
    assert!(input.x.len() == input.ih * input.iw && input.zeros.len() >= input.iw);
    debug_assert!(input.zeros.iter().all(|&z| z == 0.0));
    let oh = out.len() / ow;
    // SAFETY: the CPU has AVX-512F (`fits`); loads are masked to the input's values,
    // stores to `out`.
    unsafe { avx512::plane(input, taps, stride, start, out, oh, ow) }
}

mod avx512 {
    use super::*;

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn plane(
        input: &Input,
        taps: &Taps,
        stride: usize,
        start: f32,
        out: &mut [f32],
        oh: usize,
        ow: usize,
    ) {
        let mut w = [_mm512_setzero_ps(); MAX_TAPS];
        for (v, &t) in w.iter_mut().zip(taps.w) {
            *v = _mm512_set1_ps(t);
        }
        let g = Geometry {
            x: input.x.as_ptr(),
            zeros: input.zeros.as_ptr(),
            ih: input.ih as isize,
            iw: input.iw as isize,
            top: input.top as isize,
            left: input.left as isize,
            start: _mm512_set1_ps(start),
            out: out.as_mut_ptr(),
            ow,
        };
        // Literal geometries let the common kernels unroll fully.
        // SAFETY: as for `super::plane`.
        unsafe {
            match (stride, taps.kh, taps.kw, taps.dh, taps.dw) {
                (1, 3, 3, 1, 1) => rows::<1>(&g, &w, oh, 3, 3, 1, 1),
                (1, 5, 5, 1, 1) => rows::<1>(&g, &w, oh, 5, 5, 1, 1),
                (1, 7, 7, 1, 1) => rows::<1>(&g, &w, oh, 7, 7, 1, 1),
                (1, 3, 3, 2, 2) => rows::<1>(&g, &w, oh, 3, 3, 2, 2),
                (1, 5, 5, 2, 2) => rows::<1>(&g, &w, oh, 5, 5, 2, 2),
                (1, kh, kw, dh, dw) => rows::<1>(&g, &w, oh, kh, kw, dh, dw),
                (2, 3, 3, 1, 1) => rows::<2>(&g, &w, oh, 3, 3, 1, 1),
                (2, 5, 5, 1, 1) => rows::<2>(&g, &w, oh, 5, 5, 1, 1),
                (_, kh, kw, dh, dw) => rows::<2>(&g, &w, oh, kh, kw, dh, dw),
            }
        }
    }

    /// Where a plane's input and output are.
    struct Geometry {
        x: *const f32,
        zeros: *const f32,
        ih: isize,
        iw: isize,
        top: isize,
        left: isize,
        start: __m512,
        out: *mut f32,
        ow: usize,
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn rows<const S: usize>(
        g: &Geometry,
        w: &[__m512; MAX_TAPS],
        oh: usize,
        kh: usize,
        kw: usize,
        dh: usize,
        dw: usize,
    ) {
        let k = Kernel { w, kh, kw, dh, dw };
        // At stride 1 a block's rows are `dh` apart, so that each input row loaded
        // serves every row of the block (rows side by side would share only every
        // `dh`-th input row): blocks of `ROWS · dh` rows, one per row phase.
        let step = if S == 1 { dh } else { 1 };
        let span = ROWS * step;
        let mut base = 0;
        // SAFETY (whole body): blocks cover rows below `oh` and columns below `ow`.
        unsafe {
            while base < oh {
                for h0 in (base..oh.min(base + span)).take(step) {
                    match (oh.min(base + span) - h0).div_ceil(step) {
                        1 => columns::<1, S>(g, &k, h0, step),
                        2 => columns::<2, S>(g, &k, h0, step),
                        3 => columns::<3, S>(g, &k, h0, step),
                        _ => columns::<ROWS, S>(g, &k, h0, step),
                    }
                }
                base += span;
            }
        }
    }

    struct Kernel<'a> {
        w: &'a [__m512; MAX_TAPS],
        kh: usize,
        kw: usize,
        dh: usize,
        dw: usize,
    }

    /// Output rows `h0 + i·step` for `i < RB` (`step` 1 at stride 2), all columns:
    /// blocks of 32, the last one of 16 or 32 with its extra lanes left unstored.
    #[inline(always)]
    unsafe fn columns<const RB: usize, const S: usize>(
        g: &Geometry,
        k: &Kernel,
        h0: usize,
        step: usize,
    ) {
        let mut x0 = 0;
        // SAFETY: as for `rows`.
        unsafe {
            while x0 < g.ow {
                let rem = g.ow - x0;
                let last = lanes(0, ((rem.min(2 * LANES) - 1) % LANES + 1) as isize);
                match (rem > LANES, S) {
                    (true, 1) => block::<RB, 2>(g, k, h0, step, x0, last),
                    (false, 1) => block::<RB, 1>(g, k, h0, step, x0, last),
                    (true, _) => block_stride2::<RB, 2>(g, k, h0, x0, last),
                    (false, _) => block_stride2::<RB, 1>(g, k, h0, x0, last),
                }
                x0 += 2 * LANES;
            }
        }
    }

    /// The mask of lanes `lo .. hi` (clamped to `0 .. 16`).
    #[inline(always)]
    fn lanes(lo: isize, hi: isize) -> __mmask16 {
        let (lo, hi) = (lo.clamp(0, 16), hi.clamp(0, 16));
        if lo >= hi {
            return 0;
        }
        (((1u32 << hi) - 1) & !((1u32 << lo) - 1)) as __mmask16
    }

    /// Outputs `(h0 + i·step, x0 + 16·v + l)` for `i < RB`, `v < V`, where `step` is
    /// 1 or `dh`; the last vector stores only the lanes in `last`.
    #[inline(always)]
    unsafe fn block<const RB: usize, const V: usize>(
        g: &Geometry,
        k: &Kernel,
        h0: usize,
        step: usize,
        x0: usize,
        last: __mmask16,
    ) {
        // Per kernel column and vector: the first input column read, and the lanes
        // that read inside the input (the others read padding: zero).
        let mut cols = [[(0isize, 0 as __mmask16); V]; MAX_KW];
        for (c, cv) in cols.iter_mut().enumerate().take(k.kw) {
            for (v, cm) in cv.iter_mut().enumerate() {
                let lo = (x0 + v * LANES + c * k.dw) as isize - g.left;
                *cm = (lo, lanes(-lo, g.iw - lo));
            }
        }
        let mut acc = [[g.start; V]; RB];
        // SAFETY (whole body): loads are masked to columns `0 .. iw` of rows `0 .. ih`
        // or of `zeros` (masked-off lanes are not accessed, so their addresses may lie outside the
        // input); stores go to rows below `oh` and lanes below `ow`.
        unsafe {
            // Input rows `q` apart: `dh` when the block's rows are, else 1.
            let q = if step == k.dh { k.dh } else { 1 };
            for j in 0..((RB - 1) * step + (k.kh - 1) * k.dh) / q + 1 {
                let r = (h0 + j * q) as isize - g.top;
                let row = if r >= 0 && r < g.ih {
                    g.x.wrapping_offset(r * g.iw)
                } else {
                    g.zeros
                };
                for (c, cv) in cols.iter().enumerate().take(k.kw) {
                    let xs: [__m512; V] = std::array::from_fn(|v| {
                        let (lo, m) = cv[v];
                        _mm512_maskz_loadu_ps(m, row.wrapping_offset(lo))
                    });
                    // Input row `j` is kernel row `b` of output row `i` when
                    // `j·q = i·step + b·dh`; with `j` rising, each output's taps
                    // come in (b, c) order. Rows and columns in the padding add
                    // `w·0`, as the per-row path over the zero-padded copy does.
                    for (i, sums) in acc.iter_mut().enumerate() {
                        let Some(d) = (j * q).checked_sub(i * step) else {
                            continue;
                        };
                        if d % k.dh != 0 || d / k.dh >= k.kh {
                            continue;
                        }
                        let wv = k.w[d / k.dh * k.kw + c];
                        for (s, &x) in sums.iter_mut().zip(&xs) {
                            *s = _mm512_fmadd_ps(wv, x, *s);
                        }
                    }
                }
            }
            for (i, sums) in acc.iter().enumerate() {
                let dst = g.out.add((h0 + i * step) * g.ow + x0);
                for (v, &s) in sums.iter().enumerate() {
                    if v + 1 < V {
                        _mm512_storeu_ps(dst.add(v * LANES), s);
                    } else {
                        _mm512_mask_storeu_ps(dst.add(v * LANES), last, s);
                    }
                }
            }
        }
    }

    /// [`block`] at stride 2. Tap column `c` of output `x` reads input column `2·x +
    /// c·dw - left`: column phase `c·dw % 2`, shifted by `c·dw / 2` outputs. Each
    /// input row is loaded once per block, split into its even and odd columns in
    /// registers, and every tap takes its vectors from the phase it reads (the split
    /// into phase planes in memory, which this replaces, took half of a stride-2
    /// conv's time).
    #[inline(always)]
    unsafe fn block_stride2<const RB: usize, const V: usize>(
        g: &Geometry,
        k: &Kernel,
        h0: usize,
        x0: usize,
        last: __mmask16,
    ) {
        // Input vector `u` of a row holds columns `first + 16·u ..`; the pairs
        // `2·v, 2·v + 1` give output vector `v`'s phases, and pair `V` the columns
        // a shifted tap reads past the block's last output.
        let first = 2 * x0 as isize - g.left;
        let mut masks = [[(0isize, 0 as __mmask16); 2]; 3];
        for (u, pair) in masks.iter_mut().enumerate() {
            for (half, m) in pair.iter_mut().enumerate() {
                let lo = first + ((2 * u + half) * LANES) as isize;
                *m = (lo, lanes(-lo, g.iw - lo));
            }
        }
        let shifted = (k.kw - 1) * k.dw >= 2;
        let mut acc = [[g.start; V]; RB];
        // SAFETY (whole body): loads are masked to columns `0 .. iw` of rows `0 .. ih`
        // or of `zeros`; stores go to rows below `oh` and lanes below `ow`.
        unsafe {
            let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
            let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
            for j in 0..2 * (RB - 1) + (k.kh - 1) * k.dh + 1 {
                let r = (2 * h0 + j) as isize - g.top;
                let row = if r >= 0 && r < g.ih {
                    g.x.wrapping_offset(r * g.iw)
                } else {
                    g.zeros
                };
                // phase[p][u]: columns `first + 32·u + 2·l + p` for lanes `l`.
                let mut phase = [[_mm512_setzero_ps(); 3]; 2];
                for (u, &[(lo_a, m_a), (lo_b, m_b)]) in
                    masks.iter().enumerate().take(V + shifted as usize)
                {
                    let a = _mm512_maskz_loadu_ps(m_a, row.wrapping_offset(lo_a));
                    let b = _mm512_maskz_loadu_ps(m_b, row.wrapping_offset(lo_b));
                    phase[0][u] = _mm512_permutex2var_ps(a, even, b);
                    phase[1][u] = _mm512_permutex2var_ps(a, odd, b);
                }
                for c in 0..k.kw {
                    let (p, q) = (c * k.dw % 2, c * k.dw / 2);
                    // Loops, not closures: a closure would not inherit AVX-512 and
                    // the intrinsics in it would become calls.
                    let mut xs = [_mm512_setzero_ps(); V];
                    for (v, x) in xs.iter_mut().enumerate() {
                        *x = shift(phase[p][v], phase[p][v + 1], q);
                    }
                    // Input row `j` is kernel row `b` of output row `i` when
                    // `j = 2·i + b·dh`; with `j` rising, each output's taps come in
                    // (b, c) order.
                    for (i, sums) in acc.iter_mut().enumerate() {
                        let Some(d) = j.checked_sub(2 * i) else {
                            continue;
                        };
                        if d % k.dh != 0 || d / k.dh >= k.kh {
                            continue;
                        }
                        let wv = k.w[d / k.dh * k.kw + c];
                        for (s, &x) in sums.iter_mut().zip(&xs) {
                            *s = _mm512_fmadd_ps(wv, x, *s);
                        }
                    }
                }
            }
            for (i, sums) in acc.iter().enumerate() {
                let dst = g.out.add((h0 + i) * g.ow + x0);
                for (v, &s) in sums.iter().enumerate() {
                    if v + 1 < V {
                        _mm512_storeu_ps(dst.add(v * LANES), s);
                    } else {
                        _mm512_mask_storeu_ps(dst.add(v * LANES), last, s);
                    }
                }
            }
        }
    }

    /// Lanes `q .. q + 16` of `lo` followed by `hi` (`q < 16`).
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[inline(always)]
    unsafe fn shift(lo: __m512, hi: __m512, q: usize) -> __m512 {
        macro_rules! align {
            ($($q:literal)*) => {
                match q {
                    0 => lo,
                    // SAFETY: AVX-512F (the caller's promise).
                    $($q => unsafe {
                        let (l, h) = (_mm512_castps_si512(lo), _mm512_castps_si512(hi));
                        _mm512_castsi512_ps(_mm512_alignr_epi32::<$q>(h, l))
                    },)*
                    _ => unreachable!("shift of {q} lanes"),
                }
            };
        }
        align!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every output is the bias plus its taps in (kernel row, kernel column) order,
    /// one fused multiply-add each, padding as `w·0`: bit for bit what the per-row
    /// path over a zero-padded copy gives. At stride 1 over kernels of 1x1 to 7x7,
    /// dilations 1 to 3, pads 0 to 3 and planes from one row to more than a block of
    /// rows, whose widths end on and off a 16- and 32-column block.
    #[test]
    fn sums_match_fused_taps_in_order() {
        let kernels = [(1, 1), (3, 3), (5, 5), (7, 7), (3, 1), (1, 5), (2, 3)];
        let dilations = [(1, 1), (2, 2), (3, 1)];
        let inputs = [(1, 18), (5, 16), (9, 33), (11, 47), (6, 64)];
        check_planes(1, &kernels, &dilations, &inputs, 7);
    }

    /// The same at stride 2, over kernels whose taps shift a column phase by 0 to 9
    /// lanes.
    #[test]
    fn stride2_sums_match_fused_taps_in_order() {
        let kernels = [(1, 1), (3, 3), (5, 5), (7, 7), (2, 3), (3, 2)];
        let dilations = [(1, 1), (2, 2), (1, 3)];
        let inputs = [(2, 36), (9, 33), (6, 64), (13, 70), (17, 95)];
        check_planes(2, &kernels, &dilations, &inputs, 11);
    }

    /// [`plane`] at `stride` against the fused taps in order, over every kernel,
    /// dilation and input size given and pads `(0, 0)`, `(1, 1)`, `(2, 3)`, `(3, 0)`
    /// (planes with fewer than 16 outputs per row are skipped).
    fn check_planes(
        stride: usize,
        kernels: &[(usize, usize)],
        dilations: &[(usize, usize)],
        inputs: &[(usize, usize)],
        seed: u32,
    ) {
        if !fits(16, 1, 1, 1, stride) {
            eprintln!("dw_rows tests at stride {stride} SKIPPED: no AVX-512");
            return;
        }
        let mut seed = seed;
        let mut next = move || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1 << 24) as f32 - 0.5
        };
        // Outputs along an axis of `n` values padded by `pad` on both sides.
        let outputs = |n: usize, pad: usize, k: usize, d: usize| {
            (n + 2 * pad)
                .checked_sub((k - 1) * d + 1)
                .map(|span| span / stride + 1)
        };
        let mut cases = 0;
        for &(kh, kw) in kernels {
            for &(dh, dw) in dilations {
                for (top, left) in [(0usize, 0usize), (1, 1), (2, 3), (3, 0)] {
                    for &(ih, iw) in inputs {
                        let (Some(oh), Some(ow)) =
                            (outputs(ih, top, kh, dh), outputs(iw, left, kw, dw))
                        else {
                            continue;
                        };
                        if ow < 16 {
                            continue;
                        }
                        let x: Vec<f32> = (0..ih * iw).map(|_| next()).collect();
                        let w: Vec<f32> = (0..kh * kw).map(|_| next()).collect();
                        let start = next();
                        let zeros = vec![0.0; iw];
                        let input = Input {
                            x: &x,
                            zeros: &zeros,
                            ih,
                            iw,
                            top,
                            left,
                        };
                        let taps = Taps {
                            w: &w,
                            kh,
                            kw,
                            dh,
                            dw,
                        };
                        let mut got = vec![f32::NAN; oh * ow];
                        plane(&input, &taps, stride, start, &mut got, ow);
                        let at = |r: isize, c: isize| {
                            let inside =
                                (0..ih as isize).contains(&r) && (0..iw as isize).contains(&c);
                            if inside {
                                x[r as usize * iw + c as usize]
                            } else {
                                0.0
                            }
                        };
                        for h in 0..oh {
                            for j in 0..ow {
                                let mut want = start;
                                for b in 0..kh {
                                    for c in 0..kw {
                                        let r = (stride * h + b * dh) as isize - top as isize;
                                        let cc = (stride * j + c * dw) as isize - left as isize;
                                        want = w[b * kw + c].mul_add(at(r, cc), want);
                                    }
                                }
                                let g = got[h * ow + j];
                                assert_eq!(
                                    g.to_bits(),
                                    want.to_bits(),
                                    "stride {stride}, {kh}x{kw} dil {dh},{dw} pad {top},{left} in {ih}x{iw} at ({h}, {j}): {g} vs {want}"
                                );
                            }
                        }
                        cases += 1;
                    }
                }
            }
        }
        assert!(cases > 100, "{cases} cases at stride {stride}");
    }
}
