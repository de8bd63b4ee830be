//! MatMul, Gemm, MatMulInteger and Einsum on the shared GEMM (`gemm_util`); f32
//! products with a weight on the packed GEMM ([`super::packed_gemm`]).

use std::collections::BTreeMap;

use hmct_tensor::ndarray::{ArrayD, ArrayView2};
use hmct_tensor::{Tensor, bf16, f16};
use rayon::prelude::*;

use super::arrays::{array, contiguous, permute_data};
use super::gemm_util::{self as gu, MatRef, Scalar};
use super::packed_gemm::{PackedB, Start};
use super::weight_cache::WeightCache;
use super::{Kernel, NodeSpec, OpError, broadcast_shapes, input};

pub(crate) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>> {
    let k: Result<Box<dyn Kernel>, OpError> = match spec.op_type {
        "MatMul" => Ok(Box::new(MatMulKernel {
            weights: WeightCache::new(spec, 1),
        })),
        "MatMulInteger" => Ok(Box::new(matmul_integer)),
        "Gemm" => GemmKernel::new(spec).map(|k| Box::new(k) as Box<dyn Kernel>),
        "Einsum" => EinsumKernel::new(spec).map(|k| Box::new(k) as Box<dyn Kernel>),
        _ => return None,
    };
    Some(k)
}

/// A constant right operand packed for [`super::packed_gemm`], per weight tensor.
type PackedWeight = WeightCache<std::sync::OnceLock<Packed>>;

/// A weight packed for the FMA kernels, or in bf16 parts for [`super::amx`].
pub(crate) enum Packed {
    Fma(PackedB),
    /// For products of one row.
    Rows(super::gemv::PackedRows),
    #[cfg(target_arch = "x86_64")]
    Amx(super::amx::PackedB),
}

impl Packed {
    /// `y = start + a · self` for the `m × k` matrix `a`.
    fn matmul(&self, a: MatRef<f32>, m: usize, start: Start, y: &mut [f32]) {
        match self {
            Packed::Fma(b) => super::packed_gemm::matmul(a, m, b, start, y),
            Packed::Rows(b) => b.matmul(a, m, start, y),
            #[cfg(target_arch = "x86_64")]
            Packed::Amx(b) => super::amx::matmul(a, m, b, start, y),
        }
    }
}

/// Products below this many multiply-adds stay on the `gemm` crate.
const PACKED_MIN_WORK: usize = 1 << 16;

/// A stable f32 weight `w` (`k × n`, or `n × k` when `w_transposed`) packed for the
/// packed GEMM, or for [`super::gemv`] for a single row, once per weight tensor, for a
/// product of `m` rows (the first call's `m` picks the layout; a later product of
/// more rows on a single-row layout runs row by row). `None` when that path does not
/// apply: no AVX2 or AVX-512, a weight the session does not keep, or a small product.
/// Nothing is packed per run; the `gemm` crate packs both operands on every call
/// (`kernel_table`, % of the FMA peak there -> here: BERT-base's 128x768x3072 77 -> 89,
/// ViT-S/16's 197x384x1536 88 -> 92).
fn packed_weight(
    weights: &PackedWeight,
    w: &ArrayD<f32>,
    w_transposed: bool,
    m: usize,
) -> Option<std::sync::Arc<std::sync::OnceLock<Packed>>> {
    let isa = crate::cpu::conv_isa()?;
    let wd = w.as_slice()?;
    let &[r, c] = w.shape() else { return None };
    let (k, n) = if w_transposed { (c, r) } else { (r, c) };
    if m == 0 || m * n * k < PACKED_MIN_WORK {
        return None;
    }
    let packed = weights.derived(wd.as_ptr())?;
    packed.get_or_init(|| {
        let wm = if w_transposed {
            MatRef::transposed(wd, k)
        } else {
            MatRef::row_major(wd, n)
        };
        if m == 1 {
            return Packed::Rows(super::gemv::PackedRows::new(wm, k, n));
        }
        #[cfg(target_arch = "x86_64")]
        if super::amx::matmul_prefers(k, n) {
            return Packed::Amx(super::amx::PackedB::new(wm, k, n));
        }
        Packed::Fma(PackedB::new(wm, k, n, isa))
    });
    Some(packed)
}

/// The weight [`packed_weight`] made.
fn made(packed: &std::sync::OnceLock<Packed>) -> &Packed {
    packed
        .get()
        .expect("packed_weight packs the weight it returns")
}

/// Inputs 0 and 1 when both are f32.
fn f32_operands<'a>(inputs: &[Option<&'a Tensor>]) -> Option<(&'a ArrayD<f32>, &'a ArrayD<f32>)> {
    match (
        inputs.first().copied().flatten(),
        inputs.get(1).copied().flatten(),
    ) {
        (Some(Tensor::F32(x)), Some(Tensor::F32(w))) => Some((x, w)),
        _ => None,
    }
}

/// Each sample's input 0 (of shape `shape`, one row) as contiguous values, when every
/// sample has that shape and the same f32 weight `w` as input 1 (the same tensor, by
/// address): the rows a single-row weight's pass can share.
fn single_rows<'a>(
    samples: &'a [Vec<Option<&Tensor>>],
    shape: &[usize],
    w: &ArrayD<f32>,
) -> Option<Vec<std::borrow::Cow<'a, [f32]>>> {
    samples
        .iter()
        .map(|inputs| {
            let (x, wi) = f32_operands(inputs)?;
            let same = x.shape() == shape && wi.as_ptr() == w.as_ptr() && wi.shape() == w.shape();
            same.then(|| contiguous(x))
        })
        .collect()
}

