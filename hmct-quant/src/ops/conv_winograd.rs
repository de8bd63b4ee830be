//! 3x3 stride-1 f32 convs by Winograd's minimal filtering F(2x2, 3x3): each 2x2 block
//! of outputs (a *tile*) from a 4x4 block of input with 16 multiplies per input and
//! output channel, where the direct form takes 36.
//!
//! The direct kernels run these convs at about 90% of the FMA peak, where onnxruntime
//! runs them too; fewer multiply-adds is the one way past that. The input of each tile
//! is transformed (`Bᵀ d B`) into 16 values, one per *frequency*; per frequency the
//! products over input channels are a pointwise conv of the transformed input with the
//! transformed weights (`G g Gᵀ`, made once per weight), run by the channel-lanes
//! kernel over the tiles as positions; the 16 sums of a tile are transformed back
//! (`Aᵀ m A`) into its four outputs, plus the bias. Tiles go in chunks of whole tile
//! rows, sized so that the transformed input and sums stay in cache.
//!
//! Convs with 64 or more channels on larger planes run F(4x4, 3x3) instead (see
//! [`variant`]): 4x4 outputs from 6x6 inputs, 36 multiplies per 16 outputs.
//!
//! The sums differ from the direct form's by rounding (the transforms add and
//! subtract inputs before the products and sums after them): F(2x2) within a few units
//! in the last place of the largest products (the unit test: 2.8e-7 of the sum of the
//! products' magnitudes), F(4x4), whose coefficients reach 5 and 8, within 1.3e-5 of
//! it, at a tile's last output; both far inside the tolerances against onnxruntime.
//! The order is fixed by the shapes alone, so the results do not depend on the thread
//! count, and a model's full and incremental runs, which run the same kernel on the
//! same values, give the same bits.

use rayon::prelude::*;

use super::gemm_util::{Scalar, SendPtr};
use super::window::{Win3, split_row_stride2};

/// Frequencies per tile: the 4x4 transformed input.
const FREQS: usize = 16;
/// Input channels × tiles per chunk at most, which sets the tiles of a chunk: its
/// transformed input (16 values per channel and tile, 512 KiB) and sums stay in or
/// near a core's L2 cache. Fixed, so results never depend on threads.
const CHUNK_VALUES: usize = 1 << 13;
/// Fewest tiles per chunk, so that each pointwise product has rows to fill its
/// register tiles.
const MIN_TILES: usize = 48;

/// Whether [`conv`] runs this conv: 2-D, 3x3, stride 1, no dilation, pads not negative,
/// one group, 48 or more input and output channels, and enough of them for the plane
/// ([`worth_it`]; with AVX-512 or AVX2, for the channel-lanes kernel), unless turned
/// off.
///
/// With fewer channels or outputs the transforms and fixed costs weigh more against
/// the products: `tools/ab_kernels.py` on a Zen 4 (here / the direct kernels, median
/// of 3 alternating rounds), 32->32 at 80x80 1.00, at 40x40 1.15; MTCNN O-Net's 32->64
/// at 21x21 1.07 (and its 64->64 at 8x8 0.063 against 0.049 ms per run in the model);
/// 32->64 at 80x80 0.87, 48->48 0.81; 64->64 at 14x14 0.94, 28x28 0.84,
/// 40x40 0.78; 128->128 at 14x14 0.77; ResNet-50's 3x3 at 56x56 0.74, 28x28 0.68,
/// 14x14 0.69; YOLO's 64->80 and 80->80 at 80x80 0.68, 80->80 at 40x40 0.72;
/// the PP-OCRv4 head's 96->96 at 160x160 0.67.
///
/// On the Xeon with AVX-512 of session 41, 32 channels on either side no longer pay
/// (`kernel_table --cold`, two rounds, ms, here / the direct kernels with AMX off):
/// Inception-v3's 32->64 at 147x147 5.97-6.43 / 5.85-6.02, 32->64 at 80x80 1.75-1.79 /
/// 1.63-1.71, MTCNN O-Net's 32->64 at 21x21 0.17 / 0.12, DenseNet-121's 128->32 at
/// 28x28 0.45-0.46 / 0.39-0.42 (at 56x56 a tie); with 48 they still do (48->48 at 80x80
/// 1.80-1.82 / 1.90-1.95).
pub(crate) fn fits(g: &Win3, c: usize, m: usize, group: usize) -> bool {
    group == 1
        && g.input[0] == 1
        && g.out[0] == 1
        && g.kernel == [1, 3, 3]
        && g.stride == [1; 3]
        && g.dil == [1; 3]
        && g.pad.iter().all(|&p| p >= 0)
        && c >= 48
        && m >= 48
        && worth_it(c * m, g.out_vol())
        && crate::cpu::conv_isa().is_some()
        && enabled()
}

