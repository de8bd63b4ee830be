//! `.npy` files ⇄ [`Tensor`] (numpy's format: calibration data, outputs).
//!
//! Reading accepts little- and big-endian data and Fortran order (transposed into
//! row-major); anything else (object arrays, structured dtypes, truncated data) is an
//! error that names the file.

use std::io::Cursor;
use std::path::Path;

use ndarray::{ArrayD, IxDyn, ShapeBuilder};
use npyz::{NpyFile, NpyHeader, Order, WriterBuilder};

use crate::{DType, Tensor, TensorError};

/// Reads an `.npy` file.
pub fn read_npy(path: &Path) -> Result<Tensor, TensorError> {
    let bytes = std::fs::read(path).map_err(|source| TensorError::Io {
        path: path.display().to_string(),
        source,
    })?;
    read_npy_bytes(&bytes, &path.display().to_string())
}

/// Reads `.npy` content; `context` (usually the file name) prefixes errors.
pub fn read_npy_bytes(bytes: &[u8], context: &str) -> Result<Tensor, TensorError> {
    let bad = |m: String| TensorError::invalid(context, m);
    check_header(bytes).map_err(bad)?;
    let mut cursor = Cursor::new(bytes);
    let header = NpyHeader::from_reader(&mut cursor)
        .map_err(|e| bad(format!("not a valid .npy file ({e})")))?;
    let data = &bytes[cursor.position() as usize..];
    let npyz::DType::Plain(ts) = header.dtype() else {
        return Err(bad("structured or array dtypes are not supported".into()));
    };
    let desc = ts.to_string();
    let dtype = dtype_of_descr(&desc).ok_or_else(|| bad(format!("unsupported dtype '{desc}'")))?;
    let shape: Vec<usize> = header.shape().iter().map(|&d| d as usize).collect();
    let count = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| bad("shape overflows".into()))?;
    let need = count
        .checked_mul(dtype.size_of().unwrap_or(1))
        .ok_or_else(|| bad("shape overflows".into()))?;
    if data.len() < need {
        return Err(bad(format!(
            "truncated: shape {shape:?} of {dtype} needs {need} data bytes, file has {}",
            data.len()
        )));
    }
    let order = header.order();
    let file = NpyFile::with_header(header, &data[..need]);
    let io = |e: std::io::Error| bad(format!("cannot read data ({e})"));
    macro_rules! read {
        ($t:ty, $v:ident) => {
            Tensor::$v(shaped(file.into_vec::<$t>().map_err(io)?, &shape, order))
        };
    }
    Ok(match dtype {
        DType::F32 => read!(f32, F32),
        DType::F64 => read!(f64, F64),
        DType::F16 => read!(half::f16, F16),
        DType::I8 => read!(i8, I8),
        DType::I16 => read!(i16, I16),
        DType::I32 => read!(i32, I32),
        DType::I64 => read!(i64, I64),
        DType::U8 => read!(u8, U8),
        DType::U16 => read!(u16, U16),
        DType::U32 => read!(u32, U32),
        DType::U64 => read!(u64, U64),
        DType::Bool => read!(bool, Bool),
        DType::BF16 | DType::String => return Err(bad(format!("unsupported dtype '{desc}'"))),
    })
}

/// How deep brackets may nest in the header dict. Plain dtypes need two levels
/// (`{'shape': (1, 3)}`), structured ones (refused later, with a clear message) three
/// or four.
const MAX_HEADER_NESTING: usize = 6;

