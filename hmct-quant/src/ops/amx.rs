//! f32 matrix products on AMX-BF16, where the CPU has it and Linux grants the tile
//! state (Intel Xeons from Sapphire Rapids on).
//!
//! Each f32 operand is split exactly into three bf16 parts, `x = x0 + x1 + x2` (`x0`
//! the value truncated to bf16's 8 significant bits, `x1` the rest truncated, `x2`
//! what remains, which has at most 8 significant bits). Of the nine products of parts
//! the six that reach f32's precision are summed: `a0·b0, a1·b0, a2·b0, a0·b1, a1·b1,
//! a0·b2` (the three left out are below 2^-24 of `a·b`). A product of two bf16 values
//! is exact in f32, and `tdpbf16ps` adds each to an f32 sum, so the result is an f32
//! sum of the same order of error as the FMA kernels' (measured in the tests and in
//! docs/performance.md), at `AMX peak / 6`: 530 GFLOP/s per core where the AVX-512
//! FMA peak is 215 (`cargo xtask peak`). TPUs' highest matmul precision and cuBLAS's
//! FP32 emulation use the same split.
//!
//! Each operand is stored as its three parts (weights once, 1.5x their f32 bytes;
//! activations a block at a time), and the kernel runs the six products of parts as
//! six bf16 GEMMs into the same f32 sums, 32 depths at a time: weight part x
//! activation part 1x1, 0x1, 0x2, 0x0, 1x0, 2x0. A conv's weights are `A` (rows are
//! output channels) and its input `B`; a MatMul's input is `A` and its weight `B`.
//! Each output is summed in that order over chunks of 32 depths, so the operand
//! roles, the blocking, the tasks and the thread count change no bit (the tests
//! check the two roles against each other). The sums differ from the FMA kernels'
//! (a changed summation order, within f32 rounding); `HMCT_AMX=0` turns the path off.
//!
//! Blocking: a register block is 2x2 tiles of 16x16 f32 outputs (tiles 0-3) from
//! two `A` tiles (16 rows x 32 bf16, tiles 4-5) and two `B` tiles (16 pairs of depth
//! x 16 columns, tiles 6-7); depth runs in blocks of [`KB`] (an `A` block of 32 rows
//! is 24 KiB, in L1 while it sweeps a block of `B` in L2); sums between depth blocks
//! go through memory (exact).

use std::arch::asm;
use std::cell::RefCell;

use super::blocked::Layouts;
use super::gemm_util::MatRef;
use super::packed_gemm::Start;
use super::window::Win3;

/// Rows and columns of a register block.
const MB: usize = 32;
const NB: usize = 32;
/// Depth per block (a multiple of 32, the depth of a tile).
const KB: usize = 128;
/// Columns of `B` packed per block.
const NC: usize = 256;
/// bf16 values of one tile (16 rows x 64 bytes).
const TILE: usize = 512;
/// bf16 values of one part of a register block's `A` (or `B`) for 32 depths: two
/// tiles (rows, or columns, 0-15 and 16-31).
const PART: usize = 2 * TILE;
/// bf16 values of 32 depths of a register block's `A` (or `B`): three parts.
const CHUNK: usize = 3 * PART;

/// Whether matrix products run here: the CPU has AMX-BF16, Linux granted this
/// process the tile state, and `HMCT_AMX` is not `0` or `off`.
pub(crate) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        let off = matches!(std::env::var("HMCT_AMX").as_deref(), Ok("0" | "off"));
        !off && crate::cpu::amx_bf16()
    })
}

/// The three bf16 parts of `x` (as the high halves of f32 bit patterns).
#[inline]
fn split(x: f32) -> [u32; 3] {
    const HI: u32 = 0xffff_0000;
    let p0 = x.to_bits() & HI;
    let r1 = x - f32::from_bits(p0);
    let p1 = r1.to_bits() & HI;
    let r2 = r1 - f32::from_bits(p1);
    [p0, p1, r2.to_bits() & HI]
}

/// One tile row: 32 bf16 values on a 64-byte line. Tile loads from lines that are not
/// aligned run at a third of the rate (the register block alone, timed by a scratch
/// loop on data in L1 that is not in the repository: 2800 GFLOP/s of bf16, 89% of
/// `cargo xtask peak`'s 3183, against 900 with rows off the lines), so every buffer of
/// parts is made of these.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u16; 32]);

/// bf16 values on 64-byte lines.
#[derive(Default)]
struct Lines(Vec<Line>);

impl Lines {
    /// Room for at least `values` values, zero where new.
    fn resize(&mut self, values: usize) {
        self.0.resize(values.div_ceil(32), Line([0; 32]));
    }

    fn zeroed(values: usize) -> Lines {
        let mut l = Lines::default();
        l.resize(values);
        l
    }

    fn values(&self) -> &[u16] {
        // SAFETY: a `Line` is 32 u16 without padding.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast(), self.0.len() * 32) }
    }

    fn values_mut(&mut self) -> &mut [u16] {
        // SAFETY: a `Line` is 32 u16 without padding.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast(), self.0.len() * 32) }
    }
}

/// A weight as `A` (`m × k`, a conv's filters): per block of 32 rows, per chunk of 32
/// depths, per part, two tiles (rows 0-15, 16-31) of 16 rows x 32 bf16. Rows past
/// `m` and depths past `k` are zero.
pub(crate) struct PackedA {
    data: Lines,
    m: usize,
    k: usize,
    chunks: usize,
    /// Depth tap by tap ([`pack_conv_weights`]).
    by_tap: bool,
}

impl PackedA {
    pub(crate) fn new(a: MatRef<f32>, m: usize, k: usize) -> PackedA {
        let chunks = k.div_ceil(32);
        let mut lines = Lines::zeroed(m.div_ceil(MB) * chunks * CHUNK);
        let data = lines.values_mut();
        for i in 0..m {
            let (blk, half, r) = (i / MB, i % MB / 16, i % 16);
            for kk in 0..k {
                let parts = split(a.data[i * a.rs + kk * a.cs]);
                for (p, part) in parts.into_iter().enumerate() {
                    let tile = (blk * chunks + kk / 32) * CHUNK + p * PART + half * TILE;
                    data[tile + r * 32 + kk % 32] = (part >> 16) as u16;
                }
            }
        }
        PackedA {
            data: lines,
            m,
            k,
            chunks,
            by_tap: false,
        }
    }

    pub(crate) fn rows(&self) -> usize {
        self.m
    }

    pub(crate) fn depth(&self) -> usize {
        self.k
    }

    /// The 32 rows from `i0`, from chunk `chunk` of their depth on.
    fn block(&self, i0: usize, chunk: usize) -> *const u16 {
        self.data.values()[((i0 / MB) * self.chunks + chunk) * CHUNK..].as_ptr()
    }
}

/// A weight as `B` (`k × n`, a MatMul's): per panel of 32 columns, per chunk of 32
/// depths, per part, two tiles (columns 0-15, 16-31) of 16 pairs of depths x 16
/// columns (a column's pair adjacent, as `tdpbf16ps` reads it).
pub(crate) struct PackedB {
    data: Lines,
    k: usize,
    n: usize,
    chunks: usize,
}

impl PackedB {
    pub(crate) fn new(b: MatRef<f32>, k: usize, n: usize) -> PackedB {
        let chunks = k.div_ceil(32);
        let mut lines = Lines::zeroed(n.div_ceil(NB) * chunks * CHUNK);
        let data = lines.values_mut();
        for kk in 0..k {
            for j in 0..n {
                let parts = split(b.data[kk * b.rs + j * b.cs]);
                let (pn, half, col) = (j / NB, j % NB / 16, j % 16);
                for (p, part) in parts.into_iter().enumerate() {
                    let tile = (pn * chunks + kk / 32) * CHUNK + p * PART + half * TILE;
                    data[tile + kk % 32 / 2 * 32 + col * 2 + kk % 2] = (part >> 16) as u16;
                }
            }
        }
        PackedB {
            data: lines,
            k,
            n,
            chunks,
        }
    }
}

/// Where [`gemm`] takes `A` from.
#[derive(Clone, Copy)]
pub(crate) enum ASource<'a> {
    Packed(&'a PackedA),
    /// An activation matrix (`m × k`), converted a block at a time.
    Matrix {
        a: MatRef<'a, f32>,
        m: usize,
        k: usize,
    },
}

