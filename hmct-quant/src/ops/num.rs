//! Element-type traits, dtype dispatch and scalar operands, shared by the
//! element-wise, reduction and shape kernels.
//!
//! [`Num`] gives every numeric ONNX type the arithmetic ONNX defines for it (integers
//! wrap, integer division truncates), so one generic kernel body serves all of them.
//! [`Real`] is the transcendental math of `f32`/`f64`; half-precision types are
//! widened to `f32`, computed and rounded once.

use half::{bf16, f16};
use hmct_tensor::ndarray::ArrayD;
use hmct_tensor::{DType, Tensor};

use crate::ops::OpError;

/// Arithmetic on a numeric element type, as ONNX defines it for that type.
pub(crate) trait Num:
    Copy + Send + Sync + Default + PartialOrd + std::fmt::Debug + TensorElem + 'static
{
    const FLOAT: bool;
    const ZERO: Self;
    const ONE: Self;
    /// `-inf` for floats, the minimum for integers (identity of max-reductions).
    const LOWEST: Self;
    /// `+inf` for floats, the maximum for integers (identity of min-reductions).
    const HIGHEST: Self;

    /// Wrapping for integers.
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    /// Truncating for integers; an integer division by zero gives 0 (ONNX leaves it
    /// undefined and a kernel must not trap).
    fn div(self, o: Self) -> Self;
    /// Remainder with the sign of the dividend (C `fmod`).
    fn fmod(self, o: Self) -> Self;
    /// Remainder with the sign of the divisor (Python `%`).
    fn floor_mod(self, o: Self) -> Self;
    fn neg(self) -> Self;
    fn abs(self) -> Self;
    fn signum(self) -> Self;
    fn is_nan(self) -> bool;
    fn to_f64(self) -> f64;
    /// Saturating (`as`) conversion.
    fn from_f64(v: f64) -> Self;
    fn to_i64(self) -> i64;
    /// Wrapping (`as`) conversion.
    fn from_i64(v: i64) -> Self;

    /// NaN-propagating maximum (numpy `maximum`).
    #[inline(always)]
    fn max_nan(self, o: Self) -> Self {
        if self.is_nan() || self >= o { self } else { o }
    }

    /// NaN-propagating minimum (numpy `minimum`).
    #[inline(always)]
    fn min_nan(self, o: Self) -> Self {
        if self.is_nan() || self <= o { self } else { o }
    }
}

macro_rules! impl_int {
    ($($t:ty),*) => {$(
        impl Num for $t {
            const FLOAT: bool = false;
            const ZERO: Self = 0;
            const ONE: Self = 1;
            const LOWEST: Self = <$t>::MIN;
            const HIGHEST: Self = <$t>::MAX;
            #[inline(always)] fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline(always)] fn sub(self, o: Self) -> Self { self.wrapping_sub(o) }
            #[inline(always)] fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            #[inline(always)]
            fn div(self, o: Self) -> Self {
                if o == 0 { 0 } else { self.wrapping_div(o) }
            }
            #[inline(always)]
            fn fmod(self, o: Self) -> Self {
                if o == 0 { 0 } else { self.wrapping_rem(o) }
            }
            #[inline(always)]
            #[allow(unused_comparisons)]
            fn floor_mod(self, o: Self) -> Self {
                if o == 0 {
                    return 0;
                }
                let r = self.wrapping_rem(o);
                if r != 0 && ((r < 0) != (o < 0)) { r.wrapping_add(o) } else { r }
            }
            #[inline(always)] fn neg(self) -> Self { (0 as $t).wrapping_sub(self) }
            #[inline(always)]
            #[allow(unused_comparisons)]
            fn abs(self) -> Self { if self < 0 { self.neg() } else { self } }
            #[inline(always)]
            #[allow(unused_comparisons)]
            fn signum(self) -> Self {
                if self > 0 { 1 } else if self < 0 { (0 as $t).wrapping_sub(1) } else { 0 }
            }
            #[inline(always)] fn is_nan(self) -> bool { false }
            #[inline(always)] fn to_f64(self) -> f64 { self as f64 }
            #[inline(always)] fn from_f64(v: f64) -> Self { v as $t }
            #[inline(always)] fn to_i64(self) -> i64 { self as i64 }
            #[inline(always)] fn from_i64(v: i64) -> Self { v as $t }
        }
    )*};
}
impl_int!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! impl_float {
    ($($t:ty),*) => {$(
        impl Num for $t {
            const FLOAT: bool = true;
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const LOWEST: Self = <$t>::NEG_INFINITY;
            const HIGHEST: Self = <$t>::INFINITY;
            #[inline(always)] fn add(self, o: Self) -> Self { self + o }
            #[inline(always)] fn sub(self, o: Self) -> Self { self - o }
            #[inline(always)] fn mul(self, o: Self) -> Self { self * o }
            #[inline(always)] fn div(self, o: Self) -> Self { self / o }
            #[inline(always)] fn fmod(self, o: Self) -> Self { self % o }
            #[inline(always)]
            fn floor_mod(self, o: Self) -> Self {
                // numpy `mod`: a zero result takes the divisor's sign.
                let r = self % o;
                if r == 0.0 {
                    (0.0 as $t).copysign(o)
                } else if (r < 0.0) != (o < 0.0) {
                    r + o
                } else {
                    r
                }
            }
            #[inline(always)] fn neg(self) -> Self { -self }
            #[inline(always)] fn abs(self) -> Self { self.abs() }
            #[inline(always)]
            fn signum(self) -> Self {
                if self > 0.0 { 1.0 } else if self < 0.0 { -1.0 } else { self }
            }
            #[inline(always)] fn is_nan(self) -> bool { self.is_nan() }
            #[inline(always)] fn to_f64(self) -> f64 { self as f64 }
            #[inline(always)] fn from_f64(v: f64) -> Self { v as $t }
            #[inline(always)] fn to_i64(self) -> i64 { self as i64 }
            #[inline(always)] fn from_i64(v: i64) -> Self { v as $t }
        }
    )*};
}
impl_float!(f32, f64);

