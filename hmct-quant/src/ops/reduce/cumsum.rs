//! CumSum (`exclusive`, `reverse`). Sums accumulate in the element type, in order,
//! as numpy's `cumsum` does.

use hmct_tensor::Tensor;

use crate::ops::arrays::{array, contiguous, split3};
use crate::ops::num::{Num, with_num};
use crate::ops::{Kernel, NodeSpec, OpError, input, input_i64s, normalize_axis};

fn cumsum<T: Num>(
    data: &[T],
    (outer, len, inner): (usize, usize, usize),
    exclusive: bool,
    reverse: bool,
) -> Vec<T> {
    let mut out = vec![T::ZERO; data.len()];
    let mut acc = vec![T::ZERO; inner];
    for o in 0..outer {
        acc.fill(T::ZERO);
        for step in 0..len {
            let r = if reverse { len - 1 - step } else { step };
            let at = (o * len + r) * inner;
            let (x, y) = (&data[at..at + inner], &mut out[at..at + inner]);
            for ((a, &v), y) in acc.iter_mut().zip(x).zip(y) {
                if exclusive {
                    *y = *a;
                    *a = a.add(v);
                } else {
                    *a = a.add(v);
                    *y = *a;
                }
            }
        }
    }
    out
}

pub(super) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>> {
    if spec.op_type != "CumSum" {
        return None;
    }
    Some((|| {
        let exclusive = spec.attrs.int_or("exclusive", 0)? != 0;
        let reverse = spec.attrs.int_or("reverse", 0)? != 0;
        Ok(Box::new(move |inputs: &[Option<&Tensor>]| {
            let x = input(inputs, 0)?;
            let axis = match input_i64s(inputs, 1)?.as_slice() {
                [a] => *a,
                other => {
                    return Err(OpError::invalid(format!(
                        "CumSum axis must be a scalar, got {other:?}"
                    )));
                }
            };
            let shape = x.shape();
            if shape.is_empty() {
                return Err(OpError::invalid("CumSum of a scalar"));
            }
            let ax = normalize_axis(axis, shape.len())?;
            let dims = split3(shape, ax, ax);
            Ok(vec![
                with_num!(x, a => Tensor::from(array(shape, cumsum(&contiguous(a), dims, exclusive, reverse))?),
                other => return Err(OpError::unsupported(format!("CumSum on {}", other.dtype())))),
            ])
        }) as Box<dyn Kernel>)
    })())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclusive_and_reverse() {
        let d = [1i64, 2, 3, 4];
        assert_eq!(cumsum(&d, (1, 4, 1), false, false), vec![1, 3, 6, 10]);
        assert_eq!(cumsum(&d, (1, 4, 1), true, false), vec![0, 1, 3, 6]);
        assert_eq!(cumsum(&d, (1, 4, 1), false, true), vec![10, 9, 7, 4]);
        assert_eq!(cumsum(&d, (1, 4, 1), true, true), vec![9, 7, 4, 0]);
        // Along the outer axis of a 2x2.
        assert_eq!(cumsum(&d, (1, 2, 2), false, false), vec![1, 2, 4, 6]);
    }
}