/// Where [`gemm`] takes `B` from.
#[derive(Clone, Copy)]
pub(crate) enum BSource<'a> {
    Packed(&'a PackedB),
    /// Activations whose row `k` is `x[k · stride ..]` (a pointwise conv's input
    /// channels), converted a block at a time.
    Planes {
        x: &'a [f32],
        stride: usize,
    },
    /// A 2-D conv's windows over its input zero-padded to what they read
    /// ([`pad_input`]): row `c · taps + tap`, column = output position.
    Windows {
        x: &'a [f32],
        g: &'a Win3,
    },
    /// A pointwise conv's channel-blocked input ([`super::blocked`]): row `c` is
    /// channel `c`, lane `c % 16` of block `c / 16`'s `plane` positions.
    Blocked {
        x: &'a [f32],
        plane: usize,
    },
    /// A conv's windows over its unpadded input, tap by tap, for a conv whose taps
    /// mostly read padding: row `tap · cg32 + c` (`cg32` = `cg` rounded up to 32;
    /// rows past `cg` are zero), column `j` = output position `plan.order[j]`; values
    /// in the padding are zeros the gather leaves out. Depth blocks stay within a
    /// tap, and a panel of 32 columns none of whose positions reads data with the
    /// block's tap is skipped.
    TapWindows {
        x: &'a [f32],
        g: &'a Win3,
        cg: usize,
        plan: &'a TapPlan,
    },
}

/// The order in which a conv whose taps mostly read padding ([`conv_reads_little`])
/// visits its output positions, and which panels of 32 positions in that order read
/// data with each tap.
pub(crate) struct TapPlan {
    /// Output positions band after band (a band: a rectangle of outputs that read
    /// data with the same taps), row-major within a band.
    order: Vec<u32>,
    /// Panels of `order`.
    panels: usize,
    /// `reads[tap · panels + panel]`.
    reads: Vec<bool>,
}

impl TapPlan {
    fn new(g: &Win3) -> TapPlan {
        let [_, _, ow] = g.out;
        let [_, _, kw] = g.kernel;
        let (rows, cols) = (super::conv::axis_bands(g, 1), super::conv::axis_bands(g, 2));
        let mut order = Vec::with_capacity(g.out_vol());
        let mut taps = Vec::with_capacity(g.out_vol());
        for (r, tr) in &rows {
            for (c, tc) in &cols {
                for y in r.clone() {
                    for x in c.clone() {
                        order.push((y * ow + x) as u32);
                        taps.push((tr.clone(), tc.clone()));
                    }
                }
            }
        }
        let panels = order.len().div_ceil(NB);
        let mut reads = vec![false; g.k_vol() * panels];
        for (j, (tr, tc)) in taps.iter().enumerate() {
            for a in tr.clone() {
                for b in tc.clone() {
                    reads[(a * kw + b) * panels + j / NB] = true;
                }
            }
        }
        TapPlan {
            order,
            panels,
            reads,
        }
    }
}

thread_local! {
    /// Per thread: a converted `B` block, a converted `A` block, and sums staged on
    /// 64-byte lines ([`gemm`]).
    static BUFFERS: RefCell<(Lines, Lines, Vec<Aligned<16>>)> =
        const { RefCell::new((Lines(Vec::new()), Lines(Vec::new()), Vec::new())) };
}

