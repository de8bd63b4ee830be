//! Ops that pick, repeat or join ranges of indices per axis: Slice, Split, Concat,
//! Tile, Pad.

use hmct_tensor::ndarray::{ArrayD, Axis};
use hmct_tensor::{Tensor, map_tensor};

use crate::ops::arrays::{array, contiguous};
use crate::ops::num::{TensorElem, scalar_of, typed};
use crate::ops::{Kernel, NodeSpec, OpError, input, input_i64s, normalize_axis, opt_input};

/// Output element at multi-index `i` is input element `idx[0][i0], idx[1][i1], ...`,
/// or `fill` where an index is `None` (padding).
pub(crate) fn take<T: Clone + Default + 'static>(
    a: &ArrayD<T>,
    idx: &[Vec<Option<usize>>],
    fill: &T,
) -> Result<ArrayD<T>, OpError> {
    let rank = idx.len();
    if rank != a.ndim() {
        return Err(OpError::invalid("index lists do not match the rank"));
    }
    let out_shape: Vec<usize> = idx.iter().map(Vec::len).collect();
    if rank == 0 {
        return Ok(a.clone());
    }
    let src = contiguous(a);
    let n: usize = out_shape.iter().product();
    if n == 0 {
        return array(&out_shape, Vec::new());
    }
    // Every element is written below, in order from `filled`. f32 results come from
    // the pool: Swin-T's Pads faulted in fresh pages on every run.
    let mut out = crate::buffers::take::<T>(n);
    let mut filled = 0;
    let mut strides = vec![1usize; rank];
    for k in (0..rank - 1).rev() {
        strides[k] = strides[k + 1] * a.shape()[k + 1];
    }
    if let Some(starts) = idx
        .iter()
        .map(|v| consecutive(v))
        .collect::<Option<Vec<_>>>()
    {
        for_blocks(a.shape(), &starts, &out_shape, |at, len| {
            out[filled..filled + len].clone_from_slice(&src[at..at + len]);
            filled += len;
        });
        return array(&out_shape, out);
    }
    let last = &idx[rank - 1];
    // A run of consecutive source indices copies as one slice.
    let run = match (last.first(), last.len()) {
        (Some(Some(s)), len) if last.iter().enumerate().all(|(j, v)| *v == Some(s + j)) => {
            Some((*s, len))
        }
        _ => None,
    };
    let mut pos = vec![0usize; rank - 1];
    loop {
        let mut base = Some(0usize);
        for k in 0..rank - 1 {
            base = match (base, idx[k][pos[k]]) {
                (Some(b), Some(i)) => Some(b + i * strides[k]),
                _ => None,
            };
        }
        let row = &mut out[filled..filled + last.len()];
        filled += last.len();
        match (base, run) {
            (None, _) => row.fill(fill.clone()),
            (Some(b), Some((s, len))) => row.clone_from_slice(&src[b + s..b + s + len]),
            (Some(b), None) => {
                for (o, j) in row.iter_mut().zip(last) {
                    *o = match j {
                        Some(j) => src[b + j].clone(),
                        None => fill.clone(),
                    };
                }
            }
        }
        let mut k = rank - 1;
        loop {
            if k == 0 {
                return array(&out_shape, out);
            }
            k -= 1;
            pos[k] += 1;
            if pos[k] < out_shape[k] {
                break;
            }
            pos[k] = 0;
        }
    }
}

/// The first index of a list of consecutive source indices (`s, s+1, ...`, no
/// padding), or None.
fn consecutive(v: &[Option<usize>]) -> Option<usize> {
    let s = v.first().copied().flatten()?;
    v.iter()
        .enumerate()
        .all(|(j, i)| *i == Some(s + j))
        .then_some(s)
}

