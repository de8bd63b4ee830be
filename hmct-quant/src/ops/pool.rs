//! MaxPool (with Indices), AveragePool, GlobalAveragePool and GlobalMaxPool over 1-D to
//! 3-D windows. One parallel task per (image, channel) plane.

use hmct_tensor::ndarray::{ArrayD, IxDyn};
use hmct_tensor::{Tensor, f16};
use rayon::prelude::*;

use super::conv::{Win3, WindowAttrs, contiguous};
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

fn shaped<T>(shape: &[usize], data: Vec<T>) -> Result<ArrayD<T>, OpError> {
    ArrayD::from_shape_vec(IxDyn(shape), data).map_err(|e| OpError::invalid(e.to_string()))
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

fn avg_pool<T: num_traits::Float + Send + Sync>(
    x: &[T],
    xs: &[usize],
    g: &Win3,
    pe: &[usize; 3],
    include_pad: bool,
) -> Vec<T> {
    let (in_vol, out_vol) = (g.in_vol(), g.out_vol());
    let planes = xs[0] * xs[1];
    let [od_n, oh_n, ow_n] = g.out;
    let [_, ih_n, iw_n] = g.input;
    let axis_taps: Vec<Vec<(Vec<usize>, usize)>> = (0..3)
        .map(|a| (0..g.out[a]).map(|o| taps(g, pe, a, o)).collect())
        .collect();
    let mut y = vec![T::zero(); planes * out_vol];
    let plane = |(p, out): (usize, &mut [T])| {
        let xp = &x[p * in_vol..][..in_vol];
        for od in 0..od_n {
            let (td, pd) = &axis_taps[0][od];
            for oh in 0..oh_n {
                let (th, ph) = &axis_taps[1][oh];
                for ow in 0..ow_n {
                    let (tw, pw) = &axis_taps[2][ow];
                    let mut s = T::zero();
                    for &d in td {
                        for &h in th {
                            let row = &xp[(d * ih_n + h) * iw_n..][..iw_n];
                            for &w in tw {
                                s = s + row[w];
                            }
                        }
                    }
                    let count = if include_pad {
                        pd * ph * pw
                    } else {
                        td.len() * th.len() * tw.len()
                    };
                    out[(od * oh_n + oh) * ow_n + ow] = if count == 0 {
                        T::zero()
                    } else {
                        s / T::from(count).unwrap_or(T::one())
                    };
                }
            }
        }
    };
    if y.len() * g.k_vol() < (1 << 16) {
        y.chunks_mut(out_vol.max(1)).enumerate().for_each(plane);
    } else {
        y.par_chunks_mut(out_vol.max(1)).enumerate().for_each(plane);
    }
    y
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
    if y.len() * g.k_vol() < (1 << 16) {
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

/// Max pooling without indices: the same maximum as [`max_pool`] (the first tap, then
/// any later tap greater than it), summed up row by row with each tap's valid output
/// range worked out once per row instead of per output.
fn max_pool_values<T: Copy + PartialOrd + Send + Sync>(
    x: &[T],
    xs: &[usize],
    g: &Win3,
    pe: &[usize; 3],
    lowest: T,
) -> Vec<T> {
    let (in_vol, out_vol) = (g.in_vol(), g.out_vol());
    let planes = xs[0] * xs[1];
    let [od_n, oh_n, ow_n] = g.out;
    let [_, ih_n, iw_n] = g.input;
    let outer: Vec<Vec<Vec<usize>>> = (0..2)
        .map(|a| (0..g.out[a]).map(|o| taps(g, pe, a, o).0).collect())
        .collect();
    // Per width tap: the outputs whose tap lies inside the row, and the column of output 0.
    let width_taps: Vec<(usize, usize, isize)> =
        (0..g.kernel[2]).map(|k| g.inner_range(k)).collect();
    let mut y = vec![lowest; planes * out_vol];
    let plane = |(p, out): (usize, &mut [T])| {
        let xp = &x[p * in_vol..][..in_vol];
        let mut seen = vec![false; ow_n];
        for od in 0..od_n {
            for oh in 0..oh_n {
                let orow = &mut out[(od * oh_n + oh) * ow_n..][..ow_n];
                let rows = outer[0][od]
                    .iter()
                    .flat_map(|&d| outer[1][oh].iter().map(move |&h| d * ih_n + h));
                for (i, r) in rows.enumerate() {
                    let row = &xp[r * iw_n..][..iw_n];
                    // Every output with a tap in the window's first row meets its first
                    // tap there, so only that row tracks which outputs have one.
                    if i == 0 {
                        seen.fill(false);
                    }
                    let s = g.stride[2];
                    for &(lo, hi, off) in &width_taps {
                        let outs = orow.iter_mut().enumerate().take(hi).skip(lo);
                        let col = |ow: usize| ((ow * s) as isize + off) as usize;
                        if i == 0 {
                            for (ow, o) in outs {
                                let v = row[col(ow)];
                                if !seen[ow] || v > *o {
                                    *o = v;
                                    seen[ow] = true;
                                }
                            }
                        } else {
                            for (ow, o) in outs {
                                let v = row[col(ow)];
                                *o = if v > *o { v } else { *o };
                            }
                        }
                    }
                }
            }
        }
    };
    if y.len() * g.k_vol() < (1 << 16) {
        y.chunks_mut(out_vol.max(1)).enumerate().for_each(plane);
    } else {
        y.par_chunks_mut(out_vol.max(1)).enumerate().for_each(plane);
    }
    y
}

impl Kernel for PoolKernel {
    fn run(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        let x = input(inputs, 0)?;
        let xs = x.shape();
        let (g, pe, shape) = self.geometry(xs)?;
        if !self.max {
            let out = match x {
                Tensor::F32(a) => Tensor::F32(shaped(
                    &shape,
                    avg_pool(&contiguous(a), xs, &g, &pe, self.count_include_pad),
                )?),
                Tensor::F64(a) => Tensor::F64(shaped(
                    &shape,
                    avg_pool(&contiguous(a), xs, &g, &pe, self.count_include_pad),
                )?),
                Tensor::F16(a) => {
                    let v: Vec<f32> = a.iter().map(|v| v.to_f32()).collect();
                    let y = avg_pool(&v, xs, &g, &pe, self.count_include_pad);
                    Tensor::F16(shaped(&shape, y.into_iter().map(f16::from_f32).collect())?)
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
            ($variant:ident, $a:expr, $low:expr) => {{
                if self.want_indices {
                    let (y, i) = max_pool(&contiguous($a), xs, &g, &pe, $low, self.column_major);
                    (Tensor::$variant(shaped(&shape, y)?), i)
                } else {
                    let y = max_pool_values(&contiguous($a), xs, &g, &pe, $low);
                    (Tensor::$variant(shaped(&shape, y)?), Vec::new())
                }
            }};
        }
        let (y, idx) = match x {
            Tensor::F32(a) => mp!(F32, a, f32::NEG_INFINITY),
            Tensor::F64(a) => mp!(F64, a, f64::NEG_INFINITY),
            Tensor::F16(a) => mp!(F16, a, f16::NEG_INFINITY),
            Tensor::I8(a) => mp!(I8, a, i8::MIN),
            Tensor::U8(a) => mp!(U8, a, u8::MIN),
            other => {
                return Err(OpError::unsupported(format!(
                    "MaxPool on {}",
                    other.dtype()
                )));
            }
        };
        if self.want_indices {
            Ok(vec![y, Tensor::I64(shaped(&shape, idx)?)])
        } else {
            Ok(vec![y])
        }
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
            let y: Vec<f32> = if vol == 0 {
                vec![f32::NAN; shape.iter().product()]
            } else {
                d.par_chunks(vol)
                    .with_min_len((1 << 14) / vol.max(1) + 1)
                    .map(|p| {
                        if max {
                            p.iter().copied().fold(f32::NEG_INFINITY, |m, v| {
                                if v > m || v.is_nan() { v } else { m }
                            })
                        } else {
                            (p.iter().map(|&v| v as f64).sum::<f64>() / p.len() as f64) as f32
                        }
                    })
                    .collect()
            };
            Tensor::F32(shaped(&shape, y)?)
        }
        Tensor::F64(a) => {
            let d = contiguous(a);
            let y: Vec<f64> = if vol == 0 {
                vec![f64::NAN; shape.iter().product()]
            } else {
                d.chunks(vol).map(reduce).collect()
            };
            Tensor::F64(shaped(&shape, y)?)
        }
        Tensor::F16(a) => {
            let d: Vec<f64> = a.iter().map(|v| v.to_f64()).collect();
            let y: Vec<f16> = if vol == 0 {
                vec![f16::NAN; shape.iter().product()]
            } else {
                d.chunks(vol).map(|p| f16::from_f64(reduce(p))).collect()
            };
            Tensor::F16(shaped(&shape, y)?)
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
