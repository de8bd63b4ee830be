//! BatchNormalization, InstanceNormalization, LayerNormalization, GroupNormalization.
//!
//! Statistics are accumulated in f64 in a fixed order per normalized group, so results
//! are deterministic and close to the exact value; the normalization itself runs in the
//! tensor's type. Float16 tensors are computed in f32.

use hmct_tensor::ndarray::{ArrayD, IxDyn};
use hmct_tensor::{Tensor, f16};
use num_traits::Float;
use rayon::prelude::*;

use super::arrays::{array, contiguous};
use super::elementwise::step::ElementStep;
use super::reduce::fold_row;
use super::{Kernel, NodeSpec, OpError, input, normalize_axis, run_not_reusing};

pub(crate) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>> {
    let k: Result<Box<dyn Kernel>, OpError> = match spec.op_type {
        "BatchNormalization" => BatchNorm::new(spec).map(|k| Box::new(k) as Box<dyn Kernel>),
        "InstanceNormalization" => spec.attrs.float_or("epsilon", 1e-5).map(|eps| {
            Box::new(move |i: &[Option<&Tensor>]| instance_norm(i, eps)) as Box<dyn Kernel>
        }),
        "LayerNormalization" => LayerNorm::new(spec).map(|k| Box::new(k) as Box<dyn Kernel>),
        "GroupNormalization" => GroupNorm::new(spec).map(|k| Box::new(k) as Box<dyn Kernel>),
        _ => return None,
    };
    Some(k)
}

/// A float tensor's values widened to `f64`-capable `T` work buffers: f32 and f64 as
/// they are, f16 as f32.
enum Floats {
    F32(Vec<f32>),
    F64(Vec<f64>),
    F16(Vec<f32>),
}

fn floats(t: &Tensor, what: &str) -> Result<Floats, OpError> {
    Ok(match t {
        Tensor::F32(a) => Floats::F32(contiguous(a).into_owned()),
        Tensor::F64(a) => Floats::F64(contiguous(a).into_owned()),
        Tensor::F16(a) => Floats::F16(a.iter().map(|v| v.to_f32()).collect()),
        Tensor::BF16(a) => Floats::F32(a.iter().map(|v| v.to_f32()).collect()),
        other => {
            return Err(OpError::unsupported(format!(
                "{what} of type {}",
                other.dtype()
            )));
        }
    })
}

/// A parameter tensor as f64 values, whatever its float type.
fn params(t: &Tensor, what: &str) -> Result<Vec<f64>, OpError> {
    match t {
        Tensor::F32(_) | Tensor::F64(_) | Tensor::F16(_) | Tensor::BF16(_) => {
            Ok(t.to_f64_vec().unwrap_or_default())
        }
        other => Err(OpError::unsupported(format!(
            "{what} of type {}",
            other.dtype()
        ))),
    }
}

/// Rebuilds a tensor of `like`'s float type from computed values.
fn rebuild<T: Float>(like: &Tensor, shape: &[usize], v: Vec<T>) -> Result<Tensor, OpError> {
    let f = |x: T| x.to_f64().unwrap_or(f64::NAN);
    Ok(match like {
        Tensor::F64(_) => Tensor::F64(array(shape, v.into_iter().map(f).collect())?),
        Tensor::F16(_) => Tensor::F16(array(
            shape,
            v.into_iter().map(|x| f16::from_f64(f(x))).collect(),
        )?),
        Tensor::BF16(_) => Tensor::BF16(array(
            shape,
            v.into_iter()
                .map(|x| hmct_tensor::bf16::from_f64(f(x)))
                .collect(),
        )?),
        _ => Tensor::F32(array(shape, v.into_iter().map(|x| f(x) as f32).collect())?),
    })
}

/// Runs `f` on the input's values in their working type and rebuilds the result.
macro_rules! with_floats {
    ($x:expr, $what:expr, $v:ident => $body:expr) => {
        match floats($x, $what)? {
            Floats::F32(mut $v) => $body,
            Floats::F64(mut $v) => $body,
            Floats::F16(mut $v) => $body,
        }
    };
}

/// Per-channel coefficients computed in f64, in the type they are applied in.
fn coefficients<T: Float>(a: &[f64], b: &[f64]) -> (Vec<T>, Vec<T>) {
    a.iter()
        .zip(b)
        .map(|(&p, &q)| {
            (
                T::from(p).unwrap_or(T::nan()),
                T::from(q).unwrap_or(T::nan()),
            )
        })
        .unzip()
}

