//! MaxPool (with Indices), AveragePool, GlobalAveragePool and GlobalMaxPool over 1-D to
//! 3-D windows. One parallel task per (image, channel) plane.

use hmct_tensor::{Tensor, f16};
use rayon::prelude::*;

use super::arrays::{array, contiguous};
use super::broadcast::for_chunks_with_scratch;
use super::conv::{f32_slice, f32_slice_mut};
use super::pool_rows::{AvgRows, MaxRows};
use super::window::{Win3, WindowAttrs};
use super::{Kernel, NodeSpec, OpError, input};

pub(crate) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>> {
    let k: Result<Box<dyn Kernel>, OpError> = match spec.op_type {
        "MaxPool" | "AveragePool" => PoolKernel::new(spec).map(|k| Box::new(k) as Box<dyn Kernel>),
        "GlobalAveragePool" => Ok(Box::new(|i: &[Option<&Tensor>]| {
            global(input(i, 0)?, false)
        })),
        "GlobalMaxPool" => Ok(Box::new(|i: &[Option<&Tensor>]| global(input(i, 0)?, true))),
        _ => return None,
    };
    Some(k)
}

struct PoolKernel {
    max: bool,
    attrs: WindowAttrs,
    kernel: Vec<usize>,
    ceil_mode: bool,
    count_include_pad: bool,
    column_major: bool,
    want_indices: bool,
}

impl PoolKernel {
    fn new(spec: &NodeSpec) -> Result<Self, OpError> {
        let max = spec.op_type == "MaxPool";
        let attrs = WindowAttrs::parse(spec)?;
        let kernel = attrs
            .kernel_shape
            .clone()
            .ok_or_else(|| OpError::invalid(format!("{} without kernel_shape", spec.op_type)))?;
        if !max
            && attrs
                .dilations
                .as_ref()
                .is_some_and(|d| d.iter().any(|&x| x != 1))
            && spec.opset < 19
        {
            return Err(OpError::invalid("AveragePool dilations before opset 19"));
        }
        let storage_order = spec.attrs.int_or("storage_order", 0)?;
        if !(0..=1).contains(&storage_order) {
            return Err(OpError::invalid(format!("storage_order {storage_order}")));
        }
        Ok(PoolKernel {
            max,
            attrs,
            kernel,
            ceil_mode: spec.attrs.int_or("ceil_mode", 0)? != 0,
            count_include_pad: spec.attrs.int_or("count_include_pad", 0)? != 0,
            column_major: storage_order == 1,
            want_indices: max && spec.num_outputs > 1,
        })
    }

    fn geometry(&self, xs: &[usize]) -> Result<(Win3, [usize; 3], Vec<usize>), OpError> {
        if xs.len() < 3 {
            return Err(OpError::invalid(format!("pooling input of shape {xs:?}")));
        }
        let win = self.attrs.resolve(&xs[2..], &self.kernel, self.ceil_mode)?;
        let g = Win3::new(&xs[2..], &win)?;
        let n = win.pad_end.len();
        let mut pe = [0usize; 3];
        pe[3 - n..].copy_from_slice(&win.pad_end);
        let mut shape = xs[..2].to_vec();
        shape.extend_from_slice(&win.out);
        Ok((g, pe, shape))
    }
}

/// Window taps of output `o` on axis `a`: the input positions inside the data, and how
/// many taps fall inside the padded extent `[-pad_begin, in + pad_end)`.
fn taps(g: &Win3, pe: &[usize; 3], a: usize, o: usize) -> (Vec<usize>, usize) {
    let mut inside = Vec::with_capacity(g.kernel[a]);
    let mut padded = 0;
    for k in 0..g.kernel[a] {
        let p = (o * g.stride[a] + k * g.dil[a]) as isize - g.pad[a];
        if p < g.input[a] as isize + pe[a] as isize {
            padded += 1;
        }
        if p >= 0 && (p as usize) < g.input[a] {
            inside.push(p as usize);
        }
    }
    (inside, padded)
}

/// Average pooling. Each output is `(0 + Σ x) / count`, the sum over its window's taps
/// inside the data in row-major order (`count`: those taps, or with
/// `count_include_pad` the taps inside the padded extent): f32 2-D windows with
/// AVX-512 as masked loads over the flat plane where the output has the input's shape
/// at stride 1 ([`avg_pool_same`]), else row by row where [`AvgRows`] applies (a
/// stride of 1 or 2 along the width: DenseNet-121's 2x2 stride-2 transitions, 0.080
/// -> 0.052 ms on 128 planes of 56x56 alone), else through phase planes
/// ([`avg_pool_phases`]); others blocks of a row's outputs at a time ([`avg_planes`]).
/// A loop per output over its own taps took Inception-v3's nine 3x3 average pools
/// 21.7 ms against onnxruntime's 0.6.
fn avg_pool<T: num_traits::Float + Default + Send + Sync + 'static>(
    x: &[T],
    xs: &[usize],
    g: &Win3,
    pe: &[usize; 3],
    include_pad: bool,
) -> Vec<T> {
    let (in_vol, out_vol) = (g.in_vol(), g.out_vol());
    let planes = xs[0] * xs[1];
    let axis_taps: Vec<Vec<(Vec<usize>, usize)>> = (0..3)
        .map(|a| (0..g.out[a]).map(|o| taps(g, pe, a, o)).collect())
        .collect();
    // What each output's sum is divided by (zero: the output is zero).
    let mut divisors = Vec::with_capacity(out_vol);
    for (td, pd) in &axis_taps[0] {
        for (th, ph) in &axis_taps[1] {
            for (tw, pw) in &axis_taps[2] {
                let count = match include_pad {
                    true => pd * ph * pw,
                    false => td.len() * th.len() * tw.len(),
                };
                divisors.push(T::from(count).unwrap_or(T::one()));
            }
        }
    }
    // Every output is written below: a recycled buffer (a fresh one faulted its pages
    // in on every call). Planes go to tasks in groups, fixed, so that small planes
    // (8x8) do not cost a call each.
    let mut y = crate::buffers::take::<T>(planes * out_vol);
    let per_task = (1 << 14) / out_vol.max(1) + 1;
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::conv_isa() == Some(crate::cpu::Isa::Avx512)
        && g.input[0] == 1
        && g.kernel[0] == 1
        && g.pad.iter().all(|&p| p >= 0)
        && out_vol > 0
        && let (Some(xf), Some(divf)) = (f32_slice(x), f32_slice(&divisors))
    {
        let yf = f32_slice_mut(&mut y).expect("T is f32, as x is");
        let same = g.stride == [1; 3] && g.out == g.input;
        if same {
            avg_pool_same(xf, yf, g, divf, per_task);
            return y;
        }
        if let Some(rows) = AvgRows::new(g) {
            let parallel = yf.len() * g.k_vol() >= 1 << 16;
            for_chunks_with_scratch(yf, out_vol * per_task, parallel, |_: &mut (), (t, out)| {
                for (i, out) in out.chunks_exact_mut(out_vol).enumerate() {
                    let plane = &xf[(t * per_task + i) * in_vol..][..in_vol];
                    rows.plane(plane, out, divf);
                }
            });
            return y;
        }
        avg_pool_phases(xf, yf, g, divf, per_task);
        return y;
    }
    let task = |(t, out): (usize, &mut [T])| {
        let x = &x[t * per_task * in_vol..];
        avg_planes(x, out, g, &axis_taps, &divisors)
    };
    if y.len() * g.k_vol() < (1 << 16) || !crate::par::enabled() {
        y.chunks_mut(out_vol.max(1) * per_task)
            .enumerate()
            .for_each(task);
    } else {
        y.par_chunks_mut(out_vol.max(1) * per_task)
            .enumerate()
            .for_each(task);
    }
    y
}

