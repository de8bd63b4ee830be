//! Ops that move data without computing on it (plus the few that make index or shape
//! tensors): Reshape, Flatten, Transpose, Squeeze/Unsqueeze, Concat, Split, Slice,
//! Gather*/Scatter*, Expand, Tile, Pad, DepthToSpace/SpaceToDepth, Shape, Size,
//! ConstantOfShape, Range, Identity, Dropout (inference), NonZero, Trilu.
//!
//! All are generic over every element type a [`Tensor`] holds.

mod gather;
mod generate;
mod layout;
mod slice;

use hmct_tensor::ndarray::{ArrayD, ArrayViewD, IxDyn};
use hmct_tensor::{Tensor, map_tensor_same};

use super::elementwise::broadcast::contiguous;
use super::{Kernel, NodeSpec, OpError};

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
    Ok(map_tensor_same!(t, a => std_owned(a.view().permuted_axes(IxDyn(perm)))))
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

pub(crate) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>> {
    layout::build(spec)
        .or_else(|| slice::build(spec))
        .or_else(|| gather::build(spec))
        .or_else(|| generate::build(spec))
}