macro_rules! impl_half {
    ($($t:ty),*) => {$(
        impl Num for $t {
            const FLOAT: bool = true;
            const ZERO: Self = <$t>::ZERO;
            const ONE: Self = <$t>::ONE;
            const LOWEST: Self = <$t>::NEG_INFINITY;
            const HIGHEST: Self = <$t>::INFINITY;
            #[inline(always)] fn add(self, o: Self) -> Self { self + o }
            #[inline(always)] fn sub(self, o: Self) -> Self { self - o }
            #[inline(always)] fn mul(self, o: Self) -> Self { self * o }
            #[inline(always)] fn div(self, o: Self) -> Self { self / o }
            #[inline(always)] fn fmod(self, o: Self) -> Self { self % o }
            #[inline(always)]
            fn floor_mod(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32().floor_mod(o.to_f32()))
            }
            #[inline(always)] fn neg(self) -> Self { -self }
            #[inline(always)] fn abs(self) -> Self { <$t>::from_f32(self.to_f32().abs()) }
            #[inline(always)]
            fn signum(self) -> Self { <$t>::from_f32(Num::signum(self.to_f32())) }
            #[inline(always)] fn is_nan(self) -> bool { self.is_nan() }
            #[inline(always)] fn to_f64(self) -> f64 { self.to_f64() }
            #[inline(always)] fn from_f64(v: f64) -> Self { <$t>::from_f64(v) }
            #[inline(always)] fn to_i64(self) -> i64 { self.to_f32() as i64 }
            #[inline(always)] fn from_i64(v: i64) -> Self { <$t>::from_f64(v as f64) }
        }
    )*};
}
impl_half!(f16, bf16);

/// Transcendental math of the two native float types.
pub(crate) trait Real: Num + num_traits::Float {
    fn erf(self) -> Self;
    fn from_f32c(v: f32) -> Self;
    /// Round half to even (ONNX `Round`).
    fn round_even(self) -> Self;
    /// `exp` for kernels where a vectorizable 2-ulp f32 version is worth it.
    fn exp_fast(self) -> Self;
}

impl Real for f32 {
    #[inline(always)]
    fn erf(self) -> Self {
        super::fastmath::erf_f32(self)
    }
    #[inline(always)]
    fn exp_fast(self) -> Self {
        super::fastmath::exp_f32(self)
    }
    #[inline(always)]
    fn round_even(self) -> Self {
        self.round_ties_even()
    }
    #[inline(always)]
    fn from_f32c(v: f32) -> Self {
        v
    }
}