/// [`avg_pool`] for f32 planes of 2-D windows (and pads not negative) with AVX-512,
/// through the phase planes of max pooling ([`PhaseGeometry`], padding zero): a tap
/// reads one contiguous run of a phase plane for all outputs of the plane at the phase
/// planes' row width, so sums go 16 outputs a vector whatever the row width (the row
/// blocks of [`avg_planes`] left half the lanes idle on Inception-v3's 17- and 8-wide
/// rows, and take strided rows lane by lane). `per_task` planes per task. The same
/// taps in the same order from +0, and a tap in the padding adds +0, which changes no
/// sum (see [`avg_planes`]): the same bits.
#[cfg(target_arch = "x86_64")]
fn avg_pool_phases(x: &[f32], y: &mut [f32], g: &Win3, divisors: &[f32], per_task: usize) {
    let geo = PhaseGeometry::new(g);
    let taps = geo
        .taps_2d
        .as_deref()
        .expect("2-D windows have their taps listed");
    let [_, oh, ow] = g.out;
    let (in_vol, out_vol, cols) = (g.in_vol(), g.out_vol(), geo.cols);
    // The outputs at the phase planes' row width; the last row only as long as needed.
    let run = (oh - 1) * cols + ow;
    let mut wide_divisors = vec![1.0f32; run];
    for (r, d) in divisors.chunks_exact(ow).enumerate() {
        wide_divisors[r * cols..][..ow].copy_from_slice(d);
    }
    let task = |(split, wide): &mut (Vec<f32>, Vec<f32>), (t, out): (usize, &mut [f32])| {
        for (i, out) in out.chunks_exact_mut(out_vol).enumerate() {
            let plane = &x[(t * per_task + i) * in_vol..][..in_vol];
            geo.split(plane, split, 0.0);
            let dst = match cols == ow {
                true => &mut *out,
                false => {
                    wide.resize(run, 0.0);
                    &mut wide[..run]
                }
            };
            // SAFETY: the CPU has AVX-512F (the caller checked).
            unsafe { avg_fold_avx512(split, taps, &wide_divisors, dst) };
            if cols != ow {
                for (o, w) in out.chunks_exact_mut(ow).zip(wide.chunks(cols)) {
                    o.copy_from_slice(&w[..ow]);
                }
            }
        }
    };
    let parallel = y.len() * g.k_vol() >= 1 << 16;
    for_chunks_with_scratch(y, out_vol * per_task, parallel, task);
}

/// [`avg_pool`] for f32 planes of 2-D windows of stride 1 whose output has the
/// input's shape (Inception-v3's 3x3 pools, padded by 1), with AVX-512: a vector holds
/// 16 consecutive outputs of the flat plane, across row ends, and each tap is one
/// masked load at the tap's flat offset, its lanes outside the input (padding, or
/// another row) read as +0. No copy of the plane: the phase planes' path copied each
/// plane in and, on rows narrower than the padded ones, the outputs back out, row by
/// row (two short copies per row of a 17x17 or 35x35 plane). Inception-v3's nine
/// pools (`sh tools/ab_classes.sh 3`, least ms per run): 1.49-1.53 -> 1.05-1.08
/// (onnxruntime, on NCHWc data: 0.62). The same taps in the same order from +0 as
/// [`avg_planes`]: the same bits.
#[cfg(target_arch = "x86_64")]
fn avg_pool_same(x: &[f32], y: &mut [f32], g: &Win3, divisors: &[f32], per_task: usize) {
    let [_, ih, iw] = g.input;
    let plane = g.out_vol();
    let taps: Vec<(isize, isize)> = (0..g.kernel[1])
        .flat_map(|kh| (0..g.kernel[2]).map(move |kw| (kh, kw)))
        .map(|(kh, kw)| {
            let dh = (kh * g.dil[1]) as isize - g.pad[1];
            (dh, (kw * g.dil[2]) as isize - g.pad[2])
        })
        .collect();
    let offsets: Vec<isize> = taps.iter().map(|&(dh, dw)| dh * iw as isize + dw).collect();
    // Per vector of outputs, per tap: the lanes whose tap lies inside the input.
    let vectors = plane.div_ceil(16);
    let mut masks = vec![0u16; vectors * taps.len()];
    for p in 0..plane {
        let (h, w) = ((p / iw) as isize, (p % iw) as isize);
        for (t, &(dh, dw)) in taps.iter().enumerate() {
            let inside =
                (0..ih as isize).contains(&(h + dh)) && (0..iw as isize).contains(&(w + dw));
            masks[p / 16 * taps.len() + t] |= u16::from(inside) << (p % 16);
        }
    }
    let task = |_: &mut (), (t, out): (usize, &mut [f32])| {
        for (i, out) in out.chunks_exact_mut(plane).enumerate() {
            let src = &x[(t * per_task + i) * plane..][..plane];
            // SAFETY: the CPU has AVX-512F (the caller checked); the masks set only
            // lanes whose taps lie inside the plane, of outputs inside it.
            unsafe {
                match offsets.len() {
                    9 => avg_same_plane_avx512::<9>(src, &offsets, &masks, divisors, out),
                    _ => avg_same_plane_avx512::<0>(src, &offsets, &masks, divisors, out),
                }
            }
        }
    };
    let parallel = y.len() * g.k_vol() >= 1 << 16;
    for_chunks_with_scratch(y, plane * per_task, parallel, task);
}

/// One plane of [`avg_pool_same`]: `dst[p] = (+0 + Σ_t x[p + offsets[t]]) /
/// divisors[p]` over the taps in order, the lanes outside vector `v`'s mask of tap
/// `t` (`masks[v·taps + t]`) adding +0 (zero where the divisor is zero). `T` is the
/// number of taps, unrolled, or 0 for any number (3x3 unrolled against any number:
/// Inception-v3's pools 1.195 against 1.274 ms per run, `ab_classes.sh`, 3 rounds).
///
/// # Safety
/// The CPU has AVX-512F; each mask sets only lanes `p` with `p + offset` inside `x`
/// and `p` inside `dst` and `divisors`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avg_same_plane_avx512<const T: usize>(
    x: &[f32],
    offsets: &[isize],
    masks: &[u16],
    divisors: &[f32],
    dst: &mut [f32],
) {
    use std::arch::x86_64::*;
    let plane = dst.len();
    let taps = if T == 0 { offsets.len() } else { T };
    assert!(offsets.len() == taps && masks.len() == plane.div_ceil(16) * taps);
    assert!(x.len() >= plane && divisors.len() >= plane);
    for (v, masks) in masks.chunks_exact(taps).enumerate() {
        let p = 16 * v;
        let mut sums = _mm512_setzero_ps();
        for t in 0..taps {
            // Masked-off lanes neither read nor fault, wherever they point.
            let at = x.as_ptr().wrapping_offset(p as isize + offsets[t]);
            // SAFETY: the lanes the mask sets lie inside `x` (the caller vouched).
            let tap = unsafe { _mm512_maskz_loadu_ps(masks[t], at) };
            sums = _mm512_add_ps(sums, tap);
        }
        let kept = lanes_below(plane - p);
        // SAFETY: `kept` lanes lie inside `divisors` and `dst`.
        unsafe {
            let q = quotient_avx512(sums, divisors.as_ptr().add(p), kept);
            _mm512_mask_storeu_ps(dst.as_mut_ptr().add(p), kept, q);
        }
    }
}

/// The first `n` of 16 lanes (all of them from 16 on).
#[cfg(target_arch = "x86_64")]
pub(super) fn lanes_below(n: usize) -> u16 {
    ((1u32 << n.min(16)) - 1) as u16
}

/// The average pools' quotients: `sums` over the divisors at `by` in the `kept` lanes,
/// zero where a divisor is zero (and in the other lanes).
///
/// # Safety
/// The CPU has AVX-512F; the `kept` lanes from `by` are readable.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn quotient_avx512(
    sums: std::arch::x86_64::__m512,
    by: *const f32,
    kept: u16,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // SAFETY: the `kept` lanes are readable (the caller vouched).
    let c = unsafe { _mm512_maskz_loadu_ps(kept, by) };
    let nonzero = _mm512_mask_cmp_ps_mask::<_CMP_NEQ_UQ>(kept, c, _mm512_setzero_ps());
    _mm512_maskz_div_ps(nonzero, sums, c)
}

