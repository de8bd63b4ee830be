//! Depthwise 2-D convs (one input and one output channel per group, stride 1 or 2)
//! with AVX-512, sixteen channels at a time, or with AVX2 and FMA, eight at a time.
//!
//! Per channel plane (the generic path in [`super::conv`]), a vector holds sixteen
//! positions of one row: on the 7x7 and 14x14 planes of mobile nets most of each
//! vector, and most of the time, went to row ends, the padded copy and the copy out
//! (`kernel_table`: 8-29% of the FMA peak). Here a vector holds one position of
//! sixteen channels, as in onnxruntime's NCHWc layout: a task transposes a band of
//! rows of sixteen channel planes into one buffer, position-major with the zero
//! padding in place (split into four phase planes for stride 2, so that consecutive
//! outputs read consecutive positions), sums tiles of up to sixteen outputs of a row
//! (two rows of eight or fewer) in registers, transposes each tile back and stores
//! every channel's run of outputs.
//!
//! With AVX2 a tile is eight consecutive *outputs* (each with its own position in the
//! buffer), not eight consecutive positions: positions between output rows (a 5x5
//! kernel on a 7x7 map pads rows to 11) are not summed.
//!
//! Each output is `start + Σ_taps w·x` over all taps in (row, column) order, padding
//! taps included as `w·0`, with fused multiply-adds: the sums of the per-plane path
//! for these geometries, bit for bit.

use rayon::prelude::*;

use super::window::Win3;

/// Channels per block with AVX-512: one vector of f32.
const LANES: usize = 16;
/// Bytes of a task's band buffer at most (halo rows included), which sets how many
/// output rows a task covers: 1024 positions of sixteen channels, 2048 of eight.
/// Fixed, so tasks never depend on threads.
const BAND_BYTES: usize = 64 << 10;
/// Multiply-adds below which a conv runs on the calling thread.
const SERIAL_WORK: usize = 1 << 18;

/// Whether [`conv`] runs this geometry here: the CPU has AVX-512 or AVX2 and FMA (the
/// conv ISA), the conv is 2-D with stride 1 or 2 and no negative padding, and it runs
/// faster here than per plane.
///
/// With AVX-512, the two transposes cost about as much as a 3x3 kernel's arithmetic,
/// which pays on small planes, whose rows fill vectors badly per plane, and on 5x5
/// and larger kernels. `kernel_table` (least of 20 runs, ms, per plane -> here): 3x3
/// at 7x7 0.10 -> 0.053, 5x5 at 14x14 0.20-0.25 -> 0.17, 5x5 at 28x28 0.22-0.26 ->
/// 0.20, 7x7 at 56x56 0.60-0.70 -> 0.52, 3x3 stride 2 to 28x28 0.14-0.19 -> 0.155; but
/// 3x3 at 56x56 0.26-0.33 -> 0.30, 3x3 stride 2 to 56x56 0.29-0.37 -> 0.43.
///
/// Planes 16 or more outputs wide went faster still per plane once that path summed
/// several output rows per load (`super::dw_rows`, AVX-512 only), except 5x5 and
/// larger kernels of stride 1 on planes up to 28 wide: `kernel_table` ms, here ->
/// there: 3x3 stride 2 to 28x28 0.16 -> 0.13, 3x3 at 28x28 0.10 -> 0.072, 5x5 stride 2
/// to 28x28 0.125 -> 0.099, 7x7 at 56x56 0.52 -> 0.48; but 5x5 at 28x28 0.20 -> 0.23.
///
/// With AVX2 (a Zen 3) every such geometry runs here: `kernel_table _dw`, median of
/// 5 alternating rounds against the per-plane path, 0.51-0.54 on 7x7 maps, 0.73-0.83
/// on 14x14, 0.41-0.74 for stride 2 to 28x28 and 14x14, 0.81-0.87 for 5x5 and 7x7
/// kernels at 28x28 and 56x56, 0.88-0.89 for stride 2 from 112x112, 1.00-1.03 for
/// 3x3 at 28x28 and 56x56.
pub(crate) fn fits(g: &Win3) -> bool {
    let Some(lanes) = lanes() else {
        return false;
    };
    let structural = runs(g);
    if lanes == 8 {
        return structural;
    }
    #[cfg(target_arch = "x86_64")]
    let rows_fit = super::dw_rows::fits(g.out[2], g.k_vol(), g.kernel[2], g.dil[2], g.stride[2]);
    #[cfg(not(target_arch = "x86_64"))]
    let rows_fit = false;
    structural
        && (g.out_vol() <= 28 * 28 || g.k_vol() >= 25)
        // `dw_rows` takes planes 16+ wide, but for 5x5+ kernels of stride 1 up to 28.
        && (!rows_fit || (g.k_vol() >= 25 && g.out[2] <= 28 && g.stride[2] == 1))
}

/// Whether [`conv`] can run this geometry (whether it is faster than the per-plane
/// path is [`fits`]'s question): the CPU has AVX-512 or AVX2 and FMA, the conv is 2-D
/// with stride 1 or 2 and no negative padding.
fn runs(g: &Win3) -> bool {
    lanes().is_some()
        && g.input[0] == 1
        && g.out[0] == 1
        && g.kernel[0] == 1
        && (g.stride == [1, 1, 1] || g.stride == [1, 2, 2])
        && g.pad.iter().all(|&p| p >= 0)
}

