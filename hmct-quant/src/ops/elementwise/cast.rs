//! Cast and CastLike between every element type a [`Tensor`] can hold.
//!
//! Numeric conversions follow C/numpy: floats to integers truncate toward zero (Rust
//! `as`, so out-of-range values saturate where C leaves them undefined), floats narrow
//! with round-to-nearest-even, anything to bool is "not zero". Strings parse as decimal
//! or scientific numbers (and `inf`/`nan`) and print as the shortest round-trip form.

use std::fmt::Display;

use half::{bf16, f16};
use hmct_tensor::ndarray::ArrayD;
use hmct_tensor::{DType, Tensor};
use num_traits::AsPrimitive;

use crate::ops::broadcast::unary;
use crate::ops::num::{Num, with_num};
use crate::ops::{Kernel, NodeSpec, OpError, input};

/// A numeric type that converts to every other numeric type.
trait CastSrc:
    Num
    + Display
    + AsPrimitive<f32>
    + AsPrimitive<f64>
    + AsPrimitive<f16>
    + AsPrimitive<bf16>
    + AsPrimitive<i8>
    + AsPrimitive<i16>
    + AsPrimitive<i32>
    + AsPrimitive<i64>
    + AsPrimitive<u8>
    + AsPrimitive<u16>
    + AsPrimitive<u32>
    + AsPrimitive<u64>
{
}

impl<T> CastSrc for T where
    T: Num
        + Display
        + AsPrimitive<f32>
        + AsPrimitive<f64>
        + AsPrimitive<f16>
        + AsPrimitive<bf16>
        + AsPrimitive<i8>
        + AsPrimitive<i16>
        + AsPrimitive<i32>
        + AsPrimitive<i64>
        + AsPrimitive<u8>
        + AsPrimitive<u16>
        + AsPrimitive<u32>
        + AsPrimitive<u64>
{
}

fn cast_num<S: CastSrc>(a: &ArrayD<S>, to: DType) -> Tensor {
    match to {
        DType::F32 => Tensor::F32(unary(a, |v| v.as_())),
        DType::F64 => Tensor::F64(unary(a, |v| v.as_())),
        DType::F16 => Tensor::F16(unary(a, |v| v.as_())),
        DType::BF16 => Tensor::BF16(unary(a, |v| v.as_())),
        DType::I8 => Tensor::I8(unary(a, |v| v.as_())),
        DType::I16 => Tensor::I16(unary(a, |v| v.as_())),
        DType::I32 => Tensor::I32(unary(a, |v| v.as_())),
        DType::I64 => Tensor::I64(unary(a, |v| v.as_())),
        DType::U8 => Tensor::U8(unary(a, |v| v.as_())),
        DType::U16 => Tensor::U16(unary(a, |v| v.as_())),
        DType::U32 => Tensor::U32(unary(a, |v| v.as_())),
        DType::U64 => Tensor::U64(unary(a, |v| v.as_())),
        DType::Bool => Tensor::Bool(unary(a, |v| v != S::ZERO)),
        DType::String => Tensor::String(a.map(|v| format!("{v}"))),
    }
}

fn from_bool(a: &ArrayD<bool>, to: DType) -> Tensor {
    match to {
        DType::Bool => Tensor::Bool(a.clone()),
        DType::String => Tensor::String(a.map(|&v| if v { "True" } else { "False" }.to_string())),
        _ => cast_num(&unary(a, u8::from), to),
    }
}

fn parse_f64(s: &str) -> Result<f64, OpError> {
    s.trim()
        .parse::<f64>()
        .map_err(|_| OpError::invalid(format!("Cast cannot parse '{s}' as a number")))
}

/// Integers parse exactly when written as integers, through f64 otherwise ("1e3").
fn parse_int<T: Num + std::str::FromStr>(s: &str) -> Result<T, OpError> {
    match s.trim().parse::<T>() {
        Ok(v) => Ok(v),
        Err(_) => parse_f64(s).map(T::from_f64),
    }
}

