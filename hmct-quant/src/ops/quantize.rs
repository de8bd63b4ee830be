//! QuantizeLinear, DequantizeLinear (per-tensor, per-axis and blocked) and
//! DynamicQuantizeLinear, for 8-, 16- and 32-bit integers.
//!
//! Quantization follows onnxruntime exactly: `x / scale` is an f32 division (for f32,
//! f16 and bf16 inputs), the quotient is clamped to `[qmin - zp, qmax - zp]` with NaN
//! going to the low bound, rounded half to even, and offset by the zero point.

use hmct_tensor::ndarray::{ArrayD, IxDyn};
use hmct_tensor::{DType, Tensor, bf16, f16};

use super::arrays::{array, contiguous};
use super::{Kernel, NodeSpec, OpError, input, normalize_axis};

pub(crate) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>> {
    let k: Result<Box<dyn Kernel>, OpError> = match spec.op_type {
        "QuantizeLinear" => QdqKernel::new(spec, true).map(|k| Box::new(k) as Box<dyn Kernel>),
        "DequantizeLinear" => QdqKernel::new(spec, false).map(|k| Box::new(k) as Box<dyn Kernel>),
        "DynamicQuantizeLinear" => Ok(Box::new(dynamic_quantize)),
        _ => return None,
    };
    Some(k)
}

/// Integer range of a quantized type.
fn int_range(d: DType) -> Option<(i64, i64)> {
    Some(match d {
        DType::I8 => (i8::MIN as i64, i8::MAX as i64),
        DType::U8 => (0, u8::MAX as i64),
        DType::I16 => (i16::MIN as i64, i16::MAX as i64),
        DType::U16 => (0, u16::MAX as i64),
        DType::I32 => (i32::MIN as i64, i32::MAX as i64),
        _ => return None,
    })
}

/// Builds an integer tensor of type `d` from values already inside its range.
fn int_tensor(d: DType, shape: &[usize], v: Vec<i64>) -> Result<Tensor, OpError> {
    Ok(match d {
        DType::I8 => Tensor::I8(array(shape, v.into_iter().map(|q| q as i8).collect())?),
        DType::U8 => Tensor::U8(array(shape, v.into_iter().map(|q| q as u8).collect())?),
        DType::I16 => Tensor::I16(array(shape, v.into_iter().map(|q| q as i16).collect())?),
        DType::U16 => Tensor::U16(array(shape, v.into_iter().map(|q| q as u16).collect())?),
        DType::I32 => Tensor::I32(array(shape, v.into_iter().map(|q| q as i32).collect())?),
        other => return Err(OpError::unsupported(format!("quantized type {other}"))),
    })
}

/// A float tensor's values as f32 (the precision onnxruntime quantizes in).
fn f32_values(t: &Tensor, what: &str) -> Result<Vec<f32>, OpError> {
    Ok(match t {
        Tensor::F32(a) => contiguous(a).into_owned(),
        Tensor::F16(a) => a.iter().map(|v| v.to_f32()).collect(),
        Tensor::BF16(a) => a.iter().map(|v| v.to_f32()).collect(),
        Tensor::I32(a) => a.iter().map(|&v| v as f32).collect(),
        other => {
            return Err(OpError::unsupported(format!(
                "{what} of type {}",
                other.dtype()
            )));
        }
    })
}

/// `q = clamp(round_half_even(x / s) + zp, qmin, qmax)`, NaN to `qmin`.
#[inline]
pub(crate) fn quantize_one(x: f32, s: f32, zp: i64, qmin: i64, qmax: i64) -> i64 {
    let v = (x / s) as f64;
    let (lo, hi) = ((qmin - zp) as f64, (qmax - zp) as f64);
    let v = if v >= lo { v } else { lo };
    let v = if v <= hi { v } else { hi };
    v.round_ties_even() as i64 + zp
}

/// How parameters map onto the data: the data is viewed as `[outer, dim, inner]`
/// around the quantization axis.
#[derive(Clone, Copy, Debug)]
struct Layout {
    dim: usize,
    inner: usize,
    /// 0: per tensor; otherwise elements along the axis per parameter (`dim` for
    /// per-axis is expressed as block 1 with `blocks == dim`).
    block: usize,
    blocks: usize,
    per_axis_outer: bool,
}

impl Layout {
    #[inline]
    fn param(&self, flat: usize) -> usize {
        if self.block == 0 {
            return 0;
        }
        let j = flat % self.inner;
        let i = (flat / self.inner) % self.dim;
        let o = flat / (self.inner * self.dim);
        let b = i / self.block;
        if self.per_axis_outer {
            (o * self.blocks + b) * self.inner + j
        } else {
            b
        }
    }
}

struct QdqKernel {
    quantize: bool,
    axis: i64,
    block_size: usize,
    output_dtype: Option<DType>,
}

impl QdqKernel {
    fn new(spec: &NodeSpec, quantize: bool) -> Result<Self, OpError> {
        let block_size = spec.attrs.int_or("block_size", 0)?;
        if block_size < 0 {
            return Err(OpError::invalid(format!("block_size {block_size}")));
        }
        let output_dtype = match spec.attrs.int_or("output_dtype", 0)? {
            0 => None,
            code => {
                let d = DType::from_onnx(code as i32).ok_or_else(|| {
                    OpError::unsupported(format!(
                        "output_dtype {}",
                        DType::onnx_code_name(code as i32)
                    ))
                })?;
                let ok = if quantize {
                    int_range(d).is_some()
                } else {
                    matches!(d, DType::F32 | DType::F16 | DType::BF16)
                };
                if !ok {
                    return Err(OpError::unsupported(format!("output_dtype {d}")));
                }
                Some(d)
            }
        };
        if quantize && spec.attrs.int_or("precision", 0)? != 0 {
            return Err(OpError::unsupported("QuantizeLinear precision attribute"));
        }
        Ok(QdqKernel {
            quantize,
            axis: if spec.opset >= 13 {
                spec.attrs.int_or("axis", 1)?
            } else {
                1
            },
            block_size: block_size as usize,
            output_dtype,
        })
    }

