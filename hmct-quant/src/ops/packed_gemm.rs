//! A packed f32 GEMM for AVX-512 or AVX2: `C = start + A·B`, each output summed from
//! its start value over `k` in order with fused multiply-adds. Pointwise convs run on
//! it (see [`conv_prefers`] for what was measured), and MatMul and Gemm with a weight
//! for `B` ([`matmul`]).
//!
//! `A` (whose elements are broadcast) is packed in tiles of `mr` rows, `k`-major, so
//! a tile's weights for one `k` are adjacent; conv weights are constants, so
//! [`super::conv`] packs them once per plan. A MatMul's `A` (its activations) is read
//! in place instead: packing it weighs where the weight has few columns (ConvNeXt-T's
//! 3136x384x96 in `kernel_table`: 1.35x the `gemm` crate's time with it packed,
//! 0.95-0.98x read in place). `B` is packed right before use, a block of `kc` × `nc`
//! at a time (it stays in the L2 cache), in panels of `kc` × `nr` read in order: by a
//! caller-given packer, so a conv packs its input's windows (implicit im2col); or a
//! constant `B` is packed once, whole ([`PackedB`]). Each register tile of `mr` rows
//! × `nr` columns (AVX-512: 12 × 32 in 24 zmm accumulators; AVX2: 6 × 16 in 12 ymm; two
//! vectors of `B` and one broadcast per row and `k`) then runs at the FMA units' rate;
//! its `A` tile stays in L1 while it sweeps the block's panels (see [`Geometry`]).
//! Blocks of `k` after the first add to the sums the previous one stored (exact: f32
//! values round-trip through memory).
//!
//! The direct conv ([`super::conv_direct`]) sums `bias + Σ_c Σ_taps w·x` in the same
//! order with the same instructions, so a conv gives the same bits on either path,
//! with any instruction set, tiling or thread count.

use std::cell::RefCell;

use super::gemm_util::MatRef;
use super::window::Win3;
use crate::cpu::Isa;

/// The blocking of one instruction set: rows and columns of a register tile (`mr`,
/// `nr`), and the depth and width of a packed block of `B` (`kc`, `nc`).
///
/// AVX-512: a block is 128 × 384 (192 KiB, in a 1 MiB L2 beside its `A` tiles); a
/// panel (`kc` × `nr`) is 16 KiB, half of L1, beside the 6 KiB `A` tile it meets; at
/// a depth of 256 it filled L1 alone (`kernel_table`: ResNet-50's 256->64 at 56x56
/// went from 73% to 84% of the FMA peak, 64->256 from 83% to 89%; blocks of `k`
/// after the first add to stored sums, so the bits are the same). AVX2 (Zen 3, 512
/// KiB L2) keeps the same block: depths 128 and 256 by widths 192, 384 and 768, and
/// sweeping panels outside row tiles instead of inside, all ran ResNet-50's 1x1 convs
/// at 56x56 within 3% of each other.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geometry {
    mr: usize,
    nr: usize,
    kc: usize,
    nc: usize,
}

impl Geometry {
    pub(crate) fn of(isa: Isa) -> Geometry {
        match isa {
            Isa::Avx512 => Geometry {
                mr: AVX512_MR,
                nr: AVX512_NR,
                kc: 128,
                nc: 384,
            },
            Isa::Avx2Fma => Geometry {
                mr: AVX2_MR,
                nr: AVX2_NR,
                kc: 128,
                nc: 384,
            },
        }
    }
}

/// Register tiles: rows × columns, per instruction set.
const AVX512_MR: usize = 12;
const AVX512_NR: usize = 32;
const AVX2_MR: usize = 6;
const AVX2_NR: usize = 16;

/// `A` packed in tiles of `mr` rows, one block of `kc` depths at a time: block `b`
/// holds, tile after tile, rows `t·mr ..` as groups of `mr` values (rows past the
/// last are zero) for depths `b·kc ..`, for the register tiles of `isa`. [`gemm`]
/// runs a block's row tiles in turn, so it reads `A` as one stream. Packed tile by
/// tile over all of `k`, a tile's 6 KiB for one block lay `k·mr` values from the next
/// tile's, and weights larger than L2 stalled at the start of every tile: DeepLabV3's
/// ASPP convs (up to 8.8 MiB of weights for 256 rows, bands of 64-144 positions) ran
/// faster with the next tile prefetched by hand (`run --profile`, dilation 12:
/// 36.5-45.9 -> 32.7-35.0 ms per run), and as fast again with this layout and no
/// prefetch (the ASPP's convs 49.5 -> 47.9 ms, least of 3 alternating rounds).
pub(crate) struct PackedA {
    data: Vec<f32>,
    m: usize,
    k: usize,
    isa: Isa,
}

impl PackedA {
    pub(crate) fn new(a: MatRef<f32>, m: usize, k: usize, isa: Isa) -> PackedA {
        let mut p = PackedA {
            data: Vec::new(),
            m,
            k,
            isa,
        };
        p.repack(a, m, k);
        p
    }

    /// Packs `a` into this buffer (reusing its memory).
    pub(crate) fn repack(&mut self, a: MatRef<f32>, m: usize, k: usize) {
        let Geometry { mr, kc, .. } = Geometry::of(self.isa);
        let rows = m.div_ceil(mr) * mr;
        self.data.clear();
        self.data.resize(rows * k, 0.0);
        (self.m, self.k) = (m, k);
        for k0 in (0..k).step_by(kc) {
            let depth = kc.min(k - k0);
            let block = &mut self.data[k0 * rows..][..depth * rows];
            for (t, tile) in block.chunks_exact_mut(mr * depth).enumerate() {
                for r in 0..mr.min(m - t * mr) {
                    let row = &a.data[(t * mr + r) * a.rs + k0 * a.cs..];
                    for (kk, d) in tile.iter_mut().skip(r).step_by(mr).enumerate() {
                        *d = row[kk * a.cs];
                    }
                }
            }
        }
    }

    pub(crate) fn rows(&self) -> usize {
        self.m
    }

    pub(crate) fn depth(&self) -> usize {
        self.k
    }
}

/// What each output's sum starts from.
#[derive(Clone, Copy)]
pub(crate) enum Start<'a> {
    /// Row `i` of `A` starts from `bias[i]`.
    Bias(&'a [f32]),
    Zero,
    /// The value already in `C`.
    Output,
}

/// Packs rows `k0 .. k0 + kc` × columns `j0 .. j0 + cols` (`cols <= nr`) of `B` into
/// `dst` (`kc` rows of `nr`; columns from `cols` on must be written as zero).
pub(crate) trait PackB {
    fn pack(&self, k0: usize, kc: usize, j0: usize, cols: usize, nr: usize, dst: &mut [f32]);

