//! Softmax, LogSoftmax and Hardmax.
//!
//! Before opset 13 the input is coerced to 2-D at `axis` (default 1) and the op runs
//! over each row of the flattened trailing dimensions; from 13 on it runs along the
//! single `axis` (default -1). Exponent sums accumulate in f64; half-precision inputs
//! are computed in f32 and rounded once.

use hmct_tensor::Tensor;
use hmct_tensor::ndarray::ArrayD;

use super::fold::fold_row;
use crate::ops::arrays::{array, contiguous, split3};
use crate::ops::broadcast::{CHUNK, PAR_MIN, for_chunks, unary};
use crate::ops::num::{Half, Num, Real};
use crate::ops::{Kernel, NodeSpec, OpError, input, normalize_axis};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Softmax,
    LogSoftmax,
    Hardmax,
}

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma"))]
fn row<T: Real>(x: &[T], y: &mut [T], kind: Kind) {
    let m = fold_row(x, T::LOWEST, |v| v, Num::max_nan);
    match kind {
        Kind::Softmax => {
            for (y, &v) in y.iter_mut().zip(x) {
                *y = (v - m).exp_fast();
            }
            let s = fold_row(y, 0.0f64, |v: T| Num::to_f64(v), |a, b| a + b);
            let inv = T::from_f64(1.0 / s);
            for y in y.iter_mut() {
                *y = *y * inv;
            }
        }
        Kind::LogSoftmax => {
            let s = fold_row(
                x,
                0.0f64,
                |v: T| Num::to_f64((v - m).exp_fast()),
                |a, b| a + b,
            );
            let shift = m + T::from_f64(s.ln());
            for (y, &v) in y.iter_mut().zip(x) {
                *y = v - shift;
            }
        }
        Kind::Hardmax => {
            y.fill(T::ZERO);
            if let Some(i) = x.iter().position(|&v| v == m || Num::is_nan(v)) {
                y[i] = T::ONE;
            }
        }
    }
}

/// One `[len, inner]` block: the op along `len` for every one of `inner` columns.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma"))]
fn block<T: Real>(x: &[T], y: &mut [T], len: usize, inner: usize, kind: Kind) {
    let mut m = vec![T::LOWEST; inner];
    for r in 0..len {
        for (m, &v) in m.iter_mut().zip(&x[r * inner..(r + 1) * inner]) {
            *m = m.max_nan(v);
        }
    }
    match kind {
        Kind::Softmax | Kind::LogSoftmax => {
            let mut s = vec![0.0f64; inner];
            for r in 0..len {
                let (xr, yr) = (
                    &x[r * inner..(r + 1) * inner],
                    &mut y[r * inner..(r + 1) * inner],
                );
                for (((s, &m), &v), y) in s.iter_mut().zip(&m).zip(xr).zip(yr) {
                    let e = (v - m).exp_fast();
                    *y = e;
                    *s += Num::to_f64(e);
                }
            }
            for r in 0..len {
                let (xr, yr) = (
                    &x[r * inner..(r + 1) * inner],
                    &mut y[r * inner..(r + 1) * inner],
                );
                for (j, (y, &v)) in yr.iter_mut().zip(xr).enumerate() {
                    *y = if kind == Kind::Softmax {
                        *y * T::from_f64(1.0 / s[j])
                    } else {
                        v - (m[j] + T::from_f64(s[j].ln()))
                    };
                }
            }
        }
        Kind::Hardmax => {
            y.fill(T::ZERO);
            for (j, &m) in m.iter().enumerate() {
                if let Some(r) = (0..len).find(|&r| {
                    let v = x[r * inner + j];
                    v == m || Num::is_nan(v)
                }) {
                    y[r * inner + j] = T::ONE;
                }
            }
        }
    }
}

