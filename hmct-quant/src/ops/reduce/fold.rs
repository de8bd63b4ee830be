//! ReduceSum/Mean/Max/Min/Prod/L1/L2/SumSquare/LogSum/LogSumExp.
//!
//! Axes come from the `axes` attribute before opset 13 (ReduceSum) or 18 (the others)
//! and from the optional second input after; an empty or absent list reduces every
//! axis unless `noop_with_empty_axes` is set. Reducing an empty set gives the
//! operation's identity (0 for sums, 1 for products, -inf/+inf or the integer limits
//! for Max/Min, NaN for Mean), as ONNX specifies.

use half::{bf16, f16};
use hmct_tensor::Tensor;

use crate::ops::arrays::{array, contiguous, permute, split3};
use crate::ops::broadcast::{CHUNK, PAR_MIN, for_chunks};
use crate::ops::num::Num;
use crate::ops::{Kernel, NodeSpec, OpError, input, input_i64s, normalize_axis};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Red {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    L1,
    L2,
    SumSquare,
    LogSum,
    LogSumExp,
}

/// An element type with the type its reductions accumulate in (f64 for floats, the
/// type itself, wrapping, for integers).
trait Reducible: Num {
    type A: Num;
    fn up(self) -> Self::A;
    fn down(a: Self::A) -> Self;
}

macro_rules! reducible_self {
    ($($t:ty),*) => {$(
        impl Reducible for $t {
            type A = $t;
            #[inline(always)] fn up(self) -> $t { self }
            #[inline(always)] fn down(a: $t) -> $t { a }
        }
    )*};
}
reducible_self!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! reducible_f64 {
    ($($t:ty),*) => {$(
        impl Reducible for $t {
            type A = f64;
            #[inline(always)] fn up(self) -> f64 { Num::to_f64(self) }
            #[inline(always)] fn down(a: f64) -> $t { <$t as Num>::from_f64(a) }
        }
    )*};
}
reducible_f64!(f32, f64, f16, bf16);

/// Folds `row` with eight interleaved accumulators combined in a fixed order at the
/// end: the same result every run, and a loop the compiler can vectorize.
#[inline(always)]
pub(crate) fn fold_row<T: Copy, A: Copy>(
    row: &[T],
    init: A,
    map: impl Fn(T) -> A,
    comb: impl Fn(A, A) -> A,
) -> A {
    let mut lanes = [init; 8];
    let mut chunks = row.chunks_exact(8);
    for c in &mut chunks {
        for k in 0..8 {
            lanes[k] = comb(lanes[k], map(c[k]));
        }
    }
    let mut acc = init;
    for l in lanes {
        acc = comb(acc, l);
    }
    for &x in chunks.remainder() {
        acc = comb(acc, map(x));
    }
    acc
}

/// Reduces the middle axis of `data` viewed as `[outer, len, inner]`.
fn fold3<T, A, M, C, F>(
    data: &[T],
    (outer, len, inner): (usize, usize, usize),
    init: A,
    map: M,
    comb: C,
    fin: F,
) -> Vec<T>
where
    T: Copy + Send + Sync + Default,
    A: Copy + Send + Sync,
    M: Fn(T) -> A + Sync,
    C: Fn(A, A) -> A + Sync,
    F: Fn(A) -> T + Sync,
{
    let mut out = vec![T::default(); outer * inner];
    let parallel = data.len() >= PAR_MIN;
    if inner == 1 {
        let per = (CHUNK / len.max(1)).max(1);
        for_chunks(&mut out, per, parallel, &|off, piece| {
            for (k, y) in piece.iter_mut().enumerate() {
                let o = off + k;
                *y = fin(fold_row(&data[o * len..(o + 1) * len], init, &map, &comb));
            }
        });
        return out;
    }
    // Strided: accumulate up to COLS outputs of one outer index at a time, walking
    // the reduced axis row by row (vectorizes over the columns).
    const COLS: usize = 1024;
    for_chunks(&mut out, COLS, parallel, &|off, piece| {
        let mut acc = [init; COLS];
        let mut p = 0;
        while p < piece.len() {
            let (o, j0) = ((off + p) / inner, (off + p) % inner);
            let w = COLS.min(inner - j0).min(piece.len() - p);
            let acc = &mut acc[..w];
            acc.fill(init);
            for r in 0..len {
                let row = &data[(o * len + r) * inner + j0..][..w];
                for (a, &x) in acc.iter_mut().zip(row) {
                    *a = comb(*a, map(x));
                }
            }
            for (y, &a) in piece[p..p + w].iter_mut().zip(acc.iter()) {
                *y = fin(a);
            }
            p += w;
        }
    });
    out
}

