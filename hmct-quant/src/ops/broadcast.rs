//! Element-wise maps over one, two or three arrays with numpy broadcasting.
//!
//! Binary and ternary maps collapse the broadcast into runs: adjacent dimensions that all inputs
//! walk the same way are merged, so the innermost run is a contiguous stretch of the
//! output where each input is either contiguous or a single repeated value (a scalar,
//! or a per-channel constant as in `[N,C,H,W] * [C,1,1]`). Those runs are simple loops
//! the compiler vectorizes. Large outputs are split into fixed-size chunks of output
//! elements for rayon; nothing is reduced across chunks, so results do not depend on
//! the thread count.

use hmct_tensor::ndarray::{ArrayD, IxDyn};
use rayon::prelude::*;

use crate::ops::OpError;
use crate::ops::arrays::{array, contiguous};

/// Outputs smaller than this run on the calling thread.
pub(crate) const PAR_MIN: usize = 1 << 15;
/// Output elements per parallel task.
pub(crate) const CHUNK: usize = 1 << 13;

/// Numpy-style broadcast of two shapes.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Vec<usize>, OpError> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(OpError::invalid(format!(
                "shapes {a:?} and {b:?} do not broadcast"
            )));
        };
    }
    Ok(out)
}

/// Whether an operand of shape `operand` broadcasts to `shape` without changing it,
/// varying along axis 1 at most: one value, or one per channel.
pub(crate) fn along_axis1_only(operand: &[usize], shape: &[usize]) -> bool {
    let Some(lead) = shape.len().checked_sub(operand.len()) else {
        return false;
    };
    operand
        .iter()
        .enumerate()
        .all(|(d, &n)| n == 1 || (lead + d == 1 && n == shape[1]))
}

/// Runs `f(offset, piece)` over `out` cut into pieces of `chunk` elements, on the
/// rayon pool when `parallel`. Taking `f` as a trait object keeps rayon's machinery
/// instantiated once per element type rather than once per kernel.
pub(crate) fn for_chunks<O: Send>(
    out: &mut [O],
    chunk: usize,
    parallel: bool,
    f: &(dyn Fn(usize, &mut [O]) + Sync),
) {
    if parallel && crate::par::enabled() {
        let chunk = chunk.max(1);
        out.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, piece)| f(i * chunk, piece));
    } else {
        f(0, out);
    }
}

/// Runs `f(scratch, (i, chunk))` over `out` cut into chunks of `len` elements (chunk
/// `i` from element `i * len`), on the rayon pool when `parallel`, each thread with
/// its own scratch (buffers a kernel reuses from chunk to chunk).
pub(crate) fn for_chunks_with_scratch<O: Send, S: Default>(
    out: &mut [O],
    len: usize,
    parallel: bool,
    f: impl Fn(&mut S, (usize, &mut [O])) + Sync + Send,
) {
    if parallel && crate::par::enabled() {
        out.par_chunks_mut(len)
            .enumerate()
            .for_each_init(S::default, f);
    } else {
        let mut scratch = S::default();
        out.chunks_mut(len)
            .enumerate()
            .for_each(|chunk| f(&mut scratch, chunk));
    }
}

/// `f` applied to every element.
pub(crate) fn unary<T, O, F>(a: &ArrayD<T>, f: F) -> ArrayD<O>
where
    T: Copy + Sync,
    O: Copy + Default + Send + 'static,
    F: Fn(T) -> O + Sync,
{
    let src = contiguous(a);
    let mut out = crate::buffers::take::<O>(src.len());
    for_chunks(&mut out, CHUNK, src.len() >= PAR_MIN, &|off, piece| {
        map_into(&src[off..off + piece.len()], piece, &f)
    });
    ArrayD::from_shape_vec(IxDyn(a.shape()), out).expect("same element count as the input")
}

/// `f` applied to every element of `data`, in place.
pub(crate) fn unary_in_place<T, F>(data: &mut [T], f: F)
where
    T: Copy + Send,
    F: Fn(T) -> T + Sync,
{
    for_chunks(data, CHUNK, data.len() >= PAR_MIN, &|_, piece| {
        map_in_place(piece, &f)
    });
}