    /// Columns `j0 .. j0 + width` as consecutive panels.
    fn pack_block(
        &self,
        k0: usize,
        kc: usize,
        j0: usize,
        width: usize,
        nr: usize,
        dst: &mut [f32],
    ) {
        for p in 0..width.div_ceil(nr) {
            let cols = nr.min(width - p * nr);
            self.pack(
                k0,
                kc,
                j0 + p * nr,
                cols,
                nr,
                &mut dst[p * kc * nr..][..kc * nr],
            );
        }
    }
}

/// Where [`gemm`] takes `A` from: packed tiles, or a matrix read in place (row `i`
/// of a register tile broadcast from `i · rs` past the tile's first, the next `k`
/// `cs` further on: nothing to pack, for an operand that changes on every call).
#[derive(Clone, Copy)]
pub(crate) enum ASource<'a> {
    Packed(&'a PackedA),
    Matrix {
        a: MatRef<'a, f32>,
        m: usize,
        k: usize,
        isa: Isa,
    },
}

impl ASource<'_> {
    /// The instruction set, rows and depth.
    fn dims(&self) -> (Isa, usize, usize) {
        match *self {
            ASource::Packed(p) => (p.isa, p.m, p.k),
            ASource::Matrix { m, k, isa, .. } => (isa, m, k),
        }
    }

    /// Where the register tile of rows from `t0` reads `k0`: the pointer, the
    /// distance between its rows and between consecutive `k`.
    fn at(&self, t0: usize, k0: usize) -> (*const f32, usize, usize) {
        match *self {
            ASource::Packed(p) => {
                let Geometry { mr, kc, .. } = Geometry::of(p.isa);
                debug_assert!(k0.is_multiple_of(kc));
                // The block of depths from `k0` starts at `k0 · rows`; its tile of
                // rows from `t0`, `t0 · depth` further.
                let (rows, depth) = (p.m.div_ceil(mr) * mr, kc.min(p.k - k0));
                (p.data[k0 * rows + t0 * depth..].as_ptr(), 1, mr)
            }
            ASource::Matrix { a, .. } => (a.data[t0 * a.rs + k0 * a.cs..].as_ptr(), a.rs, a.cs),
        }
    }
}

