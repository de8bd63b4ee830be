//! Element-wise nodes as steps over blocks of f32 values, for running a chain of them
//! in one pass (see `crate::fusion`). Each step calls the very per-element function
//! its node's kernel uses, so a fused chain gives the node-by-node results bit for bit.

use super::num::Num;
pub(crate) use super::unary::Act;
pub(crate) use super::unary::clip_f32_bounds as clip_bounds;
use super::unary::{clip_one, map_in_place, relu};

/// What an element-wise kernel does to f32 values, as far as fusing is concerned.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum ElementStep {
    /// Add, Sub, Mul or Div of inputs 0 and 1.
    Arith(ArithOp),
    /// Clip of input 0; the bounds are these attributes, or optional inputs 1 and 2.
    Clip {
        attr_bounds: Option<(f32, f32)>,
    },
    Relu,
    /// A float activation of input 0.
    Act(Act),
    /// Inference BatchNormalization: input 0 and four per-channel parameters.
    BatchNorm {
        epsilon: f32,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ArithOp {
    Add,
    Sub,
    Mul,
    Div,
}

/// One operand of a binary step over a block.
#[derive(Clone, Copy)]
pub(crate) enum Operand<'a> {
    Block(&'a [f32]),
    Value(f32),
}

/// `out[i] = a[i] op b[i]`, the same `Num` operation the Add/Sub/Mul/Div kernels use.
#[inline(always)]
pub(crate) fn arith_block(op: ArithOp, a: Operand, b: Operand, out: &mut [f32]) {
    match op {
        ArithOp::Add => binary_block(Num::add, a, b, out),
        ArithOp::Sub => binary_block(Num::sub, a, b, out),
        ArithOp::Mul => binary_block(Num::mul, a, b, out),
        ArithOp::Div => binary_block(Num::div, a, b, out),
    }
}

/// Generic over `f` so that each operation and operand form is its own vector loop.
#[inline(always)]
fn binary_block<F: Fn(f32, f32) -> f32>(f: F, a: Operand, b: Operand, out: &mut [f32]) {
    match (a, b) {
        (Operand::Block(a), Operand::Block(b)) => {
            for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
                *o = f(x, y);
            }
        }
        (Operand::Block(a), Operand::Value(y)) => {
            for (o, &x) in out.iter_mut().zip(a) {
                *o = f(x, y);
            }
        }
        (Operand::Value(x), Operand::Block(b)) => {
            for (o, &y) in out.iter_mut().zip(b) {
                *o = f(x, y);
            }
        }
        (Operand::Value(x), Operand::Value(y)) => out.fill(f(x, y)),
    }
}

/// Clip with the Clip kernel's per-element function.
#[inline(always)]
pub(crate) fn clip_block(src: &[f32], lo: f32, hi: f32, out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(src) {
        *o = clip_one(v, lo, hi);
    }
}

/// Relu with the Relu kernel's per-element function.
#[inline(always)]
pub(crate) fn relu_block(src: &[f32], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(src) {
        *o = relu(v);
    }
}

/// A float activation, through the function its kernel applies in place.
#[inline(always)]
pub(crate) fn act_block(act: Act, src: &[f32], out: &mut [f32]) {
    out.copy_from_slice(src);
    map_in_place(act, out);
}

/// How the four nodes of an exported hard-swish, `Div(Mul(x, Clip(Add(x, add), lo,
/// hi)), div)`, take their operands: [`hard_swish_block`] does each node's operation
/// with the operands in the node's order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct HardSwish {
    pub add: f32,
    /// The Add reads `x` first (else the constant first).
    pub x_first_in_add: bool,
    pub lo: f32,
    pub hi: f32,
    /// The Mul reads `x` first (else the Clip's output first).
    pub x_first_in_mul: bool,
    pub div: f32,
}

/// The four nodes of a hard-swish in one loop: per element the same Add, Clip, Mul and
/// Div, on the same operands in the same order, as the four steps they replace (so
/// the same bits), without storing and reloading three blocks in between.
#[inline(always)]
pub(crate) fn hard_swish_block(h: HardSwish, src: &[f32], out: &mut [f32]) {
    for (o, &x) in out.iter_mut().zip(src) {
        let t = if h.x_first_in_add {
            Num::add(x, h.add)
        } else {
            Num::add(h.add, x)
        };
        let u = clip_one(t, h.lo, h.hi);
        let v = if h.x_first_in_mul {
            Num::mul(x, u)
        } else {
            Num::mul(u, x)
        };
        *o = Num::div(v, h.div);
    }
}

/// `x * a + b`, as BatchNormalization computes it with its f32 coefficients.
#[inline(always)]
pub(crate) fn affine_block(src: &[f32], a: f32, b: f32, out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(src) {
        *o = v * a + b;
    }
}