/// Whether `pairs` input × output channel pairs on a plane of `plane` outputs save more
/// multiply-adds than the transforms and the 16 products' fixed costs take. Not on
/// planes under 144 outputs whatever the channels: there the transformed weights
/// (16 values per pair against 9) come from memory on each run and are used by few
/// tiles, and ResNet-50's 3x3 convs at 7x7 took 5.2 ms per run against the direct
/// kernels' 4.9 (`run --profile`; `kernel_table`'s warm 0.89 does not hold in the model).
fn worth_it(pairs: usize, plane: usize) -> bool {
    pairs >= 4096 && plane >= 144 || pairs >= 2048 && plane >= 1600
}

/// Whether Winograd convs are on: unless the environment variable
/// `HMCT_CONV_WINOGRAD` is `off`, for runs that must give the direct form's sums
/// (and to time the two against each other).
fn enabled() -> bool {
    mode() != Mode::Off
}

/// `HMCT_CONV_WINOGRAD`: `off` (direct convs), `f2` (F(2x2, 3x3) only), or unset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Off,
    F2,
    Both,
}

fn mode() -> Mode {
    static MODE: std::sync::OnceLock<Mode> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("HMCT_CONV_WINOGRAD").as_deref() {
        Ok("off") => Mode::Off,
        Ok("f2") => Mode::F2,
        _ => Mode::Both,
    })
}

/// The two tile sizes: F(2x2, 3x3) and F(4x4, 3x3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Variant {
    /// 2x2 outputs from 4x4 inputs: 16 products per 4 outputs.
    F2,
    /// 4x4 outputs from 6x6 inputs: 36 products per 16 outputs, with larger
    /// transform coefficients (up to 5 and 8 against 1), so larger rounding.
    F4,
}

impl Variant {
    /// Outputs per tile side.
    fn out(self) -> usize {
        match self {
            Variant::F2 => 2,
            Variant::F4 => 4,
        }
    }

    /// Frequencies per tile: the transformed input's values.
    fn freqs(self) -> usize {
        (self.out() + 2) * (self.out() + 2)
    }

    /// The variant whose weights `packed` holds (one matrix per frequency).
    fn of(packed: &[Vec<f32>]) -> Variant {
        match packed.len() {
            FREQS => Variant::F2,
            _ => Variant::F4,
        }
    }
}

/// Which variant [`conv`] runs a conv [`fits`] accepts with: F(4x4, 3x3) with 64 or
/// more input and output channels on planes of 28x28 outputs or more, unless
/// `HMCT_CONV_WINOGRAD` is `f2`.
///
/// Its transforms cost about as much as its products on 64 channels, so it pays where
/// whole tiles cover the plane. `kernel_table 3x3_` against `HMCT_CONV_WINOGRAD=f2
/// kernel_table 3x3_` on a Zen 4 (least of 10 runs, medians of 3 alternating rounds,
/// F(4x4) / F(2x2)): PP-OCRv4's 96->96 at 160x160 0.78, YOLO's 80->80 at 80x80 0.73
/// and at 40x40 0.84, 64->80 at 80x80 0.78, ResNet-50's 128->128 at 28x28 0.74, 64->64
/// at 56x56 0.78. On 14x14 (ResNet-50's 256->256) four tiles of four cover 16 columns
/// of 14: 1.10 in a scratch build that ran F(4x4) there (with half today's chunks).
pub(crate) fn variant(g: &Win3, c: usize, m: usize) -> Variant {
    if c >= 64 && m >= 64 && g.out_vol() >= 28 * 28 && mode() != Mode::F2 {
        Variant::F4
    } else {
        Variant::F2
    }
}

/// The transformed weights `U = G g Gᵀ` of `w` (`[m, c, 3, 3]`), one `[m, c]` matrix per
/// frequency, each packed for the channel-lanes kernel. The transform runs in f64, so
/// each value is rounded to f32 once, from sums far more precise than f32's.
pub(crate) fn pack_weights(w: &[f32], m: usize, c: usize, variant: Variant) -> Vec<Vec<f32>> {
    let side = variant.out() + 2;
    let mut u = vec![vec![0.0f32; m * c]; variant.freqs()];
    for (oc, g) in w.chunks_exact(9).enumerate() {
        let g: [f64; 9] = std::array::from_fn(|i| g[i] as f64);
        // G applied to a column of the kernel (a, b, c): its first `side` values.
        let gg = |a: f64, b: f64, c: f64| -> [f64; 6] {
            match variant {
                Variant::F2 => [a, (a + b + c) / 2.0, (a - b + c) / 2.0, c, 0.0, 0.0],
                Variant::F4 => [
                    a / 4.0,
                    -(a + b + c) / 6.0,
                    -(a - b + c) / 6.0,
                    a / 24.0 + b / 12.0 + c / 6.0,
                    a / 24.0 - b / 12.0 + c / 6.0,
                    c,
                ],
            }
        };
        let cols: [[f64; 6]; 3] = std::array::from_fn(|col| gg(g[col], g[3 + col], g[6 + col]));
        for i in 0..side {
            let row = gg(cols[0][i], cols[1][i], cols[2][i]);
            for (j, &v) in row[..side].iter().enumerate() {
                u[side * i + j][oc] = v as f32;
            }
        }
    }
    u.iter()
        .map(|uf| super::channel_lanes::pack_weights(uf, m, 1, c))
        .collect()
}