/// Where [`gemm`] takes `B` from.
#[derive(Clone, Copy)]
pub(crate) enum BSource<'a> {
    /// Packed a block at a time, right before use.
    Pack(&'a dyn PackB),
    /// Packed once (a constant).
    Packed(&'a PackedB),
}

/// A constant `B` (`k × n`, a weight) packed once, whole, in the blocks and panels
/// [`gemm`] reads: the block of columns `j0 ..` (a multiple of `nc`) and rows `k0 ..`
/// (a multiple of `kc`) is `kc` × `nc` as [`PackB::pack`] lays it out, at
/// `j0 · k + k0 · width` (`width` the block's columns rounded up to `nr`).
pub(crate) struct PackedB {
    data: Vec<f32>,
    k: usize,
    n: usize,
    isa: Isa,
}

impl PackedB {
    pub(crate) fn new(b: MatRef<f32>, k: usize, n: usize, isa: Isa) -> PackedB {
        let Geometry { nr, kc, nc, .. } = Geometry::of(isa);
        let mut data = vec![0.0; k * n.div_ceil(nr) * nr];
        for j0 in (0..n).step_by(nc) {
            let width = nc.min(n - j0).div_ceil(nr) * nr;
            for k0 in (0..k).step_by(kc) {
                let kcb = kc.min(k - k0);
                let block = &mut data[j0 * k + k0 * width..][..kcb * width];
                MatrixB(b).pack_block(k0, kcb, j0, nc.min(n - j0), nr, block);
            }
        }
        PackedB { data, k, n, isa }
    }

    /// The block of columns from `j0` and rows from `k0`, whole.
    fn block(&self, j0: usize, k0: usize) -> &[f32] {
        let Geometry { nr, kc, nc, .. } = Geometry::of(self.isa);
        let width = nc.min(self.n - j0).div_ceil(nr) * nr;
        &self.data[j0 * self.k + k0 * width..][..kc.min(self.k - k0) * width]
    }
}

thread_local! {
    static B_BLOCK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `C[i][j] = start_i + Σ_k A[i][k]·B[k][j]` for rows `rows` of `a` (the first a
/// multiple of its tiles' `mr`) and columns `columns` of `b`; `C[i][j]` is at
/// `c + (i - rows.start)·ldc + j - columns.start`.
///
/// # Safety
/// The CPU runs `a`'s instruction set (which a packed `b` was packed for); an
/// `ASource::Matrix` holds its `m × k` values; `c` points to the `rows.len() ×
/// columns.len()` block with row stride `ldc >= columns.len()`, which nothing else
/// accesses during the call; `Start::Bias` has a value for every row of `rows`.
pub(crate) unsafe fn gemm(
    a: ASource,
    rows: std::ops::Range<usize>,
    columns: std::ops::Range<usize>,
    start: Start,
    b: BSource,
    c: *mut f32,
    ldc: usize,
) {
    let (isa, m, k) = a.dims();
    let Geometry { mr, nr, kc, nc } = Geometry::of(isa);
    if let BSource::Packed(pb) = b {
        debug_assert!(pb.isa == isa && pb.k == k && columns.end <= pb.n);
        debug_assert!(columns.start.is_multiple_of(nc));
    }
    let (kc_max, nc_max) = (kc, nc);
    debug_assert!(rows.start.is_multiple_of(mr) && rows.end <= m);
    let n = columns.len();
    if rows.is_empty() || n == 0 {
        return;
    }
    if k == 0 {
        for i in rows.clone() {
            let v = match start {
                Start::Bias(bias) => bias[i],
                Start::Zero => 0.0,
                Start::Output => continue,
            };
            // SAFETY: row i of the caller's block.
            unsafe { std::slice::from_raw_parts_mut(c.add((i - rows.start) * ldc), n).fill(v) };
        }
        return;
    }
    let mut block = B_BLOCK.with(|cell| cell.take());
    block.resize(kc_max * nc_max, 0.0);
    for j0 in (0..n).step_by(nc_max) {
        let nc = nc_max.min(n - j0);
        let panels = nc.div_ceil(nr);
        for k0 in (0..k).step_by(kc_max) {
            let kc = kc_max.min(k - k0);
            let panels_at = match b {
                BSource::Pack(b) => {
                    b.pack_block(k0, kc, columns.start + j0, nc, nr, &mut block);
                    block.as_ptr()
                }
                BSource::Packed(b) => b.block(columns.start + j0, k0).as_ptr(),
            };
            let from = if k0 == 0 { start } else { Start::Output };
            let run = |t0: usize, p: usize| {
                let r = mr.min(rows.end - t0);
                let (at, a_rs, a_ks) = a.at(t0, k0);
                let bias = match from {
                    Start::Bias(bias) => Some(&bias[t0..t0 + r]),
                    _ => None,
                };
                let cols = nr.min(nc - p * nr);
                // SAFETY: the tile reads rows `t0 .. t0 + r` × depths `k0 .. k0 + kc`
                // of `a` (packed, or in place inside the matrix `matmul` checked) and
                // `kc` rows of `nr` of the block, and accesses rows
                // `t0 .. t0 + r` × columns `j0 + p·nr ..` (`cols` of them) of the
                // caller's block.
                unsafe {
                    let ct = c.add((t0 - rows.start) * ldc + j0 + p * nr);
                    let bt = panels_at.add(p * kc * nr);
                    let load = matches!(from, Start::Output);
                    tile(isa, r, kc, (at, a_rs, a_ks), bt, ct, ldc, cols, bias, load);
                }
            };
            // A packed `B` is one stream in the order of the blocks here; the next
            // block's lines are fetched into L2 over the row tiles after the first,
            // which read this block from L2 (see `NextBlock`).
            let mut next = match b {
                BSource::Packed(pb) => NextBlock::after(pb, columns.clone(), j0, k0),
                BSource::Pack(_) => NextBlock::default(),
            };
            let calls = (rows.len().div_ceil(mr) - 1) * panels;
            for (i, t0) in rows.clone().step_by(mr).enumerate() {
                for p in 0..panels {
                    if i > 0 {
                        next.fetch_share((i - 1) * panels + p, calls);
                    }
                    run(t0, p);
                }
            }
        }
    }
    B_BLOCK.with(|cell| cell.replace(block));
}

/// The lines of the packed `B` block [`gemm`] reads after the current one, within the
/// caller's columns, fetched into L2 a share at a time.
///
/// A block is 192 KiB: with few rows (ConvNeXt-T's last stage has 49 positions, 768
/// -> 3072 channels and 9 MiB of weights), the first row tile waited for each block
/// from memory and the other four read it from L2.
#[derive(Default)]
struct NextBlock {
    start: usize,
    lines: usize,
    fetched: usize,
}

impl NextBlock {
    const LINE: usize = 64;

    /// The block after `(j0, k0)` (offsets within `columns`) of `pb`.
    fn after(pb: &PackedB, columns: std::ops::Range<usize>, j0: usize, k0: usize) -> NextBlock {
        let Geometry { kc, nc, .. } = Geometry::of(pb.isa);
        let (next_j0, next_k0) = if k0 + kc < pb.k {
            (j0, k0 + kc)
        } else {
            (j0 + nc, 0)
        };
        if next_j0 >= columns.len() {
            return NextBlock::default();
        }
        let block = pb.block(columns.start + next_j0, next_k0);
        NextBlock {
            start: block.as_ptr() as usize,
            lines: size_of_val(block).div_ceil(Self::LINE),
            fetched: 0,
        }
    }

    /// Fetches the lines up to share `i + 1` of `of`.
    #[inline]
    fn fetch_share(&mut self, i: usize, of: usize) {
        let upto = self.lines * (i + 1) / of;
        #[cfg(target_arch = "x86_64")]
        for line in self.fetched..upto {
            // SAFETY: a prefetch is a hint; it reads nothing and never faults.
            unsafe {
                use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
                _mm_prefetch::<_MM_HINT_T1>((self.start + line * Self::LINE) as *const i8);
            }
        }
        self.fetched = upto;
    }
}

/// One register tile of `r <= mr` rows.
///
/// # Safety
/// As in [`gemm`]'s body.
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    isa: Isa,
    r: usize,
    kc: usize,
    a: (*const f32, usize, usize),
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    cols: usize,
    bias: Option<&[f32]>,
    load: bool,
) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: forwarded from the caller.
    unsafe {
        if isa == Isa::Avx2Fma {
            let f = match r {
                6 => avx2::tile::<6>,
                5 => avx2::tile::<5>,
                4 => avx2::tile::<4>,
                3 => avx2::tile::<3>,
                2 => avx2::tile::<2>,
                _ => avx2::tile::<1>,
            };
            return f(kc, a, b, c, ldc, cols, bias, load);
        }
        let f = match r {
            12 => avx512::tile::<12>,
            11 => avx512::tile::<11>,
            10 => avx512::tile::<10>,
            9 => avx512::tile::<9>,
            8 => avx512::tile::<8>,
            7 => avx512::tile::<7>,
            6 => avx512::tile::<6>,
            5 => avx512::tile::<5>,
            4 => avx512::tile::<4>,
            3 => avx512::tile::<3>,
            2 => avx512::tile::<2>,
            _ => avx512::tile::<1>,
        };
        f(kc, a, b, c, ldc, cols, bias, load)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, r, kc, a, b, c, ldc, cols, bias, load);
        unreachable!("the packed GEMM runs only on x86-64 with AVX2 or AVX-512");
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// Lanes `i < n` set, for `n` in `0..=16`.
    #[inline]
    fn mask(n: usize) -> __mmask16 {
        ((1u32 << n.min(16)) - 1) as __mmask16
    }

    /// Writes `len` values to `out`: for column `c` in `c0 .. c0 + len`, the input
    /// `src[c·s + off]` when `c` is in `[a, e)`, else zero. Padding lanes are masked off,
    /// so they are never read.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `src[c·s + off]` is readable for c in `[a, e)`, and `out`
    /// has `len <= 32` writable values.
    #[inline]
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn copy_columns(
        src: *const f32,
        c0: usize,
        len: usize,
        a: usize,
        e: usize,
        s: usize,
        off: isize,
        out: *mut f32,
    ) {
        let stride = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(s as i32),
        );
        for v in (0..len).step_by(16) {
            // Lanes [v, v + 16) of the segment: in the data from `a` to `e`.
            let lane = |c: usize| (c.saturating_sub(c0 + v)).min(16);
            let data = mask(lane(e)) & !mask(lane(a));
            let keep = mask(len - v);
            // The pointer of lane 0 may lie before the row (its lane is masked off).
            let first = src.wrapping_offset(((c0 + v) * s) as isize + off);
            // SAFETY: only lanes in `data` are read, inside the row (see above); the
            // store writes lanes below `len - v` of `out`.
            unsafe {
                let x = if s == 1 {
                    _mm512_maskz_loadu_ps(data, first)
                } else {
                    _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), data, stride, first)
                };
                _mm512_mask_storeu_ps(out.add(v), keep, x);
            }
        }
    }

    /// [`super::Windows::pack`] with [`copy_columns`].
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pack_windows(w: &super::Windows, k0: usize, kc: usize, dst: &mut [f32]) {
        let s = w.g.stride[2];
        w.pack(k0, kc, dst, |out, src, c0, a, e, off| {
            // SAFETY: AVX-512F (the caller's promise); `inner_range` put the columns
            // `[a, e)` inside the row, and `out` holds the segment's values.
            unsafe { copy_columns(src.as_ptr(), c0, out.len(), a, e, s, off, out.as_mut_ptr()) }
        });
    }

    /// `R` rows × `cols` (≤ 32) columns: starts from the bias (or zero), or from `c`
    /// when `load`, adds `kc` products, stores into `c`.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile<const R: usize>(
        kc: usize,
        (mut a, a_rs, a_ks): (*const f32, usize, usize),
        mut b: *const f32,
        c: *mut f32,
        ldc: usize,
        cols: usize,
        bias: Option<&[f32]>,
        load: bool,
    ) {
        let masks = [mask(cols), mask(cols.saturating_sub(16))];
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        // SAFETY (whole body): the caller vouches for `kc` groups of `R` values
        // (`a_rs` apart, groups `a_ks` apart) at `a`, `kc` rows of `AVX512_NR` at
        // `b`, and `R` rows of `cols` values at `c`; masked-off lanes are neither read
        // nor written.
        unsafe {
            for (i, acc) in acc.iter_mut().enumerate() {
                for (v, acc) in acc.iter_mut().enumerate() {
                    *acc = match bias {
                        _ if load => _mm512_maskz_loadu_ps(masks[v], c.add(i * ldc + 16 * v)),
                        Some(bias) => _mm512_set1_ps(bias[i]),
                        None => _mm512_setzero_ps(),
                    };
                }
            }
            for _ in 0..kc {
                let x0 = _mm512_loadu_ps(b);
                let x1 = _mm512_loadu_ps(b.add(16));
                for (i, acc) in acc.iter_mut().enumerate() {
                    let w = _mm512_set1_ps(*a.add(i * a_rs));
                    acc[0] = _mm512_fmadd_ps(w, x0, acc[0]);
                    acc[1] = _mm512_fmadd_ps(w, x1, acc[1]);
                }
                a = a.add(a_ks);
                b = b.add(super::AVX512_NR);
            }
            for (i, acc) in acc.iter().enumerate() {
                for (v, &acc) in acc.iter().enumerate() {
                    _mm512_mask_storeu_ps(c.add(i * ldc + 16 * v), masks[v], acc);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// `R` rows × `cols` (≤ 16) columns: starts from the bias (or zero), or from `c`
    /// when `load`, adds `kc` products, stores into `c`. A tile of fewer columns goes
    /// through a buffer on the stack (masked loads and stores are slow on Zen 3).
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile<const R: usize>(
        kc: usize,
        (mut a, a_rs, a_ks): (*const f32, usize, usize),
        mut b: *const f32,
        c: *mut f32,
        ldc: usize,
        cols: usize,
        bias: Option<&[f32]>,
        load: bool,
    ) {
        let mut buf = [[0f32; 16]; R];
        let (out, ld) = if cols == 16 {
            (c, ldc)
        } else {
            if load {
                for (i, row) in buf.iter_mut().enumerate() {
                    // SAFETY: row i of the caller's tile has `cols` values.
                    row[..cols].copy_from_slice(unsafe {
                        std::slice::from_raw_parts(c.add(i * ldc), cols)
                    });
                }
            }
            (buf.as_mut_ptr().cast::<f32>(), 16)
        };
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        // SAFETY (whole body): the caller vouches for `kc` groups of `R` values
        // (`a_rs` apart, groups `a_ks` apart) at `a`, `kc` rows of 16 at `b`, and `R`
        // rows of `cols` values at `c`; `out` is either `c` with 16 columns per row or
        // the stack buffer.
        unsafe {
            for (i, acc) in acc.iter_mut().enumerate() {
                for (v, acc) in acc.iter_mut().enumerate() {
                    *acc = match bias {
                        _ if load => _mm256_loadu_ps(out.add(i * ld + 8 * v)),
                        Some(bias) => _mm256_set1_ps(bias[i]),
                        None => _mm256_setzero_ps(),
                    };
                }
            }
            for _ in 0..kc {
                let x0 = _mm256_loadu_ps(b);
                let x1 = _mm256_loadu_ps(b.add(8));
                for (i, acc) in acc.iter_mut().enumerate() {
                    let w = _mm256_broadcast_ss(&*a.add(i * a_rs));
                    acc[0] = _mm256_fmadd_ps(w, x0, acc[0]);
                    acc[1] = _mm256_fmadd_ps(w, x1, acc[1]);
                }
                a = a.add(a_ks);
                b = b.add(super::AVX2_NR);
            }
            for (i, acc) in acc.iter().enumerate() {
                for (v, &acc) in acc.iter().enumerate() {
                    _mm256_storeu_ps(out.add(i * ld + 8 * v), acc);
                }
            }
            if cols < 16 {
                for (i, row) in buf.iter().enumerate() {
                    std::ptr::copy_nonoverlapping(row.as_ptr(), c.add(i * ldc), cols);
                }
            }
        }
    }
}

/// `B` given as a matrix: each panel row is copied (or gathered, for a transposed
/// matrix) and padded with zeros.
pub(crate) struct MatrixB<'a>(pub MatRef<'a, f32>);

impl PackB for MatrixB<'_> {
    fn pack(&self, k0: usize, kc: usize, j0: usize, cols: usize, nr: usize, dst: &mut [f32]) {
        let b = self.0;
        for (kk, row) in dst.chunks_exact_mut(nr).take(kc).enumerate() {
            let first = (k0 + kk) * b.rs + j0 * b.cs;
            if b.cs == 1 {
                row[..cols].copy_from_slice(&b.data[first..first + cols]);
            } else {
                for (jj, d) in row[..cols].iter_mut().enumerate() {
                    *d = b.data[first + jj * b.cs];
                }
            }
            row[cols..].fill(0.0);
        }
    }
}

/// The implicit im2col matrix of one image group of a 2-D conv (`Win3` with a depth of
/// one): row `c · k_vol + tap` (taps row-major over the kernel), column = output
/// position (row-major over the output plane), value = the input under that tap, or
/// zero in the padding.
pub(crate) struct ConvB<'a> {
    /// The group's input channels, `in_vol` values each.
    pub x: &'a [f32],
    pub g: &'a Win3,
}

