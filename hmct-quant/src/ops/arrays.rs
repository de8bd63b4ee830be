//! Array plumbing every kind of kernel shares: an array's data in row-major order,
//! arrays from a shape and data, reshaping and permuting tensors, and the
//! `[outer, len, inner]` view of a shape around an axis.

use std::borrow::Cow;

use hmct_tensor::ndarray::{ArrayD, ArrayViewD, IxDyn};
use hmct_tensor::{Tensor, map_tensor_same};

use super::OpError;

/// The elements of `a` in row-major order, borrowed when `a` is already standard
/// (a copy only for other layouts).
pub(crate) fn contiguous<T: Clone>(a: &ArrayD<T>) -> Cow<'_, [T]> {
    match a.as_slice() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(a.iter().cloned().collect()),
    }
}

/// Builds an array from a shape and row-major data of matching length.
pub(crate) fn array<T>(shape: &[usize], data: Vec<T>) -> Result<ArrayD<T>, OpError> {
    ArrayD::from_shape_vec(IxDyn(shape), data).map_err(|e| OpError::invalid(e.to_string()))
}

/// `[outer, len, inner]` sizes of `shape` around axes `a0..=a1`.
pub(crate) fn split3(shape: &[usize], a0: usize, a1: usize) -> (usize, usize, usize) {
    let outer = shape[..a0].iter().product();
    let len = shape[a0..=a1].iter().product();
    let inner = shape[a1 + 1..].iter().product();
    (outer, len, inner)
}

/// An owned standard-layout copy of a view (strided views are walked in logical
/// order).
pub(crate) fn std_owned<T: Clone>(v: ArrayViewD<'_, T>) -> ArrayD<T> {
    if v.is_standard_layout() {
        v.to_owned()
    } else {
        let shape = v.shape().to_vec();
        ArrayD::from_shape_vec(IxDyn(&shape), v.iter().cloned().collect())
            .expect("element count of the view")
    }
}

/// `t` with its axes reordered: output axis `i` is input axis `perm[i]`.
pub(crate) fn permute(t: &Tensor, perm: &[usize]) -> Result<Tensor, OpError> {
    let rank = t.shape().len();
    let mut seen = vec![false; rank];
    if perm.len() != rank
        || perm
            .iter()
            .any(|&p| p >= rank || std::mem::replace(&mut seen[p], true))
    {
        return Err(OpError::invalid(format!(
            "{perm:?} is not a permutation of {rank} axes"
        )));
    }
    let out_shape: Vec<usize> = perm.iter().map(|&p| t.shape()[p]).collect();
    Ok(map_tensor_same!(t, a => ArrayD::from_shape_vec(
        IxDyn(&out_shape),
        permute_data(&contiguous(a), a.shape(), perm),
    )
    .map_err(|e| OpError::invalid(e.to_string()))?))
}

