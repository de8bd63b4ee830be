//! f32 convs with output channels in the vector lanes: pointwise convs (on small
//! planes, or with many input channels) and 2-D convs of stride 1 or 2 with larger
//! kernels, with AVX-512 or AVX2.
//!
//! The other conv kernels put positions in the lanes: a 7x7 plane's 49 positions fill
//! 64 lanes (a 32-wide tile and a 17-wide tail), and ResNet-50's 2048->512 at 7x7 ran
//! at two thirds of the FMA peak; the packed GEMM also copies its input into panels.
//! Here a register tile is up to 12 outputs of one row × 32 output channels (a row
//! split into tiles of as equal sizes as can be): per weight row (input
//! channel and tap), two vectors of transposed weights (packed once per weight) and
//! twelve inputs broadcast from where they lie, 24 multiply-adds. A last block of 16
//! channels or fewer (output channel counts such as 80, 112 or 240) takes tiles of up
//! to 24 outputs × 16 channels instead, rather than multiply-adds half of whose lanes are
//! padding. Each finished tile is transposed back and stored as runs of positions per
//! channel.
//!
//! With AVX2 (16 registers of 8 lanes) a tile is 6 positions × 16 channels, half a
//! block's panel; it is transposed back in 8 × 8 squares, and stored as whole vectors
//! where the positions after it are the task's own, which later tiles overwrite.
//!
//! Each output is `bias + Σ_c Σ_taps w·x` summed in that order with fused
//! multiply-adds, padding taps included as `w·0`: the sums of the direct conv, bit for
//! bit.

use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use super::gemm_util::SendPtr;
use super::window::{Win3, split_row_stride2};
use crate::cpu::Isa;

/// Positions and output channels of a register tile.
const PR: usize = 12;
const CR: usize = 32;
/// With AVX2 only: positions and output channels of a register tile (12 of the 16
/// vector registers hold sums), and the planes of pointwise convs it takes at any
/// channel count.
const PR_AVX2: usize = 6;
const CR_AVX2: usize = 16;
const AVX2_SMALL_PLANE: usize = 400;
/// With AVX-512: the most outputs per channel of a stride-1 conv of 16 output channels
/// per group that runs here (see [`fits_spatial`]).
const HALF_BLOCK_PLANE: usize = 4096;
/// Multiply-adds below which a conv runs on the calling thread.
const SERIAL_WORK: usize = 1 << 20;
/// Packed weights (values) from which a conv runs in parallel whatever its
/// multiply-adds: streaming them from memory takes longer than their arithmetic.
/// Measured on MobileNetV3's squeeze-excitation convs, a megabyte for one output
/// position, which ran here until session 42 (at 2 threads, `run --profile`,
/// 0.064-0.081 -> 0.024-0.042 ms per conv); convs on one position now run on
/// [`super::gemv`], which splits from the same count, and this serves convs on a few
/// positions with large weights (SSDlite's extra layers on 3x3 and 2x2 maps).
const PARALLEL_WEIGHTS: usize = 1 << 16;
/// With AVX-512, the planes below which pointwise convs run here rather than on the
/// packed GEMM (see [`fits`]).
const LANES_PLANE: usize = 28 * 28;
/// Positions per task (whole tiles), so that large planes with few output channels
/// still split into tasks. Fixed, so tasks never depend on threads.
const TASK_POSITIONS: usize = 32 * PR;
/// Fewest tasks a conv without a band splits into on more than one thread, where its
/// plane allows (tasks of two tiles at least): mobile nets' projections have two to five blocks of output
/// channels on planes of 7x7 and 14x14, one task each, which left a second thread
/// idle for part of them. MobileNetV2's 1x1 convs at 14x14 at two threads (`run
/// --profile`, two alternating rounds, `tools/conv_classes.py`) 1.376 / 1.387 ->
/// 1.243 / 1.279 ms per run, at 7x7 unchanged (a scratch switch between 1 and 8).
const MIN_TASKS: usize = 8;

/// Positions per task for a conv of `plane` positions with `others` tasks per chunk
/// of positions (images, groups, blocks of output channels): whole tiles, at most
/// [`TASK_POSITIONS`], fewer where that gives fewer than [`MIN_TASKS`] tasks. Each
/// output is summed alone, so how positions split into tasks changes no bit.
fn positions_per_task(plane: usize, others: usize) -> usize {
    let chunks = MIN_TASKS.div_ceil(others.max(1));
    plane
        .div_ceil(chunks)
        .next_multiple_of(PR)
        .clamp(2 * PR, TASK_POSITIONS)
}

/// Whether [`conv`] runs this conv here: a pointwise conv (1x1, stride 1, no pads)
/// with 16 or more input channels; with AVX-512, 32 or more output channels per group
/// on a plane of fewer than [`LANES_PLANE`] positions with 64 or more input channels;
/// with AVX2 only, 16 or more output channels on a plane
/// of at most [`AVX2_SMALL_PLANE`] positions, or fewer than 2048 with 128 or more
/// input channels.
///
/// With AVX2 on a Zen 3 (time here / direct conv on `kernel_table`'s shapes, median of
/// 15 alternating rounds of a scratch build that switched between the two):
/// MobileNetV3's 672->112 at 14x14 0.73, 112->672 0.79, 160->960 at 7x7 0.83;
/// ResNet-50's 1024->256 at 14x14 0.78, 2048->512 at 7x7 0.94, 512->128 at 28x28
/// 0.95; but 40->240 at 28x28 1.03. Later (A/B of two `kernel_table`
/// builds, median of 11-15 rounds): DeepLab's 960->256 at 33x33 0.89-0.90,
/// while ResNet-50's 256->64 at 56x56 ran 0.98-1.06 (within the host's noise), so
/// planes from 2048 positions on stay direct.
///
/// `kernel_table` (least of 20 runs, % of the FMA peak, packed GEMM -> here), ResNet-50:
/// 2048->512 at 7x7 65 -> 95, 1024->256 at 14x14 72 -> 99, 512->128 at 28x28 82 -> 97,
/// 256->512 stride 2 (gathered to 28x28) 77 -> 88, 256->64 at 56x56 85 -> 95; but
/// 64->256 at 56x56 89 -> 85 (with few input channels, a tile's transposes and stores
/// weigh more than its sums). The same holds on small planes with fewer than 64 input
/// channels (Zen 4, `tools/ab_kernels.py` of builds with and without this kernel,
/// packed GEMM / here, median of 3 rounds): MobileNetV2's 32->192 at 28x28 0.80,
/// MobileNetV3's 40->240 at 28x28 0.85; with 64 (64->384 at 14x14) 1.02 and more
/// this kernel wins: 96->576 at 14x14 1.09, 192->32 at 28x28 1.15, 576->96 1.28,
/// 960->160 at 7x7 1.32, ResNet-50's 1024->256 at 14x14 1.35.
///
/// On larger planes, a last block of 16 channels (its tiles of 24 outputs × 16
/// channels need a broadcast per multiply-add) lost to the packed GEMM: Inception-v3's
/// 192->48, 256->48 and 288->48 at 35x35 (`run --profile`, least of 3 alternating
/// rounds, ms, here -> packed GEMM) 0.272 -> 0.227, 0.315 -> 0.251, 0.391 -> 0.290,
/// where its 64-channel neighbours moved within the noise (2-7%). (That was a
/// condition on output channels, until the plane limit below took 35x35 planes whole.)
///
/// Those were single convs, their operands warm or all cold. Inside whole models the
/// packed GEMM, which packs each stretch of input once for all output channels (here a
/// tile reads its positions from every input plane again for each block of 32
/// outputs), won on every plane of 28x28 and more (Zen 4, `tools/ab_classes.sh` on a
/// scratch build with an environment switch between the two, least of 3-4 alternating
/// rounds, packed GEMM / here, per class of 1x1 conv; the same classes move between
/// builds of commits a3ceb9b and 8db70c2, and 56x56 between a512eec and a3ceb9b): DeepLabV3's at 32x32 0.912 (42.8 -> 39.0 ms per run),
/// Inception-v3's at 35x35 0.973, at 28x28 RegNet-Y's 0.934-0.939 (stride 2 from
/// 56x56 0.835), ResNet-50's 0.946 (stride 2 0.930), EfficientNet-B0's 0.943,
/// DenseNet-121's 1.000, and at 56x56 DenseNet-121's 128-256 -> 128 convs 0.888;
/// ResNet-50's 256->64 at 56x56 alone lost, 1.03. Below 28x28 this kernel keeps its
/// lead in the model as alone: 14x14 1.06-1.16, 7x7 1.21-1.28, Inception-v3's 17x17
/// 1.16. Hence [`LANES_PLANE`]. Both kernels start from the bias and add the input
/// channels in order with fused multiply-adds: the bits are the same (ResNet-50,
/// RegNet-Y, EfficientNet-B0 and DenseNet-121 outputs identical either way).
pub(crate) fn fits(g: &Win3, mg: usize, cg: usize) -> bool {
    let faster_here = match crate::cpu::conv_isa() {
        Some(Isa::Avx512) => g.out_vol() < LANES_PLANE && cg >= 64,
        Some(Isa::Avx2Fma) => {
            let plane = g.out_vol();
            plane <= AVX2_SMALL_PLANE || plane < 2048 && cg >= 128
        }
        None => false,
    };
    runs_pointwise(g, mg, cg) && faster_here
}