    fn layout(&self, xs: &[usize], ss: &[usize]) -> Result<Layout, OpError> {
        let n: usize = ss.iter().product();
        if self.block_size == 0 && n == 1 && ss.len() <= 1 {
            return Ok(Layout {
                dim: 1,
                inner: 1,
                block: 0,
                blocks: 1,
                per_axis_outer: false,
            });
        }
        let axis = normalize_axis(self.axis, xs.len())?;
        let inner: usize = xs[axis + 1..].iter().product();
        let dim = xs[axis];
        if self.block_size == 0 {
            if ss.len() != 1 || ss[0] != dim {
                return Err(OpError::invalid(format!(
                    "scale {ss:?} for axis {axis} of {xs:?}"
                )));
            }
            return Ok(Layout {
                dim,
                inner,
                block: 1,
                blocks: dim,
                per_axis_outer: false,
            });
        }
        let blocks = dim.div_ceil(self.block_size);
        let mut want = xs.to_vec();
        want[axis] = blocks;
        if ss != want.as_slice() {
            return Err(OpError::invalid(format!(
                "blocked scale {ss:?}, expected {want:?}"
            )));
        }
        Ok(Layout {
            dim,
            inner,
            block: self.block_size,
            blocks,
            per_axis_outer: true,
        })
    }
}

impl Kernel for QdqKernel {
    fn run(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        let x = input(inputs, 0)?;
        let scale_t = input(inputs, 1)?;
        let zp_t = inputs.get(2).copied().flatten();
        let xs = x.shape().to_vec();
        let lay = self.layout(&xs, scale_t.shape())?;
        let scales = f32_values(scale_t, "scale")?;
        let zps: Option<Vec<i64>> = match zp_t {
            None => None,
            Some(z) => {
                if int_range(z.dtype()).is_none() {
                    return Err(OpError::unsupported(format!(
                        "zero point of type {}",
                        z.dtype()
                    )));
                }
                if z.shape() != scale_t.shape() {
                    return Err(OpError::invalid(format!(
                        "zero point {:?} vs scale {:?}",
                        z.shape(),
                        scale_t.shape()
                    )));
                }
                z.to_i64_vec()
            }
        };
        let zp_at = |k: usize| zps.as_ref().map_or(0, |z| z[k]);
        if self.quantize {
            let qtype = match (zp_t, self.output_dtype) {
                (Some(z), _) => z.dtype(),
                (None, Some(d)) => d,
                (None, None) => DType::U8,
            };
            let (qmin, qmax) = int_range(qtype)
                .ok_or_else(|| OpError::unsupported(format!("QuantizeLinear to {qtype}")))?;
            let xv = f32_values(x, "QuantizeLinear input")?;
            let q: Vec<i64> = xv
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let k = lay.param(i);
                    quantize_one(v, scales[k], zp_at(k), qmin, qmax)
                })
                .collect();
            return Ok(vec![int_tensor(qtype, &xs, q)?]);
        }
        let xv = x
            .to_i64_vec()
            .filter(|_| int_range(x.dtype()).is_some())
            .ok_or_else(|| OpError::unsupported(format!("DequantizeLinear of {}", x.dtype())))?;
        if x.dtype() == DType::I32 && zps.as_ref().is_some_and(|z| z.iter().any(|&v| v != 0)) {
            return Err(OpError::invalid(
                "int32 DequantizeLinear with a non-zero zero point",
            ));
        }
        let y: Vec<f32> = xv
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let k = lay.param(i);
                (v - zp_at(k)) as f32 * scales[k]
            })
            .collect();
        let out_type = self.output_dtype.unwrap_or(scale_t.dtype());
        Ok(vec![match out_type {
            DType::F16 => Tensor::F16(array(&xs, y.into_iter().map(f16::from_f32).collect())?),
            DType::BF16 => Tensor::BF16(array(&xs, y.into_iter().map(bf16::from_f32).collect())?),
            _ => Tensor::F32(array(&xs, y)?),
        }])
    }
}

/// DynamicQuantizeLinear: uint8 with a range that always includes 0.
fn dynamic_quantize(inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
    let x = input(inputs, 0)?;
    let xv = f32_values(x, "DynamicQuantizeLinear input")?;
    let (qmin, qmax) = (0i64, 255i64);
    let mut lo = 0.0f32;
    let mut hi = 0.0f32;
    for &v in &xv {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    let scale = (hi - lo) / (qmax - qmin) as f32;
    let zp_f = if scale == 0.0 {
        0.0
    } else {
        qmin as f32 - lo / scale
    };
    let zp = zp_f.clamp(qmin as f32, qmax as f32).round_ties_even() as i64;
    let q: Vec<i64> = xv
        .iter()
        .map(|&v| quantize_one(v, scale, zp, qmin, qmax))
        .collect();
    let xs = x.shape().to_vec();
    Ok(vec![
        int_tensor(DType::U8, &xs, q)?,
        Tensor::scalar_f32(scale),
        Tensor::U8(ArrayD::from_elem(IxDyn(&[]), zp as u8)),
    ])
}