/// npyz parses the header dict with a backtracking parser whose time grows
/// exponentially with the nesting of brackets: a 240-byte header opening 130 `[`
/// runs for minutes. Such headers are refused before npyz sees them. Brackets inside
/// quoted strings count too, which only makes the check stricter. A declared header
/// length beyond the end of the file is refused too.
fn check_header(bytes: &[u8]) -> Result<(), String> {
    // Magic (6 bytes), version (2), header length (2 bytes in version 1, else 4).
    let (len, start) = match (bytes.get(..6), bytes.get(6)) {
        (Some(b"\x93NUMPY"), Some(1)) => match bytes.get(8..10) {
            Some(l) => (u16::from_le_bytes([l[0], l[1]]) as usize, 10),
            None => return Ok(()),
        },
        (Some(b"\x93NUMPY"), Some(_)) => match bytes.get(8..12) {
            Some(l) => (u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize, 12),
            None => return Ok(()),
        },
        // Not an .npy file at all: npyz says so.
        _ => return Ok(()),
    };
    let header = bytes.get(start..).unwrap_or_default();
    // npyz allocates the declared length before reading (found by fuzzing: 4 GB).
    if len > header.len() {
        return Err(format!(
            "not a valid .npy file (the header declares {len} bytes, the file has {})",
            header.len()
        ));
    }
    let header = &header[..len];
    let mut depth = 0usize;
    for &b in header {
        match b {
            b'[' | b'(' | b'{' => {
                depth += 1;
                if depth > MAX_HEADER_NESTING {
                    return Err(format!(
                        "not a valid .npy file (the header nests brackets more than {MAX_HEADER_NESTING} deep)"
                    ));
                }
            }
            b']' | b')' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

fn shaped<T: Clone>(v: Vec<T>, shape: &[usize], order: Order) -> ArrayD<T> {
    match order {
        Order::C => ArrayD::from_shape_vec(IxDyn(shape), v).expect("length checked"),
        Order::Fortran => {
            let a = ArrayD::from_shape_vec(IxDyn(shape).f(), v).expect("length checked");
            a.as_standard_layout().into_owned()
        }
    }
}

/// The `.npy` type strings of the element types `.npy` files carry, as written here
/// (little-endian; `|` where byte order does not apply).
const DESCRS: [(DType, &str); 12] = [
    (DType::F32, "<f4"),
    (DType::F64, "<f8"),
    (DType::F16, "<f2"),
    (DType::I8, "|i1"),
    (DType::I16, "<i2"),
    (DType::I32, "<i4"),
    (DType::I64, "<i8"),
    (DType::U8, "|u1"),
    (DType::U16, "<u2"),
    (DType::U32, "<u4"),
    (DType::U64, "<u8"),
    (DType::Bool, "|b1"),
];

/// The element type of a type string of either byte order (npyz converts on read).
fn dtype_of_descr(d: &str) -> Option<DType> {
    let body = d.trim_start_matches(['<', '>', '|', '=']);
    DESCRS
        .iter()
        .find(|(_, s)| s[1..] == *body)
        .map(|&(t, _)| t)
}

/// Encodes a tensor as `.npy` bytes (little-endian, C order).
pub fn write_npy_bytes(t: &Tensor) -> Result<Vec<u8>, TensorError> {
    let Some(&(_, descr)) = DESCRS.iter().find(|(d, _)| *d == t.dtype()) else {
        return Err(TensorError::UnsupportedType {
            context: "npy".into(),
            dtype: t.dtype().to_string(),
        });
    };
    let shape: Vec<u64> = t.shape().iter().map(|&d| d as u64).collect();
    let mut out = Vec::new();
    // npyz writes the header; the data goes in as bytes, because npyz's
    // element-by-element writer took about half of `run`'s wall time on small models.
    npyz::WriteOptions::new_header_only()
        .dtype(npyz::DType::Plain(
            descr.parse().expect("a valid type string"),
        ))
        .shape(&shape)
        .writer(&mut out)
        .write_header_only()
        .map_err(|e| TensorError::invalid("npy", e.to_string()))?;
    crate::proto::append_le_bytes(t, &mut out);
    Ok(out)
}

/// Writes a tensor to an `.npy` file atomically (a temporary file, then a rename), so
/// no half-written file is ever left behind.
pub fn write_npy(path: &Path, t: &Tensor) -> Result<(), TensorError> {
    let bytes = write_npy_bytes(t)?;
    let io = |source| TensorError::Io {
        path: path.display().to_string(),
        source,
    };
    let tmp = path.with_extension("npy.tmp");
    // A failed write (a full disk) may have created the temporary file: it goes too.
    std::fs::write(&tmp, &bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(e)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_all_numeric_types() {
        let shape = [2usize, 3];
        let ts = vec![
            Tensor::F32(
                ArrayD::from_shape_vec(IxDyn(&shape), vec![1.5f32, -2., 0., 3., f32::NAN, 7.])
                    .unwrap(),
            ),
            Tensor::I64(
                ArrayD::from_shape_vec(IxDyn(&shape), vec![1i64, -2, 0, 3, i64::MAX, 7]).unwrap(),
            ),
            Tensor::U8(ArrayD::from_shape_vec(IxDyn(&shape), vec![1u8, 2, 0, 3, 255, 7]).unwrap()),
            Tensor::Bool(
                ArrayD::from_shape_vec(IxDyn(&shape), vec![true, false, true, true, false, true])
                    .unwrap(),
            ),
        ];
        for t in ts {
            let back = read_npy_bytes(&write_npy_bytes(&t).unwrap(), "x.npy").unwrap();
            assert_eq!(back.dtype(), t.dtype());
            assert_eq!(back.shape(), t.shape());
            assert_eq!(format!("{back:?}"), format!("{t:?}"));
        }
    }

    /// The header and data bytes are those of npyz's own writer, element by element,
    /// for every element type (and in row-major order for a transposed view).
    #[test]
    fn bytes_match_npyz_element_writer() {
        fn npyz_bytes<T: npyz::AutoSerialize + Copy>(a: &ArrayD<T>) -> Vec<u8> {
            let shape: Vec<u64> = a.shape().iter().map(|&d| d as u64).collect();
            let mut out = Vec::new();
            let mut w = npyz::WriteOptions::<T>::new()
                .default_dtype()
                .shape(&shape)
                .writer(&mut out)
                .begin_nd()
                .unwrap();
            w.extend(a.iter().copied()).unwrap();
            w.finish().unwrap();
            out
        }
        macro_rules! check {
            ($v:ident, $f:expr) => {{
                let a = ArrayD::from_shape_fn(IxDyn(&[3, 4]), |i| $f(i[0] * 4 + i[1]));
                for a in [a.clone(), a.reversed_axes()] {
                    assert_eq!(
                        write_npy_bytes(&Tensor::$v(a.clone())).unwrap(),
                        npyz_bytes(&a),
                        stringify!($v)
                    );
                }
            }};
        }
        check!(F32, |i: usize| i as f32 - 5.5);
        check!(F64, |i: usize| i as f64 * -1.25);
        check!(F16, |i: usize| half::f16::from_f32(i as f32 / 3.0));
        check!(I8, |i: usize| i as i8 - 6);
        check!(I16, |i: usize| i as i16 * -300);
        check!(I32, |i: usize| i as i32 * -70000);
        check!(I64, |i: usize| i as i64 * -(1 << 40));
        check!(U8, |i: usize| i as u8 * 20);
        check!(U16, |i: usize| i as u16 * 5000);
        check!(U32, |i: usize| i as u32 * 300_000_000);
        check!(U64, |i: usize| i as u64 * (1 << 60));
        check!(Bool, |i: usize| i % 3 == 0);
    }

    #[test]
    fn truncated_and_garbage_are_errors() {
        let t = Tensor::from_f32(&[4], vec![1., 2., 3., 4.]).unwrap();
        let bytes = write_npy_bytes(&t).unwrap();
        let e = read_npy_bytes(&bytes[..bytes.len() - 3], "a.npy")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("a.npy: truncated"), "{e}");
        assert!(read_npy_bytes(b"hello world", "b.npy").is_err());
        assert!(read_npy_bytes(&[], "c.npy").is_err());
    }

    /// Found by fuzzing: npyz's header parser takes minutes on deep nesting.
    #[test]
    fn deeply_nested_header_is_refused_at_once() {
        let dict = format!(
            "{{'descr': {}'<f4'{}, 'fortran_order': False, 'shape': (1,), }}",
            "[".repeat(130),
            "]".repeat(130)
        );
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        bytes.extend_from_slice(&(dict.len() as u16).to_le_bytes());
        bytes.extend_from_slice(dict.as_bytes());
        bytes.extend_from_slice(&1f32.to_le_bytes());
        let start = std::time::Instant::now();
        let e = read_npy_bytes(&bytes, "deep.npy").unwrap_err().to_string();
        assert!(
            e.starts_with("deep.npy: not a valid .npy file (the header nests"),
            "{e}"
        );
        assert!(start.elapsed().as_secs_f64() < 1.0);
        // Structured dtypes nest three deep and still get their own message.
        let dict =
            "{'descr': [('a', '<i4'), ('b', '<f4')], 'fortran_order': False, 'shape': (1,), }";
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        bytes.extend_from_slice(&(dict.len() as u16).to_le_bytes());
        bytes.extend_from_slice(dict.as_bytes());
        bytes.extend_from_slice(&[0; 8]);
        let e = read_npy_bytes(&bytes, "s.npy").unwrap_err().to_string();
        assert!(e.contains("structured or array dtypes"), "{e}");
        // A version-2 header declaring 4 GB in a short file.
        let mut huge = b"\x93NUMPY\x02\x00".to_vec();
        huge.extend_from_slice(&0xff7b_0076u32.to_le_bytes());
        huge.extend_from_slice(b"{'descr': '<f4'}");
        let e = read_npy_bytes(&huge, "huge.npy").unwrap_err().to_string();
        assert!(e.contains("the header declares"), "{e}");
    }
}