/// Whether [`conv`] can run this pointwise conv (whether it is faster here is
/// [`fits`]'s question): 1x1, stride 1, no pads, 16 or more input channels, and a
/// block's output channels per group (32 with AVX-512, 16 with AVX2).
fn runs_pointwise(g: &Win3, mg: usize, cg: usize) -> bool {
    let pointwise = g.pointwise();
    let block = match crate::cpu::conv_isa() {
        Some(Isa::Avx512) => CR,
        Some(Isa::Avx2Fma) => CR_AVX2,
        None => return false,
    };
    pointwise && cg >= 16 && mg >= block
}

/// Whether [`conv`] can run this pointwise conv on channel-blocked data (see
/// [`super::blocked`]): with AVX-512, one group, 16 or more input and output channels,
/// a multiple of 16 on each blocked side. Any such conv gains here: a tile's outputs
/// are stored as they are summed, and inputs broadcast from 16 apart.
pub(crate) fn runs_blocked(
    g: &Win3,
    m: usize,
    c: usize,
    group: usize,
    layouts: super::blocked::Layouts,
) -> bool {
    let pointwise = g.pointwise();
    crate::cpu::conv_isa() == Some(Isa::Avx512)
        && pointwise
        && group == 1
        && c >= 16
        && m >= 16
        && (!layouts.input || c.is_multiple_of(16))
        && (!layouts.output || m.is_multiple_of(16))
}

/// Whether [`conv`] runs this conv here: a 2-D conv of stride 1 or 2 with a kernel
/// larger than 1x1 and no negative padding, with 8 or more input channels per group
/// and, with AVX-512, 32 or more output channels per group, or exactly 16 with
/// stride 2 or at most [`HALF_BLOCK_PLANE`] outputs; with AVX2 only, 16 or more output
/// channels and more than 16 input channels per group (16 with stride 1).
///
/// Groups of 16 output channels fill one AVX-512 vector per position (tiles of 24
/// outputs × 16 channels), where the direct conv's 12-channel tiles take 12 + 4:
/// `tools/ab_kernels.py` on a Zen 4 (here / direct conv, median of 3 alternating
/// rounds), RegNet-Y-800MF's groups of 16, stride 2 from 112x112 0.89, from 56x56
/// 0.82, from 14x14 0.71, stride 1 at 28x28 0.85, 14x14 0.76; a 128->64 conv in 4
/// groups at 28x28 0.86; 16->16 stride 2 from 160x160 0.94, stride 1 at 56x56 0.93,
/// but at 80x80 1.05 and YOLOv8n's 16->16 at 160x160 1.10 (its wide rows fill the
/// direct conv's 32-position tiles). Other channel counts below 32 lose here: 24 per
/// group at 28x28 1.22, 20 1.45, 8 (RegNet's 64 in groups of 8 at 56x56) 1.80,
/// 16->24 at 80x80 1.40.
///
/// With AVX2 on a Zen 3 (time here, with weight rows in blocks, / direct conv, median
/// of 7 alternating rounds): ResNet-50's 3x3 stride 2 from 56x56 0.74, from 28x28
/// 0.71, at 28x28 0.86, 14x14 0.84, 7x7 0.91, 56x56 0.94; YOLO's 64->128 stride 2 at
/// 40x40 0.83, 80->80 at 40x40 0.91; RegNet's 512 channels in groups of 64 at 14x14
/// 0.88. But with 16 input channels per group: YOLO's 16->32 stride 2 1.15-1.18,
/// RegNet's groups of 16 1.09: those stayed on the direct kernel. Since tiles take
/// outputs only (median of 7 alternating rounds against the direct conv): RegNet's
/// groups of 16 at 28x28 0.90, YOLO's 16->32 stride 2 at 320x320 still 1.10, so
/// stride-1 convs with 16 channels per group run here. Dilated convs ran
/// 1.39x slower here before weight rows went in blocks and tiles skipped the padding
/// columns; since, `kernel_table` against the direct conv (median of 5 rounds):
/// DeepLab's 3x3 of dilation 2 at 28x28 0.77, and its ASPP convs on the 33x33 map
/// (bands of [`super::conv`]'s `padding_bands`) 0.69 (dilation 12), 0.66 (24); such
/// bands now run on the packed GEMM ([`super::packed_gemm::band_prefers`]).
///
/// `kernel_table` (% of the FMA peak, direct conv -> here): ResNet-50's 3x3 at 56x56
/// 79 -> 92, 28x28 81 -> 92, 14x14 79 -> 87, 7x7 65 -> 76, stride 2 from 56x56 70 ->
/// 88, from 28x28 62 -> 78-89; RegNet's 3x3 with 64 channels per group 79 -> 84;
/// DeepLab's dilated 3x3 79 -> 85; YOLO's 32->32 at 80x80 88 -> 90, 64->128 stride 2
/// 68 -> 88. ResNet-50's 7x7 stem (3 input channels) ran 87-89 -> 78-86, so convs
/// with few input channels stay on the direct kernel.
pub(crate) fn fits_spatial(g: &Win3, mg: usize, cg: usize) -> bool {
    let on_isa = match crate::cpu::conv_isa() {
        Some(Isa::Avx512) => {
            mg >= CR || mg == CR / 2 && (g.stride[2] == 2 || g.out_vol() <= HALF_BLOCK_PLANE)
        }
        Some(Isa::Avx2Fma) => mg >= CR_AVX2 && (cg > 16 || cg == 16 && g.stride == [1; 3]),
        None => false,
    };
    on_isa
        && g.input[0] == 1
        && g.out[0] == 1
        && g.kernel[0] == 1
        && g.k_vol() > 1
        && (g.stride == [1; 3] || g.stride == [1, 2, 2])
        && g.pad.iter().all(|&p| p >= 0)
        && cg >= 8
}

/// Weights `[m, cg]` transposed per block of [`CR`] output channels of a group into
/// `[cg, CR]` panels (zeros in the padding channels), each read in order by its
/// tiles. (Transposed whole, `[cg, mg]`, a panel's rows lay a power of two apart and
/// shared a few cache sets: ResNet-50's 2048->512 at 7x7 ran at half speed.)
pub(crate) fn pack_weights(w: &[f32], m: usize, group: usize, cg: usize) -> Vec<f32> {
    let mg = m / group;
    let blocks = mg.div_ceil(CR);
    let mut out = vec![0.0; group * blocks * cg * CR];
    for gi in 0..group {
        for o in 0..mg {
            let panel = (gi * blocks + o / CR) * cg;
            for c in 0..cg {
                out[(panel + c) * CR + o % CR] = w[(gi * mg + o) * cg + c];
            }
        }
    }
    out
}

/// Where the tiles of a conv read and write, per image and group.
struct Lines {
    /// Per weight row (input channel, then tap), the offset in the input of the
    /// value the first position reads.
    rows: Vec<usize>,
    /// Input values per image and group.
    in_len: usize,
    /// Outputs per row (`kept`), and positions per row of the input they read
    /// (`width`: output `(h, w)` reads from position `h·width + w`).
    width: usize,
    kept: usize,
}