impl PackB for ConvB<'_> {
    fn pack(&self, k0: usize, kc: usize, j0: usize, cols: usize, nr: usize, dst: &mut [f32]) {
        let g = self.g;
        let in_vol = g.in_vol();
        let [_, _, ow] = g.out;
        let [_, _, kw] = g.kernel;
        if g.pointwise() {
            // Pointwise: row c is channel c's positions as they are.
            for (kk, row) in dst.chunks_exact_mut(nr).take(kc).enumerate() {
                row[..cols].copy_from_slice(&self.x[(k0 + kk) * in_vol + j0..][..cols]);
                row[cols..].fill(0.0);
            }
            return;
        }
        // The panel's columns by output row: (output row, first column, count, offset
        // in the panel).
        let mut segs = [(0usize, 0usize, 0usize, 0usize); AVX512_NR];
        let mut nseg = 0;
        let mut j = j0;
        while j < j0 + cols {
            let (r, c0) = (j / ow, j % ow);
            let len = (ow - c0).min(j0 + cols - j);
            segs[nseg] = (r, c0, len, j - j0);
            nseg += 1;
            j += len;
        }
        let segs = &segs[..nseg];
        // Per kernel column: the output columns whose source is inside the input.
        let mut ranges = [(0usize, 0usize, 0isize); 16];
        let ranges = if kw <= ranges.len() {
            for (tb, r) in ranges.iter_mut().enumerate().take(kw) {
                *r = g.inner_range(tb);
            }
            &ranges[..kw]
        } else {
            &(0..kw).map(|tb| g.inner_range(tb)).collect::<Vec<_>>()[..]
        };
        let windows = Windows {
            x: self.x,
            g,
            segs,
            ranges,
            cols,
            nr,
        };
        #[cfg(target_arch = "x86_64")]
        if Isa::Avx512.supported() {
            // SAFETY: AVX-512 was checked.
            unsafe { avx512::pack_windows(&windows, k0, kc, dst) };
            return;
        }
        let s = g.stride[2];
        windows.pack(k0, kc, dst, |out, src, c0, a, e, off| {
            out[..a - c0].fill(0.0);
            out[e - c0..].fill(0.0);
            let first = (a * s) as isize + off;
            for (i, d) in out[a - c0..e - c0].iter_mut().enumerate() {
                *d = src[(first + (i * s) as isize) as usize];
            }
        });
    }
}