/// Channels per block, one vector of f32: 16 with AVX-512, 8 with AVX2 and FMA; none
/// elsewhere.
fn lanes() -> Option<usize> {
    match crate::cpu::conv_isa() {
        Some(crate::cpu::Isa::Avx512) => Some(16),
        Some(crate::cpu::Isa::Avx2Fma) => Some(8),
        None => None,
    }
}

/// The band buffer's geometry: phase planes of `rows × width` positions.
struct Bands {
    /// Stride (1 or 2): phase planes per axis.
    s: usize,
    /// Output rows per band.
    rows_per_band: usize,
    /// Positions per phase-plane row (the padded width divided by the stride).
    width: usize,
    /// Each tap's offset in positions from a flat output's first tap.
    taps: Vec<usize>,
}

impl Bands {
    fn new(g: &Win3, lanes: usize) -> Bands {
        let s = g.stride[2];
        let [_, _, ow] = g.out;
        let [_, kh, kw] = g.kernel;
        let [_, dh, dw] = g.dil;
        let ew = (ow - 1) * s + (kw - 1) * dw + 1;
        let width = ew.div_ceil(s);
        // As many output rows as keep the buffer within `BAND_BYTES`.
        let most = BAND_BYTES / (lanes * size_of::<f32>());
        let mut rows_per_band = 1;
        while rows_per_band < g.out[1]
            && s * s * Self::phase_rows(g, s, rows_per_band + 1) * width <= most
        {
            rows_per_band += 1;
        }
        let rows = Self::phase_rows(g, s, rows_per_band);
        let taps = (0..kh)
            .flat_map(|a| (0..kw).map(move |b| (a * dh, b * dw)))
            .map(|(a, b)| ((a % s * s + b % s) * rows + a / s) * width + b / s)
            .collect();
        Bands {
            s,
            rows_per_band,
            width,
            taps,
        }
    }

    /// Rows of each phase plane for a band of `out_rows` output rows (every band's
    /// buffer has the first band's layout; shorter last bands leave rows unused).
    fn phase_rows(g: &Win3, s: usize, out_rows: usize) -> usize {
        ((out_rows - 1) * s + (g.kernel[1] - 1) * g.dil[1] + 1).div_ceil(s)
    }

    fn rows(&self, g: &Win3) -> usize {
        Self::phase_rows(g, self.s, self.rows_per_band)
    }

    /// The largest tap offset (taps of a later phase plane lie further on).
    fn reach(&self) -> usize {
        self.taps.iter().copied().max().unwrap_or(0)
    }

    /// A band of `out_rows` output rows as tiles of eight consecutive outputs (the
    /// last one shorter), with where each output's first tap lies in the band buffer:
    /// output `(o, j)` of the band at flat position `(o - o0)·width + j`.
    fn tiles(&self, g: &Win3, out_rows: usize) -> Vec<Tile> {
        let ow = g.out[2];
        let outputs = out_rows * ow;
        (0..outputs)
            .step_by(8)
            .map(|first| {
                let count = 8.min(outputs - first);
                // Lanes past `count` repeat the last output (summed and dropped).
                let at = std::array::from_fn(|j| {
                    let o = first + j.min(count - 1);
                    (o / ow * self.width + o % ow) as u32
                });
                // Positions rise with the outputs, so eight of them spanning eight
                // positions are consecutive.
                let consecutive = count == 8 && at[7] == at[0] + 7;
                Tile {
                    first,
                    count,
                    at,
                    consecutive,
                }
            })
            .collect()
    }

    /// Positions in a band buffer, with slack for the last tile's extra positions
    /// (a tile is as many positions as a block has channels).
    fn len(&self, g: &Win3, lanes: usize) -> usize {
        self.s * self.s * self.rows(g) * self.width + self.reach() + 2 * lanes
    }
}

/// Eight consecutive outputs of a band (fewer at its end), for the AVX2 kernel.
#[derive(Clone, Copy, Debug)]
struct Tile {
    /// Its first output, counted from the band's first.
    first: usize,
    /// How many outputs it holds.
    count: usize,
    /// Each output's flat position in the band buffer.
    at: [u32; 8],
    /// Whether those are eight consecutive positions.
    consecutive: bool,
}

/// A depthwise conv's weights `[c, 1, kh, kw]` (`k_vol` taps per channel) for
/// [`conv`]: per block of channels, tap-major, one lane per channel (zero past `c`).
pub(crate) fn pack_weights(w: &[f32], c: usize, k_vol: usize) -> Vec<f32> {
    let lanes = lanes().expect("`fits` holds only with AVX2 or AVX-512");
    let mut wb = vec![0.0f32; c.div_ceil(lanes) * k_vol * lanes];
    for (ch, taps) in w.chunks_exact(k_vol).take(c).enumerate() {
        let (blk, lane) = (ch / lanes, ch % lanes);
        for (t, &v) in taps.iter().enumerate() {
            wb[(blk * k_vol + t) * lanes + lane] = v;
        }
    }
    wb
}

