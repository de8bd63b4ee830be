//! Element-wise kernels: unary math and activations, broadcasting arithmetic,
//! comparisons and logic, variadic Min/Max/Sum/Mean, Where, Clip and Cast.
//!
//! The broadcasting engine and the numeric traits live here too and are shared with
//! the reduction and shape kernels.

mod binary;
pub(crate) mod broadcast;
pub(crate) mod cast;
mod fastmath;
pub(crate) mod num;
pub(crate) mod step;
mod unary;

pub(crate) use unary::scalar_of;

use super::{Kernel, NodeSpec, OpError};

pub(crate) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>> {
    unary::build(spec)
        .or_else(|| binary::build(spec))
        .or_else(|| cast::build(spec))
}