/// `dst[p] = (+0 + Σ_t split[t + p]) / divisors[p]` over the taps `t` in order (zero
/// where the divisor is zero), 64 outputs at a time in four vectors.
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avg_fold_avx512(split: &[f32], taps: &[usize], divisors: &[f32], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let run = dst.len();
    assert!(divisors.len() >= run && taps.iter().all(|&t| t + run <= split.len()));
    let (src, by, out) = (split.as_ptr(), divisors.as_ptr(), dst.as_mut_ptr());
    // SAFETY (every access below): outputs `p .. p + 16` lie below `run` (masked at
    // the end), so each tap's read lies inside `split` and each divisor inside
    // `divisors` (asserted above).
    let quotient =
        |sums: __m512, p: usize, kept: __mmask16| unsafe { quotient_avx512(sums, by.add(p), kept) };
    let mut p = 0;
    while p + 64 <= run {
        let mut sums = [_mm512_setzero_ps(); 4];
        for &t in taps {
            for (j, s) in sums.iter_mut().enumerate() {
                *s = _mm512_add_ps(*s, unsafe { _mm512_loadu_ps(src.add(t + p + 16 * j)) });
            }
        }
        for (j, &s) in sums.iter().enumerate() {
            let q = quotient(s, p + 16 * j, !0);
            unsafe { _mm512_storeu_ps(out.add(p + 16 * j), q) };
        }
        p += 64;
    }
    while p < run {
        let kept = lanes_below(run - p);
        let mut s = _mm512_setzero_ps();
        for &t in taps {
            s = _mm512_add_ps(s, unsafe { _mm512_maskz_loadu_ps(kept, src.add(t + p)) });
        }
        unsafe { _mm512_mask_storeu_ps(out.add(p), kept, quotient(s, p, kept)) };
        p += 16;
    }
}

/// Outputs of a row summed together: one AVX-512 vector of f32.
const AVG_LANES: usize = 16;

/// A plane's input rows, each between zero columns: the left padding, and on the
/// right as far as the last block of [`AVG_LANES`] outputs of a row reads. Padded
/// column `c` is input column `c - pad` (a negative pad skips input columns).
struct PaddedRows<T> {
    rows: Vec<T>,
    width: usize,
    pad: usize,
    skip: usize,
    /// Input rows per depth slice, and values per input row.
    height: usize,
    iw: usize,
}

impl<T: num_traits::Float> PaddedRows<T> {
    fn new(g: &Win3) -> PaddedRows<T> {
        let [id_n, ih_n, iw_n] = g.input;
        let (pad, skip) = (g.pad[2].max(0) as usize, (-g.pad[2]).max(0) as usize);
        let blocks = g.out[2].div_ceil(AVG_LANES);
        let reach = (blocks * AVG_LANES - 1) * g.stride[2] + (g.kernel[2] - 1) * g.dil[2] + 1;
        let width = reach.max(pad + iw_n.saturating_sub(skip));
        PaddedRows {
            rows: vec![T::zero(); id_n * ih_n * width],
            width,
            pad,
            skip,
            height: ih_n,
            iw: iw_n,
        }
    }

    /// Copies one plane's rows in (the zero columns stay as they are).
    fn fill(&mut self, plane: &[T]) {
        let kept = self.iw.saturating_sub(self.skip);
        for (src, dst) in plane
            .chunks_exact(self.iw)
            .zip(self.rows.chunks_exact_mut(self.width))
        {
            dst[self.pad..self.pad + kept].copy_from_slice(&src[self.skip..]);
        }
    }

    /// The rows a window reads, in order: depths `td`, each at heights `th`.
    fn window<'a>(&'a self, td: &'a [usize], th: &'a [usize]) -> impl Iterator<Item = &'a [T]> {
        td.iter().flat_map(move |&d| {
            th.iter()
                .map(move |&h| &self.rows[(d * self.height + h) * self.width..][..self.width])
        })
    }
}

/// Walks the blocks of [`AVG_LANES`] outputs of each output row of consecutive planes
/// (`out` holds whole planes, `x` their inputs from the first on), the planes' rows
/// copied into [`PaddedRows`] one plane at a time. `block` sums one block: given the
/// rows, the depths and heights its window reads, the padded column of its first
/// output's first tap, and its outputs and their divisors. Inline, so that `block`
/// is compiled with the caller's target features.
#[inline(always)]
fn avg_blocks<T: num_traits::Float>(
    x: &[T],
    out: &mut [T],
    g: &Win3,
    axis_taps: &[Vec<(Vec<usize>, usize)>],
    divisors: &[T],
    mut block: impl FnMut(&PaddedRows<T>, &[usize], &[usize], usize, &mut [T], &[T]),
) {
    let [_, oh_n, ow_n] = g.out;
    let (in_vol, out_vol) = (g.in_vol(), g.out_vol());
    let mut rows = PaddedRows::new(g);
    for (i, out) in out.chunks_mut(out_vol.max(1)).enumerate() {
        rows.fill(&x[i * in_vol..][..in_vol]);
        for (od, (td, _)) in axis_taps[0].iter().enumerate() {
            for (oh, (th, _)) in axis_taps[1].iter().enumerate() {
                for b in 0..ow_n.div_ceil(AVG_LANES) {
                    let j = (od * oh_n + oh) * ow_n + b * AVG_LANES;
                    let n = AVG_LANES.min(ow_n - b * AVG_LANES);
                    let first = b * AVG_LANES * g.stride[2];
                    block(
                        &rows,
                        td,
                        th,
                        first,
                        &mut out[j..][..n],
                        &divisors[j..][..n],
                    );
                }
            }
        }
    }
}

/// Consecutive planes of [`avg_pool`] (`out` holds whole planes, `x` their inputs
/// from the first on); `divisors` per output of a plane.
///
/// A block of [`AVG_LANES`] outputs of a row adds, per tap, the values the tap reads
/// from the [`PaddedRows`]. A tap in the padding adds zero, which changes no sum: sums
/// start at +0 and adding values never makes one -0, so `s + 0 = s` (NaN and
/// infinities stay). With AVX-512 the block is one vector (`avg_planes_avx512`).
fn avg_planes<T: num_traits::Float + 'static>(
    x: &[T],
    out: &mut [T],
    g: &Win3,
    axis_taps: &[Vec<(Vec<usize>, usize)>],
    divisors: &[T],
) {
    #[cfg(target_arch = "x86_64")]
    if g.stride[2] == 1
        && crate::cpu::conv_isa() == Some(crate::cpu::Isa::Avx512)
        && let (Some(xf), Some(divf)) = (f32_slice(x), f32_slice(divisors))
    {
        let outf = f32_slice_mut(out).expect("T is f32, as x is");
        // SAFETY: the CPU has AVX-512F (checked just above).
        unsafe { avg_planes_avx512(xf, outf, g, axis_taps, divf) };
        return;
    }
    let (sw, dw, kw) = (g.stride[2], g.dil[2], g.kernel[2]);
    avg_blocks(
        x,
        out,
        g,
        axis_taps,
        divisors,
        |rows, td, th, first, outs, by| {
            let mut sums = [T::zero(); AVG_LANES];
            for row in rows.window(td, th) {
                for k in 0..kw {
                    let taps = row[first + k * dw..].iter().step_by(sw);
                    for (s, &v) in sums.iter_mut().zip(taps) {
                        *s = *s + v;
                    }
                }
            }
            for ((o, &s), &c) in outs.iter_mut().zip(&sums).zip(by) {
                *o = if c == T::zero() { T::zero() } else { s / c };
            }
        },
    );
}

/// [`avg_planes`] for f32 rows of stride 1 with AVX-512: a block's sums in one vector.
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avg_planes_avx512(
    x: &[f32],
    out: &mut [f32],
    g: &Win3,
    axis_taps: &[Vec<(Vec<usize>, usize)>],
    divisors: &[f32],
) {
    use std::arch::x86_64::*;
    let (dw, kw) = (g.dil[2], g.kernel[2]);
    avg_blocks(
        x,
        out,
        g,
        axis_taps,
        divisors,
        |rows, td, th, first, outs, by| {
            let mut sums = _mm512_setzero_ps();
            for row in rows.window(td, th) {
                for k in 0..kw {
                    let taps = &row[first + k * dw..][..AVG_LANES];
                    // SAFETY: `taps` holds 16 values.
                    let v = unsafe { _mm512_loadu_ps(taps.as_ptr()) };
                    sums = _mm512_add_ps(sums, v);
                }
            }
            let kept = lanes_below(outs.len());
            // SAFETY: `kept` covers the values of `by` and `outs` (as many).
            unsafe {
                let q = quotient_avx512(sums, by.as_ptr(), kept);
                _mm512_mask_storeu_ps(outs.as_mut_ptr(), kept, q);
            }
        },
    );
}

