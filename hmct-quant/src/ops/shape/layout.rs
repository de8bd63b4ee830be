//! Shape-only and reordering ops: Reshape, Flatten, Squeeze, Unsqueeze, Transpose,
//! Expand, DepthToSpace, SpaceToDepth, Identity, Dropout, Shape, Size.

use hmct_tensor::ndarray::IxDyn;
use hmct_tensor::{Tensor, map_tensor_same};

use crate::ops::arrays::{permute, reshaped, reshaped_owned, std_owned};
use crate::ops::{
    Kernel, NodeSpec, OpError, broadcast_shapes, input, input_i64s, normalize_axis, run_not_reusing,
};

/// Resolves a Reshape target: 0 copies the input dimension (unless `allowzero`), -1
/// takes what is left.
pub(crate) fn reshape_target(
    input: &[usize],
    target: &[i64],
    allowzero: bool,
) -> Result<Vec<usize>, OpError> {
    let bad = || OpError::invalid(format!("cannot reshape {input:?} to {target:?}"));
    let mut out = Vec::with_capacity(target.len());
    let mut infer = None;
    for (i, &d) in target.iter().enumerate() {
        out.push(match d {
            -1 if infer.is_none() => {
                infer = Some(i);
                1
            }
            0 if !allowzero => *input.get(i).ok_or_else(bad)?,
            d if d >= 0 => d as usize,
            _ => return Err(bad()),
        });
    }
    let total: usize = input.iter().product();
    if let Some(i) = infer {
        let rest: usize = out.iter().product();
        if rest == 0 || total % rest != 0 {
            return Err(bad());
        }
        out[i] = total / rest;
    }
    if out.iter().product::<usize>() != total {
        return Err(bad());
    }
    Ok(out)
}

fn squeeze_shape(shape: &[usize], axes: Option<&[i64]>) -> Result<Vec<usize>, OpError> {
    let drop: Vec<bool> = match axes {
        None => shape.iter().map(|&d| d == 1).collect(),
        Some(axes) => {
            let mut drop = vec![false; shape.len()];
            for &a in axes {
                let a = normalize_axis(a, shape.len())?;
                if shape[a] != 1 {
                    return Err(OpError::invalid(format!(
                        "Squeeze axis {a} has size {}",
                        shape[a]
                    )));
                }
                drop[a] = true;
            }
            drop
        }
    };
    Ok(shape
        .iter()
        .zip(&drop)
        .filter(|(_, d)| !**d)
        .map(|(&s, _)| s)
        .collect())
}

fn unsqueeze_shape(shape: &[usize], axes: &[i64]) -> Result<Vec<usize>, OpError> {
    let rank = shape.len() + axes.len();
    let mut new_axis = vec![false; rank];
    for &a in axes {
        let a = normalize_axis(a, rank)?;
        if std::mem::replace(&mut new_axis[a], true) {
            return Err(OpError::invalid(format!("Unsqueeze repeats axis {a}")));
        }
    }
    let mut dims = shape.iter();
    Ok(new_axis
        .iter()
        .map(|&n| if n { 1 } else { *dims.next().unwrap_or(&1) })
        .collect())
}

fn expand(x: &Tensor, shape: &[i64]) -> Result<Tensor, OpError> {
    let target: Vec<usize> = shape
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| OpError::invalid(format!("Expand to {shape:?}"))))
        .collect::<Result<_, _>>()?;
    let out = broadcast_shapes(x.shape(), &target)?;
    Ok(map_tensor_same!(x, a => std_owned(
        a.broadcast(IxDyn(&out)).ok_or_else(|| OpError::invalid("Expand shapes do not broadcast"))?
    )))
}

/// DepthToSpace and SpaceToDepth on NCHW; `crd` picks the CRD channel order (the
/// `mode` attribute, DepthToSpace from opset 11, SpaceToDepth from 25).
fn depth_space(x: &Tensor, b: usize, to_space: bool, crd: bool) -> Result<Tensor, OpError> {
    let &[n, c, h, w] = x.shape() else {
        return Err(OpError::invalid(format!(
            "expected a 4-D input, got {:?}",
            x.shape()
        )));
    };
    if to_space {
        if c % (b * b) != 0 {
            return Err(OpError::invalid(format!(
                "DepthToSpace: {c} channels, blocksize {b}"
            )));
        }
        let c2 = c / (b * b);
        let (split, perm): (Vec<usize>, [usize; 6]) = if crd {
            (vec![n, c2, b, b, h, w], [0, 1, 4, 2, 5, 3])
        } else {
            (vec![n, b, b, c2, h, w], [0, 3, 4, 1, 5, 2])
        };
        reshaped(
            &permute(&reshaped(x, &split)?, &perm)?,
            &[n, c2, h * b, w * b],
        )
    } else {
        if h % b != 0 || w % b != 0 {
            return Err(OpError::invalid(format!(
                "SpaceToDepth: {h}x{w}, blocksize {b}"
            )));
        }
        let split = [n, c, h / b, b, w / b, b];
        let perm = if crd {
            [0, 1, 3, 5, 2, 4]
        } else {
            [0, 3, 5, 1, 2, 4]
        };
        reshaped(
            &permute(&reshaped(x, &split)?, &perm)?,
            &[n, c * b * b, h / b, w / b],
        )
    }
}