/// Whether [`conv`] can run this geometry on channel-blocked data (see
/// [`super::blocked`]): with AVX-512, on any geometry it runs, since it reads and
/// stores blocked values without the transposes that [`fits`] weighs.
pub(crate) fn runs_blocked(g: &Win3, c: usize) -> bool {
    lanes() == Some(LANES) && runs(g) && c.is_multiple_of(LANES)
}

/// `y = conv(x, w) + bias` for f32 data of `n` images of `c` channels, one per
/// group, with weights `[c, 1, kh, kw]` packed by [`pack_weights`]: NCHW, or blocked
/// input and/or output as `layouts` says (the caller checks [`runs_blocked`] then; the
/// buffer is then filled by plain copies and tiles are stored as they are, without
/// transposes: the same sums). Tasks are (image, block of channels, band of output
/// rows), fixed by the shapes. The caller checks [`fits`] or [`runs_blocked`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv(
    x: &[f32],
    wb: &[f32],
    bias: Option<&[f32]>,
    y: &mut [f32],
    n: usize,
    c: usize,
    g: &Win3,
    tail: Option<&crate::fusion::Tail>,
    layouts: super::blocked::Layouts,
) {
    assert!(runs(g));
    let lanes = lanes().expect("`runs` holds only with AVX2 or AVX-512");
    let blocked = layouts.input || layouts.output;
    assert!(!blocked || runs_blocked(g, c));
    let (in_vol, out_vol, k_vol) = (g.in_vol(), g.out_vol(), g.k_vol());
    let blocks = c.div_ceil(lanes);
    assert!(x.len() >= n * c * in_vol && y.len() >= n * c * out_vol);
    assert_eq!(wb.len(), blocks * k_vol * lanes);
    let bands = Bands::new(g, lanes);
    // The bias per block, one lane per channel (zero past `c`).
    let mut bb = vec![0.0f32; blocks * lanes];
    if let Some(bias) = bias {
        bb[..c].copy_from_slice(&bias[..c]);
    }
    let n_bands = g.out[1].div_ceil(bands.rows_per_band);
    let tasks = n * blocks * n_bands;
    // The AVX2 kernel's tiles of a full band and of the last one.
    let last_rows = g.out[1] - (n_bands - 1) * bands.rows_per_band;
    let (full_tiles, last_tiles) = if lanes == 8 {
        let full = bands.tiles(g, bands.rows_per_band.min(g.out[1]));
        (full, bands.tiles(g, last_rows))
    } else {
        (Vec::new(), Vec::new())
    };
    let yp = super::gemm_util::SendPtr(y.as_mut_ptr());
    let task = |buf: &mut Vec<f32>, t: usize| {
        let band = t % n_bands;
        let blk = t / n_bands % blocks;
        let b = t / n_bands / blocks;
        let c0 = blk * lanes;
        let nch = lanes.min(c - c0);
        // The buffer is zeroed once per conv: padding columns stay zero (they are
        // padding in every band), `fill` zeroes the padding rows of each band, and
        // positions past the band's rows are read only for outputs that are dropped.
        let len = bands.len(g, lanes);
        buf.resize((len + 64 / lanes) * lanes, 0.0);
        // Positions start on cache lines (AVX-512) or halves of one (AVX2): a vector
        // split over two lines costs two accesses.
        let skip = buf.as_ptr().align_offset(64).min(16);
        let buf = &mut buf[skip..][..len * lanes];
        let o0 = band * bands.rows_per_band;
        let o1 = (o0 + bands.rows_per_band).min(g.out[1]);
        let xb = if layouts.input {
            &x[(b * blocks + blk) * in_vol * lanes..][..in_vol * lanes]
        } else {
            &x[(b * c + c0) * in_vol..][..nch * in_vol]
        };
        let yp = &yp;
        // SAFETY: `lanes` is 16 only with AVX-512 and 8 only with AVX2 and FMA (checked
        // by `fits`); the task reads channels `c0 .. c0 + nch` of image `b` (inside
        // `x`, checked above) and writes output rows `o0 .. o1` of those channels,
        // which no other task writes, inside `y`; the tail rewrites those same outputs.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            let yb = match layouts.output {
                true => yp.0.add((b * blocks + blk) * out_vol * lanes),
                false => yp.0.add((b * c + c0) * out_vol),
            };
            let wt = &wb[blk * k_vol * lanes..][..k_vol * lanes];
            let start = &bb[c0..c0 + lanes];
            if lanes == LANES {
                avx512::fill(xb, nch, g, &bands, o0, o1, buf, layouts.input);
                match layouts.output {
                    true => {
                        avx512::sum::<true>(buf, wt, start, &bands, g, o0, o1, nch, yb, out_vol)
                    }
                    false => {
                        avx512::sum::<false>(buf, wt, start, &bands, g, o0, o1, nch, yb, out_vol)
                    }
                }
            } else {
                avx2::fill(xb, nch, g, &bands, o0, o1, buf);
                let tiles = if band + 1 == n_bands {
                    &last_tiles
                } else {
                    &full_tiles
                };
                let y_band = yb.add(o0 * g.out[2]);
                avx2::sum(
                    buf,
                    wt,
                    start,
                    &bands,
                    tiles,
                    (o1 - o0) * g.out[2],
                    nch,
                    y_band,
                    out_vol,
                );
            }
            if let Some(tail) = tail {
                let ow = g.out[2];
                if layouts.output {
                    // The band's outputs of the block are one run.
                    let first = ((b * blocks + blk) * out_vol + o0 * ow) * lanes;
                    let len = (o1 - o0) * ow * lanes;
                    tail.apply_runs(yp.0, first, 1, len, len);
                } else {
                    let first = (b * c + c0) * out_vol + o0 * ow;
                    tail.apply_runs(yp.0, first, nch, (o1 - o0) * ow, out_vol);
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (xb, yp, &wb, &bb, buf, o0, o1, nch, &full_tiles, &last_tiles);
            unreachable!("`fits` holds only on x86-64");
        }
    };
    if tasks == 1 || n * c * out_vol * k_vol < SERIAL_WORK || !crate::par::enabled() {
        let mut buf = Vec::new();
        (0..tasks).for_each(|t| task(&mut buf, t));
    } else {
        (0..tasks).into_par_iter().for_each_init(Vec::new, task);
    }
}