/// Max pooling; the index of each maximum is flat over the whole input (row-major, or
/// column-major within a plane for `storage_order = 1`).
fn max_pool<T: Copy + PartialOrd + Send + Sync>(
    x: &[T],
    xs: &[usize],
    g: &Win3,
    pe: &[usize; 3],
    lowest: T,
    column_major: bool,
) -> (Vec<T>, Vec<i64>) {
    let (in_vol, out_vol) = (g.in_vol(), g.out_vol());
    let planes = xs[0] * xs[1];
    let [od_n, oh_n, ow_n] = g.out;
    let [id_n, ih_n, iw_n] = g.input;
    let axis_taps: Vec<Vec<Vec<usize>>> = (0..3)
        .map(|a| (0..g.out[a]).map(|o| taps(g, pe, a, o).0).collect())
        .collect();
    let mut y = vec![lowest; planes * out_vol];
    let mut idx = vec![0i64; planes * out_vol];
    let plane = |(p, (out, oi)): (usize, (&mut [T], &mut [i64]))| {
        let xp = &x[p * in_vol..][..in_vol];
        for od in 0..od_n {
            for oh in 0..oh_n {
                for ow in 0..ow_n {
                    let mut best = lowest;
                    let mut at: Option<(usize, usize, usize)> = None;
                    for &d in &axis_taps[0][od] {
                        for &h in &axis_taps[1][oh] {
                            let row = &xp[(d * ih_n + h) * iw_n..][..iw_n];
                            for &w in &axis_taps[2][ow] {
                                if at.is_none() || row[w] > best {
                                    best = row[w];
                                    at = Some((d, h, w));
                                }
                            }
                        }
                    }
                    let o = (od * oh_n + oh) * ow_n + ow;
                    out[o] = best;
                    let local = match at {
                        None => 0,
                        Some((d, h, w)) if column_major => (w * ih_n + h) * id_n + d,
                        Some((d, h, w)) => (d * ih_n + h) * iw_n + w,
                    };
                    oi[o] = (p * in_vol + local) as i64;
                }
            }
        }
    };
    let chunk = out_vol.max(1);
    if y.len() * g.k_vol() < (1 << 16) || !crate::par::enabled() {
        y.chunks_mut(chunk)
            .zip(idx.chunks_mut(chunk))
            .enumerate()
            .for_each(plane);
    } else {
        y.par_chunks_mut(chunk)
            .zip(idx.par_chunks_mut(chunk))
            .enumerate()
            .for_each(plane);
    }
    (y, idx)
}

/// Max pooling without indices: the same maximum as [`max_pool`] (the window's first
/// tap inside the data, then any later tap greater than it), a whole plane per tap.
///
/// Each depth slice of a plane is copied, with its padding, into `sh × sw` phase
/// planes: padded row `r`, column `c` goes to phase plane `(r % sh, c % sw)`, row
/// `r / sh`, column `c / sw`. A kernel tap then reads the rows and columns of every
/// output at consecutive places of one phase plane, so the tap is one element-wise max
/// over a contiguous run (the output is laid out at the phase plane's row width, and
/// trimmed after). Padding holds `skip`, a value `v > o` never accepts (NaN for floats,
/// the minimum for integers); each output starts from its first tap inside the data,
/// which the fold over all taps then meets again without effect.
fn max_pool_values<T: PoolElem>(x: &[T], xs: &[usize], g: &Win3, lowest: T, skip: T) -> Vec<T> {
    let (in_vol, out_vol) = (g.in_vol(), g.out_vol());
    let planes = xs[0] * xs[1];
    if let (Some(rows), Some(xf)) = (MaxRows::new(g), f32_slice(x)) {
        // Every output is written: no fill.
        let mut y = crate::buffers::take::<T>(planes * out_vol);
        max_pool_rows(
            xf,
            f32_slice_mut(&mut y).expect("T is f32, as x is"),
            g,
            &rows,
        );
        return y;
    }
    // From the buffer pool: a fresh 800 KB output (ResNet-50's pool) cost its page
    // faults on every run.
    let mut y = crate::buffers::take_filled(planes * out_vol, lowest);
    if out_vol == 0 || in_vol == 0 {
        return y;
    }
    if out_vol <= SMALL_OUT {
        max_pool_small(x, g, &mut y, lowest);
        return y;
    }
    let geo = PhaseGeometry::new(g);
    let plane = |scratch: &mut (Vec<T>, Vec<T>), (p, out): (usize, &mut [T])| {
        let (split, wide) = scratch;
        let xp = &x[p * in_vol..][..in_vol];
        pool_plane(&geo, xp, out, split, wide, lowest, skip);
    };
    let parallel = y.len() * g.k_vol() >= 1 << 16;
    for_chunks_with_scratch(&mut y, out_vol, parallel, plane);
    y
}

/// [`max_pool_values`] on f32 planes by [`MaxRows`]: each input row reduced along
/// the width once, then the reduced rows folded per output row.
fn max_pool_rows(x: &[f32], y: &mut [f32], g: &Win3, rows: &MaxRows) {
    let (in_vol, out_vol) = (g.in_vol(), g.out_vol());
    let parallel = y.len() * g.k_vol() >= 1 << 16;
    for_chunks_with_scratch(y, out_vol, parallel, |reduced, (p, out)| {
        rows.plane(&x[p * in_vol..][..in_vol], out, reduced)
    });
}

/// [`PhaseGeometry::plane`], compiled for AVX-512 or AVX2 where the CPU has them, so
/// the loops without hand-written vector code (other element types, odd strides)
/// vectorize sixteen or eight lanes wide.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl", "x86_64+avx2"))]
fn pool_plane<T: PoolElem>(
    geo: &PhaseGeometry,
    x: &[T],
    out: &mut [T],
    split: &mut Vec<T>,
    wide: &mut Vec<T>,
    lowest: T,
    skip: T,
) {
    geo.plane(x, out, split, wide, lowest, skip);
}

/// Outputs per plane up to which [`max_pool_small`] pools (MTCNN's 4x4 outputs):
/// there building the phase planes costs more than the maxima. Its time grows by
/// about 4 ns per output against the phase planes' 1.5 ns (one thread, 3x3 windows:
/// 75 vs 190 ns on a 4x4 plane, 400 vs 310 ns on a 10x10 one), so they cross near 64.
/// (Timed before the phase planes were folded in registers and filled once per call,
/// which made them faster still; the crossover may now lie lower.)
const SMALL_OUT: usize = 64;

/// [`max_pool_values`] for planes with few outputs: each output folds its taps inside
/// the data, in window order, from a list of offsets built once for every plane (the
/// same maximum: the first tap, then any later tap greater than it; `lowest` for a
/// window with no tap inside). On a 9x9 plane pooled to 4x4, the phase planes and
/// their trimming took five times as long.
fn max_pool_small<T: PoolElem>(x: &[T], g: &Win3, y: &mut [T], lowest: T) {
    let (in_vol, out_vol) = (g.in_vol(), g.out_vol());
    let [od_n, oh_n, ow_n] = g.out;
    let [_, ih_n, iw_n] = g.input;
    // Offsets of every output's taps inside the data, output after output.
    let mut offsets: Vec<usize> = Vec::with_capacity(out_vol * g.k_vol());
    let mut ends = Vec::with_capacity(out_vol);
    for od in 0..od_n {
        for oh in 0..oh_n {
            for ow in 0..ow_n {
                for kd in 0..g.kernel[0] {
                    let Some(d) = g.src(0, od, kd) else { continue };
                    for kh in 0..g.kernel[1] {
                        let Some(h) = g.src(1, oh, kh) else { continue };
                        for kw in 0..g.kernel[2] {
                            if let Some(w) = g.src(2, ow, kw) {
                                offsets.push((d * ih_n + h) * iw_n + w);
                            }
                        }
                    }
                }
                ends.push(offsets.len());
            }
        }
    }
    let plane = |(p, out): (usize, &mut [T])| {
        let xp = &x[p * in_vol..][..in_vol];
        let mut start = 0;
        for (o, &end) in out.iter_mut().zip(&ends) {
            let taps = &offsets[start..end];
            start = end;
            *o = match taps.split_first() {
                None => lowest,
                Some((&first, rest)) => rest.iter().fold(xp[first], |m, &i| {
                    let v = xp[i];
                    if v > m { v } else { m }
                }),
            };
        }
    };
    if y.len() * g.k_vol() < (1 << 16) || !crate::par::enabled() {
        y.chunks_mut(out_vol).enumerate().for_each(plane);
    } else {
        y.par_chunks_mut(out_vol).enumerate().for_each(plane);
    }
}

