//! Index-driven reads and writes: Gather, GatherElements, GatherND, ScatterND,
//! ScatterElements (and its deprecated alias Scatter). Negative indices count from
//! the end; out-of-range indices are an error, never a wild read.

use hmct_tensor::ndarray::ArrayD;
use hmct_tensor::{Tensor, map_tensor};

use crate::ops::arrays::{array, contiguous, split3};
use crate::ops::num::{Num, TensorElem, typed, with_num};
use crate::ops::{Kernel, NodeSpec, OpError, input, input_i64s, normalize_axis};

fn norm_index(i: i64, len: usize) -> Result<usize, OpError> {
    let l = len as i64;
    let j = if i < 0 { i + l } else { i };
    if (0..l).contains(&j) {
        Ok(j as usize)
    } else {
        Err(OpError::invalid(format!(
            "index {i} out of range for axis of size {len}"
        )))
    }
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1] * shape[k + 1];
    }
    s
}

/// Calls `f(linear, multi_index)` for every position of `shape` in row-major order.
fn for_each_pos(
    shape: &[usize],
    mut f: impl FnMut(usize, &[usize]) -> Result<(), OpError>,
) -> Result<(), OpError> {
    let n: usize = shape.iter().product();
    let mut pos = vec![0usize; shape.len()];
    for lin in 0..n {
        f(lin, &pos)?;
        for k in (0..shape.len()).rev() {
            pos[k] += 1;
            if pos[k] < shape[k] {
                break;
            }
            pos[k] = 0;
        }
    }
    Ok(())
}

fn gather<T: Clone + Default + 'static>(
    a: &ArrayD<T>,
    axis: usize,
    ind: &[i64],
    ind_shape: &[usize],
) -> Result<ArrayD<T>, OpError> {
    let shape = a.shape();
    let (outer, len, inner) = split3(shape, axis, axis);
    let rows: Vec<usize> = ind
        .iter()
        .map(|&i| norm_index(i, len))
        .collect::<Result<_, _>>()?;
    let src = contiguous(a);
    // Every element is written below. f32 results come from the pool: ViT's Gathers
    // of the query, key and value (300 KB each) faulted in fresh pages on every run.
    let mut out = crate::buffers::take::<T>(outer * rows.len() * inner);
    if inner > 0 {
        let mut dst = out.chunks_exact_mut(inner);
        for o in 0..outer {
            for &r in &rows {
                let d = dst.next().expect("one chunk per gathered row");
                d.clone_from_slice(&src[(o * len + r) * inner..(o * len + r + 1) * inner]);
            }
        }
    }
    let out_shape: Vec<usize> = shape[..axis]
        .iter()
        .chain(ind_shape)
        .chain(&shape[axis + 1..])
        .copied()
        .collect();
    array(&out_shape, out)
}

fn gather_elements<T: Clone>(
    a: &ArrayD<T>,
    axis: usize,
    ind: &[i64],
    ind_shape: &[usize],
) -> Result<ArrayD<T>, OpError> {
    let shape = a.shape();
    if ind_shape.len() != shape.len() {
        return Err(OpError::invalid(
            "GatherElements indices must have the data's rank",
        ));
    }
    let st = strides(shape);
    let src = contiguous(a);
    let mut out = Vec::with_capacity(ind.len());
    for_each_pos(ind_shape, |lin, pos| {
        let mut off = 0;
        for k in 0..pos.len() {
            let i = if k == axis {
                norm_index(ind[lin], shape[k])?
            } else {
                pos[k]
            };
            if i >= shape[k] {
                return Err(OpError::invalid(
                    "GatherElements indices shape exceeds the data",
                ));
            }
            off += i * st[k];
        }
        out.push(src[off].clone());
        Ok(())
    })?;
    array(ind_shape, out)
}

