//! ONNX `TensorProto` ⇄ [`Tensor`].

use std::path::Path;

use half::{bf16, f16};
use hmct_proto::onnx::TensorProto;
use ndarray::{ArrayD, IxDyn};

use crate::{DType, Tensor, TensorError};

/// Reads a `TensorProto` (typed fields, `raw_data` or external data) into a tensor.
///
/// `base_dir` is the folder of the model file; external data locations are relative
/// to it. Without it, a tensor stored externally is an error.
pub fn tensor_from_proto(t: &TensorProto, base_dir: Option<&Path>) -> Result<Tensor, TensorError> {
    let ctx = format!("tensor '{}'", t.name());
    let code = t.data_type();
    let dtype = DType::from_onnx(code).ok_or_else(|| TensorError::UnsupportedType {
        context: ctx.clone(),
        dtype: DType::onnx_code_name(code),
    })?;
    let mut shape = Vec::with_capacity(t.dims.len());
    for &d in &t.dims {
        if d < 0 {
            return Err(TensorError::invalid(
                &ctx,
                format!("negative dimension {d}"),
            ));
        }
        shape.push(d as usize);
    }
    let count = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| TensorError::invalid(&ctx, "element count overflows"))?;

    let external;
    let raw: Option<&[u8]> =
        if t.data_location() == hmct_proto::onnx::tensor_proto::DataLocation::External {
            external = read_external(t, base_dir, &ctx)?;
            Some(&external)
        } else {
            t.raw_data.as_deref()
        };

    if let Some(raw) = raw {
        if dtype == DType::String {
            return Err(TensorError::invalid(
                &ctx,
                "string tensor stored as raw_data",
            ));
        }
        let size = dtype.size_of().unwrap_or(1);
        if raw.len() != count * size {
            return Err(TensorError::invalid(
                &ctx,
                format!(
                    "raw_data has {} bytes, shape {:?} of {} needs {}",
                    raw.len(),
                    shape,
                    dtype,
                    count * size
                ),
            ));
        }
        return Ok(from_le_bytes(dtype, &shape, raw));
    }

    let check = |n: usize| -> Result<(), TensorError> {
        if n == count {
            Ok(())
        } else {
            Err(TensorError::invalid(
                &ctx,
                format!("holds {n} values, shape {shape:?} needs {count}"),
            ))
        }
    };
    let arr = |v| ArrayD::from_shape_vec(IxDyn(&shape), v).expect("length checked");
    let i32s = &t.int32_data;
    Ok(match dtype {
        DType::F32 => {
            check(t.float_data.len())?;
            Tensor::F32(arr(t.float_data.clone()))
        }
        DType::F64 => {
            check(t.double_data.len())?;
            Tensor::F64(
                ArrayD::from_shape_vec(IxDyn(&shape), t.double_data.clone()).expect("checked"),
            )
        }
        DType::I64 => {
            check(t.int64_data.len())?;
            Tensor::I64(
                ArrayD::from_shape_vec(IxDyn(&shape), t.int64_data.clone()).expect("checked"),
            )
        }
        DType::U32 | DType::U64 => {
            check(t.uint64_data.len())?;
            let v = &t.uint64_data;
            if dtype == DType::U32 {
                Tensor::U32(
                    ArrayD::from_shape_vec(IxDyn(&shape), v.iter().map(|&x| x as u32).collect())
                        .expect("checked"),
                )
            } else {
                Tensor::U64(ArrayD::from_shape_vec(IxDyn(&shape), v.clone()).expect("checked"))
            }
        }
        DType::String => {
            check(t.string_data.len())?;
            let v = t
                .string_data
                .iter()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .collect();
            Tensor::String(ArrayD::from_shape_vec(IxDyn(&shape), v).expect("checked"))
        }
        _ => {
            check(i32s.len())?;
            let sh = IxDyn(&shape);
            match dtype {
                DType::I32 => {
                    Tensor::I32(ArrayD::from_shape_vec(sh, i32s.clone()).expect("checked"))
                }
                DType::I16 => Tensor::I16(
                    ArrayD::from_shape_vec(sh, i32s.iter().map(|&x| x as i16).collect())
                        .expect("checked"),
                ),
                DType::I8 => Tensor::I8(
                    ArrayD::from_shape_vec(sh, i32s.iter().map(|&x| x as i8).collect())
                        .expect("checked"),
                ),
                DType::U16 => Tensor::U16(
                    ArrayD::from_shape_vec(sh, i32s.iter().map(|&x| x as u16).collect())
                        .expect("checked"),
                ),
                DType::U8 => Tensor::U8(
                    ArrayD::from_shape_vec(sh, i32s.iter().map(|&x| x as u8).collect())
                        .expect("checked"),
                ),
                DType::Bool => Tensor::Bool(
                    ArrayD::from_shape_vec(sh, i32s.iter().map(|&x| x != 0).collect())
                        .expect("checked"),
                ),
                DType::F16 => Tensor::F16(
                    ArrayD::from_shape_vec(
                        sh,
                        i32s.iter().map(|&x| f16::from_bits(x as u16)).collect(),
                    )
                    .expect("checked"),
                ),
                DType::BF16 => Tensor::BF16(
                    ArrayD::from_shape_vec(
                        sh,
                        i32s.iter().map(|&x| bf16::from_bits(x as u16)).collect(),
                    )
                    .expect("checked"),
                ),
                _ => unreachable!("all other types handled above"),
            }
        }
    })
}

