//! One-input element-wise ops: float math and activations, the integer-capable
//! Abs/Neg/Sign/Relu, Not, IsNaN/IsInf and Clip.

use hmct_tensor::Tensor;
use hmct_tensor::ndarray::ArrayD;

use hmct_tensor::ndarray::IxDyn;

use super::step::{
    Act, ElementStep, Fresh, InPlace, bound_or, clip_f32_bounds, clip_one, f32_slice_kernel,
    map_real, relu,
};
use crate::ops::arrays::contiguous;
use crate::ops::broadcast::{CHUNK, PAR_MIN, for_chunks, unary, unary_in_place};
use crate::ops::num::{Half, Num, with_num};
use crate::ops::{Kernel, NodeSpec, OpError, input, run_not_reusing};

fn act_for(spec: &NodeSpec) -> Option<Result<Act, OpError>> {
    let a = &spec.attrs;
    let act = |r: Result<Act, OpError>| Some(r);
    Some(Ok(match spec.op_type {
        "Sqrt" => Act::Sqrt,
        "Exp" => Act::Exp,
        "Log" => Act::Log,
        "Reciprocal" => Act::Reciprocal,
        "Floor" => Act::Floor,
        "Ceil" => Act::Ceil,
        "Round" => Act::Round,
        "Sin" => Act::Sin,
        "Cos" => Act::Cos,
        "Tan" => Act::Tan,
        "Asin" => Act::Asin,
        "Acos" => Act::Acos,
        "Atan" => Act::Atan,
        "Sinh" => Act::Sinh,
        "Cosh" => Act::Cosh,
        "Asinh" => Act::Asinh,
        "Acosh" => Act::Acosh,
        "Atanh" => Act::Atanh,
        "Erf" => Act::Erf,
        "Tanh" => Act::Tanh,
        "Sigmoid" => Act::Sigmoid,
        "HardSwish" => Act::HardSwish,
        "Softplus" => Act::Softplus,
        "Softsign" => Act::Softsign,
        "Mish" => Act::Mish,
        "HardSigmoid" => {
            return act((|| {
                Ok(Act::HardSigmoid {
                    alpha: a.float_or("alpha", 0.2)?,
                    beta: a.float_or("beta", 0.5)?,
                })
            })());
        }
        "LeakyRelu" => {
            return act(a
                .float_or("alpha", 0.01)
                .map(|alpha| Act::LeakyRelu { alpha }));
        }
        "Elu" => return act(a.float_or("alpha", 1.0).map(|alpha| Act::Elu { alpha })),
        "Celu" => return act(a.float_or("alpha", 1.0).map(|alpha| Act::Celu { alpha })),
        "ThresholdedRelu" => {
            return act(a
                .float_or("alpha", 1.0)
                .map(|alpha| Act::ThresholdedRelu { alpha }));
        }
        "Selu" => {
            return act((|| {
                Ok(Act::Selu {
                    alpha: a.float_or("alpha", 1.673_263_2)?,
                    gamma: a.float_or("gamma", 1.050_701)?,
                })
            })());
        }
        "Shrink" => {
            return act((|| {
                Ok(Act::Shrink {
                    bias: a.float_or("bias", 0.0)?,
                    lambd: a.float_or("lambd", 0.5)?,
                })
            })());
        }
        "Gelu" => {
            return act(match a.string_or("approximate", "none") {
                Ok(s) if s == "none" => Ok(Act::Gelu),
                Ok(s) if s == "tanh" => Ok(Act::GeluTanh),
                Ok(s) => Err(OpError::unsupported(format!("Gelu approximate='{s}'"))),
                Err(e) => Err(e),
            });
        }
        _ => return None,
    }))
}

/// Half-precision inputs are widened to f32, computed, and rounded once.
fn map_half<H: Half>(act: Act, x: &ArrayD<H>) -> ArrayD<H> {
    let wide = unary(x, |v: H| v.to_f32h());
    unary(&map_real(act, Fresh(&wide)), H::from_f32h)
}

/// An f32 slice kernel over a whole array, in fixed chunks.
fn slice_kernel(a: &ArrayD<f32>, k: fn(&[f32], &mut [f32])) -> ArrayD<f32> {
    let src = contiguous(a);
    let mut out = crate::buffers::take::<f32>(src.len());
    for_chunks(&mut out, CHUNK, src.len() >= PAR_MIN, &|off, piece| {
        k(&src[off..off + piece.len()], piece)
    });
    ArrayD::from_shape_vec(IxDyn(a.shape()), out).expect("same element count as the input")
}

