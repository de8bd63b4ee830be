//! Ops that make tensors from shapes or positions: ConstantOfShape, Range, NonZero,
//! Trilu.

use hmct_tensor::ndarray::{ArrayD, IxDyn};
use hmct_tensor::{Tensor, map_tensor, map_tensor_same};

use crate::ops::arrays::{array, contiguous};
use crate::ops::num::{Num, TensorElem, scalar_of, typed, with_num};
use crate::ops::{Kernel, NodeSpec, OpError, input, input_i64s};

fn dims_of(v: &[i64]) -> Result<Vec<usize>, OpError> {
    v.iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| OpError::invalid(format!("negative dimension in {v:?}")))
        })
        .collect()
}

/// `number = max(ceil((limit - start) / delta), 0)` values `start + i * delta`.
fn range<T: Num>(start: T, limit: T, delta: T) -> Result<ArrayD<T>, OpError> {
    if delta == T::ZERO {
        return Err(OpError::invalid("Range delta 0"));
    }
    let n = if T::FLOAT {
        ((limit.to_f64() - start.to_f64()) / delta.to_f64())
            .ceil()
            .max(0.0) as usize
    } else {
        let (s, l, d) = (
            start.to_i64() as i128,
            limit.to_i64() as i128,
            delta.to_i64() as i128,
        );
        let span = l - s;
        let q = span / d + i128::from(span % d != 0 && ((span < 0) == (d < 0)));
        q.max(0) as usize
    };
    let out = (0..n)
        .map(|i| {
            if T::FLOAT {
                T::from_f64(start.to_f64() + i as f64 * delta.to_f64())
            } else {
                start.add(T::from_i64(i as i64).mul(delta))
            }
        })
        .collect();
    array(&[n], out)
}

fn non_zero(t: &Tensor) -> Result<Tensor, OpError> {
    let shape = t.shape().to_vec();
    let flags: Vec<bool> = match t {
        Tensor::Bool(a) => a.iter().copied().collect(),
        Tensor::String(a) => a.iter().map(|s| !s.is_empty()).collect(),
        other => with_num!(other, a => a.iter().map(|&v| v != Num::ZERO).collect(),
            o => return Err(OpError::unsupported(format!("NonZero on {}", o.dtype())))),
    };
    let hits: Vec<usize> = flags
        .iter()
        .enumerate()
        .filter(|(_, f)| **f)
        .map(|(i, _)| i)
        .collect();
    let rank = shape.len();
    let mut out = vec![0i64; rank * hits.len()];
    for (j, &lin) in hits.iter().enumerate() {
        let mut rest = lin;
        for k in (0..rank).rev() {
            out[k * hits.len() + j] = (rest % shape[k]) as i64;
            rest /= shape[k];
        }
    }
    Ok(Tensor::I64(array(&[rank, hits.len()], out)?))
}

fn trilu<T: Clone + Default>(a: &ArrayD<T>, k: i64, upper: bool) -> Result<ArrayD<T>, OpError> {
    let shape = a.shape();
    if shape.len() < 2 {
        return Err(OpError::invalid("Trilu needs a rank of at least 2"));
    }
    let (rows, cols) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let mut out = contiguous(a).into_owned();
    for (m, v) in out.iter_mut().enumerate() {
        let (i, j) = (((m / cols) % rows.max(1)) as i64, (m % cols) as i64);
        let keep = if upper { j - i >= k } else { j - i <= k };
        if !keep {
            *v = T::default();
        }
    }
    array(shape, out)
}

fn boxed(
    k: impl Fn(&[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> + Send + Sync + 'static,
) -> Box<dyn Kernel> {
    Box::new(k)
}

pub(super) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>> {
    let op = spec.op_type;
    if !matches!(op, "ConstantOfShape" | "Range" | "NonZero" | "Trilu") {
        return None;
    }
    let attrs = spec.attrs;
    Some((|| -> Result<Box<dyn Kernel>, OpError> {
        Ok(match op {
            "ConstantOfShape" => {
                let value = match attrs.tensor("value")? {
                    Some(v) if v.len() == 1 => v,
                    Some(v) => {
                        return Err(OpError::invalid(format!(
                            "ConstantOfShape value of shape {:?}",
                            v.shape()
                        )));
                    }
                    None => Tensor::scalar_f32(0.0),
                };
                boxed(move |inputs| {
                    let dims = dims_of(&input_i64s(inputs, 0)?)?;
                    Ok(vec![map_tensor_same!(&value, v => ArrayD::from_elem(
                        IxDyn(&dims),
                        v.iter().next().cloned().unwrap_or_default()
                    ))])
                })
            }
            "Range" => boxed(|inputs| {
                let (s, l, d) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
                Ok(vec![with_num!(s, a => {
                    let start = scalar_of(a, "Range start")?;
                    let limit = scalar_of(typed(l, "Range limit")?, "Range limit")?;
                    let delta = scalar_of(typed(d, "Range delta")?, "Range delta")?;
                    TensorElem::wrap(range(start, limit, delta)?)
                }, other => return Err(OpError::unsupported(format!("Range on {}", other.dtype()))))])
            }),
            "NonZero" => boxed(|inputs| Ok(vec![non_zero(input(inputs, 0)?)?])),
            _ => {
                let upper = attrs.int_or("upper", 1)? != 0;
                boxed(move |inputs| {
                    let k = match inputs.get(1).copied().flatten() {
                        Some(_) => match input_i64s(inputs, 1)?.as_slice() {
                            [k] => *k,
                            other => return Err(OpError::invalid(format!("Trilu k {other:?}"))),
                        },
                        None => 0,
                    };
                    let x = input(inputs, 0)?;
                    Ok(vec![
                        map_tensor!(x, a => TensorElem::wrap(trilu(a, k, upper)?)),
                    ])
                })
            }
        })
    })())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_lengths() {
        assert_eq!(range(1i32, 10, 3).unwrap().as_slice().unwrap(), &[1, 4, 7]);
        assert_eq!(range(10i64, 4, -3).unwrap().as_slice().unwrap(), &[10, 7]);
        assert_eq!(range(0i64, 5, -1).unwrap().len(), 0);
        assert_eq!(range(0.0f32, 1.0, 0.25).unwrap().len(), 4);
        assert!(range(0i32, 1, 0).is_err());
    }

    #[test]
    fn non_zero_lists_coordinates_row_major() {
        let t = Tensor::from_f32(&[2, 2], vec![1.0, 0.0, 0.0, 3.0]).unwrap();
        let Tensor::I64(out) = non_zero(&t).unwrap() else {
            panic!()
        };
        assert_eq!(out.shape(), &[2, 2]);
        assert_eq!(out.as_slice().unwrap(), &[0, 1, 0, 1]);
    }
}
