//! ArgMax, ArgMin and TopK.

use std::cmp::Ordering;

use hmct_tensor::Tensor;
use hmct_tensor::ndarray::ArrayD;

use crate::ops::arrays::{array, contiguous, split3};
use crate::ops::num::{Num, with_num};
use crate::ops::{Kernel, NodeSpec, OpError, input, input_i64s, normalize_axis};

/// Index of the max (or min) along the middle axis of `[outer, len, inner]`. The
/// first occurrence wins unless `last`; NaN counts as the extreme value, as in numpy.
fn arg_extreme<T: Num>(
    data: &[T],
    (outer, len, inner): (usize, usize, usize),
    max: bool,
    last: bool,
) -> Vec<i64> {
    let better = |v: T, best: T| -> bool {
        if best.is_nan() {
            return last && v.is_nan();
        }
        if v.is_nan() {
            return true;
        }
        match (max, last) {
            (true, false) => v > best,
            (true, true) => v >= best,
            (false, false) => v < best,
            (false, true) => v <= best,
        }
    };
    let mut out = vec![0i64; outer * inner];
    let mut best = vec![T::ZERO; inner];
    for o in 0..outer {
        let base = o * len * inner;
        best.copy_from_slice(&data[base..base + inner]);
        let idx = &mut out[o * inner..(o + 1) * inner];
        for r in 1..len {
            let row = &data[base + r * inner..base + (r + 1) * inner];
            for ((b, i), &v) in best.iter_mut().zip(idx.iter_mut()).zip(row) {
                if better(v, *b) {
                    *b = v;
                    *i = r as i64;
                }
            }
        }
    }
    out
}

fn arg_kernel(spec: &NodeSpec, max: bool) -> Result<Box<dyn Kernel>, OpError> {
    let axis = spec.attrs.int_or("axis", 0)?;
    let keepdims = spec.attrs.int_or("keepdims", 1)? != 0;
    let last = spec.attrs.int_or("select_last_index", 0)? != 0;
    Ok(Box::new(move |inputs: &[Option<&Tensor>]| {
        let x = input(inputs, 0)?;
        let shape = x.shape();
        let ax = normalize_axis(axis, shape.len())?;
        if shape.is_empty() || shape[ax] == 0 {
            return Err(OpError::invalid("ArgMax/ArgMin over an empty axis"));
        }
        let dims = split3(shape, ax, ax);
        let mut out_shape = shape.to_vec();
        if keepdims {
            out_shape[ax] = 1;
        } else {
            out_shape.remove(ax);
        }
        let idx = with_num!(x, a => arg_extreme(&contiguous(a), dims, max, last),
            other => return Err(OpError::unsupported(format!("ArgMax/ArgMin on {}", other.dtype()))));
        Ok(vec![Tensor::I64(array(&out_shape, idx)?)])
    }))
}

/// Orders candidates best-first: by value (NaN as the largest), then lower index.
#[inline]
fn order<T: Num>(largest: bool, (va, ia): (T, usize), (vb, ib): (T, usize)) -> Ordering {
    let by_value = match va.partial_cmp(&vb) {
        Some(o) => o,
        None => va.is_nan().cmp(&vb.is_nan()),
    };
    let by_value = if largest {
        by_value.reverse()
    } else {
        by_value
    };
    by_value.then(ia.cmp(&ib))
}

fn top_k<T: Num>(
    a: &ArrayD<T>,
    axis: usize,
    k: usize,
    largest: bool,
) -> Result<(ArrayD<T>, ArrayD<i64>), OpError> {
    let shape = a.shape();
    let (outer, len, inner) = split3(shape, axis, axis);
    if k > len {
        return Err(OpError::invalid(format!(
            "TopK k={k} exceeds axis length {len}"
        )));
    }
    let data = contiguous(a);
    let mut values = vec![T::ZERO; outer * k * inner];
    let mut indices = vec![0i64; outer * k * inner];
    let mut cand: Vec<(T, usize)> = Vec::with_capacity(len);
    for o in 0..outer {
        for j in 0..inner {
            cand.clear();
            cand.extend((0..len).map(|r| (data[(o * len + r) * inner + j], r)));
            let cmp = |x: &(T, usize), y: &(T, usize)| order(largest, *x, *y);
            if k > 0 && k < len {
                cand.select_nth_unstable_by(k - 1, cmp);
            }
            cand[..k].sort_unstable_by(cmp);
            for (i, &(v, r)) in cand[..k].iter().enumerate() {
                values[(o * k + i) * inner + j] = v;
                indices[(o * k + i) * inner + j] = r as i64;
            }
        }
    }
    let mut out_shape = shape.to_vec();
    out_shape[axis] = k;
    Ok((array(&out_shape, values)?, array(&out_shape, indices)?))
}

fn topk_kernel(spec: &NodeSpec) -> Result<Box<dyn Kernel>, OpError> {
    let axis = spec.attrs.int_or("axis", -1)?;
    let largest = spec.attrs.int_or("largest", 1)? != 0;
    // `sorted=0` lets the output be in any order; sorted output is one of them.
    let attr_k = if spec.opset < 10 {
        Some(
            spec.attrs
                .int("k")?
                .ok_or_else(|| OpError::invalid("TopK without 'k'"))?,
        )
    } else {
        None
    };
    Ok(Box::new(move |inputs: &[Option<&Tensor>]| {
        let x = input(inputs, 0)?;
        let k = match attr_k {
            Some(k) => k,
            None => match input_i64s(inputs, 1)?.as_slice() {
                [k] => *k,
                other => {
                    return Err(OpError::invalid(format!(
                        "TopK K must hold one value, got {other:?}"
                    )));
                }
            },
        };
        let k = usize::try_from(k).map_err(|_| OpError::invalid(format!("TopK k={k}")))?;
        let ax = normalize_axis(axis, x.shape().len())?;
        let (v, i) = with_num!(x, a => {
            let (v, i) = top_k(a, ax, k, largest)?;
            (Tensor::from(v), i)
        }, other => return Err(OpError::unsupported(format!("TopK on {}", other.dtype()))));
        Ok(vec![v, Tensor::I64(i)])
    }))
}

pub(super) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>> {
    Some(match spec.op_type {
        "ArgMax" => arg_kernel(spec, true),
        "ArgMin" => arg_kernel(spec, false),
        "TopK" => topk_kernel(spec),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_keep_lower_indices_first() {
        let a = ArrayD::from_shape_vec(
            hmct_tensor::ndarray::IxDyn(&[5]),
            vec![1.0f32, 3.0, 3.0, 0.0, 3.0],
        )
        .unwrap();
        let (v, i) = top_k(&a, 0, 2, true).unwrap();
        assert_eq!(v.as_slice().unwrap(), &[3.0, 3.0]);
        assert_eq!(i.as_slice().unwrap(), &[1, 2]);
        let (_, i) = top_k(&a, 0, 3, false).unwrap();
        assert_eq!(i.as_slice().unwrap(), &[3, 0, 1]);
    }

    #[test]
    fn argmax_first_or_last_occurrence() {
        let d = [2i32, 7, 7, 1];
        assert_eq!(arg_extreme(&d, (1, 4, 1), true, false), vec![1]);
        assert_eq!(arg_extreme(&d, (1, 4, 1), true, true), vec![2]);
        assert_eq!(arg_extreme(&d, (1, 4, 1), false, false), vec![3]);
    }
}