impl Real for f64 {
    #[inline(always)]
    fn erf(self) -> Self {
        libm::erf(self)
    }
    #[inline(always)]
    fn exp_fast(self) -> Self {
        self.exp()
    }
    #[inline(always)]
    fn round_even(self) -> Self {
        self.round_ties_even()
    }
    #[inline(always)]
    fn from_f32c(v: f32) -> Self {
        v as f64
    }
}

/// Element types that have a [`Tensor`] variant: typed access without a `match`.
pub(crate) trait TensorElem: Clone + Send + Sync + 'static {
    const DTYPE: DType;
    fn view(t: &Tensor) -> Option<&ArrayD<Self>>;
    fn wrap(a: ArrayD<Self>) -> Tensor;
}

macro_rules! impl_tensor_elem {
    ($($t:ty => $v:ident),*) => {$(
        impl TensorElem for $t {
            const DTYPE: DType = DType::$v;
            #[inline]
            fn view(t: &Tensor) -> Option<&ArrayD<Self>> {
                match t {
                    Tensor::$v(a) => Some(a),
                    _ => None,
                }
            }
            #[inline]
            fn wrap(a: ArrayD<Self>) -> Tensor {
                Tensor::$v(a)
            }
        }
    )*};
}
impl_tensor_elem!(f32 => F32, f64 => F64, f16 => F16, bf16 => BF16, i8 => I8, i16 => I16,
    i32 => I32, i64 => I64, u8 => U8, u16 => U16, u32 => U32, u64 => U64, bool => Bool,
    String => String);

/// `t` as an array of `T`, or an error naming `what` when its type differs.
pub(crate) fn typed<'a, T: TensorElem>(
    t: &'a Tensor,
    what: &str,
) -> Result<&'a ArrayD<T>, OpError> {
    T::view(t).ok_or_else(|| {
        OpError::invalid(format!(
            "{what} has type {}, expected the type of the data input",
            t.dtype()
        ))
    })
}

/// Half-precision types, computed through `f32`.
pub(crate) trait Half: Num {
    fn to_f32h(self) -> f32;
    fn from_f32h(v: f32) -> Self;
}