/// The products of each sample's one row (input 0, of shape `x_shape`, `k` values) by
/// the weight `w` (`k × n`, or `n × k` with `w_transposed`) as packed for one row,
/// summed from `start` (one value per column) or zero, in one pass over the weight;
/// one output of shape `shape` per sample, each the bits a product of that row alone
/// gives. `None` when the samples do not share `w` ([`single_rows`]) or `w` is not
/// packed for single rows.
#[allow(clippy::too_many_arguments)]
fn rows_together(
    weights: &PackedWeight,
    samples: &[Vec<Option<&Tensor>>],
    x_shape: &[usize],
    w: &ArrayD<f32>,
    w_transposed: bool,
    (k, n): (usize, usize),
    start: Option<&[f32]>,
    shape: &[usize],
) -> Option<Result<Vec<Vec<Tensor>>, OpError>> {
    let rows = single_rows(samples, x_shape, w)?;
    let packed = packed_weight(weights, w, w_transposed, 1)?;
    let Packed::Rows(b) = made(&packed) else {
        return None;
    };
    let m = rows.len();
    let a: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    let mut y = vec![0.0f32; m * n];
    let from = match start {
        Some(c) => {
            for yi in y.chunks_exact_mut(n) {
                yi.copy_from_slice(c);
            }
            Start::Output
        }
        None => Start::Zero,
    };
    b.matmul(MatRef::row_major(&a, k), m, from, &mut y);
    let outputs = y
        .chunks_exact(n)
        .map(|yi| {
            let mut out = crate::buffers::take(n);
            out.copy_from_slice(yi);
            array(shape, out).map(|t| vec![Tensor::F32(t)])
        })
        .collect();
    Some(outputs)
}

/// MatMul: f32 products with a constant right operand on the packed GEMM, the rest on
/// [`matmul`].
struct MatMulKernel {
    weights: PackedWeight,
}

impl MatMulKernel {
    /// `(m, k, n)` and the output's shape of a product [`MatMulKernel::packed`] takes:
    /// `x` of shape `[lead.., k]` with `lead` not empty (`m` rows), `w` of `[k, n]`.
    fn packed_dims(x: &ArrayD<f32>, w: &ArrayD<f32>) -> Option<(usize, usize, usize, Vec<usize>)> {
        let (&k, lead) = x.shape().split_last()?;
        if lead.is_empty() || w.ndim() != 2 || w.shape()[0] != k {
            return None;
        }
        let n = w.shape()[1];
        let shape = lead.iter().copied().chain([n]).collect();
        Some((lead.iter().product(), k, n, shape))
    }

    fn packed(&self, x: &ArrayD<f32>, w: &ArrayD<f32>) -> Option<Tensor> {
        let (m, k, n, shape) = Self::packed_dims(x, w)?;
        let packed = packed_weight(&self.weights, w, false, m)?;
        let xd = contiguous(x);
        // Every output is written (summed from zero).
        let mut y = crate::buffers::take(m * n);
        made(&packed).matmul(MatRef::row_major(&xd, k), m, Start::Zero, &mut y);
        array(&shape, y).ok().map(Tensor::F32)
    }
}

impl Kernel for MatMulKernel {
    fn run(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        let (a, b) = (input(inputs, 0)?, input(inputs, 1)?);
        if let (Tensor::F32(x), Tensor::F32(w)) = (a, b)
            && let Some(y) = self.packed(x, w)
        {
            return Ok(vec![y]);
        }
        Ok(vec![matmul(a, b)?])
    }

    fn batches_rows(&self) -> bool {
        true
    }

    fn run_rows(
        &self,
        samples: &[Vec<Option<&Tensor>>],
    ) -> Option<Result<Vec<Vec<Tensor>>, OpError>> {
        let (x0, w) = f32_operands(samples.first()?)?;
        let (m, k, n, shape) = Self::packed_dims(x0, w)?;
        if m != 1 {
            return None;
        }
        rows_together(
            &self.weights,
            samples,
            x0.shape(),
            w,
            false,
            (k, n),
            None,
            &shape,
        )
    }
}