/// `y = conv(x, w) + bias` for f32 NCHW data of a conv [`fits`] or [`fits_spatial`]
/// accepts, or for blocked input and/or output (`layouts`) of a pointwise conv
/// [`runs_blocked`] accepts, with `wt` from [`pack_weights`]; `y` is written in full.
/// Tasks are (image, group, block of [`CR`] output channels, chunk of positions:
/// [`TASK_POSITIONS`], or [`positions_per_task`] without a band); with a band, block
/// and chunk swap places.
///
/// A pointwise conv reads its input as is, and so does a conv whose outputs read all
/// of it and nothing else ([`reads_in_place`]). Others read, with AVX-512, each task's
/// [`Band`] of zero-padded input rows; with AVX2 a zero-padded copy of the whole input
/// ([`padded_copy`]). Output `(h, w)` is position `h·width + w` over the padded (phase)
/// width, and each tap reads it at a fixed offset from there (times the stride in a
/// band). With AVX-512 a tile is outputs of one row, with AVX2 consecutive outputs
/// (see `avx2::Tile`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv(
    wt: &[f32],
    x: &[f32],
    bias: Option<&[f32]>,
    y: &mut [f32],
    n: usize,
    c: usize,
    m: usize,
    group: usize,
    g: &Win3,
    tail: Option<&crate::fusion::Tail>,
    layouts: super::blocked::Layouts,
) {
    let (cg, mg) = (c / group, m / group);
    let blocked = layouts.input || layouts.output;
    assert!(!blocked || runs_blocked(g, m, c, group, layouts));
    let pointwise = blocked || runs_pointwise(g, mg, cg);
    assert!(pointwise || fits_spatial(g, mg, cg));
    let isa = crate::cpu::conv_isa().expect("`fits` checked the instruction set");
    let (plane, k_vol) = (g.out_vol(), g.k_vol());
    let kdim = cg * k_vol;
    let blocks = mg.div_ceil(CR);
    assert!(wt.len() == group * blocks * kdim * CR);
    assert!(x.len() >= n * c * g.in_vol() && y.len() >= n * m * plane);
    let uses_band = !pointwise && isa == Isa::Avx512 && !reads_in_place(g);
    let light = n * m * plane * kdim < SERIAL_WORK && wt.len() < PARALLEL_WEIGHTS;
    // Smaller tasks serve a second thread only: run on one (one thread, or a conv too
    // light to hand out), a block's weights would be read once per chunk for nothing.
    let task_positions = match uses_band || light || crate::par::threads() == 1 {
        true => TASK_POSITIONS,
        false => positions_per_task(plane, n * group * blocks),
    };
    let chunks = plane.div_ceil(task_positions);
    let mut padded = Vec::new();
    let mut band = None;
    let (xs, lines) = if pointwise {
        // A blocked input's channel `ci` lies in lane `ci % 16` of its block's positions.
        let row = |ci: usize| match layouts.input {
            true => ci / 16 * plane * 16 + ci % 16,
            false => ci * plane,
        };
        let lines = Lines {
            rows: (0..cg).map(row).collect(),
            in_len: cg * plane,
            width: plane,
            kept: plane,
        };
        (x, lines)
    } else if uses_band {
        let b = Band::new(g, cg, chunks);
        let lines = b.lines();
        band = Some(b);
        (x, lines)
    } else {
        match padded_copy(x, n * c, cg, g) {
            (lines, Some(copy)) => {
                padded = copy;
                (&padded[..], lines)
            }
            (lines, None) => (x, lines),
        }
    };
    let tasks = n * group * blocks * chunks;
    let yp = SendPtr(y.as_mut_ptr());
    let lines = &lines;
    // Tasks in order of (image, group), then chunk then block of channels, or with a
    // band block then chunk, so that a thread's consecutive tasks read the same band
    // (filled once: refilled for each of ResNet-50's 16 blocks at 7x7, the copy of
    // 9-value rows took a fifth of the conv).
    let call = band
        .as_ref()
        .map(|_| BAND_CALLS.fetch_add(1, Ordering::Relaxed));
    let split = |t: usize| {
        let (b, gi) = (t / chunks / blocks / group, t / chunks / blocks % group);
        match band {
            Some(_) => (b, gi, t % blocks, t / blocks % chunks),
            None => (b, gi, t / chunks % blocks, t % chunks),
        }
    };
    let task = |t: usize| {
        let (b, gi, blk, chunk) = split(t);
        let positions = chunk * task_positions..((chunk + 1) * task_positions).min(plane);
        let m0 = blk * CR;
        let chans = CR.min(mg - m0);
        // With a band, tiles read the task's rows from it, the first output row's at 0.
        let mut band_buf = Vec::new();
        let (xg, row0) = match (&band, call) {
            (Some(band), Some(call)) => {
                let row0 = positions.start / g.out[2];
                let key = Some((call, b, gi, chunk));
                let held;
                (held, band_buf) = BAND.take();
                if held != key {
                    let input = &xs[(b * group + gi) * cg * g.in_vol()..][..cg * g.in_vol()];
                    let zeroed = held.is_some_and(|(c, ..)| c == call);
                    let rows = row0..(positions.end - 1) / g.out[2] + 1;
                    band.fill(input, rows, zeroed, &mut band_buf);
                }
                (&band_buf[..], row0)
            }
            _ => (&xs[(b * group + gi) * lines.in_len..][..lines.in_len], 0),
        };
        let wg = &wt[(gi * blocks + blk) * kdim * CR..][..kdim * CR];
        let mut start = [0.0f32; CR];
        if let Some(bias) = bias {
            start[..chans].copy_from_slice(&bias[gi * mg + m0..][..chans]);
        }
        let yp = &yp;
        // The outputs the task writes in each channel: consecutive, from `written.0`.
        let mut written: Option<(usize, usize)> = None;
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx2Fma {
            assert!(!blocked, "`runs_blocked` holds only with AVX-512");
            let tiles: Vec<avx2::Tile> = positions
                .clone()
                .step_by(PR_AVX2)
                .map(|first| {
                    let count = PR_AVX2.min(positions.end - first);
                    avx2::Tile::new(first, count, lines.width, lines.kept)
                })
                .collect();
            // SAFETY: AVX2 and FMA were checked by `fits`/`fits_spatial`; each tile
            // reads `xg` at each row's offset plus the positions of outputs below
            // `positions.end` (inside the copy or input, by construction of `lines`)
            // and writes outputs `first .. first + count` of channels `gi·mg + m0 ..`
            // (`chans` of them) of image `b`, which no other task writes, inside `y`
            // (checked above); a tile whose next 8 outputs are still the task's may
            // store whole vectors there (later tiles overwrite them). `wg` holds the
            // block's `kdim` rows of `CR`.
            unsafe {
                let to = |t: &avx2::Tile, half: usize| avx2::Store {
                    y: yp.0.add((b * m + gi * mg + m0 + half) * plane + t.first),
                    plane,
                    chans: CR_AVX2.min(chans - half),
                    count: t.count,
                    spill: t.first + 8 <= positions.end,
                };
                let k_block = avx2::k_block(pointwise, plane);
                avx2::task(xg, &lines.rows, wg, &start, chans, &tiles, k_block, to);
            }
            written = Some((positions.start, positions.end));
        }
        // A block of 16 channels or fewer (the last of 80, 112, 144 or 240) fills one
        // vector per position: its tiles take twice the outputs, so that every
        // multiply-add still does 16 useful lanes.
        let per_tile = if chans <= 16 { 2 * PR } else { PR };
        let avx512_outputs = match isa {
            Isa::Avx512 => positions.clone(),
            Isa::Avx2Fma => 0..0,
        };
        // Weights are read once per tile, so on small planes the first tile of each
        // block waited for them from memory (`kernel_table --cold` against warm:
        // MobileNetV3's 160->960 at 7x7 0.196 against 0.151 ms, ResNet-50's
        // 2048->512 at 7x7 1.12 against 0.89). The first tile prefetches its own
        // weights 16 rows ahead of the sums, and each tile a share of the next task's
        // weights when they are another block's, into L2: tile `j` of `J` rows `j`,
        // `j + J`, ... as it passes them. (The last tile alone prefetching all of them
        // asked the memory for a block's weights at once, within a tile's time:
        // `kernel_table --cold`, two alternating rounds, ResNet-50's 2048->512 at 7x7
        // 1.10-1.11 -> 0.90-0.91 ms, 3x3 512->512 at 7x7 2.23-2.30 -> 1.93-2.06;
        // MobileNetV2's 960->160 at 7x7 0.19 -> 0.17.)
        let next_weights = (t + 1 < tasks)
            .then(|| split(t + 1))
            .map(|(_, ng, nblk, _)| ng * blocks + nblk)
            .filter(|&next| next != gi * blocks + blk)
            .map(|next| wt[next * kdim * CR..].as_ptr());
        // Tiles of one row each: the row's outputs in the task split into tiles of as
        // equal sizes as can be. (Tiles of consecutive positions over the padded width
        // summed the columns between rows too and dropped them: DeepLab's ASPP convs,
        // of dilation 12 and 24, summed 24-33 positions per row of 9-15 outputs.
        // `kernel_table` on a Zen 4, median of 3 alternating rounds against those:
        // `deeplab_3x3d12_960to256_33` 0.81, `deeplab_3x3d24_960to256_33` 0.74,
        // ResNet-50's 3x3 at 7x7 0.83, 14x14 0.90, 28x28 0.94, 56x56 0.97, stride 2
        // 0.92-0.94; pointwise shapes within the noise.)
        let mut tiles = Vec::new();
        let mut next = avx512_outputs.start;
        while next < avx512_outputs.end {
            let row_end = (next / lines.kept + 1) * lines.kept;
            let left = row_end.min(positions.end) - next;
            let count = left.div_ceil(left.div_ceil(per_tile));
            tiles.push((next, count));
            next += count;
        }
        if let (Some(&(first, _)), Some(&(last, count))) = (tiles.first(), tiles.last()) {
            written = Some((written.map_or(first, |w| w.0), last + count));
        }
        // Consecutive outputs read values `XS` apart: 16 in a blocked input, the
        // stride in a band.
        let xs_step = match (layouts.input, &band) {
            (true, _) => 16,
            (false, Some(_)) => g.stride[2],
            (false, None) => 1,
        };
        // On one thread a pointwise conv's input is in L2 (the node before wrote it),
        // and the prefetches cost a whole run 1-3% (MobileNetV2/V3, EfficientNet-B0,
        // RegNet-Y, SSDlite, 5 alternating rounds).
        let prefetch_inputs = pointwise && crate::par::threads() > 1;
        let k_block = match pointwise {
            true => avx512::K_BLOCK,
            false => kdim,
        };
        let k_blocks = kdim.div_ceil(k_block.max(1));
        let kept = match k_blocks {
            1 => 0,
            _ => tiles.len() * avx512::SUMS,
        };
        use super::gemm_util::Scalar;
        f32::with_scratch(kept, |sums| {
            for kb in 0..k_blocks {
                let k = kb * k_block..((kb + 1) * k_block).min(kdim);
                for (j, &(first, count)) in tiles.iter().enumerate() {
                    let (row, col) = (first / lines.kept, first % lines.kept);
                    let q0 = (row - row0) * lines.width + col;
                    let from = match kb {
                        0 => avx512::From::Start(&start),
                        _ => avx512::From::Sums(sums[j * avx512::SUMS..].as_ptr()),
                    };
                    let dest = match kb + 1 == k_blocks {
                        true => avx512::Dest::Out(avx512::Store {
                            // SAFETY: inside `y` (checked above).
                            y: unsafe { yp.0.add((b * m + gi * mg + m0) * plane) },
                            plane,
                            chans,
                            first,
                            blocked: layouts.output,
                        }),
                        false => avx512::Dest::Sums(sums[j * avx512::SUMS..].as_mut_ptr()),
                    };
                    let ahead = (j == 0).then(|| wg.as_ptr().wrapping_add((k.start + 16) * CR));
                    let spread = next_weights.map(|w| avx512::Spread {
                        at: w.wrapping_add((k.start + j) * CR),
                        every: tiles.len(),
                    });
                    let (rows, wk) = (&lines.rows[k.clone()], &wg[k.start * CR..]);
                    macro_rules! tile {
                        ($v:literal, $p:expr, $xs:literal) => {
                            avx512::tile::<$v, { $p }, $xs>(
                                xg,
                                rows,
                                q0,
                                count,
                                wk,
                                from,
                                dest,
                                ahead,
                                spread,
                                prefetch_inputs,
                            )
                        };
                    }
                    // SAFETY: AVX-512 was checked by `fits`/`fits_spatial`; the tile
                    // reads `xg` at each row's offset plus the positions of outputs
                    // below `positions.end` (inside the input, or the band filled for
                    // this task, whose rows cover those the task's output rows read, by
                    // construction of `lines`; the band's positions times the stride),
                    // and writes outputs `first .. first + count` of channels
                    // `gi·mg + m0 ..` (`chans` of them) of image `b`, which no other
                    // task writes, inside `y` (checked above), or its sums in `sums`;
                    // `wg` holds the block's `kdim` rows of `CR`.
                    #[cfg(target_arch = "x86_64")]
                    unsafe {
                        match (chans <= 16, xs_step) {
                            (true, 1) => tile!(1, 2 * PR, 1),
                            (false, 1) => tile!(2, PR, 1),
                            (true, 2) => tile!(1, 2 * PR, 2),
                            (false, 2) => tile!(2, PR, 2),
                            (true, _) => tile!(1, 2 * PR, 16),
                            (false, _) => tile!(2, PR, 16),
                        }
                    }
                    #[cfg(not(target_arch = "x86_64"))]
                    {
                        let _ = (from, dest, ahead, spread, rows, wk, xs_step);
                        unreachable!("`fits` holds only with AVX-512 or AVX2");
                    }
                }
            }
        });
        if let Some(call) = call {
            BAND.set((Some((call, b, gi, chunk)), band_buf));
        }
        if let (Some(tail), Some((from, to))) = (tail, written) {
            // SAFETY: outputs `from .. to` of the task's channels are its own (above);
            // blocked, those of each block of 16 channels are one run.
            unsafe {
                if layouts.output {
                    let at = (b * m + gi * mg + m0) * plane + from * 16;
                    let runs = chans / 16;
                    tail.apply_runs(yp.0, at, runs, (to - from) * 16, plane * 16);
                } else {
                    let at = (b * m + gi * mg + m0) * plane + from;
                    tail.apply_runs(yp.0, at, chans, to - from, plane);
                }
            }
        }
    };
    if tasks == 1 || light || !crate::par::enabled() {
        (0..tasks).for_each(task);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
    if !pointwise {
        crate::buffers::give_vec(padded);
    }
}

/// A task's band and what it holds: (conv call, image, group, chunk).
type HeldBand = (Option<(u64, usize, usize, usize)>, Vec<f32>);

thread_local! {
    /// The thread's last [`Band`], kept for its next task.
    static BAND: std::cell::RefCell<HeldBand> = const { std::cell::RefCell::new((None, Vec::new())) };
}

/// Numbers each conv call that fills bands, so that a band is never taken for another
/// call's (its input may sit at the same address).
static BAND_CALLS: AtomicU64 = AtomicU64::new(0);

/// Whether a 2-D conv's outputs read its whole input and nothing else, so tiles read
/// the input where it lies: stride 1 and no padding (DeepLab's bands of taps that read
/// data; their copy and its zero fill were 5% of `kernel_table
/// deeplab_3x3d12_960to256_33` in `perf record`).
fn reads_in_place(g: &Win3) -> bool {
    g.stride == [1; 3] && g.pad == [0; 3] && (g.reach(1), g.reach(2)) == (g.input[1], g.input[2])
}

/// With AVX-512, a task's input rows of a 2-D conv, zero-padded to the columns its
/// outputs read, in a buffer of the thread's (`BAND`) that stays in cache while the
/// task's tiles read it; tiles read it with the conv's stride. A copy of the whole input
/// (zero-filled, then split into phase planes with stride 2) went to memory on large
/// planes and was read back from there, and on small ones the phase split of short rows
/// took a quarter of the conv (`perf record` of `kernel_table
/// regnety_g16_3x3s2_784_14`). `kernel_table` against that copy (mean of 2 alternating
/// rounds, least of 10 runs each): RegNet-Y-800MF's groups of 16, stride 2 from
/// 112x112 0.90, from 56x56 0.84, from 14x14 0.69; YOLO's 16->32 stride 2 from 320x320
/// 0.89; ResNet-50's stride 2 0.98; stride-1 shapes 0.99-1.01. In RegNet-Y-800MF
/// (`run --profile`), its stride-2 group convs from 112x112 1.20 -> 0.82 ms per run,
/// from 56x56 0.63 -> 0.41.
struct Band {
    /// Input rows per channel in the buffer: the most a task needs.
    rows: usize,
    /// Values per buffer row: the padded input columns the outputs read.
    width: usize,
    cg: usize,
    g: Win3,
}

impl Band {
    /// For tasks of [`TASK_POSITIONS`] consecutive outputs (`chunks` of them per plane).
    fn new(g: &Win3, cg: usize, chunks: usize) -> Band {
        let [_, oh, ow] = g.out;
        let plane = oh * ow;
        let out_rows = (0..chunks)
            .map(|k| {
                let end = ((k + 1) * TASK_POSITIONS).min(plane);
                (end - 1) / ow - k * TASK_POSITIONS / ow + 1
            })
            .max()
            .unwrap_or(1);
        Band {
            rows: Self::input_rows(g, out_rows),
            width: (ow - 1) * g.stride[2] + (g.kernel[2] - 1) * g.dil[2] + 1,
            cg,
            g: *g,
        }
    }

    /// Input rows that `out_rows` consecutive output rows read.
    fn input_rows(g: &Win3, out_rows: usize) -> usize {
        (out_rows - 1) * g.stride[1] + (g.kernel[1] - 1) * g.dil[1] + 1
    }

    /// How tiles read a band: weight row (channel, tap) at a fixed offset from output
    /// `(h, w)`'s position `(h - first row)·width + w` times the stride.
    fn lines(&self) -> Lines {
        let g = &self.g;
        let [_, kh, kw] = g.kernel;
        let [_, dh, dw] = g.dil;
        let (rows, width) = (self.rows, self.width);
        Lines {
            rows: (0..self.cg)
                .flat_map(|ci| {
                    (0..kh).flat_map(move |a| {
                        (0..kw).map(move |b| (ci * rows + a * dh) * width + b * dw)
                    })
                })
                .collect(),
            in_len: self.cg * rows * width,
            width,
            kept: g.out[2],
        }
    }

    /// Fills `buf` with the rows that output rows `rows` read from `input` (the group's
    /// `cg` planes), zeros where they lie in the padding. `zeroed`: `buf` was filled
    /// for this conv call before, so its padding columns hold zeros already (a row of
    /// 14 values took three calls to write with its two pads).
    fn fill(&self, input: &[f32], rows: std::ops::Range<usize>, zeroed: bool, buf: &mut Vec<f32>) {
        let g = &self.g;
        let [_, ih, iw] = g.input;
        let (ph, pw) = (g.pad[1], g.pad[2] as usize);
        let width = self.width;
        let need = Self::input_rows(g, rows.len());
        let len = self.cg * self.rows * width;
        if !zeroed {
            buf.clear();
        }
        buf.resize(len, 0.0);
        let left = pw.min(width);
        let cols = iw.min(width - left);
        for (src, dst) in input
            .chunks_exact(ih * iw)
            .zip(buf.chunks_exact_mut(self.rows * width))
        {
            for (j, dst) in dst.chunks_exact_mut(width).take(need).enumerate() {
                let h = (rows.start * g.stride[1] + j) as isize - ph;
                if h < 0 || h >= ih as isize {
                    dst.fill(0.0);
                } else {
                    dst[left..][..cols].copy_from_slice(&src[h as usize * iw..][..cols]);
                }
            }
        }
    }
}

/// The input of a 2-D conv of stride 1 or 2, zero-padded to the extent its outputs
/// read, for the `planes` channel planes of `x`, and how tiles read it with `cg`
/// channels per group. With stride 2 each plane is split into four phase planes
/// (padded row `r`, column `p` to plane `(r % 2, p % 2)`, row `r / 2`, column `p / 2`),
/// where consecutive outputs read consecutive values.
///
/// No copy (`None`: the tiles read `x` where it lies) when [`reads_in_place`].
fn padded_copy(x: &[f32], planes: usize, cg: usize, g: &Win3) -> (Lines, Option<Vec<f32>>) {
    let [_, ih, iw] = g.input;
    let ow = g.out[2];
    let [_, kh, kw] = g.kernel;
    let [_, dh, dw] = g.dil;
    let s = g.stride[2];
    let (ph, pw) = (g.pad[1] as usize, g.pad[2] as usize);
    let (eh, ew) = (g.reach(1), g.reach(2));
    let (rows, width) = (eh.div_ceil(s), ew.div_ceil(s));
    let phase = rows * width;
    let in_plane = s * s * phase;
    let as_is = reads_in_place(g);
    let mut copy = match as_is {
        true => Vec::new(),
        false => crate::buffers::take_filled(planes * in_plane, 0.0f32),
    };
    let (rows_in, cols_in) = (ih.min(eh.saturating_sub(ph)), iw.min(ew.saturating_sub(pw)));
    for (src, dst) in x.chunks_exact(ih * iw).zip(copy.chunks_exact_mut(in_plane)) {
        for h in 0..rows_in {
            let (r, row) = (h + ph, &src[h * iw..][..cols_in]);
            if s == 1 {
                dst[r * width + pw..][..cols_in].copy_from_slice(row);
            } else {
                let at = (r % 2 * 2 * rows + r / 2) * width;
                let (even, odd) = dst[at..].split_at_mut(phase);
                split_row_stride2(row, pw, &mut even[..width], &mut odd[..width]);
            }
        }
    }
    let tap = move |a: usize, b: usize| {
        let (a, b) = (a * dh, b * dw);
        ((a % s * s + b % s) * rows + a / s) * width + b / s
    };
    let rows = (0..cg)
        .flat_map(|ci| (0..kh).flat_map(move |a| (0..kw).map(move |b| ci * in_plane + tap(a, b))))
        .collect();
    let lines = Lines {
        rows,
        in_len: cg * in_plane,
        width,
        kept: ow,
    };
    (lines, (!as_is).then_some(copy))
}

/// The 8x8 transpose of vectors, which the depthwise kernel uses too.
#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::transpose8;

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{CR, PR_AVX2};

    /// Weight rows summed over all of a task's tiles before the next rows (16 KiB of
    /// weights for a block's two halves). On a Zen 3 (time with / without, median of
    /// 9 alternating rounds): ResNet-50's 3x3 stride 2 from 28x28 0.73, at 14x14 0.80,
    /// 2048->512 1x1 at 7x7 0.80, 1024->256 at 14x14 0.83; MobileNetV3's 672->112 at
    /// 14x14 0.86; no shape slower. Blocks of 256 rows gained half as much.
    const K_BLOCK: usize = 128;
    /// Weight rows per block for pointwise convs on planes of at most
    /// [`SHORT_PLANE`] positions: there a task's tiles read the block's whole input
    /// rows, which with 128 rows (25 KiB on a 7x7 plane) and the weights (16 KiB) no
    /// longer fit in L1. `kernel_table`'s 7x7 shapes (Zen 3, time against 128 rows,
    /// median of 9 alternating rounds): ResNet-50's 2048->512 0.71-0.75, MobileNetV3's
    /// 160->960 0.81-0.95; 32 rows ran 1.07-1.09x slower than 64. On 14x14 planes 64
    /// rows ran 1.04-1.07x slower than 128.
    const K_BLOCK_SHORT: usize = 64;
    const SHORT_PLANE: usize = 64;

    /// Weight rows summed per block for a conv whose tiles read rows of `plane`
    /// positions (`pointwise`) or a padded copy.
    pub(super) fn k_block(pointwise: bool, plane: usize) -> usize {
        if pointwise && plane <= SHORT_PLANE {
            K_BLOCK_SHORT
        } else {
            K_BLOCK
        }
    }

    /// Up to [`PR_AVX2`] consecutive outputs of a plane, summed together: output `o`
    /// reads the input (or its padded copy) at position `o / kept · width + o % kept`,
    /// so outputs on one line read consecutive values and a tile that crosses a line
    /// jumps over the padding columns. (Tiles of consecutive positions over the padded
    /// width summed those columns too and dropped them: a 7x7 plane's 3x3 conv summed
    /// 66 positions for 49 outputs, a 14x14 one 222 for 196.)
    pub(super) struct Tile {
        /// The first output, and the position it reads.
        pub first: usize,
        at: usize,
        pub count: usize,
        /// Each output's position after `at`.
        delta: [usize; PR_AVX2],
    }

    impl Tile {
        pub(super) fn new(first: usize, count: usize, width: usize, kept: usize) -> Tile {
            let position = |o: usize| o / kept * width + o % kept;
            let at = position(first);
            let mut delta = [0; PR_AVX2];
            for (i, d) in delta.iter_mut().enumerate().take(count) {
                *d = position(first + i) - at;
            }
            Tile {
                first,
                at,
                count,
                delta,
            }
        }
    }

    /// Where a tile's outputs go: channel `o` at `y + o·plane`, `count` values. With
    /// `spill`, the 8 values from `y` on belong to the caller, who writes those past
    /// `count` later: each channel is stored as one vector.
    pub(super) struct Store {
        pub y: *mut f32,
        pub plane: usize,
        pub chans: usize,
        pub count: usize,
        pub spill: bool,
    }

    /// Sums of a tile kept between blocks of weight rows: positions × 16 channels.
    const SUMS: usize = PR_AVX2 * 16;

    /// A task's `tiles` × the block's `chans` channels, in halves of 16, stored where
    /// `to(tile, half)` says. The weight rows are summed `k_block` at a time over all
    /// tiles, the sums in between kept in a buffer, so that a block's weights stay in
    /// L1 while the tiles read them.
    ///
    /// # Safety
    /// As for [`tile`], for every tile and half, with `wg` the block's `rows.len()`
    /// rows of [`CR`] and `start` its [`CR`] starting values.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn task(
        x: &[f32],
        rows: &[usize],
        wg: &[f32],
        start: &[f32],
        chans: usize,
        tiles: &[Tile],
        k_block: usize,
        to: impl Fn(&Tile, usize) -> Store,
    ) {
        use crate::ops::gemm_util::Scalar;
        let halves = chans.div_ceil(16);
        let blocks = rows.len().div_ceil(k_block);
        let kept = if blocks > 1 {
            tiles.len() * halves * SUMS
        } else {
            0
        };
        f32::with_scratch(kept, |sums| {
            for kb in 0..blocks {
                let k = kb * k_block..((kb + 1) * k_block).min(rows.len());
                let wk = &wg[k.start * CR..];
                for (ti, t) in tiles.iter().enumerate() {
                    for h in 0..halves {
                        let half = 16 * h;
                        let at = (ti * halves + h) * SUMS;
                        let from = match kb {
                            0 => From::Start(&start[half..]),
                            _ => From::Sums(sums[at..].as_ptr()),
                        };
                        let dest = match kb + 1 == blocks {
                            true => Dest::Out(to(t, half)),
                            false => Dest::Sums(sums[at..].as_mut_ptr()),
                        };
                        // SAFETY: as the caller vouched; `sums` holds the tile's
                        // SUMS values at `at`.
                        unsafe { tile(x, &rows[k.clone()], t, &wk[half..], from, dest) };
                    }
                }
            }
        });
    }

    /// What a tile's sums start from.
    enum From<'a> {
        /// 16 values, one per channel.
        Start(&'a [f32]),
        /// The [`SUMS`] sums a previous block of rows stored.
        Sums(*const f32),
    }

    /// Where a tile's sums go.
    enum Dest {
        Out(Store),
        Sums(*mut f32),
    }

    /// The tile's outputs × up to 16 output channels: sums over the weight rows (row
    /// `r` reads `x` at `rows[r]` plus each output's position, its weights at
    /// `wg[r·CR ..]`, 16 of them), starting from `from`, stored as `to` says.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `x[rows[r] + position]` is readable for every row and
    /// output of the tile; `wg` holds `rows.len()` rows `CR` apart of 16 values; a
    /// `Start` has 16, `Sums` [`SUMS`] readable or writable values; a `Store`'s `y`
    /// points to `chans` planes of `plane` values whose outputs stored nothing else
    /// accesses during the call.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile(x: &[f32], rows: &[usize], t: &Tile, wg: &[f32], from: From, to: Dest) {
        debug_assert!(t.count <= PR_AVX2 && wg.len() >= (rows.len() - 1) * CR + 16);
        // SAFETY (whole body): as the caller vouched.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; PR_AVX2];
            for (i, a) in acc.iter_mut().enumerate() {
                for (v, a) in a.iter_mut().enumerate() {
                    *a = match from {
                        From::Start(s) => _mm256_loadu_ps(s.as_ptr().add(8 * v)),
                        From::Sums(p) => _mm256_loadu_ps(p.add(16 * i + 8 * v)),
                    };
                }
            }
            let (xp, wp) = (x.as_ptr().add(t.at), wg.as_ptr());
            let d = t.delta;
            // Literal output counts keep the accumulators in registers.
            macro_rules! sums {
                ($r:literal) => {
                    for (r, &off) in rows.iter().enumerate() {
                        let w0 = _mm256_loadu_ps(wp.add(r * CR));
                        let w1 = _mm256_loadu_ps(wp.add(r * CR + 8));
                        let xr = xp.add(off);
                        for (i, a) in acc.iter_mut().enumerate().take($r) {
                            let xv = _mm256_broadcast_ss(&*xr.add(d[i]));
                            a[0] = _mm256_fmadd_ps(w0, xv, a[0]);
                            a[1] = _mm256_fmadd_ps(w1, xv, a[1]);
                        }
                    }
                };
            }
            match t.count {
                6.. => sums!(6),
                5 => sums!(5),
                4 => sums!(4),
                3 => sums!(3),
                2 => sums!(2),
                _ => sums!(1),
            }
            let to = match to {
                Dest::Out(store) => store,
                Dest::Sums(p) => {
                    for (i, a) in acc.iter().enumerate() {
                        for (v, &a) in a.iter().enumerate() {
                            _mm256_storeu_ps(p.add(16 * i + 8 * v), a);
                        }
                    }
                    return;
                }
            };
            // Rows are positions, lanes channels: transposed, rows are channels.
            for v in 0..2 {
                let mut t = [_mm256_setzero_ps(); 8];
                for (t, a) in t.iter_mut().zip(&acc[..to.count]) {
                    *t = a[v];
                }
                transpose8(&mut t);
                for (o, t) in t.iter().enumerate().take(to.chans.saturating_sub(8 * v)) {
                    let dst = to.y.add((8 * v + o) * to.plane);
                    if to.spill {
                        _mm256_storeu_ps(dst, *t);
                    } else {
                        let mut staged = [0.0f32; 8];
                        _mm256_storeu_ps(staged.as_mut_ptr(), *t);
                        std::ptr::copy_nonoverlapping(staged.as_ptr(), dst, to.count);
                    }
                }
            }
        }
    }

    /// Transposes 8 vectors of 8 lanes in place.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) fn transpose8(r: &mut [__m256; 8]) {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        r[0] = _mm256_permute2f128_ps::<0x20>(u0, u4);
        r[1] = _mm256_permute2f128_ps::<0x20>(u1, u5);
        r[2] = _mm256_permute2f128_ps::<0x20>(u2, u6);
        r[3] = _mm256_permute2f128_ps::<0x20>(u3, u7);
        r[4] = _mm256_permute2f128_ps::<0x31>(u0, u4);
        r[5] = _mm256_permute2f128_ps::<0x31>(u1, u5);
        r[6] = _mm256_permute2f128_ps::<0x31>(u2, u6);
        r[7] = _mm256_permute2f128_ps::<0x31>(u3, u7);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{CR, PR};
    use crate::ops::conv_dw::transpose16;

    /// Where a tile's outputs go: channel `o` of the block at `y + o·plane`, from
    /// output `first` on; `blocked`, output `p` of the block's 16-channel half `v` at
    /// `y + (v·plane + p)·16` (`y` is then the block's first 16 channels' plane of a
    /// blocked output, which starts at the same offset).
    pub(super) struct Store {
        pub y: *mut f32,
        pub plane: usize,
        pub chans: usize,
        pub first: usize,
        pub blocked: bool,
    }

    /// How far ahead of a tile's positions, in values, a pointwise conv prefetches each
    /// input row (`prefetch_inputs`): two tiles, so each line is asked for a tile's
    /// time before it is read.
    ///
    /// A tile reads 12 values from each of the conv's input rows (672 rows, 784 bytes
    /// apart, for MobileNetV3's 672->112 at 14x14): more streams than the hardware
    /// prefetchers follow, so values not in L2 (an input written by another thread,
    /// or long ago) came one miss at a time. At two threads, the first task on each
    /// thread of that conv took 75-79 µs and the later ones 31 (a scratch trace of its
    /// tasks); with this prefetch 52-55 and the whole conv 0.21 -> 0.15 ms.
    const INPUTS_AHEAD: usize = 32;

    /// Weight rows of another block to prefetch into L2 during a tile: at the tile's
    /// weight row `r` with `r % every == 0`, row `r` from `at` (hints: any address
    /// will do).
    #[derive(Clone, Copy)]
    pub(super) struct Spread {
        pub at: *const f32,
        pub every: usize,
    }

    /// Weight rows summed per pass over a task's tiles of a pointwise conv: a block of
    /// them (16 KiB of weights) stays in L1 while every tile reads it, where a tile
    /// over all rows streamed the block's weights from L2 once per tile (EfficientNet-
    /// B0's 1152->192 at 7x7, a scratch trace of its tasks at two threads: a tile of 6
    /// positions took about as long as one of 12). The sums in between are kept in a
    /// buffer, [`SUMS`] per tile; stored and loaded as f32, they give the same bits.
    pub(super) const K_BLOCK: usize = 128;
    /// Sums of a tile kept between blocks of weight rows.
    pub(super) const SUMS: usize = 2 * PR * 16;

    /// Where a tile's sums start: the block's starting values, or sums kept from the
    /// previous block of weight rows ([`SUMS`] values).
    pub(super) enum From<'a> {
        Start(&'a [f32; CR]),
        Sums(*const f32),
    }

    /// Where a tile's sums go: the outputs, or kept for the next block of weight rows
    /// ([`SUMS`] values).
    pub(super) enum Dest {
        Out(Store),
        Sums(*mut f32),
    }

    /// Positions `q0 .. q0 + count` (`count` ≤ `P`) × the block's first `16·V` output
    /// channels, summed over the weight rows `rows` (row `r` reads `x` at
    /// `rows[r] + q·XS`: `XS` is 16 for a blocked input, 1 otherwise; its weights at
    /// `wg[r·CR ..]`) from `from`, stored to `dest`. `V` is 2 with `P` = 12 (a full
    /// block), or 1 with `P` = 24 (a block of up to 16 channels): 24 accumulators
    /// either way. With `ahead`, each weight row's lines at the same offset from
    /// `ahead` are prefetched (hints: any address will do); with `spread`, some of
    /// another block's rows as [`Spread`] says. With `prefetch_inputs`, the next
    /// tiles' input values of each row are prefetched as the row is read
    /// ([`INPUTS_AHEAD`]).
    ///
    /// The arguments stay separate: passed as one struct, they kept the accumulators
    /// on the stack (a store after every multiply-add), and whole models ran 1.5-1.8x
    /// slower.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `x[rows[r] + q·XS]` is readable for every row and position;
    /// `wg` holds `rows.len()` rows of `CR`; a `Store`'s `y` points to `chans` planes
    /// of `plane` values whose outputs `first .. first + count` nothing else accesses
    /// during the call; `Sums` point to [`SUMS`] readable (`From`) or writable
    /// (`Dest`) values.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile<const V: usize, const P: usize, const XS: usize>(
        x: &[f32],
        rows: &[usize],
        q0: usize,
        count: usize,
        wg: &[f32],
        from: From,
        dest: Dest,
        ahead: Option<*const f32>,
        spread: Option<Spread>,
        prefetch_inputs: bool,
    ) {
        debug_assert!(V * P == 2 * PR && count <= P);
        // SAFETY (whole body): as the caller vouched.
        unsafe {
            let mut acc: [[__m512; V]; P] = match from {
                From::Start(start) => {
                    [std::array::from_fn(|v| _mm512_loadu_ps(start.as_ptr().add(16 * v))); P]
                }
                From::Sums(p) => std::array::from_fn(|i| {
                    std::array::from_fn(|v| _mm512_loadu_ps(p.add((i * V + v) * 16)))
                }),
            };
            let (xp, wp) = (x.as_ptr().add(q0 * XS), wg.as_ptr());
            // Without a spread, the countdown never reaches zero again.
            let (spread_at, every, first_countdown) = spread
                .map_or((std::ptr::null(), usize::MAX, usize::MAX), |s| {
                    (s.at, s.every, 0)
                });
            // Literal position counts keep the accumulators in registers.
            macro_rules! sums {
                ($r:literal) => {{
                    let mut countdown = first_countdown;
                    for (r, &off) in rows.iter().enumerate() {
                        if countdown == 0 {
                            let line = spread_at.wrapping_add(r * CR) as *const i8;
                            _mm_prefetch::<_MM_HINT_T1>(line);
                            _mm_prefetch::<_MM_HINT_T1>(line.wrapping_add(64));
                            countdown = every;
                        }
                        countdown -= 1;
                        let mut w = [_mm512_setzero_ps(); V];
                        for (v, w) in w.iter_mut().enumerate() {
                            *w = _mm512_loadu_ps(wp.add(r * CR + 16 * v));
                        }
                        if let Some(ahead) = ahead {
                            let line = ahead.wrapping_add(r * CR) as *const i8;
                            _mm_prefetch::<_MM_HINT_T0>(line);
                            _mm_prefetch::<_MM_HINT_T0>(line.wrapping_add(64));
                        }
                        let xr = xp.add(off);
                        if prefetch_inputs && XS == 1 {
                            // The next tiles' values of this row; in the first tile,
                            // also this tile's, 16 rows ahead.
                            _mm_prefetch::<_MM_HINT_T0>(xr.wrapping_add(INPUTS_AHEAD) as *const i8);
                            if let (Some(_), Some(&o)) = (ahead, rows.get(r + 16)) {
                                let line = xp.wrapping_add(o) as *const i8;
                                _mm_prefetch::<_MM_HINT_T0>(line);
                                _mm_prefetch::<_MM_HINT_T0>(line.wrapping_add(4 * PR - 4));
                            }
                        } else if prefetch_inputs && XS == 16 {
                            // A blocked input's rows of one block share lines, one per
                            // position: each row of the block takes one of the next
                            // tile's positions.
                            let next = xr.wrapping_add((PR + r % 16) * 16);
                            _mm_prefetch::<_MM_HINT_T0>(next as *const i8);
                        }
                        for (i, a) in acc.iter_mut().enumerate().take($r) {
                            let xv = _mm512_set1_ps(*xr.add(i * XS));
                            for (a, &w) in a.iter_mut().zip(&w) {
                                *a = _mm512_fmadd_ps(w, xv, *a);
                            }
                        }
                    }
                }};
            }
            match count {
                24.. => sums!(24),
                23 => sums!(23),
                22 => sums!(22),
                21 => sums!(21),
                20 => sums!(20),
                19 => sums!(19),
                18 => sums!(18),
                17 => sums!(17),
                16 => sums!(16),
                15 => sums!(15),
                14 => sums!(14),
                13 => sums!(13),
                12 => sums!(12),
                11 => sums!(11),
                10 => sums!(10),
                9 => sums!(9),
                8 => sums!(8),
                7 => sums!(7),
                6 => sums!(6),
                5 => sums!(5),
                4 => sums!(4),
                3 => sums!(3),
                2 => sums!(2),
                _ => sums!(1),
            }
            let to = match dest {
                Dest::Out(to) => to,
                Dest::Sums(p) => {
                    for (i, a) in acc.iter().enumerate() {
                        for (v, &a) in a.iter().enumerate() {
                            _mm512_storeu_ps(p.add((i * V + v) * 16), a);
                        }
                    }
                    return;
                }
            };
            if to.blocked {
                for (p, a) in acc.iter().enumerate().take(count) {
                    for (v, &a) in a.iter().enumerate().take(to.chans.div_ceil(16)) {
                        let dst = to.y.add((v * to.plane + to.first + p) * 16);
                        _mm512_storeu_ps(dst, a);
                    }
                }
                return;
            }
            // Sixteen outputs at a time.
            for p0 in (0..count).step_by(16) {
                let kept = ((1u32 << (count - p0).min(16)) - 1) as __mmask16;
                for v in 0..V {
                    // Rows are positions, lanes channels: transposed, rows are channels.
                    let mut t = [_mm512_setzero_ps(); 16];
                    for (t, a) in t.iter_mut().zip(&acc[p0..]) {
                        *t = a[v];
                    }
                    transpose16(&mut t);
                    for (o, &t) in t.iter().enumerate().take(to.chans.saturating_sub(16 * v)) {
                        let dst = to.y.add((16 * v + o) * to.plane + to.first + p0);
                        _mm512_mask_storeu_ps(dst, kept, t);
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

    /// Same bits as the direct conv, on planes with a partial position tile, channel
    /// counts with a partial block, groups and batches, with and without a bias; and
    /// spatial kernels with padding (uneven too), dilation, no padding, one row.
    #[test]
    fn same_bits_as_the_direct_conv() {
        let Some(isa) = crate::cpu::conv_isa() else {
            return;
        };
        let values = super::super::conv_direct::tests::values;
        let pw = |h, w| win(h, w, [1, 1], 1, 1, [0; 4]);
        // (images, input channels, output channels, groups, window)
        let cases = [
            (1, 64, 32, 1, pw(7, 7)),
            (2, 40, 70, 1, pw(5, 5)),
            (1, 96, 232, 1, pw(7, 7)),
            (1, 32, 96, 2, pw(9, 14)),
            (2, 17, 33, 1, pw(1, 12)),
            // Several chunks of positions, the last one partial.
            (1, 128, 40, 1, pw(30, 31)),
            // Sums over several blocks of weight rows, the last one partial.
            (1, 300, 40, 1, pw(7, 9)),
            (1, 17, 32, 1, win(9, 9, [3, 3], 1, 1, [1; 4])),
            (2, 16, 80, 2, win(11, 8, [5, 5], 1, 2, [4, 3, 2, 4])),
            (1, 24, 33, 1, win(7, 7, [3, 3], 1, 1, [0; 4])),
            // Unpadded and dilated, read in place: rows of 13 for outputs of 9.
            (1, 20, 40, 1, win(14, 13, [3, 3], 1, 2, [0; 4])),
            // Padded at the end only: a copy after all.
            (2, 20, 32, 1, win(8, 9, [3, 3], 1, 1, [0, 0, 2, 1])),
            (1, 8, 64, 1, win(1, 40, [1, 3], 1, 1, [0, 1, 0, 1])),
            (1, 20, 36, 1, win(30, 30, [3, 3], 1, 1, [1; 4])),
            // Stride 2: even and odd sizes and pads, dilation, a 2x2 kernel.
            (1, 18, 32, 1, win(14, 14, [3, 3], 2, 1, [1; 4])),
            (2, 10, 40, 1, win(15, 13, [3, 3], 2, 1, [0, 1, 1, 0])),
            (1, 8, 48, 1, win(12, 17, [5, 5], 2, 2, [3, 2, 4, 1])),
            (1, 24, 32, 1, win(9, 9, [2, 2], 2, 1, [0; 4])),
            // Dilated, with more than 16 input channels (AVX2 takes them too).
            (1, 20, 40, 1, win(13, 12, [3, 3], 1, 3, [3, 2, 3, 4])),
            (1, 24, 32, 1, win(15, 15, [3, 3], 2, 2, [2; 4])),
            // Stride 2 on two images, two blocks of channels and two chunks of
            // positions: each task's band, and none taken for another's.
            (2, 16, 64, 1, win(60, 40, [3, 3], 2, 1, [1; 4])),
            // 16 output channels per group (AVX-512: one half block), stride 2 and 1.
            (1, 64, 64, 4, win(14, 13, [3, 3], 2, 1, [1; 4])),
            (2, 96, 32, 2, win(9, 11, [3, 3], 1, 1, [1, 0, 2, 1])),
        ];
        let mut ran = 0;
        for (i, &(n, c, m, group, g)) in cases.iter().enumerate() {
            let (cg, mg) = (c / group, m / group);
            // With AVX2 only, all but spatial ones of 16 or fewer input channels per
            // group.
            let here = runs_pointwise(&g, mg, cg) || fits_spatial(&g, mg, cg);
            let spatial_ok = g.k_vol() == 1 || cg > 16;
            let expected = isa == Isa::Avx512 || spatial_ok;
            assert_eq!(here, expected, "case {i}");
            if !here {
                continue;
            }
            ran += 1;
            let kdim = cg * g.k_vol();
            let x = values(n * c * g.in_vol(), 5 * i as u64);
            let wv = values(m * kdim, 5 * i as u64 + 1);
            let bias = values(m, 5 * i as u64 + 2);
            let packed = pack_weights(&wv, m, group, kdim);
            for b in [None, Some(&bias[..])] {
                let mut want = vec![0.0f32; n * m * g.out_vol()];
                super::super::conv_direct::conv(
                    isa, &x, &wv, b, &mut want, n, c, m, group, &g, None,
                );
                let mut got = vec![f32::NAN; want.len()];
                conv(
                    &packed,
                    &x,
                    b,
                    &mut got,
                    n,
                    c,
                    m,
                    group,
                    &g,
                    None,
                    Default::default(),
                );
                for (j, (a, e)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(a.to_bits(), e.to_bits(), "case {i}, output {j}: {a} vs {e}");
                }
            }
        }
        assert!(ran >= 12, "{ran} cases ran");
    }

    /// Pointwise convs on blocked input, output or both: the direct conv's bits in
    /// their layouts, with 16 output channels (one vector per position) and with
    /// several blocks of 32, on planes of partial tiles and of several tasks.
    #[test]
    fn blocked_layouts_give_the_same_bits() {
        use super::super::blocked::{Layouts, block_slice, unblock_slice};
        let Some(isa @ Isa::Avx512) = crate::cpu::conv_isa() else {
            // Blocked values are kept with AVX-512 only.
            return;
        };
        let values = super::super::conv_direct::tests::values;
        let pw = |h, w| win(h, w, [1, 1], 1, 1, [0; 4]);
        // (images, input channels, output channels, window)
        let cases = [
            (1, 32, 16, pw(7, 7)),
            (2, 48, 96, pw(5, 9)),
            (1, 16, 48, pw(20, 23)),
            (1, 64, 32, pw(1, 1)),
            // Sums over three blocks of weight rows, the last one partial.
            (1, 272, 48, pw(6, 7)),
        ];
        for (i, &(n, c, m, g)) in cases.iter().enumerate() {
            let all = Layouts {
                input: true,
                output: true,
                wide: false,
            };
            assert!(runs_blocked(&g, m, c, 1, all), "case {i}");
            let plane = g.out_vol();
            let x = values(n * c * plane, 7 * i as u64);
            let wv = values(m * c, 7 * i as u64 + 1);
            let bias = values(m, 7 * i as u64 + 2);
            let packed = pack_weights(&wv, m, 1, c);
            let mut want = vec![0.0f32; n * m * plane];
            super::super::conv_direct::conv(
                isa,
                &x,
                &wv,
                Some(&bias),
                &mut want,
                n,
                c,
                m,
                1,
                &g,
                None,
            );
            let xb = block_slice(&x, n, c, plane);
            for (input, output) in [(true, false), (false, true), (true, true)] {
                let layouts = Layouts {
                    input,
                    output,
                    wide: false,
                };
                let mut got = vec![f32::NAN; want.len()];
                let from = if input { &xb } else { &x };
                conv(
                    &packed,
                    from,
                    Some(&bias),
                    &mut got,
                    n,
                    c,
                    m,
                    1,
                    &g,
                    None,
                    layouts,
                );
                let got = if output {
                    unblock_slice(&got, n, m, plane)
                } else {
                    got
                };
                for (j, (a, e)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(a.to_bits(), e.to_bits(), "case {i} {layouts:?}, output {j}");
                }
            }
        }
    }
}