/// The f32 `(a, b)` with which inference BatchNormalization computes `x * a[c] + b[c]`
/// from its parameters (scale, B, mean, var): what a fused chain applies.
pub(crate) fn batch_norm_f32_affine(
    params: [&Tensor; 4],
    epsilon: f32,
) -> Result<(Vec<f32>, Vec<f32>), OpError> {
    let [scale, bias, mean, var] = param_values(params, params[0].len())?;
    let (a, b) = scale_shift(&scale, &bias, &mean, &var, epsilon as f64);
    Ok(coefficients(&a, &b))
}

/// `y = x * a[c] + b[c]` over planes of `inner` elements cycling through channels.
fn affine_planes<T: Float + Send + Sync>(x: &mut [T], inner: usize, a: &[f64], b: &[f64]) {
    let c = a.len();
    if inner == 0 || c == 0 {
        return;
    }
    let (a, b) = coefficients::<T>(a, b);
    let f = |(i, p): (usize, &mut [T])| {
        let (s, t) = (a[i % c], b[i % c]);
        for v in p {
            *v = *v * s + t;
        }
    };
    if x.len() < (1 << 16) || !crate::par::enabled() {
        x.chunks_mut(inner).enumerate().for_each(f);
    } else {
        x.par_chunks_mut(inner)
            .with_min_len((1 << 14) / inner + 1)
            .enumerate()
            .for_each(f);
    }
}

/// Mean and population variance (f64) of every run of `len` consecutive values.
fn moments<T: Float + Send + Sync>(x: &[T], len: usize) -> Vec<(f64, f64)> {
    if len == 0 {
        return Vec::new();
    }
    let one = |p: &[T]| {
        let n = p.len() as f64;
        let mean = p
            .iter()
            .map(|v| v.to_f64().unwrap_or(f64::NAN))
            .sum::<f64>()
            / n;
        let var = p
            .iter()
            .map(|v| {
                let d = v.to_f64().unwrap_or(f64::NAN) - mean;
                d * d
            })
            .sum::<f64>()
            / n;
        (mean, var)
    };
    if x.len() < (1 << 16) || !crate::par::enabled() {
        x.chunks(len).map(one).collect()
    } else {
        x.par_chunks(len)
            .with_min_len((1 << 14) / len + 1)
            .map(one)
            .collect()
    }
}

struct BatchNorm {
    epsilon: f32,
    momentum: f32,
    training: bool,
    num_outputs: usize,
}

impl BatchNorm {
    fn new(spec: &NodeSpec) -> Result<Self, OpError> {
        if spec.opset < 9 && spec.attrs.int_or("spatial", 1)? == 0 {
            return Err(OpError::unsupported("BatchNormalization spatial = 0"));
        }
        let training = if spec.opset >= 14 {
            spec.attrs.int_or("training_mode", 0)? != 0
        } else {
            // Before opset 14, asking for the running statistics outputs meant training.
            spec.num_outputs > 1 && spec.opset >= 9
        };
        Ok(BatchNorm {
            epsilon: spec.attrs.float_or("epsilon", 1e-5)?,
            momentum: spec.attrs.float_or("momentum", 0.9)?,
            training,
            num_outputs: spec.num_outputs,
        })
    }
}

/// The per-channel parameters of BatchNormalization (scale, B, mean, var) for an
/// input of shape `xs`.
fn bn_params(inputs: &[Option<&Tensor>], xs: &[usize]) -> Result<[Vec<f64>; 4], OpError> {
    if xs.len() < 2 {
        return Err(OpError::invalid(format!("BatchNormalization input {xs:?}")));
    }
    let tensors = [
        input(inputs, 1)?,
        input(inputs, 2)?,
        input(inputs, 3)?,
        input(inputs, 4)?,
    ];
    param_values(tensors, xs[1])
}

/// The values of BatchNormalization's (scale, B, mean, var), each of `c` values.
fn param_values(tensors: [&Tensor; 4], c: usize) -> Result<[Vec<f64>; 4], OpError> {
    let [scale, bias, mean, var] = tensors;
    let p = [
        params(scale, "scale")?,
        params(bias, "B")?,
        params(mean, "mean")?,
        params(var, "var")?,
    ];
    if p.iter().any(|v| v.len() != c) {
        return Err(OpError::invalid(format!(
            "BatchNormalization parameters do not have {c} values"
        )));
    }
    Ok(p)
}