/// `C[i][j] = start_i + Σ_k A[i][k]·B[k][j]` for rows `rows` (the first a multiple of
/// 32) and columns `columns` (the first a multiple of 32 when `b` is packed); `C[i][j]`
/// is at `c + (i - rows.start)·ldc + j - columns.start`. `a` is a packed weight and
/// `b` packed activations, or `a` activations and `b` a packed weight.
///
/// # Safety
/// [`enabled`] returned true; an `ASource::Matrix` holds its `m × k` values; `c`
/// points to the `rows.len() × columns.len()` block with row stride `ldc >=
/// columns.len()`, which nothing else accesses during the call; `Start::Bias` has a
/// value for every row of `rows`.
pub(crate) unsafe fn gemm(
    a: ASource,
    rows: std::ops::Range<usize>,
    columns: std::ops::Range<usize>,
    start: Start,
    b: BSource,
    c: *mut f32,
    ldc: usize,
) {
    let (k, weight_is_a) = match (a, b) {
        (ASource::Packed(p), BSource::Planes { x, stride }) => {
            let last = (p.k.max(1) - 1) * stride + columns.end;
            assert!(p.k == 0 || last <= x.len());
            (p.k, true)
        }
        (ASource::Packed(p), BSource::Windows { x, g }) => {
            let [ph, pw] = padded_extent(g);
            assert!(p.k == g.k_vol() * (x.len() / (ph * pw)) && x.len() % (ph * pw) == 0);
            assert!(columns.end <= g.out_vol());
            (p.k, true)
        }
        (ASource::Packed(p), BSource::Blocked { x, plane }) => {
            assert!(p.k.next_multiple_of(16) * plane <= x.len() && columns.end <= plane);
            (p.k, true)
        }
        (ASource::Packed(p), BSource::TapWindows { x, g, cg, plan }) => {
            assert!(p.k == g.k_vol() * cg.next_multiple_of(32) && x.len() == cg * g.in_vol());
            assert!(columns.end <= plan.order.len() && plan.order.len() == g.out_vol());
            (p.k, true)
        }
        (ASource::Matrix { k, .. }, BSource::Packed(p)) => {
            assert_eq!(p.k, k);
            (k, false)
        }
        _ => panic!("amx::gemm multiplies a weight by activations"),
    };
    let n = columns.len();
    if rows.is_empty() || n == 0 {
        return;
    }
    debug_assert!(rows.start.is_multiple_of(MB));
    // Depth blocks: (first depth, depths, tap). Taps matter to `TapWindows` only,
    // whose blocks stay within a tap's `cg32` rows.
    let depth_blocks: Vec<(usize, usize, usize)> = match b {
        BSource::TapWindows { g, cg, .. } => {
            assert!(columns.start.is_multiple_of(NB));
            let cg32 = cg.next_multiple_of(32);
            (0..g.k_vol())
                .flat_map(|t| {
                    (0..cg.div_ceil(KB))
                        .map(move |kb| (t * cg32 + kb * KB, KB.min(cg - kb * KB), t))
                })
                .collect()
        }
        _ => (0..k.div_ceil(KB).max(1))
            .map(|kb| (kb * KB, KB.min(k.saturating_sub(kb * KB)), 0))
            .collect(),
    };
    // Whether depth block `bi` reads panel `p` of the columns from `j0`.
    let reads = |bi: usize, j0: usize, p: usize| match b {
        BSource::TapWindows { plan, .. } => {
            plan.reads[depth_blocks[bi].2 * plan.panels + (columns.start + j0) / NB + p]
        }
        _ => true,
    };
    let _tiles = Tiles::configure();
    // Tile rows of sums off 64-byte lines load and store slowly (as those of parts
    // do), and partial tiles go through scratch: where `C`'s rows are not on lines
    // (planes of 14x14, 17x17, 33x33, ...), a block's sums are staged in a buffer of
    // whole tiles on lines and copied out once.
    let staged = !(c as usize).is_multiple_of(64) || !(ldc * 4).is_multiple_of(64);
    BUFFERS.with(|cell| {
        let (bbuf, abuf, cbuf) = &mut *cell.borrow_mut();
        bbuf.resize(NC / NB * KB / 32 * CHUNK);
        abuf.resize(KB / 32 * CHUNK);
        if staged {
            cbuf.resize(
                rows.len().next_multiple_of(MB) * NC / 16,
                Aligned([0.0; 16]),
            );
        }
        let (bbuf, abuf) = (bbuf.values_mut(), abuf.values_mut());
        let cbuf = cbuf.as_mut_ptr().cast::<f32>();
        let mut bias_tiles = Aligned([0.0; 2 * 256]);
        // Rows of `bias_tiles`: the bias of the 32 rows from `i0` (zero past `rows`);
        // nothing without one.
        let fill_bias = |tiles: &mut Aligned<512>, i0: usize| {
            if let Start::Bias(bias) = start {
                let vr = MB.min(rows.end - i0);
                for (r, row) in tiles.0.chunks_exact_mut(16).enumerate() {
                    row.fill(if r < vr { bias[i0 + r] } else { 0.0 });
                }
            }
        };
        let mut scratch = Aligned([0.0; 4 * 256]);
        let zeros = Aligned([0.0; 256]);
        for j0 in (0..n).step_by(NC) {
            let nc = NC.min(n - j0);
            let panels = nc.div_ceil(NB);
            // Where the register blocks' sums go: rows `cld` apart from `cb`.
            let (cb, cld) = match staged {
                true => (cbuf, NC),
                false => (c.wrapping_add(j0), ldc),
            };
            if staged && matches!(start, Start::Output) {
                for r in 0..rows.len() {
                    // SAFETY: row r's columns `j0 .. j0 + nc` of the caller's block;
                    // the staging buffer holds `NC` values per row.
                    unsafe {
                        std::ptr::copy_nonoverlapping(c.add(r * ldc + j0), cb.add(r * NC), nc)
                    };
                }
            }
            // A register block's place, and its valid rows and columns (whole tiles
            // when staged).
            let block = |i0: usize, p: usize| {
                let at = cb.wrapping_add((i0 - rows.start) * cld + p * NB);
                match staged {
                    true => (at, MB, NB),
                    false => (at, MB.min(rows.end - i0), NB.min(nc - p * NB)),
                }
            };
            // The first depth block that reads each panel starts its sums.
            let first: Vec<Option<usize>> = (0..panels)
                .map(|p| (0..depth_blocks.len()).find(|&bi| reads(bi, j0, p)))
                .collect();
            for (bi, &(k0, kc, tap)) in depth_blocks.iter().enumerate() {
                let chunks = kc.div_ceil(32);
                // Whether a panel's sums start from the bias in this block.
                let starts_here = first.contains(&Some(bi));
                // The block of `B`: its first panel and the distance between panels.
                let (bblock, panel_stride) = match b {
                    BSource::Packed(pb) => {
                        debug_assert!((columns.start + j0).is_multiple_of(NB));
                        let p0 = (columns.start + j0) / NB;
                        let at = (p0 * pb.chunks + k0 / 32) * CHUNK;
                        (pb.data.values()[at..].as_ptr(), pb.chunks * CHUNK)
                    }
                    BSource::Planes { x, stride } => {
                        for p in 0..panels {
                            let cols = NB.min(nc - p * NB);
                            let j = columns.start + j0 + p * NB;
                            let dst = &mut bbuf[p * chunks * CHUNK..][..chunks * CHUNK];
                            // SAFETY: AMX implies AVX-512F; rows `k0 .. k0 + kc` ×
                            // columns `j .. j + cols` lie inside `x` (asserted above),
                            // and `dst` holds the panel's `chunks` chunks.
                            unsafe {
                                let first = x.as_ptr().wrapping_add(k0 * stride + j);
                                convert::b_planes(first, stride, kc, cols, chunks, dst.as_mut_ptr())
                            };
                        }
                        (bbuf.as_ptr(), chunks * CHUNK)
                    }
                    BSource::Windows { x, g } => {
                        for p in 0..panels {
                            let cols = NB.min(nc - p * NB);
                            let j = columns.start + j0 + p * NB;
                            let dst = &mut bbuf[p * chunks * CHUNK..][..chunks * CHUNK];
                            let [ph, pw] = padded_extent(g);
                            let [_, _, kw] = g.kernel;
                            let taps = g.k_vol();
                            let base = |kk: usize| {
                                let (ci, tap) = ((k0 + kk) / taps, (k0 + kk) % taps);
                                ci * ph * pw + tap / kw * g.dil[1] * pw + tap % kw * g.dil[2]
                            };
                            // SAFETY: AMX implies AVX-512F; every window of the
                            // columns lies inside the padded planes (asserted above).
                            unsafe {
                                let gather = convert::Gather::padded(g, |l| j + l, cols);
                                convert::b_windows(x, &gather, base, kc, chunks, dst)
                            };
                        }
                        (bbuf.as_ptr(), chunks * CHUNK)
                    }
                    BSource::Blocked { x, plane } => {
                        for p in 0..panels {
                            let cols = NB.min(nc - p * NB);
                            let j = columns.start + j0 + p * NB;
                            let dst = &mut bbuf[p * chunks * CHUNK..][..chunks * CHUNK];
                            let base = |kk: usize| {
                                let ci = k0 + kk;
                                ci / 16 * plane * 16 + ci % 16
                            };
                            // SAFETY: AMX implies AVX-512F; channels below `k` at
                            // positions below `plane` lie inside `x` (asserted above).
                            unsafe {
                                let gather = convert::Gather::at_offsets(|l| 16 * (j + l), cols);
                                convert::b_windows(x, &gather, base, kc, chunks, dst)
                            };
                        }
                        (bbuf.as_ptr(), chunks * CHUNK)
                    }
                    BSource::TapWindows { x, g, cg, plan } => {
                        let c0 = k0 - tap * cg.next_multiple_of(32);
                        for p in (0..panels).filter(|&p| reads(bi, j0, p)) {
                            let cols = NB.min(nc - p * NB);
                            let j = columns.start + j0 + p * NB;
                            let dst = &mut bbuf[p * chunks * CHUNK..][..chunks * CHUNK];
                            let order = &plan.order[j..j + cols];
                            let in_vol = g.in_vol();
                            // SAFETY: AMX implies AVX-512F; channels `c0 .. c0 + kc`
                            // are below `cg` (`x` holds `cg` planes, asserted above),
                            // and the gather reads only inside a plane.
                            unsafe {
                                let gather =
                                    convert::Gather::tap(g, |l| order[l] as usize, cols, tap);
                                let base = |kk: usize| (c0 + kk) * in_vol;
                                convert::b_windows(x, &gather, base, kc, chunks, dst)
                            };
                        }
                        (bbuf.as_ptr(), chunks * CHUNK)
                    }
                };
                for i0 in rows.clone().step_by(MB) {
                    let ablock = match a {
                        ASource::Packed(pa) => pa.block(i0, k0 / 32),
                        ASource::Matrix { a, m, .. } => {
                            let dst = &mut abuf[..chunks * CHUNK];
                            // SAFETY: AMX implies AVX-512F.
                            unsafe { convert::a_rows(a, i0, MB.min(m - i0), k0, kc, chunks, dst) };
                            abuf.as_ptr()
                        }
                    };
                    if starts_here {
                        fill_bias(&mut bias_tiles, i0);
                    }
                    for p in (0..panels).filter(|&p| reads(bi, j0, p)) {
                        let from = if first[p] == Some(bi) {
                            start
                        } else {
                            Start::Output
                        };
                        let (ct, vr, vc) = block(i0, p);
                        // SAFETY: the block's `vr` rows × `vc` columns lie inside the
                        // caller's block or the staging buffer; `ablock` and the panel
                        // hold `chunks` chunks.
                        unsafe {
                            let out = CBlock {
                                c: ct,
                                ldc: cld,
                                rows: vr,
                                cols: vc,
                            };
                            out.load(from, &bias_tiles, &zeros, &mut scratch);
                            let bp = bblock.add(p * panel_stride);
                            if weight_is_a {
                                kernel_weight_a(ablock, bp, chunks);
                            } else {
                                kernel_weight_b(ablock, bp, chunks);
                            }
                            out.store(&mut scratch);
                        }
                    }
                }
            }
            // Panels no depth block reads (outputs whose windows are all padding):
            // their start.
            for p in (0..panels).filter(|&p| first[p].is_none()) {
                for i0 in rows.clone().step_by(MB) {
                    fill_bias(&mut bias_tiles, i0);
                    let (ct, vr, vc) = block(i0, p);
                    // SAFETY: as above.
                    unsafe {
                        let out = CBlock {
                            c: ct,
                            ldc: cld,
                            rows: vr,
                            cols: vc,
                        };
                        out.load(start, &bias_tiles, &zeros, &mut scratch);
                        out.store(&mut scratch);
                    }
                }
            }
            if staged {
                for r in 0..rows.len() {
                    // SAFETY: as for the copy in.
                    unsafe {
                        std::ptr::copy_nonoverlapping(cb.add(r * NC), c.add(r * ldc + j0), nc)
                    };
                }
            }
        }
    });
}

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Aligned<const N: usize>([f32; N]);

/// A register block's outputs in the caller's matrix: `rows` × `cols` valid (at most
/// 32 each) from `c`, rows `ldc` apart.
struct CBlock {
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
}

impl CBlock {
    /// Tile `t`'s place in the caller's matrix and its valid rows and columns.
    fn tile(&self, t: usize) -> (*mut f32, usize, usize) {
        let (r, h) = (t / 2, t % 2);
        let vr = self.rows.saturating_sub(16 * r).min(16);
        let vc = self.cols.saturating_sub(16 * h).min(16);
        (self.c.wrapping_add(16 * r * self.ldc + 16 * h), vr, vc)
    }