/// An f32 slice kernel over values it overwrites: each piece is copied to a stack
/// buffer first (in L1, cheaper than a fresh output array's page faults).
fn slice_kernel_in_place(d: &mut [f32], k: fn(&[f32], &mut [f32])) {
    for_chunks(d, CHUNK, d.len() >= PAR_MIN, &|_, piece| {
        let mut tmp = [0.0f32; 512];
        for p in piece.chunks_mut(tmp.len()) {
            let t = &mut tmp[..p.len()];
            t.copy_from_slice(p);
            k(t, p);
        }
    });
}

fn run_act(act: Act, t: &Tensor) -> Result<Tensor, OpError> {
    Ok(match t {
        Tensor::F32(a) => Tensor::F32(match f32_slice_kernel(act) {
            Some(k) => slice_kernel(a, k),
            None => map_real(act, Fresh(a)),
        }),
        Tensor::F64(a) => Tensor::F64(map_real(act, Fresh(a))),
        Tensor::F16(a) => Tensor::F16(map_half(act, a)),
        Tensor::BF16(a) => Tensor::BF16(map_half(act, a)),
        other => {
            return Err(OpError::unsupported(format!(
                "{act:?} on {}",
                other.dtype()
            )));
        }
    })
}

/// One-input float activations, which can also overwrite their input.
struct ActKernel(Act);

impl Kernel for ActKernel {
    fn run(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        Ok(vec![run_act(self.0, input(inputs, 0)?)?])
    }

    fn element_step(&self) -> Option<ElementStep> {
        Some(ElementStep::Act(self.0))
    }

    fn reusable_inputs(&self) -> &[usize] {
        &[0]
    }

    fn run_reusing(
        &self,
        inputs: &[Option<&Tensor>],
        i: usize,
        mut owned: Tensor,
    ) -> Result<Vec<Tensor>, OpError> {
        if i != 0 {
            return run_not_reusing(self, inputs, i, owned);
        }
        let done = match (&mut owned, self.0) {
            (Tensor::F32(a), act) => a
                .as_slice_mut()
                .map(|d| match f32_slice_kernel(act) {
                    Some(k) => slice_kernel_in_place(d, k),
                    None => map_real(act, InPlace(d)),
                })
                .is_some(),
            (Tensor::F64(a), act) => a
                .as_slice_mut()
                .map(|d| map_real(act, InPlace(d)))
                .is_some(),
            _ => false,
        };
        if done {
            return Ok(vec![owned]);
        }
        run_not_reusing(self, inputs, i, owned)
    }
}

/// Ops over any numeric type.
#[derive(Clone, Copy, Debug)]
enum NumOp {
    Abs,
    Neg,
    Sign,
    Relu,
}

// Expanded for unsigned types too, where Relu's `v < 0` is always false: right for
// them, and not a mistake.
#[allow(clippy::absurd_extreme_comparisons)]
fn run_num(op: NumOp, t: &Tensor) -> Result<Tensor, OpError> {
    with_num!(t, a => Ok(Tensor::from(match op {
        NumOp::Abs => unary(a, Num::abs),
        NumOp::Neg => unary(a, Num::neg),
        NumOp::Sign => unary(a, Num::signum),
        NumOp::Relu => unary(a, relu),
    })), other => Err(OpError::unsupported(format!("{op:?} on {}", other.dtype()))))
}

/// Abs, Neg, Sign and Relu; on f32 they can also overwrite their input.
struct NumKernel(NumOp);

impl Kernel for NumKernel {
    fn run(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        Ok(vec![run_num(self.0, input(inputs, 0)?)?])
    }

    fn element_step(&self) -> Option<ElementStep> {
        matches!(self.0, NumOp::Relu).then_some(ElementStep::Relu)
    }

    fn reusable_inputs(&self) -> &[usize] {
        &[0]
    }

    fn run_reusing(
        &self,
        inputs: &[Option<&Tensor>],
        i: usize,
        mut owned: Tensor,
    ) -> Result<Vec<Tensor>, OpError> {
        if let (0, Tensor::F32(a)) = (i, &mut owned)
            && let Some(d) = a.as_slice_mut()
        {
            match self.0 {
                NumOp::Abs => unary_in_place(d, Num::abs),
                NumOp::Neg => unary_in_place(d, Num::neg),
                NumOp::Sign => unary_in_place(d, Num::signum),
                NumOp::Relu => unary_in_place(d, relu),
            }
            return Ok(vec![owned]);
        }
        run_not_reusing(self, inputs, i, owned)
    }
}

fn float_pred(
    t: &Tensor,
    name: &str,
    p: impl Fn(f64) -> bool + Sync + Send,
) -> Result<Tensor, OpError> {
    Ok(Tensor::Bool(match t {
        Tensor::F32(a) => unary(a, |v| p(v as f64)),
        Tensor::F64(a) => unary(a, &p),
        Tensor::F16(a) => unary(a, |v| p(v.to_f64())),
        Tensor::BF16(a) => unary(a, |v| p(v.to_f64())),
        other => return Err(OpError::unsupported(format!("{name} on {}", other.dtype()))),
    }))
}

