//! Constant (every `value*` attribute form), EyeLike and OneHot.

use hmct_tensor::ndarray::{ArrayD, IxDyn};
use hmct_tensor::{Tensor, map_tensor};

use super::arrays::array;
use super::elementwise::cast::{cast, dtype_of_code};
use super::num::TensorElem;
use super::{Kernel, NodeSpec, OpError, input};

fn constant_value(spec: &NodeSpec) -> Result<Tensor, OpError> {
    let a = &spec.attrs;
    let bad = |e: hmct_tensor::TensorError| OpError::invalid(e.to_string());
    if a.has("sparse_value") {
        return Err(OpError::unsupported("Constant with a sparse_value"));
    }
    if let Some(t) = a.tensor("value")? {
        return Ok(t);
    }
    if let Some(v) = a.float("value_float")? {
        return Ok(Tensor::scalar_f32(v));
    }
    if let Some(v) = a.floats("value_floats")? {
        return Tensor::from_f32(&[v.len()], v).map_err(bad);
    }
    if let Some(v) = a.int("value_int")? {
        return Tensor::from_i64(&[], vec![v]).map_err(bad);
    }
    if let Some(v) = a.ints("value_ints")? {
        return Tensor::from_i64(&[v.len()], v).map_err(bad);
    }
    if let Some(v) = a.string("value_string")? {
        return Ok(Tensor::String(ArrayD::from_elem(IxDyn(&[]), v)));
    }
    if let Some(v) = a.strings("value_strings")? {
        return Ok(Tensor::String(array(&[v.len()], v)?));
    }
    Err(OpError::invalid("Constant without a value attribute"))
}

fn eye_like(x: &Tensor, dtype: Option<hmct_tensor::DType>, k: i64) -> Result<Tensor, OpError> {
    let &[rows, cols] = x.shape() else {
        return Err(OpError::invalid(format!(
            "EyeLike needs a 2-D input, got {:?}",
            x.shape()
        )));
    };
    let mut ones = vec![0u8; rows * cols];
    for i in 0..rows {
        let j = i as i64 + k;
        if (0..cols as i64).contains(&j) {
            ones[i * cols + j as usize] = 1;
        }
    }
    cast(
        &Tensor::U8(array(&[rows, cols], ones)?),
        dtype.unwrap_or(x.dtype()),
    )
}

fn one_hot(
    indices: &Tensor,
    depth: &Tensor,
    values: &Tensor,
    axis: i64,
) -> Result<Tensor, OpError> {
    let depth = match depth.to_f64_vec().as_deref() {
        Some([d]) if *d >= 1.0 => *d as usize,
        _ => return Err(OpError::invalid("OneHot depth must be one positive number")),
    };
    let idx = indices
        .to_f64_vec()
        .ok_or_else(|| OpError::invalid(format!("OneHot indices of type {}", indices.dtype())))?;
    let shape = indices.shape();
    let rank = shape.len() as i64 + 1;
    let ax = if axis < 0 { axis + rank } else { axis };
    if !(0..rank).contains(&ax) {
        return Err(OpError::invalid(format!(
            "OneHot axis {axis} for output rank {rank}"
        )));
    }
    let ax = ax as usize;
    let outer: usize = shape[..ax].iter().product();
    let inner: usize = shape[ax..].iter().product();
    let mut out_shape = shape.to_vec();
    out_shape.insert(ax, depth);
    // hot[(o * depth + d) * inner + i] is set where index (o, i) equals d.
    let hot_at: Vec<Option<usize>> = idx
        .iter()
        .map(|&v| {
            let v = v as i64;
            let v = if v < 0 { v + depth as i64 } else { v };
            (0..depth as i64).contains(&v).then_some(v as usize)
        })
        .collect();
    map_tensor!(values, vals => {
        let v: Vec<_> = vals.iter().cloned().collect();
        let [off, on] = <[_; 2]>::try_from(v)
            .map_err(|_| OpError::invalid("OneHot values must hold two elements"))?;
        let mut out = vec![off; outer * depth * inner];
        for o in 0..outer {
            for i in 0..inner {
                if let Some(d) = hot_at[o * inner + i] {
                    out[(o * depth + d) * inner + i] = on.clone();
                }
            }
        }
        Ok(TensorElem::wrap(array(&out_shape, out)?))
    })
}

pub(crate) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>> {
    Some(match spec.op_type {
        "Constant" => constant_value(spec)
            .map(|t| Box::new(move |_: &[Option<&Tensor>]| Ok(vec![t.clone()])) as Box<dyn Kernel>),
        "EyeLike" => (|| {
            let dtype = spec
                .attrs
                .int("dtype")?
                .map(|c| dtype_of_code(c, "EyeLike dtype"))
                .transpose()?;
            let k = spec.attrs.int_or("k", 0)?;
            Ok(Box::new(move |inputs: &[Option<&Tensor>]| {
                Ok(vec![eye_like(input(inputs, 0)?, dtype, k)?])
            }) as Box<dyn Kernel>)
        })(),
        "OneHot" => (|| {
            let axis = spec.attrs.int_or("axis", -1)?;
            Ok(Box::new(move |inputs: &[Option<&Tensor>]| {
                Ok(vec![one_hot(
                    input(inputs, 0)?,
                    input(inputs, 1)?,
                    input(inputs, 2)?,
                    axis,
                )?])
            }) as Box<dyn Kernel>)
        })(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_hot_inserts_the_depth_axis() {
        let ind = Tensor::from_i64(&[2], vec![1, -1]).unwrap();
        let depth = Tensor::from_i64(&[], vec![3]).unwrap();
        let vals = Tensor::from_f32(&[2], vec![0.0, 5.0]).unwrap();
        let out = one_hot(&ind, &depth, &vals, 0).unwrap();
        assert_eq!(out.shape(), &[3, 2]);
        assert_eq!(
            out.as_f32().unwrap().iter().copied().collect::<Vec<_>>(),
            vec![0.0, 0.0, 5.0, 0.0, 0.0, 5.0]
        );
    }

    #[test]
    fn eye_like_with_offset() {
        let x = Tensor::from_i64(&[2, 3], vec![0; 6]).unwrap();
        let out = eye_like(&x, None, 1).unwrap();
        assert_eq!(out.to_i64_vec().unwrap(), vec![0, 1, 0, 0, 0, 1]);
    }
}
