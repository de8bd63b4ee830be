//! Resize (opsets 10 to 19+) and Upsample (7, 9).
//!
//! Resizing is separable, so it runs one axis at a time: each output coordinate along
//! the axis gets a list of (source index, weight) taps computed once, following the
//! ONNX reference implementation (coordinates in f64, edge clamping, `exclude_outside`,
//! antialiasing filters for downsampling, tf_crop_and_resize extrapolation). Axes are
//! processed from last to first, which is the order the reference nests them in.

use hmct_tensor::{Tensor, f16};
use rayon::prelude::*;

use super::arrays::{array, contiguous};
use super::{Kernel, NodeSpec, OpError, input, normalize_axis};

pub(crate) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>> {
    match spec.op_type {
        "Resize" | "Upsample" => {
            Some(ResizeKernel::new(spec).map(|k| Box::new(k) as Box<dyn Kernel>))
        }
        _ => None,
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Coord {
    HalfPixel,
    HalfPixelSymmetric,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
    TfCropAndResize,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Nearest {
    RoundPreferFloor,
    RoundPreferCeil,
    Floor,
    Ceil,
    /// Opset < 11 (and Upsample): floor when upsampling, ceil when downsampling.
    Legacy,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum AspectPolicy {
    Stretch,
    NotLarger,
    NotSmaller,
}

struct ResizeKernel {
    mode: Mode,
    coord: Coord,
    nearest: Nearest,
    cubic_a: f64,
    exclude_outside: bool,
    extrapolation: f64,
    antialias: bool,
    axes: Option<Vec<i64>>,
    policy: AspectPolicy,
    /// Where the scales come from: an attribute (Upsample 7), input 1 (Resize 10,
    /// Upsample 9) or input 2 (Resize 11+, with roi at 1 and sizes at 3).
    attr_scales: Option<Vec<f32>>,
    legacy_inputs: bool,
}

impl ResizeKernel {
    fn new(spec: &NodeSpec) -> Result<Self, OpError> {
        let a = &spec.attrs;
        let upsample = spec.op_type == "Upsample";
        let legacy = upsample || spec.opset < 11;
        let mode = match a.string_or("mode", "nearest")?.as_str() {
            "nearest" => Mode::Nearest,
            "linear" | "bilinear" => Mode::Linear,
            "cubic" if !legacy => Mode::Cubic,
            other => {
                return Err(OpError::unsupported(format!(
                    "{} mode '{other}'",
                    spec.op_type
                )));
            }
        };
        let (coord, nearest) = if legacy {
            (Coord::Asymmetric, Nearest::Legacy)
        } else {
            let coord = match a
                .string_or("coordinate_transformation_mode", "half_pixel")?
                .as_str()
            {
                "half_pixel" => Coord::HalfPixel,
                "half_pixel_symmetric" => Coord::HalfPixelSymmetric,
                "pytorch_half_pixel" => Coord::PytorchHalfPixel,
                "align_corners" => Coord::AlignCorners,
                "asymmetric" => Coord::Asymmetric,
                "tf_crop_and_resize" => Coord::TfCropAndResize,
                "tf_half_pixel_for_nn" => {
                    return Err(OpError::unsupported(
                        "coordinate_transformation_mode tf_half_pixel_for_nn",
                    ));
                }
                other => {
                    return Err(OpError::invalid(format!(
                        "coordinate_transformation_mode '{other}'"
                    )));
                }
            };
            let nearest = match a.string_or("nearest_mode", "round_prefer_floor")?.as_str() {
                "round_prefer_floor" => Nearest::RoundPreferFloor,
                "round_prefer_ceil" => Nearest::RoundPreferCeil,
                "floor" => Nearest::Floor,
                "ceil" => Nearest::Ceil,
                other => return Err(OpError::invalid(format!("nearest_mode '{other}'"))),
            };
            (coord, nearest)
        };
        let policy = match a.string_or("keep_aspect_ratio_policy", "stretch")?.as_str() {
            "stretch" => AspectPolicy::Stretch,
            "not_larger" => AspectPolicy::NotLarger,
            "not_smaller" => AspectPolicy::NotSmaller,
            other => {
                return Err(OpError::invalid(format!(
                    "keep_aspect_ratio_policy '{other}'"
                )));
            }
        };
        let attr_scales = if upsample && spec.opset < 9 {
            Some(
                a.floats("scales")?
                    .ok_or_else(|| OpError::invalid("Upsample without scales"))?,
            )
        } else {
            None
        };
        Ok(ResizeKernel {
            mode,
            coord,
            nearest,
            cubic_a: a.float_or("cubic_coeff_a", -0.75)? as f64,
            exclude_outside: a.int_or("exclude_outside", 0)? != 0,
            extrapolation: a.float_or("extrapolation_value", 0.0)? as f64,
            antialias: a.int_or("antialias", 0)? != 0,
            axes: a.ints("axes")?,
            policy,
            attr_scales,
            legacy_inputs: legacy,
        })
    }

    /// Output shape, per-axis scales and per-axis roi `(start, end)`.
    #[allow(clippy::type_complexity)]
    fn plan(
        &self,
        inputs: &[Option<&Tensor>],
        xs: &[usize],
    ) -> Result<(Vec<usize>, Vec<f64>, Vec<(f64, f64)>), OpError> {
        let r = xs.len();
        let nonempty = |i: usize| inputs.get(i).copied().flatten().filter(|t| !t.is_empty());
        let floats = |t: &Tensor| -> Result<Vec<f64>, OpError> {
            t.to_f64_vec()
                .ok_or_else(|| OpError::invalid(format!("resize parameter of type {}", t.dtype())))
        };
        let axes: Vec<usize> = match &self.axes {
            None => (0..r).collect(),
            Some(a) => a
                .iter()
                .map(|&x| normalize_axis(x, r))
                .collect::<Result<_, _>>()?,
        };
        let (scales_in, sizes_in, roi_in) = if let Some(s) = &self.attr_scales {
            (
                Some(s.iter().map(|&v| v as f64).collect::<Vec<_>>()),
                None,
                None,
            )
        } else if self.legacy_inputs {
            (nonempty(1).map(floats).transpose()?, None, None)
        } else {
            (
                nonempty(2).map(floats).transpose()?,
                nonempty(3)
                    .map(|t| {
                        t.to_i64_vec()
                            .ok_or_else(|| OpError::invalid("sizes must be int64"))
                    })
                    .transpose()?,
                nonempty(1).map(floats).transpose()?,
            )
        };
        let mut roi = vec![(0.0, 1.0); r];
        if let Some(v) = roi_in
            && self.coord == Coord::TfCropAndResize
        {
            let n = axes.len();
            if v.len() != 2 * n {
                return Err(OpError::invalid(format!(
                    "roi of {} values for {n} axes",
                    v.len()
                )));
            }
            for (k, &ax) in axes.iter().enumerate() {
                roi[ax] = (v[k], v[k + n]);
            }
        }
        let mut scales = vec![1.0f64; r];
        let mut out = xs.to_vec();
        match (scales_in, sizes_in) {
            (Some(s), None) => {
                if s.len() != axes.len() {
                    return Err(OpError::invalid(format!(
                        "{} scales for {} axes",
                        s.len(),
                        axes.len()
                    )));
                }
                for (k, &ax) in axes.iter().enumerate() {
                    if s[k] <= 0.0 {
                        return Err(OpError::invalid(format!("scale {}", s[k])));
                    }
                    scales[ax] = s[k];
                    out[ax] = (xs[ax] as f64 * s[k]).floor() as usize;
                }
            }
            (None, Some(z)) => {
                if z.len() != axes.len() {
                    return Err(OpError::invalid(format!(
                        "{} sizes for {} axes",
                        z.len(),
                        axes.len()
                    )));
                }
                if z.iter().any(|&v| v < 0) {
                    return Err(OpError::invalid(format!("sizes {z:?}")));
                }
                let ratio = |k: usize, ax: usize| z[k] as f64 / xs[ax] as f64;
                let common = match self.policy {
                    AspectPolicy::Stretch => None,
                    AspectPolicy::NotLarger => axes
                        .iter()
                        .enumerate()
                        .map(|(k, &ax)| ratio(k, ax))
                        .reduce(f64::min),
                    AspectPolicy::NotSmaller => axes
                        .iter()
                        .enumerate()
                        .map(|(k, &ax)| ratio(k, ax))
                        .reduce(f64::max),
                };
                for (k, &ax) in axes.iter().enumerate() {
                    match common {
                        None => {
                            scales[ax] = ratio(k, ax);
                            out[ax] = z[k] as usize;
                        }
                        Some(c) => {
                            scales[ax] = c;
                            out[ax] = (c * xs[ax] as f64 + 0.5) as usize;
                        }
                    }
                }
            }
            (Some(_), Some(_)) => {
                return Err(OpError::invalid("Resize given both scales and sizes"));
            }
            (None, None) => return Err(OpError::invalid("Resize needs scales or sizes")),
        }
        Ok((out, scales, roi))
    }

    /// Source taps of every output coordinate along one axis.
    fn axis_taps(&self, in_w: usize, out_w: usize, scale: f64, roi: (f64, f64)) -> Vec<Taps> {
        let out_f = scale * in_w as f64;
        let inw = in_w as f64;
        (0..out_w)
            .map(|y| {
                let yf = y as f64;
                let x = match self.coord {
                    Coord::AlignCorners => {
                        if out_f == 1.0 {
                            0.0
                        } else {
                            yf * (inw - 1.0) / (out_f - 1.0)
                        }
                    }
                    Coord::Asymmetric => yf / scale,
                    Coord::TfCropAndResize => {
                        let x = if out_f == 1.0 {
                            (roi.1 - roi.0) * (inw - 1.0) / 2.0
                        } else {
                            yf * (roi.1 - roi.0) * (inw - 1.0) / (out_f - 1.0)
                        };
                        x + roi.0 * (inw - 1.0)
                    }
                    Coord::PytorchHalfPixel => {
                        if out_f == 1.0 {
                            -0.5
                        } else {
                            (yf + 0.5) / scale - 0.5
                        }
                    }
                    Coord::HalfPixel => (yf + 0.5) / scale - 0.5,
                    Coord::HalfPixelSymmetric => {
                        let adjustment = out_w as f64 / out_f;
                        let offset = inw / 2.0 * (1.0 - adjustment);
                        offset + (yf + 0.5) / scale - 0.5
                    }
                };
                if self.coord == Coord::TfCropAndResize && (x < 0.0 || x > inw - 1.0) {
                    return Taps::Extrapolate;
                }
                self.taps_at(x, in_w, scale)
            })
            .collect()
    }

    fn taps_at(&self, x: f64, in_w: usize, scale: f64) -> Taps {
        let clamp = |i: i64| i.clamp(0, in_w as i64 - 1) as usize;
        let integer = x == x.floor();
        if self.mode == Mode::Nearest {
            let fl = x.floor();
            let ratio = x - fl;
            let i = if integer {
                x as i64
            } else {
                let up = match self.nearest {
                    Nearest::RoundPreferFloor => ratio > 0.5,
                    Nearest::RoundPreferCeil => ratio >= 0.5,
                    Nearest::Floor => false,
                    Nearest::Ceil => true,
                    Nearest::Legacy => scale < 1.0,
                };
                fl as i64 + up as i64
            };
            return Taps::One(clamp(i));
        }
        // `base` is the pixel left of x (x - 1 when x is an integer), ratio in (0, 1].
        let base = if integer {
            x as i64 - 1
        } else {
            x.floor() as i64
        };
        let ratio = x - base as f64;
        let a = self.cubic_a;
        let aa = self.antialias && scale < 1.0;
        let s = if aa { scale } else { 1.0 };
        let (start, end) = match (self.mode, aa) {
            (Mode::Linear, false) => (0, 2),
            (Mode::Cubic, false) => (-1, 3),
            (Mode::Linear, true) => {
                let st = (-1.0 / s).floor() as i64 + 1;
                (st, 2 - st)
            }
            _ => {
                let st = (-2.0 / s).floor() as i64 + 1;
                (st, 2 - st)
            }
        };
        let cubic = |d: f64| {
            let d = d.abs();
            if d <= 1.0 {
                (a + 2.0) * d * d * d - (a + 3.0) * d * d + 1.0
            } else if d < 2.0 {
                a * d * d * d - 5.0 * a * d * d + 8.0 * a * d - 4.0 * a
            } else {
                0.0
            }
        };
        let mut taps: Vec<(i64, f64)> = (start..end)
            .map(|i| {
                let d = (i as f64 - ratio) * s;
                let w = match self.mode {
                    Mode::Linear => (1.0 - d.abs()).clamp(0.0, 1.0),
                    _ => cubic(d),
                };
                (base + i, w)
            })
            .collect();
        if aa {
            let sum: f64 = taps.iter().map(|t| t.1).sum();
            taps.iter_mut().for_each(|t| t.1 /= sum);
        }
        if self.exclude_outside {
            for t in taps.iter_mut() {
                if t.0 < 0 || t.0 >= in_w as i64 {
                    t.1 = 0.0;
                }
            }
            let sum: f64 = taps.iter().map(|t| t.1).sum();
            if sum != 0.0 {
                taps.iter_mut().for_each(|t| t.1 /= sum);
            }
        }
        Taps::Many(taps.into_iter().map(|(i, w)| (clamp(i), w)).collect())
    }
}

#[derive(Clone, Debug)]
enum Taps {
    One(usize),
    Many(Vec<(usize, f64)>),
    Extrapolate,
}

/// Element types Resize interpolates in.
trait Sample: Copy + Default + Send + Sync + 'static {
    fn weighted(taps: &[(usize, f64)], get: impl Fn(usize) -> Self) -> Self;
    fn from_f64(v: f64) -> Self;

    /// `row[k] = weighted(taps, |i| src[i * inner + k])` for every `k`.
    fn weighted_row(taps: &[(usize, f64)], src: &[Self], inner: usize, row: &mut [Self]) {
        for (k, v) in row.iter_mut().enumerate() {
            *v = Self::weighted(taps, |i| src[i * inner + k]);
        }
    }
}

/// [`Sample::weighted_row`] for floats: tap by tap over the whole row (a loop that
/// vectorizes), each element summed from zero in tap order as `weighted` sums it,
/// so the same bits. DeepLabV3's final 65 -> 520 resize went element by element.
macro_rules! float_rows {
    ($t:ty) => {
        fn weighted_row(taps: &[(usize, f64)], src: &[$t], inner: usize, row: &mut [$t]) {
            row.fill(0.0);
            let n = row.len();
            for &(i, w) in taps {
                let w = w as $t;
                for (v, &x) in row.iter_mut().zip(&src[i * inner..][..n]) {
                    *v = *v + w * x;
                }
            }
        }
    };
}

impl Sample for f32 {
    fn weighted(taps: &[(usize, f64)], get: impl Fn(usize) -> Self) -> Self {
        taps.iter().fold(0.0f32, |s, &(i, w)| s + w as f32 * get(i))
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    float_rows!(f32);
}

impl Sample for f64 {
    fn weighted(taps: &[(usize, f64)], get: impl Fn(usize) -> Self) -> Self {
        taps.iter().fold(0.0, |s, &(i, w)| s + w * get(i))
    }
    fn from_f64(v: f64) -> Self {
        v
    }
    float_rows!(f64);
}

/// Integers only take the nearest path; interpolation rounds (saturating casts).
macro_rules! int_sample {
    ($($t:ty),*) => {$(
        impl Sample for $t {
            fn weighted(taps: &[(usize, f64)], get: impl Fn(usize) -> Self) -> Self {
                let v: f64 = taps.iter().map(|&(i, w)| w * get(i) as f64).sum();
                v.round() as $t
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
        }
    )*};
}
int_sample!(u8, i8, i32, i64);

/// The source index of every output of an axis whose taps are all single sources
/// (nearest), or `None`.
fn nearest_sources(taps: &[Taps]) -> Option<Vec<usize>> {
    taps.iter()
        .map(|t| match t {
            Taps::One(i) => Some(*i),
            _ => None,
        })
        .collect()
}

/// Resizes one axis: data viewed as `[outer, in_w, inner]` becomes `[outer, out_w, inner]`.
fn resize_axis<T: Sample>(
    x: &[T],
    outer: usize,
    in_w: usize,
    inner: usize,
    taps: &[Taps],
    extrapolation: f64,
) -> Vec<T> {
    let out_w = taps.len();
    // Every element is written below.
    let mut y: Vec<T> = crate::buffers::take(outer * out_w * inner);
    let ext = T::from_f64(extrapolation);
    // Nearest taps on the last axis as plain source indices: a gather without a match
    // per element.
    let nearest = if inner == 1 {
        nearest_sources(taps)
    } else {
        None
    };
    let block = |(o, yo): (usize, &mut [T])| {
        let xo = &x[o * in_w * inner..][..in_w * inner];
        if let Some(idx) = &nearest {
            for (v, &i) in yo.iter_mut().zip(idx) {
                *v = xo[i];
            }
            return;
        }
        if inner == 1 {
            // Resizing the last axis: one element per tap, no row copies.
            for (v, t) in yo.iter_mut().zip(taps) {
                *v = match t {
                    Taps::One(i) => xo[*i],
                    Taps::Extrapolate => ext,
                    Taps::Many(ts) => T::weighted(ts, |i| xo[i]),
                };
            }
            return;
        }
        for (j, t) in taps.iter().enumerate() {
            let row = &mut yo[j * inner..][..inner];
            match t {
                Taps::One(i) => row.copy_from_slice(&xo[i * inner..][..inner]),
                Taps::Extrapolate => row.fill(ext),
                Taps::Many(ts) => T::weighted_row(ts, xo, inner, row),
            }
        }
    };
    let chunk = (out_w * inner).max(1);
    if y.len() < (1 << 16) || !crate::par::enabled() {
        y.chunks_mut(chunk).enumerate().for_each(block);
    } else {
        y.par_chunks_mut(chunk).enumerate().for_each(block);
    }
    y
}

/// `planes` planes of `h × w` resized by nearest taps on both axes (`rows` and `cols`,
/// source indices per output row and column) in one pass: each output row is
/// gathered once from its source row, or copied from the output row before it when
/// both read the same source row. Axis by axis, a 2x upsample gathered a plane twice
/// the input's size and then copied every row of it: YOLOv8n's two upsamples took
/// 0.85 ms per run together, onnxruntime's 0.42; gathered through indices in one
/// pass 0.63-0.70, repeating each value without indices 0.50-0.52 (`run --profile`,
/// three alternating rounds).
fn nearest_planes<T: Sample>(
    x: &[T],
    planes: usize,
    h: usize,
    w: usize,
    rows: &[usize],
    cols: &[usize],
) -> Vec<T> {
    let (oh, ow) = (rows.len(), cols.len());
    // Each source column `f` times in order (an integer upsample): no indices.
    let repeat = (ow > 0
        && ow.is_multiple_of(w)
        && cols.iter().enumerate().all(|(j, &c)| c == j / (ow / w)))
    .then_some(ow / w);
    // Every element is written below.
    let mut y: Vec<T> = crate::buffers::take(planes * oh * ow);
    let plane = |(p, yp): (usize, &mut [T])| {
        let xp = &x[p * h * w..][..h * w];
        for (j, &i) in rows.iter().enumerate() {
            let (before, rest) = yp.split_at_mut(j * ow);
            let row = &mut rest[..ow];
            if j > 0 && rows[j - 1] == i {
                row.copy_from_slice(&before[(j - 1) * ow..]);
            } else {
                let src = &xp[i * w..][..w];
                match repeat {
                    // Written out for 2: the general arm's `fill` of two values per
                    // source took YOLOv8n's upsamples 0.70-0.83 ms against 0.46-0.55
                    // (`run --profile`, three alternating rounds).
                    Some(2) => {
                        for (pair, &v) in row.chunks_exact_mut(2).zip(src) {
                            pair[0] = v;
                            pair[1] = v;
                        }
                    }
                    Some(f) => {
                        for (run, &v) in row.chunks_exact_mut(f).zip(src) {
                            run.fill(v);
                        }
                    }
                    None => {
                        for (v, &c) in row.iter_mut().zip(cols) {
                            *v = src[c];
                        }
                    }
                }
            }
        }
    };
    let chunk = (oh * ow).max(1);
    if y.len() < (1 << 16) || !crate::par::enabled() {
        y.chunks_mut(chunk).enumerate().for_each(plane);
    } else {
        y.par_chunks_mut(chunk).enumerate().for_each(plane);
    }
    y
}

impl ResizeKernel {
    /// The source rows and columns of a resize whose last two axes change by nearest
    /// taps alone (an upsample of feature maps), for [`nearest_planes`].
    fn nearest_plane(
        &self,
        xs: &[usize],
        out: &[usize],
        scales: &[f64],
        roi: &[(f64, f64)],
    ) -> Option<(Vec<usize>, Vec<usize>)> {
        let n = xs.len();
        if n < 2 || self.mode != Mode::Nearest || self.coord == Coord::TfCropAndResize {
            return None;
        }
        if xs[n - 2] == 0
            || xs[n - 1] == 0
            || (n - 2..n).any(|a| out[a] == xs[a] && scales[a] == 1.0)
        {
            return None;
        }
        let sources = |a: usize| nearest_sources(&self.axis_taps(xs[a], out[a], scales[a], roi[a]));
        Some((sources(n - 2)?, sources(n - 1)?))
    }

    fn resize<T: Sample>(
        &self,
        x: &[T],
        xs: &[usize],
        out: &[usize],
        scales: &[f64],
        roi: &[(f64, f64)],
    ) -> Vec<T> {
        // The input is read in place by the first axis resized; each later axis reads
        // the previous one's result, whose buffer then goes back to the pool.
        let mut data: Option<Vec<T>> = None;
        let mut shape = xs.to_vec();
        let mut axes = xs.len();
        if let Some((rows, cols)) = self.nearest_plane(xs, out, scales, roi) {
            let (h, w) = (xs[axes - 2], xs[axes - 1]);
            let planes: usize = xs[..axes - 2].iter().product();
            data = Some(nearest_planes(x, planes, h, w, &rows, &cols));
            shape[axes - 2] = out[axes - 2];
            shape[axes - 1] = out[axes - 1];
            axes -= 2;
        }
        for ax in (0..axes).rev() {
            let unchanged =
                out[ax] == xs[ax] && scales[ax] == 1.0 && self.coord != Coord::TfCropAndResize;
            if unchanged {
                continue;
            }
            let taps = self.axis_taps(xs[ax], out[ax], scales[ax], roi[ax]);
            let outer: usize = shape[..ax].iter().product();
            let inner: usize = shape[ax + 1..].iter().product();
            shape[ax] = out[ax];
            let next = if xs[ax] == 0 {
                vec![T::from_f64(0.0); shape.iter().product()]
            } else {
                let src = data.as_deref().unwrap_or(x);
                resize_axis(src, outer, xs[ax], inner, &taps, self.extrapolation)
            };
            if let Some(old) = data.replace(next) {
                crate::buffers::give_vec(old);
            }
        }
        data.unwrap_or_else(|| x.to_vec())
    }
}

impl Kernel for ResizeKernel {
    fn run(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        let x = input(inputs, 0)?;
        let xs = x.shape().to_vec();
        let (out, scales, roi) = self.plan(inputs, &xs)?;
        let y = match x {
            Tensor::F32(a) => Tensor::F32(array(
                &out,
                self.resize(&contiguous(a), &xs, &out, &scales, &roi),
            )?),
            Tensor::F64(a) => Tensor::F64(array(
                &out,
                self.resize(&contiguous(a), &xs, &out, &scales, &roi),
            )?),
            Tensor::F16(a) => {
                let v: Vec<f32> = a.iter().map(|v| v.to_f32()).collect();
                let r = self.resize(&v, &xs, &out, &scales, &roi);
                Tensor::F16(array(&out, r.into_iter().map(f16::from_f32).collect())?)
            }
            Tensor::U8(a) => Tensor::U8(array(
                &out,
                self.resize(&contiguous(a), &xs, &out, &scales, &roi),
            )?),
            Tensor::I8(a) => Tensor::I8(array(
                &out,
                self.resize(&contiguous(a), &xs, &out, &scales, &roi),
            )?),
            Tensor::I32(a) => Tensor::I32(array(
                &out,
                self.resize(&contiguous(a), &xs, &out, &scales, &roi),
            )?),
            Tensor::I64(a) => Tensor::I64(array(
                &out,
                self.resize(&contiguous(a), &xs, &out, &scales, &roi),
            )?),
            other => return Err(OpError::unsupported(format!("Resize on {}", other.dtype()))),
        };
        Ok(vec![y])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(coord: Coord, nearest: Nearest) -> ResizeKernel {
        ResizeKernel {
            mode: Mode::Nearest,
            coord,
            nearest,
            cubic_a: -0.75,
            exclude_outside: false,
            extrapolation: 0.0,
            antialias: false,
            axes: None,
            policy: AspectPolicy::Stretch,
            attr_scales: None,
            legacy_inputs: false,
        }
    }

    /// Nearest resizes of the last two axes in one pass give the axis-by-axis result:
    /// integer upsamples (the repeat path), fractional scales and downsamples (the
    /// index path), under each rounding of coordinates.
    #[test]
    fn nearest_planes_match_axis_by_axis() {
        let xs = [2usize, 3, 5, 7];
        let x: Vec<f32> = (0..xs.iter().product::<usize>())
            .map(|i| i as f32 * 0.5 - 9.0)
            .collect();
        let modes = [
            (Coord::Asymmetric, Nearest::Legacy),
            (Coord::Asymmetric, Nearest::Floor),
            (Coord::HalfPixel, Nearest::RoundPreferFloor),
            (Coord::HalfPixel, Nearest::RoundPreferCeil),
            (Coord::AlignCorners, Nearest::Ceil),
            (Coord::PytorchHalfPixel, Nearest::RoundPreferFloor),
        ];
        let mut fused_runs = 0;
        for (coord, nearest) in modes {
            let k = kernel(coord, nearest);
            for (sh, sw) in [(2.0, 2.0), (3.0, 2.0), (1.5, 2.5), (0.6, 0.5), (2.0, 0.75)] {
                let out = [2, 3, (5.0 * sh) as usize, (7.0 * sw) as usize];
                let scales = [1.0, 1.0, sh, sw];
                let roi = [(0.0, 1.0); 4];
                let got = k.resize(&x, &xs, &out, &scales, &roi);
                fused_runs += k.nearest_plane(&xs, &out, &scales, &roi).is_some() as usize;
                let taps_w = k.axis_taps(7, out[3], sw, roi[3]);
                let by_w = resize_axis(&x, 2 * 3 * 5, 7, 1, &taps_w, 0.0);
                let taps_h = k.axis_taps(5, out[2], sh, roi[2]);
                let want = resize_axis(&by_w, 2 * 3, 5, out[3], &taps_h, 0.0);
                assert_eq!(got, want, "{coord:?} {nearest:?} scales {sh} x {sw}");
            }
        }
        assert_eq!(fused_runs, 30, "every case above takes the one-pass path");
    }
}