fn run<T: Real>(
    a: &ArrayD<T>,
    (outer, len, inner): (usize, usize, usize),
    kind: Kind,
) -> Result<ArrayD<T>, OpError> {
    let x = contiguous(a);
    // Every element is written (a row or block at a time).
    let mut y = crate::buffers::take::<T>(x.len());
    let w = len * inner;
    if w > 0 {
        // Pieces hold whole `[len, inner]` blocks.
        let per = (CHUNK / w).max(1) * w;
        for_chunks(&mut y, per, x.len() >= PAR_MIN, &|off, piece| {
            for (k, yo) in piece.chunks_mut(w).enumerate() {
                let xo = &x[off + k * w..off + (k + 1) * w];
                if inner == 1 {
                    row(xo, yo, kind);
                } else {
                    block(xo, yo, len, inner, kind);
                }
            }
        });
    }
    debug_assert_eq!(outer * w, x.len());
    array(a.shape(), y)
}

fn run_half<H: Half>(
    a: &ArrayD<H>,
    dims: (usize, usize, usize),
    kind: Kind,
) -> Result<ArrayD<H>, OpError> {
    let wide = unary(a, |v: H| v.to_f32h());
    Ok(unary(&run(&wide, dims, kind)?, H::from_f32h))
}

pub(super) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>> {
    let kind = match spec.op_type {
        "Softmax" => Kind::Softmax,
        "LogSoftmax" => Kind::LogSoftmax,
        "Hardmax" => Kind::Hardmax,
        _ => return None,
    };
    let coerce_2d = spec.opset < 13;
    Some((|| {
        let axis = spec.attrs.int_or("axis", if coerce_2d { 1 } else { -1 })?;
        Ok(Box::new(move |inputs: &[Option<&Tensor>]| {
            let x = input(inputs, 0)?;
            let shape = x.shape();
            let rank = shape.len();
            let ax = normalize_axis(axis, rank)?;
            let dims = if coerce_2d {
                split3(shape, ax, rank - 1)
            } else {
                split3(shape, ax, ax)
            };
            Ok(vec![match x {
                Tensor::F32(a) => Tensor::F32(run(a, dims, kind)?),
                Tensor::F64(a) => Tensor::F64(run(a, dims, kind)?),
                Tensor::F16(a) => Tensor::F16(run_half(a, dims, kind)?),
                Tensor::BF16(a) => Tensor::BF16(run_half(a, dims, kind)?),
                other => {
                    return Err(OpError::unsupported(format!(
                        "{kind:?} on {}",
                        other.dtype()
                    )));
                }
            }])
        }) as Box<dyn Kernel>)
    })())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_block_matches_rows_of_the_transpose() {
        // [2, 3, 4] along axis 1 vs the same data transposed to put axis 1 last.
        let x: Vec<f32> = (0..24).map(|i| ((i * 7 % 5) as f32) * 0.3 - 0.5).collect();
        let a = ArrayD::from_shape_vec(hmct_tensor::ndarray::IxDyn(&[2, 3, 4]), x).unwrap();
        for kind in [Kind::Softmax, Kind::LogSoftmax, Kind::Hardmax] {
            let strided = run(&a, (2, 3, 4), kind).unwrap();
            let t = a
                .view()
                .permuted_axes(vec![0, 2, 1])
                .as_standard_layout()
                .into_owned();
            let rows = run(&t, (8, 3, 1), kind).unwrap();
            let back = rows
                .view()
                .permuted_axes(vec![0, 2, 1])
                .as_standard_layout()
                .into_owned();
            for (p, q) in strided.iter().zip(back.iter()) {
                assert!((p - q).abs() < 1e-6, "{kind:?}");
            }
        }
    }

    #[test]
    fn softmax_rows_sum_to_one_even_for_huge_inputs() {
        let a = ArrayD::from_shape_vec(
            hmct_tensor::ndarray::IxDyn(&[1, 3]),
            vec![1000.0f32, 1000.0, -1000.0],
        )
        .unwrap();
        let y = run(&a, (1, 3, 1), Kind::Softmax).unwrap();
        assert_eq!(y.as_slice().unwrap(), &[0.5, 0.5, 0.0]);
    }
}
