//! Direct f32 convolution with AVX-512 or AVX2 and FMA, for 1-D and 2-D convs of any
//! stride, dilation and padding with more than one input channel per group.
//!
//! The im2col + GEMM path copies every input value once per kernel tap and packs the
//! copy again inside the GEMM, and pre-fills the output with the bias: on the small
//! channel counts of mobile CNNs that copying costs about as much as the arithmetic.
//! Here each output tile (AVX2: 6 channels × 16 positions; AVX-512: 12 channels × 32
//! positions) is summed in registers straight from the input planes, starting from
//! the bias, and stored once.
//!
//! Input that needs padding or has a stride is copied, a few rows of one block of
//! channels at a time right before they are used (so the copy stays in cache), with
//! the zero padding in place and split into `stride × stride` phase planes (rows and
//! columns `p, p + s, p + 2s, ...`): every tap of every output tile then reads a
//! tile's width of consecutive values, and with AVX-512 a task's output rows are
//! summed as one line over the planes' width (see `Layout::plan_copy`). Unpadded
//! stride-1 convs on narrow rows, whose last tile per row would be mostly empty, are
//! summed as one line at the input's row width instead
//! (the few positions between rows are computed and dropped: by AVX-512 as it stores,
//! by AVX2 in a copy from a buffer), so nearly every tile is full.
//! Each output element is `bias + Σ_c Σ_taps w·x` summed in that order with
//! fused multiply-adds, whatever the instruction set, the tiling or the thread count,
//! so the AVX2 and AVX-512 kernels give the same bits.

use std::ops::Range;

use rayon::prelude::*;

use super::gemm_util::{Scalar, SendPtr};
pub(crate) use crate::cpu::Isa;

use super::window::{Win3, split_row_stride2};

/// Output channels and positions of one register tile, per instruction set.
const MR_AVX2: usize = 6;
const NR_AVX2: usize = 16;
const MR_AVX512: usize = 12;
const NR_AVX512: usize = 32;
/// The most output channels any tile has.
const MR_MAX: usize = if MR_AVX2 > MR_AVX512 {
    MR_AVX2
} else {
    MR_AVX512
};
/// Input elements one task reads per block of input channels (128 KiB, a quarter of
/// a 512 KiB L2 cache), which sets how many output rows or columns a task covers at
/// most; on more than one thread groups of lines may be smaller, so that threads get
/// as many (`par::even_chunk`). Each output is summed alone, in the same order,
/// whatever its task: results never depend on threads.
const TASK_INPUT: usize = 1 << 15;
/// Output channels per task when a conv has too few positions to split.
const M_CHUNK: usize = 48;
/// Multiply-adds per output a tile sums before the next tile (input channels times
/// kernel taps, at least one channel).
const K_BLOCK: usize = 256;
/// Multiply-adds below which a conv runs on the calling thread.
const SERIAL_WORK: usize = 1 << 20;
/// Most sums one task keeps in its wide-line buffer (256 KiB), which bounds the
/// per-thread scratch that buffer leaves behind.
const WIDE_SUMS: usize = 1 << 16;
/// Outputs per channel an element-wise tail runs on at least, where lines allow.
const TAIL_SPAN: usize = 512;

impl Isa {
    /// Output channels and positions of one register tile.
    fn tile(self) -> (usize, usize) {
        match self {
            Isa::Avx2Fma => (MR_AVX2, NR_AVX2),
            Isa::Avx512 => (MR_AVX512, NR_AVX512),
        }
    }
}

/// Whether [`conv`] handles this geometry (1-D or 2-D, pads not negative) with `cg`
/// input channels per group.
pub(crate) fn fits(g: &Win3, cg: usize) -> bool {
    cg > 1 && g.input[0] == 1 && g.out[0] == 1 && g.kernel[0] == 1 && g.pad.iter().all(|&p| p >= 0)
}

/// Whether `oh` output rows of `ow` positions fill more of the vectors of `nr`-wide
/// tiles (two vectors each; a tail is summed in one vector when it fits) as one line at
/// the input's row width `iw` than row by row: narrow rows leave much of their last
/// vector empty, a wide line only the `iw - ow` positions each row skips.
fn wide_fills_better(oh: usize, ow: usize, iw: usize, nr: usize) -> bool {
    let by_rows = oh * ow.next_multiple_of(nr / 2);
    let wide = ((oh - 1) * iw + ow).next_multiple_of(nr / 2);
    // Vectors computed, with a margin for the trim.
    wide * 10 < by_rows * 9
}

/// How the kernel reads one input channel: output line `l`, position `j` and tap `t`
/// read element `l * line_stride + j + taps[t]` of the channel (as is, or its copy).
struct Layout {
    lines: usize,
    line_len: usize,
    line_stride: usize,
    taps: Vec<usize>,
    /// Padded, phase-split planes have to be built; otherwise the input is read as is.
    copy: bool,
    /// Padded row length and phase width of a copy (the input's for plain input).
    row_len: usize,
    phase: usize,
    /// Padded rows between consecutive output lines, and rows one output line reads.
    row_step: usize,
    window_rows: usize,
    /// Positions are counted at the input's row width `wide` (one line over the whole
    /// plane, `wide - ow` unused positions per row) and trimmed into the output; for a
    /// copy, at its planes' width, one line over a task's output rows.
    wide: Option<usize>,
    /// Rows of each phase plane of a copy (see [`Layout::plan_copy`]).
    slots: usize,
}