/// Offsets into the data of each index tuple of GatherND/ScatterND: returns the
/// offsets, the size of the slice each tuple selects and the leading index shape.
fn nd_offsets(
    shape: &[usize],
    ind: &[i64],
    ind_shape: &[usize],
    b: usize,
) -> Result<(Vec<usize>, usize, Vec<usize>), OpError> {
    let (r, q) = (shape.len(), ind_shape.len());
    let k = *ind_shape
        .last()
        .ok_or_else(|| OpError::invalid("indices of rank 0"))?;
    if b >= q.min(r) || k > r - b || ind_shape[..b] != shape[..b] {
        return Err(OpError::invalid(format!(
            "indices of shape {ind_shape:?} (batch_dims {b}) do not fit data of shape {shape:?}"
        )));
    }
    let st = strides(shape);
    let batch: usize = shape[..b].iter().product();
    let batch_stride: usize = shape[b..].iter().product();
    let tuples: usize = ind_shape[b..q - 1].iter().product();
    let slice: usize = shape[b + k..].iter().product();
    let mut offs = Vec::with_capacity(batch * tuples);
    for bi in 0..batch {
        for t in 0..tuples {
            let tuple = &ind[(bi * tuples + t) * k..(bi * tuples + t + 1) * k];
            let mut off = bi * batch_stride;
            for (j, &i) in tuple.iter().enumerate() {
                off += norm_index(i, shape[b + j])? * st[b + j];
            }
            offs.push(off);
        }
    }
    Ok((offs, slice, ind_shape[..q - 1].to_vec()))
}