fn clip<T: Num>(x: &ArrayD<T>, lo: T, hi: T) -> ArrayD<T> {
    unary(x, move |v: T| clip_one(v, lo, hi))
}

struct ClipKernel {
    /// Before opset 11 the bounds are attributes; since then, optional inputs.
    attr_bounds: Option<(f32, f32)>,
}

impl ClipKernel {
    fn f32_bounds(&self, inputs: &[Option<&Tensor>]) -> Result<(f32, f32), OpError> {
        let bound = |i: usize| inputs.get(i).copied().flatten();
        clip_f32_bounds(self.attr_bounds, bound(1), bound(2))
    }
}

impl Kernel for ClipKernel {
    fn run(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        let x = input(inputs, 0)?;
        if let Some((lo, hi)) = self.attr_bounds {
            return Ok(vec![match x {
                Tensor::F32(a) => Tensor::F32(clip(a, lo, hi)),
                Tensor::F64(a) => Tensor::F64(clip(a, lo as f64, hi as f64)),
                Tensor::F16(a) => {
                    Tensor::F16(clip(a, half::f16::from_f32(lo), half::f16::from_f32(hi)))
                }
                other => return Err(OpError::unsupported(format!("Clip-6 on {}", other.dtype()))),
            }]);
        }
        let bound = |i: usize| inputs.get(i).copied().flatten();
        let (lo, hi) = (bound(1), bound(2));
        with_num!(x, a => {
            let lo = bound_or(lo, Num::LOWEST, "Clip min")?;
            let hi = bound_or(hi, Num::HIGHEST, "Clip max")?;
            Ok(vec![Tensor::from(clip(a, lo, hi))])
        }, other => Err(OpError::unsupported(format!("Clip on {}", other.dtype()))))
    }

    fn reusable_inputs(&self) -> &[usize] {
        &[0]
    }

    fn element_step(&self) -> Option<ElementStep> {
        Some(ElementStep::Clip {
            attr_bounds: self.attr_bounds,
        })
    }

    fn run_reusing(
        &self,
        inputs: &[Option<&Tensor>],
        i: usize,
        mut owned: Tensor,
    ) -> Result<Vec<Tensor>, OpError> {
        if let (0, Tensor::F32(a)) = (i, &mut owned)
            && let Some(d) = a.as_slice_mut()
        {
            let (lo, hi) = self.f32_bounds(inputs)?;
            unary_in_place(d, move |v: f32| clip_one(v, lo, hi));
            return Ok(vec![owned]);
        }
        run_not_reusing(self, inputs, i, owned)
    }
}

fn clip_kernel(spec: &NodeSpec) -> Result<Box<dyn Kernel>, OpError> {
    let attr_bounds = if spec.opset < 11 {
        Some((
            spec.attrs.float_or("min", f32::MIN)?,
            spec.attrs.float_or("max", f32::MAX)?,
        ))
    } else {
        None
    };
    Ok(Box::new(ClipKernel { attr_bounds }))
}

pub(super) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>> {
    if let Some(act) = act_for(spec) {
        return Some(act.map(|act| Box::new(ActKernel(act)) as Box<dyn Kernel>));
    }
    let num_op = match spec.op_type {
        "Abs" => Some(NumOp::Abs),
        "Neg" => Some(NumOp::Neg),
        "Sign" => Some(NumOp::Sign),
        "Relu" => Some(NumOp::Relu),
        _ => None,
    };
    if let Some(op) = num_op {
        return Some(Ok(Box::new(NumKernel(op))));
    }
    Some(match spec.op_type {
        "Not" => Ok(Box::new(|inputs: &[Option<&Tensor>]| {
            match input(inputs, 0)? {
                Tensor::Bool(a) => Ok(vec![Tensor::Bool(unary(a, |v: bool| !v))]),
                other => Err(OpError::invalid(format!("Not on {}", other.dtype()))),
            }
        })),
        "IsNaN" => Ok(Box::new(|inputs: &[Option<&Tensor>]| {
            Ok(vec![float_pred(input(inputs, 0)?, "IsNaN", f64::is_nan)?])
        })),
        "IsInf" => (|| {
            let pos = spec.attrs.int_or("detect_positive", 1)? != 0;
            let neg = spec.attrs.int_or("detect_negative", 1)? != 0;
            Ok(Box::new(move |inputs: &[Option<&Tensor>]| {
                Ok(vec![float_pred(input(inputs, 0)?, "IsInf", move |v| {
                    (pos && v == f64::INFINITY) || (neg && v == f64::NEG_INFINITY)
                })?])
            }) as Box<dyn Kernel>)
        })(),
        "Clip" => clip_kernel(spec),
        _ => return None,
    })
}
