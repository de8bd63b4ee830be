//! What each fusible element-wise op does to one value: the per-element functions
//! their kernels apply (activations, Relu, Clip and its bounds), and the same
//! functions as steps over blocks of f32 values, for running a chain of nodes in one
//! pass (see `crate::fusion`). Kernel and fused step call the very same function, so
//! a fused chain gives the node-by-node results bit for bit.

use hmct_tensor::Tensor;
use hmct_tensor::ndarray::ArrayD;

use crate::ops::OpError;
use crate::ops::broadcast::{unary, unary_in_place};
use crate::ops::fastmath::{erf_slice, exp_slice, gelu_slice, sigmoid_slice};
use crate::ops::num::{Num, Real, scalar_of, typed};

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

/// The f32 slice kernel of `act`, where `fastmath` has one (the activation kernel
/// runs it on f32 tensors instead of its per-element function).
pub(crate) fn f32_slice_kernel(act: Act) -> Option<fn(&[f32], &mut [f32])> {
    match act {
        Act::Exp => Some(exp_slice),
        Act::Sigmoid => Some(sigmoid_slice),
        Act::Erf => Some(erf_slice),
        Act::Gelu => Some(gelu_slice),
        _ => None,
    }
}

/// A float activation, through the function its kernel applies: its
/// [`f32_slice_kernel`], else the one it applies in place.
#[inline(always)]
pub(crate) fn act_block(act: Act, src: &[f32], out: &mut [f32]) {
    match f32_slice_kernel(act) {
        Some(k) => k(src, out),
        None => {
            out.copy_from_slice(src);
            map_in_place(act, out);
        }
    }
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
        *o = hard_swish_one(h, x);
    }
}

#[inline(always)]
pub(crate) fn hard_swish_one(h: HardSwish, x: f32) -> f32 {
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
    Num::div(v, h.div)
}

/// A SiLU, `Mul(x, Sigmoid(x))` (`x_first`) or `Mul(Sigmoid(x), x)`, in one loop:
/// the Sigmoid kernel's function and the Mul on the same operands in the same order
/// as the two steps it replaces, so the same bits, without storing and reloading the
/// Sigmoid's block (a fifth of EfficientNet-B0 and a fifteenth of YOLOv8n run such
/// pairs).
#[inline(always)]
pub(crate) fn silu_block(x_first: bool, src: &[f32], out: &mut [f32]) {
    for (o, &x) in out.iter_mut().zip(src) {
        *o = silu_one(x_first, x);
    }
}

#[inline(always)]
pub(crate) fn silu_one(x_first: bool, x: f32) -> f32 {
    let s = crate::ops::fastmath::sigmoid_f32(x);
    if x_first {
        Num::mul(x, s)
    } else {
        Num::mul(s, x)
    }
}

/// How the five nodes of an exported erf GELU, `Mul(Mul(x, Add(Erf(Div(x, d)), one)),
/// half)`, take their operands: [`gelu_one`] does each node's operation with the
/// operands in the node's order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Gelu {
    /// The first node divides `x` by `scale` (else multiplies it by `scale`).
    pub divide: bool,
    pub scale: f32,
    /// The first node reads `x` first (a Div always does).
    pub x_first_in_scale: bool,
    pub one: f32,
    /// The Add reads the Erf's output first (else the constant first).
    pub erf_first_in_add: bool,
    /// The first Mul reads `x` first (else the Add's output first).
    pub x_first_in_mul: bool,
    pub half: f32,
    /// The last Mul reads the first Mul's output first (else the constant first).
    pub product_first: bool,
}

/// The five nodes of a GELU in one loop: per element the same Div (or Mul), Erf (the
/// Erf kernel's function), Add, Mul and Mul on the same operands in the same order as
/// the five steps they replace, so the same bits, without storing and reloading four
/// blocks in between.
#[inline(always)]
pub(crate) fn gelu_block(g: Gelu, src: &[f32], out: &mut [f32]) {
    for (o, &x) in out.iter_mut().zip(src) {
        *o = gelu_one(g, x);
    }
}