    /// Loads tiles 0-3 with the sums' start: the bias (rows of `bias_tiles`), zero, or
    /// the values in the caller's matrix (through `scratch` for a partial tile).
    ///
    /// # Safety
    /// Tiles are configured; the valid part lies in the caller's matrix.
    unsafe fn load(
        &self,
        from: Start,
        bias_tiles: &Aligned<512>,
        zeros: &Aligned<256>,
        scratch: &mut Aligned<1024>,
    ) {
        let mut at = [std::ptr::null::<f32>(); 4];
        let mut stride = [64usize; 4];
        for (t, (at, stride)) in at.iter_mut().zip(&mut stride).enumerate() {
            let (p, vr, vc) = self.tile(t);
            let s = &mut scratch.0[t * 256..][..256];
            *at = match from {
                Start::Bias(_) => bias_tiles.0[t / 2 * 256..].as_ptr(),
                Start::Zero => zeros.0.as_ptr(),
                Start::Output if vr == 16 && vc == 16 => {
                    *stride = self.ldc * 4;
                    p
                }
                Start::Output => {
                    s.fill(0.0);
                    for r in 0..vr {
                        // SAFETY: row r of the tile's valid part.
                        let src = unsafe { std::slice::from_raw_parts(p.add(r * self.ldc), vc) };
                        s[r * 16..][..vc].copy_from_slice(src);
                    }
                    s.as_ptr()
                }
            };
        }
        // SAFETY: each pointer holds 16 rows of 64 bytes `stride` apart.
        unsafe {
            asm!(
                "tileloadd tmm0, [{a0} + {s0}]",
                "tileloadd tmm1, [{a1} + {s1}]",
                "tileloadd tmm2, [{a2} + {s2}]",
                "tileloadd tmm3, [{a3} + {s3}]",
                a0 = in(reg) at[0], s0 = in(reg) stride[0],
                a1 = in(reg) at[1], s1 = in(reg) stride[1],
                a2 = in(reg) at[2], s2 = in(reg) stride[2],
                a3 = in(reg) at[3], s3 = in(reg) stride[3],
                options(nostack, readonly, preserves_flags)
            );
        }
    }

    /// Stores tiles 0-3: whole tiles in place, partial ones through `scratch`.
    ///
    /// # Safety
    /// As for [`CBlock::load`].
    unsafe fn store(&self, scratch: &mut Aligned<1024>) {
        let mut at = [std::ptr::null_mut::<f32>(); 4];
        let mut stride = [64usize; 4];
        for (t, (at, stride)) in at.iter_mut().zip(&mut stride).enumerate() {
            let (p, vr, vc) = self.tile(t);
            *at = if vr == 16 && vc == 16 {
                *stride = self.ldc * 4;
                p
            } else {
                scratch.0[t * 256..].as_mut_ptr()
            };
        }
        // SAFETY: each pointer holds 16 rows of 64 bytes `stride` apart.
        unsafe {
            asm!(
                "tilestored [{a0} + {s0}], tmm0",
                "tilestored [{a1} + {s1}], tmm1",
                "tilestored [{a2} + {s2}], tmm2",
                "tilestored [{a3} + {s3}], tmm3",
                a0 = in(reg) at[0], s0 = in(reg) stride[0],
                a1 = in(reg) at[1], s1 = in(reg) stride[1],
                a2 = in(reg) at[2], s2 = in(reg) stride[2],
                a3 = in(reg) at[3], s3 = in(reg) stride[3],
                options(nostack, preserves_flags)
            );
        }
        for t in 0..4 {
            let (p, vr, vc) = self.tile(t);
            if vr < 16 || vc < 16 {
                for r in 0..vr {
                    // SAFETY: row r of the tile's valid part.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            scratch.0[t * 256 + r * 16..].as_ptr(),
                            p.add(r * self.ldc),
                            vc,
                        )
                    };
                }
            }
        }
    }
}

/// Loads one part of `A` (byte offset `$off` in a chunk) into tiles 4 (rows 0-15) and
/// 5 (rows 16-31).
macro_rules! load_a {
    ($off:literal) => {
        concat!(
            "tileloadd tmm4, [{a} + {s} + ",
            $off,
            "]\n",
            "tileloadd tmm5, [{a} + {s} + ",
            $off,
            " + 1024]\n",
        )
    };
}

/// Loads one part of `B` (byte offset `$off` in a chunk) into tiles 6 (columns 0-15)
/// and 7 (columns 16-31).
macro_rules! load_b {
    ($off:literal) => {
        concat!(
            "tileloadd tmm6, [{b} + {s} + ",
            $off,
            "]\n",
            "tileloadd tmm7, [{b} + {s} + ",
            $off,
            " + 1024]\n",
        )
    };
}

/// Tiles 4-5 (`A`) times tiles 6-7 (`B`) added to tiles 0-3.
macro_rules! product {
    () => {
        concat!(
            "tdpbf16ps tmm0, tmm4, tmm6\n",
            "tdpbf16ps tmm1, tmm4, tmm7\n",
            "tdpbf16ps tmm2, tmm5, tmm6\n",
            "tdpbf16ps tmm3, tmm5, tmm7\n",
        )
    };
}

/// The loop over `chunks` chunks at `a` and `b` that adds six products of parts to
/// tiles 0-3, given as the loads and products of one chunk.
macro_rules! six_products {
    ($a:expr, $b:expr, $chunks:expr, $($step:expr),+) => {
        asm!(
            "2:",
            $($step,)+
            "add {a}, 6144",
            "add {b}, 6144",
            "dec {n}",
            "jnz 2b",
            a = inout(reg) $a => _,
            b = inout(reg) $b => _,
            n = inout(reg) $chunks => _,
            s = in(reg) 64usize,
            options(nostack, readonly)
        )
    };
}

/// The six products of one chunk, weight part x activation part 1x1, 0x1, 0x2, 0x0,
/// 1x0, 2x0, with `$w` loading the weight's parts and `$x` the activations' (parts are
/// 2048 bytes apart in a chunk). Each product after the first keeps one operand's part
/// in its tiles and loads the other's: 14 tile loads a chunk instead of 24.
macro_rules! weight_by_activation {
    ($a:expr, $b:expr, $chunks:expr, $w:ident, $x:ident) => {
        six_products!(
            $a,
            $b,
            $chunks,
            concat!($w!("2048"), $x!("2048"), product!()),
            concat!($w!("0"), product!()),
            concat!($x!("4096"), product!()),
            concat!($x!("0"), product!()),
            concat!($w!("2048"), product!()),
            concat!($w!("4096"), product!())
        )
    };
}

/// Adds `chunks` chunks of the weight's parts (at `a`) times the activations' (at `b`)
/// to tiles 0-3, in [`weight_by_activation`]'s order (chunks 6144 bytes apart).
///
/// # Safety
/// Tiles are configured and hold the sums; `a` and `b` hold `chunks` chunks.
unsafe fn kernel_weight_a(a: *const u16, b: *const u16, chunks: usize) {
    if chunks > 0 {
        // SAFETY: reads `chunks` chunks at `a` and at `b`.
        unsafe { weight_by_activation!(a, b, chunks, load_a, load_b) };
    }
}

/// [`kernel_weight_a`] with the activations' parts at `a` and the weight's at `b`: the
/// same products in the same order.
///
/// # Safety
/// As for [`kernel_weight_a`].
unsafe fn kernel_weight_b(a: *const u16, b: *const u16, chunks: usize) {
    if chunks > 0 {
        // SAFETY: reads `chunks` chunks at `a` and at `b`.
        unsafe { weight_by_activation!(a, b, chunks, load_b, load_a) };
    }
}

/// This thread's tile configuration, for the life of the value: eight tiles of 16
/// rows x 64 bytes; released on drop (a thread holding tile state makes every
/// context switch save 8 KiB more).
struct Tiles;

impl Tiles {
    fn configure() -> Tiles {
        #[repr(C, align(64))]
        struct Config([u8; 64]);
        let mut cfg = Config([0; 64]);
        cfg.0[0] = 1; // palette 1
        for t in 0..8 {
            cfg.0[16 + 2 * t..18 + 2 * t].copy_from_slice(&64u16.to_le_bytes());
            cfg.0[48 + t] = 16;
        }
        // SAFETY: AMX is enabled (the callers' contract) and `cfg` is a valid palette-1
        // configuration.
        unsafe { asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly)) };
        Tiles
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: tiles were configured by `configure`.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// Activations into bf16 parts, with AVX-512.
mod convert {
    use super::super::conv_dw::transpose16;
    use super::super::gemm_util::MatRef;
    use super::super::window::Win3;
    use super::{CHUNK, KB, PART, TILE};
    use std::arch::x86_64::*;