/// BatchNormalization as `x * a[c] + b[c]`.
fn scale_shift(
    scale: &[f64],
    bias: &[f64],
    mean: &[f64],
    var: &[f64],
    eps: f64,
) -> (Vec<f64>, Vec<f64>) {
    let a: Vec<f64> = (0..scale.len())
        .map(|i| scale[i] / (var[i] + eps).sqrt())
        .collect();
    let b: Vec<f64> = (0..scale.len()).map(|i| bias[i] - mean[i] * a[i]).collect();
    (a, b)
}

impl Kernel for BatchNorm {
    fn run(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        let x = input(inputs, 0)?;
        let xs = x.shape().to_vec();
        let [scale, bias, mean_in, var_in] = bn_params(inputs, &xs)?;
        let c = xs[1];
        let inner: usize = xs[2..].iter().product();
        let eps = self.epsilon as f64;
        with_floats!(x, "BatchNormalization input", v => {
            let (mean, var) = if self.training {
                // Batch statistics per channel over (N, spatial).
                let per = moments(&v, inner);
                let n = xs[0];
                let mut mean = vec![0.0; c];
                let mut var = vec![0.0; c];
                for ch in 0..c {
                    let parts: Vec<(f64, f64)> = (0..n).map(|b| per[b * c + ch]).collect();
                    let m = parts.iter().map(|p| p.0).sum::<f64>() / n as f64;
                    // Pool the per-image variances around the batch mean.
                    let s = parts.iter().map(|p| p.1 + (p.0 - m) * (p.0 - m)).sum::<f64>() / n as f64;
                    mean[ch] = m;
                    var[ch] = s;
                }
                (mean, var)
            } else {
                (mean_in.clone(), var_in.clone())
            };
            let (a, b) = scale_shift(&scale, &bias, &mean, &var, eps);
            affine_planes(&mut v, inner, &a, &b);
            let mut outs = vec![rebuild(x, &xs, v)?];
            if self.training {
                let mom = self.momentum as f64;
                let rm: Vec<f64> = (0..c).map(|i| mean_in[i] * mom + mean[i] * (1.0 - mom)).collect();
                let rv: Vec<f64> = (0..c).map(|i| var_in[i] * mom + var[i] * (1.0 - mom)).collect();
                let like = input(inputs, 3)?;
                outs.push(rebuild(like, &[c], rm)?);
                outs.push(rebuild(like, &[c], rv)?);
            }
            outs.truncate(self.num_outputs.max(1));
            Ok(outs)
        })
    }

    fn reusable_inputs(&self) -> &[usize] {
        if self.training { &[] } else { &[0] }
    }

    fn element_step(&self) -> Option<ElementStep> {
        (!self.training && self.num_outputs <= 1).then_some(ElementStep::BatchNorm {
            epsilon: self.epsilon,
        })
    }

    /// Inference on f32: the same `x * a + b` as `run`, over the input's buffer.
    fn run_reusing(
        &self,
        inputs: &[Option<&Tensor>],
        i: usize,
        mut owned: Tensor,
    ) -> Result<Vec<Tensor>, OpError> {
        if let (0, false, Tensor::F32(x)) = (i, self.training, &mut owned) {
            let xs = x.shape().to_vec();
            let [scale, bias, mean, var] = bn_params(inputs, &xs)?;
            if let Some(v) = x.as_slice_mut() {
                let (a, b) = scale_shift(&scale, &bias, &mean, &var, self.epsilon as f64);
                affine_planes(v, xs[2..].iter().product(), &a, &b);
                return Ok(vec![owned]);
            }
        }
        run_not_reusing(self, inputs, i, owned)
    }
}

fn instance_norm(inputs: &[Option<&Tensor>], epsilon: f32) -> Result<Vec<Tensor>, OpError> {
    let x = input(inputs, 0)?;
    let xs = x.shape().to_vec();
    if xs.len() < 3 {
        return Err(OpError::invalid(format!(
            "InstanceNormalization input {xs:?}"
        )));
    }
    let c = xs[1];
    let scale = params(input(inputs, 1)?, "scale")?;
    let bias = params(input(inputs, 2)?, "B")?;
    if scale.len() != c || bias.len() != c {
        return Err(OpError::invalid(format!(
            "InstanceNormalization parameters do not have {c} values"
        )));
    }
    let inner: usize = xs[2..].iter().product();
    with_floats!(x, "InstanceNormalization input", v => {
        let st = moments(&v, inner);
        let a: Vec<f64> = st.iter().enumerate().map(|(i, s)| scale[i % c] / (s.1 + epsilon as f64).sqrt()).collect();
        let b: Vec<f64> = st.iter().enumerate().map(|(i, s)| bias[i % c] - s.0 * a[i]).collect();
        affine_planes(&mut v, inner, &a, &b);
        Ok(vec![rebuild(x, &xs, v)?])
    })
}