impl Half for f16 {
    #[inline(always)]
    fn to_f32h(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn from_f32h(v: f32) -> Self {
        f16::from_f32(v)
    }
}

impl Half for bf16 {
    #[inline(always)]
    fn to_f32h(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn from_f32h(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

/// Runs `$body` with `$a` bound to the inner array of a numeric tensor; other tensors
/// go to the `$other` arm.
macro_rules! with_num {
    ($t:expr, $a:ident => $body:expr, $other:pat => $fallback:expr) => {
        match $t {
            hmct_tensor::Tensor::F32($a) => $body,
            hmct_tensor::Tensor::F64($a) => $body,
            hmct_tensor::Tensor::F16($a) => $body,
            hmct_tensor::Tensor::BF16($a) => $body,
            hmct_tensor::Tensor::I8($a) => $body,
            hmct_tensor::Tensor::I16($a) => $body,
            hmct_tensor::Tensor::I32($a) => $body,
            hmct_tensor::Tensor::I64($a) => $body,
            hmct_tensor::Tensor::U8($a) => $body,
            hmct_tensor::Tensor::U16($a) => $body,
            hmct_tensor::Tensor::U32($a) => $body,
            hmct_tensor::Tensor::U64($a) => $body,
            $other => $fallback,
        }
    };
}
pub(crate) use with_num;

/// Like [`with_num!`] for two tensors of the same numeric type.
macro_rules! with_num2 {
    ($x:expr, $y:expr, ($a:ident, $b:ident) => $body:expr, $other:pat => $fallback:expr) => {
        match ($x, $y) {
            (hmct_tensor::Tensor::F32($a), hmct_tensor::Tensor::F32($b)) => $body,
            (hmct_tensor::Tensor::F64($a), hmct_tensor::Tensor::F64($b)) => $body,
            (hmct_tensor::Tensor::F16($a), hmct_tensor::Tensor::F16($b)) => $body,
            (hmct_tensor::Tensor::BF16($a), hmct_tensor::Tensor::BF16($b)) => $body,
            (hmct_tensor::Tensor::I8($a), hmct_tensor::Tensor::I8($b)) => $body,
            (hmct_tensor::Tensor::I16($a), hmct_tensor::Tensor::I16($b)) => $body,
            (hmct_tensor::Tensor::I32($a), hmct_tensor::Tensor::I32($b)) => $body,
            (hmct_tensor::Tensor::I64($a), hmct_tensor::Tensor::I64($b)) => $body,
            (hmct_tensor::Tensor::U8($a), hmct_tensor::Tensor::U8($b)) => $body,
            (hmct_tensor::Tensor::U16($a), hmct_tensor::Tensor::U16($b)) => $body,
            (hmct_tensor::Tensor::U32($a), hmct_tensor::Tensor::U32($b)) => $body,
            (hmct_tensor::Tensor::U64($a), hmct_tensor::Tensor::U64($b)) => $body,
            $other => $fallback,
        }
    };
}
pub(crate) use with_num2;

/// Like [`map_tensor!`](hmct_tensor::map_tensor) for two tensors of the same type
/// (any type, strings and bools included).
macro_rules! with_same2 {
    ($x:expr, $y:expr, ($a:ident, $b:ident) => $body:expr, $other:pat => $fallback:expr) => {
        match ($x, $y) {
            (hmct_tensor::Tensor::F32($a), hmct_tensor::Tensor::F32($b)) => $body,
            (hmct_tensor::Tensor::F64($a), hmct_tensor::Tensor::F64($b)) => $body,
            (hmct_tensor::Tensor::F16($a), hmct_tensor::Tensor::F16($b)) => $body,
            (hmct_tensor::Tensor::BF16($a), hmct_tensor::Tensor::BF16($b)) => $body,
            (hmct_tensor::Tensor::I8($a), hmct_tensor::Tensor::I8($b)) => $body,
            (hmct_tensor::Tensor::I16($a), hmct_tensor::Tensor::I16($b)) => $body,
            (hmct_tensor::Tensor::I32($a), hmct_tensor::Tensor::I32($b)) => $body,
            (hmct_tensor::Tensor::I64($a), hmct_tensor::Tensor::I64($b)) => $body,
            (hmct_tensor::Tensor::U8($a), hmct_tensor::Tensor::U8($b)) => $body,
            (hmct_tensor::Tensor::U16($a), hmct_tensor::Tensor::U16($b)) => $body,
            (hmct_tensor::Tensor::U32($a), hmct_tensor::Tensor::U32($b)) => $body,
            (hmct_tensor::Tensor::U64($a), hmct_tensor::Tensor::U64($b)) => $body,
            (hmct_tensor::Tensor::Bool($a), hmct_tensor::Tensor::Bool($b)) => $body,
            (hmct_tensor::Tensor::String($a), hmct_tensor::Tensor::String($b)) => $body,
            $other => $fallback,
        }
    };
}
pub(crate) use with_same2;

/// The single value of a bound tensor (ONNX says scalar; exporters also write `[1]`).
pub(crate) fn scalar_of<T: Clone>(a: &ArrayD<T>, what: &str) -> Result<T, OpError> {
    match a.iter().next() {
        Some(v) if a.len() == 1 => Ok(v.clone()),
        _ => Err(OpError::invalid(format!(
            "{what} must be a scalar, got shape {:?}",
            a.shape()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_division_truncates_and_never_traps() {
        assert_eq!(Num::div(-7i32, 2), -3);
        assert_eq!(Num::div(7u8, 0), 0);
        assert_eq!(Num::div(i8::MIN, -1), i8::MIN);
    }

    #[test]
    fn remainders_follow_dividend_or_divisor_sign() {
        assert_eq!(Num::fmod(-7i32, 3), -1);
        assert_eq!(Num::floor_mod(-7i32, 3), 2);
        assert_eq!(Num::floor_mod(7i32, -3), -2);
        assert_eq!(Num::floor_mod(-7.5f32, 2.0), 0.5);
        assert_eq!(Num::fmod(-7.5f32, 2.0), -1.5);
        assert!(Num::floor_mod(0.0f32, -2.0).is_sign_negative());
        assert_eq!(Num::floor_mod(-3.0f64, f64::INFINITY), f64::INFINITY);
        assert_eq!(Num::floor_mod(3.0f64, f64::INFINITY), 3.0);
    }

    #[test]
    fn max_and_min_propagate_nan() {
        assert!(Num::max_nan(f32::NAN, 1.0).is_nan());
        assert!(Num::max_nan(1.0, f32::NAN).is_nan());
        assert!(Num::min_nan(1.0f64, f64::NAN).is_nan());
        assert_eq!(Num::max_nan(2i64, 3), 3);
    }
}