fn reduce_typed<T: Reducible>(data: &[T], dims: (usize, usize, usize), red: Red) -> Vec<T> {
    type A<T> = <T as Reducible>::A;
    let zero = <A<T> as Num>::ZERO;
    let len = dims.1;
    let f = |g: fn(f64) -> f64| move |a: A<T>| T::down(<A<T> as Num>::from_f64(g(a.to_f64())));
    match red {
        Red::Sum => fold3(data, dims, zero, T::up, Num::add, T::down),
        Red::Mean => {
            let n = <A<T> as Num>::from_i64(len as i64);
            fold3(data, dims, zero, T::up, Num::add, move |a: A<T>| {
                T::down(a.div(n))
            })
        }
        Red::Max => fold3(
            data,
            dims,
            <A<T> as Num>::LOWEST,
            T::up,
            Num::max_nan,
            T::down,
        ),
        Red::Min => fold3(
            data,
            dims,
            <A<T> as Num>::HIGHEST,
            T::up,
            Num::min_nan,
            T::down,
        ),
        Red::Prod => fold3(data, dims, <A<T> as Num>::ONE, T::up, Num::mul, T::down),
        Red::L1 => fold3(data, dims, zero, |x: T| Num::abs(x.up()), Num::add, T::down),
        Red::SumSquare => fold3(
            data,
            dims,
            zero,
            |x: T| x.up().mul(x.up()),
            Num::add,
            T::down,
        ),
        Red::L2 => fold3(
            data,
            dims,
            zero,
            |x: T| x.up().mul(x.up()),
            Num::add,
            f(f64::sqrt),
        ),
        Red::LogSum => fold3(data, dims, zero, T::up, Num::add, f(f64::ln)),
        Red::LogSumExp => {
            // max + log(sum(exp(x - max))): no overflow for large inputs. Rows are
            // contiguous here (the caller moves the reduced axes last).
            let (outer, len, _) = dims;
            (0..outer)
                .map(|o| {
                    let row = &data[o * len..(o + 1) * len];
                    let m = fold_row(row, f64::NEG_INFINITY, |x: T| x.to_f64(), f64::max);
                    if !m.is_finite() {
                        // Empty or all -inf rows give -inf; +inf and NaN propagate.
                        return T::from_f64(m);
                    }
                    let s = fold_row(row, 0.0, |x: T| (x.to_f64() - m).exp(), |a, b| a + b);
                    T::from_f64(m + s.ln())
                })
                .collect()
        }
    }
}

fn reduce_bool(data: &[bool], dims: (usize, usize, usize), red: Red) -> Result<Vec<bool>, OpError> {
    match red {
        Red::Max => Ok(fold3(data, dims, false, |x| x, |a, b| a | b, |a| a)),
        Red::Min => Ok(fold3(data, dims, true, |x| x, |a, b| a & b, |a| a)),
        _ => Err(OpError::unsupported(format!("Reduce{red:?} on bool"))),
    }
}

