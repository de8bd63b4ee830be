//! Broadcasting ops over two or more inputs: arithmetic, Pow, Mod, BitShift,
//! comparisons, logic, Where, PRelu and the variadic Min/Max/Sum/Mean.

use hmct_tensor::Tensor;
use hmct_tensor::ndarray::ArrayD;

use super::step::{ArithOp, ElementStep};
use crate::ops::broadcast::{along_axis1_only, binary, binary_in_place, ternary, unary};
use crate::ops::num::{Num, with_num, with_num2, with_same2};
use crate::ops::{Kernel, NodeSpec, OpError, input, run_not_reusing};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Arith {
    Add,
    Sub,
    Mul,
    Div,
    /// numpy-style remainder (sign of the divisor). ONNX asks for fmod=1 on floats,
    /// but its own tests (and onnxruntime) also define fmod=0 there, as numpy `mod`.
    Mod,
    /// C-style remainder (sign of the dividend).
    FMod,
    Min,
    Max,
}

fn type_error(what: &str, a: &Tensor, b: &Tensor) -> OpError {
    if a.dtype() == b.dtype() {
        OpError::unsupported(format!("{what} on {}", a.dtype()))
    } else {
        OpError::invalid(format!(
            "{what} inputs have different types {} and {}",
            a.dtype(),
            b.dtype()
        ))
    }
}

fn arith(op: Arith, a: &Tensor, b: &Tensor) -> Result<Tensor, OpError> {
    with_num2!(a, b, (x, y) => Ok(Tensor::from(match op {
        Arith::Add => binary(x, y, Num::add)?,
        Arith::Sub => binary(x, y, Num::sub)?,
        Arith::Mul => binary(x, y, Num::mul)?,
        Arith::Div => binary(x, y, Num::div)?,
        Arith::Mod => binary(x, y, Num::floor_mod)?,
        Arith::FMod => binary(x, y, Num::fmod)?,
        Arith::Min => binary(x, y, Num::min_nan)?,
        Arith::Max => binary(x, y, Num::max_nan)?,
    })), _ => Err(type_error(&format!("{op:?}"), a, b)))
}