/// The blocks `(offset, length)` of a row-major source of `shape`, in order, that
/// make up the part whose axis `k` runs over `starts[k]..starts[k] + out_shape[k]`:
/// the trailing axes read whole are one block with the axis before them, so a
/// channel split of an NCHW tensor is one copy per image rather than one per row.
fn for_blocks(
    shape: &[usize],
    starts: &[usize],
    out_shape: &[usize],
    mut f: impl FnMut(usize, usize),
) {
    let rank = shape.len();
    let mut strides = vec![1usize; rank];
    for k in (0..rank.saturating_sub(1)).rev() {
        strides[k] = strides[k + 1] * shape[k + 1];
    }
    let mut inner = rank - 1;
    // (A run as long as its axis starts at 0.)
    while inner > 0 && out_shape[inner] == shape[inner] {
        inner -= 1;
    }
    let block = out_shape[inner] * strides[inner];
    let mut pos = vec![0usize; inner];
    loop {
        let at: usize = (0..inner)
            .map(|k| (starts[k] + pos[k]) * strides[k])
            .sum::<usize>()
            + starts[inner] * strides[inner];
        f(at, block);
        // The next position of the outer axes, the last one fastest.
        let mut k = inner;
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            pos[k] += 1;
            if pos[k] < out_shape[k] {
                break;
            }
            pos[k] = 0;
        }
    }
}

fn take_tensor(t: &Tensor, idx: &[Vec<Option<usize>>]) -> Result<Tensor, OpError> {
    // f32 parts of consecutive runs go into a recycled buffer: a fresh one costs
    // page faults on every run, more than the copy.
    if let Tensor::F32(a) = t
        && !idx.is_empty()
        && idx.len() == a.ndim()
        && let Some(src) = a.as_slice()
        && let Some(starts) = idx
            .iter()
            .map(|v| consecutive(v))
            .collect::<Option<Vec<_>>>()
    {
        let out_shape: Vec<usize> = idx.iter().map(Vec::len).collect();
        let mut out = crate::buffers::take::<f32>(out_shape.iter().product());
        let mut filled = 0;
        for_blocks(a.shape(), &starts, &out_shape, |at, len| {
            out[filled..filled + len].copy_from_slice(&src[at..at + len]);
            filled += len;
        });
        return Ok(Tensor::F32(array(&out_shape, out)?));
    }
    map_tensor!(t, a => Ok(TensorElem::wrap(take(a, idx, &Default::default())?)))
}

fn identity_idx(shape: &[usize]) -> Vec<Vec<Option<usize>>> {
    shape.iter().map(|&d| (0..d).map(Some).collect()).collect()
}

/// Source indices of a Slice along one axis of size `dim` (ONNX clamping rules).
fn slice_axis(dim: usize, start: i64, end: i64, step: i64) -> Result<Vec<Option<usize>>, OpError> {
    if step == 0 {
        return Err(OpError::invalid("Slice step 0"));
    }
    let d = dim as i64;
    let fix = |v: i64| if v < 0 { v + d } else { v };
    let (s, e) = (fix(start), fix(end));
    let (s, e) = if step > 0 {
        (s.clamp(0, d), e.clamp(0, d))
    } else {
        (s.clamp(0, (d - 1).max(0)), e.clamp(-1, d - 1))
    };
    let mut out = Vec::new();
    let mut i = s;
    while (step > 0 && i < e) || (step < 0 && i > e) {
        out.push(Some(i as usize));
        i += step;
    }
    Ok(out)
}

fn slice(
    x: &Tensor,
    starts: &[i64],
    ends: &[i64],
    axes: Option<&[i64]>,
    steps: Option<&[i64]>,
) -> Result<Tensor, OpError> {
    let shape = x.shape();
    let n = starts.len();
    if ends.len() != n || axes.is_some_and(|a| a.len() != n) || steps.is_some_and(|s| s.len() != n)
    {
        return Err(OpError::invalid(
            "Slice starts/ends/axes/steps lengths differ",
        ));
    }
    let mut idx = identity_idx(shape);
    let mut seen = vec![false; shape.len()];
    for i in 0..n {
        let ax = normalize_axis(axes.map_or(i as i64, |a| a[i]), shape.len())?;
        if std::mem::replace(&mut seen[ax], true) {
            return Err(OpError::invalid(format!("Slice repeats axis {ax}")));
        }
        idx[ax] = slice_axis(shape[ax], starts[i], ends[i], steps.map_or(1, |s| s[i]))?;
    }
    take_tensor(x, &idx)
}