// The loops of `unary` and `unary_in_place`, compiled for AVX-512 and AVX2 where the
// CPU has them: activations such as HardSwish, Clip and Relu are arithmetic and
// selects that vectorize 16 or 8 wide there, against 4 wide with x86-64's baseline
// SSE2 (MobileNetV3's HardSwish tails took 5% of its run). Each element gets the same
// operations either way (Rust never contracts `a * b + c` into an FMA, and `mul_add`
// is fused everywhere), so the bits do not depend on the CPU.

#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl", "x86_64+avx2+fma"))]
fn map_into<T: Copy, O, F: Fn(T) -> O>(src: &[T], out: &mut [O], f: &F) {
    for (y, &x) in out.iter_mut().zip(src) {
        *y = f(x);
    }
}

// In place, each piece goes through a copy on the stack: mapped as `*v = f(*v)`, the
// compiler drops the stores where `f` returns its argument (Relu's positive values)
// and writes the others with masked stores, which on a Zen 3 are slow: Relu over
// ResNet-50's 3 MB residual sums ran at a third of the speed of the Add before it.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl", "x86_64+avx2+fma"))]
fn map_in_place<T: Copy, F: Fn(T) -> T>(data: &mut [T], f: &F) {
    const STAGE: usize = 256;
    for piece in data.chunks_mut(STAGE) {
        let mut staged = [piece[0]; STAGE];
        let staged = &mut staged[..piece.len()];
        staged.copy_from_slice(piece);
        for (y, &x) in piece.iter_mut().zip(staged.iter()) {
            *y = f(x);
        }
    }
}

/// `f(a, b)` with numpy broadcasting, written over `dst`, which holds `a` when
/// `dst_is_a` and `b` otherwise. Gives the values of [`binary`]; returns false (and
/// leaves `dst` alone) when `dst` does not have the broadcast shape or is not
/// contiguous.
pub(crate) fn binary_in_place<T, F>(
    dst: &mut ArrayD<T>,
    other: &ArrayD<T>,
    dst_is_a: bool,
    f: F,
) -> bool
where
    T: Copy + Send + Sync,
    F: Fn(T, T) -> T + Sync,
{
    if dst_is_a {
        update(dst, other, |d, o| f(d, o))
    } else {
        update(dst, other, |d, o| f(o, d))
    }
}

/// `dst = g(dst, other)` element-wise, `other` broadcast to `dst`'s shape.
fn update<T, G>(dst: &mut ArrayD<T>, other: &ArrayD<T>, g: G) -> bool
where
    T: Copy + Send + Sync,
    G: Fn(T, T) -> T + Sync,
{
    let shape = dst.shape().to_vec();
    if broadcast_shapes(&shape, other.shape()).ok().as_deref() != Some(&shape[..]) {
        return false;
    }
    let Some(d) = dst.as_slice_mut() else {
        return false;
    };
    let n = d.len();
    if n == 0 {
        return true;
    }
    let o = contiguous(other);
    if o.len() == n {
        for_chunks(d, CHUNK, n >= PAR_MIN, &|off, piece| {
            for (v, &y) in piece.iter_mut().zip(&o[off..]) {
                *v = g(*v, y);
            }
        });
        return true;
    }
    // `other` is smaller, so n > 1 and the walk has at least one dimension.
    // (`dst` is contiguous in the output's shape: it never splits a run.)
    let walk = Walk::new([other.shape()], &shape);
    let (inner, [step]) = walk.inner();
    let rows_per_piece = (CHUNK / inner).max(1);
    for_chunks(d, rows_per_piece * inner, n >= PAR_MIN, &|off, piece| {
        for (r, row) in piece.chunks_mut(inner).enumerate() {
            let [ob] = walk.offsets(off / inner + r);
            if step == 1 {
                for (v, &y) in row.iter_mut().zip(&o[ob..]) {
                    *v = g(*v, y);
                }
            } else {
                let y = o[ob];
                for v in row.iter_mut() {
                    *v = g(*v, y);
                }
            }
        }
    });
    true
}

/// How a broadcast map walks its `K` inputs: collapsed output dimensions and each
/// input's element stride per dimension (0 where it is broadcast).
struct Walk<const K: usize> {
    dims: Vec<usize>,
    strides: Vec<[usize; K]>,
}

