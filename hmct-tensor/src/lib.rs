//! Typed n-dimensional tensors shared by every crate of the workspace: the element
//! types ONNX models use, conversion from and to ONNX `TensorProto` (typed fields,
//! `raw_data`, external data), and `.npy` files (calibration data, outputs).
//!
//! A [`Tensor`] is an enum of `ndarray::ArrayD` per element type. Arrays built here are
//! always in standard (row-major, contiguous) layout, so kernels can take slices.

mod dataset;
mod dtype;
mod npy;
mod proto;

pub use dataset::{Dataset, InputSpec, sanitize_name};
pub use dtype::DType;
pub use half::{bf16, f16};
pub use ndarray;
pub use npy::{read_npy, read_npy_bytes, write_npy, write_npy_bytes};
pub use proto::{tensor_from_proto, tensor_to_proto};

use ndarray::{ArrayD, IxDyn};

/// Errors of tensor conversion and I/O. Each names what was being read; an I/O
/// error is the `source` of [`TensorError::Io`], not part of its message.
#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    #[error("{context}: unsupported element type {dtype}")]
    UnsupportedType { context: String, dtype: String },
    #[error("{context}: {message}")]
    Invalid { context: String, message: String },
    #[error("{path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl TensorError {
    pub(crate) fn invalid(context: impl Into<String>, message: impl Into<String>) -> Self {
        TensorError::Invalid {
            context: context.into(),
            message: message.into(),
        }
    }
}

/// A tensor of one of the element types ONNX models use.
#[derive(Clone, Debug, PartialEq)]
pub enum Tensor {
    F32(ArrayD<f32>),
    F64(ArrayD<f64>),
    F16(ArrayD<f16>),
    BF16(ArrayD<bf16>),
    I8(ArrayD<i8>),
    I16(ArrayD<i16>),
    I32(ArrayD<i32>),
    I64(ArrayD<i64>),
    U8(ArrayD<u8>),
    U16(ArrayD<u16>),
    U32(ArrayD<u32>),
    U64(ArrayD<u64>),
    Bool(ArrayD<bool>),
    String(ArrayD<String>),
}

/// Runs `$body` with `$a` bound to the inner array, whatever the element type.
#[macro_export]
macro_rules! map_tensor {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            $crate::Tensor::F32($a) => $body,
            $crate::Tensor::F64($a) => $body,
            $crate::Tensor::F16($a) => $body,
            $crate::Tensor::BF16($a) => $body,
            $crate::Tensor::I8($a) => $body,
            $crate::Tensor::I16($a) => $body,
            $crate::Tensor::I32($a) => $body,
            $crate::Tensor::I64($a) => $body,
            $crate::Tensor::U8($a) => $body,
            $crate::Tensor::U16($a) => $body,
            $crate::Tensor::U32($a) => $body,
            $crate::Tensor::U64($a) => $body,
            $crate::Tensor::Bool($a) => $body,
            $crate::Tensor::String($a) => $body,
        }
    };
}

/// Like [`map_tensor!`] but rebuilds a tensor of the same variant from `$body`,
/// which must produce an `ArrayD` of the same element type.
#[macro_export]
macro_rules! map_tensor_same {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            $crate::Tensor::F32($a) => $crate::Tensor::F32($body),
            $crate::Tensor::F64($a) => $crate::Tensor::F64($body),
            $crate::Tensor::F16($a) => $crate::Tensor::F16($body),
            $crate::Tensor::BF16($a) => $crate::Tensor::BF16($body),
            $crate::Tensor::I8($a) => $crate::Tensor::I8($body),
            $crate::Tensor::I16($a) => $crate::Tensor::I16($body),
            $crate::Tensor::I32($a) => $crate::Tensor::I32($body),
            $crate::Tensor::I64($a) => $crate::Tensor::I64($body),
            $crate::Tensor::U8($a) => $crate::Tensor::U8($body),
            $crate::Tensor::U16($a) => $crate::Tensor::U16($body),
            $crate::Tensor::U32($a) => $crate::Tensor::U32($body),
            $crate::Tensor::U64($a) => $crate::Tensor::U64($body),
            $crate::Tensor::Bool($a) => $crate::Tensor::Bool($body),
            $crate::Tensor::String($a) => $crate::Tensor::String($body),
        }
    };
}