fn concat_typed<T: TensorElem>(
    first: &ArrayD<T>,
    all: &[&Tensor],
    axis: usize,
) -> Result<Tensor, OpError> {
    let mut views = vec![first.view()];
    for t in &all[1..] {
        views.push(typed::<T>(t, "Concat input")?.view());
    }
    let out = hmct_tensor::ndarray::concatenate(Axis(axis), &views)
        .map_err(|e| OpError::invalid(format!("Concat: {e}")))?;
    Ok(T::wrap(if out.is_standard_layout() {
        out
    } else {
        crate::ops::arrays::std_owned(out.view())
    }))
}

/// Concat of f32 tensors in standard layout as block copies into a recycled buffer
/// (ndarray's concatenate walks elements into fresh pages); `None` when the inputs
/// do not all fit that case, for the general path to handle or reject.
fn concat_f32(all: &[&Tensor], axis: usize) -> Option<Tensor> {
    let arrays: Vec<&[f32]> = all
        .iter()
        .map(|t| t.as_f32().and_then(|a| a.as_slice()))
        .collect::<Option<_>>()?;
    let first = all.first()?.shape();
    if axis >= first.len() {
        return None;
    }
    let same_but_axis = |s: &[usize]| {
        s.len() == first.len()
            && s.iter()
                .zip(first)
                .enumerate()
                .all(|(d, (a, b))| d == axis || a == b)
    };
    if !all.iter().all(|t| same_but_axis(t.shape())) {
        return None;
    }
    let outer: usize = first[..axis].iter().product();
    let inner: usize = first[axis + 1..].iter().product();
    let mut shape = first.to_vec();
    shape[axis] = all.iter().map(|t| t.shape()[axis]).sum();
    // Every element is written: each outer index takes one block from every input.
    let mut out = crate::buffers::take::<f32>(shape.iter().product());
    let mut at = 0;
    for o in 0..outer {
        for (t, a) in all.iter().zip(&arrays) {
            let len = t.shape()[axis] * inner;
            out[at..at + len].copy_from_slice(&a[o * len..][..len]);
            at += len;
        }
    }
    array(&shape, out).ok().map(Tensor::F32)
}

fn concat(inputs: &[Option<&Tensor>], axis: i64) -> Result<Tensor, OpError> {
    let all: Vec<&Tensor> = inputs.iter().flatten().copied().collect();
    let first = *all
        .first()
        .ok_or_else(|| OpError::invalid("Concat without inputs"))?;
    let ax = normalize_axis(axis, first.shape().len())?;
    if let Some(t) = concat_f32(&all, ax) {
        return Ok(t);
    }
    map_tensor!(first, a => concat_typed(a, &all, ax))
}

/// Split sizes: given, or `n` near-equal parts (the last one smaller when uneven).
fn split_sizes(dim: usize, given: Option<Vec<i64>>, n: usize) -> Result<Vec<usize>, OpError> {
    match given {
        Some(s) => {
            let s: Vec<usize> = s
                .iter()
                .map(|&v| {
                    usize::try_from(v).map_err(|_| OpError::invalid(format!("Split size {v}")))
                })
                .collect::<Result<_, _>>()?;
            if s.iter().sum::<usize>() != dim {
                return Err(OpError::invalid(format!(
                    "Split sizes {s:?} do not add up to {dim}"
                )));
            }
            Ok(s)
        }
        None => {
            if n == 0 {
                return Err(OpError::invalid("Split into 0 outputs"));
            }
            let part = dim.div_ceil(n);
            Ok((0..n)
                .map(|i| part.min(dim.saturating_sub(i * part)))
                .collect())
        }
    }
}