/// Integer power with wrapping; negative exponents truncate like `1 / b^-e`.
fn ipow(mut b: i64, mut e: i64) -> i64 {
    if e < 0 {
        return match b {
            1 => 1,
            -1 => {
                if e % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    let mut r: i64 = 1;
    while e > 0 {
        if e & 1 == 1 {
            r = r.wrapping_mul(b);
        }
        b = b.wrapping_mul(b);
        e >>= 1;
    }
    r
}

/// `b ^ e` in the base's type: exact for integers, through f64 otherwise.
#[inline]
fn pow_mixed<T: Num, E: Num>(b: T, e: E) -> T {
    if !T::FLOAT && !E::FLOAT {
        T::from_i64(ipow(b.to_i64(), e.to_i64()))
    } else {
        T::from_f64(b.to_f64().powf(e.to_f64()))
    }
}

fn pow_base<T: Num>(x: &ArrayD<T>, e: &Tensor) -> Result<Tensor, OpError> {
    with_num!(e, y => Ok(T::wrap(binary(x, y, pow_mixed)?)),
        other => Err(OpError::unsupported(format!("Pow exponent of type {}", other.dtype()))))
}

fn pow(a: &Tensor, b: &Tensor) -> Result<Tensor, OpError> {
    match (a, b) {
        (Tensor::F32(x), Tensor::F32(y)) => {
            // Squares (unfolded LayerNorm variance) deserve a multiply, not a libm call.
            if y.len() == 1 && y.iter().all(|&e| e == 2.0) {
                return Ok(Tensor::F32(binary(x, y, |v, _| v * v)?));
            }
            Ok(Tensor::F32(binary(x, y, f32::powf)?))
        }
        (Tensor::F64(x), Tensor::F64(y)) => Ok(Tensor::F64(binary(x, y, f64::powf)?)),
        (Tensor::F32(x), e) => pow_base(x, e),
        (Tensor::F64(x), e) => pow_base(x, e),
        (Tensor::F16(x), e) => pow_base(x, e),
        (Tensor::BF16(x), e) => pow_base(x, e),
        (Tensor::I32(x), e) => pow_base(x, e),
        (Tensor::I64(x), e) => pow_base(x, e),
        (other, _) => Err(OpError::unsupported(format!(
            "Pow base of type {}",
            other.dtype()
        ))),
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Cmp {
    Equal,
    Less,
    LessOrEqual,
    Greater,
    GreaterOrEqual,
}

fn compare(op: Cmp, a: &Tensor, b: &Tensor) -> Result<Tensor, OpError> {
    if op == Cmp::Equal {
        match (a, b) {
            (Tensor::Bool(x), Tensor::Bool(y)) => {
                return Ok(Tensor::Bool(binary(x, y, |p, q| p == q)?));
            }
            (Tensor::String(x), Tensor::String(y)) => {
                return Ok(Tensor::Bool(ternary(x, y, x, |p, q, _| p == q)?));
            }
            _ => {}
        }
    }
    with_num2!(a, b, (x, y) => Ok(Tensor::Bool(match op {
        Cmp::Equal => binary(x, y, |p, q| p == q)?,
        Cmp::Less => binary(x, y, |p, q| p < q)?,
        Cmp::LessOrEqual => binary(x, y, |p, q| p <= q)?,
        Cmp::Greater => binary(x, y, |p, q| p > q)?,
        Cmp::GreaterOrEqual => binary(x, y, |p, q| p >= q)?,
    })), _ => Err(type_error(&format!("{op:?}"), a, b)))
}

fn logic(op: &str, a: &Tensor, b: &Tensor) -> Result<Tensor, OpError> {
    let (Tensor::Bool(x), Tensor::Bool(y)) = (a, b) else {
        return Err(OpError::invalid(format!(
            "{op} needs bool inputs, got {} and {}",
            a.dtype(),
            b.dtype()
        )));
    };
    Ok(Tensor::Bool(match op {
        "And" => binary(x, y, |p, q| p & q)?,
        "Or" => binary(x, y, |p, q| p | q)?,
        _ => binary(x, y, |p, q| p ^ q)?,
    }))
}

/// Shift counts outside `0..bits` give 0, or -1 for a right shift of a negative
/// value (what an arithmetic shift tends to); left shifts of signed values wrap.
fn bit_shift(left: bool, a: &Tensor, b: &Tensor) -> Result<Tensor, OpError> {
    macro_rules! shift {
        ($t:ident, $x:expr, $y:expr) => {{
            let bits = $t::BITS as i64;
            #[allow(unused_comparisons)]
            let out = if left {
                binary($x, $y, |v: $t, s: $t| {
                    let s = s as i64;
                    if (0..bits).contains(&s) {
                        v.wrapping_shl(s as u32)
                    } else {
                        0
                    }
                })?
            } else {
                binary($x, $y, |v: $t, s: $t| {
                    let s = s as i64;
                    if (0..bits).contains(&s) {
                        v >> s
                    } else if v < 0 {
                        (0 as $t).wrapping_sub(1)
                    } else {
                        0
                    }
                })?
            };
            out
        }};
    }
    Ok(match (a, b) {
        (Tensor::U8(x), Tensor::U8(y)) => Tensor::U8(shift!(u8, x, y)),
        (Tensor::U16(x), Tensor::U16(y)) => Tensor::U16(shift!(u16, x, y)),
        (Tensor::U32(x), Tensor::U32(y)) => Tensor::U32(shift!(u32, x, y)),
        (Tensor::U64(x), Tensor::U64(y)) => Tensor::U64(shift!(u64, x, y)),
        (Tensor::I8(x), Tensor::I8(y)) => Tensor::I8(shift!(i8, x, y)),
        (Tensor::I16(x), Tensor::I16(y)) => Tensor::I16(shift!(i16, x, y)),
        (Tensor::I32(x), Tensor::I32(y)) => Tensor::I32(shift!(i32, x, y)),
        (Tensor::I64(x), Tensor::I64(y)) => Tensor::I64(shift!(i64, x, y)),
        _ => return Err(type_error("BitShift", a, b)),
    })
}

/// The slope as it broadcasts to an input of shape `x`: before opset 7 (`per_channel`)
/// a 1-D slope of length C applies along axis 1 (NCHW channels).
fn prelu_slope<'s>(
    x: &[usize],
    slope: &'s Tensor,
    per_channel: bool,
) -> Result<std::borrow::Cow<'s, Tensor>, OpError> {
    Ok(match (x, slope.shape()) {
        ([_, c, rest @ ..], &[s]) if per_channel && s == *c && s > 1 => {
            let shape: Vec<usize> = std::iter::once(s).chain(rest.iter().map(|_| 1)).collect();
            std::borrow::Cow::Owned(crate::ops::arrays::reshaped(slope, &shape)?)
        }
        _ => std::borrow::Cow::Borrowed(slope),
    })
}

/// PRelu with `slope` as [`prelu_slope`] gives it.
fn prelu(x: &Tensor, slope: &Tensor) -> Result<Tensor, OpError> {
    // The macro expands this for unsigned types too, where `v < 0` is always false:
    // right for them, and not a mistake.
    #[allow(clippy::absurd_extreme_comparisons)]
    let out = with_num2!(x, slope, (a, s) => Tensor::from(
        binary(a, s, |v, k| if v < Num::ZERO { v.mul(k) } else { v })?
    ), _ => return Err(type_error("PRelu", x, slope)));
    if out.shape() != x.shape() {
        return Err(OpError::invalid(format!(
            "PRelu slope of shape {:?} does not broadcast to the input shape {:?}",
            slope.shape(),
            x.shape()
        )));
    }
    Ok(out)
}

fn where_(c: &Tensor, x: &Tensor, y: &Tensor) -> Result<Tensor, OpError> {
    let Tensor::Bool(c) = c else {
        return Err(OpError::invalid(format!(
            "Where condition must be bool, got {}",
            c.dtype()
        )));
    };
    with_same2!(x, y, (a, b) => Ok(Tensor::from(
        ternary(c, a, b, |&c, p, q| if c { p.clone() } else { q.clone() })?
    )), _ => Err(type_error("Where", x, y)))
}

/// Min/Max/Sum/Mean: a left fold over the inputs (fixed order), Mean divides last.
fn variadic(op: &str, inputs: &[Option<&Tensor>]) -> Result<Tensor, OpError> {
    let mut acc = input(inputs, 0)?.clone();
    for i in 1..inputs.len() {
        let next = input(inputs, i)?;
        acc = arith(
            match op {
                "Min" => Arith::Min,
                "Max" => Arith::Max,
                _ => Arith::Add,
            },
            &acc,
            next,
        )?;
    }
    if op == "Mean" && inputs.len() > 1 {
        let n = inputs.len() as i64;
        acc = with_num!(&acc, a => Tensor::from(unary(a, |v| v.div(Num::from_i64(n)))),
            other => return Err(OpError::unsupported(format!("Mean on {}", other.dtype()))));
    }
    Ok(acc)
}

/// Before opset 7, `broadcast=1` with `axis` lines the second input up with the
/// first starting at `axis` instead of at the trailing dimension.
fn legacy_align(a: &Tensor, b: &Tensor, axis: i64) -> Result<Tensor, OpError> {
    let (ra, rb) = (a.shape().len() as i64, b.shape().len() as i64);
    let ax = if axis < 0 { axis + ra } else { axis };
    if ax < 0 || ax + rb > ra {
        return Err(OpError::invalid(format!(
            "legacy broadcast of {:?} into {:?} at axis {axis}",
            b.shape(),
            a.shape()
        )));
    }
    let shape: Vec<usize> = std::iter::repeat_n(1, ax as usize)
        .chain(b.shape().iter().copied())
        .chain(std::iter::repeat_n(1, (ra - ax - rb) as usize))
        .collect();
    crate::ops::arrays::reshaped(b, &shape)
}

fn two(
    legacy_axis: Option<i64>,
    f: impl Fn(&Tensor, &Tensor) -> Result<Tensor, OpError> + Send + Sync + 'static,
) -> Result<Box<dyn Kernel>, OpError> {
    Ok(Box::new(move |inputs: &[Option<&Tensor>]| {
        let (a, b) = (input(inputs, 0)?, input(inputs, 1)?);
        Ok(vec![match legacy_axis {
            Some(axis) => f(a, &legacy_align(a, b, axis)?)?,
            None => f(a, b)?,
        }])
    }))
}

/// PRelu, with a fast path for f32 input and one slope or one per channel (MTCNN's
/// PRelu after each conv).
struct PReluKernel {
    legacy_axis: Option<i64>,
    per_channel: bool,
}

impl Kernel for PReluKernel {
    fn run(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        let (x, s) = (input(inputs, 0)?, input(inputs, 1)?);
        let aligned;
        let s = match self.legacy_axis {
            Some(axis) => {
                aligned = legacy_align(x, s, axis)?;
                &aligned
            }
            None => s,
        };
        let slope = prelu_slope(x.shape(), s, self.per_channel)?;
        if let (Tensor::F32(xa), Tensor::F32(k)) = (x, &*slope)
            && let Some(y) = prelu_planes(xa, k)
        {
            return Ok(vec![Tensor::F32(y)]);
        }
        Ok(vec![prelu(x, &slope)?])
    }
}

/// PRelu of `x` with one slope, or one per channel (axis 1), a plane at a time; `None`
/// for any other slope or a non-contiguous `x`.
fn prelu_planes(x: &ArrayD<f32>, slope: &ArrayD<f32>) -> Option<ArrayD<f32>> {
    let shape = x.shape();
    if !along_axis1_only(slope.shape(), shape) {
        return None;
    }
    let plane = match slope.len() {
        1 => x.len().max(1),
        _ => shape[2..].iter().product::<usize>().max(1),
    };
    let (src, k) = (x.as_slice()?, slope.as_slice()?);
    // Written into a new buffer, not in place: in place, the compiler turns the
    // select into masked stores, which on AMD cost more than the whole loop.
    let mut out = crate::buffers::take::<f32>(src.len());
    #[cfg(target_arch = "x86_64")]
    let avx = plane >= 8 && crate::cpu::features().avx;
    // Planes cycle through the slopes (channels of each image in turn).
    for ((s, d), &k) in src
        .chunks(plane)
        .zip(out.chunks_mut(plane))
        .zip(k.iter().cycle())
    {
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if avx {
            // SAFETY: the CPU has AVX.
            done = unsafe { prelu_avx(s, d, k) };
        }
        for (d, &v) in d[done..].iter_mut().zip(&s[done..]) {
            *d = if v < 0.0 { v * k } else { v };
        }
    }
    ArrayD::from_shape_vec(shape, out).ok()
}

/// `dst = src < 0 ? src * k : src`, eight values at a time with a compare and a blend
/// (the generic broadcast loop ran at SSE width and took 4% of an MTCNN run); returns
/// how many values it did.
///
/// # Safety
/// The CPU has AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn prelu_avx(src: &[f32], dst: &mut [f32], k: f32) -> usize {
    use std::arch::x86_64::*;
    let full = src.len().min(dst.len()) / 8 * 8;
    let (kv, zero) = (_mm256_set1_ps(k), _mm256_setzero_ps());
    // SAFETY: every access is below `full`, inside both slices.
    unsafe {
        for i in (0..full).step_by(8) {
            let v = _mm256_loadu_ps(src.as_ptr().add(i));
            let neg = _mm256_cmp_ps::<_CMP_LT_OQ>(v, zero);
            let y = _mm256_blendv_ps(v, _mm256_mul_ps(v, kv), neg);
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), y);
        }
    }
    full
}