/// Expands a parameter that broadcasts to `shape` into `prod(shape)` values.
fn expand_to(p: &Tensor, shape: &[usize], what: &str) -> Result<Vec<f64>, OpError> {
    let vals = params(p, what)?;
    let a = ArrayD::from_shape_vec(IxDyn(p.shape()), vals)
        .map_err(|e| OpError::invalid(e.to_string()))?;
    let b = a.broadcast(IxDyn(shape)).ok_or_else(|| {
        OpError::invalid(format!(
            "{what} {:?} does not broadcast to {shape:?}",
            p.shape()
        ))
    })?;
    Ok(b.iter().copied().collect())
}

struct LayerNorm {
    axis: i64,
    epsilon: f32,
    num_outputs: usize,
}

impl LayerNorm {
    fn new(spec: &NodeSpec) -> Result<Self, OpError> {
        let stash = spec.attrs.int_or("stash_type", 1)?;
        if stash != 1 && stash != 11 {
            return Err(OpError::unsupported(format!(
                "LayerNormalization stash_type {stash}"
            )));
        }
        Ok(LayerNorm {
            axis: spec.attrs.int_or("axis", -1)?,
            epsilon: spec.attrs.float_or("epsilon", 1e-5)?,
            num_outputs: spec.num_outputs,
        })
    }
}

impl Kernel for LayerNorm {
    fn run(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        let x = input(inputs, 0)?;
        let xs = x.shape().to_vec();
        let axis = normalize_axis(self.axis, xs.len())?;
        let norm_shape = &xs[axis..];
        let len: usize = norm_shape.iter().product();
        let scale = expand_to(input(inputs, 1)?, norm_shape, "Scale")?;
        let bias = match inputs.get(2).copied().flatten() {
            Some(b) => expand_to(b, norm_shape, "B")?,
            None => vec![0.0; len],
        };
        let mut stat_shape = xs[..axis].to_vec();
        stat_shape.extend(std::iter::repeat_n(1, xs.len() - axis));
        let eps = self.epsilon as f64;
        // Y, then Mean and InvStdDev in the stash type (float), as many as the node has.
        let outputs = |y: Tensor, mean: Vec<f32>, inv: Vec<f32>| -> Result<Vec<Tensor>, OpError> {
            let stat = |d| -> Result<Tensor, OpError> { Ok(Tensor::F32(array(&stat_shape, d)?)) };
            let mut outs = vec![y, stat(mean)?, stat(inv)?];
            outs.truncate(self.num_outputs.max(1));
            Ok(outs)
        };
        // Transformers' LayerNorms are f32: one vectorized pass per statistic
        // and one that writes the output, with no widened copy of the input.
        if let (Tensor::F32(a), true) = (x, len > 0) {
            let src = contiguous(a);
            let rows = src.len() / len;
            // Every element is written.
            let mut out = crate::buffers::take::<f32>(src.len());
            let mut stats = vec![(0.0f64, 0.0f64); rows];
            let f = |((x, y), st): ((&[f32], &mut [f32]), &mut (f64, f64))| {
                *st = layer_norm_row(x, &scale, &bias, eps, y);
            };
            if src.len() < (1 << 16) || !crate::par::enabled() {
                src.chunks(len)
                    .zip(out.chunks_mut(len))
                    .zip(&mut stats)
                    .for_each(f);
            } else {
                src.par_chunks(len)
                    .zip(out.par_chunks_mut(len))
                    .zip(stats.par_iter_mut())
                    .with_min_len((1 << 14) / len + 1)
                    .for_each(f);
            }
            return outputs(
                Tensor::F32(array(&xs, out)?),
                stats.iter().map(|s| s.0 as f32).collect(),
                stats.iter().map(|s| s.1 as f32).collect(),
            );
        }
        with_floats!(x, "LayerNormalization input", v => {
            let st = moments(&v, len);
            let inv: Vec<f64> = st.iter().map(|s| 1.0 / (s.1 + eps).sqrt()).collect();
            if len > 0 {
                let f = |(i, row): (usize, &mut [_])| {
                    let (m, r) = (st[i].0, inv[i]);
                    for (j, e) in row.iter_mut().enumerate() {
                        let n = (num_traits::ToPrimitive::to_f64(&*e).unwrap_or(f64::NAN) - m) * r;
                        *e = num_traits::cast(n * scale[j] + bias[j]).unwrap_or_else(Float::nan);
                    }
                };
                if v.len() < (1 << 16) || !crate::par::enabled() {
                    v.chunks_mut(len).enumerate().for_each(f);
                } else {
                    v.par_chunks_mut(len).enumerate().for_each(f);
                }
            }
            outputs(
                rebuild(x, &xs, v)?,
                st.iter().map(|s| s.0 as f32).collect(),
                inv.iter().map(|&q| q as f32).collect(),
            )
        })
    }
}

