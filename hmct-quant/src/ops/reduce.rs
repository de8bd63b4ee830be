//! Reductions and ops that work along an axis: ReduceX, ArgMax/ArgMin, TopK, CumSum,
//! Softmax/LogSoftmax/Hardmax.
//!
//! Every kernel views its input as `[outer, len, inner]` around the reduced axis (or
//! block of axes) and accumulates each output in a fixed order that does not depend on
//! how work is split across threads. Float sums accumulate in f64.

mod arg;
mod cumsum;
mod fold;
pub(crate) use fold::fold_row;
mod softmax;

use super::{Kernel, NodeSpec, OpError};

pub(crate) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>> {
    fold::build(spec)
        .or_else(|| arg::build(spec))
        .or_else(|| cumsum::build(spec))
        .or_else(|| softmax::build(spec))
}