fn from_string(a: &ArrayD<String>, to: DType) -> Result<Tensor, OpError> {
    fn each<T>(
        a: &ArrayD<String>,
        f: impl Fn(&str) -> Result<T, OpError>,
    ) -> Result<ArrayD<T>, OpError> {
        let data = a
            .iter()
            .map(|s| f(s))
            .collect::<Result<Vec<T>, OpError>>()?;
        crate::ops::arrays::array(a.shape(), data)
    }
    Ok(match to {
        DType::String => Tensor::String(a.clone()),
        DType::F32 => Tensor::F32(each(a, |s| parse_f64(s).map(|v| v as f32))?),
        DType::F64 => Tensor::F64(each(a, parse_f64)?),
        DType::F16 => Tensor::F16(each(a, |s| parse_f64(s).map(f16::from_f64))?),
        DType::BF16 => Tensor::BF16(each(a, |s| parse_f64(s).map(bf16::from_f64))?),
        DType::I8 => Tensor::I8(each(a, parse_int)?),
        DType::I16 => Tensor::I16(each(a, parse_int)?),
        DType::I32 => Tensor::I32(each(a, parse_int)?),
        DType::I64 => Tensor::I64(each(a, parse_int)?),
        DType::U8 => Tensor::U8(each(a, parse_int)?),
        DType::U16 => Tensor::U16(each(a, parse_int)?),
        DType::U32 => Tensor::U32(each(a, parse_int)?),
        DType::U64 => Tensor::U64(each(a, parse_int)?),
        DType::Bool => Tensor::Bool(each(a, |s| match s.trim().to_ascii_lowercase().as_str() {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => parse_f64(s).map(|v| v != 0.0),
        })?),
    })
}

/// `t` converted to element type `to`.
pub(crate) fn cast(t: &Tensor, to: DType) -> Result<Tensor, OpError> {
    if t.dtype() == to {
        return Ok(t.clone());
    }
    match t {
        Tensor::Bool(a) => Ok(from_bool(a, to)),
        Tensor::String(a) => from_string(a, to),
        _ => {
            with_num!(t, a => Ok(cast_num(a, to)), other => Err(OpError::unsupported(format!("Cast from {}", other.dtype()))))
        }
    }
}

/// The element type named by an ONNX type code, or why it cannot be used.
pub(crate) fn dtype_of_code(code: i64, what: &str) -> Result<DType, OpError> {
    i32::try_from(code)
        .ok()
        .and_then(DType::from_onnx)
        .ok_or_else(|| {
            OpError::unsupported(format!("{what} {}", DType::onnx_code_name(code as i32)))
        })
}

pub(super) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>> {
    match spec.op_type {
        "Cast" => Some((|| {
            let to = spec
                .attrs
                .int("to")?
                .ok_or_else(|| OpError::invalid("Cast without a 'to' attribute"))?;
            let to = dtype_of_code(to, "Cast to")?;
            Ok(
                Box::new(move |inputs: &[Option<&Tensor>]| Ok(vec![cast(input(inputs, 0)?, to)?]))
                    as Box<dyn Kernel>,
            )
        })()),
        "CastLike" => Some(Ok(Box::new(|inputs: &[Option<&Tensor>]| {
            let like = input(inputs, 1)?.dtype();
            Ok(vec![cast(input(inputs, 0)?, like)?])
        }))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Tensor {
        Tensor::from_f32(&[v.len()], v.to_vec()).unwrap()
    }

    #[test]
    fn float_to_int_truncates_toward_zero() {
        let t = cast(&f32s(&[1.9, -1.9, 0.5]), DType::I32).unwrap();
        assert_eq!(t.to_i64_vec().unwrap(), vec![1, -1, 0]);
    }

    #[test]
    fn float_to_half_rounds_to_nearest_even() {
        // 1 + 2^-11 lies halfway between two f16 values; ties go to the even one (1.0).
        let t = cast(&f32s(&[1.0 + 2f32.powi(-11), 65520.0]), DType::F16).unwrap();
        let Tensor::F16(a) = t else { panic!() };
        assert_eq!(a[[0]], f16::ONE);
        assert!(a[[1]].is_infinite());
    }

    #[test]
    fn bool_and_string_round_trips() {
        let b = cast(&f32s(&[0.0, -2.0, f32::NAN]), DType::Bool).unwrap();
        assert_eq!(b.to_i64_vec().unwrap(), vec![0, 1, 1]);
        let s = cast(&f32s(&[1.5, -3.0]), DType::String).unwrap();
        let back = cast(&s, DType::F64).unwrap();
        assert_eq!(back.to_f64_vec().unwrap(), vec![1.5, -3.0]);
        let bad = Tensor::String(ArrayD::from_elem(
            hmct_tensor::ndarray::IxDyn(&[1]),
            "x".into(),
        ));
        assert!(cast(&bad, DType::F32).is_err());
        let sci = Tensor::String(ArrayD::from_elem(
            hmct_tensor::ndarray::IxDyn(&[1]),
            "1E3".into(),
        ));
        assert_eq!(
            cast(&sci, DType::I64).unwrap().to_i64_vec().unwrap(),
            vec![1000]
        );
    }
}
