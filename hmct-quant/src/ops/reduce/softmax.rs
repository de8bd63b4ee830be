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
use crate::ops::fastmath::exp_f32_nonpositive;
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

/// The largest value of `x`, or a NaN of `x` if it has one (-inf when empty), as
/// [`fold_row`] with `max_nan` finds it; on AVX-512, 32 values at a time with
/// `vmaxps`, and NaNs looked for apart. `fold_row`'s eight lanes chained a compare,
/// a second compare and a blend per value: a third of a ViT attention row's time.
fn max_f32(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::features().avx512f {
        // SAFETY: the CPU has AVX-512F.
        return unsafe { max_f32_avx512(x) };
    }
    fold_row(x, f32::NEG_INFINITY, |v| v, Num::max_nan)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn max_f32_avx512(x: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let lowest = _mm512_set1_ps(f32::NEG_INFINITY);
    let (mut a, mut b) = (lowest, lowest);
    let mut nan: __mmask16 = 0;
    let mut pairs = x.chunks_exact(32);
    for c in &mut pairs {
        // SAFETY: `c` holds 32 values.
        let (u, v) = unsafe {
            (
                _mm512_loadu_ps(c.as_ptr()),
                _mm512_loadu_ps(c.as_ptr().add(16)),
            )
        };
        nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(u, v);
        a = _mm512_max_ps(a, u);
        b = _mm512_max_ps(b, v);
    }
    for c in pairs.remainder().chunks(16) {
        let mask = ((1u32 << c.len()) - 1) as __mmask16;
        // SAFETY: the masked load reads the `c.len()` values of `c` only.
        let u = unsafe { _mm512_mask_loadu_ps(lowest, mask, c.as_ptr()) };
        nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(u, u);
        a = _mm512_max_ps(a, u);
    }
    if nan != 0 {
        return fold_row(x, f32::NEG_INFINITY, |v| v, Num::max_nan);
    }
    _mm512_reduce_max_ps(_mm512_max_ps(a, b))
}

/// [`row`]'s Softmax for f32, with the same bits, in chunks of 16 lanes. The last
/// values come from the chunk that ends the row rather than a scalar loop; the
/// exponents, of values less the row's maximum, skip the overflow checks; each is
/// added to the sum from registers as it is made. On ViT-S/16's attention rows (197
/// values) the generic row took twice as long as onnxruntime's Softmax.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma"))]
fn softmax_row_f32(x: &[f32], y: &mut [f32]) {
    const L: usize = 16;
    let (full, rest) = (x.len() / L * L, x.len() % L);
    let m = max_f32(x);
    // The sum in `fold_row`'s order: element `i` of the eight-lane chunks into lane
    // `i % 8`, the lanes added in order, then what is left one by one.
    let mut sums = [0.0f64; 8];
    for (xc, yc) in x[..full].chunks_exact(L).zip(y.chunks_exact_mut(L)) {
        // Summed from registers: read back from `y`, the upper half of each store
        // waited for it (a failed store forward, a seventh of the row's time).
        let mut e = [0.0f32; L];
        for k in 0..L {
            e[k] = exp_f32_nonpositive(xc[k] - m);
        }
        yc.copy_from_slice(&e);
        for half in e.chunks_exact(8) {
            for k in 0..8 {
                sums[k] += f64::from(half[k]);
            }
        }
    }
    // The last `rest` values: from a chunk that ends with the row when there is one
    // (a chunk padded on the stack waited for the stores that filled it).
    let mut last = [m; L];
    let at = if x.len() >= L {
        last.copy_from_slice(&x[x.len() - L..]);
        L - rest
    } else {
        last[..rest].copy_from_slice(x);
        0
    };
    for v in &mut last {
        *v = exp_f32_nonpositive(*v - m);
    }
    let tail = &last[at..at + rest];
    y[full..].copy_from_slice(tail);
    let eights = rest / 8 * 8;
    for k in 0..eights {
        sums[k] += f64::from(tail[k]);
    }
    let mut s = 0.0f64;
    for v in sums {
        s += v;
    }
    for &v in &tail[eights..] {
        s += f64::from(v);
    }
    let inv = (1.0 / s) as f32;
    for v in y.iter_mut() {
        *v *= inv;
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

/// A row of f32: Softmax on [`softmax_row_f32`], the others on [`row`].
fn row_f32(x: &[f32], y: &mut [f32], kind: Kind) {
    if kind == Kind::Softmax {
        softmax_row_f32(x, y)
    } else {
        row(x, y, kind)
    }
}

/// The op over `a` viewed as `[outer, len, inner]`, each row (`inner` 1) on `row`.
fn run<T: Real>(
    a: &ArrayD<T>,
    (outer, len, inner): (usize, usize, usize),
    kind: Kind,
    row: fn(&[T], &mut [T], Kind),
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
    Ok(unary(&run(&wide, dims, kind, row_f32)?, H::from_f32h))
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
                Tensor::F32(a) => Tensor::F32(run(a, dims, kind, row_f32)?),
                Tensor::F64(a) => Tensor::F64(run(a, dims, kind, row::<f64>)?),
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
            let strided = run(&a, (2, 3, 4), kind, row_f32).unwrap();
            let t = a
                .view()
                .permuted_axes(vec![0, 2, 1])
                .as_standard_layout()
                .into_owned();
            let rows = run(&t, (8, 3, 1), kind, row_f32).unwrap();
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
    fn f32_softmax_rows_have_the_generic_rows_bits() {
        // Lengths around the chunks of 8, 16 and 32, and a ViT attention row; rows with
        // a NaN and one of -inf only.
        let mut seed = 7u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1 << 24) as f32 * 40.0 - 20.0
        };
        let mut rows: Vec<Vec<f32>> = [1, 5, 7, 8, 9, 15, 16, 17, 23, 24, 25, 31, 33, 197]
            .iter()
            .map(|&n| (0..n).map(|_| next()).collect())
            .collect();
        rows.push(vec![1.0, f32::NAN, 2.0]);
        let mut nan_in_pair = rows[13].clone();
        nan_in_pair[20] = f32::NAN;
        rows.push(nan_in_pair);
        rows.push(vec![f32::NEG_INFINITY; 19]);
        for x in rows {
            let (mut fast, mut generic) = (vec![0.0; x.len()], vec![0.0; x.len()]);
            softmax_row_f32(&x, &mut fast);
            row(&x, &mut generic, Kind::Softmax);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fast), bits(&generic), "row of {}", x.len());
        }
    }

    #[test]
    fn softmax_rows_sum_to_one_even_for_huge_inputs() {
        let a = ArrayD::from_shape_vec(
            hmct_tensor::ndarray::IxDyn(&[1, 3]),
            vec![1000.0f32, 1000.0, -1000.0],
        )
        .unwrap();
        let y = run(&a, (1, 3, 1), Kind::Softmax, row_f32).unwrap();
        assert_eq!(y.as_slice().unwrap(), &[0.5, 0.5, 0.0]);
    }
}