impl<const K: usize> Walk<K> {
    fn new(inputs: [&[usize]; K], out: &[usize]) -> Walk<K> {
        let strides = |shape: &[usize]| -> Vec<usize> {
            let pad = out.len() - shape.len();
            let mut s = vec![0; out.len()];
            let mut acc = 1;
            for i in (0..shape.len()).rev() {
                s[pad + i] = if shape[i] == 1 { 0 } else { acc };
                acc *= shape[i];
            }
            s
        };
        let full = inputs.map(strides);
        // Merge each dimension into the run after it when every input continues its
        // stride pattern across the boundary.
        let mut dims: Vec<usize> = Vec::new();
        let mut runs: Vec<[usize; K]> = Vec::new();
        for i in (0..out.len()).rev() {
            if out[i] == 1 {
                continue;
            }
            let here: [usize; K] = std::array::from_fn(|k| full[k][i]);
            if let (Some(&d), Some(last)) = (dims.last(), runs.last())
                && (0..K).all(|k| here[k] == last[k] * d)
            {
                *dims.last_mut().expect("non-empty") *= out[i];
                continue;
            }
            dims.push(out[i]);
            runs.push(here);
        }
        if dims.is_empty() {
            // A single output value.
            dims.push(1);
            runs.push([0; K]);
        }
        dims.reverse();
        runs.reverse();
        Walk {
            dims,
            strides: runs,
        }
    }

    /// Length of the innermost run, and each input's step along it (1, or 0 where
    /// the input repeats one value).
    fn inner(&self) -> (usize, [usize; K]) {
        let last = self.dims.len() - 1;
        (self.dims[last], self.strides[last])
    }

    /// Input offsets of the first element of outer row `row`.
    #[inline]
    fn offsets(&self, mut row: usize) -> [usize; K] {
        let mut at = [0; K];
        for i in (0..self.dims.len() - 1).rev() {
            let d = self.dims[i];
            let idx = row % d;
            row /= d;
            for (o, s) in at.iter_mut().zip(self.strides[i]) {
                *o += idx * s;
            }
        }
        at
    }
}

#[inline(always)]
fn run<A: Copy, B: Copy, O>(
    out: &mut [O],
    a: &[A],
    a_step: usize,
    b: &[B],
    b_step: usize,
    f: &impl Fn(A, B) -> O,
) {
    let n = out.len();
    match (a_step, b_step) {
        (1, 1) => {
            for ((o, &x), &y) in out.iter_mut().zip(&a[..n]).zip(&b[..n]) {
                *o = f(x, y);
            }
        }
        (1, _) => {
            let y = b[0];
            for (o, &x) in out.iter_mut().zip(&a[..n]) {
                *o = f(x, y);
            }
        }
        (_, 1) => {
            let x = a[0];
            for (o, &y) in out.iter_mut().zip(&b[..n]) {
                *o = f(x, y);
            }
        }
        _ => {
            let (x, y) = (a[0], b[0]);
            for o in out.iter_mut() {
                *o = f(x, y);
            }
        }
    }
}

/// `f(a, b)` with numpy broadcasting.
pub(crate) fn binary<A, B, O, F>(a: &ArrayD<A>, b: &ArrayD<B>, f: F) -> Result<ArrayD<O>, OpError>
where
    A: Copy + Sync,
    B: Copy + Sync,
    O: Copy + Send + Default + 'static,
    F: Fn(A, B) -> O + Sync + Send,
{
    let out_shape = broadcast_shapes(a.shape(), b.shape())?;
    let n: usize = out_shape.iter().product();
    let (xa, xb) = (contiguous(a), contiguous(b));
    if n == 0 {
        return array(&out_shape, Vec::new());
    }
    // Same length means the same elements in the same order (only 1-dims differ).
    if xa.len() == n && xb.len() == n {
        let out: Vec<O> = if n >= PAR_MIN {
            let mut out = crate::buffers::take::<O>(n);
            for_chunks(&mut out, CHUNK, true, &|off, piece| {
                let m = piece.len();
                run(piece, &xa[off..off + m], 1, &xb[off..off + m], 1, &f);
            });
            out
        } else {
            xa.iter().zip(xb.iter()).map(|(&x, &y)| f(x, y)).collect()
        };
        return array(&out_shape, out);
    }
    let walk = Walk::new([a.shape(), b.shape()], &out_shape);
    let (inner, [ia, ib]) = walk.inner();
    let mut out = crate::buffers::take::<O>(n);
    // Pieces hold whole rows, so each starts at a row boundary.
    let rows_per_piece = (CHUNK / inner).max(1);
    for_chunks(
        &mut out,
        rows_per_piece * inner,
        n >= PAR_MIN,
        &|off, piece| {
            for (r, row_out) in piece.chunks_mut(inner).enumerate() {
                let [oa, ob] = walk.offsets(off / inner + r);
                run(row_out, &xa[oa..], ia, &xb[ob..], ib, &f);
            }
        },
    );
    array(&out_shape, out)
}