    /// The three parts of 16 values, each in the high halves of its lanes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn split(x: __m512) -> [__m512i; 3] {
        let hi = _mm512_set1_epi32(0xffff_0000u32 as i32);
        let p0 = _mm512_and_si512(_mm512_castps_si512(x), hi);
        let r1 = _mm512_sub_ps(x, _mm512_castsi512_ps(p0));
        let p1 = _mm512_and_si512(_mm512_castps_si512(r1), hi);
        let r2 = _mm512_sub_ps(r1, _mm512_castsi512_ps(p1));
        [p0, p1, _mm512_and_si512(_mm512_castps_si512(r2), hi)]
    }

    /// `chunks` chunks of `B` tiles from its rows: `row(kk, half)` is depth `kk`'s 16
    /// columns of the panel's `half`; each pair of depths goes into one tile row per
    /// part, the even depth in the low halves.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `dst` holds `chunks · CHUNK` values.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn store_pairs(chunks: usize, dst: *mut u16, row: impl Fn(usize, usize) -> __m512) {
        let dst = dst.cast::<u32>();
        for kk in (0..32 * chunks).step_by(2) {
            for half in 0..2 {
                let even = split(row(kk, half));
                let odd = split(row(kk + 1, half));
                for p in 0..3 {
                    let pair = _mm512_or_si512(_mm512_srli_epi32::<16>(even[p]), odd[p]);
                    let at = (kk / 32 * CHUNK + p * PART + half * TILE) / 2 + kk % 32 / 2 * 16;
                    // SAFETY: pair row kk / 2 of the chunk's tiles, inside `dst`.
                    unsafe { _mm512_storeu_si512(dst.add(at).cast(), pair) };
                }
            }
        }
    }

    /// Where the 32 positions of a panel read: per half of 16, the offsets of their
    /// windows' first values from a row's base, and the lanes read (the others are
    /// zero).
    pub(super) struct Gather {
        idx: [__m512i; 2],
        masks: [u16; 2],
    }

    impl Gather {
        /// `cols` (at most 32) positions of `g`, `position(l)` for lane `l`, in planes
        /// zero-padded to [`super::padded_extent`]: every lane below `cols` is read.
        ///
        /// # Safety
        /// The CPU has AVX-512F.
        #[target_feature(enable = "avx512f")]
        pub(super) unsafe fn padded(
            g: &Win3,
            position: impl Fn(usize) -> usize,
            cols: usize,
        ) -> Gather {
            let [_, pw] = super::padded_extent(g);
            let [_, _, ow] = g.out;
            let offset = |q: usize| (q / ow * g.stride[1]) * pw + q % ow * g.stride[2];
            // SAFETY: AVX-512F (the caller's promise).
            unsafe { Self::at_offsets(|l| offset(position(l)), cols) }
        }

        /// `cols` (at most 32) lanes at offsets `offset(l)`, every lane below `cols`
        /// read.
        ///
        /// # Safety
        /// The CPU has AVX-512F.
        #[target_feature(enable = "avx512f")]
        pub(super) unsafe fn at_offsets(offset: impl Fn(usize) -> usize, cols: usize) -> Gather {
            let lanes: [i32; 32] = std::array::from_fn(|l| offset(l.min(cols.max(1) - 1)) as i32);
            let mask = |half: usize| ((1u32 << cols.saturating_sub(16 * half).min(16)) - 1) as u16;
            Self::new(&lanes, [mask(0), mask(1)])
        }

        #[target_feature(enable = "avx512f")]
        fn new(lanes: &[i32; 32], masks: [u16; 2]) -> Gather {
            // SAFETY: 32 i32 are 128 bytes.
            let idx = unsafe {
                [
                    _mm512_loadu_si512(lanes.as_ptr().cast()),
                    _mm512_loadu_si512(lanes[16..].as_ptr().cast()),
                ]
            };
            Gather { idx, masks }
        }

        /// `cols` (at most 32) positions of `g`, `position(l)` for lane `l`, reading
        /// with tap `tap` from unpadded planes: lanes whose tap reads padding are left
        /// out (zero).
        ///
        /// # Safety
        /// The CPU has AVX-512F.
        #[target_feature(enable = "avx512f")]
        pub(super) unsafe fn tap(
            g: &Win3,
            position: impl Fn(usize) -> usize,
            cols: usize,
            tap: usize,
        ) -> Gather {
            let [_, ih, iw] = g.input;
            let [_, _, ow] = g.out;
            let [_, _, kw] = g.kernel;
            let mut masks = [0u16; 2];
            let lanes: [i32; 32] = std::array::from_fn(|l| {
                if l >= cols {
                    return 0;
                }
                let q = position(l);
                let r = (q / ow * g.stride[1] + tap / kw * g.dil[1]) as isize - g.pad[1];
                let c = (q % ow * g.stride[2] + tap % kw * g.dil[2]) as isize - g.pad[2];
                if r < 0 || c < 0 || r >= ih as isize || c >= iw as isize {
                    return 0;
                }
                masks[l / 16] |= 1 << (l % 16);
                (r as usize * iw + c as usize) as i32
            });
            Self::new(&lanes, masks)
        }
    }

    /// `kc` rows of a conv's windows × a panel's positions ([`Gather`]) into `chunks`
    /// chunks: per part, two tiles of 16 pairs of rows x 16 columns (rows past `kc`
    /// and lanes the gather leaves out zero). Row `kk` reads `x` from `base(kk)` at
    /// the gather's offsets: one gather per row of 16 positions.
    ///
    /// # Safety
    /// The CPU has AVX-512F; every lane the gather reads lies inside `x` for every
    /// row below `kc`; `dst` holds the chunks.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn b_windows(
        x: &[f32],
        gather: &Gather,
        base: impl Fn(usize) -> usize,
        kc: usize,
        chunks: usize,
        dst: &mut [u16],
    ) {
        let row = |kk: usize, half: usize| {
            if kk >= kc {
                return _mm512_setzero_ps();
            }
            // SAFETY: the lanes read lie inside `x` (the caller's contract);
            // masked-off lanes are not read.
            unsafe {
                _mm512_mask_i32gather_ps::<4>(
                    _mm512_setzero_ps(),
                    gather.masks[half],
                    gather.idx[half],
                    x.as_ptr().add(base(kk)).cast(),
                )
            }
        };
        // SAFETY: `dst` holds the chunks (the caller's contract).
        unsafe { store_pairs(chunks, dst.as_mut_ptr(), row) };
    }

    /// 16 rows of `ncols` sums (`rows`, row-major) stored channel-blocked: position
    /// `j`'s 16 values at `dst + 16·j`, one 16x16 transpose per 16 positions.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `dst` holds `16 · ncols` values, which nothing else
    /// accesses during the call.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn store_blocked(rows: &[f32], ncols: usize, dst: *mut f32) {
        assert!(rows.len() >= 16 * ncols);
        for j0 in (0..ncols).step_by(16) {
            let valid = (ncols - j0).min(16);
            let mask = ((1u32 << valid) - 1) as u16;
            // SAFETY: row r's columns `j0 .. j0 + valid` lie inside `rows`.
            let mut columns: [__m512; 16] = std::array::from_fn(|i| unsafe {
                _mm512_maskz_loadu_ps(mask, rows.as_ptr().add(i * ncols + j0))
            });
            // SAFETY: AVX-512F (the caller's promise).
            unsafe { transpose16(&mut columns) };
            for (jj, v) in columns.iter().enumerate().take(valid) {
                // SAFETY: position j0 + jj < ncols of `dst` (the caller's contract).
                unsafe { _mm512_storeu_ps(dst.add((j0 + jj) * 16), *v) };
            }
        }
    }

    /// `kc` rows of `B` (`x`, `stride` apart) × `cols` (at most 32) columns into
    /// `chunks` chunks: per part, two tiles of 16 pairs of rows x 16 columns (rows
    /// past `kc` and columns past `cols` zero).
    ///
    /// # Safety
    /// The CPU has AVX-512F; `x` holds the rows and columns; `dst` holds `chunks ·
    /// CHUNK` values.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn b_planes(
        x: *const f32,
        stride: usize,
        kc: usize,
        cols: usize,
        chunks: usize,
        dst: *mut u16,
    ) {
        let lanes = |half: usize| ((1u32 << cols.saturating_sub(16 * half).min(16)) - 1) as u16;
        let masks = [lanes(0), lanes(1)];
        let row = |kk: usize, half: usize| {
            if kk < kc {
                // SAFETY: row kk is inside `x`; only lanes below `cols` are read.
                unsafe { _mm512_maskz_loadu_ps(masks[half], x.add(kk * stride + 16 * half)) }
            } else {
                _mm512_setzero_ps()
            }
        };
        // SAFETY: `dst` holds the chunks (the caller's contract).
        unsafe { store_pairs(chunks, dst, row) };
    }

    /// Rows `i0 .. i0 + rows` (at most 32) × depths `k0 .. k0 + kc` of `a` into
    /// `chunks` chunks: per part, two tiles of 16 rows x 32 bf16 (rows past `rows`
    /// and depths past `kc` zero).
    ///
    /// # Safety
    /// The CPU has AVX-512F; `a` holds the rows and depths; `dst` holds `chunks ·
    /// CHUNK` values.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn a_rows(
        a: MatRef<f32>,
        i0: usize,
        rows: usize,
        k0: usize,
        kc: usize,
        chunks: usize,
        dst: &mut [u16],
    ) {
        let mut line = [0f32; KB];
        for r in 0..32 {
            if r < rows {
                let row = &a.data[(i0 + r) * a.rs + k0 * a.cs..];
                if a.cs == 1 {
                    line[..kc].copy_from_slice(&row[..kc]);
                } else {
                    for (kk, v) in line[..kc].iter_mut().enumerate() {
                        *v = row[kk * a.cs];
                    }
                }
                line[kc..].fill(0.0);
            } else {
                line.fill(0.0);
            }
            let (half, row) = (r / 16, r % 16);
            for g in 0..2 * chunks {
                // SAFETY: 16 depths of `line`; row r of chunk g / 2's tiles.
                unsafe {
                    let parts = split(_mm512_loadu_ps(line.as_ptr().add(16 * g)));
                    for (p, part) in parts.into_iter().enumerate() {
                        let bf = _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(part));
                        let at = g / 2 * CHUNK + p * PART + half * TILE + row * 32 + g % 2 * 16;
                        _mm256_storeu_si256(dst.as_mut_ptr().add(at).cast(), bf);
                    }
                }
            }
        }
    }
}