/// Element types of [`max_pool_values`], with its inner loop.
trait PoolElem: Copy + Default + PartialOrd + Send + Sync + 'static {
    /// `dst[i] = if src[i] > dst[i] { src[i] } else { dst[i] }` over equal lengths.
    #[inline(always)]
    fn max_into(dst: &mut [Self], src: &[Self]) {
        for (o, &v) in dst.iter_mut().zip(src) {
            *o = if v > *o { v } else { *o };
        }
    }

    /// `even[i] = row[2i]`, `odd[i] = row[2i + 1]` for every whole pair that fits.
    #[inline(always)]
    fn deinterleave(row: &[Self], even: &mut [Self], odd: &mut [Self]) {
        for ((e, o), pair) in even.iter_mut().zip(odd.iter_mut()).zip(row.chunks_exact(2)) {
            *e = pair[0];
            *o = pair[1];
        }
    }

    /// Whether [`PoolElem::fold_2d`] runs for this type on this CPU.
    #[inline(always)]
    fn has_fold_2d() -> bool {
        false
    }

    /// Pools a 2-D plane from its phase planes `split` straight into `out` (rows of
    /// `ow` outputs), folding every tap of a few outputs in registers. Output `(r, c)`
    /// of tap `t` is `split[taps[t] + r * cols + c]`. With `start_in_out`, each output
    /// starts from the value already in `out` and folds every tap; otherwise it starts
    /// from tap 0. Only called where [`PoolElem::has_fold_2d`].
    #[inline(always)]
    fn fold_2d(
        _split: &[Self],
        _taps: &[usize],
        _cols: usize,
        _out: &mut [Self],
        _ow: usize,
        _start_in_out: bool,
    ) {
        unreachable!("fold_2d without has_fold_2d")
    }
}

impl PoolElem for f64 {}
impl PoolElem for f16 {}
impl PoolElem for i8 {}
impl PoolElem for u8 {}

impl PoolElem for f32 {
    #[inline(always)]
    fn deinterleave(row: &[f32], even: &mut [f32], odd: &mut [f32]) {
        let pairs = (row.len() / 2).min(even.len()).min(odd.len());
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::features().avx2 {
            // SAFETY: the CPU has AVX2; `pairs` bounds every access.
            done = unsafe { deinterleave_avx2(row, even, odd, pairs) };
        }
        for i in done..pairs {
            even[i] = row[2 * i];
            odd[i] = row[2 * i + 1];
        }
    }

    #[inline(always)]
    fn has_fold_2d() -> bool {
        crate::cpu::features().avx2
    }

    #[inline(always)]
    fn fold_2d(
        split: &[f32],
        taps: &[usize],
        cols: usize,
        out: &mut [f32],
        ow: usize,
        start_in_out: bool,
    ) {
        let rows = out.len() / ow;
        let last = taps.iter().max().map(|&t| t + (rows - 1) * cols + ow);
        assert!(
            Self::has_fold_2d()
                && rows > 0
                && rows * ow == out.len()
                && last.is_some_and(|l| l <= split.len())
        );
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX2; the assert bounds every read of `split` (the last
        // output of the furthest tap) and `out` holds `rows` rows of `ow`.
        unsafe {
            fold_2d_avx2(split, taps, cols, out, ow, start_in_out)
        };
    }

    #[inline(always)]
    fn max_into(dst: &mut [f32], src: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::features().avx {
            // SAFETY: the CPU has AVX.
            unsafe { max_into_avx(dst, src) };
            return;
        }
        for (o, &v) in dst.iter_mut().zip(src) {
            *o = if v > *o { v } else { *o };
        }
    }
}

/// [`PoolElem::max_into`] for f32 with `vmaxps`, which is exactly `v > o ? v : o`
/// lane by lane. Written out because the compiler turns the plain loop into masked
/// stores, which are slower than the loop they replace.
///
/// # Safety
/// The CPU has AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn max_into_avx(dst: &mut [f32], src: &[f32]) {
    use std::arch::x86_64::*;
    let n = dst.len().min(src.len());
    let full = n / 8 * 8;
    // SAFETY: every access is below `n`, inside both slices.
    unsafe {
        for i in (0..full).step_by(8) {
            let o = dst.as_mut_ptr().add(i);
            let v = _mm256_loadu_ps(src.as_ptr().add(i));
            _mm256_storeu_ps(o, _mm256_max_ps(v, _mm256_loadu_ps(o)));
        }
    }
    for (o, &v) in dst[full..n].iter_mut().zip(&src[full..n]) {
        *o = if v > *o { v } else { *o };
    }
}

/// [`PoolElem::fold_2d`] for f32, eight outputs of a row in each vector: each tap is
/// one load and one `vmaxps` (`v > m ? v : m`, the fold's rule lane by lane) on a
/// running maximum kept in a register, and the outputs are stored once. Up to four
/// vectors are folded side by side, each tap's loads together (one vector at a time
/// was a little slower: O-Net's pools 0.051-0.055 against 0.046-0.053 ms per run,
/// `run --profile`, alternating). A row's last vector of fewer than eight
/// outputs is done as the eight outputs ending the row, folding a few again: folding
/// taps into their own maximum changes nothing. Rows of fewer than eight outputs use
/// masked loads and stores.
///
/// # Safety
/// The CPU has AVX2; `out` holds whole rows of `ow`, and every `taps[t] + r * cols +
/// c` for an output `(r, c)` is inside `split`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fold_2d_avx2(
    split: &[f32],
    taps: &[usize],
    cols: usize,
    out: &mut [f32],
    ow: usize,
    start_in_out: bool,
) {
    use std::arch::x86_64::*;
    let (first, rest) = match start_in_out {
        true => (None, taps),
        false => (Some(taps[0]), &taps[1..]),
    };
    let vectors = ow.div_ceil(8);
    for r in 0..out.len() / ow {
        // SAFETY: every access is to an output (r, c) of the row, or its taps.
        unsafe {
            let src = split.as_ptr().add(r * cols);
            let dst = out.as_mut_ptr().add(r * ow);
            if ow < 8 {
                let mask = _mm256_cmpgt_epi32(
                    _mm256_set1_epi32(ow as i32),
                    _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                );
                let mut m = match first {
                    Some(t) => _mm256_maskload_ps(src.add(t), mask),
                    None => _mm256_maskload_ps(dst, mask),
                };
                for &t in rest {
                    m = _mm256_max_ps(_mm256_maskload_ps(src.add(t), mask), m);
                }
                _mm256_maskstore_ps(dst, mask, m);
                continue;
            }
            let at = |v: usize| (8 * v).min(ow - 8);
            let mut v = 0;
            while v < vectors {
                match vectors - v {
                    1 => fold_vectors_avx2([at(v)], src, dst, first, rest),
                    2 => fold_vectors_avx2([at(v), at(v + 1)], src, dst, first, rest),
                    3 => fold_vectors_avx2([at(v), at(v + 1), at(v + 2)], src, dst, first, rest),
                    _ => fold_vectors_avx2(
                        [at(v), at(v + 1), at(v + 2), at(v + 3)],
                        src,
                        dst,
                        first,
                        rest,
                    ),
                }
                v += 4;
            }
        }
    }
}

/// Folds the eight outputs at each of `cols` of one row: from tap `first` (or from
/// `dst` without one), then every tap of `rest`.
///
/// # Safety
/// The CPU has AVX2; `dst + c` and `src + t + c` for every `c` of `cols` and tap `t`
/// are eight readable (`dst`: writable) values.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn fold_vectors_avx2<const V: usize>(
    cols: [usize; V],
    src: *const f32,
    dst: *mut f32,
    first: Option<usize>,
    rest: &[usize],
) {
    use std::arch::x86_64::*;
    // SAFETY: forwarded from the caller.
    unsafe {
        let mut m = [_mm256_setzero_ps(); V];
        for (m, &c) in m.iter_mut().zip(&cols) {
            *m = match first {
                Some(t) => _mm256_loadu_ps(src.add(t + c)),
                None => _mm256_loadu_ps(dst.add(c)),
            };
        }
        for &t in rest {
            let s = src.add(t);
            for (m, &c) in m.iter_mut().zip(&cols) {
                *m = _mm256_max_ps(_mm256_loadu_ps(s.add(c)), *m);
            }
        }
        for (m, &c) in m.iter().zip(&cols) {
            _mm256_storeu_ps(dst.add(c), *m);
        }
    }
}