impl Tensor {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Tensor::F32(_) => DType::F32,
            Tensor::F64(_) => DType::F64,
            Tensor::F16(_) => DType::F16,
            Tensor::BF16(_) => DType::BF16,
            Tensor::I8(_) => DType::I8,
            Tensor::I16(_) => DType::I16,
            Tensor::I32(_) => DType::I32,
            Tensor::I64(_) => DType::I64,
            Tensor::U8(_) => DType::U8,
            Tensor::U16(_) => DType::U16,
            Tensor::U32(_) => DType::U32,
            Tensor::U64(_) => DType::U64,
            Tensor::Bool(_) => DType::Bool,
            Tensor::String(_) => DType::String,
        }
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        map_tensor!(self, a => a.shape())
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        map_tensor!(self, a => a.len())
    }

    /// True when the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of element storage (strings count their UTF-8 bytes).
    pub fn nbytes(&self) -> usize {
        match self {
            Tensor::String(a) => a.iter().map(|s| s.len()).sum(),
            _ => self.len() * self.dtype().size_of().unwrap_or(0),
        }
    }

    /// A scalar f32 tensor.
    pub fn scalar_f32(v: f32) -> Tensor {
        Tensor::F32(ArrayD::from_elem(IxDyn(&[]), v))
    }

    /// An f32 tensor from a shape and row-major data.
    pub fn from_f32(shape: &[usize], data: Vec<f32>) -> Result<Tensor, TensorError> {
        ArrayD::from_shape_vec(IxDyn(shape), data)
            .map(Tensor::F32)
            .map_err(|e| TensorError::invalid("tensor", e.to_string()))
    }

    /// An i64 tensor from a shape and row-major data.
    pub fn from_i64(shape: &[usize], data: Vec<i64>) -> Result<Tensor, TensorError> {
        ArrayD::from_shape_vec(IxDyn(shape), data)
            .map(Tensor::I64)
            .map_err(|e| TensorError::invalid("tensor", e.to_string()))
    }

    /// The f32 array, if this is an f32 tensor.
    pub fn as_f32(&self) -> Option<&ArrayD<f32>> {
        match self {
            Tensor::F32(a) => Some(a),
            _ => None,
        }
    }

    /// The f32 array, mutably, if this is an f32 tensor.
    pub fn as_f32_mut(&mut self) -> Option<&mut ArrayD<f32>> {
        match self {
            Tensor::F32(a) => Some(a),
            _ => None,
        }
    }

    /// The i64 array, if this is an i64 tensor.
    pub fn as_i64(&self) -> Option<&ArrayD<i64>> {
        match self {
            Tensor::I64(a) => Some(a),
            _ => None,
        }
    }

    /// Elements as i64 for any integer or bool tensor (shape inputs, indices, axes).
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        Some(match self {
            Tensor::I64(a) => a.iter().copied().collect(),
            Tensor::I32(a) => a.iter().map(|&v| v as i64).collect(),
            Tensor::I16(a) => a.iter().map(|&v| v as i64).collect(),
            Tensor::I8(a) => a.iter().map(|&v| v as i64).collect(),
            Tensor::U8(a) => a.iter().map(|&v| v as i64).collect(),
            Tensor::U16(a) => a.iter().map(|&v| v as i64).collect(),
            Tensor::U32(a) => a.iter().map(|&v| v as i64).collect(),
            Tensor::U64(a) => a.iter().map(|&v| v as i64).collect(),
            Tensor::Bool(a) => a.iter().map(|&v| v as i64).collect(),
            _ => return None,
        })
    }

    /// Elements converted to f64 for any numeric tensor (statistics, comparisons).
    pub fn to_f64_vec(&self) -> Option<Vec<f64>> {
        Some(match self {
            Tensor::F32(a) => a.iter().map(|&v| v as f64).collect(),
            Tensor::F64(a) => a.iter().copied().collect(),
            Tensor::F16(a) => a.iter().map(|v| v.to_f64()).collect(),
            Tensor::BF16(a) => a.iter().map(|v| v.to_f64()).collect(),
            Tensor::String(_) => return None,
            other => other.to_i64_vec()?.into_iter().map(|v| v as f64).collect(),
        })
    }

    /// Returns the tensor in standard (row-major contiguous) layout.
    pub fn into_standard_layout(self) -> Tensor {
        map_tensor_same!(self, a => if a.is_standard_layout() { a } else { a.as_standard_layout().into_owned() })
    }
}

macro_rules! impl_from_array {
    ($($t:ty => $v:ident),*) => {$(
        impl From<ArrayD<$t>> for Tensor {
            fn from(a: ArrayD<$t>) -> Tensor { Tensor::$v(a) }
        }
    )*};
}
impl_from_array!(f32 => F32, f64 => F64, f16 => F16, bf16 => BF16, i8 => I8, i16 => I16,
    i32 => I32, i64 => I64, u8 => U8, u16 => U16, u32 => U32, u64 => U64, bool => Bool,
    String => String);