impl Layout {
    fn new(g: &Win3, nr: usize) -> Layout {
        let [_, ih, iw] = g.input;
        let [_, oh, ow] = g.out;
        let [_, kh, kw] = g.kernel;
        let [_, sh, sw] = g.stride;
        let [_, dh, dw] = g.dil;
        let (ph, pw) = (g.pad[1] as usize, g.pad[2] as usize);
        // Padded extent: the last output's last tap, plus one.
        let rows = (oh - 1) * sh + (kh - 1) * dh + 1;
        let cols = (ow - 1) * sw + (kw - 1) * dw + 1;
        if sw == 1 && ph == 0 && pw == 0 && cols == iw && rows <= ih {
            // Plain input; when lines follow each other in memory they are one line.
            let taps = (0..kh)
                .flat_map(|a| (0..kw).map(move |b| a * dh * iw + b * dw))
                .collect();
            let (lines, line_len, line_stride, wide) = if sh == 1 && ow == iw {
                (1, oh * ow, 0, None)
            } else if sh == 1 && wide_fills_better(oh, ow, iw, nr) {
                (1, (oh - 1) * iw + ow, 0, Some(iw))
            } else {
                (oh, ow, sh * iw, None)
            };
            return Layout {
                lines,
                line_len,
                line_stride,
                taps,
                copy: false,
                row_len: iw,
                phase: iw,
                row_step: sh,
                window_rows: (kh - 1) * dh + 1,
                wide,
                slots: 0,
            };
        }
        let phase = cols.div_ceil(sw);
        Layout {
            lines: oh,
            line_len: ow,
            line_stride: phase,
            // Set by `plan_copy`, which needs the task size.
            taps: Vec::new(),
            copy: true,
            row_len: phase * sw,
            phase,
            row_step: sh,
            window_rows: (kh - 1) * dh + 1,
            wide: None,
            slots: 0,
        }
    }

    /// For a copy read by tasks of at most `line_group` output lines: the rows of its
    /// phase planes and the taps' offsets in them, and whether a task's lines are summed
    /// as one wide line (`wide_ok`: the caller can trim one).
    ///
    /// A task's padded rows are split into `sh × sw` phase planes: row `r` (from the
    /// task's first), column `col` go to plane `(r % sh, col % sw)`, row `r / sh`,
    /// column `col / sw`. Then a tap reads consecutive values along an output line,
    /// and the next output line one plane row (`phase` values) further on, whatever
    /// the stride: output `(l, j)` is position `l · phase + j` of one line, and the
    /// `phase - ow` positions after each output row are computed and dropped.
    fn plan_copy(&mut self, g: &Win3, line_group: usize, nr: usize, wide_ok: bool) {
        let [_, kh, kw] = g.kernel;
        let [_, sh, sw] = g.stride;
        let [_, dh, dw] = g.dil;
        let copy_rows = (line_group - 1) * sh + self.window_rows;
        let (slots, phase) = (copy_rows.div_ceil(sh), self.phase);
        self.slots = slots;
        self.taps = (0..kh)
            .flat_map(|a| {
                (0..kw).map(move |b| {
                    let (r, c) = (a * dh, b * dw);
                    ((r % sh * sw + c % sw) * slots + r / sh) * phase + c / sw
                })
            })
            .collect();
        let ow = g.out[2];
        if wide_ok && line_group > 1 && wide_fills_better(line_group, ow, phase, nr) {
            self.wide = Some(phase);
        }
    }

    /// Values of one channel's copy.
    fn copy_chan(&self) -> usize {
        self.row_step * self.row_len * self.slots
    }

    /// The outputs (flat, in each channel plane) a task of lines `lines` and wide
    /// positions `cols` writes: always a run, since tasks split planes in order.
    fn wide_task_outputs(&self, g: &Win3, lines: Range<usize>, cols: Range<usize>) -> Range<usize> {
        let ow = g.out[2];
        match (self.copy, self.wide) {
            // Over the input's rows, of which `iw - ow` positions each are dropped.
            (false, Some(iw)) => {
                let out = |p: usize| p / iw * ow + (p % iw).min(ow);
                out(cols.start)..out(cols.end)
            }
            // Over the copy's rows: whole output rows.
            (true, Some(_)) => lines.start * ow..lines.end * ow,
            (_, None) => unreachable!("lines that are not wide are written as they are"),
        }
    }

    /// Positions of a task's lines `l0..l1`: as one wide line, or each line's.
    fn task_line_len(&self, lines: usize) -> usize {
        match (self.copy, self.wide) {
            (true, Some(phase)) => (lines - 1) * phase + self.line_len,
            _ => self.line_len,
        }
    }

    /// Copies padded rows `r0..` of one input channel into `dst`, the phase planes of
    /// [`Layout::plan_copy`] (`copy_chan` values; `r0` is a multiple of the row
    /// stride). Every element of `dst` is written.
    fn fill_rows(&self, g: &Win3, src: &[f32], dst: &mut [f32], r0: usize) {
        let [_, ih, iw] = g.input;
        let (sh, sw) = (self.row_step, g.stride[2]);
        let (ph, pw) = (g.pad[1] as usize, g.pad[2] as usize);
        let (phase, slots) = (self.phase, self.slots);
        let cols = iw.min(self.row_len.saturating_sub(pw));
        for i in 0..sh * slots {
            let (pr, slot) = (i % sh, i / sh);
            // Phase `pc` of this row: plane `pr · sw + pc`, row `slot`.
            let at = |pc: usize| ((pr * sw + pc) * slots + slot) * phase;
            // No columns: the pad covers every column a tap reads.
            let row = (r0 + i)
                .checked_sub(ph)
                .filter(|&h| h < ih && cols > 0)
                .map(|h| &src[h * iw..][..cols]);
            match (row, sw) {
                (None, _) => (0..sw).for_each(|pc| dst[at(pc)..][..phase].fill(0.0)),
                (Some(row), 1) => {
                    let out = &mut dst[at(0)..][..phase];
                    out[..pw].fill(0.0);
                    out[pw..pw + cols].copy_from_slice(row);
                    out[pw + cols..].fill(0.0);
                }
                (Some(row), 2) => {
                    let (head, tail) = dst.split_at_mut(at(1));
                    let (p0, p1) = (&mut head[at(0)..][..phase], &mut tail[..phase]);
                    p0.fill(0.0);
                    p1.fill(0.0);
                    split_row_stride2(row, pw, p0, p1);
                }
                (Some(row), _) => {
                    for col in 0..self.row_len {
                        let v = col.checked_sub(pw).and_then(|c| row.get(c));
                        dst[at(col % sw) + col / sw] = v.copied().unwrap_or(0.0);
                    }
                }
            }
        }
    }
}