/// A panel of a 2-D conv's implicit im2col matrix (rows: channel, tap row, tap
/// column, in that order): the group's input `x`, the panel's columns `segs` (output
/// row, first column, count, offset in the panel), `cols` of them in rows of `nr`, and
/// `ranges[tb]`, kernel column `tb`'s [`Win3::inner_range`].
struct Windows<'a> {
    x: &'a [f32],
    g: &'a Win3,
    segs: &'a [(usize, usize, usize, usize)],
    ranges: &'a [(usize, usize, isize)],
    cols: usize,
    nr: usize,
}

impl Windows<'_> {
    /// Rows `k0 .. k0 + kc` into `dst` (zero from `cols` on). `copy(out, src_row, c0,
    /// a, e, off)` writes one segment: for column `c` in `c0 .. c0 + out.len()`,
    /// `src_row[c·stride + off]` where `a <= c < e`, else zero. The tap is followed
    /// by counting, not by dividing each row index.
    #[inline(always)]
    fn pack(
        &self,
        k0: usize,
        kc: usize,
        dst: &mut [f32],
        mut copy: impl FnMut(&mut [f32], &[f32], usize, usize, usize, isize),
    ) {
        let Windows {
            x,
            g,
            segs,
            ranges,
            cols,
            nr,
        } = *self;
        let in_vol = g.in_vol();
        let [_, kh, kw] = g.kernel;
        let iw = g.input[2];
        let k_vol = kh * kw;
        let (mut ci, mut ta, mut tb) = (k0 / k_vol, k0 % k_vol / kw, k0 % kw);
        for row in dst.chunks_exact_mut(nr).take(kc) {
            let plane = &x[ci * in_vol..][..in_vol];
            let (lo, hi, off) = ranges[tb];
            row[cols..].fill(0.0);
            for &(r, c0, len, d0) in segs {
                let out = &mut row[d0..d0 + len];
                match g.src(1, r, ta) {
                    None => out.fill(0.0),
                    // Output columns [a, e) of the segment read the input.
                    Some(h) => copy(
                        out,
                        &plane[h * iw..][..iw],
                        c0,
                        lo.clamp(c0, c0 + len),
                        hi.clamp(c0, c0 + len),
                        off,
                    ),
                }
            }
            tb += 1;
            if tb == kw {
                (tb, ta) = (0, ta + 1);
                if ta == kh {
                    (ta, ci) = (0, ci + 1);
                }
            }
        }
    }
}

/// Whether a 2-D conv runs faster here than on the direct kernel: measured with
/// `kernel_table` (release build, one thread), pointwise convs (1x1, stride 1, no pads)
/// with 24 or more output channels per group and planes of 128 positions or more
/// (ResNet-50's 64->256 at 56x56: 66% -> 77% of the FMA peak, 256->64: 49% -> 68%,
/// 1024->256 at 14x14: 56% -> 67%). Their panels are plain copies of input rows. Convs
/// whose panels gather windows (3x3, strides, pads) ran slower than on the direct
/// kernel (3x3 128->128 at 28x28: 71% -> 51%, stride 2: 51% -> 21%): the packing
/// costs more than the register tiles gain, so they stay on the direct kernel.
///
/// With AVX2 (Zen 3, median of alternating rounds against the direct kernel):
/// ResNet-50's 64->256 and 256->64 at 56x56 0.84 and 0.80 of the time; but
/// MobileNetV3's 16->64 at 112x112 1.13 and 40->240 at 28x28 1.26, so AVX2 takes
/// pointwise convs of 64 or more input channels, and those whose input channels
/// overflow the L1 lines one position of every channel plane can occupy
/// ([`l1_lines_across_planes`]): the direct kernel reads its input in place, and on
/// YOLOv8n's 160x160 planes (100 KiB apart, all in one set) its 32->32 conv took 1.44
/// ms against 0.94 here, 16->64 1.72 against 1.00; on 112x112 planes (4 sets, 32
/// lines) 32->32 ran 0.40 there against 0.45 here (`kernel_table`'s `yolo_1x1_*` and
/// `sets_1x1_32to32_112`, least of 10 runs; the MobileNetV3 figures above with the
/// depth threshold at 16).
pub(crate) fn conv_prefers(isa: Isa, g: &Win3, mg: usize, kdim: usize) -> bool {
    let Geometry { mr, nr, .. } = Geometry::of(isa);
    let deep_enough = match isa {
        Isa::Avx512 => kdim >= 16,
        Isa::Avx2Fma => kdim >= 64 || (kdim >= 16 && kdim > l1_lines_across_planes(g.out_vol())),
    };
    let pointwise = g.pointwise();
    pointwise && mg >= 2 * mr && deep_enough && g.out_vol() >= 4 * nr
}