/// [`PoolElem::deinterleave`] for f32, eight pairs at a time; returns the pairs done.
/// A last group of fewer than eight pairs is done as the eight pairs ending with it,
/// rewriting a few values with themselves: on rows of a few dozen values, a scalar
/// tail cost a third of the pooling.
///
/// # Safety
/// The CPU has AVX2; `row` holds `2 * pairs` values, `even` and `odd` `pairs` each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn deinterleave_avx2(row: &[f32], even: &mut [f32], odd: &mut [f32], pairs: usize) -> usize {
    use std::arch::x86_64::*;
    let full = pairs / 8 * 8;
    // SAFETY: reads below `2 * full` of `row`, writes below `full` of `even`, `odd`.
    unsafe {
        for i in (0..full).step_by(8) {
            let a = _mm256_loadu_ps(row.as_ptr().add(2 * i));
            let b = _mm256_loadu_ps(row.as_ptr().add(2 * i + 8));
            // Within each 128-bit half: a's and b's even (odd) lanes; then the 64-bit
            // quarters reordered to a0 a2 a4 a6 b0 b2 b4 b6.
            let e = _mm256_shuffle_ps::<0b10_00_10_00>(a, b);
            let o = _mm256_shuffle_ps::<0b11_01_11_01>(a, b);
            let e = _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(e)));
            let o = _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(o)));
            _mm256_storeu_ps(even.as_mut_ptr().add(i), e);
            _mm256_storeu_ps(odd.as_mut_ptr().add(i), o);
        }
    }
    if full < pairs && pairs >= 8 {
        // SAFETY: as above, for the eight pairs `pairs - 8..pairs`.
        unsafe {
            deinterleave_avx2(
                &row[2 * (pairs - 8)..],
                &mut even[pairs - 8..],
                &mut odd[pairs - 8..],
                8,
            )
        };
        return pairs;
    }
    full
}

/// Where [`max_pool_values`] puts a plane's padded rows and columns.
struct PhaseGeometry {
    g: Win3,
    /// Rows and columns of one phase plane.
    rows: usize,
    cols: usize,
    /// Padded columns any window reaches.
    need_cols: usize,
    /// Per output row, column and depth: its first tap inside the data, if any.
    first: [Vec<Option<usize>>; 3],
    /// Whether every output's first tap is tap 0 on every axis.
    first_is_zero: bool,
    /// For 2-D windows, where each tap's phase plane reads output (0, 0): the offsets
    /// of [`PoolElem::fold_2d`], in window order.
    taps_2d: Option<Vec<usize>>,
    /// Where each input row any window reaches starts in a depth slice of the phase
    /// planes (worked out once: two divisions per row cost as much as its copy).
    row_at: Vec<usize>,
    /// For 2-D windows not all starting at tap 0: each output's first tap inside the
    /// data, as runs of consecutive outputs that read consecutive values of the phase
    /// planes (see [`FirstRun`]).
    first_runs_2d: Vec<FirstRun>,
}

/// Outputs `out .. out + len` of a plane start from the phase planes' values `src ..`
/// (their first taps inside the data), or from the lowest value where `src` is `None`
/// (windows wholly in the padding). Copied run by run, not output by output: per
/// output, this start was most of ResNet-50's 3x3 stride-2 max pool on a Zen 3.
#[derive(Clone, Copy, Debug, PartialEq)]
struct FirstRun {
    out: usize,
    len: usize,
    src: Option<usize>,
}

/// The runs of [`FirstRun`] for 2-D windows: output `(oh, ow)` starts from data
/// `(first[1][oh], first[2][ow])`, which lies in the phase planes at padded row `r`,
/// column `c` (data plus padding): plane `(r % sh, c % sw)`, row `r / sh`, column
/// `c / sw`.
fn first_runs_2d(
    g: &Win3,
    first: &[Vec<Option<usize>>; 3],
    rows: usize,
    cols: usize,
) -> Vec<FirstRun> {
    let [_, sh, sw] = g.stride;
    let (ph, pw) = (g.pad[1] as usize, g.pad[2] as usize);
    let mut runs: Vec<FirstRun> = Vec::new();
    for (oh, h) in first[1].iter().enumerate() {
        let row_start = runs.len();
        for (ow, w) in first[2].iter().enumerate() {
            let src = match (h, w) {
                (Some(h), Some(w)) => {
                    let (r, c) = (h + ph, w + pw);
                    Some(((r % sh) * sw + c % sw) * rows * cols + (r / sh) * cols + c / sw)
                }
                _ => None,
            };
            let out = oh * g.out[2] + ow;
            match runs[row_start..].last_mut() {
                Some(run)
                    if run.src.map(|s| s + run.len) == src || (run.src, src) == (None, None) =>
                {
                    run.len += 1
                }
                _ => runs.push(FirstRun { out, len: 1, src }),
            }
        }
    }
    runs
}

impl PhaseGeometry {
    fn new(g: &Win3) -> PhaseGeometry {
        let first: [Vec<Option<usize>>; 3] = std::array::from_fn(|a| {
            (0..g.out[a])
                .map(|o| {
                    (0..g.kernel[a])
                        .map(|k| (o * g.stride[a] + k * g.dil[a]) as isize - g.pad[a])
                        .find(|&p| p >= 0 && (p as usize) < g.input[a])
                        .map(|p| p as usize)
                })
                .collect()
        });
        let first_is_zero = (0..3).all(|a| {
            first[a]
                .iter()
                .enumerate()
                .all(|(o, f)| *f == Some(o * g.stride[a]) && g.pad[a] == 0)
        });
        let (rows, cols) = (
            g.reach(1).div_ceil(g.stride[1]),
            g.reach(2).div_ceil(g.stride[2]),
        );
        let [_, sh, sw] = g.stride;
        let taps_2d = (g.input[0] == 1 && g.kernel[0] == 1).then(|| {
            (0..g.kernel[1])
                .flat_map(|kh| {
                    let r = kh * g.dil[1];
                    (0..g.kernel[2]).map(move |kw| {
                        let c = kw * g.dil[2];
                        ((r % sh) * sw + c % sw) * rows * cols + (r / sh) * cols + c / sw
                    })
                })
                .collect()
        });
        let row_at = (0..g.input[1])
            .map(|h| h + g.pad[1] as usize)
            .take_while(|&r| r < g.reach(1))
            .map(|r| (r % sh) * sw * rows * cols + (r / sh) * cols)
            .collect();
        let first_runs_2d = match (&taps_2d, first_is_zero) {
            (Some(_), false) => first_runs_2d(g, &first, rows, cols),
            _ => Vec::new(),
        };
        PhaseGeometry {
            g: *g,
            rows,
            cols,
            row_at,
            first_runs_2d,
            need_cols: g.reach(2),
            first,
            first_is_zero,
            taps_2d,
        }
    }

    fn phase_planes(&self) -> usize {
        self.g.stride[1] * self.g.stride[2]
    }

    /// Pools one plane `x` into `out`, with `split` and `wide` as scratch.
    #[inline(always)]
    fn plane<T: PoolElem>(
        &self,
        x: &[T],
        out: &mut [T],
        split: &mut Vec<T>,
        wide: &mut Vec<T>,
        lowest: T,
        skip: T,
    ) {
        let [od_n, oh_n, ow_n] = self.g.out;
        self.split(x, split, skip);
        if let Some(taps) = self.taps_2d.as_deref().filter(|_| T::has_fold_2d()) {
            if !self.first_is_zero {
                for run in &self.first_runs_2d {
                    let dst = &mut out[run.out..][..run.len];
                    match run.src {
                        Some(s) => dst.copy_from_slice(&split[s..][..run.len]),
                        None => dst.fill(lowest),
                    }
                }
            }
            T::fold_2d(split, taps, self.cols, out, ow_n, !self.first_is_zero);
            return;
        }
        // Outputs at the phase plane's row width; the last row only as long as needed.
        let run = (oh_n - 1) * self.cols + ow_n;
        let in_place = self.cols == ow_n;
        if !in_place {
            wide.clear();
            wide.resize(run, lowest);
        }
        for od in 0..od_n {
            if in_place {
                self.fold(x, split, od, &mut out[od * oh_n * ow_n..][..run], lowest);
            } else {
                self.fold(x, split, od, &mut wide[..run], lowest);
                let out = &mut out[od * oh_n * ow_n..][..oh_n * ow_n];
                for (o, w) in out.chunks_exact_mut(ow_n).zip(wide.chunks(self.cols)) {
                    o.copy_from_slice(&w[..ow_n]);
                }
            }
        }
    }