/// `y = conv(x, w) + bias` for f32 NCHW data of a conv [`fits`] accepts, with `packed`
/// from [`pack_weights`]; `y` is written in full and `tail` run on it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv(
    packed: &[Vec<f32>],
    x: &[f32],
    bias: Option<&[f32]>,
    y: &mut [f32],
    n: usize,
    c: usize,
    m: usize,
    g: &Win3,
    tail: Option<&crate::fusion::Tail>,
) {
    let [_, oh, ow] = g.out;
    let variant = Variant::of(packed);
    let (side, freqs) = (variant.out(), variant.freqs());
    let (th, tw) = (oh.div_ceil(side), ow.div_ceil(side));
    // F(4x4)'s chunks hold twice the transformed input of F(2x2)'s: each frequency's
    // weights, read once per chunk, then serve more tiles. `kernel_table`, F(4x4)
    // with the same size -> twice (the commit before a51674f against it): ResNet-50's
    // 64->64 at 56x56 1.54 -> 1.24 ms, 128->128 at 28x28 1.27 -> 1.07, YOLO's 64->80 at
    // 80x80 3.34 -> 2.93. A scratch build with the size as a knob: four times 1.27-1.36,
    // 1.07, 2.83; F(2x2) with twice 64->64 at 56x56 1.60 -> 1.61, 64->80 3.9 -> 4.1.
    let values = match variant {
        Variant::F2 => CHUNK_VALUES * FREQS,
        Variant::F4 => 2 * CHUNK_VALUES * FREQS,
    };
    let per_chunk = (values / freqs / c).max(MIN_TILES);
    // The tile rows in chunks of as equal sizes as can be: ResNet-50's 7 rows of tiles
    // at 14x14 ran as chunks of 6 and 1, the second reading all the transformed weights
    // (4 MiB for 256->256) for 8 slots. `kernel_table r50_3x3_256_14`, two alternating
    // rounds: 1.37-1.69 -> 1.18-1.28 ms; `tools/ab_classes.sh` on ResNet-50, its six
    // 3x3 convs at 14x14 9.06 -> 8.19 ms per run.
    let most_rows = per_chunk.div_ceil(tw + 1).clamp(1, th);
    let chunk_rows = crate::par::even_chunk(th, most_rows, n);
    let chunks = th.div_ceil(chunk_rows);
    assert!(x.len() >= n * c * g.in_vol() && y.len() >= n * m * g.out_vol());
    let yp = SendPtr(y.as_mut_ptr());
    let task = |t: usize| {
        let yp = &yp;
        let (b, k) = (t / chunks, t % chunks);
        let rows = k * chunk_rows..((k + 1) * chunk_rows).min(th);
        // Each row of tiles takes `tw + 1` slots, the last a tile past the output
        // whose sums are dropped: then the transforms run over the chunk's slots in
        // one stretch, where per row of 7 or 14 tiles their loops were mostly the
        // remainder of a vector (MTCNN O-Net's 32->64 conv at 21x21 ran 1.6x slower
        // than the direct conv).
        let slots = rows.len() * (tw + 1);
        let xb = &x[b * c * g.in_vol()..][..c * g.in_vol()];
        let mut v = crate::buffers::take::<f32>(freqs * c * slots);
        let mut sums = crate::buffers::take::<f32>(freqs * m * slots);
        let tiles = TileRows {
            rows: rows.clone(),
            phase: tw + 1,
        };
        match variant {
            Variant::F2 => transform_input(xb, c, g, &tiles, &mut v),
            Variant::F4 => transform_input4(xb, c, g, &tiles, &mut v),
        }
        let pointwise = Win3 {
            input: [1, 1, slots],
            out: [1, 1, slots],
            kernel: [1; 3],
            stride: [1; 3],
            dil: [1; 3],
            pad: [0; 3],
        };
        for f in 0..freqs {
            let (vf, sf) = (
                &v[f * c * slots..][..c * slots],
                &mut sums[f * m * slots..][..m * slots],
            );
            let layouts = super::blocked::Layouts::default();
            super::channel_lanes::conv(
                &packed[f], vf, None, sf, 1, c, m, 1, &pointwise, None, layouts,
            );
        }
        // Output rows of the chunk's tiles, in each channel plane of image b.
        let out_rows = side * rows.start..(side * rows.end).min(oh);
        let first = (b * m) * g.out_vol() + out_rows.start * ow;
        // SAFETY: output rows `out_rows` of every channel of image `b` belong to this
        // task alone (tasks split images and tile rows), inside `y` (checked above).
        unsafe {
            let out = yp.0.add(first);
            let (out_vol, n_rows) = (g.out_vol(), out_rows.len());
            transform_output(variant, &sums, m, slots, tw, bias, ow, out_vol, n_rows, out);
        };
        if let Some(tail) = tail {
            // SAFETY: the same outputs, this task's alone.
            unsafe { tail.apply_runs(yp.0, first, m, out_rows.len() * ow, g.out_vol()) };
        }
        crate::buffers::give_vec(v);
        crate::buffers::give_vec(sums);
    };
    let tasks = n * chunks;
    if tasks == 1 || !crate::par::enabled() {
        (0..tasks).for_each(task);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
}

/// A chunk's tile rows (`rows`) and the slots each takes (`phase`: its tiles and one
/// past the output, see [`conv`]).
struct TileRows {
    rows: std::ops::Range<usize>,
    phase: usize,
}

impl TileRows {
    fn slots(&self) -> usize {
        self.rows.len() * self.phase
    }
}

/// The input rows and columns inside the padded extent a 3x3 conv's outputs read.
fn rows_and_columns_read(g: &Win3) -> (usize, usize) {
    let ([_, ih, iw], [_, oh, ow]) = (g.input, g.out);
    let (ph, pw) = (g.pad[1] as usize, g.pad[2] as usize);
    (
        ih.min((oh + 2).saturating_sub(ph)),
        iw.min((ow + 2).saturating_sub(pw)),
    )
}

/// Writes `Bᵀ d B` of every tile of the chunk's tile rows of each of the `c` channel
/// planes of `xb` into `v`: frequency `f`, channel `ci`, slot `u` at
/// `(f·c + ci)·slots + u`, where tile `(r, j)` of the chunk is slot `r·phase + j` (see
/// [`conv`]). Tile `(r, j)` reads padded rows `2r .. 2r + 4`, columns `2j .. 2j + 4`;
/// what lies outside the padded extent the outputs read is zero.
fn transform_input(xb: &[f32], c: usize, g: &Win3, tiles: &TileRows, v: &mut [f32]) {
    let [_, ih, iw] = g.input;
    let (ph, pw) = (g.pad[1] as usize, g.pad[2] as usize);
    let (rows, phase, slots) = (tiles.rows.clone(), tiles.phase, tiles.slots());
    let (rows_in, cols_in) = rows_and_columns_read(g);
    // Row `i` of every tile row: the even and odd padded columns of padded row
    // `2r + i`, `phase` of each per tile row, and one more for the last slot's shift.
    f32::with_scratch(8 * (slots + 1) + FREQS * slots, |scratch| {
        let (split, q) = scratch.split_at_mut(8 * (slots + 1));
        // The rows' spans are zeroed below; this clears the extra value after each.
        split.fill(0.0);
        for ci in 0..c {
            let plane = &xb[ci * ih * iw..][..ih * iw];
            for i in 0..4 {
                let (even, odd) =
                    split[2 * i * (slots + 1)..][..2 * (slots + 1)].split_at_mut(slots + 1);
                for (ri, r) in rows.clone().enumerate() {
                    let (even, odd) = (
                        &mut even[ri * phase..][..phase],
                        &mut odd[ri * phase..][..phase],
                    );
                    even.fill(0.0);
                    odd.fill(0.0);
                    if let Some(h) = (2 * r + i).checked_sub(ph).filter(|&h| h < rows_in) {
                        split_row_stride2(&plane[h * iw..][..cols_in], pw, even, odd);
                    }
                }
            }
            columns(split, slots, q);
            for j in 0..4 {
                let cols: [&[f32]; 4] = std::array::from_fn(|i| &q[(4 * i + j) * slots..][..slots]);
                let outs: [usize; 4] = std::array::from_fn(|i| ((4 * i + j) * c + ci) * slots);
                rows_of(cols, &mut *v, outs, slots);
            }
        }
    });
}

/// `d B` over a chunk's slots: `q[(4i + j)·slots + u]` is column `j` of row `i` of slot
/// `u`'s tile, from row `i`'s even and odd phases in `split` (`slots + 1` values each).
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl", "x86_64+avx2+fma"))]
fn columns(split: &[f32], slots: usize, q: &mut [f32]) {
    for i in 0..4 {
        let even = &split[2 * i * (slots + 1)..][..slots + 1];
        let odd = &split[(2 * i + 1) * (slots + 1)..][..slots + 1];
        let (d0, d1, d2, d3) = (&even[..slots], &odd[..slots], &even[1..], &odd[1..]);
        let (q01, q23) = q[4 * i * slots..][..4 * slots].split_at_mut(2 * slots);
        let (q0, q1) = q01.split_at_mut(slots);
        let (q2, q3) = q23.split_at_mut(slots);
        for u in 0..slots {
            q0[u] = d0[u] - d2[u];
            q1[u] = d1[u] + d2[u];
            q2[u] = d2[u] - d1[u];
            q3[u] = d1[u] - d3[u];
        }
    }
}

/// `Bᵀ q` for one column `j` over a chunk's slots: `cols[i]` is row `i`'s column; row
/// `i` of the result goes to `v[outs[i] ..][.. slots]`.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl", "x86_64+avx2+fma"))]
fn rows_of(cols: [&[f32]; 4], v: &mut [f32], outs: [usize; 4], slots: usize) {
    let [c0, c1, c2, c3] = cols;
    for u in 0..slots {
        let (a, b, c, d) = (c0[u], c1[u], c2[u], c3[u]);
        v[outs[0] + u] = a - c;
        v[outs[1] + u] = b + c;
        v[outs[2] + u] = c - b;
        v[outs[3] + u] = b - d;
    }
}

/// `Aᵀ m A` plus the bias for every tile of a chunk: `sums` holds frequency `f`, output
/// channel `o`, slot `u` at `(f·m + o)·slots + u` (tile `(r, j)` in slot `r·(tw + 1) +
/// j`); the outputs go to `out`, channel `o`'s `out_rows` rows of `ow` from `out +
/// o·out_vol` (the last rows or columns of an edge tile past the output are dropped).
///
/// # Safety
/// Those rows are the caller's to write, and nothing else accesses them during the
/// call.
#[allow(clippy::too_many_arguments)]
unsafe fn transform_output(
    variant: Variant,
    sums: &[f32],
    m: usize,
    slots: usize,
    tw: usize,
    bias: Option<&[f32]>,
    ow: usize,
    out_vol: usize,
    out_rows: usize,
    out: *mut f32,
) {
    let side = variant.out();
    let phase = tw + 1;
    // The output lines of a tile (and F(4x4)'s 24 lines of `M A`).
    let scratch = match variant {
        Variant::F2 => 4 * slots,
        Variant::F4 => 40 * slots,
    };
    f32::with_scratch(scratch, |lines| {
        for o in 0..m {
            let start = bias.map_or(0.0, |b| b[o]);
            let freq = |f: usize| &sums[(f * m + o) * slots..][..slots];
            match variant {
                Variant::F2 => back(&std::array::from_fn(freq), start, lines, slots),
                Variant::F4 => back4(&std::array::from_fn(freq), start, lines, slots),
            }
            for r in 0..out_rows.div_ceil(side) {
                for k in 0..side.min(out_rows - side * r) {
                    // SAFETY: a row of channel `o` the caller gave.
                    let dst = unsafe {
                        let at = o * out_vol + (side * r + k) * ow;
                        std::slice::from_raw_parts_mut(out.add(at), ow)
                    };
                    let line = |l: usize| &lines[(side * k + l) * slots + r * phase..][..tw];
                    match variant {
                        Variant::F2 => interleave(line(0), line(1), dst),
                        Variant::F4 => interleave4([line(0), line(1), line(2), line(3)], dst),
                    }
                }
            }
        }
    });
}

/// The four outputs of the tile in each slot: `lines[(2k + l)·slots + u]` is output
/// row `k`, column `l` of slot `u`'s tile.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl", "x86_64+avx2+fma"))]
fn back(m: &[&[f32]; FREQS], start: f32, lines: &mut [f32], slots: usize) {
    let (y0, rest) = lines.split_at_mut(slots);
    let (y1, rest) = rest.split_at_mut(slots);
    let (y2, y3) = rest.split_at_mut(slots);
    for u in 0..slots {
        let s: [f32; 4] = std::array::from_fn(|j| m[j][u] + m[4 + j][u] + m[8 + j][u]);
        let d: [f32; 4] = std::array::from_fn(|j| m[4 + j][u] - m[8 + j][u] - m[12 + j][u]);
        y0[u] = start + (s[0] + s[1] + s[2]);
        y1[u] = start + (s[1] - s[2] - s[3]);
        y2[u] = start + (d[0] + d[1] + d[2]);
        y3[u] = start + (d[1] - d[2] - d[3]);
    }
}

/// `dst[2t] = a[t]`, `dst[2t + 1] = b[t]`, as far as `dst` goes.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl", "x86_64+avx2+fma"))]
fn interleave(a: &[f32], b: &[f32], dst: &mut [f32]) {
    let pairs = dst.len() / 2;
    for (t, pair) in dst[..2 * pairs].chunks_exact_mut(2).enumerate() {
        pair[0] = a[t];
        pair[1] = b[t];
    }
    if dst.len() % 2 == 1 {
        dst[2 * pairs] = a[pairs];
    }
}

/// [`transform_input`] for F(4x4, 3x3): tile `(r, j)` reads padded rows `4r .. 4r + 6`,
/// columns `4j .. 4j + 6`; frequency `6i + k` of `Bᵀ d B` goes to `v` as there.
fn transform_input4(xb: &[f32], c: usize, g: &Win3, tiles: &TileRows, v: &mut [f32]) {
    let [_, ih, iw] = g.input;
    let (ph, pw) = (g.pad[1] as usize, g.pad[2] as usize);
    let (rows, phase, slots) = (tiles.rows.clone(), tiles.phase, tiles.slots());
    let (rows_in, cols_in) = rows_and_columns_read(g);
    // Row `i` of every tile row: padded columns `4t + φ` in phase `φ`, `phase` of each
    // per tile row, and one more for the last slot's shift.
    let span = slots + 1;
    let padded_len = 4 * phase;
    f32::with_scratch(24 * span + 36 * slots + padded_len, |scratch| {
        let (split, rest) = scratch.split_at_mut(24 * span);
        let (q, padded) = rest.split_at_mut(36 * slots);
        split.fill(0.0);
        padded.fill(0.0);
        for ci in 0..c {
            let plane = &xb[ci * ih * iw..][..ih * iw];
            for i in 0..6 {
                let phases = &mut split[4 * i * span..][..4 * span];
                for (ri, r) in rows.clone().enumerate() {
                    // The padding columns stay zero; the data's span is the row's, or
                    // zeros for a row outside the input.
                    let data = &mut padded[pw..pw + cols_in];
                    match (4 * r + i).checked_sub(ph).filter(|&h| h < rows_in) {
                        Some(h) => data.copy_from_slice(&plane[h * iw..][..cols_in]),
                        None => data.fill(0.0),
                    }
                    let (p01, p23) = phases.split_at_mut(2 * span);
                    let (p0, p1) = p01.split_at_mut(span);
                    let (p2, p3) = p23.split_at_mut(span);
                    let at = ri * phase..(ri + 1) * phase;
                    deinterleave4(
                        padded,
                        [
                            &mut p0[at.clone()],
                            &mut p1[at.clone()],
                            &mut p2[at.clone()],
                            &mut p3[at],
                        ],
                    );
                }
            }
            columns4(split, slots, q);
            // `Bᵀ` down each column `k`: frequency `6i + k` of channel `ci` at
            // `((6i + k)·c + ci)·slots`, six frequencies `6·c·slots` apart.
            for k in 0..6 {
                let cols: [&[f32]; 6] = std::array::from_fn(|i| &q[(6 * i + k) * slots..][..slots]);
                let mut freqs = v[(k * c + ci) * slots..].chunks_mut(6 * c * slots);
                let dst = std::array::from_fn(|_| freqs.next().expect("six frequencies"));
                b_t_lines(cols, dst, slots);
            }
        }
    });
}

/// `Bᵀ a` of F(4x4, 3x3) for six values `a`.
#[inline(always)]
fn b_t(a: [f32; 6]) -> [f32; 6] {
    [
        4.0 * a[0] - 5.0 * a[2] + a[4],
        -4.0 * a[1] - 4.0 * a[2] + a[3] + a[4],
        4.0 * a[1] - 4.0 * a[2] - a[3] + a[4],
        -2.0 * a[1] - a[2] + 2.0 * a[3] + a[4],
        2.0 * a[1] - a[2] - 2.0 * a[3] + a[4],
        4.0 * a[1] - 5.0 * a[3] + a[5],
    ]
}

/// `d B` over a chunk's slots: `q[(6i + k)·slots + u]` is column `k` of row `i` of slot
/// `u`'s tile, from row `i`'s four phases in `split` (`slots + 1` values each; the
/// tile's columns 4 and 5 are the next slot's 0 and 1).
fn columns4(split: &[f32], slots: usize, q: &mut [f32]) {
    let span = slots + 1;
    for i in 0..6 {
        let p: [&[f32]; 4] = std::array::from_fn(|f| &split[(4 * i + f) * span..][..span]);
        let cols = [p[0], p[1], p[2], p[3], &p[0][1..], &p[1][1..]];
        let mut rows = q[6 * i * slots..][..6 * slots].chunks_exact_mut(slots);
        b_t_lines(
            cols,
            std::array::from_fn(|_| rows.next().expect("six rows")),
            slots,
        );
    }
}

/// `dst[k][u] = (Bᵀ a)[k]` over `u < slots`, with `a = cols[..][u]`.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl", "x86_64+avx2+fma"))]
fn b_t_lines(cols: [&[f32]; 6], dst: [&mut [f32]; 6], slots: usize) {
    let [a0, a1, a2, a3, a4, a5] = cols.map(|a| &a[..slots]);
    let [d0, d1, d2, d3, d4, d5] = dst.map(|d| &mut d[..slots]);
    for u in 0..slots {
        let b = b_t([a0[u], a1[u], a2[u], a3[u], a4[u], a5[u]]);
        d0[u] = b[0];
        d1[u] = b[1];
        d2[u] = b[2];
        d3[u] = b[3];
        d4[u] = b[4];
        d5[u] = b[5];
    }
}

/// The four phases of `padded`: `phases[f][t] = padded[4t + f]`, as far as the phases go.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl", "x86_64+avx2+fma"))]
fn deinterleave4(padded: &[f32], phases: [&mut [f32]; 4]) {
    let [p0, p1, p2, p3] = phases;
    let n = p0.len().min(p1.len()).min(p2.len()).min(p3.len());
    for (t, quad) in padded.chunks_exact(4).take(n).enumerate() {
        p0[t] = quad[0];
        p1[t] = quad[1];
        p2[t] = quad[2];
        p3[t] = quad[3];
    }
}

/// `Aᵀ a` of F(4x4, 3x3) for six values `a`.
#[inline(always)]
fn a_t(a: [f32; 6]) -> [f32; 4] {
    [
        a[0] + a[1] + a[2] + a[3] + a[4],
        a[1] - a[2] + 2.0 * (a[3] - a[4]),
        a[1] + a[2] + 4.0 * (a[3] + a[4]),
        a[1] - a[2] + 8.0 * (a[3] - a[4]) + a[5],
    ]
}

/// The sixteen outputs of the tile in each slot: `lines[(4k + l)·slots + u]` is output
/// row `k`, column `l` of slot `u`'s tile; `lines` also holds 24 more rows of scratch.
fn back4(m: &[&[f32]; 36], start: f32, lines: &mut [f32], slots: usize) {
    let (out, t) = lines[..40 * slots].split_at_mut(16 * slots);
    // `M A` row by row: row `i`'s four values in `t[(4i + l)·slots ..]`.
    for i in 0..6 {
        let mut rows = t[4 * i * slots..][..4 * slots].chunks_exact_mut(slots);
        let dst: [&mut [f32]; 4] = std::array::from_fn(|_| rows.next().expect("4 rows"));
        a_t_lines(std::array::from_fn(|j| m[6 * i + j]), dst, 0.0, slots);
    }
    // `Aᵀ` down each column `l`, plus the start.
    let t = &*t;
    for l in 0..4 {
        // Output rows `k` of column `l`: lines `4k + l`.
        let mut column = out.chunks_exact_mut(slots).skip(l).step_by(4);
        let lines4 = std::array::from_fn(|_| column.next().expect("four rows"));
        a_t_lines(
            std::array::from_fn(|i| &t[(4 * i + l) * slots..][..slots]),
            lines4,
            start,
            slots,
        );
    }
}

/// `dst[k][u] = start + (Aᵀ a)[k]` over `u < slots`, with `a = inp[..][u]`.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl", "x86_64+avx2+fma"))]
fn a_t_lines(inp: [&[f32]; 6], dst: [&mut [f32]; 4], start: f32, slots: usize) {
    let [a0, a1, a2, a3, a4, a5] = inp.map(|a| &a[..slots]);
    let [d0, d1, d2, d3] = dst.map(|d| &mut d[..slots]);
    for u in 0..slots {
        let y = a_t([a0[u], a1[u], a2[u], a3[u], a4[u], a5[u]]);
        d0[u] = start + y[0];
        d1[u] = start + y[1];
        d2[u] = start + y[2];
        d3[u] = start + y[3];
    }
}

/// `dst[4t + l] = lines[l][t]`, as far as `dst` goes.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl", "x86_64+avx2+fma"))]
fn interleave4(lines: [&[f32]; 4], dst: &mut [f32]) {
    let quads = dst.len() / 4;
    let [l0, l1, l2, l3] = lines.map(|l| &l[..quads]);
    let (body, rest) = dst.split_at_mut(4 * quads);
    for (t, quad) in body.chunks_exact_mut(4).enumerate() {
        quad[0] = l0[t];
        quad[1] = l1[t];
        quad[2] = l2[t];
        quad[3] = l3[t];
    }
    for (k, d) in rest.iter_mut().enumerate() {
        *d = lines[k][quads];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::par::{in_pool, same_bits};

    /// Within rounding of the direct conv's sums, on odd and even planes, uneven and
    /// wide pads, several chunks of tile rows, a batch, with and without a bias: each
    /// output within `1e-5` of the sum of its products' magnitudes (the direct conv of
    /// `|x|` by `|w|`), where a wrong tap or transform is off by whole products.
    #[test]
    fn matches_the_direct_conv_within_rounding() {
        let Some(isa) = crate::cpu::conv_isa() else {
            return;
        };
        let values = super::super::conv_direct::tests::values;
        let win = |h: usize, w: usize, p: [usize; 4]| Win3 {
            input: [1, h, w],
            out: [1, h + p[0] + p[2] - 2, w + p[1] + p[3] - 2],
            kernel: [1, 3, 3],
            stride: [1; 3],
            dil: [1; 3],
            pad: [0, p[0] as isize, p[1] as isize],
        };
        // (images, input channels, output channels, window)
        let cases = [
            (1, 128, 128, win(12, 12, [1; 4])),
            (2, 128, 130, win(13, 12, [1, 0, 2, 1])),
            (1, 64, 96, win(17, 30, [0; 4])),
            (1, 129, 130, win(10, 14, [2; 4])),
            (1, 64, 48, win(40, 41, [1; 4])),
        ];
        for (variant, tolerance) in [(Variant::F2, 1e-5), (Variant::F4, 5e-5)] {
            let mut worst = 0.0f32;
            for (i, &(n, c, m, g)) in cases.iter().enumerate() {
                assert!(fits(&g, c, m, 1), "case {i}");
                let seed = 7 * i as u64;
                let x = values(n * c * g.in_vol(), seed);
                let w = values(m * c * 9, seed + 1);
                let bias = values(m, seed + 2);
                let packed = pack_weights(&w, m, c, variant);
                let abs = |v: &[f32]| v.iter().map(|a| a.abs()).collect::<Vec<f32>>();
                let mut magnitude = vec![0.0f32; n * m * g.out_vol()];
                let (xa, wa, ba) = (abs(&x), abs(&w), abs(&bias));
                super::super::conv_direct::conv(
                    isa,
                    &xa,
                    &wa,
                    Some(&ba),
                    &mut magnitude,
                    n,
                    c,
                    m,
                    1,
                    &g,
                    None,
                );
                for b in [None, Some(&bias[..])] {
                    let mut want = vec![0.0f32; n * m * g.out_vol()];
                    super::super::conv_direct::conv(
                        isa, &x, &w, b, &mut want, n, c, m, 1, &g, None,
                    );
                    let mut got = vec![f32::NAN; want.len()];
                    conv(&packed, &x, b, &mut got, n, c, m, &g, None);
                    for (j, ((a, e), mag)) in got.iter().zip(&want).zip(&magnitude).enumerate() {
                        worst = worst.max((a - e).abs() / mag);
                        assert!(
                            (a - e).abs() <= tolerance * mag,
                            "{variant:?}, case {i}, output {j}: {a} vs {e} (magnitude {mag})"
                        );
                    }
                }
            }
            eprintln!("{variant:?}: largest error {worst:.2e} of the magnitude");
        }
    }

    /// The same bits at 1, 2 and 3 threads: 7 rows of F(4x4) tiles that fit one chunk
    /// (split for more threads), and two images.
    #[test]
    fn thread_count_independent() {
        if crate::cpu::conv_isa().is_none() {
            return;
        }
        let values = super::super::conv_direct::tests::values;
        let g = |side: usize| Win3 {
            input: [1, side, side],
            out: [1, side, side],
            kernel: [1, 3, 3],
            stride: [1; 3],
            dil: [1; 3],
            pad: [0, 1, 1],
        };
        for (n, c, m, g) in [(1, 128, 128, g(28)), (2, 64, 80, g(20))] {
            for variant in [Variant::F2, Variant::F4] {
                let x = values(n * c * g.in_vol(), 1);
                let w = values(m * c * 9, 2);
                let bias = values(m, 3);
                let packed = pack_weights(&w, m, c, variant);
                let on = |threads| {
                    let mut y = vec![f32::NAN; n * m * g.out_vol()];
                    in_pool(threads, || {
                        conv(&packed, &x, Some(&bias), &mut y, n, c, m, &g, None)
                    });
                    y
                };
                let one = on(1);
                for threads in [2, 3] {
                    assert!(
                        same_bits(&one, &on(threads)),
                        "{variant:?}, {n}x{c}->{m}, {threads} threads"
                    );
                }
            }
        }
    }
}