/// Add, Sub, Mul and Div, which can also write into an input's buffer.
struct ArithKernel {
    op: Arith,
    legacy_axis: Option<i64>,
}

impl Kernel for ArithKernel {
    fn run(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        let (a, b) = (input(inputs, 0)?, input(inputs, 1)?);
        Ok(vec![match self.legacy_axis {
            Some(axis) => arith(self.op, a, &legacy_align(a, b, axis)?)?,
            None => arith(self.op, a, b)?,
        }])
    }

    fn element_step(&self) -> Option<ElementStep> {
        let op = match self.op {
            Arith::Add => ArithOp::Add,
            Arith::Sub => ArithOp::Sub,
            Arith::Mul => ArithOp::Mul,
            Arith::Div => ArithOp::Div,
            _ => return None,
        };
        self.legacy_axis.is_none().then_some(ElementStep::Arith(op))
    }

    fn reusable_inputs(&self) -> &[usize] {
        if self.legacy_axis.is_none() {
            &[0, 1]
        } else {
            &[]
        }
    }

    fn run_reusing(
        &self,
        inputs: &[Option<&Tensor>],
        i: usize,
        mut owned: Tensor,
    ) -> Result<Vec<Tensor>, OpError> {
        let other = input(inputs, if i == 0 { 1 } else { 0 })?;
        if let (Tensor::F32(d), Tensor::F32(o)) = (&mut owned, other) {
            let a_first = i == 0;
            let done = match self.op {
                Arith::Add => binary_in_place(d, o, a_first, Num::add),
                Arith::Sub => binary_in_place(d, o, a_first, Num::sub),
                Arith::Mul => binary_in_place(d, o, a_first, Num::mul),
                Arith::Div => binary_in_place(d, o, a_first, Num::div),
                _ => false,
            };
            if done {
                return Ok(vec![owned]);
            }
        }
        run_not_reusing(self, inputs, i, owned)
    }
}