fn read_external(
    t: &TensorProto,
    base_dir: Option<&Path>,
    ctx: &str,
) -> Result<ExternalBytes, TensorError> {
    let mut location = None;
    let mut offset = 0u64;
    let mut length = None;
    for e in &t.external_data {
        let value = e.value();
        match e.key() {
            "location" => location = Some(value.to_string()),
            "offset" => {
                offset = value.parse().map_err(|_| {
                    TensorError::invalid(
                        ctx,
                        format!("external data offset '{value}' is not a number"),
                    )
                })?
            }
            "length" => {
                length = Some(value.parse::<u64>().map_err(|_| {
                    TensorError::invalid(
                        ctx,
                        format!("external data length '{value}' is not a number"),
                    )
                })?)
            }
            _ => {}
        }
    }
    let location =
        location.ok_or_else(|| TensorError::invalid(ctx, "external data without a location"))?;
    let rel = Path::new(&location);
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(TensorError::invalid(
            ctx,
            format!("external data location '{location}' leaves the model's folder"),
        ));
    }
    let base = base_dir.ok_or_else(|| {
        TensorError::invalid(
            ctx,
            format!(
                "stored in external file '{location}' but the model was not loaded from a file"
            ),
        )
    })?;
    let path = base.join(rel);
    let io = |source| TensorError::Io {
        path: path.display().to_string(),
        source,
    };
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(&path).map_err(io)?;
    let file_len = f.metadata().map_err(io)?.len();
    let len = match length {
        Some(l) => l,
        None => file_len.saturating_sub(offset),
    };
    if offset.checked_add(len).is_none_or(|end| end > file_len) {
        return Err(TensorError::invalid(
            ctx,
            format!(
                "external data {}: offset {offset} + length {len} exceeds file size {file_len}",
                path.display()
            ),
        ));
    }
    let len = usize::try_from(len)
        .map_err(|_| TensorError::invalid(ctx, format!("external data length {len} is too big")))?;
    if len < MAP_MIN_BYTES {
        f.seek(SeekFrom::Start(offset)).map_err(io)?;
        let mut buf = vec![0u8; len];
        f.read_exact(&mut buf).map_err(io)?;
        return Ok(ExternalBytes::Read(buf));
    }
    // SAFETY: the mapping is read-only and lives only while this tensor is decoded.
    // Another process truncating the file meanwhile would fault the read, the risk
    // every memory-mapping model loader (onnxruntime's too) takes for not holding a
    // second copy of a multi-gigabyte weight file.
    let map = unsafe { memmap2::MmapOptions::new().offset(offset).len(len).map(&f) }.map_err(io)?;
    Ok(ExternalBytes::Mapped(map))
}

/// External tensors at least this big are memory-mapped rather than read.
const MAP_MIN_BYTES: usize = 1 << 20;

/// The bytes of an external tensor. Big ones are the file's pages, mapped: decoding
/// then copies them once into the tensor, instead of reading them into a buffer first
/// (which for a large model doubles the peak memory of loading its weights).
enum ExternalBytes {
    Read(Vec<u8>),
    Mapped(memmap2::Mmap),
}

impl std::ops::Deref for ExternalBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            ExternalBytes::Read(v) => v,
            ExternalBytes::Mapped(m) => m,
        }
    }
}

/// Builds a tensor from little-endian bytes; the length must already be checked.
pub(crate) fn from_le_bytes(dtype: DType, shape: &[usize], raw: &[u8]) -> Tensor {
    macro_rules! conv {
        ($t:ty, $n:expr, $f:expr) => {{
            let v: Vec<$t> = raw
                .chunks_exact($n)
                .map(|c| $f(c.try_into().expect("chunk size")))
                .collect();
            ArrayD::from_shape_vec(IxDyn(shape), v).expect("length checked")
        }};
    }
    match dtype {
        DType::F32 => Tensor::F32(conv!(f32, 4, f32::from_le_bytes)),
        DType::F64 => Tensor::F64(conv!(f64, 8, f64::from_le_bytes)),
        DType::F16 => Tensor::F16(conv!(f16, 2, |b| f16::from_bits(u16::from_le_bytes(b)))),
        DType::BF16 => Tensor::BF16(conv!(bf16, 2, |b| bf16::from_bits(u16::from_le_bytes(b)))),
        DType::I8 => Tensor::I8(conv!(i8, 1, i8::from_le_bytes)),
        DType::I16 => Tensor::I16(conv!(i16, 2, i16::from_le_bytes)),
        DType::I32 => Tensor::I32(conv!(i32, 4, i32::from_le_bytes)),
        DType::I64 => Tensor::I64(conv!(i64, 8, i64::from_le_bytes)),
        DType::U8 => Tensor::U8(conv!(u8, 1, u8::from_le_bytes)),
        DType::U16 => Tensor::U16(conv!(u16, 2, u16::from_le_bytes)),
        DType::U32 => Tensor::U32(conv!(u32, 4, u32::from_le_bytes)),
        DType::U64 => Tensor::U64(conv!(u64, 8, u64::from_le_bytes)),
        DType::Bool => Tensor::Bool(conv!(bool, 1, |b: [u8; 1]| b[0] != 0)),
        DType::String => unreachable!("strings have no raw form"),
    }
}