/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Offsets of each broadcast batch into an operand of batch dims `dims` (right
/// aligned against `out`) holding `mat` elements per matrix.
fn batch_offsets(dims: &[usize], out: &[usize], mat: usize) -> Vec<usize> {
    let lead = out.len() - dims.len();
    let st = strides(dims);
    let total: usize = out.iter().product();
    let mut offs = Vec::with_capacity(total);
    let mut idx = vec![0usize; out.len()];
    for _ in 0..total {
        let mut o = 0;
        for (k, &d) in dims.iter().enumerate() {
            if d != 1 {
                o += idx[lead + k] * st[k];
            }
        }
        offs.push(o * mat);
        for k in (0..out.len()).rev() {
            idx[k] += 1;
            if idx[k] < out[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    offs
}

/// Output columns one task of [`vec_mat`] sums at a time: 256 f32 sums are sixteen
/// AVX-512 registers.
const VEC_MAT_COLS: usize = 256;

/// `y = a · b` for one row `a` of `k` values and a row-major `k × n` matrix `b` (the
/// dense layers of a CNN at batch 1). Each output is `Σ_i a[i]·b[i][j]` summed in `i`
/// order, with fused multiply-adds where the CPU has FMA. A GEMM would pack `b` for a
/// product that reads it once; here each row of `b` is streamed once into a block of
/// column sums held in registers. Column blocks are independent tasks, so results do
/// not depend on the thread count.
fn vec_mat<T: Scalar>(a: &[T], b: &[T], n: usize, y: &mut [T]) {
    let task = |(c, yc): (usize, &mut [T])| vec_mat_block(a, b, n, c * VEC_MAT_COLS, yc);
    if a.len() * n < (1 << 20) || !crate::par::enabled() {
        y.chunks_mut(VEC_MAT_COLS).enumerate().for_each(task);
    } else {
        y.par_chunks_mut(VEC_MAT_COLS).enumerate().for_each(task);
    }
}

/// Columns `j0..j0 + y.len()` of [`vec_mat`].
#[multiversion::multiversion(targets("x86_64+avx512f+avx2+fma", "x86_64+avx2+fma"))]
fn vec_mat_block<T: Scalar>(a: &[T], b: &[T], n: usize, j0: usize, y: &mut [T]) {
    let fma = multiversion::target::target_cfg_f!(target_feature = "fma");
    let width = y.len();
    let mut sums = [T::zero(); VEC_MAT_COLS];
    let sums = &mut sums[..width];
    for (i, &ai) in a.iter().enumerate() {
        let row = &b[i * n + j0..][..width];
        if fma {
            for (s, &bv) in sums.iter_mut().zip(row) {
                *s = ai.mul_add(bv, *s);
            }
        } else {
            for (s, &bv) in sums.iter_mut().zip(row) {
                *s = *s + ai * bv;
            }
        }
    }
    y.copy_from_slice(sums);
}

/// Numpy `matmul` semantics on row-major data: 1-D operands are promoted and the
/// promoted axis removed from the result; batch dims broadcast.
pub(crate) fn matmul_nd<T: Scalar>(
    a: &[T],
    ash: &[usize],
    b: &[T],
    bsh: &[usize],
) -> Result<(Vec<T>, Vec<usize>), OpError> {
    if ash.is_empty() || bsh.is_empty() {
        return Err(OpError::invalid("MatMul of a scalar"));
    }
    let mut a_shape = ash.to_vec();
    let mut b_shape = bsh.to_vec();
    if a_shape.len() == 1 {
        a_shape.insert(0, 1);
    }
    if b_shape.len() == 1 {
        b_shape.push(1);
    }
    let (ra, rb) = (a_shape.len(), b_shape.len());
    let (m, k) = (a_shape[ra - 2], a_shape[ra - 1]);
    let (k2, n) = (b_shape[rb - 2], b_shape[rb - 1]);
    if k != k2 {
        return Err(OpError::invalid(format!("MatMul of {ash:?} and {bsh:?}")));
    }
    let batch = broadcast_shapes(&a_shape[..ra - 2], &b_shape[..rb - 2])?;
    let mut out_shape = batch.clone();
    if ash.len() > 1 {
        out_shape.push(m);
    }
    if bsh.len() > 1 {
        out_shape.push(n);
    }
    let nb: usize = batch.iter().product();
    // From the pool, zeroed: a fresh zeroed vector of BERT-base's attention scores
    // (768 KiB) is fresh pages, faulted in on every run.
    let mut y = crate::buffers::take_filled(nb * m * n, T::zero());
    if y.is_empty() {
        return Ok((y, out_shape));
    }
    let b_batch: usize = b_shape[..rb - 2].iter().product();
    if b_batch == 1 && a_shape[..ra - 2].iter().product::<usize>() == nb {
        // A shared B: fold A's batch into its rows, one big product.
        let rows = nb * m;
        if rows == 1 {
            vec_mat(a, b, n, &mut y);
            return Ok((y, out_shape));
        }
        gu::gemm(
            rows,
            n,
            k,
            MatRef::row_major(a, k),
            MatRef::row_major(b, n),
            &mut y,
            n,
            false,
            T::one(),
        );
        return Ok((y, out_shape));
    }
    let ao = batch_offsets(&a_shape[..ra - 2], &batch, m * k);
    let bo = batch_offsets(&b_shape[..rb - 2], &batch, k * n);
    let one = |(i, c): (usize, &mut [T])| {
        gu::gemm_serial(
            m,
            n,
            k,
            MatRef::row_major(&a[ao[i]..], k),
            MatRef::row_major(&b[bo[i]..], n),
            c,
            n,
            false,
            T::one(),
        );
    };
    if nb >= 4 && nb * m * n * k >= (1 << 20) {
        if crate::par::enabled() {
            y.par_chunks_mut(m * n).enumerate().for_each(one);
        } else {
            y.chunks_mut(m * n).enumerate().for_each(one);
        }
    } else if nb * m * n * k >= (1 << 20) {
        for i in 0..nb {
            let c = &mut y[i * m * n..][..m * n];
            gu::gemm(
                m,
                n,
                k,
                MatRef::row_major(&a[ao[i]..], k),
                MatRef::row_major(&b[bo[i]..], n),
                c,
                n,
                false,
                T::one(),
            );
        }
    } else {
        y.chunks_mut(m * n).enumerate().for_each(one);
    }
    Ok((y, out_shape))
}

/// Integer MatMul with wrapping arithmetic (shape math, rarely hot).
fn matmul_int<T: Copy + Into<i128>>(
    a: &ArrayD<T>,
    b: &ArrayD<T>,
    back: impl Fn(i128) -> T,
) -> Result<ArrayD<T>, OpError> {
    let (mut ash, mut bsh) = (a.shape().to_vec(), b.shape().to_vec());
    if ash.is_empty() || bsh.is_empty() {
        return Err(OpError::invalid("MatMul of a scalar"));
    }
    if ash.len() == 1 {
        ash.insert(0, 1);
    }
    if bsh.len() == 1 {
        bsh.push(1);
    }
    let (ra, rb) = (ash.len(), bsh.len());
    let (m, k, n) = (ash[ra - 2], ash[ra - 1], bsh[rb - 1]);
    if bsh[rb - 2] != k {
        return Err(OpError::invalid(format!(
            "MatMul of {:?} and {:?}",
            a.shape(),
            b.shape()
        )));
    }
    let batch = broadcast_shapes(&ash[..ra - 2], &bsh[..rb - 2])?;
    let mut shape = batch.clone();
    if a.ndim() > 1 {
        shape.push(m);
    }
    if b.ndim() > 1 {
        shape.push(n);
    }
    let ao = batch_offsets(&ash[..ra - 2], &batch, m * k);
    let bo = batch_offsets(&bsh[..rb - 2], &batch, k * n);
    let av = contiguous(a);
    let bv = contiguous(b);
    let mut out = Vec::with_capacity(ao.len() * m * n);
    for (oa, ob) in ao.iter().zip(&bo) {
        for i in 0..m {
            for j in 0..n {
                let mut s: i128 = 0;
                for p in 0..k {
                    s = s.wrapping_add(
                        av[oa + i * k + p]
                            .into()
                            .wrapping_mul(bv[ob + p * n + j].into()),
                    );
                }
                out.push(back(s));
            }
        }
    }
    array(&shape, out)
}

/// MatMul of two tensors of the same type.
pub(crate) fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor, OpError> {
    Ok(match (a, b) {
        (Tensor::F32(x), Tensor::F32(y)) => {
            let (v, s) = matmul_nd(&contiguous(x), x.shape(), &contiguous(y), y.shape())?;
            Tensor::F32(array(&s, v)?)
        }
        (Tensor::F64(x), Tensor::F64(y)) => {
            let (v, s) = matmul_nd(&contiguous(x), x.shape(), &contiguous(y), y.shape())?;
            Tensor::F64(array(&s, v)?)
        }
        (Tensor::F16(x), Tensor::F16(y)) => {
            let up = |a: &ArrayD<f16>| a.iter().map(|v| v.to_f32()).collect::<Vec<f32>>();
            let (v, s) = matmul_nd(&up(x), x.shape(), &up(y), y.shape())?;
            Tensor::F16(array(&s, v.into_iter().map(f16::from_f32).collect())?)
        }
        (Tensor::BF16(x), Tensor::BF16(y)) => {
            let up = |a: &ArrayD<bf16>| a.iter().map(|v| v.to_f32()).collect::<Vec<f32>>();
            let (v, s) = matmul_nd(&up(x), x.shape(), &up(y), y.shape())?;
            Tensor::BF16(array(&s, v.into_iter().map(bf16::from_f32).collect())?)
        }
        (Tensor::I32(x), Tensor::I32(y)) => Tensor::I32(matmul_int(x, y, |v| v as i32)?),
        (Tensor::I64(x), Tensor::I64(y)) => Tensor::I64(matmul_int(x, y, |v| v as i64)?),
        (Tensor::U32(x), Tensor::U32(y)) => Tensor::U32(matmul_int(x, y, |v| v as u32)?),
        (Tensor::U64(x), Tensor::U64(y)) => Tensor::U64(matmul_int(x, y, |v| v as u64)?),
        _ => {
            return Err(OpError::unsupported(format!(
                "MatMul of {} and {}",
                a.dtype(),
                b.dtype()
            )));
        }
    })
}

/// An 8-bit integer tensor as f64 values (exact), for the integer ops.
fn int8_values(t: &Tensor, what: &str) -> Result<Vec<f64>, OpError> {
    match t {
        Tensor::U8(_) | Tensor::I8(_) => Ok(t.to_f64_vec().unwrap_or_default()),
        other => Err(OpError::unsupported(format!(
            "{what} of type {}",
            other.dtype()
        ))),
    }
}

/// MatMulInteger: products of 8-bit integers minus zero points, accumulated in f64
/// (exact far beyond any realistic K) and returned as int32.
fn matmul_integer(inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
    let a = input(inputs, 0)?;
    let b = input(inputs, 1)?;
    let mut av = int8_values(a, "MatMulInteger A")?;
    let mut bv = int8_values(b, "MatMulInteger B")?;
    let (ash, bsh) = (a.shape(), b.shape());
    if let Some(z) = inputs.get(2).copied().flatten() {
        let z = int8_values(z, "a_zero_point")?;
        let m = if ash.len() >= 2 {
            ash[ash.len() - 2]
        } else {
            1
        };
        let k = *ash.last().unwrap_or(&1);
        if z.len() == 1 {
            av.iter_mut().for_each(|v| *v -= z[0]);
        } else if z.len() == m {
            // Per-row zero points of A.
            for (i, v) in av.iter_mut().enumerate() {
                *v -= z[(i / k.max(1)) % m];
            }
        } else {
            return Err(OpError::invalid(format!(
                "a_zero_point of {} values",
                z.len()
            )));
        }
    }
    if let Some(z) = inputs.get(3).copied().flatten() {
        let z = int8_values(z, "b_zero_point")?;
        let n = *bsh.last().unwrap_or(&1);
        if z.len() == 1 {
            bv.iter_mut().for_each(|v| *v -= z[0]);
        } else if z.len() == n {
            for (i, v) in bv.iter_mut().enumerate() {
                *v -= z[i % n];
            }
        } else {
            return Err(OpError::invalid(format!(
                "b_zero_point of {} values",
                z.len()
            )));
        }
    }
    let (y, s) = matmul_nd::<f64>(&av, ash, &bv, bsh)?;
    Ok(vec![Tensor::I32(array(
        &s,
        y.into_iter().map(|v| v as i32).collect(),
    )?)])
}

struct GemmKernel {
    trans_a: bool,
    trans_b: bool,
    alpha: f32,
    beta: f32,
    weights: PackedWeight,
}

impl GemmKernel {
    fn new(spec: &NodeSpec) -> Result<Self, OpError> {
        // `broadcast` (opset < 7) asks for the unidirectional broadcast of C that
        // later opsets always do, so it needs no separate handling.
        Ok(GemmKernel {
            trans_a: spec.attrs.int_or("transA", 0)? != 0,
            trans_b: spec.attrs.int_or("transB", 0)? != 0,
            alpha: spec.attrs.float_or("alpha", 1.0)?,
            beta: spec.attrs.float_or("beta", 1.0)?,
            weights: WeightCache::new(spec, 1),
        })
    }

    /// `A·B + C` on the packed GEMM (see [`packed_weight`]) when `alpha` is 1 and
    /// `beta` 1 (or 0, or no `C`): each output summed from its value of `C`.
    /// `(m, k, n)` of a product [`GemmKernel::packed`] takes, with the values of `C`
    /// each output starts from (`None`: from zero): 2-D operands that fit, `alpha` 1
    /// and `beta` 1 (or 0, or no `C`), a `C` that broadcasts to `[m, n]`.
    #[allow(clippy::type_complexity)]
    fn packed_dims<'c>(
        &self,
        x: &ArrayD<f32>,
        w: &ArrayD<f32>,
        c: Option<&'c ArrayD<f32>>,
    ) -> Option<(usize, usize, usize, Option<ArrayView2<'c, f32>>)> {
        let (&[xr, xc], &[wr, wc]) = (x.shape(), w.shape()) else {
            return None;
        };
        let (m, k) = if self.trans_a { (xc, xr) } else { (xr, xc) };
        let n = if self.trans_b { wr } else { wc };
        let with_c = c.is_some() && self.beta != 0.0;
        if self.alpha != 1.0
            || (with_c && self.beta != 1.0)
            || k != if self.trans_b { wc } else { wr }
        {
            return None;
        }
        let start = match c {
            Some(c) if with_c => {
                if broadcast_shapes(c.shape(), &[m, n]).ok()? != [m, n] {
                    return None;
                }
                Some(c.broadcast([m, n])?)
            }
            _ => None,
        };
        Some((m, k, n, start))
    }

    fn packed(
        &self,
        x: &ArrayD<f32>,
        w: &ArrayD<f32>,
        c: Option<&ArrayD<f32>>,
    ) -> Option<Result<Tensor, OpError>> {
        let (m, k, n, c_start) = self.packed_dims(x, w, c)?;
        let packed = packed_weight(&self.weights, w, self.trans_b, m)?;
        // Every output is written: from `C`, or summed from zero.
        let mut y = crate::buffers::take(m * n);
        let start = match c_start {
            Some(cb) => {
                // Row by row: an element iterator over the broadcast view, a scalar
                // load and store per value, took 1.35% of ViT-S/16's cycles (`perf`).
                for (yr, cr) in y.chunks_exact_mut(n.max(1)).zip(cb.rows()) {
                    match cr.as_slice() {
                        Some(s) => yr.copy_from_slice(s),
                        None => yr.iter_mut().zip(cr).for_each(|(d, &v)| *d = v),
                    }
                }
                Start::Output
            }
            None => Start::Zero,
        };
        let xd = contiguous(x);
        let xm = if self.trans_a {
            MatRef::transposed(&xd, m)
        } else {
            MatRef::row_major(&xd, k)
        };
        made(&packed).matmul(xm, m, start, &mut y);
        Some(array(&[m, n], y).map(Tensor::F32))
    }

    fn typed<T: Scalar>(
        &self,
        a: &[T],
        ash: &[usize],
        b: &[T],
        bsh: &[usize],
        c: Option<(&[T], &[usize])>,
        alpha: T,
        beta: T,
    ) -> Result<(Vec<T>, Vec<usize>), OpError> {
        if ash.len() != 2 || bsh.len() != 2 {
            return Err(OpError::invalid(format!(
                "Gemm operands {ash:?} and {bsh:?} must be 2-D"
            )));
        }
        let (m, k) = if self.trans_a {
            (ash[1], ash[0])
        } else {
            (ash[0], ash[1])
        };
        let (k2, n) = if self.trans_b {
            (bsh[1], bsh[0])
        } else {
            (bsh[0], bsh[1])
        };
        if k != k2 {
            return Err(OpError::invalid(format!(
                "Gemm operands {ash:?} and {bsh:?} do not fit"
            )));
        }
        let mut y = vec![T::zero(); m * n];
        let mut accumulate = false;
        if let Some((cv, csh)) = c
            && beta != T::zero()
        {
            let full = broadcast_shapes(csh, &[m, n])?;
            if full != [m, n] {
                return Err(OpError::invalid(format!(
                    "Gemm C {csh:?} does not broadcast to [{m}, {n}]"
                )));
            }
            let (cm, cn) = match csh.len() {
                0 => (1, 1),
                1 => (1, csh[0]),
                _ => (csh[csh.len() - 2], csh[csh.len() - 1]),
            };
            for i in 0..m {
                for j in 0..n {
                    let v = cv[(if cm == 1 { 0 } else { i }) * cn + if cn == 1 { 0 } else { j }];
                    y[i * n + j] = beta * v;
                }
            }
            accumulate = true;
        }
        let am = if self.trans_a {
            MatRef::transposed(a, m)
        } else {
            MatRef::row_major(a, k)
        };
        let bm = if self.trans_b {
            MatRef::transposed(b, k)
        } else {
            MatRef::row_major(b, n)
        };
        gu::gemm(m, n, k, am, bm, &mut y, n, accumulate, alpha);
        Ok((y, vec![m, n]))
    }
}

impl Kernel for GemmKernel {
    fn run(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        let a = input(inputs, 0)?;
        let b = input(inputs, 1)?;
        let c = inputs.get(2).copied().flatten();
        let out = match (a, b) {
            (Tensor::F32(x), Tensor::F32(y)) => {
                let cf = match c {
                    Some(Tensor::F32(z)) => Some(z),
                    _ => None,
                };
                if (c.is_none() || cf.is_some())
                    && let Some(out) = self.packed(x, y, cf)
                {
                    return Ok(vec![out?]);
                }
                let cv = match c {
                    None => None,
                    Some(Tensor::F32(z)) => Some((contiguous(z), z.shape())),
                    Some(o) => {
                        return Err(OpError::invalid(format!("Gemm C of type {}", o.dtype())));
                    }
                };
                let (v, s) = self.typed(
                    &contiguous(x),
                    x.shape(),
                    &contiguous(y),
                    y.shape(),
                    cv.as_ref().map(|(d, s)| (&d[..], *s)),
                    self.alpha,
                    self.beta,
                )?;
                Tensor::F32(array(&s, v)?)
            }
            (Tensor::F64(x), Tensor::F64(y)) => {
                let cv = match c {
                    None => None,
                    Some(Tensor::F64(z)) => Some((contiguous(z), z.shape())),
                    Some(o) => {
                        return Err(OpError::invalid(format!("Gemm C of type {}", o.dtype())));
                    }
                };
                let (v, s) = self.typed(
                    &contiguous(x),
                    x.shape(),
                    &contiguous(y),
                    y.shape(),
                    cv.as_ref().map(|(d, s)| (&d[..], *s)),
                    self.alpha as f64,
                    self.beta as f64,
                )?;
                Tensor::F64(array(&s, v)?)
            }
            _ => {
                return Err(OpError::unsupported(format!(
                    "Gemm of {} and {}",
                    a.dtype(),
                    b.dtype()
                )));
            }
        };
        Ok(vec![out])
    }

    fn batches_rows(&self) -> bool {
        true
    }

    fn run_rows(
        &self,
        samples: &[Vec<Option<&Tensor>>],
    ) -> Option<Result<Vec<Vec<Tensor>>, OpError>> {
        let (x0, w) = f32_operands(samples.first()?)?;
        let c = match samples[0].get(2).copied().flatten() {
            None => None,
            Some(Tensor::F32(c)) => Some(c),
            Some(_) => return None,
        };
        let (m, k, n, c_start) = self.packed_dims(x0, w, c)?;
        if m != 1 {
            return None;
        }
        // One `C` for all samples (a constant bias).
        let same_c = |inputs: &Vec<Option<&Tensor>>| match (inputs.get(2).copied().flatten(), c) {
            (None, None) => true,
            (Some(Tensor::F32(ci)), Some(c)) => {
                ci.as_ptr() == c.as_ptr() && ci.shape() == c.shape()
            }
            _ => false,
        };
        if !samples.iter().all(same_c) {
            return None;
        }
        let start: Option<Vec<f32>> = c_start.map(|cb| cb.iter().copied().collect());
        let (x_shape, shape) = (x0.shape(), [1, n]);
        rows_together(
            &self.weights,
            samples,
            x_shape,
            w,
            self.trans_b,
            (k, n),
            start.as_deref(),
            &shape,
        )
    }
}

/// A parsed Einsum equation. Labels are letters; each ellipsis dim gets its own label
/// above the letters.
#[derive(Debug, Clone)]
struct Equation {
    inputs: Vec<Vec<u32>>,
    /// Position of the ellipsis in each input term, if any.
    ellipsis: Vec<Option<usize>>,
    output: Vec<u32>,
    out_ellipsis: Option<usize>,
    explicit: bool,
}

const ELLIPSIS_BASE: u32 = 1000;

fn label(c: char) -> Result<u32, OpError> {
    if c.is_ascii_alphabetic() {
        Ok(c as u32)
    } else {
        Err(OpError::invalid(format!("Einsum label '{c}'")))
    }
}

fn parse_term(t: &str) -> Result<(Vec<u32>, Option<usize>), OpError> {
    let mut labels = Vec::new();
    let mut ell = None;
    let mut rest = t;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("...") {
            if ell.is_some() {
                return Err(OpError::invalid(format!(
                    "Einsum term '{t}' has two ellipses"
                )));
            }
            ell = Some(labels.len());
            rest = r;
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            labels.push(label(c)?);
            rest = &rest[c.len_utf8()..];
        }
    }
    Ok((labels, ell))
}

impl Equation {
    fn parse(eq: &str) -> Result<Equation, OpError> {
        let eq: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
        let (lhs, rhs) = match eq.split_once("->") {
            Some((l, r)) => (l, Some(r)),
            None => (eq.as_str(), None),
        };
        let mut inputs = Vec::new();
        let mut ellipsis = Vec::new();
        for t in lhs.split(',') {
            let (l, e) = parse_term(t)?;
            inputs.push(l);
            ellipsis.push(e);
        }
        let (output, out_ellipsis, explicit) = match rhs {
            Some(r) => {
                let (l, e) = parse_term(r)?;
                (l, e, true)
            }
            None => {
                let mut count: BTreeMap<u32, usize> = BTreeMap::new();
                for l in inputs.iter().flatten() {
                    *count.entry(*l).or_default() += 1;
                }
                let out = count
                    .into_iter()
                    .filter(|&(_, c)| c == 1)
                    .map(|(l, _)| l)
                    .collect();
                let e = ellipsis.iter().any(|e| e.is_some()).then_some(0);
                (out, e, false)
            }
        };
        Ok(Equation {
            inputs,
            ellipsis,
            output,
            out_ellipsis,
            explicit,
        })
    }

    /// Full label lists (ellipsis expanded) for inputs of the given ranks, and the
    /// output labels.
    fn expand(&self, ranks: &[usize]) -> Result<(Vec<Vec<u32>>, Vec<u32>), OpError> {
        if ranks.len() != self.inputs.len() {
            return Err(OpError::invalid(format!(
                "Einsum equation has {} operands, got {}",
                self.inputs.len(),
                ranks.len()
            )));
        }
        let mut ell_rank = 0;
        let mut full = Vec::new();
        for (i, (l, e)) in self.inputs.iter().zip(&self.ellipsis).enumerate() {
            let r = ranks[i];
            match e {
                None if r != l.len() => {
                    return Err(OpError::invalid(format!(
                        "Einsum operand {i} of rank {r} for '{l:?}'"
                    )));
                }
                None => full.push(l.clone()),
                Some(pos) => {
                    let er = r.checked_sub(l.len()).ok_or_else(|| {
                        OpError::invalid(format!("Einsum operand {i} rank {r} too small"))
                    })?;
                    ell_rank = ell_rank.max(er);
                    let mut v = l[..*pos].to_vec();
                    // Right-aligned ellipsis labels so they broadcast like numpy.
                    v.extend((0..er).map(|j| ELLIPSIS_BASE + (j + 64 - er) as u32));
                    v.extend_from_slice(&l[*pos..]);
                    full.push(v);
                }
            }
        }
        let ell_labels: Vec<u32> = (0..ell_rank)
            .map(|j| ELLIPSIS_BASE + (j + 64 - ell_rank) as u32)
            .collect();
        let out = match self.out_ellipsis {
            Some(pos) if self.explicit => {
                let mut v = self.output[..pos].to_vec();
                v.extend_from_slice(&ell_labels);
                v.extend_from_slice(&self.output[pos..]);
                v
            }
            Some(_) => {
                let mut v = ell_labels;
                v.extend_from_slice(&self.output);
                v
            }
            None => self.output.clone(),
        };
        Ok((full, out))
    }
}

struct EinsumKernel {
    eq: Equation,
}

impl EinsumKernel {
    fn new(spec: &NodeSpec) -> Result<Self, OpError> {
        let eq = spec
            .attrs
            .string("equation")?
            .ok_or_else(|| OpError::invalid("Einsum without equation"))?;
        Ok(EinsumKernel {
            eq: Equation::parse(&eq)?,
        })
    }
}

/// Size of each label, checking consistency (size-1 dims broadcast).
fn label_sizes(labels: &[Vec<u32>], shapes: &[&[usize]]) -> Result<BTreeMap<u32, usize>, OpError> {
    let mut sizes: BTreeMap<u32, usize> = BTreeMap::new();
    for (l, s) in labels.iter().zip(shapes) {
        for (&lab, &d) in l.iter().zip(s.iter()) {
            let e = sizes.entry(lab).or_insert(d);
            if *e == 1 {
                *e = d;
            } else if d != 1 && d != *e {
                return Err(OpError::invalid(format!(
                    "Einsum dimension mismatch: {d} vs {e}"
                )));
            }
        }
    }
    Ok(sizes)
}

/// Reference Einsum: one loop over every label combination. Exact for any equation.
fn einsum_loop<T: Scalar>(
    labels: &[Vec<u32>],
    out: &[u32],
    data: &[&[T]],
    shapes: &[&[usize]],
) -> Result<(Vec<T>, Vec<usize>), OpError> {
    let sizes = label_sizes(labels, shapes)?;
    for l in out {
        if !sizes.contains_key(l) {
            return Err(OpError::invalid("Einsum output label not in any input"));
        }
    }
    let mut all: Vec<u32> = out.to_vec();
    for l in sizes.keys() {
        if !all.contains(l) {
            all.push(*l);
        }
    }
    let dims: Vec<usize> = all.iter().map(|l| sizes[l]).collect();
    let out_shape: Vec<usize> = out.iter().map(|l| sizes[l]).collect();
    let out_len: usize = out_shape.iter().product();
    let sum_len: usize = dims[out.len()..].iter().product();
    // Per operand, the stride each position in `all` contributes (0 for absent or
    // broadcast labels; repeated labels add up, which walks diagonals).
    let op_strides: Vec<Vec<usize>> = labels
        .iter()
        .zip(shapes)
        .map(|(l, s)| {
            let st = strides(s);
            all.iter()
                .map(|a| {
                    l.iter()
                        .enumerate()
                        .filter(|(_, x)| *x == a)
                        .map(|(k, _)| if s[k] == 1 { 0 } else { st[k] })
                        .sum()
                })
                .collect()
        })
        .collect();
    let mut y = vec![T::zero(); out_len];
    let mut idx = vec![0usize; all.len()];
    for v in y.iter_mut() {
        for _ in 0..sum_len {
            let mut p = T::one();
            for (d, st) in data.iter().zip(&op_strides) {
                let off: usize = idx.iter().zip(st).map(|(i, s)| i * s).sum();
                p = p * d[off];
            }
            *v += p;
            for k in (out.len()..all.len()).rev() {
                idx[k] += 1;
                if idx[k] < dims[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
        for k in (0..out.len()).rev() {
            idx[k] += 1;
            if idx[k] < dims[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    Ok((y, out_shape))
}

/// Two-operand Einsum as a batched matmul when no label repeats within a term and
/// every shared label has the same size in both operands; `None` otherwise.
fn einsum_pair<T: Scalar>(
    la: &[u32],
    lb: &[u32],
    out: &[u32],
    a: &[T],
    ash: &[usize],
    b: &[T],
    bsh: &[usize],
) -> Result<Option<(Vec<T>, Vec<usize>)>, OpError> {
    let unique = |l: &[u32]| l.iter().enumerate().all(|(i, x)| !l[..i].contains(x));
    if !unique(la) || !unique(lb) || !unique(out) {
        return Ok(None);
    }
    let size = |l: &[u32], s: &[usize], x: u32| l.iter().position(|&y| y == x).map(|p| s[p]);
    // Labels in one operand only and not in the output are summed first.
    for (l, other) in [(la, lb), (lb, la)] {
        if l.iter().any(|x| !other.contains(x) && !out.contains(x)) {
            return Ok(None);
        }
    }
    let mut batch = Vec::new();
    let mut contract = Vec::new();
    for &x in la {
        if lb.contains(&x) {
            if size(la, ash, x) != size(lb, bsh, x) {
                return Ok(None);
            }
            if out.contains(&x) {
                batch.push(x);
            } else {
                contract.push(x);
            }
        }
    }
    let left: Vec<u32> = la.iter().copied().filter(|x| !lb.contains(x)).collect();
    let right: Vec<u32> = lb.iter().copied().filter(|x| !la.contains(x)).collect();
    if out.iter().any(|x| !la.contains(x) && !lb.contains(x)) {
        return Err(OpError::invalid("Einsum output label not in any input"));
    }
    let pos = |l: &[u32], x: &u32| l.iter().position(|y| y == x).unwrap_or(0);
    let pa: Vec<usize> = batch
        .iter()
        .chain(&left)
        .chain(&contract)
        .map(|x| pos(la, x))
        .collect();
    let pb: Vec<usize> = batch
        .iter()
        .chain(&contract)
        .chain(&right)
        .map(|x| pos(lb, x))
        .collect();
    let prod =
        |l: &[u32], s: &[usize], ls: &[u32]| -> usize { ls.iter().map(|x| s[pos(l, x)]).product() };
    let (nb, m, k, n) = (
        prod(la, ash, &batch),
        prod(la, ash, &left),
        prod(la, ash, &contract),
        prod(lb, bsh, &right),
    );
    let ap = permute_data(a, ash, &pa);
    let bp = permute_data(b, bsh, &pb);
    let mut mid_shape: Vec<usize> = batch.iter().map(|x| ash[pos(la, x)]).collect();
    mid_shape.extend(left.iter().map(|x| ash[pos(la, x)]));
    mid_shape.extend(right.iter().map(|x| bsh[pos(lb, x)]));
    let (y, _) = matmul_nd(&ap, &[nb, m, k], &bp, &[nb, k, n])?;
    let mid: Vec<u32> = batch.iter().chain(&left).chain(&right).copied().collect();
    let perm: Vec<usize> = out.iter().map(|x| pos(&mid, x)).collect();
    let out_shape: Vec<usize> = perm.iter().map(|&p| mid_shape[p]).collect();
    Ok(Some((permute_data(&y, &mid_shape, &perm), out_shape)))
}

fn einsum_typed<T: Scalar>(
    eq: &Equation,
    data: &[&[T]],
    shapes: &[&[usize]],
) -> Result<(Vec<T>, Vec<usize>), OpError> {
    let ranks: Vec<usize> = shapes.iter().map(|s| s.len()).collect();
    let (labels, out) = eq.expand(&ranks)?;
    if data.len() == 2
        && let Some(r) = einsum_pair(
            &labels[0], &labels[1], &out, data[0], shapes[0], data[1], shapes[1],
        )?
    {
        return Ok(r);
    }
    einsum_loop(&labels, &out, data, shapes)
}

impl Kernel for EinsumKernel {
    fn run(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        let ts: Vec<&Tensor> = inputs
            .iter()
            .map(|t| t.ok_or_else(|| OpError::invalid("missing Einsum input")))
            .collect::<Result<_, _>>()?;
        let shapes: Vec<&[usize]> = ts.iter().map(|t| t.shape()).collect();
        let first = ts
            .first()
            .ok_or_else(|| OpError::invalid("Einsum without inputs"))?;
        if ts.iter().any(|t| t.dtype() != first.dtype()) {
            return Err(OpError::invalid("Einsum inputs of different types"));
        }
        macro_rules! via {
            ($variant:ident, $t:ty, $to:expr, $from:expr) => {{
                let vals: Vec<Vec<$t>> = ts
                    .iter()
                    .map(|t| match t {
                        Tensor::$variant(a) => a.iter().map($to).collect(),
                        _ => Vec::new(),
                    })
                    .collect();
                let refs: Vec<&[$t]> = vals.iter().map(|v| v.as_slice()).collect();
                let (y, s) = einsum_typed(&self.eq, &refs, &shapes)?;
                Tensor::$variant(array(&s, y.into_iter().map($from).collect())?)
            }};
        }
        let out = match first {
            Tensor::F32(_) => via!(F32, f32, |v: &f32| *v, |v| v),
            Tensor::F64(_) => via!(F64, f64, |v: &f64| *v, |v| v),
            Tensor::F16(_) => via!(F16, f32, |v: &f16| v.to_f32(), f16::from_f32),
            Tensor::BF16(_) => via!(BF16, f32, |v: &bf16| v.to_f32(), bf16::from_f32),
            // Integer Einsum in f64 is exact while sums stay below 2^53.
            Tensor::I32(_) => via!(I32, f64, |v: &i32| *v as f64, |v: f64| v as i32),
            Tensor::I64(_) => via!(I64, f64, |v: &i64| *v as f64, |v: f64| v as i64),
            other => return Err(OpError::unsupported(format!("Einsum on {}", other.dtype()))),
        };
        Ok(vec![out])
    }
}

#[cfg(test)]
mod tests {
    use hmct_proto::onnx::{AttributeProto, attribute_proto::AttributeType};

    use super::*;
    use crate::ops::conv_direct::tests::values;

    fn attr(name: &str, i: Option<i64>, f: Option<f32>) -> AttributeProto {
        AttributeProto {
            name: Some(name.into()),
            r#type: Some(if f.is_some() {
                AttributeType::Float
            } else {
                AttributeType::Int
            } as i32),
            i,
            f,
            ..Default::default()
        }
    }

    /// The kernel of `op` with its right operand stable (a weight the session keeps)
    /// or not.
    fn kernel(op: &str, attrs: &[AttributeProto], inputs: usize, stable: bool) -> Box<dyn Kernel> {
        let present = vec![true; inputs];
        let consts = vec![None; inputs];
        let stable: Vec<bool> = (0..inputs).map(|i| i == 1 && stable).collect();
        let spec = NodeSpec {
            name: "n",
            op_type: op,
            domain: "",
            opset: 17,
            attrs: super::super::Attrs::new(attrs),
            num_inputs: inputs,
            inputs_present: &present,
            num_outputs: 1,
            const_inputs: &consts,
            stable_inputs: &stable,
        };
        super::super::build_kernel(&spec).unwrap()
    }

    fn f32_tensor(shape: &[usize], seed: u64) -> Tensor {
        let n = shape.iter().product();
        Tensor::F32(array(shape, values(n, seed)).unwrap())
    }

    /// Same shape, and values within rounding of each other (the packed GEMM and the
    /// `gemm` crate sum in different orders).
    fn close(a: &Tensor, b: &Tensor, what: &str) {
        let (Tensor::F32(x), Tensor::F32(y)) = (a, b) else {
            panic!("{what}: not f32")
        };
        assert_eq!(x.shape(), y.shape(), "{what}");
        for (p, q) in x.iter().zip(y.iter()) {
            assert!(
                (p - q).abs() <= 1e-4 * (1.0 + q.abs()),
                "{what}: {p} vs {q}"
            );
        }
    }

    /// MatMul and Gemm with a stable weight (packed once, on AVX2 or AVX-512) against
    /// the same products on the `gemm` crate: batch axes folded into rows, either
    /// operand transposed, `C` of every broadcast shape, `beta` 0, and `alpha` 2 (which
    /// stays on the `gemm` crate); a second run (the packed weight cached) gives the
    /// same bits.
    #[test]
    fn stable_weights_on_the_packed_gemm() {
        for (a_shape, n, seed) in [
            (vec![2, 3, 7, 40], 50, 1),
            (vec![197, 130], 400, 2),
            (vec![1, 9], 3, 3),
        ] {
            let k = a_shape[a_shape.len() - 1];
            let a = f32_tensor(&a_shape, seed);
            let w = f32_tensor(&[k, n], seed + 1);
            let inputs = [Some(&a), Some(&w)];
            let packed = kernel("MatMul", &[], 2, true);
            let first = packed.run(&inputs).unwrap();
            let plain = kernel("MatMul", &[], 2, false).run(&inputs).unwrap();
            close(
                &first[0],
                &plain[0],
                &format!("MatMul {a_shape:?} x [{k}, {n}]"),
            );
            assert_eq!(first, packed.run(&inputs).unwrap());
        }
        let (m, k, n) = (70, 150, 45);
        for (ta, tb) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
            let a = f32_tensor(&if ta == 1 { [k, m] } else { [m, k] }, 4);
            let w = f32_tensor(&if tb == 1 { [n, k] } else { [k, n] }, 5);
            let cs: [&[usize]; 5] = [&[n], &[1, n], &[m, 1], &[m, n], &[]];
            for (ci, c_shape) in cs.iter().enumerate() {
                let c = f32_tensor(c_shape, 6 + ci as u64);
                for (alpha, beta) in [(1.0, 1.0), (1.0, 0.0), (2.0, 1.0)] {
                    let attrs = [
                        attr("transA", Some(ta), None),
                        attr("transB", Some(tb), None),
                        attr("alpha", None, Some(alpha)),
                        attr("beta", None, Some(beta)),
                    ];
                    let what = format!(
                        "Gemm transA {ta} transB {tb} C {c_shape:?} alpha {alpha} beta {beta}"
                    );
                    let inputs = [Some(&a), Some(&w), Some(&c)];
                    let got = kernel("Gemm", &attrs, 3, true).run(&inputs).unwrap();
                    let want = kernel("Gemm", &attrs, 3, false).run(&inputs).unwrap();
                    close(&got[0], &want[0], &what);
                    let got = kernel("Gemm", &attrs, 2, true).run(&inputs[..2]).unwrap();
                    let want = kernel("Gemm", &attrs, 2, false).run(&inputs[..2]).unwrap();
                    close(&got[0], &want[0], &format!("{what}, no C"));
                }
            }
        }
    }
}