pub(super) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>> {
    let op = spec.op_type;
    let arith_op = match op {
        "Add" => Some(Arith::Add),
        "Sub" => Some(Arith::Sub),
        "Mul" => Some(Arith::Mul),
        "Div" => Some(Arith::Div),
        _ => None,
    };
    let cmp_op = match op {
        "Equal" => Some(Cmp::Equal),
        "Less" => Some(Cmp::Less),
        "LessOrEqual" => Some(Cmp::LessOrEqual),
        "Greater" => Some(Cmp::Greater),
        "GreaterOrEqual" => Some(Cmp::GreaterOrEqual),
        _ => None,
    };
    let legacy =
        arith_op.is_some() || cmp_op.is_some() || matches!(op, "Pow" | "And" | "Or" | "Xor");
    let legacy_axis = match (
        legacy && spec.opset < 7,
        spec.attrs.int_or("broadcast", 0),
        spec.attrs.int("axis"),
    ) {
        (true, Ok(1), Ok(axis)) => axis,
        (true, Err(e), _) | (true, _, Err(e)) => return Some(Err(e)),
        _ => None,
    };
    if let Some(op) = arith_op {
        return Some(Ok(Box::new(ArithKernel { op, legacy_axis })));
    }
    if let Some(c) = cmp_op {
        return Some(two(legacy_axis, move |x, y| compare(c, x, y)));
    }
    Some(match op {
        "Pow" => two(legacy_axis, pow),
        "Mod" => match spec.attrs.int_or("fmod", 0) {
            Ok(0) => two(legacy_axis, |x, y| arith(Arith::Mod, x, y)),
            Ok(1) => two(legacy_axis, |x, y| arith(Arith::FMod, x, y)),
            Ok(v) => Err(OpError::invalid(format!("Mod fmod={v}"))),
            Err(e) => Err(e),
        },
        "BitShift" => match spec.attrs.string("direction") {
            Ok(Some(d)) if d == "LEFT" => two(legacy_axis, |x, y| bit_shift(true, x, y)),
            Ok(Some(d)) if d == "RIGHT" => two(legacy_axis, |x, y| bit_shift(false, x, y)),
            Ok(d) => Err(OpError::invalid(format!("BitShift direction {d:?}"))),
            Err(e) => Err(e),
        },
        "And" | "Or" | "Xor" => {
            let name = op.to_string();
            two(legacy_axis, move |x, y| logic(&name, x, y))
        }
        "PRelu" => Ok(Box::new(PReluKernel {
            legacy_axis,
            per_channel: spec.opset < 7,
        })),
        "Where" => Ok(Box::new(|inputs: &[Option<&Tensor>]| {
            Ok(vec![where_(
                input(inputs, 0)?,
                input(inputs, 1)?,
                input(inputs, 2)?,
            )?])
        })),
        "Min" | "Max" | "Sum" | "Mean" => {
            let name = op.to_string();
            Ok(Box::new(move |inputs: &[Option<&Tensor>]| {
                Ok(vec![variadic(&name, inputs)?])
            }))
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values with both zeros, NaN, infinities and a plane length off the vector width.
    fn values(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| match i % 11 {
                0 => f32::NAN,
                1 => -0.0,
                2 => 0.0,
                3 => f32::NEG_INFINITY,
                4 => f32::INFINITY,
                r => (r as f32 - 7.5) * 0.37,
            })
            .collect()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.as_f32().unwrap().iter().map(|v| v.to_bits()).collect()
    }

    /// The per-plane path gives the generic broadcast's bits, per channel (as a
    /// `[C, 1, 1]` slope, as a `[C]` slope before opset 7, and on `[N, C]` input) and
    /// with one slope.
    #[test]
    fn prelu_planes_match_the_broadcast() {
        let x = Tensor::from_f32(&[2, 3, 5, 7], values(210)).unwrap();
        let flat = Tensor::from_f32(&[4, 6], values(24)).unwrap();
        let cases = [
            (&x, vec![3, 1, 1], false),
            (&x, vec![3], true),
            (&x, vec![1], false),
            (&flat, vec![6], false),
        ];
        for (x, slope_shape, legacy) in cases {
            let n: usize = slope_shape.iter().product();
            let k: Vec<f32> = (0..n).map(|i| 0.25 - 0.5 * i as f32).collect();
            let slope = Tensor::from_f32(&slope_shape, k).unwrap();
            let kernel = PReluKernel {
                legacy_axis: None,
                per_channel: legacy,
            };
            let fast = kernel.run(&[Some(x), Some(&slope)]).unwrap();
            let fits = prelu_slope(x.shape(), &slope, legacy).unwrap();
            let generic = prelu(x, &fits).unwrap();
            let (Tensor::F32(xa), Tensor::F32(ka)) = (x, &*fits) else {
                unreachable!()
            };
            assert!(
                prelu_planes(xa, ka).is_some(),
                "{slope_shape:?} takes the plane path"
            );
            assert_eq!(fast[0].shape(), generic.shape());
            assert_eq!(bits(&fast[0]), bits(&generic), "slope {slope_shape:?}");
        }
    }
}