/// Rows and columns of a conv's input plane zero-padded to what its windows read.
fn padded_extent(g: &Win3) -> [usize; 2] {
    [g.reach(1), g.reach(2)]
}

/// `planes` input planes of `g` zero-padded to [`padded_extent`] (the pads before,
/// zeros after; inputs no window reads are left out).
fn pad_input(x: &[f32], planes: usize, g: &Win3) -> Vec<f32> {
    let [ph, pw] = padded_extent(g);
    let [_, ih, iw] = g.input;
    let (top, left) = (g.pad[1], g.pad[2]);
    let mut out = crate::buffers::take_filled::<f32>(planes * ph * pw, 0.0);
    for (src, dst) in x
        .chunks_exact(ih * iw)
        .zip(out.chunks_exact_mut(ph * pw))
        .take(planes)
    {
        for r in 0..ph {
            let ir = r as isize - top;
            if ir < 0 || ir >= ih as isize {
                continue;
            }
            let row = &src[ir as usize * iw..][..iw];
            // Padded columns `c` read input column `c - left`.
            let c0 = left.max(0) as usize;
            let i0 = (-left).max(0) as usize;
            let len = (iw - i0.min(iw)).min(pw.saturating_sub(c0));
            dst[r * pw + c0..][..len].copy_from_slice(&row[i0..i0 + len]);
        }
    }
    out
}

/// Whether a conv runs here rather than on the FMA kernels (Winograd's 3x3 convs are
/// asked first): AMX is on, 64 or more output channels per group, and
/// - pointwise with 32 or more input channels and 256 or more positions, or 196 or
///   more with 256 or more input and 128 or more output channels;
/// - or spatial (2-D), with 64 or more values per output (input channels x taps) and
///   196 or more positions, and 128 or more output channels per group, or fewer
///   input channels than 16 at a stride (stems), which then gather their windows
///   straight into parts ([`BSource::Windows`], or tap by tap where the taps mostly
///   read padding).
///
/// `kernel_table` (one thread, least of 10 runs, two alternating rounds against
/// `HMCT_AMX=0`): ResNet-50's 1x1 64->256 at 56x56 0.70-0.72 -> 0.46-0.48 ms, 512->128
/// at 28x28 0.90-0.97 -> 0.40, its 3x3 stride-2 convs 1.57-1.73 -> 1.21-1.42 and
/// 1.50-1.67 -> 1.26-1.35, YOLOv8n's 64->128 stride 2 0.37-0.41 -> 0.32-0.34, DeepLab's
/// 1x1 960->256 at 33x33 5.8-6.1 -> 2.4-2.5. Since sums off 64-byte lines are staged,
/// pointwise convs at 14x14 and 7x7 on NCHW values run faster here too (a build with
/// the threshold at 49: ResNet-50's 1024->256 at 14x14 0.62-0.63 -> 0.40-0.41, 2048->512
/// at 7x7 0.64-0.66 -> 0.51-0.53, MobileNetV2's 96->576 at 14x14 0.14 -> 0.095), but in
/// the mobile nets those convs read and write channel-blocked values, where the
/// channel-lanes kernel runs faster than this one (reading and storing blocked values
/// natively; `run --profile`, MobileNetV2's 1x1 convs at 14x14 1.28 -> 1.43 ms per
/// run, at 7x7 1.30 -> 1.79: expansions of 64-160 channels lose most, projections of
/// 384+ channels to 64-112 tie), and a conv's kernel must not depend on where its
/// values are blocked. Hence 196 positions with wide weights: `run`, median ms per
/// run over three alternating rounds, against the threshold at 256: ResNet-50 58.6-61.8
/// -> 55.0-56.1, RegNet-Y 15.7-16.1 -> 13.5-14.3, DenseNet-121 45.3-46.4 -> 43.0-44.4,
/// the mobile nets the same. Left on the FMA kernels: 32 or 48 output channels
/// (YOLOv8n's 32->32 at 160x160 the same either way in a build with the threshold
/// lowered), and stride-1 3x3 convs (Winograd: ResNet-50's 64->64 at 56x56 1.19 ->
/// 1.53 and YOLOv8n's 80->80 at 80x80 3.26 -> 4.95 on AMX in a build that sent them
/// here). Stride-1 convs of 64 output channels run faster on the FMA kernels, where
/// converting their windows into parts serves only two blocks of 32 rows
/// (`kernel_table --cold`, two rounds, here / `HMCT_AMX=0`): Inception-v3's 5x5 48->64
/// at 35x35 1.26-1.36 / 0.95-1.06 ms, its 3x3 32->64 at 147x147 7.2-7.4 / 5.9-6.0 with
/// Winograd off; strided ones do not (ResNet-50's 7x7 stem, 64 channels, 1.9-2.1
/// here against 2.4). With 16 or more input channels the FMA kernels win at a
/// stride too (YOLOv8n's 3x3 stride-2 convs alone, `run --profile` of a one-node
/// model, three alternating rounds: 32->64 from 160x160 1.93-2.22 ms here, 1.68-1.91
/// there; 64->64 from 80x80 0.93-1.08, 0.90-0.94).
pub(crate) fn conv_prefers(g: &Win3, mg: usize, kdim: usize) -> bool {
    let pointwise = g.pointwise();
    let fits = if pointwise {
        kdim >= 32 && (g.out_vol() >= 256 || g.out_vol() >= 196 && kdim >= 256 && mg >= 128)
    } else {
        let strided = g.stride.iter().any(|&st| st > 1);
        let few_inputs = kdim / g.k_vol() < 16;
        g.input[0] == 1
            && kdim >= 64
            && g.out_vol() >= 196
            && (mg >= 4 * MB || strided && few_inputs)
    };
    enabled() && mg >= 2 * MB && fits
}

/// Conv weights `[m, cg, taps...]` packed per group: depth `c · taps + tap`, or for
/// a conv whose taps mostly read padding ([`BSource::TapWindows`]) `tap · cg32 + c`.
pub(crate) fn pack_conv_weights(w: &[f32], m: usize, group: usize, g: &Win3) -> Vec<PackedA> {
    let (mg, taps) = (m / group, g.k_vol());
    let kdim = w.len() / m;
    let cg = kdim / taps;
    let tap_major = tap_by_tap(g);
    (0..group)
        .map(|gi| {
            let wg = &w[gi * mg * kdim..][..mg * kdim];
            if !tap_major {
                return PackedA::new(MatRef::row_major(wg, kdim), mg, kdim);
            }
            let cg32 = cg.next_multiple_of(32);
            let mut by_tap = vec![0.0; mg * taps * cg32];
            for (o, filter) in wg.chunks_exact(kdim).enumerate() {
                for (ci, channel) in filter.chunks_exact(taps).enumerate() {
                    for (t, &v) in channel.iter().enumerate() {
                        by_tap[(o * taps + t) * cg32 + ci] = v;
                    }
                }
            }
            let mut packed = PackedA::new(MatRef::row_major(&by_tap, taps * cg32), mg, taps * cg32);
            packed.by_tap = true;
            packed
        })
        .collect()
}

/// Whether a spatial conv runs tap by tap ([`BSource::TapWindows`]): its taps mostly
/// read padding, as DeepLab's ASPP convs (dilations 12, 24 and 36 on a 32x32 map).
fn tap_by_tap(g: &Win3) -> bool {
    !g.pointwise() && super::conv::reads_little(g)
}

/// Output channels per task, in register blocks, when positions alone give few tasks.
const M_CHUNK_BLOCKS: usize = 2;
/// Multiply-adds below which a conv runs on the calling thread.
const SERIAL_WORK: usize = 1 << 20;