/// The 16x16 transpose of vectors (lane `j` of vector `i` to lane `i` of vector `j`),
/// which the pointwise kernel for small planes uses too.
#[cfg(target_arch = "x86_64")]
pub(crate) use avx512::transpose as transpose16;

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{Bands, LANES, Win3};

    /// Lanes `i < n` set, for `n` in `0..=16`.
    #[inline]
    fn mask(n: usize) -> __mmask16 {
        ((1u32 << n.min(16)) - 1) as __mmask16
    }

    /// Transposes 16 vectors: lane `j` of vector `i` goes to lane `i` of vector `j`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn transpose(r: &mut [__m512; 16]) {
        let mut t = [_mm512_setzero_ps(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // Lane group L of u[4i + k]: column 4L + k of rows 4i .. 4i + 4.
        let mut u = [_mm512_setzero_ps(); 16];
        for i in 0..4 {
            u[4 * i] = _mm512_shuffle_ps::<0x44>(t[4 * i], t[4 * i + 2]);
            u[4 * i + 1] = _mm512_shuffle_ps::<0xEE>(t[4 * i], t[4 * i + 2]);
            u[4 * i + 2] = _mm512_shuffle_ps::<0x44>(t[4 * i + 1], t[4 * i + 3]);
            u[4 * i + 3] = _mm512_shuffle_ps::<0xEE>(t[4 * i + 1], t[4 * i + 3]);
        }
        for k in 0..4 {
            let v0 = _mm512_shuffle_f32x4::<0x88>(u[k], u[4 + k]);
            let v1 = _mm512_shuffle_f32x4::<0xDD>(u[k], u[4 + k]);
            let v2 = _mm512_shuffle_f32x4::<0x88>(u[8 + k], u[12 + k]);
            let v3 = _mm512_shuffle_f32x4::<0xDD>(u[8 + k], u[12 + k]);
            r[k] = _mm512_shuffle_f32x4::<0x88>(v0, v2);
            r[k + 8] = _mm512_shuffle_f32x4::<0xDD>(v0, v2);
            r[k + 4] = _mm512_shuffle_f32x4::<0x88>(v1, v3);
            r[k + 12] = _mm512_shuffle_f32x4::<0xDD>(v1, v3);
        }
    }

    /// Writes the padded input rows that output rows `o0 .. o1` read into `buf` (rows
    /// in the padding as zeros; padding columns are left as the caller zeroed them):
    /// padded row `r`, column `p` of channel `l` goes to phase plane
    /// `(r % s, p % s)`, row `(r - o0·s) / s`, column `p / s`, lane `l` (zero for
    /// `l >= nch`).
    ///
    /// With `blocked`, `xb` holds one block of a blocked input (`g.input`'s positions
    /// of 16 lanes), whose rows are copied as they are.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `xb` holds `nch <= 16` channel planes of `g.input`, or
    /// with `blocked` its positions of 16 lanes.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn fill(
        xb: &[f32],
        nch: usize,
        g: &Win3,
        bands: &Bands,
        o0: usize,
        o1: usize,
        buf: &mut [f32],
        blocked: bool,
    ) {
        let [_, ih, iw] = g.input;
        let (ph, pw) = (g.pad[1] as usize, g.pad[2] as usize);
        let s = bands.s;
        let (rows, width) = (bands.rows(g), bands.width);
        let ew = width * s;
        let r0 = o0 * s;
        let r1 = (o1 - 1) * s + (g.kernel[1] - 1) * g.dil[1] + 1;
        let in_vol = g.input[1] * iw;
        // Input columns that land inside the padded width.
        let cols = iw.min(ew.saturating_sub(pw));
        assert!(!blocked || xb.len() >= ih * iw * LANES);
        let zero = _mm512_setzero_ps();
        for r in r0..r1 {
            let rr = r - r0;
            // Position `p` of this row in `buf` (`s` is 1 or 2: shifts and masks, where
            // divisions took most of the time).
            let (rphase, rrow) = (rr & (s - 1), rr >> (s - 1));
            let at =
                |p: usize| ((rphase * s + (p & (s - 1))) * rows + rrow) * width + (p >> (s - 1));
            // SAFETY (stores below): `rr / s < rows` and `p / s < width` for `p < ew`,
            // inside `buf`.
            let put = |buf: &mut [f32], p: usize, v: __m512| unsafe {
                _mm512_storeu_ps(buf.as_mut_ptr().add(at(p) * LANES), v)
            };
            let Some(h) = r.checked_sub(ph).filter(|&h| h < ih) else {
                for p in 0..ew {
                    put(buf, p, zero);
                }
                continue;
            };
            if blocked {
                let src = &xb[h * iw * LANES..][..cols * LANES];
                if s == 1 {
                    let at0 = at(pw) * LANES;
                    buf[at0..at0 + cols * LANES].copy_from_slice(src);
                } else {
                    for (w, v) in src.chunks_exact(LANES).enumerate() {
                        // SAFETY: 16 values of `xb`, as this function's caller vouched.
                        put(buf, w + pw, unsafe { _mm512_loadu_ps(v.as_ptr()) });
                    }
                }
                continue;
            }
            for w0 in (0..cols).step_by(LANES) {
                let len = LANES.min(cols - w0);
                let mut v = [zero; 16];
                for (l, v) in v.iter_mut().enumerate().take(nch) {
                    // SAFETY: `len` values of row `h` of channel `l`, from column `w0`.
                    *v = unsafe {
                        _mm512_maskz_loadu_ps(mask(len), xb.as_ptr().add(l * in_vol + h * iw + w0))
                    };
                }
                // SAFETY: AVX-512F, as this function's caller vouched.
                unsafe { transpose(&mut v) };
                for (j, &v) in v.iter().enumerate().take(len) {
                    put(buf, w0 + j + pw, v);
                }
            }
        }
    }

    /// Sums output rows `o0 .. o1` from the band buffer and stores channel `l < nch`'s
    /// outputs at `y + l·out_vol`, or with `BLOCKED` each output's 16 lanes at
    /// `y + 16·output` (a block of a blocked output).
    ///
    /// A tile is a run of up to 16 outputs of one row (rows wider than 16 in runs of
    /// equal length), or two rows of 8 or fewer: output `(o, j)` reads the band
    /// from flat position `(o - o0)·width + j`, and the positions past a row's end
    /// (`width - ow` of them, 4 of every 18 for a 5x5 kernel on a 14x14 map, 4 of 11
    /// for a 5x5 kernel at 7x7) are not summed. The tiles of 16 consecutive positions
    /// that this replaced summed them and dropped them: 256 sums for 196 outputs at
    /// 14x14, 80 for 49 at 7x7. A tile's outputs of one channel are one run, stored
    /// under a mask.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `buf` was filled by [`fill`] for this band; `y` points to
    /// `nch` output planes of `out_vol` values (with `BLOCKED` a block's `out_vol`
    /// positions of 16 lanes), whose rows `o0 .. o1` nothing else accesses during the
    /// call.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn sum<const BLOCKED: bool>(
        buf: &[f32],
        wt: &[f32],
        start: &[f32],
        bands: &Bands,
        g: &Win3,
        o0: usize,
        o1: usize,
        nch: usize,
        y: *mut f32,
        out_vol: usize,
    ) {
        let ow = g.out[2];
        let width = bands.width;
        // The last output's position, and the reach of its taps.
        let last = (o1 - o0 - 1) * width + ow;
        assert!((last + bands.reach()) * LANES <= buf.len());
        assert!(wt.len() == bands.taps.len() * LANES && start.len() == LANES);
        // SAFETY (whole body): reads of `buf` stay below the bound asserted above; the
        // stores write outputs of rows `o0 .. o1` of channels below `nch`.
        unsafe {
            let bias = _mm512_loadu_ps(start.as_ptr());
            // Rows of 8 outputs or fewer go two to a tile.
            let pair = ow <= LANES / 2;
            // Rows wider than 16 split into runs of equal length (20 into 10 and 10,
            // not 16 and 4), each with as many independent sums as can be.
            let step = ow.div_ceil(ow.div_ceil(LANES));
            let mut o = o0;
            while o < o1 {
                let rows = if pair && o + 1 < o1 { 2 } else { 1 };
                for c0 in (0..ow).step_by(step) {
                    let len = step.min(ow - c0);
                    let p = buf.as_ptr().add(((o - o0) * width + c0) * LANES);
                    let mut acc = sums(len, rows, p, width, &bands.taps, wt.as_ptr(), bias);
                    // Two rows are whole rows: their outputs are one run too.
                    let (first, count) = (o * ow + c0, len * rows);
                    if BLOCKED {
                        for (j, a) in acc.iter().enumerate().take(count) {
                            _mm512_storeu_ps(y.add((first + j) * LANES), *a);
                        }
                        continue;
                    }
                    transpose(&mut acc);
                    for (l, &a) in acc.iter().enumerate().take(nch) {
                        _mm512_mask_storeu_ps(y.add(l * out_vol + first), mask(count), a);
                    }
                }
                o += rows;
            }
        }
    }

    /// The sums of a tile of `rows` (1, or 2 for `len <= 8`) runs of `len <= 16`
    /// consecutive positions, the first from `p` and the second `width` positions
    /// further (lanes past them hold `start`): each `start + Σ_taps w·x` in tap order.
    /// The counts are constants of each copy of [`sums_of`], so that its sums stay in
    /// registers.
    ///
    /// # Safety
    /// The CPU has AVX-512F; every position of the tile plus every tap's offset lies
    /// inside the band buffer, 16 lanes each; `wt` holds 16 lanes per tap.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn sums(
        len: usize,
        rows: usize,
        p: *const f32,
        width: usize,
        taps: &[usize],
        wt: *const f32,
        start: __m512,
    ) -> [__m512; 16] {
        macro_rules! by_len {
            ($rows:literal; $($n:literal)*) => {
                match len {
                    // SAFETY: as this function's caller vouched.
                    $($n => unsafe { sums_of::<$n, $rows>(p, width, taps, wt, start) },)*
                    _ => unreachable!("a tile holds 1 to 16 outputs"),
                }
            };
        }
        match rows {
            1 => by_len!(1; 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16),
            _ => by_len!(2; 1 2 3 4 5 6 7 8),
        }
    }

    /// [`sums`] for `R` runs of `N` positions.
    ///
    /// # Safety
    /// As [`sums`].
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn sums_of<const N: usize, const R: usize>(
        p: *const f32,
        width: usize,
        taps: &[usize],
        wt: *const f32,
        start: __m512,
    ) -> [__m512; 16] {
        let mut acc = [start; 16];
        // SAFETY: as the caller vouched.
        unsafe {
            for (t, &off) in taps.iter().enumerate() {
                let wv = _mm512_loadu_ps(wt.add(t * LANES));
                for r in 0..R {
                    let q = p.add((off + r * width) * LANES);
                    for j in 0..N {
                        let a = &mut acc[r * N + j];
                        *a = _mm512_fmadd_ps(wv, _mm512_loadu_ps(q.add(j * LANES)), *a);
                    }
                }
            }
        }
        acc
    }
}