/// How many lines of a 32 KiB, 8-way L1 cache (64 sets of 64-byte lines) the values
/// at one position of consecutive f32 channel planes of `plane` values can occupy:
/// planes a multiple of 4 KiB apart all map to one set (8 lines), so a kernel that
/// reads more channels than that at one position evicts its own lines.
pub(crate) fn l1_lines_across_planes(plane: usize) -> usize {
    let bytes = plane * 4;
    if !bytes.is_multiple_of(64) {
        return 512;
    }
    let sets = 64 >> (bytes / 64).trailing_zeros().min(6);
    8 * sets
}

/// Whether a band of a padding-heavy conv (see [`super::conv`]'s `padding_bands`)
/// of `positions` outputs runs here, its windows gathered in place: with at least two
/// row tiles of output channels per group and a panel of positions. DeepLabV3's ASPP
/// convs (960->256, 3x3, dilations 12 and 24 on a 32x32 map), ms per run inside the
/// model (`run --profile`, 3 alternating rounds, Xeon without AMX), on copies of each
/// band's rectangle on the channel-lanes kernel -> here: 37.2-47.7 -> 26.9-30.9 and
/// 22.5-27.0 -> 12.6-14.4 (onnxruntime 24.2-25.6 and 12.5-13.7).
pub(crate) fn band_prefers(isa: Isa, mg: usize, kdim: usize, positions: usize) -> bool {
    let Geometry { mr, nr, .. } = Geometry::of(isa);
    mg >= 2 * mr && kdim >= 16 && positions >= nr
}

/// Conv weights `[m, cg, taps...]` packed per group for the tiles of `isa`.
pub(crate) fn pack_conv_weights(
    isa: Isa,
    w: &[f32],
    m: usize,
    group: usize,
    kdim: usize,
) -> Vec<PackedA> {
    let mg = m / group;
    (0..group)
        .map(|g| {
            PackedA::new(
                MatRef::row_major(&w[g * mg * kdim..][..mg * kdim], kdim),
                mg,
                kdim,
                isa,
            )
        })
        .collect()
}

/// Output channels per task, in register tiles, when positions alone give few tasks.
const M_CHUNK_TILES: usize = 4;
/// Multiply-adds below which a conv runs on the calling thread.
const SERIAL_WORK: usize = 1 << 20;