/// `y = conv(x, w) + bias` for f32 NCHW data of a 2-D conv (a `Win3` of depth one),
/// with `w` packed by [`pack_conv_weights`]; `y` is written in full, then `tail` runs
/// on it. Tasks are (image, group, block of positions, chunk of output channels); each
/// output is summed in the same order whatever the tasks.
///
/// AMX is [`enabled`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv(
    w: &[PackedA],
    x: &[f32],
    bias: Option<&[f32]>,
    y: &mut [f32],
    n: usize,
    c: usize,
    m: usize,
    group: usize,
    g: &Win3,
    tail: Option<&crate::fusion::Tail>,
    layouts: Layouts,
) {
    use rayon::prelude::*;
    assert!(enabled());
    assert!(!(layouts.input || layouts.output) || runs_blocked(g, m, c, group, layouts));
    let (cg, mg) = (c / group, m / group);
    let (in_vol, out_vol) = (g.in_vol(), g.out_vol());
    let by_tap = tap_by_tap(g);
    let kdim = if by_tap {
        cg.next_multiple_of(32) * g.k_vol()
    } else {
        cg * g.k_vol()
    };
    assert!(w.len() == group && w.iter().all(|p| p.rows() == mg && p.depth() == kdim));
    assert!(w.iter().all(|p| p.by_tap == by_tap));
    assert!(x.len() >= n * c * in_vol && y.len() >= n * m * out_vol);
    let blocks = out_vol.div_ceil(NC);
    // Chunks of output channels give threads work on small planes, but each chunk
    // converts the input again: on one thread, none (the sums are the same either way).
    let threads = crate::par::threads();
    let m_chunk = if threads > 1 && n * group * blocks < 4 && mg > M_CHUNK_BLOCKS * MB {
        M_CHUNK_BLOCKS * MB
    } else {
        mg
    };
    let m_tasks = mg.div_ceil(m_chunk);
    let tasks = n * group * blocks * m_tasks;
    let pointwise = g.pointwise();
    let padded = (!pointwise && !by_tap).then(|| pad_input(x, n * c, g));
    let plane = match padded {
        Some(_) => padded_extent(g).iter().product(),
        None => in_vol,
    };
    let xs = padded.as_deref().unwrap_or(x);
    // Tap by tap, outputs are summed in the plan's order into `sums`, then put in place.
    let plan = by_tap.then(|| TapPlan::new(g));
    let mut sums = plan
        .as_ref()
        .map(|_| crate::buffers::take::<f32>(n * m * out_vol));
    let yp = super::gemm_util::SendPtr(sums.as_deref_mut().unwrap_or(y).as_mut_ptr());
    let task = |t: usize| {
        let blk = t % blocks;
        let mt = t / blocks % m_tasks;
        let bg = t / blocks / m_tasks;
        let (b, gi) = (bg / group, bg % group);
        let xg = &xs[(b * c + gi * cg) * plane..][..cg * plane];
        let rows = mt * m_chunk..(mt * m_chunk + m_chunk).min(mg);
        let cols = blk * NC..(blk * NC + NC).min(out_vol);
        let start = match bias {
            Some(bias) => Start::Bias(&bias[gi * mg..][..mg]),
            None => Start::Zero,
        };
        let source = match &plan {
            _ if layouts.input => BSource::Blocked {
                x: &x[b * c * in_vol..][..c * in_vol],
                plane: in_vol,
            },
            _ if pointwise => BSource::Planes {
                x: xg,
                stride: in_vol,
            },
            Some(plan) => BSource::TapWindows { x: xg, g, cg, plan },
            None => BSource::Windows { x: xg, g },
        };
        let yp = &yp;
        // SAFETY: the task writes channels `gi·mg + rows` × positions `cols` of image
        // `b` (in `y`, or in `sums` of the same size), which no other task writes
        // (checked above), then runs the tail on them; AMX is enabled (checked above).
        unsafe {
            // A blocked output is summed as rows first, then each block of 16
            // channels stored position by position (the tail runs over runs of 16
            // channels).
            let ncols = cols.len();
            let mut rows_out = match layouts.output {
                true => crate::buffers::take::<f32>(rows.len() * ncols),
                false => Vec::new(),
            };
            let at = (b * m + gi * mg + rows.start) * out_vol + cols.start;
            let (dst, ldc) = match layouts.output {
                true => (rows_out.as_mut_ptr(), ncols),
                false => (yp.0.add(at), out_vol),
            };
            gemm(
                ASource::Packed(&w[gi]),
                rows.clone(),
                cols.clone(),
                start,
                source,
                dst,
                ldc,
            );
            if layouts.output {
                // One group (`runs_blocked`): the block of channel `rows.start`.
                let at = (b * m + rows.start) * out_vol + cols.start * 16;
                for (i, block) in rows_out.chunks_exact(16 * ncols).enumerate() {
                    convert::store_blocked(block, ncols, yp.0.add(at + i * 16 * out_vol));
                }
                crate::buffers::give_vec(rows_out);
                if let Some(tail) = tail {
                    tail.apply_runs(yp.0, at, rows.len() / 16, ncols * 16, out_vol * 16);
                }
            } else if let (Some(tail), None) = (tail, &plan) {
                tail.apply_runs(yp.0, at, rows.len(), cols.len(), out_vol);
            }
        }
    };
    if tasks == 1 || n * m * out_vol * kdim < SERIAL_WORK || !crate::par::enabled() {
        (0..tasks).for_each(task);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
    if let (Some(plan), Some(sums)) = (&plan, sums) {
        for (dst, src) in y.chunks_exact_mut(out_vol).zip(sums.chunks_exact(out_vol)) {
            for (&q, &v) in plan.order.iter().zip(src) {
                dst[q as usize] = v;
            }
        }
        if let Some(tail) = tail {
            tail.apply_all(&mut y[..n * m * out_vol]);
        }
        crate::buffers::give_vec(sums);
    }
    if let Some(p) = padded {
        crate::buffers::give_vec(p);
    }
}

/// Whether [`conv`] runs this conv on channel-blocked values (see
/// [`super::blocked`]): pointwise, one group, a multiple of 16 channels on each blocked
/// side.
pub(crate) fn runs_blocked(g: &Win3, m: usize, c: usize, group: usize, layouts: Layouts) -> bool {
    g.pointwise()
        && group == 1
        && (!layouts.input || c.is_multiple_of(16))
        && (!layouts.output || m.is_multiple_of(16))
}

/// Whether `packed` ([`pack_conv_weights`]) is in the depth order `g` runs in.
pub(crate) fn packed_for(packed: &[PackedA], g: &Win3) -> bool {
    packed.iter().all(|p| p.by_tap == tap_by_tap(g))
}

/// Whether a MatMul or Gemm with a constant `k × n` weight runs here: AMX is on and
/// the weight fills the tiles' depth and columns.
pub(crate) fn matmul_prefers(k: usize, n: usize) -> bool {
    enabled() && k >= 32 && n >= NB
}

/// Rows per task of a parallel [`matmul`].
const MATMUL_ROWS: usize = 128;

/// `y = start + a · b` for an `m × k` matrix `a` and a packed constant `b` (`k × n`),
/// with `y` row-major `m × n`; `start` is `Start::Zero` or `Start::Output`. Tasks are
/// (chunk of rows, block of columns); each output is summed in the same order
/// whatever the tasks.
///
/// AMX is [`enabled`].
pub(crate) fn matmul(a: MatRef<f32>, m: usize, b: &PackedB, start: Start, y: &mut [f32]) {
    use rayon::prelude::*;
    let (k, n) = (b.k, b.n);
    assert!(enabled() && y.len() >= m * n && !matches!(start, Start::Bias(_)));
    assert!(m == 0 || k == 0 || (m - 1) * a.rs + (k - 1) * a.cs < a.data.len());
    if m == 0 || n == 0 {
        return;
    }
    let a = ASource::Matrix { a, m, k };
    let col_tasks = n.div_ceil(NC);
    let tasks = m.div_ceil(MATMUL_ROWS) * col_tasks;
    let yp = super::gemm_util::SendPtr(y.as_mut_ptr());
    let task = |t: usize| {
        let (rt, ct) = (t / col_tasks, t % col_tasks);
        let rows = rt * MATMUL_ROWS..(rt * MATMUL_ROWS + MATMUL_ROWS).min(m);
        let cols = ct * NC..(ct * NC + NC).min(n);
        let yp = &yp;
        // SAFETY: the task writes rows `rows` × columns `cols` of `y` (checked above),
        // which no other task writes; `a` covers `m × k`; AMX is enabled.
        unsafe {
            let dst = yp.0.add(rows.start * n + cols.start);
            gemm(a, rows, cols, start, BSource::Packed(b), dst, n);
        }
    };
    if tasks == 1 || m * n * k < SERIAL_WORK || !crate::par::enabled() {
        (0..tasks).for_each(task);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
            })
            .collect()
    }

    #[test]
    fn parts_sum_to_the_value() {
        for &x in &values(10_000, 1) {
            let [p0, p1, p2] = split(x).map(f32::from_bits);
            assert_eq!(p0 + p1 + p2, x);
        }
    }

    /// `a · b` in f64, and `|a| · |b|` (the scale of the rounding error).
    fn reference(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
        let mut exact = vec![0f64; m * n];
        let mut scale = vec![0f64; m * n];
        for i in 0..m {
            for kk in 0..k {
                let av = a[i * k + kk] as f64;
                for j in 0..n {
                    let bv = b[kk * n + j] as f64;
                    exact[i * n + j] += av * bv;
                    scale[i * n + j] += (av * bv).abs();
                }
            }
        }
        (exact, scale)
    }

    /// Both roles of the weight give the same bits, and the sums are within f32
    /// rounding of the exact products.
    #[test]
    fn both_roles_agree_and_are_accurate() {
        if !enabled() {
            eprintln!("no AMX here: skipped");
            return;
        }
        for &(m, k, n) in &[
            (32, 64, 32),
            (45, 70, 77),
            (64, 200, 300),
            (3, 5, 40),
            (96, 16, 520),
        ] {
            let a = values(m * k, m as u64);
            let b = values(k * n, n as u64 + 7);
            // A conv's role: the weight `a` packed as A, the activation `b` (rows
            // `n` apart, as a pointwise conv's input planes) converted per block.
            let pa = PackedA::new(MatRef::row_major(&a, k), m, k);
            let mut y1 = vec![f32::NAN; m * n];
            let planes = BSource::Planes { x: &b, stride: n };
            // SAFETY: AMX is enabled; `y1` is m × n.
            unsafe {
                gemm(
                    ASource::Packed(&pa),
                    0..m,
                    0..n,
                    Start::Zero,
                    planes,
                    y1.as_mut_ptr(),
                    n,
                )
            };
            // A MatMul's role, transposed: C^T = B^T · A^T with the weight `a^T` as B.
            let bt = MatRef {
                data: &b[..],
                rs: 1,
                cs: n,
            };
            let pw = PackedB::new(
                MatRef {
                    data: &a[..],
                    rs: 1,
                    cs: k,
                },
                k,
                m,
            );
            let mut y2 = vec![f32::NAN; n * m];
            matmul(bt, n, &pw, Start::Zero, &mut y2);
            let (exact, scale) = reference(&a, &b, m, k, n);
            let mut worst = 0f64;
            for i in 0..m {
                for j in 0..n {
                    assert_eq!(
                        y1[i * n + j].to_bits(),
                        y2[j * m + i].to_bits(),
                        "{m}x{k}x{n} at ({i}, {j})"
                    );
                    let err = (y1[i * n + j] as f64 - exact[i * n + j]).abs()
                        / scale[i * n + j].max(1e-30);
                    worst = worst.max(err);
                }
            }
            eprintln!("{m}x{k}x{n}: worst relative error {worst:e}");
            // f32 sums of k products: a few units of 2^-24 per term at worst.
            assert!(
                worst < 2e-6 * (k as f64).sqrt().max(1.0),
                "{m}x{k}x{n}: {worst:e}"
            );
        }
    }

    /// A pointwise conv on channel-blocked input, output or both gives the bits of
    /// the conv on NCHW data (two images, 48 -> 80 channels, 15x13 positions: partial
    /// tiles and panels, and a block of 16 positions cut short).
    #[test]
    fn blocked_layouts_give_the_same_bits() {
        use super::super::blocked::{block_slice, unblock_slice};
        if !enabled() {
            eprintln!("no AMX here: skipped");
            return;
        }
        let (n, c, m, plane) = (2, 48, 80, 15 * 13);
        let g = Win3 {
            input: [1, 15, 13],
            out: [1, 15, 13],
            kernel: [1; 3],
            stride: [1; 3],
            dil: [1; 3],
            pad: [0; 3],
        };
        let (x, w, bias) = (values(n * c * plane, 21), values(m * c, 22), values(m, 23));
        let packed = pack_conv_weights(&w, m, 1, &g);
        let run = |layouts: Layouts| {
            let input = match layouts.input {
                true => block_slice(&x, n, c, plane),
                false => x.clone(),
            };
            let mut y = vec![f32::NAN; n * m * plane];
            conv(
                &packed,
                &input,
                Some(&bias),
                &mut y,
                n,
                c,
                m,
                1,
                &g,
                None,
                layouts,
            );
            let y = match layouts.output {
                true => unblock_slice(&y, n, m, plane),
                false => y,
            };
            y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let nchw = run(Layouts::default());
        for (input, output) in [(true, false), (false, true), (true, true)] {
            assert_eq!(
                run(Layouts {
                    input,
                    output,
                    wide: false
                }),
                nchw,
                "{input} {output}"
            );
        }
    }

    /// Sums staged on 64-byte lines (the output's rows off them) are the sums
    /// stored in place (rows on them), bit for bit, starting from a bias and then
    /// from the output.
    #[test]
    fn staged_sums_are_the_sums_in_place() {
        if !enabled() {
            eprintln!("no AMX here: skipped");
            return;
        }
        let (m, k, n) = (70, 200, 64);
        let (a, b, bias) = (values(m * k, 11), values(k * n, 12), values(m, 13));
        let pa = PackedA::new(MatRef::row_major(&a, k), m, k);
        let planes = BSource::Planes { x: &b, stride: n };
        let run = |offset: usize| {
            let mut buf = vec![Aligned([f32::NAN; 16]); (m * n + offset).div_ceil(16)];
            let y = buf.as_mut_ptr().cast::<f32>().wrapping_add(offset);
            for start in [Start::Bias(&bias), Start::Output] {
                // SAFETY: AMX is enabled; `y` holds m × n values.
                unsafe { gemm(ASource::Packed(&pa), 0..m, 0..n, start, planes, y, n) };
            }
            // SAFETY: as above.
            let y = unsafe { std::slice::from_raw_parts(y, m * n) };
            y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        assert_eq!(run(0), run(1));
    }

    /// A strided padded 3x3 conv with two images and partial blocks against f64
    /// sums, and its bits on 1 and 2 threads.
    #[test]
    fn strided_conv_gathers_its_windows() {
        let g = Win3 {
            input: [1, 29, 27],
            out: [1, 15, 14],
            kernel: [1, 3, 3],
            stride: [1, 2, 2],
            dil: [1; 3],
            pad: [0, 1, 1],
        };
        assert!(!tap_by_tap(&g));
        check_conv(&g, 2, 40, 70);
    }

    /// A dilated 3x3 conv whose taps mostly read padding (DeepLab's ASPP, smaller)
    /// runs tap by tap over bands of outputs, 40 channels padded to 64 per tap: the
    /// same checks.
    #[test]
    fn padding_heavy_conv_runs_tap_by_tap() {
        let g = Win3 {
            input: [1, 19, 17],
            out: [1, 19, 17],
            kernel: [1, 3, 3],
            stride: [1; 3],
            dil: [1, 7, 12],
            pad: [0, 7, 12],
        };
        assert!(tap_by_tap(&g));
        check_conv(&g, 2, 40, 70);
    }

    /// [`conv`] of `n` images of `c` channels to `m` against f64 sums (within
    /// f32 rounding of the sum of |terms|), and its bits on 1 and 2 threads.
    fn check_conv(g: &Win3, n: usize, c: usize, m: usize) {
        if !enabled() {
            eprintln!("no AMX here: skipped");
            return;
        }
        let [_, ih, iw] = g.input;
        let [_, oh, ow] = g.out;
        let [_, kh, kw] = g.kernel;
        let taps = kh * kw;
        let kdim = c * taps;
        let (x, w, bias) = (
            values(n * c * ih * iw, 3),
            values(m * kdim, 4),
            values(m, 5),
        );
        let packed = pack_conv_weights(&w, m, 1, g);
        let out_vol = oh * ow;
        let run = |threads: usize| {
            let mut y = vec![f32::NAN; n * m * out_vol];
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                conv(
                    &packed,
                    &x,
                    Some(&bias),
                    &mut y,
                    n,
                    c,
                    m,
                    1,
                    g,
                    None,
                    Layouts::default(),
                )
            });
            y
        };
        let y = run(1);
        assert_eq!(
            y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            run(2).iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        for b in 0..n {
            for o in 0..m {
                for p in 0..out_vol {
                    let (r, col) = (p / ow, p % ow);
                    let (mut sum, mut scale) = (bias[o] as f64, bias[o].abs() as f64);
                    for ci in 0..c {
                        for t in 0..taps {
                            let ir = (r * g.stride[1] + t / kw * g.dil[1]) as isize - g.pad[1];
                            let ic = (col * g.stride[2] + t % kw * g.dil[2]) as isize - g.pad[2];
                            if ir < 0 || ic < 0 || ir >= ih as isize || ic >= iw as isize {
                                continue;
                            }
                            let xv =
                                x[(b * c + ci) * ih * iw + ir as usize * iw + ic as usize] as f64;
                            let wv = w[o * kdim + ci * taps + t] as f64;
                            sum += xv * wv;
                            scale += (xv * wv).abs();
                        }
                    }
                    let got = y[(b * m + o) * out_vol + p] as f64;
                    assert!(
                        (got - sum).abs() <= 2e-6 * (kdim as f64).sqrt() * scale,
                        "{b} {o} {p}: {got} {sum}"
                    );
                }
            }
        }
    }
}