/// `y = conv(x, w) + bias` for f32 NCHW data; `y` is written in full. The caller checks
/// that the CPU has `isa` (e.g. from [`crate::cpu::conv_isa`]) and [`fits`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv(
    isa: Isa,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    y: &mut [f32],
    n: usize,
    c: usize,
    m: usize,
    group: usize,
    g: &Win3,
    tail: Option<&crate::fusion::Tail>,
) {
    let (cg, mg) = (c / group, m / group);
    let (mr, nr) = isa.tile();
    let mut lay = Layout::new(g, nr);
    let (in_vol, out_vol, k_vol) = (g.in_vol(), g.out_vol(), g.k_vol());
    let kdim = cg * k_vol;
    let work = n * m * out_vol * kdim;

    // Tasks: output lines in groups (or, for a single line, column ranges) sized by
    // the input one channel block of them reads, times channel chunks when positions
    // alone give few tasks.
    let c_block = (K_BLOCK / k_vol).clamp(1, cg);
    let (line_group, col_chunk) = if lay.lines == 1 {
        if lay.copy {
            lay.plan_copy(g, 1, nr, false);
        }
        let mut cols = (TASK_INPUT / (c_block * k_vol)).max(nr) / nr * nr;
        if lay.wide.is_some() && isa != Isa::Avx512 {
            cols = cols.min((WIDE_SUMS / mg).max(nr) / nr * nr);
        }
        (1, cols.min(lay.line_len.next_multiple_of(nr)))
    } else {
        let per_line = c_block * lay.row_step * lay.row_len;
        let most = (TASK_INPUT / per_line.max(1)).clamp(1, lay.lines);
        // On more than one thread, as many tasks per thread: MobileNetV3's 3x3 stride-2
        // stem (3 -> 16 channels, 112x112 outputs) made five groups of lines, three on
        // one thread and two on the other.
        let line_group = crate::par::even_chunk(lay.lines, most, n * group);
        if lay.copy {
            // Wide copies are trimmed by AVX-512's stores only.
            lay.plan_copy(g, line_group, nr, isa == Isa::Avx512);
        }
        (line_group, lay.task_line_len(line_group))
    };
    // AVX-512 stores wide lines through a `Trim`; AVX2 sums them in a buffer.
    let trim = match lay.wide {
        Some(iw) if isa == Isa::Avx512 => {
            Some(Trim::new(lay.task_line_len(line_group), iw, g.out[2]))
        }
        _ => None,
    };
    let trim = trim.as_ref();
    let col_tasks = lay.line_len.div_ceil(col_chunk);
    let line_tasks = lay.lines.div_ceil(line_group) * col_tasks;
    let m_chunk = if n * group * line_tasks < 4 && mg > M_CHUNK {
        M_CHUNK
    } else {
        mg
    };
    let m_tasks = mg.div_ceil(m_chunk);
    let tasks = n * group * m_tasks * line_tasks;
    let channels_inner = k_vol > 1;

    let yp = SendPtr(y.as_mut_ptr());
    let lay = &lay;
    let task = |t: usize| {
        let lt = t % line_tasks;
        let mt = t / line_tasks % m_tasks;
        let bg = t / line_tasks / m_tasks;
        let (b, gi) = (bg / group, bg % group);
        let (l0, j0) = (lt / col_tasks * line_group, lt % col_tasks * col_chunk);
        let l1 = (l0 + line_group).min(lay.lines);
        let j1 = (j0 + col_chunk).min(lay.task_line_len(l1 - l0));
        let m0 = mt * m_chunk;
        let m1 = (m0 + m_chunk).min(mg);
        let xg = &x[(b * c + gi * cg) * in_vol..][..cg * in_vol];
        let yp = yp;
        // Wide lines without a `Trim` are summed into a buffer of the task's channels ×
        // positions, and trimmed into `y` at the end; other tasks write to `y` directly.
        let wide_len = match (lay.wide, trim) {
            (Some(_), None) => (m1 - m0) * (j1 - j0),
            _ => 0,
        };
        f32::with_scratch(wide_len, |wide_buf| {
            let wide_ptr = SendPtr(wide_buf.as_mut_ptr());
            // Input channels in blocks; later blocks add to the sums stored by earlier
            // ones (exact: f32 values round-trip through memory).
            for c0 in (0..cg).step_by(c_block) {
                let cn = c_block.min(cg - c0);
                // The padded rows these lines read, of this block's channels, copied into
                // a per-thread buffer that stays in cache; plain input is read in place.
                let first_row = l0 * lay.row_step;
                // A vector's worth of slack after a copy lets AVX2 read the last tile of
                // a line in full (see `avx2::segment`).
                let copy_len = if lay.copy {
                    cn * lay.copy_chan() + NR_AVX2
                } else {
                    0
                };
                f32::with_scratch(copy_len, |buf| {
                    let (xs, chan, line0) = if lay.copy {
                        let planes = buf[..cn * lay.copy_chan()].chunks_exact_mut(lay.copy_chan());
                        for (ci, dst) in planes.enumerate() {
                            lay.fill_rows(g, &xg[(c0 + ci) * in_vol..][..in_vol], dst, first_row);
                        }
                        (&buf[..], lay.copy_chan(), l0)
                    } else {
                        (&xg[c0 * in_vol..], in_vol, 0)
                    };
                    // Output channels [mb, mb + mr) × positions [j, j + len) of line l.
                    let run = |l: usize, j: usize, len: usize, mb: usize| {
                        let rows = mr.min(m1 - mb);
                        let ch = gi * mg + mb;
                        let wq = &w[ch * kdim + c0 * k_vol..][..(rows - 1) * kdim + cn * k_vol];
                        let base = (l - line0) * lay.line_stride + j;
                        let init = Init::new(c0, bias, ch, rows);
                        // SAFETY: this writes channels [ch, ch + rows) × positions
                        // [l*line_len + j, + len) of image b, a region no other task writes
                        // (tasks split images, groups, channel chunks and lines or
                        // columns), inside `y`'s n*m*out_vol elements (through `trim`,
                        // the outputs of wide positions [j, j + len)) or this task's
                        // wide buffer of (m1 - m0) × (j1 - j0). Reads stay inside
                        // `xs`: `cn` channels of `chan` elements, where position j + len - 1
                        // of line l plus the last tap is the last element an output needs.
                        unsafe {
                            let plane = yp.0.add((b * m + ch) * out_vol);
                            let (out, ldo, trim) = match (lay.wide, trim) {
                                // A wide copy's line starts at output line l.
                                (Some(_), Some(t)) => {
                                    (plane.add(l * lay.line_len), out_vol, Some((t, j)))
                                }
                                (Some(_), None) => (
                                    wide_ptr.0.add((mb - m0) * (j1 - j0) + j - j0),
                                    j1 - j0,
                                    None,
                                ),
                                (None, _) => (plane.add(l * lay.line_len + j), out_vol, None),
                            };
                            let terms = Terms {
                                chan,
                                channels: cn,
                                taps: &lay.taps,
                                w: wq,
                                w_row: kdim,
                            };
                            let dest = Dest { out, ldo, trim };
                            segment(isa, xs, base, terms, rows, init, dest, len);
                        }
                    };
                    // A wide copy sums the task's lines as one, from line l0.
                    let lines = match (lay.copy, lay.wide) {
                        (true, Some(_)) => l0..l0 + 1,
                        _ => l0..l1,
                    };
                    // The tail runs on outputs once their last input block is summed,
                    // while they are in cache: per line, or per channel block of a
                    // line written a stream at a time (wide lines: at the task's end).
                    let tail = tail.filter(|_| c0 + cn == cg && lay.wide.is_none());
                    // Outputs of lines `ls` (whole lines when there are several) of
                    // channels `chans`.
                    let finish = |ls: Range<usize>, chans: Range<usize>| {
                        let Some(tail) = tail else { return };
                        let len = (ls.len() - 1) * lay.line_len + j1 - j0;
                        let at = (b * m + gi * mg + chans.start) * out_vol
                            + ls.start * lay.line_len
                            + j0;
                        // SAFETY: outputs this task wrote (above), and only it.
                        unsafe { tail.apply_runs(yp.0, at, chans.len(), len, out_vol) };
                    };
                    // Short lines are finished a few at a time: a call per line of 7
                    // or 14 outputs cost more than the tail's arithmetic.
                    let mut unfinished = lines.start;
                    for l in lines.clone() {
                        if channels_inner {
                            // The tile's input stays in L1 across the channel's row blocks.
                            for j in (j0..j1).step_by(nr) {
                                let len = nr.min(j1 - j);
                                (m0..m1).step_by(mr).for_each(|mb| run(l, j, len, mb));
                            }
                            if (l + 1 - unfinished) * (j1 - j0) >= TAIL_SPAN || l + 1 == lines.end {
                                finish(unfinished..l + 1, m0..m1);
                                unfinished = l + 1;
                            }
                        } else {
                            // A tile's output rows are written at a time, a stream each.
                            for mb in (m0..m1).step_by(mr) {
                                run(l, j0, j1 - j0, mb);
                                finish(l..l + 1, mb..(mb + mr).min(m1));
                            }
                        }
                    }
                });
            }
            if let (Some(iw), None) = (lay.wide, trim) {
                let first = (b * m + gi * mg + m0) * out_vol;
                // SAFETY: the output positions of wide positions [j0, j1) of channels
                // [m0, m1) belong to this task alone, inside `y`.
                unsafe { trim_wide(wide_buf, j0..j1, iw, g.out[2], yp.0.add(first), out_vol) };
            }
        });
        if let Some(tail) = tail.filter(|_| lay.wide.is_some()) {
            let outputs = lay.wide_task_outputs(g, l0..l1, j0..j1);
            let at = (b * m + gi * mg + m0) * out_vol + outputs.start;
            // SAFETY: the task's outputs of its channels, written above by it alone.
            unsafe { tail.apply_runs(yp.0, at, m1 - m0, outputs.len(), out_vol) };
        }
    };
    if tasks == 1 || work < SERIAL_WORK || !crate::par::enabled() {
        (0..tasks).for_each(task);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
}

/// Where the AVX-512 kernel stores the 16-lane vectors of a wide line straight into the
/// output, dropping the lanes of the `iw - ow` positions each row skips: the kept lanes
/// of a vector are consecutive outputs, so they are packed together (`vcompressps`)
/// and stored at the output of the first one. This replaces the wide buffer and its
/// row-by-row trim (one short copy per output row and channel), which on convs of few
/// products per output cost as much as a tenth of the conv (R-Net's 3->28: 0.015 ->
/// 0.013 ms per run without it).
struct Trim {
    /// Per vector of 16 wide positions (vector `v` starts at position `16 v`): the
    /// lanes that are outputs, and the output index of its first kept lane.
    lanes: Vec<u16>,
    at: Vec<usize>,
}

impl Trim {
    fn new(line_len: usize, iw: usize, ow: usize) -> Trim {
        let vectors = line_len.div_ceil(16);
        let lanes = (0..vectors)
            .map(|v| {
                (0..16)
                    .filter(|l| {
                        let p = 16 * v + l;
                        p < line_len && p % iw < ow
                    })
                    .fold(0u16, |k, l| k | 1 << l)
            })
            .collect();
        let at = (0..vectors)
            .map(|v| (16 * v / iw) * ow + (16 * v % iw).min(ow))
            .collect();
        Trim { lanes, at }
    }
}

/// Copies the sums of wide positions `span` (one row of `span.len()` per channel in
/// `sums`) to the outputs they stand for: wide position `p` is output row `p / iw`,
/// column `p % iw`, and columns from `ow` on are not outputs.
///
/// # Safety
/// `y` points to as many output planes of `out_vol` values as `sums` has channels.
unsafe fn trim_wide(
    sums: &[f32],
    span: std::ops::Range<usize>,
    iw: usize,
    ow: usize,
    y: *mut f32,
    out_vol: usize,
) {
    for (r, sums) in sums.chunks_exact(span.len()).enumerate() {
        let mut p = span.start;
        while p < span.end {
            let (row, col) = (p / iw, p % iw);
            if col < ow {
                let end = (row * iw + ow).min(span.end);
                // SAFETY: row < out rows and col..col + end - p within the row, so the
                // target is inside plane r.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        sums.as_ptr().add(p - span.start),
                        y.add(r * out_vol + row * ow + col),
                        end - p,
                    );
                }
            }
            p = ((row + 1) * iw).min(span.end);
        }
    }
}