fn gather_nd<T: Clone>(
    a: &ArrayD<T>,
    ind: &[i64],
    ind_shape: &[usize],
    b: usize,
) -> Result<ArrayD<T>, OpError> {
    let (offs, slice, lead) = nd_offsets(a.shape(), ind, ind_shape, b)?;
    let k = ind_shape[ind_shape.len() - 1];
    let src = contiguous(a);
    let mut out = Vec::with_capacity(offs.len() * slice);
    for off in offs {
        out.extend_from_slice(&src[off..off + slice]);
    }
    let out_shape: Vec<usize> = lead.iter().chain(&a.shape()[b + k..]).copied().collect();
    array(&out_shape, out)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum ScatterRed {
    None,
    Add,
    Mul,
    Max,
    Min,
}

fn combine<T: Num>(red: ScatterRed) -> impl Fn(&mut T, &T) {
    move |o: &mut T, &u: &T| {
        *o = match red {
            ScatterRed::None => u,
            ScatterRed::Add => o.add(u),
            ScatterRed::Mul => o.mul(u),
            ScatterRed::Max => o.max_nan(u),
            ScatterRed::Min => o.min_nan(u),
        }
    }
}

fn scatter_nd<T: Clone>(
    a: &ArrayD<T>,
    ind: &[i64],
    ind_shape: &[usize],
    upd: &ArrayD<T>,
    f: impl Fn(&mut T, &T),
) -> Result<ArrayD<T>, OpError> {
    let (offs, slice, lead) = nd_offsets(a.shape(), ind, ind_shape, 0)?;
    let k = ind_shape[ind_shape.len() - 1];
    let want: Vec<usize> = lead.iter().chain(&a.shape()[k..]).copied().collect();
    if upd.shape() != want.as_slice() {
        return Err(OpError::invalid(format!(
            "ScatterND updates of shape {:?}, expected {want:?}",
            upd.shape()
        )));
    }
    let mut out = contiguous(a).into_owned();
    let u = contiguous(upd);
    for (t, off) in offs.into_iter().enumerate() {
        for s in 0..slice {
            f(&mut out[off + s], &u[t * slice + s]);
        }
    }
    array(a.shape(), out)
}

fn scatter_elements<T: Clone>(
    a: &ArrayD<T>,
    axis: usize,
    ind: &[i64],
    ind_shape: &[usize],
    upd: &ArrayD<T>,
    f: impl Fn(&mut T, &T),
) -> Result<ArrayD<T>, OpError> {
    let shape = a.shape();
    if ind_shape.len() != shape.len() || upd.shape() != ind_shape {
        return Err(OpError::invalid(
            "ScatterElements indices/updates shapes do not match the data",
        ));
    }
    let st = strides(shape);
    let mut out = contiguous(a).into_owned();
    let u = contiguous(upd);
    for_each_pos(ind_shape, |lin, pos| {
        let mut off = 0;
        for k in 0..pos.len() {
            let i = if k == axis {
                norm_index(ind[lin], shape[k])?
            } else {
                pos[k]
            };
            if i >= shape[k] {
                return Err(OpError::invalid(
                    "ScatterElements indices shape exceeds the data",
                ));
            }
            off += i * st[k];
        }
        f(&mut out[off], &u[lin]);
        Ok(())
    })?;
    array(shape, out)
}

fn scatter(
    kind: &str,
    data: &Tensor,
    axis: i64,
    ind: &[i64],
    ind_shape: &[usize],
    upd: &Tensor,
    red: ScatterRed,
) -> Result<Tensor, OpError> {
    let axis = normalize_axis(axis, data.shape().len())?;
    let elements = kind != "ScatterND";
    macro_rules! go {
        ($a:expr, $f:expr) => {{
            let u = typed(upd, "updates")?;
            let out = if elements {
                scatter_elements($a, axis, ind, ind_shape, u, $f)?
            } else {
                scatter_nd($a, ind, ind_shape, u, $f)?
            };
            Ok(TensorElem::wrap(out))
        }};
    }
    if red == ScatterRed::None {
        return map_tensor!(data, a => go!(a, |o: &mut _, u: &_| *o = Clone::clone(u)));
    }
    with_num!(data, a => go!(a, combine(red)),
        other => Err(OpError::unsupported(format!("{kind} reduction on {}", other.dtype()))))
}

fn boxed(
    k: impl Fn(&[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> + Send + Sync + 'static,
) -> Box<dyn Kernel> {
    Box::new(k)
}

pub(super) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>> {
    let op = spec.op_type;
    if !matches!(
        op,
        "Gather" | "GatherElements" | "GatherND" | "ScatterND" | "ScatterElements" | "Scatter"
    ) {
        return None;
    }
    let attrs = spec.attrs;
    Some((|| -> Result<Box<dyn Kernel>, OpError> {
        let axis = attrs.int_or("axis", 0)?;
        Ok(match op {
            "Gather" | "GatherElements" => {
                let elements = op == "GatherElements";
                boxed(move |inputs| {
                    let x = input(inputs, 0)?;
                    let ind_t = input(inputs, 1)?;
                    let ind = input_i64s(inputs, 1)?;
                    let ax = normalize_axis(axis, x.shape().len())?;
                    Ok(vec![map_tensor!(x, a => TensorElem::wrap(if elements {
                        gather_elements(a, ax, &ind, ind_t.shape())?
                    } else {
                        gather(a, ax, &ind, ind_t.shape())?
                    }))])
                })
            }
            "GatherND" => {
                let b = usize::try_from(attrs.int_or("batch_dims", 0)?)
                    .map_err(|_| OpError::invalid("negative batch_dims"))?;
                boxed(move |inputs| {
                    let x = input(inputs, 0)?;
                    let ind = input_i64s(inputs, 1)?;
                    let ind_shape = input(inputs, 1)?.shape().to_vec();
                    Ok(vec![
                        map_tensor!(x, a => TensorElem::wrap(gather_nd(a, &ind, &ind_shape, b)?)),
                    ])
                })
            }
            _ => {
                let red = match attrs.string_or("reduction", "none")?.as_str() {
                    "none" => ScatterRed::None,
                    "add" => ScatterRed::Add,
                    "mul" => ScatterRed::Mul,
                    "max" => ScatterRed::Max,
                    "min" => ScatterRed::Min,
                    r => return Err(OpError::unsupported(format!("{op} reduction '{r}'"))),
                };
                let kind = op.to_string();
                boxed(move |inputs| {
                    let data = input(inputs, 0)?;
                    let ind = input_i64s(inputs, 1)?;
                    let ind_shape = input(inputs, 1)?.shape().to_vec();
                    let upd = input(inputs, 2)?;
                    Ok(vec![scatter(
                        &kind, data, axis, &ind, &ind_shape, upd, red,
                    )?])
                })
            }
        })
    })())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hmct_tensor::ndarray::IxDyn;

    fn a(shape: &[usize], v: Vec<i64>) -> ArrayD<i64> {
        ArrayD::from_shape_vec(IxDyn(shape), v).unwrap()
    }

    #[test]
    fn gather_nd_with_batch_dims() {
        // onnx example: data [2,2,2], indices [[1],[0]] with batch_dims=1 -> [[2,3],[4,5]]
        let d = a(&[2, 2, 2], (0..8).collect());
        let out = gather_nd(&d, &[1, 0], &[2, 1], 1).unwrap();
        assert_eq!(out, a(&[2, 2], vec![2, 3, 4, 5]));
    }

    #[test]
    fn scatter_elements_adds_duplicates_and_rejects_out_of_range() {
        let d = a(&[1, 5], vec![1, 2, 3, 4, 5]);
        let u = a(&[1, 2], vec![10, 20]);
        let out = scatter_elements(&d, 1, &[1, 1], &[1, 2], &u, combine(ScatterRed::Add)).unwrap();
        assert_eq!(out, a(&[1, 5], vec![1, 32, 3, 4, 5]));
        assert!(scatter_elements(&d, 1, &[5, 0], &[1, 2], &u, combine(ScatterRed::Add)).is_err());
        assert_eq!(
            gather(&d, 1, &[-1, 0], &[2]).unwrap(),
            a(&[1, 2], vec![5, 1])
        );
    }
}