#[inline(always)]
pub(crate) fn gelu_one(g: Gelu, x: f32) -> f32 {
    let t = match (g.divide, g.x_first_in_scale) {
        (true, _) => Num::div(x, g.scale),
        (false, true) => Num::mul(x, g.scale),
        (false, false) => Num::mul(g.scale, x),
    };
    let e = crate::ops::fastmath::erf_f32(t);
    let a = if g.erf_first_in_add {
        Num::add(e, g.one)
    } else {
        Num::add(g.one, e)
    };
    let m = if g.x_first_in_mul {
        Num::mul(x, a)
    } else {
        Num::mul(a, x)
    };
    if g.product_first {
        Num::mul(m, g.half)
    } else {
        Num::mul(g.half, m)
    }
}

/// `block[i] = f(block[i])`: a step whose only operand is the block it overwrites
/// (the `_block` forms read a separate source), with the same per-element function.
#[inline(always)]
pub(crate) fn map_block(block: &mut [f32], f: impl Fn(f32) -> f32) {
    for v in block {
        *v = f(*v);
    }
}

/// `x * a + b`, as BatchNormalization computes it with its f32 coefficients.
#[inline(always)]
pub(crate) fn affine_block(src: &[f32], a: f32, b: f32, out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(src) {
        *o = v * a + b;
    }
}

/// Float-only element-wise functions with their attributes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Act {
    Sqrt,
    Exp,
    Log,
    Reciprocal,
    Floor,
    Ceil,
    Round,
    Sin,
    Cos,
    Tan,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Asinh,
    Acosh,
    Atanh,
    Erf,
    Tanh,
    Sigmoid,
    HardSigmoid { alpha: f32, beta: f32 },
    HardSwish,
    LeakyRelu { alpha: f32 },
    Elu { alpha: f32 },
    Selu { alpha: f32, gamma: f32 },
    Celu { alpha: f32 },
    ThresholdedRelu { alpha: f32 },
    Gelu,
    GeluTanh,
    Softplus,
    Softsign,
    Mish,
    Shrink { bias: f32, lambd: f32 },
}

#[inline(always)]
fn softplus<T: Real>(v: T) -> T {
    // log(1 + exp(v)) without overflow for large v.
    if v > T::ZERO {
        v + (-v).exp().ln_1p()
    } else {
        v.exp().ln_1p()
    }
}

/// Where an element-wise function's results go: a fresh array, or over the input.
pub(super) trait Dest<T> {
    type Out;
    fn apply<F: Fn(T) -> T + Sync + Send>(self, f: F) -> Self::Out;
}

pub(super) struct Fresh<'a, T>(pub &'a ArrayD<T>);

impl<T: Copy + Default + Send + Sync + 'static> Dest<T> for Fresh<'_, T> {
    type Out = ArrayD<T>;
    fn apply<F: Fn(T) -> T + Sync + Send>(self, f: F) -> ArrayD<T> {
        unary(self.0, f)
    }
}

pub(super) struct InPlace<'a, T>(pub &'a mut [T]);

impl<T: Copy + Send> Dest<T> for InPlace<'_, T> {
    type Out = ();
    fn apply<F: Fn(T) -> T + Sync + Send>(self, f: F) {
        unary_in_place(self.0, f)
    }
}