/// Row-major data of the permuted array. Output axes that stay adjacent in the input
/// are merged first; then either whole input rows are copied, or, when the input's
/// innermost axis moves, the copy goes in 32x32 tiles so both sides stay in cache.
pub(crate) fn permute_data<T: Clone + Default + 'static>(
    src: &[T],
    shape: &[usize],
    perm: &[usize],
) -> Vec<T> {
    let rank = shape.len();
    let mut in_st = vec![1usize; rank];
    for k in (0..rank.saturating_sub(1)).rev() {
        in_st[k] = in_st[k + 1] * shape[k + 1];
    }
    // Output dimensions with their input strides, size-1 axes dropped, runs merged.
    let (mut dims, mut st): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    for &p in perm {
        if shape[p] == 1 {
            continue;
        }
        match (dims.last_mut(), st.last_mut()) {
            (Some(d), Some(s)) if *s == in_st[p] * shape[p] => {
                *d *= shape[p];
                *s = in_st[p];
            }
            _ => {
                dims.push(shape[p]);
                st.push(in_st[p]);
            }
        }
    }
    let n: usize = dims.iter().product();
    if n == 0 || dims.len() <= 1 {
        // The order does not change (ViT's `[197, 1, 384]` to `[1, 197, 384]`): a copy,
        // into a recycled buffer as below.
        let mut out = crate::buffers::take::<T>(src.len());
        out.clone_from_slice(src);
        return out;
    }
    let k = dims.len();
    // Every element is written below. f32 results come from the pool: a fresh
    // zeroed megabyte is fresh pages, faulted in on every run (ShuffleNet's
    // channel-shuffle Transposes spent as long in the page-fault path as copying).
    let mut out = crate::buffers::take::<T>(n);
    let mut ost = vec![1usize; k];
    for i in (0..k - 1).rev() {
        ost[i] = ost[i + 1] * dims[i + 1];
    }
    let last = dims[k - 1];
    if st[k - 1] == 1 {
        for (row, dst) in out.chunks_mut(last).enumerate() {
            let mut rest = row;
            let mut base = 0;
            for i in (0..k - 1).rev() {
                base += (rest % dims[i]) * st[i];
                rest /= dims[i];
            }
            dst.clone_from_slice(&src[base..base + last]);
        }
        return out;
    }
    // The input's innermost axis (stride 1) is output axis `p`; tile (p, last).
    const TILE: usize = 32;
    let p = st
        .iter()
        .position(|&s| s == 1)
        .expect("the innermost input axis");
    let others: Vec<usize> = (0..k - 1).filter(|&i| i != p).collect();
    let combos: usize = others.iter().map(|&i| dims[i]).product();
    let (dp, sl) = (dims[p], st[k - 1]);
    // Where combination `c` of the other output axes starts in the input and output.
    let starts = |c: usize| {
        let (mut rest, mut bin, mut bout) = (c, 0, 0);
        for &i in others.iter().rev() {
            let idx = rest % dims[i];
            rest /= dims[i];
            bin += idx * st[i];
            bout += idx * ost[i];
        }
        (bin, bout)
    };
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::features().avx2
        && let (Some(src), Some(outf)) = (
            super::conv::f32_slice(src),
            super::conv::f32_slice_mut(&mut out),
        )
    {
        for c in 0..combos {
            let (bin, bout) = starts(c);
            // SAFETY: AVX2 was checked.
            unsafe { transpose_f32(src, [bin, sl], outf, [bout, ost[p]], [dp, last]) };
        }
        return out;
    }
    for c in 0..combos {
        let (bin, bout) = starts(c);
        for i0 in (0..dp).step_by(TILE) {
            for j0 in (0..last).step_by(TILE) {
                for i in i0..(i0 + TILE).min(dp) {
                    let o = bout + i * ost[p];
                    for j in j0..(j0 + TILE).min(last) {
                        out[o + j] = src[bin + i + j * sl].clone();
                    }
                }
            }
        }
    }
    out
}

/// `out[o + i·os + j] = src[b + i + j·sl]` for `i < rows`, `j < cols` (`[b, sl]`,
/// `[o, os]`), in blocks of 8x8 transposed in registers, 32x32 at a time so both
/// sides stay in cache. Copied value by value with strided loads, it took about five
/// cycles a value: SSDlite's class-head Transposes ran at six times onnxruntime's time.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose_f32(
    src: &[f32],
    [b, sl]: [usize; 2],
    out: &mut [f32],
    [o, os]: [usize; 2],
    [rows, cols]: [usize; 2],
) {
    use std::arch::x86_64::*;
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(b + (rows - 1) + (cols - 1) * sl < src.len());
    assert!(o + (rows - 1) * os + cols - 1 < out.len());
    const TILE: usize = 32;
    let (r8, c8) = (rows / 8 * 8, cols / 8 * 8);
    for i1 in (0..r8).step_by(TILE) {
        for j1 in (0..c8).step_by(TILE) {
            for i0 in (i1..r8.min(i1 + TILE)).step_by(8) {
                for j0 in (j1..c8.min(j1 + TILE)).step_by(8) {
                    let mut v = [_mm256_setzero_ps(); 8];
                    for (jj, v) in v.iter_mut().enumerate() {
                        // SAFETY: values `i0 .. i0 + 8 <= rows` of column `j0 + jj <
                        // cols`, inside `src` (asserted above).
                        *v = unsafe { _mm256_loadu_ps(src.as_ptr().add(b + i0 + (j0 + jj) * sl)) };
                    }
                    super::channel_lanes::transpose8(&mut v);
                    for (ii, v) in v.iter().enumerate() {
                        // SAFETY: values `j0 .. j0 + 8 <= cols` of row `i0 + ii < rows`,
                        // inside `out` (asserted above).
                        unsafe {
                            _mm256_storeu_ps(out.as_mut_ptr().add(o + (i0 + ii) * os + j0), *v)
                        };
                    }
                }
            }
        }
    }
    // The rows past the last block of 8, and the columns past it in the others.
    for i in 0..rows {
        for j in if i < r8 { c8 } else { 0 }..cols {
            out[o + i * os + j] = src[b + i + j * sl];
        }
    }
}