fn reduce(
    x: &Tensor,
    red: Red,
    axes: Option<&[i64]>,
    keepdims: bool,
    noop_empty: bool,
) -> Result<Tensor, OpError> {
    let shape = x.shape().to_vec();
    let rank = shape.len();
    let mut axes: Vec<usize> = match axes {
        Some(a) if !a.is_empty() => a
            .iter()
            .map(|&v| normalize_axis(v, rank))
            .collect::<Result<_, _>>()?,
        _ if noop_empty => return Ok(x.clone()),
        _ => (0..rank).collect(),
    };
    axes.sort_unstable();
    axes.dedup();
    let reduced: Vec<bool> = (0..rank).map(|i| axes.contains(&i)).collect();
    let out_shape: Vec<usize> = (0..rank)
        .filter_map(|i| match (reduced[i], keepdims) {
            (false, _) => Some(shape[i]),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();

    let contiguous_block = axes.windows(2).all(|w| w[1] == w[0] + 1);
    // LogSumExp works on contiguous rows; other reductions handle a strided block.
    let rows_needed = red == Red::LogSumExp && axes.last().is_some_and(|&l| l + 1 < rank);
    let (moved, dims) = if axes.is_empty() {
        (None, (shape.iter().product(), 1, 1))
    } else if contiguous_block && !rows_needed {
        (
            None,
            split3(&shape, axes[0], *axes.last().expect("non-empty")),
        )
    } else {
        let perm: Vec<usize> = (0..rank)
            .filter(|i| !reduced[*i])
            .chain(axes.iter().copied())
            .collect();
        let t = permute(x, &perm)?;
        let kept = rank - axes.len();
        let dims = split3(t.shape(), kept, rank - 1);
        (Some(t), dims)
    };
    let src = moved.as_ref().unwrap_or(x);
    macro_rules! go {
        ($a:expr) => {
            Tensor::from(array(&out_shape, reduce_typed(&contiguous($a), dims, red))?)
        };
    }
    Ok(match src {
        Tensor::F32(a) => go!(a),
        Tensor::F64(a) => go!(a),
        Tensor::F16(a) => go!(a),
        Tensor::BF16(a) => go!(a),
        Tensor::I8(a) => go!(a),
        Tensor::I16(a) => go!(a),
        Tensor::I32(a) => go!(a),
        Tensor::I64(a) => go!(a),
        Tensor::U8(a) => go!(a),
        Tensor::U16(a) => go!(a),
        Tensor::U32(a) => go!(a),
        Tensor::U64(a) => go!(a),
        Tensor::Bool(a) => {
            Tensor::Bool(array(&out_shape, reduce_bool(&contiguous(a), dims, red)?)?)
        }
        Tensor::String(_) => return Err(OpError::unsupported(format!("Reduce{red:?} on string"))),
    })
}

pub(super) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>> {
    let red = match spec.op_type {
        "ReduceSum" => Red::Sum,
        "ReduceMean" => Red::Mean,
        "ReduceMax" => Red::Max,
        "ReduceMin" => Red::Min,
        "ReduceProd" => Red::Prod,
        "ReduceL1" => Red::L1,
        "ReduceL2" => Red::L2,
        "ReduceSumSquare" => Red::SumSquare,
        "ReduceLogSum" => Red::LogSum,
        "ReduceLogSumExp" => Red::LogSumExp,
        _ => return None,
    };
    let axes_input_from = if red == Red::Sum { 13 } else { 18 };
    let axes_as_input = spec.opset >= axes_input_from;
    Some((|| {
        let keepdims = spec.attrs.int_or("keepdims", 1)? != 0;
        let noop = spec.attrs.int_or("noop_with_empty_axes", 0)? != 0;
        let attr_axes = if axes_as_input {
            None
        } else {
            spec.attrs.ints("axes")?
        };
        Ok(Box::new(move |inputs: &[Option<&Tensor>]| {
            let x = input(inputs, 0)?;
            let from_input;
            let axes = if axes_as_input {
                if inputs.get(1).copied().flatten().is_some() {
                    from_input = input_i64s(inputs, 1)?;
                    Some(from_input.as_slice())
                } else {
                    None
                }
            } else {
                attr_axes.as_deref()
            };
            Ok(vec![reduce(x, red, axes, keepdims, noop)?])
        }) as Box<dyn Kernel>)
    })())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hmct_tensor::ndarray::ArrayD;

    fn t(shape: &[usize], v: Vec<f32>) -> Tensor {
        Tensor::from_f32(shape, v).unwrap()
    }

    fn naive_sum(x: &ArrayD<f32>, axes: &[usize]) -> Vec<f32> {
        let mut a = x.mapv(|v| v as f64);
        for &ax in axes.iter().rev() {
            a = a.sum_axis(hmct_tensor::ndarray::Axis(ax));
        }
        a.iter().map(|&v| v as f32).collect()
    }

    #[test]
    fn every_axis_subset_matches_a_naive_sum() {
        let shape = [3, 4, 5, 2];
        let x: Vec<f32> = (0..120).map(|i| ((i * 37 % 11) as f32) - 5.5).collect();
        let xt = t(&shape, x);
        for mask in 1u32..16 {
            let axes: Vec<usize> = (0..4).filter(|i| mask & (1 << i) != 0).collect();
            let ax64: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
            let got = reduce(&xt, Red::Sum, Some(&ax64), false, false).unwrap();
            let want = naive_sum(xt.as_f32().unwrap(), &axes);
            assert_eq!(
                got.as_f32().unwrap().iter().copied().collect::<Vec<_>>(),
                want,
                "{axes:?}"
            );
        }
    }

    #[test]
    fn empty_sets_give_identities() {
        let x = t(&[2, 0, 3], vec![]);
        let max = reduce(&x, Red::Max, Some(&[1]), true, false).unwrap();
        assert_eq!(max.shape(), &[2, 1, 3]);
        assert!(
            max.as_f32()
                .unwrap()
                .iter()
                .all(|&v| v == f32::NEG_INFINITY)
        );
        let prod = reduce(&x, Red::Prod, Some(&[1]), false, false).unwrap();
        assert!(prod.as_f32().unwrap().iter().all(|&v| v == 1.0));
    }

    #[test]
    fn log_sum_exp_is_stable_and_noop_keeps_input() {
        let x = t(&[2, 2], vec![1000.0, 1000.0, -1.0, 2.0]);
        let got = reduce(&x, Red::LogSumExp, Some(&[0]), false, false).unwrap();
        let g = got.as_f32().unwrap();
        assert!((g[[0]] - 1000.0).abs() < 1e-3);
        assert!((g[[1]] - 1000.0).abs() < 1e-3);
        assert_eq!(reduce(&x, Red::Sum, Some(&[]), true, true).unwrap(), x);
    }

    #[test]
    fn large_strided_reductions_are_thread_count_independent() {
        let n = 7 * 300 * 97;
        let x = t(
            &[7, 300, 97],
            (0..n).map(|i| ((i as f32) * 0.37).sin()).collect(),
        );
        let run = |threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| reduce(&x, Red::Mean, Some(&[1]), true, false).unwrap())
        };
        assert_eq!(run(1), run(4));
    }
}
