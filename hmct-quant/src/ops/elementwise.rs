//! Element-wise kernels: unary math and activations, broadcasting arithmetic,
//! comparisons and logic, variadic Min/Max/Sum/Mean, Where, Clip and Cast.

mod binary;
pub(crate) mod cast;
pub(crate) mod step;
mod unary;

use super::{Kernel, NodeSpec, OpError};

pub(crate) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>> {
    unary::build(spec)
        .or_else(|| binary::build(spec))
        .or_else(|| cast::build(spec))
}