    /// Copies plane `x` into its phase planes `split`, whose padding holds `skip`.
    ///
    /// Every plane of a call writes the same places of `split` (its scratch lives for
    /// one call, so one geometry), so the padding holds `skip` from the first fill on:
    /// filling it per plane was the costliest loop of the 46x46 pool in a perf profile.
    #[inline(always)]
    fn split<T: PoolElem>(&self, x: &[T], split: &mut Vec<T>, skip: T) {
        let g = &self.g;
        let [id_n, ih_n, iw_n] = g.input;
        let sw = g.stride[2];
        let phase_vol = self.rows * self.cols;
        let slice_vol = self.phase_planes() * phase_vol;
        if split.len() != id_n * slice_vol {
            split.clear();
            split.resize(id_n * slice_vol, skip);
        }
        let pad_w = g.pad[2] as usize;
        let used_cols = iw_n.min(self.need_cols.saturating_sub(pad_w));
        for (d, dst) in split.chunks_exact_mut(slice_vol).enumerate() {
            for (h, &at) in self.row_at.iter().enumerate() {
                let row = &x[(d * ih_n + h) * iw_n..][..used_cols];
                scatter_row(row, &mut dst[at..], pad_w, sw, phase_vol);
            }
        }
    }

    /// The outputs of depth `od` at the phase planes' row width, from the plane `x` and
    /// its phase-split copy.
    #[inline(always)]
    fn fold<T: PoolElem>(&self, x: &[T], split: &[T], od: usize, dst: &mut [T], lowest: T) {
        let g = &self.g;
        let [_, ih_n, iw_n] = g.input;
        let [_, oh_n, ow_n] = g.out;
        let [_, sh, sw] = g.stride;
        let phase_vol = self.rows * self.cols;
        let slice_vol = self.phase_planes() * phase_vol;
        let run = dst.len();
        let Some(fd) = self.first[0][od] else {
            // A window wholly in depth padding: nothing to take the maximum of.
            dst.fill(lowest);
            return;
        };
        if self.first_is_zero {
            dst.copy_from_slice(&split[fd * slice_vol..][..run]);
        } else {
            for oh in 0..oh_n {
                for ow in 0..ow_n {
                    dst[oh * self.cols + ow] = match (self.first[1][oh], self.first[2][ow]) {
                        (Some(h), Some(w)) => x[(fd * ih_n + h) * iw_n + w],
                        _ => lowest,
                    };
                }
            }
        }
        for kd in 0..g.kernel[0] {
            let Some(d) = (od * g.stride[0] + kd * g.dil[0])
                .checked_sub(g.pad[0] as usize)
                .filter(|&d| d < g.input[0])
            else {
                continue;
            };
            let slice = &split[d * slice_vol..][..slice_vol];
            for kh in 0..g.kernel[1] {
                let r = kh * g.dil[1];
                for kw in 0..g.kernel[2] {
                    let c = kw * g.dil[2];
                    let at = ((r % sh) * sw + c % sw) * phase_vol + (r / sh) * self.cols + c / sw;
                    T::max_into(dst, &slice[at..][..run]);
                }
            }
        }
    }
}

/// Writes `row` (columns from padded column `pad`) into `sw` phase rows `phase_vol`
/// apart in `dst`: padded column `c` goes to phase `c % sw`, slot `c / sw`.
#[inline(always)]
fn scatter_row<T: PoolElem>(row: &[T], dst: &mut [T], pad: usize, sw: usize, phase_vol: usize) {
    match sw {
        1 => dst[pad..][..row.len()].copy_from_slice(row),
        2 => {
            // Even input columns land in phase `pad % 2`, odd ones in the other.
            let (lo, hi) = dst.split_at_mut(phase_vol);
            let (even, odd) = if pad.is_multiple_of(2) {
                (lo, hi)
            } else {
                (hi, lo)
            };
            let even = &mut even[pad / 2..];
            let odd = &mut odd[pad.div_ceil(2)..];
            T::deinterleave(row, even, odd);
            if row.len() % 2 == 1 {
                even[row.len() / 2] = row[row.len() - 1];
            }
        }
        _ => {
            for (i, &v) in row.iter().enumerate() {
                let c = i + pad;
                dst[c % sw * phase_vol + c / sw] = v;
            }
        }
    }
}

impl Kernel for PoolKernel {
    fn run(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        let x = input(inputs, 0)?;
        let xs = x.shape();
        let (g, pe, shape) = self.geometry(xs)?;
        if !self.max {
            let out = match x {
                Tensor::F32(a) => Tensor::F32(array(
                    &shape,
                    avg_pool(&contiguous(a), xs, &g, &pe, self.count_include_pad),
                )?),
                Tensor::F64(a) => Tensor::F64(array(
                    &shape,
                    avg_pool(&contiguous(a), xs, &g, &pe, self.count_include_pad),
                )?),
                Tensor::F16(a) => {
                    let v: Vec<f32> = a.iter().map(|v| v.to_f32()).collect();
                    let y = avg_pool(&v, xs, &g, &pe, self.count_include_pad);
                    Tensor::F16(array(&shape, y.into_iter().map(f16::from_f32).collect())?)
                }
                other => {
                    return Err(OpError::unsupported(format!(
                        "AveragePool on {}",
                        other.dtype()
                    )));
                }
            };
            return Ok(vec![out]);
        }
        macro_rules! mp {
            ($variant:ident, $a:expr, $low:expr, $skip:expr) => {{
                if self.want_indices {
                    let (y, i) = max_pool(&contiguous($a), xs, &g, &pe, $low, self.column_major);
                    (Tensor::$variant(array(&shape, y)?), i)
                } else {
                    let y = max_pool_values(&contiguous($a), xs, &g, $low, $skip);
                    (Tensor::$variant(array(&shape, y)?), Vec::new())
                }
            }};
        }
        let (y, idx) = match x {
            Tensor::F32(a) => mp!(F32, a, f32::NEG_INFINITY, f32::NAN),
            Tensor::F64(a) => mp!(F64, a, f64::NEG_INFINITY, f64::NAN),
            Tensor::F16(a) => mp!(F16, a, f16::NEG_INFINITY, f16::NAN),
            Tensor::I8(a) => mp!(I8, a, i8::MIN, i8::MIN),
            Tensor::U8(a) => mp!(U8, a, u8::MIN, u8::MIN),
            other => {
                return Err(OpError::unsupported(format!(
                    "MaxPool on {}",
                    other.dtype()
                )));
            }
        };
        if self.want_indices {
            Ok(vec![y, Tensor::I64(array(&shape, idx)?)])
        } else {
            Ok(vec![y])
        }
    }
}

/// The mean of each plane of `vol` values in `planes` into `out`, summed in f64 over
/// 32 running sums in four groups of eight: one group of eight sums alone was a chain
/// of dependent adds, each waiting for the last (`kernel_table gap_` on a Zen 4, ms:
/// 32 planes of 112x112 0.046 -> 0.029, 144 of 56x56 0.048 -> 0.033; 672 of 14x14
/// and 1152 of 7x7 as before, 0.012 and 0.009). Values past the last 32 go to the
/// first group eight at a time, then one at a time to the total. The order is fixed,
/// so results do not depend on threads, and each lane adds the same values in the
/// same order with AVX-512, AVX or neither, so the same bits on any CPU. The CPU is
/// asked once per call: per plane, the question cost more than a 7x7 plane's sum.
fn plane_means(planes: &[f32], vol: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F.
            return unsafe { plane_means_avx512(planes, vol, out) };
        }
        if std::arch::is_x86_feature_detected!("avx") {
            // SAFETY: the CPU has AVX.
            return unsafe { plane_means_avx(planes, vol, out) };
        }
    }
    plane_means_portable(planes, vol, out);
}

/// [`plane_means`] without vector instructions.
fn plane_means_portable(planes: &[f32], vol: usize, out: &mut [f32]) {
    for (mean, p) in out.iter_mut().zip(planes.chunks_exact(vol)) {
        let mut groups = [[0.0f64; 8]; 4];
        let mut chunks = p.chunks_exact(32);
        for c in &mut chunks {
            for (g, group) in groups.iter_mut().enumerate() {
                for (l, sum) in group.iter_mut().enumerate() {
                    *sum += c[8 * g + l] as f64;
                }
            }
        }
        let mut eights = chunks.remainder().chunks_exact(8);
        for c in &mut eights {
            for (sum, &v) in groups[0].iter_mut().zip(c) {
                *sum += v as f64;
            }
        }
        let [a, b, c, d] = groups;
        let lanes = std::array::from_fn(|l| (a[l] + b[l]) + (c[l] + d[l]));
        *mean = mean_of(lanes, eights.remainder(), vol);
    }
}