/// Little-endian bytes of a non-string tensor in row-major order.
pub(crate) fn to_le_bytes(t: &Tensor) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    append_le_bytes(t, &mut out).then_some(out)
}

/// Appends the little-endian bytes of a non-string tensor, in row-major order, to
/// `out`; false, appending nothing, for strings, which have no raw form.
pub(crate) fn append_le_bytes(t: &Tensor, out: &mut Vec<u8>) -> bool {
    out.reserve(t.len() * t.dtype().size_of().unwrap_or(0));
    macro_rules! bytes {
        ($a:expr, $f:expr) => {
            for v in $a.iter() {
                out.extend_from_slice(&$f(*v));
            }
        };
    }
    match t {
        Tensor::F32(a) => bytes!(a, f32::to_le_bytes),
        Tensor::F64(a) => bytes!(a, f64::to_le_bytes),
        Tensor::F16(a) => bytes!(a, |v: f16| v.to_bits().to_le_bytes()),
        Tensor::BF16(a) => bytes!(a, |v: bf16| v.to_bits().to_le_bytes()),
        Tensor::I8(a) => bytes!(a, i8::to_le_bytes),
        Tensor::I16(a) => bytes!(a, i16::to_le_bytes),
        Tensor::I32(a) => bytes!(a, i32::to_le_bytes),
        Tensor::I64(a) => bytes!(a, i64::to_le_bytes),
        Tensor::U8(a) => bytes!(a, u8::to_le_bytes),
        Tensor::U16(a) => bytes!(a, u16::to_le_bytes),
        Tensor::U32(a) => bytes!(a, u32::to_le_bytes),
        Tensor::U64(a) => bytes!(a, u64::to_le_bytes),
        Tensor::Bool(a) => bytes!(a, |v: bool| [v as u8]),
        Tensor::String(_) => return false,
    }
    true
}

/// Writes a tensor as a `TensorProto` named `name` (numbers in `raw_data`, strings in
/// `string_data`).
pub fn tensor_to_proto(t: &Tensor, name: &str) -> TensorProto {
    let mut p = TensorProto {
        name: Some(name.to_string()),
        dims: t.shape().iter().map(|&d| d as i64).collect(),
        data_type: Some(t.dtype().onnx_code()),
        ..Default::default()
    };
    match t {
        Tensor::String(a) => p.string_data = a.iter().map(|s| s.as_bytes().to_vec()).collect(),
        other => p.raw_data = to_le_bytes(other),
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_and_raw_forms_agree() {
        let typed = TensorProto {
            name: Some("w".into()),
            dims: vec![2, 2],
            data_type: Some(1),
            float_data: vec![1.0, -2.5, 3.0, 0.0],
            ..Default::default()
        };
        let t = tensor_from_proto(&typed, None).unwrap();
        let back = tensor_from_proto(&tensor_to_proto(&t, "w"), None).unwrap();
        assert_eq!(t, back);
        assert_eq!(t.shape(), &[2, 2]);
    }

    #[test]
    fn wrong_length_is_an_error() {
        let bad = TensorProto {
            name: Some("w".into()),
            dims: vec![3],
            data_type: Some(7),
            raw_data: Some(vec![0; 16]),
            ..Default::default()
        };
        let e = tensor_from_proto(&bad, None).unwrap_err().to_string();
        assert!(e.contains("'w'") && e.contains("16 bytes"), "{e}");
    }

    #[test]
    fn every_dtype_round_trips_through_raw_bytes() {
        for d in DType::ALL {
            if d == DType::String {
                continue;
            }
            let n = d.size_of().unwrap();
            let raw: Vec<u8> = (0..6 * n).map(|i| (i * 37 % 251) as u8).collect();
            let raw = if d == DType::Bool {
                raw.iter().map(|b| b & 1).collect()
            } else {
                raw
            };
            let t = from_le_bytes(d, &[2, 3], &raw);
            assert_eq!(t.dtype(), d);
            // Bytes, not values: NaN payloads compare unequal.
            assert_eq!(to_le_bytes(&t).unwrap(), raw);
        }
    }
}
