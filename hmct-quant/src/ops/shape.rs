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

use super::{Kernel, NodeSpec, OpError};

pub(crate) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>> {
    layout::build(spec)
        .or_else(|| slice::build(spec))
        .or_else(|| gather::build(spec))
        .or_else(|| generate::build(spec))
}