/// `f(c, x, y)` with numpy broadcasting of three arrays (clone-based; for `Where`),
/// walked in runs as [`binary`] walks two.
pub(crate) fn ternary<C, X, Y, O, F>(
    c: &ArrayD<C>,
    x: &ArrayD<X>,
    y: &ArrayD<Y>,
    f: F,
) -> Result<ArrayD<O>, OpError>
where
    C: Clone,
    X: Clone,
    Y: Clone,
    O: Clone + Default + 'static,
    F: Fn(&C, &X, &Y) -> O,
{
    let shape = broadcast_shapes(&broadcast_shapes(c.shape(), x.shape())?, y.shape())?;
    let n: usize = shape.iter().product();
    if n == 0 {
        return array(&shape, Vec::new());
    }
    let (cs, xs, ys) = (contiguous(c), contiguous(x), contiguous(y));
    let walk = Walk::new([c.shape(), x.shape(), y.shape()], &shape);
    let (inner, [ic, ix, iy]) = walk.inner();
    // Every element is written below. f32 results come from the pool: Swin-T's
    // Wheres faulted in fresh pages on every run.
    let mut data = crate::buffers::take::<O>(n);
    for (row, out) in data.chunks_exact_mut(inner).enumerate() {
        let [oc, ox, oy] = walk.offsets(row);
        for (j, o) in out.iter_mut().enumerate() {
            *o = f(&cs[oc + j * ic], &xs[ox + j * ix], &ys[oy + j * iy]);
        }
    }
    array(&shape, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arr(shape: &[usize], f: impl Fn(usize) -> f32) -> ArrayD<f32> {
        let n = shape.iter().product();
        array(shape, (0..n).map(f).collect()).unwrap()
    }

    /// Reference: ndarray's own broadcasting.
    fn reference(a: &ArrayD<f32>, b: &ArrayD<f32>) -> ArrayD<f32> {
        let s = broadcast_shapes(a.shape(), b.shape()).unwrap();
        let av = a.broadcast(IxDyn(&s)).unwrap();
        let bv = b.broadcast(IxDyn(&s)).unwrap();
        let mut out = ArrayD::zeros(IxDyn(&s));
        hmct_tensor::ndarray::Zip::from(&mut out)
            .and(&av)
            .and(&bv)
            .for_each(|o, &x, &y| *o = x * 10.0 + y);
        out
    }

    #[test]
    fn broadcast_patterns_match_ndarray() {
        let cases: &[(&[usize], &[usize])] = &[
            (&[2, 3, 4, 5], &[3, 1, 1]),
            (&[2, 3, 4, 5], &[1, 3, 1, 5]),
            (&[4, 1], &[1, 6]),
            (&[1, 6], &[4, 1]),
            (&[3, 4], &[4]),
            (&[3, 1, 5], &[1, 4, 1]),
            (&[], &[3, 2]),
            (&[2, 1, 3, 1], &[2, 1, 1, 4]),
            (&[1], &[2, 2]),
            (&[2, 3], &[2, 3]),
            (&[0, 3], &[3]),
            (&[64, 64, 16], &[64, 1, 16]),
        ];
        for (sa, sb) in cases {
            let a = arr(sa, |i| i as f32);
            let b = arr(sb, |i| (i as f32) * 0.5 - 1.0);
            let got = binary(&a, &b, |x, y| x * 10.0 + y).unwrap();
            assert_eq!(got, reference(&a, &b), "{sa:?} with {sb:?}");
            assert!(got.is_standard_layout());
        }
    }

    #[test]
    fn ternary_broadcast_patterns_match_ndarray() {
        let cases: &[[&[usize]; 3]] = &[
            [&[2, 3, 4, 5], &[2, 3, 4, 5], &[2, 3, 4, 5]],
            [&[64, 49, 49], &[], &[64, 49, 49]],
            [&[1, 1, 6, 6], &[2, 3, 6, 6], &[]],
            [&[2, 3, 4, 5], &[3, 1, 1], &[1, 3, 1, 5]],
            [&[4, 1], &[1, 6], &[4, 6]],
            [&[3, 1, 5], &[1, 4, 1], &[5]],
            [&[], &[], &[]],
            [&[1], &[2, 2], &[1, 1]],
            [&[0, 3], &[3], &[1]],
        ];
        for [sc, sx, sy] in cases {
            let c = arr(sc, |i| (i * 7 % 3) as f32);
            let x = arr(sx, |i| i as f32);
            let y = arr(sy, |i| (i as f32) * 0.5 - 1.0);
            let got = ternary(&c, &x, &y, |&c, &p, &q| if c > 0.5 { p } else { q }).unwrap();
            let shape = broadcast_shapes(&broadcast_shapes(sc, sx).unwrap(), sy).unwrap();
            let (cv, xv, yv) = (
                c.broadcast(IxDyn(&shape)).unwrap(),
                x.broadcast(IxDyn(&shape)).unwrap(),
                y.broadcast(IxDyn(&shape)).unwrap(),
            );
            let mut want = ArrayD::zeros(IxDyn(&shape));
            hmct_tensor::ndarray::Zip::from(&mut want)
                .and(&cv)
                .and(&xv)
                .and(&yv)
                .for_each(|o, &c, &p, &q| *o = if c > 0.5 { p } else { q });
            assert_eq!(got, want, "{sc:?}, {sx:?}, {sy:?}");
        }
    }

    #[test]
    fn in_place_matches_a_fresh_output() {
        let cases: &[(&[usize], &[usize])] = &[
            (&[2, 3, 4, 5], &[3, 1, 1]),
            (&[2, 3, 4, 5], &[1, 3, 1, 5]),
            (&[2, 3, 4, 5], &[2, 3, 4, 5]),
            (&[3, 4], &[4]),
            (&[3, 4], &[]),
            (&[1], &[1]),
            (&[4, 8, 64, 33], &[8, 1, 33]),
        ];
        let f = |x: f32, y: f32| x * 10.0 - y;
        for (sa, sb) in cases {
            let a = arr(sa, |i| (i as f32).sin());
            let b = arr(sb, |i| (i as f32) * 0.5 - 1.0);
            let mut d = a.clone();
            assert!(binary_in_place(&mut d, &b, true, f), "{sa:?} with {sb:?}");
            assert_eq!(d, binary(&a, &b, f).unwrap(), "{sa:?} with {sb:?}");
            let mut d = a.clone();
            assert!(binary_in_place(&mut d, &b, false, f), "{sb:?} with {sa:?}");
            assert_eq!(d, binary(&b, &a, f).unwrap(), "{sb:?} with {sa:?}");
        }
    }

    #[test]
    fn in_place_refuses_a_destination_smaller_than_the_output() {
        let a = arr(&[3, 1], |i| i as f32);
        let b = arr(&[1, 4], |i| i as f32);
        let mut d = a.clone();
        assert!(!binary_in_place(&mut d, &b, true, |x, y| x + y));
        assert_eq!(d, a);
    }

    #[test]
    fn incompatible_shapes_are_an_error() {
        let a = arr(&[2, 3], |i| i as f32);
        let b = arr(&[2], |i| i as f32);
        assert!(binary(&a, &b, |x, y| x + y).is_err());
    }

    #[test]
    fn large_outputs_are_identical_across_pool_sizes() {
        let a = arr(&[4, 8, 64, 33], |i| (i as f32).sin());
        let b = arr(&[8, 1, 33], |i| (i as f32).cos());
        let run_in = |threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| binary(&a, &b, |x, y| x * 10.0 + y).unwrap())
        };
        let one = run_in(1);
        assert_eq!(one, run_in(3));
        assert_eq!(one, reference(&a, &b));
    }
}