/// What a tile sums over: `channels` input channels `chan` elements apart, each read
/// at every tap offset, times the weights of each output channel, which are read in
/// place (rows `w_row` apart, one weight per channel and tap in the order summed):
/// a broadcast costs the same from any address, and packing them per call cost more
/// than the sums on small convs.
#[derive(Clone, Copy)]
struct Terms<'a> {
    chan: usize,
    channels: usize,
    taps: &'a [usize],
    w: &'a [f32],
    w_row: usize,
}

/// Where a segment's sums go: `out` points to its first row, rows `ldo` apart; with a
/// `trim` (AVX-512 only), `out` is the start of each row's output plane and the sums
/// are those of wide positions from the given one on, stored through the [`Trim`].
#[derive(Clone, Copy)]
struct Dest<'a> {
    out: *mut f32,
    ldo: usize,
    trim: Option<(&'a Trim, usize)>,
}

/// What a tile's sums start from.
#[derive(Clone, Copy)]
enum Init {
    /// The bias of the tile's channels (zero beyond `rows` or without a bias).
    Bias([f32; MR_MAX]),
    /// The values in the output, stored by the previous channel block.
    Output,
}

impl Init {
    fn new(c0: usize, bias: Option<&[f32]>, ch: usize, rows: usize) -> Init {
        if c0 > 0 {
            return Init::Output;
        }
        Init::Bias(std::array::from_fn(|r| match bias {
            Some(b) if r < rows => b[ch + r],
            _ => 0.0,
        }))
    }
}