/// [`plane_means`]' end of a plane: its eight joined lanes in order, then the values
/// past the last eight one by one, over the plane's size.
#[inline]
fn mean_of(lanes: [f64; 8], rest: &[f32], vol: usize) -> f32 {
    let mut total = lanes.iter().sum::<f64>();
    for &v in rest {
        total += v as f64;
    }
    (total / vol as f64) as f32
}

/// [`plane_means`] with each group of sums in one vector.
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn plane_means_avx512(planes: &[f32], vol: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    for (mean, p) in out.iter_mut().zip(planes.chunks_exact(vol)) {
        let mut acc = [_mm512_setzero_pd(); 4];
        let mut chunks = p.chunks_exact(32);
        for c in &mut chunks {
            for (g, sum) in acc.iter_mut().enumerate() {
                // SAFETY: eight values of the chunk of 32.
                let v = unsafe { _mm256_loadu_ps(c.as_ptr().add(8 * g)) };
                *sum = _mm512_add_pd(*sum, _mm512_cvtps_pd(v));
            }
        }
        let mut eights = chunks.remainder().chunks_exact(8);
        for c in &mut eights {
            // SAFETY: eight values.
            let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
            acc[0] = _mm512_add_pd(acc[0], _mm512_cvtps_pd(v));
        }
        let joined = _mm512_add_pd(_mm512_add_pd(acc[0], acc[1]), _mm512_add_pd(acc[2], acc[3]));
        let mut lanes = [0.0f64; 8];
        // SAFETY: eight f64 into an array of eight.
        unsafe { _mm512_storeu_pd(lanes.as_mut_ptr(), joined) };
        *mean = mean_of(lanes, eights.remainder(), vol);
    }
}

/// [`plane_means`] with each group of sums in two vectors of four.
///
/// # Safety
/// The CPU has AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn plane_means_avx(planes: &[f32], vol: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    for (mean, p) in out.iter_mut().zip(planes.chunks_exact(vol)) {
        let mut acc = [_mm256_setzero_pd(); 8];
        let mut chunks = p.chunks_exact(32);
        for c in &mut chunks {
            for (h, sum) in acc.iter_mut().enumerate() {
                // SAFETY: four values of the chunk of 32.
                let v = unsafe { _mm_loadu_ps(c.as_ptr().add(4 * h)) };
                *sum = _mm256_add_pd(*sum, _mm256_cvtps_pd(v));
            }
        }
        let mut eights = chunks.remainder().chunks_exact(8);
        for c in &mut eights {
            for (h, sum) in acc[..2].iter_mut().enumerate() {
                // SAFETY: four of the eight values.
                let v = unsafe { _mm_loadu_ps(c.as_ptr().add(4 * h)) };
                *sum = _mm256_add_pd(*sum, _mm256_cvtps_pd(v));
            }
        }
        // Group `g` is `acc[2g]` (its lanes 0-3) and `acc[2g + 1]` (lanes 4-7).
        let mut lanes = [0.0f64; 8];
        for half in 0..2 {
            let ab = _mm256_add_pd(acc[half], acc[2 + half]);
            let cd = _mm256_add_pd(acc[4 + half], acc[6 + half]);
            // SAFETY: four f64 into half of the eight lanes.
            unsafe { _mm256_storeu_pd(lanes.as_mut_ptr().add(4 * half), _mm256_add_pd(ab, cd)) };
        }
        *mean = mean_of(lanes, eights.remainder(), vol);
    }
}

fn global(x: &Tensor, max: bool) -> Result<Vec<Tensor>, OpError> {
    let xs = x.shape();
    if xs.len() < 2 {
        return Err(OpError::invalid(format!("global pooling of shape {xs:?}")));
    }
    let mut shape = xs[..2].to_vec();
    shape.extend(std::iter::repeat_n(1, xs.len() - 2));
    let vol: usize = xs[2..].iter().product();
    // Sums in f64: a plane can hold hundreds of thousands of values.
    let reduce = |p: &[f64]| -> f64 {
        if max {
            p.iter().copied().fold(
                f64::NEG_INFINITY,
                |m, v| if v > m || v.is_nan() { v } else { m },
            )
        } else if p.is_empty() {
            f64::NAN
        } else {
            p.iter().sum::<f64>() / p.len() as f64
        }
    };
    let out = match x {
        Tensor::F32(a) => {
            let d = contiguous(a);
            let y: Vec<f32> = match d.len().checked_div(vol) {
                None => vec![f32::NAN; shape.iter().product()],
                Some(planes) => {
                    let mut y = vec![0.0f32; planes];
                    // Planes per task: about 16 Ki values.
                    let per = (1 << 14) / vol + 1;
                    let task = |(y, planes): (&mut [f32], &[f32])| {
                        if max {
                            for (m, p) in y.iter_mut().zip(planes.chunks_exact(vol)) {
                                *m = p.iter().copied().fold(f32::NEG_INFINITY, |m, v| {
                                    if v > m || v.is_nan() { v } else { m }
                                });
                            }
                        } else {
                            plane_means(planes, vol, y);
                        }
                    };
                    if d.len() < (1 << 15) || !crate::par::enabled() {
                        task((&mut y, &d));
                    } else {
                        y.par_chunks_mut(per)
                            .zip(d.par_chunks(per * vol))
                            .for_each(task);
                    }
                    y
                }
            };
            Tensor::F32(array(&shape, y)?)
        }
        Tensor::F64(a) => {
            let d = contiguous(a);
            let y: Vec<f64> = if vol == 0 {
                vec![f64::NAN; shape.iter().product()]
            } else {
                d.chunks(vol).map(reduce).collect()
            };
            Tensor::F64(array(&shape, y)?)
        }
        Tensor::F16(a) => {
            let d: Vec<f64> = a.iter().map(|v| v.to_f64()).collect();
            let y: Vec<f16> = if vol == 0 {
                vec![f16::NAN; shape.iter().product()]
            } else {
                d.chunks(vol).map(|p| f16::from_f64(reduce(p))).collect()
            };
            Tensor::F16(array(&shape, y)?)
        }
        other => {
            return Err(OpError::unsupported(format!(
                "global pooling on {}",
                other.dtype()
            )));
        }
    };
    Ok(vec![out])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values near 1 with some of ±1e17 among them, fixed by `seed`: the large ones
    /// cancel, so what is left of the small ones depends on the order of the f64
    /// sums, and a different order shows in the f32 mean.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut sign = 1.0;
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                if (state >> 20) % 4 == 0 {
                    sign = -sign;
                    return sign * 1e17;
                }
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 7.0
            })
            .collect()
    }

    /// Every instruction set sums each plane in the same order (the same bits), and
    /// the means are those of the exact sums, within f32 rounding.
    #[test]
    fn plane_means_agree_across_instruction_sets_and_with_exact_sums() {
        let sizes = (1..=100).chain([196, 784, 3136, 12544 + 7]);
        for (seed, vol) in sizes.enumerate() {
            let planes = 3;
            let x = values(planes * vol, seed as u64);
            let mut portable = vec![0.0f32; planes];
            plane_means_portable(&x, vol, &mut portable);
            for (p, &mean) in x.chunks_exact(vol).zip(&portable) {
                let exact = p.iter().map(|&v| v as f64).sum::<f64>() / vol as f64;
                let scale = p.iter().map(|&v| v.abs() as f64).sum::<f64>() / vol as f64;
                assert!(
                    (mean as f64 - exact).abs() <= 1e-6 * scale + 1e-30,
                    "vol {vol}: {mean} against {exact}"
                );
            }
            let mut dispatched = vec![0.0f32; planes];
            plane_means(&x, vol, &mut dispatched);
            assert_eq!(bits(&dispatched), bits(&portable), "vol {vol}");
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx512f") {
                    let mut v = vec![0.0f32; planes];
                    // SAFETY: the CPU has AVX-512F.
                    unsafe { plane_means_avx512(&x, vol, &mut v) };
                    assert_eq!(bits(&v), bits(&portable), "AVX-512, vol {vol}");
                }
                if std::arch::is_x86_feature_detected!("avx") {
                    let mut v = vec![0.0f32; planes];
                    // SAFETY: the CPU has AVX.
                    unsafe { plane_means_avx(&x, vol, &mut v) };
                    assert_eq!(bits(&v), bits(&portable), "AVX, vol {vol}");
                }
            }
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }
}