fn split(x: &Tensor, axis: i64, sizes: Option<Vec<i64>>, n: usize) -> Result<Vec<Tensor>, OpError> {
    let shape = x.shape();
    let ax = normalize_axis(axis, shape.len())?;
    let sizes = split_sizes(shape[ax], sizes, n)?;
    let mut idx = identity_idx(shape);
    let mut start = 0;
    let mut out = Vec::with_capacity(sizes.len());
    for s in sizes {
        idx[ax] = (start..start + s).map(Some).collect();
        out.push(take_tensor(x, &idx)?);
        start += s;
    }
    Ok(out)
}

fn tile(x: &Tensor, repeats: &[i64]) -> Result<Tensor, OpError> {
    let shape = x.shape();
    if repeats.len() != shape.len() || repeats.iter().any(|&r| r < 0) {
        return Err(OpError::invalid(format!(
            "Tile repeats {repeats:?} for shape {shape:?}"
        )));
    }
    let idx: Vec<Vec<Option<usize>>> = shape
        .iter()
        .zip(repeats)
        .map(|(&d, &r)| (0..d * r as usize).map(|i| Some(i % d)).collect())
        .collect();
    take_tensor(x, &idx)
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum PadMode {
    Constant,
    Reflect,
    Edge,
    Wrap,
}

fn pad_axis(
    dim: usize,
    before: i64,
    after: i64,
    mode: PadMode,
) -> Result<Vec<Option<usize>>, OpError> {
    let d = dim as i64;
    let len = d + before + after;
    if len < 0 {
        return Err(OpError::invalid(format!(
            "Pad gives a negative size ({dim} {before:+} {after:+})"
        )));
    }
    if dim == 0 && len > 0 && mode != PadMode::Constant {
        return Err(OpError::invalid(format!(
            "{mode:?} padding of an empty axis"
        )));
    }
    Ok((0..len)
        .map(|i| {
            let s = i - before;
            if (0..d).contains(&s) {
                return Some(s as usize);
            }
            match mode {
                PadMode::Constant => None,
                PadMode::Edge => Some(s.clamp(0, d - 1) as usize),
                PadMode::Wrap => Some(s.rem_euclid(d) as usize),
                PadMode::Reflect if d == 1 => Some(0),
                PadMode::Reflect => {
                    let m = s.rem_euclid(2 * (d - 1));
                    Some((if m >= d { 2 * (d - 1) - m } else { m }) as usize)
                }
            }
        })
        .collect())
}

fn pad(
    x: &Tensor,
    pads: &[i64],
    axes: Option<&[i64]>,
    mode: PadMode,
    value: Option<&Tensor>,
    attr_value: f32,
) -> Result<Tensor, OpError> {
    let shape = x.shape();
    let rank = shape.len();
    let axes: Vec<usize> = match axes {
        Some(a) => a
            .iter()
            .map(|&v| normalize_axis(v, rank))
            .collect::<Result<_, _>>()?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(OpError::invalid(format!(
            "Pad: {} pads for {} axes",
            pads.len(),
            axes.len()
        )));
    }
    let mut idx = identity_idx(shape);
    for (k, &ax) in axes.iter().enumerate() {
        idx[ax] = pad_axis(shape[ax], pads[k], pads[k + axes.len()], mode)?;
    }
    map_tensor!(x, a => {
        let fill = match value {
            Some(v) => scalar_of(typed(v, "Pad constant_value")?, "Pad constant_value")?,
            None => fill_value(attr_value)?,
        };
        Ok(TensorElem::wrap(take(a, &idx, &fill)?))
    })
}

/// The `value` attribute of Pad < 11 (a float) in the data's type.
fn fill_value<T: TensorElem>(v: f32) -> Result<T, OpError> {
    let t = crate::ops::elementwise::cast::cast(&Tensor::scalar_f32(v), T::DTYPE)?;
    scalar_of(typed::<T>(&t, "Pad value")?, "Pad value")
}

fn boxed(
    k: impl Fn(&[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> + Send + Sync + 'static,
) -> Box<dyn Kernel> {
    Box::new(k)
}

pub(super) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>> {
    if !matches!(spec.op_type, "Slice" | "Split" | "Concat" | "Tile" | "Pad") {
        return None;
    }
    let attrs = spec.attrs;
    let opset = spec.opset;
    Some((|| -> Result<Box<dyn Kernel>, OpError> {
        Ok(match spec.op_type {
            "Slice" if opset < 10 => {
                let starts = attrs
                    .ints("starts")?
                    .ok_or_else(|| OpError::invalid("Slice without 'starts'"))?;
                let ends = attrs
                    .ints("ends")?
                    .ok_or_else(|| OpError::invalid("Slice without 'ends'"))?;
                let axes = attrs.ints("axes")?;
                boxed(move |inputs| {
                    Ok(vec![slice(
                        input(inputs, 0)?,
                        &starts,
                        &ends,
                        axes.as_deref(),
                        None,
                    )?])
                })
            }
            "Slice" => boxed(|inputs| {
                let axes = opt_input(inputs, 3)
                    .map(|_| input_i64s(inputs, 3))
                    .transpose()?;
                let steps = opt_input(inputs, 4)
                    .map(|_| input_i64s(inputs, 4))
                    .transpose()?;
                Ok(vec![slice(
                    input(inputs, 0)?,
                    &input_i64s(inputs, 1)?,
                    &input_i64s(inputs, 2)?,
                    axes.as_deref(),
                    steps.as_deref(),
                )?])
            }),
            "Concat" => {
                let axis = match attrs.int("axis")? {
                    Some(a) => a,
                    None if opset < 4 => 1,
                    None => return Err(OpError::invalid("Concat without 'axis'")),
                };
                boxed(move |inputs| Ok(vec![concat(inputs, axis)?]))
            }
            "Split" => {
                let axis = attrs.int_or("axis", 0)?;
                let attr_split = if opset < 13 {
                    attrs.ints("split")?
                } else {
                    None
                };
                let n = match attrs.int("num_outputs")? {
                    Some(n) if opset >= 18 => usize::try_from(n)
                        .map_err(|_| OpError::invalid(format!("num_outputs {n}")))?,
                    _ => spec.num_outputs,
                };
                boxed(move |inputs| {
                    let sizes = match &attr_split {
                        Some(s) => Some(s.clone()),
                        None => opt_input(inputs, 1)
                            .map(|_| input_i64s(inputs, 1))
                            .transpose()?,
                    };
                    split(input(inputs, 0)?, axis, sizes, n)
                })
            }
            "Tile" => boxed(|inputs| Ok(vec![tile(input(inputs, 0)?, &input_i64s(inputs, 1)?)?])),
            "Pad" => {
                let mode = match attrs.string_or("mode", "constant")?.as_str() {
                    "constant" => PadMode::Constant,
                    "reflect" => PadMode::Reflect,
                    "edge" => PadMode::Edge,
                    "wrap" => PadMode::Wrap,
                    m => return Err(OpError::unsupported(format!("Pad mode '{m}'"))),
                };
                if opset < 11 {
                    let pads = attrs
                        .ints(if opset < 2 { "paddings" } else { "pads" })?
                        .ok_or_else(|| OpError::invalid("Pad without 'pads'"))?;
                    let value = attrs.float_or("value", 0.0)?;
                    boxed(move |inputs| {
                        Ok(vec![pad(
                            input(inputs, 0)?,
                            &pads,
                            None,
                            mode,
                            None,
                            value,
                        )?])
                    })
                } else {
                    boxed(move |inputs| {
                        let axes = opt_input(inputs, 3)
                            .map(|_| input_i64s(inputs, 3))
                            .transpose()?;
                        Ok(vec![pad(
                            input(inputs, 0)?,
                            &input_i64s(inputs, 1)?,
                            axes.as_deref(),
                            mode,
                            opt_input(inputs, 2),
                            0.0,
                        )?])
                    })
                }
            }
            _ => return Err(OpError::invalid("not a slicing op")),
        })
    })())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parts of consecutive runs (copied as blocks, into a pooled buffer for f32)
    /// hold the elements ndarray's own slicing gives, for every combination of whole,
    /// leading, trailing and inner runs over ranks 1 to 4.
    #[test]
    fn consecutive_parts_match_ndarray_slicing() {
        use hmct_tensor::ndarray::{IxDyn, Slice};
        let shapes: [&[usize]; 5] = [&[7], &[3, 5], &[2, 6, 4], &[2, 3, 4, 5], &[1, 116, 7, 3]];
        for shape in shapes {
            let n: usize = shape.iter().product();
            let a =
                ArrayD::from_shape_vec(IxDyn(shape), (0..n).map(|v| v as f32).collect()).unwrap();
            let ai = a.mapv(|v| v as i64);
            // Per axis: whole, the first part, the last part, an inner part.
            let runs = |d: usize| -> Vec<(usize, usize)> {
                vec![
                    (0, d),
                    (0, d.div_ceil(2)),
                    (d / 2, d),
                    (d / 3, (d / 3 + 1).min(d)),
                ]
            };
            let mut choice = vec![0usize; shape.len()];
            loop {
                let ranges: Vec<(usize, usize)> = shape
                    .iter()
                    .zip(&choice)
                    .map(|(&d, &c)| runs(d)[c])
                    .collect();
                let idx: Vec<Vec<Option<usize>>> = ranges
                    .iter()
                    .map(|&(s, e)| (s..e).map(Some).collect())
                    .collect();
                let want = a.slice_each_axis(|ax| {
                    let (s, e) = ranges[ax.axis.index()];
                    Slice::from(s..e)
                });
                let got = take_tensor(&Tensor::F32(a.clone()), &idx).unwrap();
                assert_eq!(got.as_f32().unwrap(), &want, "{shape:?} {ranges:?}");
                let got_i = take(&ai, &idx, &0).unwrap();
                assert_eq!(got_i, want.mapv(|v| v as i64), "{shape:?} {ranges:?}");
                let Some(k) = (0..shape.len()).rev().find(|&k| choice[k] < 3) else {
                    break;
                };
                choice[k] += 1;
                choice[k + 1..].fill(0);
            }
        }
    }

    #[test]
    fn slice_clamps_and_steps_backwards() {
        let idx = |v: Vec<Option<usize>>| v.into_iter().map(|i| i.unwrap()).collect::<Vec<_>>();
        assert_eq!(
            idx(slice_axis(10, 1, 1000, 1).unwrap()),
            (1..10).collect::<Vec<_>>()
        );
        assert_eq!(
            idx(slice_axis(5, -1, -1000, -1).unwrap()),
            vec![4, 3, 2, 1, 0]
        );
        assert_eq!(idx(slice_axis(5, 20, 0, -2).unwrap()), vec![4, 2]);
        assert!(slice_axis(5, 3, 1, 1).unwrap().is_empty());
    }

    #[test]
    fn pad_modes_match_numpy() {
        let src = |m| {
            pad_axis(3, 4, 2, m)
                .unwrap()
                .into_iter()
                .map(|v| v.map(|i| i as i64).unwrap_or(-1))
                .collect::<Vec<_>>()
        };
        // np.pad([0,1,2], (4,2), mode) as indices.
        assert_eq!(
            src(PadMode::Constant),
            vec![-1, -1, -1, -1, 0, 1, 2, -1, -1]
        );
        assert_eq!(src(PadMode::Edge), vec![0, 0, 0, 0, 0, 1, 2, 2, 2]);
        assert_eq!(src(PadMode::Reflect), vec![0, 1, 2, 1, 0, 1, 2, 1, 0]);
        assert_eq!(src(PadMode::Wrap), vec![2, 0, 1, 2, 0, 1, 2, 0, 1]);
    }

    #[test]
    fn uneven_split_makes_the_last_part_smaller() {
        assert_eq!(split_sizes(7, None, 3).unwrap(), vec![3, 3, 1]);
        assert_eq!(split_sizes(6, None, 3).unwrap(), vec![2, 2, 2]);
        assert!(split_sizes(6, Some(vec![2, 2]), 2).is_err());
    }
}