/// `rows` (at most `isa`'s tile rows) channels × `len` consecutive positions: full
/// tiles and a last, narrower one.
///
/// # Safety
/// The CPU has `isa`; `dest` holds `rows` rows of `len` writable values, `ldo` apart
/// (with a trim: of the outputs of its `len` wide positions, which start at a multiple
/// of 16); `base + taps[t] + len - 1 + (channels - 1) * chan < x.len()` for every tap.
#[allow(clippy::too_many_arguments)]
unsafe fn segment(
    isa: Isa,
    x: &[f32],
    base: usize,
    terms: Terms,
    rows: usize,
    init: Init,
    dest: Dest,
    len: usize,
) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: forwarded from the caller.
    unsafe {
        let x_len = x.len();
        let x = x.as_ptr().add(base);
        let (out, ldo) = (dest.out, dest.ldo);
        debug_assert!(isa == Isa::Avx512 || dest.trim.is_none());
        match isa {
            Isa::Avx2Fma => {
                let to = avx2::Out {
                    out,
                    ldo,
                    len,
                    readable: x_len - base,
                };
                match rows {
                    6 => avx2::segment::<6>(x, terms, init, to),
                    5 => avx2::segment::<5>(x, terms, init, to),
                    4 => avx2::segment::<4>(x, terms, init, to),
                    3 => avx2::segment::<3>(x, terms, init, to),
                    2 => avx2::segment::<2>(x, terms, init, to),
                    _ => avx2::segment::<1>(x, terms, init, to),
                }
            }
            Isa::Avx512 => match rows {
                12 => avx512::segment::<12>(x, terms, init, dest, len),
                11 => avx512::segment::<11>(x, terms, init, dest, len),
                10 => avx512::segment::<10>(x, terms, init, dest, len),
                9 => avx512::segment::<9>(x, terms, init, dest, len),
                8 => avx512::segment::<8>(x, terms, init, dest, len),
                7 => avx512::segment::<7>(x, terms, init, dest, len),
                6 => avx512::segment::<6>(x, terms, init, dest, len),
                5 => avx512::segment::<5>(x, terms, init, dest, len),
                4 => avx512::segment::<4>(x, terms, init, dest, len),
                3 => avx512::segment::<3>(x, terms, init, dest, len),
                2 => avx512::segment::<2>(x, terms, init, dest, len),
                _ => avx512::segment::<1>(x, terms, init, dest, len),
            },
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, x, base, terms, rows, init, dest, len);
        unreachable!("the direct conv runs only where `available` said so");
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// Where a segment's sums go (`len` positions of each row, rows `ldo` apart from
    /// `out`), and how many values from its first input position may be read.
    #[derive(Clone, Copy)]
    pub(super) struct Out {
        pub out: *mut f32,
        pub ldo: usize,
        pub len: usize,
        pub readable: usize,
    }

    /// Lanes `i` with `i < n` set, for the first and second 8 positions.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn masks(n: usize) -> (__m256i, __m256i) {
        let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let n = n as i32;
        (
            _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx),
            _mm256_cmpgt_epi32(_mm256_set1_epi32(n - 8), idx),
        )
    }

    /// See [`super::segment`]; `R` rows.
    ///
    /// The last, narrower tile reads whole vectors when the input has values past the
    /// segment's end (the next row, or a copy's slack), and drops the extra lanes'
    /// sums: masked loads (`vmaskmovps`) cost Zen 3 about twice the FMA time of a
    /// tile, and a ResNet-50 3x3 conv on 14x14 planes, whose every tile is narrower
    /// than 16 positions, ran at a third of the FMA peak (`kernel_table`).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn segment<const R: usize>(
        x: *const f32,
        terms: super::Terms,
        init: super::Init,
        to: Out,
    ) {
        let nr = super::NR_AVX2;
        let (len, out, ldo) = (to.len, to.out, to.ldo);
        let full = len / nr * nr;
        // The offset of the last row a tile reads, from its first position.
        let last_row =
            (terms.channels - 1) * terms.chan + terms.taps.iter().max().copied().unwrap_or(0);
        // SAFETY: every tile lies inside the segment the caller vouched for; a tail
        // reads whole vectors only inside the `readable` values.
        unsafe {
            for j in (0..full).step_by(nr) {
                tile::<R, 2, false, false>(x.add(j), terms, init, out.add(j), ldo, nr);
            }
            // A tail of at most one vector's positions is summed in one vector.
            let (x, out) = (x.add(full), out.add(full));
            let whole = |v: usize| full + last_row + 8 * v <= to.readable;
            match len - full {
                0 => {}
                rest if rest <= nr / 2 && whole(1) => {
                    tile::<R, 1, true, false>(x, terms, init, out, ldo, rest)
                }
                rest if rest <= nr / 2 => tile::<R, 1, true, true>(x, terms, init, out, ldo, rest),
                rest if whole(2) => tile::<R, 2, true, false>(x, terms, init, out, ldo, rest),
                rest => tile::<R, 2, true, true>(x, terms, init, out, ldo, rest),
            }
        }
    }

    /// One tile of `R` rows × `cols` (≤ 8 `V`) positions in `V` vectors; `PARTIAL`
    /// when fewer than `8 V`, with the input read through masks if `MASK_LOADS` (else
    /// in whole vectors). A partial tile's outputs go through a buffer on the stack:
    /// masked stores are slower still on Zen 3.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const R: usize, const V: usize, const PARTIAL: bool, const MASK_LOADS: bool>(
        x: *const f32,
        terms: super::Terms,
        init: super::Init,
        out: *mut f32,
        ldo: usize,
        cols: usize,
    ) {
        let (m0, m1) = masks(cols);
        let masks = [m0, m1];
        let mut acc = [[_mm256_setzero_ps(); V]; R];
        let mut wp = terms.w.as_ptr();
        let mut staged = [[0.0f32; 16]; R];
        // SAFETY (whole body): the caller guarantees every read of `x` (in whole
        // vectors unless MASK_LOADS) and every access to `out`'s `cols` positions per
        // row is in bounds; `w` holds `R` rows of weights, `w_row` apart, one weight
        // per (channel, tap).
        unsafe {
            for (r, a) in acc.iter_mut().enumerate() {
                let o = out.add(r * ldo);
                if PARTIAL && matches!(init, super::Init::Output) {
                    std::ptr::copy_nonoverlapping(o, staged[r].as_mut_ptr(), cols);
                }
                for (v, a) in a.iter_mut().enumerate() {
                    *a = match init {
                        super::Init::Bias(b) => _mm256_set1_ps(b[r]),
                        super::Init::Output if PARTIAL => {
                            _mm256_loadu_ps(staged[r].as_ptr().add(8 * v))
                        }
                        super::Init::Output => _mm256_loadu_ps(o.add(8 * v)),
                    };
                }
            }
            for ci in 0..terms.channels {
                let xc = x.add(ci * terms.chan);
                for &off in terms.taps {
                    let p = xc.add(off);
                    let mut xv = [_mm256_setzero_ps(); V];
                    for (v, xv) in xv.iter_mut().enumerate() {
                        *xv = if MASK_LOADS {
                            _mm256_maskload_ps(p.add(8 * v), masks[v])
                        } else {
                            _mm256_loadu_ps(p.add(8 * v))
                        };
                    }
                    for (r, a) in acc.iter_mut().enumerate() {
                        let wv = _mm256_broadcast_ss(&*wp.add(r * terms.w_row));
                        for (a, &xv) in a.iter_mut().zip(&xv) {
                            *a = _mm256_fmadd_ps(wv, xv, *a);
                        }
                    }
                    wp = wp.add(1);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                let o = out.add(r * ldo);
                for (v, &a) in a.iter().enumerate() {
                    if PARTIAL {
                        _mm256_storeu_ps(staged[r].as_mut_ptr().add(8 * v), a);
                    } else {
                        _mm256_storeu_ps(o.add(8 * v), a);
                    }
                }
                if PARTIAL {
                    std::ptr::copy_nonoverlapping(staged[r].as_ptr(), o, cols);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// See [`super::segment`]; `R` rows.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn segment<const R: usize>(
        x: *const f32,
        terms: super::Terms,
        init: super::Init,
        dest: super::Dest,
        len: usize,
    ) {
        let nr = super::NR_AVX512;
        let full = len / nr * nr;
        // The tile starting `j` positions into the segment.
        let at = |j: usize| super::Dest {
            out: match dest.trim {
                Some(_) => dest.out,
                // SAFETY: inside the segment, as the caller vouched.
                None => unsafe { dest.out.add(j) },
            },
            ldo: dest.ldo,
            trim: dest.trim.map(|(t, p)| (t, p + j)),
        };
        // SAFETY: every tile lies inside the segment the caller vouched for.
        unsafe {
            for j in (0..full).step_by(nr) {
                tile::<R, 2, false>(x.add(j), terms, init, at(j), nr);
            }
            // A tail of at most one vector's positions is summed in one vector.
            match len - full {
                0 => {}
                rest if rest <= nr / 2 => {
                    tile::<R, 1, true>(x.add(full), terms, init, at(full), rest)
                }
                rest => tile::<R, 2, true>(x.add(full), terms, init, at(full), rest),
            }
        }
    }

    /// Lanes `i` with `i < n` set, for `n` in `0..=16`.
    fn mask(n: usize) -> __mmask16 {
        ((1u32 << n) - 1) as __mmask16
    }

    /// One tile of `R` rows × `cols` (≤ 16 `V`) positions in `V` vectors; `MASKED`
    /// when fewer than `16 V`. Masked-off lanes are neither read nor written; with a
    /// trim, neither are the lanes it drops, and the kept ones are packed together.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile<const R: usize, const V: usize, const MASKED: bool>(
        x: *const f32,
        terms: super::Terms,
        init: super::Init,
        dest: super::Dest,
        cols: usize,
    ) {
        let masks = [mask(cols.min(16)), mask(cols.saturating_sub(16))];
        // Per vector: its offset in an output row, the lanes it keeps, and whether it
        // packs them (a trim) or stores them in place.
        let mut place = [(0usize, 0 as __mmask16); V];
        for (v, pl) in place.iter_mut().enumerate() {
            *pl = match dest.trim {
                None => (16 * v, masks[v]),
                Some((t, p)) => {
                    let i = p / 16 + v;
                    (t.at[i], t.lanes[i] & masks[v])
                }
            };
        }
        let packed = dest.trim.is_some();
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        let mut wp = terms.w.as_ptr();
        // SAFETY (whole body): the caller guarantees every read of `x` and every
        // access to `out` is in bounds; `w` holds `R` rows of weights, `w_row` apart,
        // one weight per (channel, tap).
        unsafe {
            for (r, a) in acc.iter_mut().enumerate() {
                let o = dest.out.add(r * dest.ldo);
                for (a, &(off, k)) in a.iter_mut().zip(&place) {
                    *a = match init {
                        super::Init::Bias(b) => _mm512_set1_ps(b[r]),
                        super::Init::Output if packed => {
                            let kept = mask(k.count_ones() as usize);
                            _mm512_maskz_expand_ps(k, _mm512_maskz_loadu_ps(kept, o.add(off)))
                        }
                        super::Init::Output if MASKED => _mm512_maskz_loadu_ps(k, o.add(off)),
                        super::Init::Output => _mm512_loadu_ps(o.add(off)),
                    };
                }
            }
            for ci in 0..terms.channels {
                let xc = x.add(ci * terms.chan);
                for &off in terms.taps {
                    let p = xc.add(off);
                    let mut xv = [_mm512_setzero_ps(); V];
                    for (v, xv) in xv.iter_mut().enumerate() {
                        *xv = if MASKED {
                            _mm512_maskz_loadu_ps(masks[v], p.add(16 * v))
                        } else {
                            _mm512_loadu_ps(p.add(16 * v))
                        };
                    }
                    for (r, a) in acc.iter_mut().enumerate() {
                        let wv = _mm512_set1_ps(*wp.add(r * terms.w_row));
                        for (a, &xv) in a.iter_mut().zip(&xv) {
                            *a = _mm512_fmadd_ps(wv, xv, *a);
                        }
                    }
                    wp = wp.add(1);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                let o = dest.out.add(r * dest.ldo);
                for (&a, &(off, k)) in a.iter().zip(&place) {
                    if packed {
                        let kept = mask(k.count_ones() as usize);
                        _mm512_mask_storeu_ps(o.add(off), kept, _mm512_maskz_compress_ps(k, a));
                    } else if MASKED {
                        _mm512_mask_storeu_ps(o.add(off), k, a);
                    } else {
                        _mm512_storeu_ps(o.add(off), a);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Values in [-1, 1) from a fixed generator (the packed GEMM's tests use them too).
    pub(crate) fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// A 2-D conv: batch, input channels, output channels, groups, input rows and
    /// columns, kernel, stride, dilation, pads (top, left, bottom, right).
    struct Shape {
        n: usize,
        c: usize,
        m: usize,
        group: usize,
        hw: [usize; 2],
        k: [usize; 2],
        s: [usize; 2],
        d: [usize; 2],
        p: [usize; 4],
    }

    fn run(isa: Isa, sh: &Shape) -> Vec<f32> {
        let out = |i: usize| {
            (sh.hw[i] + sh.p[i] + sh.p[i + 2] - (sh.k[i] - 1) * sh.d[i] - 1) / sh.s[i] + 1
        };
        let g = Win3 {
            input: [1, sh.hw[0], sh.hw[1]],
            out: [1, out(0), out(1)],
            kernel: [1, sh.k[0], sh.k[1]],
            stride: [1, sh.s[0], sh.s[1]],
            dil: [1, sh.d[0], sh.d[1]],
            pad: [0, sh.p[0] as isize, sh.p[1] as isize],
        };
        assert!(fits(&g, sh.c / sh.group));
        let x = values(sh.n * sh.c * g.in_vol(), 1);
        let w = values(sh.m * sh.c / sh.group * g.k_vol(), 2);
        let b = values(sh.m, 3);
        let mut y = vec![f32::NAN; sh.n * sh.m * g.out_vol()];
        conv(
            isa,
            &x,
            &w,
            Some(&b),
            &mut y,
            sh.n,
            sh.c,
            sh.m,
            sh.group,
            &g,
            None,
        );
        y
    }

    /// Groups of lines split as evenly as threads ask (see `par::even_chunk`), and every
    /// output is summed alone: the same bits at any thread count. A stem (3 channels,
    /// stride 2, 112 lines) and a stride-1 conv on two images, each of several groups
    /// of lines.
    #[test]
    fn thread_count_independent() {
        use crate::par::{in_pool, same_bits};
        let Some(isa) = crate::cpu::conv_isa() else {
            return;
        };
        let stem = Shape {
            n: 1,
            c: 3,
            m: 16,
            group: 1,
            hw: [226, 226],
            k: [3, 3],
            s: [2, 2],
            d: [1, 1],
            p: [0; 4],
        };
        let shapes = [
            Shape {
                n: 2,
                c: 16,
                hw: [64, 64],
                s: [1, 1],
                p: [1; 4],
                ..stem
            },
            stem,
        ];
        for (i, sh) in shapes.iter().enumerate() {
            let one = in_pool(1, || run(isa, sh));
            for threads in [2, 3] {
                let y = in_pool(threads, || run(isa, sh));
                assert!(same_bits(&one, &y), "shape {i}, {threads} threads");
            }
            assert!(
                one.iter().all(|v| v.is_finite()),
                "shape {i}: an output unwritten"
            );
        }
    }

    /// The AVX-512 and AVX2 kernels sum every output in the same order, so they give
    /// the same bits, on full and partial tiles of both, several channel blocks, wide
    /// lines, phase-split strides, dilation, groups and batches.
    #[test]
    fn instruction_sets_give_the_same_bits() {
        if !Isa::Avx512.supported() || !Isa::Avx2Fma.supported() {
            eprintln!("skipped: this CPU lacks AVX-512 or AVX2+FMA");
            return;
        }
        let base = Shape {
            n: 1,
            c: 16,
            m: 24,
            group: 1,
            hw: [20, 40],
            k: [3, 3],
            s: [1, 1],
            d: [1, 1],
            p: [1, 1, 1, 1],
        };
        let shapes = [
            Shape { ..base },
            Shape {
                m: 13,
                hw: [5, 33],
                ..base
            },
            Shape {
                c: 40,
                m: 9,
                hw: [6, 21],
                ..base
            },
            Shape {
                c: 300,
                m: 17,
                hw: [3, 7],
                k: [1, 1],
                p: [0; 4],
                ..base
            },
            Shape {
                c: 32,
                m: 64,
                hw: [23, 23],
                p: [0; 4],
                ..base
            },
            Shape {
                c: 3,
                m: 16,
                hw: [31, 45],
                s: [2, 2],
                ..base
            },
            Shape {
                n: 2,
                c: 8,
                m: 10,
                group: 2,
                hw: [12, 12],
                d: [2, 2],
                p: [0; 4],
                ..base
            },
            Shape {
                c: 20,
                m: 100,
                hw: [4, 4],
                ..base
            },
            Shape {
                c: 7,
                m: 600,
                hw: [12, 12],
                p: [0; 4],
                ..base
            },
            // Narrow padded rows and strides: AVX-512 sums a task's lines as one wide
            // line over the copy's phase planes, AVX2 line by line.
            Shape {
                c: 40,
                m: 30,
                hw: [7, 7],
                ..base
            },
            Shape {
                c: 20,
                m: 13,
                hw: [28, 27],
                s: [2, 2],
                ..base
            },
            // Several tasks of wide lines (a task's copy holds only its own rows).
            Shape {
                c: 40,
                m: 13,
                hw: [100, 12],
                ..base
            },
            Shape {
                c: 20,
                m: 14,
                hw: [200, 15],
                s: [2, 2],
                ..base
            },
            Shape {
                c: 6,
                m: 5,
                hw: [17, 19],
                k: [5, 3],
                s: [3, 2],
                d: [1, 2],
                p: [2, 1, 2, 3],
                ..base
            },
            Shape {
                c: 24,
                m: 7,
                hw: [1, 70],
                k: [1, 5],
                p: [0, 2, 0, 2],
                ..base
            },
        ];
        for (i, sh) in shapes.iter().enumerate() {
            let (a, b) = (run(Isa::Avx2Fma, sh), run(Isa::Avx512, sh));
            let same = a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(same, "shape {i}: AVX2 and AVX-512 differ");
        }
    }
}