/// One f32 row of LayerNormalization: mean and variance summed in f64 by
/// [`fold_row`] (a fixed order on every instruction set, so the same bits), then
/// `((x - mean) * inv) * scale + bias` in f64 as the generic path computes it.
/// Returns `(mean, 1 / sqrt(var + eps))`.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma"))]
fn layer_norm_row(x: &[f32], scale: &[f64], bias: &[f64], eps: f64, y: &mut [f32]) -> (f64, f64) {
    let n = x.len() as f64;
    let add = |a: f64, b: f64| a + b;
    let mean = fold_row(x, 0.0, |v| v as f64, add) / n;
    let var = fold_row(
        x,
        0.0,
        |v| {
            let d = v as f64 - mean;
            d * d
        },
        add,
    ) / n;
    let inv = 1.0 / (var + eps).sqrt();
    for (((y, &v), &s), &b) in y.iter_mut().zip(x).zip(scale).zip(bias) {
        *y = (((v as f64 - mean) * inv) * s + b) as f32;
    }
    (mean, inv)
}

struct GroupNorm {
    epsilon: f32,
    groups: usize,
    per_channel: bool,
}

impl GroupNorm {
    fn new(spec: &NodeSpec) -> Result<Self, OpError> {
        let groups = spec
            .attrs
            .int("num_groups")?
            .ok_or_else(|| OpError::invalid("GroupNormalization without num_groups"))?;
        if groups < 1 {
            return Err(OpError::invalid(format!("num_groups {groups}")));
        }
        Ok(GroupNorm {
            epsilon: spec.attrs.float_or("epsilon", 1e-5)?,
            groups: groups as usize,
            // Opset 18 scales per group; 21 per channel.
            per_channel: spec.opset >= 21,
        })
    }
}

impl Kernel for GroupNorm {
    fn run(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        let x = input(inputs, 0)?;
        let xs = x.shape().to_vec();
        if xs.len() < 2 || xs[1] % self.groups != 0 {
            return Err(OpError::invalid(format!(
                "GroupNormalization of {xs:?} into {} groups",
                self.groups
            )));
        }
        let (c, g) = (xs[1], self.groups);
        let scale = params(input(inputs, 1)?, "scale")?;
        let bias = params(input(inputs, 2)?, "bias")?;
        let want = if self.per_channel { c } else { g };
        if scale.len() != want || bias.len() != want {
            return Err(OpError::invalid(format!(
                "GroupNormalization parameters must have {want} values"
            )));
        }
        let inner: usize = xs[2..].iter().product();
        let per_group = c / g * inner;
        let eps = self.epsilon as f64;
        with_floats!(x, "GroupNormalization input", v => {
            let st = moments(&v, per_group);
            // Fold statistics and parameters into a per-(image, channel) affine map.
            let planes = xs[0] * c;
            let mut a = Vec::with_capacity(planes);
            let mut b = Vec::with_capacity(planes);
            for p in 0..planes {
                let ch = p % c;
                let s = st[(p / c) * g + ch / (c / g)];
                let k = if self.per_channel { ch } else { ch / (c / g) };
                let r = scale[k] / (s.1 + eps).sqrt();
                a.push(r);
                b.push(bias[k] - s.0 * r);
            }
            affine_planes(&mut v, inner, &a, &b);
            Ok(vec![rebuild(x, &xs, v)?])
        })
    }
}