/// `t`'s elements (row-major) under a new shape of the same size.
pub(crate) fn reshaped(t: &Tensor, shape: &[usize]) -> Result<Tensor, OpError> {
    if shape.iter().product::<usize>() != t.len() {
        return Err(OpError::invalid(format!(
            "cannot reshape {:?} ({} elements) to {shape:?}",
            t.shape(),
            t.len()
        )));
    }
    Ok(
        map_tensor_same!(t, a => ArrayD::from_shape_vec(IxDyn(shape), contiguous(a).into_owned())
        .map_err(|e| OpError::invalid(e.to_string()))?),
    )
}

/// [`reshaped`] of a tensor the caller owns: the same buffer under the new shape when
/// its values are in standard order (no copy), else a copy.
pub(crate) fn reshaped_owned(t: Tensor, shape: &[usize]) -> Result<Tensor, OpError> {
    if shape.iter().product::<usize>() != t.len() {
        return reshaped(&t, shape);
    }
    Ok(map_tensor_same!(t, a => {
        if a.is_standard_layout() {
            a.into_shape_with_order(IxDyn(shape))
        } else {
            ArrayD::from_shape_vec(IxDyn(shape), contiguous(&a).into_owned())
        }
        .map_err(|e| OpError::invalid(e.to_string()))?
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reshaping_an_owned_tensor_keeps_its_buffer_when_it_can() {
        let t = Tensor::from_f32(&[2, 3, 4], (0..24).map(|i| i as f32).collect()).unwrap();
        let owned = t.clone();
        let at = owned.as_f32().unwrap().as_ptr();
        let r = reshaped_owned(owned, &[6, 4]).unwrap();
        assert_eq!(r.shape(), &[6, 4]);
        assert_eq!(r.as_f32().unwrap().as_ptr(), at);
        assert_eq!(r, reshaped(&t, &[6, 4]).unwrap());
        // A transposed view is copied in standard order, as `reshaped` does.
        let Tensor::F32(a) = &t else { unreachable!() };
        let tr = Tensor::F32(a.clone().reversed_axes());
        assert_eq!(
            reshaped_owned(tr.clone(), &[24]).unwrap(),
            reshaped(&tr, &[24]).unwrap()
        );
        assert!(reshaped_owned(tr, &[5, 5]).is_err());
    }

    #[test]
    fn permute_matches_ndarray_for_every_permutation_of_four_axes() {
        // The second shape has blocks of 8x8 and 32x32 (f32 with AVX2) and edges past
        // them on both sides.
        for shape in [[2, 3, 1, 40], [3, 17, 2, 45]] {
            let n = shape.iter().product::<usize>();
            let t = Tensor::from_f32(&shape, (0..n).map(|i| i as f32).collect()).unwrap();
            let a = t.as_f32().unwrap();
            let mut perms = vec![];
            for p0 in 0..4 {
                for p1 in 0..4 {
                    for p2 in 0..4 {
                        for p3 in 0..4 {
                            let p = [p0, p1, p2, p3];
                            if (0..4).all(|v| p.contains(&v)) {
                                perms.push(p);
                            }
                        }
                    }
                }
            }
            assert_eq!(perms.len(), 24);
            for p in perms {
                let got = permute(&t, &p).unwrap();
                let want = a
                    .view()
                    .permuted_axes(IxDyn(&p))
                    .as_standard_layout()
                    .into_owned();
                assert_eq!(got, Tensor::F32(want), "{shape:?} {p:?}");
            }
        }
        let t = Tensor::from_f32(&[1, 2, 3, 4], vec![0.0; 24]).unwrap();
        assert!(permute(&t, &[0, 1, 1, 2]).is_err());
    }
}