/// `y = conv(x, w) + bias` for f32 NCHW data of a 2-D conv (a `Win3` of depth one), with
/// `w` packed by [`pack_conv_weights`]; `y` is written in full. Tasks are (image,
/// group, block of `nc` positions, chunk of output channels); each output is summed in
/// the same order whatever the tasks.
///
/// The CPU runs the instruction set `w` was packed for.
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
) {
    use rayon::prelude::*;
    let (cg, mg) = (c / group, m / group);
    let (in_vol, out_vol) = (g.in_vol(), g.out_vol());
    let kdim = cg * g.k_vol();
    assert!(w.len() == group && w.iter().all(|p| p.rows() == mg && p.depth() == kdim));
    assert!(w.iter().all(|p| p.isa.supported()));
    assert!(x.len() >= n * c * in_vol && y.len() >= n * m * out_vol);
    let Geometry { mr, nr, nc, .. } = Geometry::of(w[0].isa);
    // On more than one thread, the positions are split into runs of whole panels, as
    // evenly between threads as whole panels allow, each packed by its task alone. A
    // pointwise conv with too few panels for that splits its output channels instead,
    // each chunk packing the input again. That repeat cost too much where it was the
    // rule for pointwise convs of up to three blocks of `nc` positions (DenseNet-121's
    // 512->256 at 28x28 packed its 1.5 MiB of input six times: 1.03-1.17 ms per run
    // at two threads against 1.47 at one; by positions 0.92-1.12, `run --profile`, 3
    // alternating rounds), and where packing gathers windows (DeepLabV3's ASPP bands,
    // six chunks: no faster at two threads than at one). On one thread, blocks of
    // `nc` (the sums are the same either way).
    let threads = crate::par::threads();
    let panels = out_vol.div_ceil(nr);
    let by_channels = threads > 1 && g.pointwise() && panels < 2 * threads;
    let task_cols = if threads > 1 && !by_channels {
        nr * crate::par::even_chunk(panels, nc / nr, n * group)
    } else {
        nc
    };
    let blocks = out_vol.div_ceil(task_cols);
    let m_chunk = if by_channels && mg > M_CHUNK_TILES * mr {
        M_CHUNK_TILES * mr
    } else {
        mg
    };
    let m_tasks = mg.div_ceil(m_chunk);
    let tasks = n * group * blocks * m_tasks;
    let yp = super::gemm_util::SendPtr(y.as_mut_ptr());
    let task = |t: usize| {
        let blk = t % blocks;
        let mt = t / blocks % m_tasks;
        let bg = t / blocks / m_tasks;
        let (b, gi) = (bg / group, bg % group);
        let xg = &x[(b * c + gi * cg) * in_vol..][..cg * in_vol];
        let rows = mt * m_chunk..(mt * m_chunk + m_chunk).min(mg);
        let cols = blk * task_cols..(blk * task_cols + task_cols).min(out_vol);
        let start = match bias {
            Some(bias) => Start::Bias(&bias[gi * mg..][..mg]),
            None => Start::Zero,
        };
        let yp = &yp;
        // SAFETY: the task writes channels `gi·mg + rows` × positions `cols` of image
        // `b`, which no other task writes, inside `y` (checked above), then runs the
        // tail on them; the CPU runs `w`'s instruction set (checked above).
        unsafe {
            let dst =
                yp.0.add((b * m + gi * mg + rows.start) * out_vol + cols.start);
            gemm(
                ASource::Packed(&w[gi]),
                rows.clone(),
                cols.clone(),
                start,
                BSource::Pack(&ConvB { x: xg, g }),
                dst,
                out_vol,
            );
            if let Some(tail) = tail {
                let at = (b * m + gi * mg + rows.start) * out_vol + cols.start;
                tail.apply_runs(yp.0, at, rows.len(), cols.len(), out_vol);
            }
        }
    };
    if tasks == 1 || n * m * out_vol * kdim < SERIAL_WORK || !crate::par::enabled() {
        (0..tasks).for_each(task);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
}

/// Row tiles per task of a parallel [`matmul`].
const MATMUL_ROW_TILES: usize = 16;

/// `y = start + a · b` for an `m × k` matrix `a` (read in place) and a packed constant
/// `b` (`k × n`), with `y` row-major `m × n`; `start` is `Start::Zero` or
/// `Start::Output` (the values in `y`). Tasks are (chunk of row tiles, block of `nc`
/// columns). Each output is summed over `k` in order whatever the tasks, so the
/// thread count does not change a bit.
///
/// The CPU runs the instruction set `b` was packed for.
pub(crate) fn matmul(a: MatRef<f32>, m: usize, b: &PackedB, start: Start, y: &mut [f32]) {
    use rayon::prelude::*;
    let (k, n, isa) = (b.k, b.n, b.isa);
    assert!(isa.supported() && y.len() >= m * n && !matches!(start, Start::Bias(_)));
    assert!(m == 0 || k == 0 || (m - 1) * a.rs + (k - 1) * a.cs < a.data.len());
    if m == 0 || n == 0 {
        return;
    }
    let a = ASource::Matrix { a, m, k, isa };
    let Geometry { mr, nc, .. } = Geometry::of(isa);
    if m * n * k < SERIAL_WORK || !crate::par::enabled() {
        // SAFETY: `y` holds the `m × n` block (checked above), `a` covers `m × k`;
        // the CPU runs `b`'s instruction set.
        unsafe { gemm(a, 0..m, 0..n, start, BSource::Packed(b), y.as_mut_ptr(), n) };
        return;
    }
    let col_tasks = n.div_ceil(nc);
    let chunk = crate::par::even_chunk(m.div_ceil(mr), MATMUL_ROW_TILES, col_tasks) * mr;
    let yp = super::gemm_util::SendPtr(y.as_mut_ptr());
    let task = |t: usize| {
        let (rt, ct) = (t / col_tasks, t % col_tasks);
        let rows = rt * chunk..(rt * chunk + chunk).min(m);
        let cols = ct * nc..(ct * nc + nc).min(n);
        let yp = &yp;
        // SAFETY: the task writes rows `rows` × columns `cols` of `y` (checked above),
        // which no other task writes; as above otherwise.
        unsafe {
            let dst = yp.0.add(rows.start * n + cols.start);
            gemm(a, rows, cols, start, BSource::Packed(b), dst, n);
        }
    };
    (0..m.div_ceil(chunk) * col_tasks)
        .into_par_iter()
        .for_each(task);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::Isa;
    use crate::ops::conv_direct;
    use crate::ops::conv_direct::tests::values;
    use crate::par::{in_pool, same_bits};

    /// A 2-D conv geometry: batch, input and output channels, groups, input rows and
    /// columns, kernel, stride, dilation, pads (top, left; bottom and right alike).
    struct Shape {
        n: usize,
        c: usize,
        m: usize,
        group: usize,
        hw: [usize; 2],
        k: [usize; 2],
        s: [usize; 2],
        d: [usize; 2],
        p: [usize; 2],
    }

    fn win(sh: &Shape) -> Win3 {
        let out = |i: usize| (sh.hw[i] + 2 * sh.p[i] - (sh.k[i] - 1) * sh.d[i] - 1) / sh.s[i] + 1;
        Win3 {
            input: [1, sh.hw[0], sh.hw[1]],
            out: [1, out(0), out(1)],
            kernel: [1, sh.k[0], sh.k[1]],
            stride: [1, sh.s[0], sh.s[1]],
            dil: [1, sh.d[0], sh.d[1]],
            pad: [0, sh.p[0] as isize, sh.p[1] as isize],
        }
    }

    /// Which kernel runs a conv in the tests.
    #[derive(Clone, Copy, Debug)]
    enum Path {
        Packed(Isa),
        Direct(Isa),
    }

    /// Instruction sets this CPU runs.
    fn isas() -> Vec<Isa> {
        [Isa::Avx512, Isa::Avx2Fma]
            .into_iter()
            .filter(|isa| isa.supported())
            .collect()
    }

    /// The conv on the packed GEMM or on the direct kernel.
    fn run(sh: &Shape, path: Path, bias: bool) -> Vec<f32> {
        let g = win(sh);
        let kdim = sh.c / sh.group * g.k_vol();
        let x = values(sh.n * sh.c * g.in_vol(), 1);
        let w = values(sh.m * kdim, 2);
        let b = values(sh.m, 3);
        let b = bias.then_some(&b[..]);
        let mut y = vec![f32::NAN; sh.n * sh.m * g.out_vol()];
        match path {
            Path::Packed(isa) => {
                let packed = pack_conv_weights(isa, &w, sh.m, sh.group, kdim);
                conv(&packed, &x, b, &mut y, sh.n, sh.c, sh.m, sh.group, &g, None);
            }
            Path::Direct(isa) => {
                conv_direct::conv(isa, &x, &w, b, &mut y, sh.n, sh.c, sh.m, sh.group, &g, None)
            }
        }
        y
    }

    fn shapes() -> Vec<Shape> {
        let base = Shape {
            n: 1,
            c: 16,
            m: 24,
            group: 1,
            hw: [20, 40],
            k: [3, 3],
            s: [1, 1],
            d: [1, 1],
            p: [1, 1],
        };
        vec![
            Shape { ..base },
            // Row tiles with a tail (29 = 2·12 + 5), positions not a multiple of 32.
            Shape {
                m: 29,
                hw: [7, 7],
                ..base
            },
            // Several blocks of k (300 > 256) and of positions (> 384), pointwise.
            Shape {
                c: 300,
                m: 30,
                hw: [20, 21],
                k: [1, 1],
                p: [0, 0],
                ..base
            },
            // Pointwise with a stride, 3x3 with stride 2, uneven strides.
            Shape {
                c: 40,
                m: 26,
                hw: [15, 17],
                k: [1, 1],
                s: [2, 2],
                p: [0, 0],
                ..base
            },
            Shape {
                c: 8,
                m: 48,
                hw: [31, 45],
                s: [2, 2],
                ..base
            },
            Shape {
                c: 5,
                m: 36,
                hw: [13, 19],
                k: [3, 5],
                s: [1, 3],
                p: [2, 1],
                ..base
            },
            // Dilation, groups and a batch; an output channel chunk split (few positions).
            Shape {
                n: 2,
                c: 16,
                m: 52,
                group: 2,
                hw: [12, 12],
                d: [2, 2],
                p: [2, 2],
                ..base
            },
            Shape {
                c: 64,
                m: 200,
                hw: [4, 4],
                ..base
            },
            // 1-D (one row), rows narrower than a panel, a 7x7 stride-2 stem.
            Shape {
                c: 24,
                m: 25,
                hw: [1, 70],
                k: [1, 5],
                p: [0, 2],
                ..base
            },
            Shape {
                c: 3,
                m: 24,
                hw: [30, 30],
                k: [7, 7],
                s: [2, 2],
                p: [3, 3],
                ..base
            },
        ]
    }

    /// The packed GEMM sums each output as the direct kernels do (bias, then input
    /// channels and taps in order, fused multiply-adds), so all three give the same
    /// bits: with and without a bias, on full and partial tiles, several blocks of `k`
    /// and positions, strides, dilation, padding, groups and batches.
    #[test]
    fn same_bits_as_the_direct_kernels() {
        if isas().is_empty() {
            eprintln!("skipped: this CPU lacks AVX2 and AVX-512");
            return;
        }
        for (i, sh) in shapes().iter().enumerate() {
            for bias in [true, false] {
                for packed_isa in isas() {
                    let packed = run(sh, Path::Packed(packed_isa), bias);
                    for isa in isas() {
                        let direct = run(sh, Path::Direct(isa), bias);
                        let same = packed
                            .iter()
                            .zip(&direct)
                            .all(|(p, q)| p.to_bits() == q.to_bits());
                        assert!(
                            same,
                            "shape {i} (bias {bias}): packed {packed_isa:?} and {isa:?} differ"
                        );
                    }
                }
            }
        }
    }

    /// The same bits at 1, 2 and 3 threads, however the tasks split: positions of a
    /// 3x3 conv (3 panels), of pointwise convs of 25 panels (28x28) and of 98 (56x56,
    /// two images), and output channels of a pointwise conv of one panel.
    #[test]
    fn thread_count_independent() {
        let shape = |n: usize, c: usize, m: usize, hw: usize, k: usize| Shape {
            n,
            c,
            m,
            group: 1,
            hw: [hw, hw],
            k: [k, k],
            s: [1, 1],
            d: [1, 1],
            p: [k / 2, k / 2],
        };
        let shapes = [
            shape(1, 64, 120, 9, 3),
            shape(1, 48, 100, 28, 1),
            shape(2, 32, 64, 56, 1),
            shape(1, 640, 130, 4, 1),
        ];
        for isa in isas() {
            for (i, sh) in shapes.iter().enumerate() {
                let on = |threads| in_pool(threads, || run(sh, Path::Packed(isa), true));
                let one = on(1);
                for threads in [2, 3] {
                    assert!(
                        same_bits(&one, &on(threads)),
                        "{isa:?}, shape {i}, {threads} threads"
                    );
                }
            }
        }
    }

    #[test]
    fn l1_lines_of_channel_planes() {
        // 160x160: 100 KiB apart, one set; 112x112: 4 sets; 56x56: 16; 28x28 (49
        // lines apart): all 64; 14x14 planes do not start on a line.
        for (side, lines) in [
            (160, 8),
            (112, 32),
            (80, 32),
            (56, 128),
            (28, 512),
            (14, 512),
        ] {
            assert_eq!(l1_lines_across_planes(side * side), lines, "{side}x{side}");
        }
    }

    /// Matrix products against an f64 reference: row tails, column tails, several
    /// blocks of `k`, a transposed `B`, and sums added to what `C` holds.
    #[test]
    fn matrix_products() {
        for isa in isas() {
            matrix_products_on(isa);
        }
    }

    /// [`matmul`] (a read in place, b packed once) sums each output from its start
    /// over `k` in order with fused multiply-adds, bit for bit, with either operand
    /// transposed, at 1 and 3 threads: row chunks, column blocks and blocks of `k`
    /// with partial last ones, tiles of fewer rows and columns.
    #[test]
    fn packed_products_in_order() {
        for isa in isas() {
            for (m, n, k) in [
                (1, 1, 1),
                (5, 17, 3),
                (13, 33, 130),
                (197, 400, 300),
                (250, 20, 260),
            ] {
                let a = values(m * k, 7);
                let b = values(k * n, 8);
                let at: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
                let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
                let c0 = values(m * n, 9);
                let want = |from_c: bool| -> Vec<u32> {
                    (0..m * n)
                        .map(|ij| {
                            let (i, j) = (ij / n, ij % n);
                            let mut s = if from_c { c0[ij] } else { 0.0 };
                            for p in 0..k {
                                s = a[i * k + p].mul_add(b[p * n + j], s);
                            }
                            s.to_bits()
                        })
                        .collect()
                };
                let packed = [
                    PackedB::new(MatRef::row_major(&b, n), k, n, isa),
                    PackedB::new(MatRef::transposed(&bt, k), k, n, isa),
                ];
                for (pb, am, from_c) in [
                    (&packed[0], MatRef::row_major(&a, k), false),
                    (&packed[1], MatRef::transposed(&at, m), true),
                ] {
                    let expected = want(from_c);
                    for threads in [1, 3] {
                        let pool = rayon::ThreadPoolBuilder::new()
                            .num_threads(threads)
                            .build()
                            .unwrap();
                        let mut c = c0.clone();
                        let start = if from_c { Start::Output } else { Start::Zero };
                        pool.install(|| matmul(am, m, pb, start, &mut c));
                        let got: Vec<u32> = c.iter().map(|v| v.to_bits()).collect();
                        assert!(got == expected, "{isa:?} {m}x{n}x{k} {threads} threads");
                    }
                }
            }
        }
    }

    fn matrix_products_on(isa: Isa) {
        for (m, n, k) in [
            (1, 1, 1),
            (13, 33, 7),
            (25, 400, 300),
            (12, 32, 0),
            (40, 70, 520),
        ] {
            let a = values(m * k, 4);
            let b = values(k * n, 5);
            let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
            let c0 = values(m * n, 6);
            let want = |i: usize, j: usize| {
                (0..k)
                    .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                    .sum::<f64>()
            };
            let pa = PackedA::new(MatRef::row_major(&a, k), m, k, isa);
            for (bm, start) in [
                (MatRef::row_major(&b, n), Start::Zero),
                (MatRef::transposed(&bt, k), Start::Output),
            ] {
                let mut c = c0.clone();
                // SAFETY: `isa` is supported; `c` is m × n with row stride n.
                unsafe {
                    let (a, b) = (ASource::Packed(&pa), BSource::Pack(&MatrixB(bm)));
                    gemm(a, 0..m, 0..n, start, b, c.as_mut_ptr(), n)
                };
                for i in 0..m {
                    for j in 0..n {
                        let base = if matches!(start, Start::Output) {
                            c0[i * n + j] as f64
                        } else {
                            0.0
                        };
                        let e = base + want(i, j);
                        let got = c[i * n + j] as f64;
                        assert!(
                            (got - e).abs() <= 1e-4 * (1.0 + e.abs()),
                            "{isa:?} {m}x{n}x{k} ({i},{j}): {got} vs {e}"
                        );
                    }
                }
            }
        }
    }
}