fn boxed(
    k: impl Fn(&[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> + Send + Sync + 'static,
) -> Box<dyn Kernel> {
    Box::new(k)
}

/// The output shape of an op that gives input 0's values another shape, from the
/// inputs (input 0 itself may be absent) and input 0's shape.
type ShapeFn = dyn Fn(&[Option<&Tensor>], &[usize]) -> Result<Vec<usize>, OpError> + Send + Sync;

/// Reshape, Flatten, Squeeze, Unsqueeze and Identity: input 0's values under the
/// shape `ShapeFn` gives. Handed over an input that nothing reads afterwards, they
/// keep its buffer instead of copying it (YOLOv8n's head reshapes copied 1.2 ms per
/// run).
struct Reshaping(Box<ShapeFn>);

fn reshaping(
    f: impl Fn(&[Option<&Tensor>], &[usize]) -> Result<Vec<usize>, OpError> + Send + Sync + 'static,
) -> Box<dyn Kernel> {
    Box::new(Reshaping(Box::new(f)))
}

impl Kernel for Reshaping {
    fn run(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        let x = input(inputs, 0)?;
        Ok(vec![reshaped(x, &(self.0)(inputs, x.shape())?)?])
    }

    fn reusable_inputs(&self) -> &[usize] {
        &[0]
    }

    fn run_reusing(
        &self,
        inputs: &[Option<&Tensor>],
        i: usize,
        owned: Tensor,
    ) -> Result<Vec<Tensor>, OpError> {
        if i != 0 {
            return run_not_reusing(self, inputs, i, owned);
        }
        let shape = (self.0)(inputs, owned.shape())?;
        Ok(vec![reshaped_owned(owned, &shape)?])
    }
}

const OPS: &[&str] = &[
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Transpose",
    "Expand",
    "DepthToSpace",
    "SpaceToDepth",
    "Identity",
    "Dropout",
    "Shape",
    "Size",
];

pub(super) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>> {
    if !OPS.contains(&spec.op_type) {
        return None;
    }
    let attrs = spec.attrs;
    let opset = spec.opset;
    Some((|| -> Result<Box<dyn Kernel>, OpError> {
        Ok(match spec.op_type {
            "Reshape" => {
                let allowzero = attrs.int_or("allowzero", 0)? != 0;
                let attr_shape = if opset < 5 {
                    attrs.ints("shape")?
                } else {
                    None
                };
                reshaping(move |inputs, shape| {
                    let target = match &attr_shape {
                        Some(s) => s.clone(),
                        None => input_i64s(inputs, 1)?,
                    };
                    reshape_target(shape, &target, allowzero)
                })
            }
            "Flatten" => {
                let axis = attrs.int_or("axis", 1)?;
                reshaping(move |_, shape| {
                    let r = shape.len() as i64;
                    let a = if axis < 0 { axis + r } else { axis };
                    if !(0..=r).contains(&a) {
                        return Err(OpError::invalid(format!(
                            "Flatten axis {axis} for rank {r}"
                        )));
                    }
                    let a = a as usize;
                    let outer = shape[..a].iter().product();
                    let inner = shape[a..].iter().product();
                    Ok(vec![outer, inner])
                })
            }
            "Squeeze" => {
                let attr = attrs.ints("axes")?;
                reshaping(move |inputs, shape| {
                    let axes = if opset >= 13 {
                        match inputs.get(1).copied().flatten() {
                            Some(_) => Some(input_i64s(inputs, 1)?),
                            None => None,
                        }
                    } else {
                        attr.clone()
                    };
                    squeeze_shape(shape, axes.as_deref())
                })
            }
            "Unsqueeze" => {
                let attr = attrs.ints("axes")?;
                if opset < 13 && attr.is_none() {
                    return Err(OpError::invalid("Unsqueeze without 'axes'"));
                }
                let opset13 = opset >= 13;
                reshaping(move |inputs, shape| {
                    let axes = if opset13 {
                        input_i64s(inputs, 1)?
                    } else {
                        attr.clone().unwrap_or_default()
                    };
                    unsqueeze_shape(shape, &axes)
                })
            }
            "Transpose" => {
                let perm = attrs.ints("perm")?;
                boxed(move |inputs| {
                    let x = input(inputs, 0)?;
                    let rank = x.shape().len();
                    let p: Vec<usize> = match &perm {
                        Some(p) => p
                            .iter()
                            .map(|&a| normalize_axis(a, rank))
                            .collect::<Result<_, _>>()?,
                        None => (0..rank).rev().collect(),
                    };
                    Ok(vec![permute(x, &p)?])
                })
            }
            "Expand" => {
                boxed(|inputs| Ok(vec![expand(input(inputs, 0)?, &input_i64s(inputs, 1)?)?]))
            }
            "DepthToSpace" | "SpaceToDepth" => {
                let b = attrs
                    .int("blocksize")?
                    .ok_or_else(|| OpError::invalid("missing 'blocksize'"))?;
                let b = usize::try_from(b)
                    .ok()
                    .filter(|&b| b > 0)
                    .ok_or_else(|| OpError::invalid(format!("blocksize {b}")))?;
                let to_space = spec.op_type == "DepthToSpace";
                let crd = match attrs.string_or("mode", "DCR")?.as_str() {
                    "DCR" => false,
                    "CRD" => true,
                    m => return Err(OpError::invalid(format!("DepthToSpace mode '{m}'"))),
                };
                boxed(move |inputs| Ok(vec![depth_space(input(inputs, 0)?, b, to_space, crd)?]))
            }
            "Identity" => reshaping(|_, shape| Ok(shape.to_vec())),
            "Dropout" => dropout(spec)?,
            "Shape" => {
                let start = attrs.int_or("start", 0)?;
                let end = attrs.int("end")?;
                boxed(move |inputs| {
                    let shape = input(inputs, 0)?.shape();
                    let r = shape.len() as i64;
                    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
                    let (s, e) = (clamp(start), clamp(end.unwrap_or(r)));
                    let dims: Vec<i64> = shape[s..e.max(s)].iter().map(|&d| d as i64).collect();
                    let n = dims.len();
                    Ok(vec![
                        Tensor::from_i64(&[n], dims)
                            .map_err(|e| OpError::invalid(e.to_string()))?,
                    ])
                })
            }
            "Size" => boxed(|inputs| {
                let n = input(inputs, 0)?.len() as i64;
                Ok(vec![
                    Tensor::from_i64(&[], vec![n]).map_err(|e| OpError::invalid(e.to_string()))?,
                ])
            }),
            _ => return Err(OpError::invalid("not a layout op")),
        })
    })())
}

/// Inference-mode Dropout: the input unchanged and an all-true mask. Training mode
/// with a non-zero ratio draws random numbers and is not supported.
fn dropout(spec: &NodeSpec) -> Result<Box<dyn Kernel>, OpError> {
    if spec.opset < 7 && spec.attrs.int_or("is_test", 0)? == 0 {
        return Err(OpError::unsupported("Dropout in training mode (is_test=0)"));
    }
    // Before opset 10 the mask has the input's type; from 10 on it is bool.
    let bool_mask = spec.opset >= 10;
    if spec.opset >= 12
        && let Some(Some(t)) = spec.const_inputs.get(2)
        && t.to_i64_vec().is_some_and(|v| v.iter().any(|&b| b != 0))
    {
        let ratio_zero = spec
            .const_inputs
            .get(1)
            .copied()
            .flatten()
            .and_then(|r| r.to_f64_vec());
        if !ratio_zero.is_some_and(|r| r.iter().all(|&v| v == 0.0)) {
            return Err(OpError::unsupported("Dropout in training mode"));
        }
    }
    let want_mask = spec.num_outputs > 1;
    Ok(Box::new(move |inputs: &[Option<&Tensor>]| {
        let x = input(inputs, 0)?;
        if let Some(training) = inputs.get(2).copied().flatten()
            && training
                .to_i64_vec()
                .is_some_and(|v| v.iter().any(|&b| b != 0))
        {
            let ratio = match inputs.get(1).copied().flatten() {
                Some(r) => r
                    .to_f64_vec()
                    .and_then(|v| v.first().copied())
                    .unwrap_or(0.5),
                None => 0.5,
            };
            if ratio != 0.0 {
                return Err(OpError::unsupported("Dropout in training mode"));
            }
        }
        let mut out = vec![x.clone()];
        if want_mask {
            let shape = IxDyn(x.shape());
            out.push(if bool_mask {
                Tensor::Bool(hmct_tensor::ndarray::ArrayD::from_elem(shape, true))
            } else {
                crate::ops::elementwise::cast::cast(
                    &Tensor::Bool(hmct_tensor::ndarray::ArrayD::from_elem(shape, true)),
                    x.dtype(),
                )?
            });
        }
        Ok(out)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reshape_targets() {
        assert_eq!(
            reshape_target(&[2, 3, 4], &[0, -1], false).unwrap(),
            vec![2, 12]
        );
        assert_eq!(
            reshape_target(&[2, 3, 4], &[4, 0, 2], false).unwrap(),
            vec![4, 3, 2]
        );
        assert_eq!(reshape_target(&[0, 3], &[3, 0], true).unwrap(), vec![3, 0]);
        assert!(reshape_target(&[2, 3], &[4, -1], false).is_err());
        assert!(reshape_target(&[2, 3], &[-1, -1], false).is_err());
    }

    #[test]
    fn depth_to_space_inverts_space_to_depth() {
        let x = Tensor::from_f32(&[1, 8, 2, 3], (0..48).map(|i| i as f32).collect()).unwrap();
        for crd in [false, true] {
            let s = depth_space(&x, 2, true, crd).unwrap();
            assert_eq!(s.shape(), &[1, 2, 4, 6]);
            assert_eq!(depth_space(&s, 2, false, crd).unwrap(), x);
        }
    }
}