/// `act` over a float array; the match is outside the loops so each is vectorizable.
pub(super) fn map_real<T: Real, D: Dest<T>>(act: Act, x: D) -> D::Out {
    let c = T::from_f32c;
    let (zero, one) = (T::ZERO, T::ONE);
    match act {
        Act::Sqrt => x.apply(|v: T| v.sqrt()),
        Act::Exp => x.apply(|v: T| v.exp()),
        Act::Log => x.apply(|v: T| v.ln()),
        Act::Reciprocal => x.apply(|v: T| one / v),
        Act::Floor => x.apply(|v: T| v.floor()),
        Act::Ceil => x.apply(|v: T| v.ceil()),
        Act::Round => x.apply(|v: T| T::round_even(v)),
        Act::Sin => x.apply(|v: T| v.sin()),
        Act::Cos => x.apply(|v: T| v.cos()),
        Act::Tan => x.apply(|v: T| v.tan()),
        Act::Asin => x.apply(|v: T| v.asin()),
        Act::Acos => x.apply(|v: T| v.acos()),
        Act::Atan => x.apply(|v: T| v.atan()),
        Act::Sinh => x.apply(|v: T| v.sinh()),
        Act::Cosh => x.apply(|v: T| v.cosh()),
        Act::Asinh => x.apply(|v: T| v.asinh()),
        Act::Acosh => x.apply(|v: T| v.acosh()),
        Act::Atanh => x.apply(|v: T| v.atanh()),
        Act::Erf => x.apply(|v: T| Real::erf(v)),
        Act::Tanh => x.apply(|v: T| v.tanh()),
        Act::Sigmoid => x.apply(|v: T| one / (one + (-v).exp())),
        Act::HardSigmoid { alpha, beta } => {
            let (a, b) = (c(alpha), c(beta));
            x.apply(move |v: T| zero.max_nan(one.min_nan(a * v + b)))
        }
        Act::HardSwish => {
            let (a, b) = (c(1.0 / 6.0), c(0.5));
            x.apply(move |v: T| v * zero.max_nan(one.min_nan(a * v + b)))
        }
        Act::LeakyRelu { alpha } => {
            let a = c(alpha);
            x.apply(move |v: T| if v < zero { v * a } else { v })
        }
        Act::Elu { alpha } => {
            let a = c(alpha);
            x.apply(move |v: T| if v < zero { a * (v.exp() - one) } else { v })
        }
        Act::Selu { alpha, gamma } => {
            let (a, g) = (c(alpha), c(gamma));
            x.apply(move |v: T| {
                if v > zero {
                    g * v
                } else {
                    g * (a * v.exp() - a)
                }
            })
        }
        Act::Celu { alpha } => {
            let a = c(alpha);
            x.apply(move |v: T| zero.max_nan(v) + zero.min_nan(a * ((v / a).exp() - one)))
        }
        Act::ThresholdedRelu { alpha } => {
            let a = c(alpha);
            x.apply(move |v: T| if v > a { v } else { zero })
        }
        Act::Gelu => {
            let (half, r) = (c(0.5), T::from_f64(std::f64::consts::FRAC_1_SQRT_2));
            x.apply(move |v: T| half * v * (one + Real::erf(v * r)))
        }
        Act::GeluTanh => {
            let (half, k, s) = (
                c(0.5),
                c(0.044_715),
                T::from_f64((2.0 / std::f64::consts::PI).sqrt()),
            );
            x.apply(move |v: T| half * v * (one + (s * (v + k * v * v * v)).tanh()))
        }
        Act::Softplus => x.apply(softplus),
        Act::Softsign => x.apply(|v: T| v / (one + Num::abs(v))),
        Act::Mish => x.apply(|v: T| v * softplus(v).tanh()),
        Act::Shrink { bias, lambd } => {
            let (b, l) = (c(bias), c(lambd));
            x.apply(move |v: T| {
                if v < -l {
                    v + b
                } else if v > l {
                    v - b
                } else {
                    zero
                }
            })
        }
    }
}

/// `act` over f32 values in place: the function the activation kernel applies
/// (except where it runs an [`f32_slice_kernel`]).
pub(crate) fn map_in_place(act: Act, d: &mut [f32]) {
    map_real(act, InPlace(d))
}

// Expanded for unsigned types too, where `v < 0` is always false: right for them.
#[allow(clippy::absurd_extreme_comparisons)]
#[inline(always)]
pub(crate) fn relu<T: Num>(v: T) -> T {
    if v < T::ZERO { T::ZERO } else { v }
}

pub(super) fn bound_or<T: Num>(t: Option<&Tensor>, default: T, what: &str) -> Result<T, OpError> {
    match t {
        None => Ok(default),
        Some(t) => scalar_of(typed::<T>(t, what)?, what),
    }
}

#[inline(always)]
pub(crate) fn clip_one<T: Num>(v: T, lo: T, hi: T) -> T {
    // max then min, as numpy and onnxruntime do: when lo > hi everything becomes hi.
    let r = if v < lo { lo } else { v };
    if r > hi { hi } else { r }
}

/// Clip's f32 bounds: the attributes before opset 11, else the optional inputs.
pub(crate) fn clip_f32_bounds(
    attr_bounds: Option<(f32, f32)>,
    lo: Option<&Tensor>,
    hi: Option<&Tensor>,
) -> Result<(f32, f32), OpError> {
    if let Some(b) = attr_bounds {
        return Ok(b);
    }
    Ok((
        bound_or(lo, Num::LOWEST, "Clip min")?,
        bound_or(hi, Num::HIGHEST, "Clip max")?,
    ))
}