/// The same kernel with AVX2 and FMA: eight channels per block and tiles of eight
/// consecutive outputs ([`Tile`]; eight sums in flight, as many as two FMA units
/// with four cycles of latency keep busy).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::super::channel_lanes::transpose8;
    use super::{Bands, Tile, Win3};

    const LANES: usize = 8;

    /// [`super::avx512::fill`] with eight lanes.
    ///
    /// # Safety
    /// The CPU has AVX2; `xb` holds `nch <= 8` channel planes of `g.input`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn fill(
        xb: &[f32],
        nch: usize,
        g: &Win3,
        bands: &Bands,
        o0: usize,
        o1: usize,
        buf: &mut [f32],
    ) {
        // SAFETY: as this function's caller vouches.
        unsafe {
            if bands.s == 1 {
                fill_phases::<1>(xb, nch, g, bands, o0, o1, buf);
            } else {
                fill_phases::<2>(xb, nch, g, bands, o0, o1, buf);
            }
        }
    }

    /// [`fill`] for stride `S`.
    ///
    /// # Safety
    /// As for [`fill`].
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn fill_phases<const S: usize>(
        xb: &[f32],
        nch: usize,
        g: &Win3,
        bands: &Bands,
        o0: usize,
        o1: usize,
        buf: &mut [f32],
    ) {
        let [_, ih, iw] = g.input;
        let (ph, pw) = (g.pad[1] as usize, g.pad[2] as usize);
        let (rows, width) = (bands.rows(g), bands.width);
        let ew = width * S;
        let r0 = o0 * S;
        let r1 = (o1 - 1) * S + (g.kernel[1] - 1) * g.dil[1] + 1;
        let in_vol = g.input[1] * iw;
        let cols = iw.min(ew.saturating_sub(pw));
        assert!(xb.len() >= nch * in_vol && nch <= LANES && bands.s == S);
        assert!(buf.len() >= S * S * rows * width * LANES);
        let zero = _mm256_setzero_ps();
        let dst = buf.as_mut_ptr();
        // Whether a full vector of every channel's row can be read from column `w0`
        // on (the lanes past the row read the next row or plane, and are dropped).
        let whole = |h: usize, w0: usize| {
            nch == LANES && (LANES - 1) * in_vol + h * iw + w0 + LANES <= xb.len()
        };
        for r in r0..r1 {
            let rr = r - r0;
            // Padded column `p` goes to phase plane `(rr % S, p % S)`, row `rr / S`,
            // column `p / S`: `at[p % S] + p / S`.
            let at: [usize; S] =
                std::array::from_fn(|pc| ((rr % S * S + pc) * rows + rr / S) * width);
            // SAFETY (stores below): `rr / S < rows` and `p / S < width` for `p < ew`,
            // inside `buf` (asserted above).
            let put = |p: usize, v: __m256| unsafe {
                _mm256_storeu_ps(dst.add((at[p % S] + p / S) * LANES), v)
            };
            let Some(h) = r.checked_sub(ph).filter(|&h| h < ih) else {
                for p in 0..ew {
                    put(p, zero);
                }
                continue;
            };
            for w0 in (0..cols).step_by(LANES) {
                let len = LANES.min(cols - w0);
                let src = xb.as_ptr().wrapping_add(h * iw + w0);
                let mut v = [zero; LANES];
                if whole(h, w0) {
                    for (l, v) in v.iter_mut().enumerate() {
                        // SAFETY: eight values from `src + l·in_vol`, inside `xb`.
                        *v = unsafe { _mm256_loadu_ps(src.add(l * in_vol)) };
                    }
                } else {
                    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                    let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(len as i32), lane);
                    for (l, v) in v.iter_mut().enumerate().take(nch) {
                        // SAFETY: `len` values of row `h` of channel `l` from column
                        // `w0` (`w0 + len <= iw`), inside `xb`.
                        *v = unsafe { _mm256_maskload_ps(src.add(l * in_vol), mask) };
                    }
                }
                transpose8(&mut v);
                if len == LANES {
                    for (j, &v) in v.iter().enumerate() {
                        put(w0 + pw + j, v);
                    }
                } else {
                    for (j, &v) in v.iter().enumerate().take(len) {
                        put(w0 + pw + j, v);
                    }
                }
            }
        }
    }

    /// Sums a band's `tiles` from the band buffer and stores channel `l < nch`'s
    /// outputs at `y + l·out_vol` (`y` points to the band's first output, `band_len`
    /// outputs per channel).
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `buf` was filled by [`fill`] for this band and `tiles`
    /// are its tiles; `y` points to `nch` runs of `band_len` outputs, `out_vol` apart,
    /// that nothing else accesses during the call.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn sum(
        buf: &[f32],
        wt: &[f32],
        start: &[f32],
        bands: &Bands,
        tiles: &[Tile],
        band_len: usize,
        nch: usize,
        y: *mut f32,
        out_vol: usize,
    ) {
        let last = tiles.iter().flat_map(|t| t.at).max().unwrap_or(0) as usize;
        assert!((last + 1 + bands.reach()) * LANES <= buf.len());
        assert!(wt.len() == bands.taps.len() * LANES && start.len() == LANES);
        assert!(tiles.iter().all(|t| t.first + t.count <= band_len));
        // SAFETY (whole body): reads of `buf` stay below the bound asserted above; the
        // stores write the band's outputs of channels below `nch`.
        unsafe {
            let bias = _mm256_loadu_ps(start.as_ptr());
            for tile in tiles {
                let mut acc = [bias; LANES];
                if tile.consecutive {
                    // Consecutive positions: one pointer, fixed offsets.
                    for (t, &off) in bands.taps.iter().enumerate() {
                        let wv = _mm256_loadu_ps(wt.as_ptr().add(t * LANES));
                        let p = buf.as_ptr().add((tile.at[0] as usize + off) * LANES);
                        for (j, a) in acc.iter_mut().enumerate() {
                            *a = _mm256_fmadd_ps(wv, _mm256_loadu_ps(p.add(j * LANES)), *a);
                        }
                    }
                } else {
                    let at = tile.at.map(|q| q as usize * LANES);
                    for (t, &off) in bands.taps.iter().enumerate() {
                        let wv = _mm256_loadu_ps(wt.as_ptr().add(t * LANES));
                        let p = buf.as_ptr().add(off * LANES);
                        for (a, &q) in acc.iter_mut().zip(&at) {
                            *a = _mm256_fmadd_ps(wv, _mm256_loadu_ps(p.add(q)), *a);
                        }
                    }
                }
                transpose8(&mut acc);
                for (l, &a) in acc.iter().enumerate().take(nch) {
                    let dst = y.add(l * out_vol + tile.first);
                    if tile.count == LANES {
                        _mm256_storeu_ps(dst, a);
                    } else {
                        let mut staged = [0.0f32; LANES];
                        _mm256_storeu_ps(staged.as_mut_ptr(), a);
                        std::ptr::copy_nonoverlapping(staged.as_ptr(), dst, tile.count);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 2-D window: input rows and columns, kernel, stride, dilation, pads (top,
    /// left, bottom, right).
    fn win(h: usize, w: usize, k: [usize; 2], s: usize, d: usize, p: [usize; 4]) -> Win3 {
        let out = |i: usize, a: usize| (i + p[a] + p[a + 2] - (k[a] - 1) * d - 1) / s + 1;
        Win3 {
            input: [1, h, w],
            out: [1, out(h, 0), out(w, 1)],
            kernel: [1, k[0], k[1]],
            stride: [1, s, s],
            dil: [1, d, d],
            pad: [0, p[0] as isize, p[1] as isize],
        }
    }

    /// Same bits as the per-plane path, on channel counts with partial blocks, several
    /// bands of rows (stride 1 and 2), dilation, uneven padding and batches.
    #[test]
    fn same_bits_as_the_per_plane_path() {
        if lanes().is_none() {
            return;
        }
        let cases = [
            // (images, channels, window)
            (2, 37, win(7, 7, [3, 3], 1, 1, [1; 4])),
            (1, 20, win(14, 14, [5, 5], 2, 1, [2; 4])),
            (1, 17, win(30, 24, [7, 7], 1, 1, [3; 4])),
            (1, 16, win(9, 11, [3, 3], 2, 2, [2, 1, 0, 2])),
            (2, 5, win(60, 26, [5, 5], 2, 1, [2; 4])),
            (1, 33, win(28, 14, [3, 3], 1, 1, [0, 1, 1, 0])),
            (1, 3, win(12, 13, [1, 5], 1, 1, [0, 2, 0, 2])),
            // Several bands of eight channels too, and tiles of eight outputs over
            // three rows of three.
            (1, 9, win(100, 40, [3, 3], 1, 1, [1; 4])),
            (1, 3, win(130, 50, [5, 5], 2, 1, [2; 4])),
            (2, 8, win(5, 3, [3, 3], 1, 1, [1; 4])),
            (1, 1, win(7, 5, [3, 3], 2, 1, [0; 4])),
        ];
        let values = super::super::conv_direct::tests::values;
        for (i, &(n, c, g)) in cases.iter().enumerate() {
            // With AVX-512 some of these run per plane in a model (see `fits`).
            assert!(runs(&g), "case {i} should run here");
            let x = values(n * c * g.in_vol(), 3 * i as u64);
            let w = values(c * g.k_vol(), 3 * i as u64 + 1);
            let bias = values(c, 3 * i as u64 + 2);
            for b in [None, Some(&bias[..])] {
                let mut want = vec![0.0f32; n * c * g.out_vol()];
                super::super::conv::depthwise(&x, &w, b, &mut want, &g, c, 1, None);
                let mut got = vec![f32::NAN; want.len()];
                conv(
                    &x,
                    &pack_weights(&w, c, g.k_vol()),
                    b,
                    &mut got,
                    n,
                    c,
                    &g,
                    None,
                    Default::default(),
                );
                for (j, (a, e)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(a.to_bits(), e.to_bits(), "case {i}, output {j}: {a} vs {e}");
                }
            }
        }
    }

    /// Blocked input, output or both: the NCHW path's bits, in their layouts; and a
    /// tail on a blocked output runs on each output once.
    #[test]
    fn blocked_layouts_give_the_same_bits() {
        use super::super::blocked::{Layouts, block_slice, unblock_slice};
        let cases = [
            (2, 32, win(7, 7, [3, 3], 1, 1, [1; 4])),
            (1, 16, win(14, 14, [3, 3], 2, 1, [0, 0, 1, 1])),
            (1, 48, win(15, 9, [5, 5], 2, 1, [2; 4])),
            (1, 16, win(40, 33, [3, 3], 1, 2, [2, 1, 0, 2])),
            (1, 32, win(1, 1, [3, 3], 1, 1, [1; 4])),
        ];
        if lanes() != Some(LANES) {
            // Blocked values are kept with AVX-512 only.
            return;
        }
        let values = super::super::conv_direct::tests::values;
        for (i, &(n, c, g)) in cases.iter().enumerate() {
            assert!(runs_blocked(&g, c), "case {i}");
            let (in_vol, out_vol) = (g.in_vol(), g.out_vol());
            let x = values(n * c * in_vol, 5 * i as u64);
            let w = pack_weights(&values(c * g.k_vol(), 5 * i as u64 + 1), c, g.k_vol());
            let bias = values(c, 5 * i as u64 + 2);
            let mut want = vec![f32::NAN; n * c * out_vol];
            conv(
                &x,
                &w,
                Some(&bias),
                &mut want,
                n,
                c,
                &g,
                None,
                Layouts::default(),
            );
            let xb = block_slice(&x, n, c, in_vol);
            for (input, output) in [(true, false), (false, true), (true, true)] {
                let layouts = Layouts {
                    input,
                    output,
                    wide: false,
                };
                let mut got = vec![f32::NAN; want.len()];
                let from = if input { &xb } else { &x };
                conv(from, &w, Some(&bias), &mut got, n, c, &g, None, layouts);
                let got = if output {
                    unblock_slice(&got, n, c, out_vol)
                } else {
                    got
                };
                for (j, (a, e)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(a.to_bits(), e.to_bits(), "case {i} {layouts:?}, output {j}");
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn transpose_moves_lane_j_of_vector_i_to_lane_i_of_vector_j() {
        use std::arch::x86_64::*;
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        let m: Vec<f32> = (0..256).map(|v| v as f32).collect();
        // SAFETY: AVX-512F was checked; loads and stores of 16 values each.
        unsafe {
            let mut r = [_mm512_setzero_ps(); 16];
            for (i, r) in r.iter_mut().enumerate() {
                *r = _mm512_loadu_ps(m.as_ptr().add(16 * i));
            }
            super::avx512::transpose(&mut r);
            let mut out = vec![0.0f32; 256];
            for (i, r) in r.iter().enumerate() {
                _mm512_storeu_ps(out.as_mut_ptr().add(16 * i), *r);
            }
            for i in 0..16 {
                for j in 0..16 {
                    assert_eq!(out[16 * j + i], m[16 * i + j], "({i}, {j})");
                }
            }
        }
    }
}
