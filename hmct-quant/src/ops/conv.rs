//! Conv, ConvInteger and ConvTranspose (1-D, 2-D and 3-D).
//!
//! f32 1-D and 2-D convs with several input channels per group run the direct
//! AVX-512 or AVX2 kernel of [`super::conv_direct`] where the CPU has one. Otherwise Conv lowers to
//! GEMM: a 1×1 stride-1 unpadded conv multiplies the weight by the input
//! directly, other convs unfold (im2col) a block of output rows at a time into a
//! buffer that stays in cache, and convs with one input channel per group (depthwise)
//! run a direct loop whose inner loop walks an output row. Parallel tasks are
//! (batch, group, row block) triples fixed by the shapes, so results do not depend on
//! the thread count. ConvTranspose is a GEMM into columns followed by col2im.

use std::any::TypeId;
use std::array::from_fn;
use std::ops::Range;

use hmct_tensor::ndarray::ArrayD;
use hmct_tensor::{Tensor, f16};
use rayon::prelude::*;

use super::arrays::{array, contiguous};
use super::blocked::{BLOCK, BlockedConv, Layouts};
use super::gemm_util::{self as gu, MatRef, Scalar, SendPtr};
use super::weight_cache::WeightCache;
use super::window::{AutoPad, Win3, Window, WindowAttrs, split_row_stride2};
use super::{Kernel, NodeSpec, OpError, input, opt_input};
use crate::fusion::{ChainArgs, Tail};

pub(crate) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>> {
    let k: Result<Box<dyn Kernel>, OpError> = match spec.op_type {
        "Conv" => ConvKernel::new(spec, false).map(|k| Box::new(k) as Box<dyn Kernel>),
        "ConvInteger" => ConvKernel::new(spec, true).map(|k| Box::new(k) as Box<dyn Kernel>),
        "ConvTranspose" => ConvTransposeKernel::new(spec).map(|k| Box::new(k) as Box<dyn Kernel>),
        _ => return None,
    };
    Some(k)
}

struct ConvKernel {
    attrs: WindowAttrs,
    group: usize,
    integer: bool,
    weights: WeightCache<Derived>,
}

/// What a conv derives from its f32 weight, kept by its [`WeightCache`].
#[derive(Default)]
pub(crate) struct Derived {
    packed: std::sync::OnceLock<Vec<super::packed_gemm::PackedA>>,
    /// The weights in bf16 parts for [`super::amx`].
    #[cfg(target_arch = "x86_64")]
    amx: std::sync::OnceLock<Vec<super::amx::PackedA>>,
    /// The weights transposed for [`super::channel_lanes`].
    transposed: std::sync::OnceLock<Vec<f32>>,
    /// A conv on one position's weights in panels for [`super::gemv`].
    rows: std::sync::OnceLock<super::gemv::PackedRows>,
    /// A depthwise conv's weights in blocks of channels for [`super::conv_dw`].
    depthwise: std::sync::OnceLock<Vec<f32>>,
    /// The weights' Winograd transforms for [`super::conv_winograd`].
    winograd: std::sync::OnceLock<Vec<Vec<f32>>>,
    /// The weights' taps `(rows, columns)` of the bands of a padding-heavy conv
    /// ([`padding_bands`]), copied out once, with what their kernels derive from them.
    band_taps: BandTaps,
    /// The weights without the taps that read only padding ([`trim_padding_taps`]),
    /// for the taps kept (`[start, end]` per axis), with what their kernels derive.
    trimmed: std::sync::OnceLock<([usize; 6], std::sync::Arc<(Vec<f32>, Derived)>)>,
}

type BandTaps = std::sync::Mutex<Vec<([usize; 4], std::sync::Arc<(Vec<f32>, Derived)>)>>;

/// The value in `slot` (made on first use), or a fresh one held in `fresh` when
/// there is nothing to keep it in.
fn kept_or_fresh<'a, V>(
    slot: Option<&'a std::sync::OnceLock<V>>,
    fresh: &'a mut Option<V>,
    make: impl FnOnce() -> V,
) -> &'a V {
    match slot {
        Some(s) => s.get_or_init(make),
        None => fresh.insert(make()),
    }
}

impl ConvKernel {
    fn new(spec: &NodeSpec, integer: bool) -> Result<Self, OpError> {
        let group = spec.attrs.int_or("group", 1)?;
        if group < 1 {
            return Err(OpError::invalid(format!("group {group}")));
        }
        if integer && group != 1 {
            // ConvInteger has no group attribute before opset 10's definition either.
            return Err(OpError::invalid("ConvInteger takes group = 1"));
        }
        Ok(ConvKernel {
            attrs: WindowAttrs::parse(spec)?,
            group: group as usize,
            integer,
            weights: WeightCache::new(spec, 1),
        })
    }

    fn run_integer(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        let x = input(inputs, 0)?;
        let w = input(inputs, 1)?;
        let int_f64 = |t: &Tensor, what: &str| -> Result<Vec<f64>, OpError> {
            match t {
                Tensor::U8(_) | Tensor::I8(_) => Ok(t.to_f64_vec().unwrap_or_default()),
                other => Err(OpError::unsupported(format!(
                    "ConvInteger {what} of type {}",
                    other.dtype()
                ))),
            }
        };
        let mut xv = int_f64(x, "input")?;
        let mut wv = int_f64(w, "weight")?;
        if let Some(z) = opt_input(inputs, 2) {
            let z = int_f64(z, "x_zero_point")?;
            if z.len() != 1 {
                return Err(OpError::unsupported("per-channel x_zero_point"));
            }
            xv.iter_mut().for_each(|v| *v -= z[0]);
        }
        let m = w.shape().first().copied().unwrap_or(0);
        if let Some(z) = opt_input(inputs, 3) {
            let z = int_f64(z, "w_zero_point")?;
            if z.len() == 1 {
                wv.iter_mut().for_each(|v| *v -= z[0]);
            } else if z.len() == m && m > 0 {
                let per = wv.len() / m;
                for (c, chunk) in wv.chunks_mut(per.max(1)).enumerate() {
                    chunk.iter_mut().for_each(|v| *v -= z[c]);
                }
            } else {
                return Err(OpError::invalid(format!(
                    "w_zero_point of {} values for {m} channels",
                    z.len()
                )));
            }
        }
        let (y, shape, _) = conv_nd::<f64>(
            &xv,
            x.shape(),
            &wv,
            w.shape(),
            None,
            &self.attrs,
            self.group,
            None,
            None,
            Layouts::default(),
        )?;
        let y: Vec<i32> = y.into_iter().map(|v| v as i32).collect();
        Ok(vec![Tensor::I32(array(&shape, y)?)])
    }
}

impl ConvKernel {
    /// The f32 conv, with `tail` run on its output as it is stored when it fits;
    /// returns whether it ran.
    fn run_f32(
        &self,
        xa: &ArrayD<f32>,
        wa: &ArrayD<f32>,
        b: Option<&Tensor>,
        tail: Option<&ChainArgs>,
        layouts: Layouts,
    ) -> Result<(Vec<Tensor>, bool), OpError> {
        let bias = match b {
            None => None,
            Some(Tensor::F32(ba)) => Some(contiguous(ba)),
            Some(o) => return Err(OpError::invalid(format!("bias of type {}", o.dtype()))),
        };
        let derived = wa.as_slice().and_then(|w| self.weights.derived(w.as_ptr()));
        // A blocked input `[n, c/16, h, w, 16]` is read as the NCHW value it holds.
        let xs = match (layouts.input, xa.shape()) {
            (true, &[n, cb, h, w, BLOCK]) => vec![n, cb * BLOCK, h, w],
            (true, other) => {
                return Err(OpError::invalid(format!(
                    "blocked input of shape {other:?}"
                )));
            }
            (false, other) => other.to_vec(),
        };
        let (y, s, tail_ran) = conv_nd(
            &contiguous(xa),
            &xs,
            &contiguous(wa),
            wa.shape(),
            bias.as_deref(),
            &self.attrs,
            self.group,
            derived.as_deref(),
            tail,
            layouts,
        )?;
        Ok((vec![Tensor::F32(array(&s, y)?)], tail_ran))
    }
}

impl Kernel for ConvKernel {
    fn accepts_tail(&self) -> bool {
        !self.integer
    }

    #[allow(private_interfaces)]
    fn run_with_tail(
        &self,
        inputs: &[Option<&Tensor>],
        tail: &ChainArgs,
    ) -> Result<(Vec<Tensor>, bool), OpError> {
        self.run_blocked(inputs, Some(tail), Layouts::default())
    }

    fn blocked_conv(&self, weight: &[usize]) -> Option<BlockedConv> {
        let &[m, cg, kh, kw] = weight else {
            return None;
        };
        let unpadded = self
            .attrs
            .pads
            .as_ref()
            .is_none_or(|p| p.iter().all(|&p| p == 0))
            && matches!(self.attrs.auto_pad, AutoPad::NotSet | AutoPad::Valid);
        let at_most = |v: &Option<Vec<usize>>, most: usize| {
            v.as_ref().is_none_or(|v| v.iter().all(|&s| s <= most))
        };
        let unit = |v: &Option<Vec<usize>>| at_most(v, 1);
        let depthwise =
            cg == 1 && m == self.group && kh * kw > 1 && at_most(&self.attrs.strides, 2);
        let pointwise = self.group == 1
            && kh * kw == 1
            && unpadded
            && unit(&self.attrs.strides)
            && unit(&self.attrs.dilations);
        match (self.integer, depthwise, pointwise) {
            (false, true, _) => Some(BlockedConv::Depthwise {
                reads_wide: !at_most(&self.attrs.strides, 1) || kh * kw >= 25,
            }),
            (false, _, true) => Some(BlockedConv::Pointwise),
            _ => None,
        }
    }

    #[allow(private_interfaces)]
    fn run_blocked(
        &self,
        inputs: &[Option<&Tensor>],
        tail: Option<&ChainArgs>,
        layouts: Layouts,
    ) -> Result<(Vec<Tensor>, bool), OpError> {
        match (input(inputs, 0)?, input(inputs, 1)?) {
            (Tensor::F32(xa), Tensor::F32(wa)) if !self.integer => {
                self.run_f32(xa, wa, opt_input(inputs, 2), tail, layouts)
            }
            // Other types never hold blocked values: the plain conv, tail left to run
            // after it.
            _ if !layouts.input => self.run(inputs).map(|out| (out, false)),
            _ => Err(OpError::invalid("a blocked value reached a non-f32 conv")),
        }
    }

    fn run(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        if self.integer {
            return self.run_integer(inputs);
        }
        let x = input(inputs, 0)?;
        let w = input(inputs, 1)?;
        let b = opt_input(inputs, 2);
        match (x, w) {
            (Tensor::F32(xa), Tensor::F32(wa)) => {
                Ok(self.run_f32(xa, wa, b, None, Layouts::default())?.0)
            }
            (Tensor::F64(xa), Tensor::F64(wa)) => {
                let bias = match b {
                    None => None,
                    Some(Tensor::F64(ba)) => Some(contiguous(ba)),
                    Some(o) => return Err(OpError::invalid(format!("bias of type {}", o.dtype()))),
                };
                let (y, s, _) = conv_nd(
                    &contiguous(xa),
                    xa.shape(),
                    &contiguous(wa),
                    wa.shape(),
                    bias.as_deref(),
                    &self.attrs,
                    self.group,
                    None,
                    None,
                    Layouts::default(),
                )?;
                Ok(vec![Tensor::F64(array(&s, y)?)])
            }
            (Tensor::F16(xa), Tensor::F16(wa)) => {
                let up = |a: &ArrayD<f16>| a.iter().map(|v| v.to_f32()).collect::<Vec<f32>>();
                let bias = match b {
                    None => None,
                    Some(Tensor::F16(ba)) => Some(up(ba)),
                    Some(o) => return Err(OpError::invalid(format!("bias of type {}", o.dtype()))),
                };
                let (y, s, _) = conv_nd(
                    &up(xa),
                    xa.shape(),
                    &up(wa),
                    wa.shape(),
                    bias.as_deref(),
                    &self.attrs,
                    self.group,
                    None,
                    None,
                    Layouts::default(),
                )?;
                Ok(vec![Tensor::F16(array(
                    &s,
                    y.into_iter().map(f16::from_f32).collect(),
                )?)])
            }
            _ => Err(OpError::unsupported(format!(
                "Conv on {} input and {} weight",
                x.dtype(),
                w.dtype()
            ))),
        }
    }
}

/// Output columns per GEMM task for im2col convs, and the cap on the im2col buffer
/// (elements); columns per task for pointwise convs; output channels per task for
/// pointwise convs with many channels. Fixed, so results never depend on threads.
const IM2COL_COLS: usize = 320;
const IM2COL_MAX: usize = 1 << 18;
const POINTWISE_COLS: usize = 4096;
const M_BLOCK: usize = 64;

/// The most outputs per channel of a conv that stores a blocked output (see
/// [`super::blocked`]). On larger planes `dw_rows` on NCHW data, which sums several
/// output rows per load, beat the blocked band kernel: MobileNetV2's depthwise convs
/// at 28x28 0.162 against 0.185 ms per run, at 56x56 and 112x112 0.22-0.35 against
/// 0.35-0.51 (`run --profile`, `tools/conv_classes.py`, on builds with larger limits).
/// Up to [`super::blocked::WIDE_PLANE`] when every conv reading the value is a
/// depthwise conv that runs on the band kernel from it anyway (`Layouts::wide`).
const BLOCKED_PLANE: usize = 20 * 20;

/// Conv forward on row-major data. Returns the output and its shape.
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv_nd<T: Scalar>(
    x: &[T],
    xs: &[usize],
    w: &[T],
    ws: &[usize],
    bias: Option<&[T]>,
    attrs: &WindowAttrs,
    group: usize,
    derived: Option<&Derived>,
    tail: Option<&ChainArgs>,
    layouts: Layouts,
) -> Result<(Vec<T>, Vec<usize>, bool), OpError> {
    // Blocked values are 4-D f32 (`xs` is the input's NCHW shape either way).
    let f32_2d = TypeId::of::<T>() == TypeId::of::<f32>() && xs.len() == 4;
    assert!(f32_2d || !layouts.input, "a blocked input is 4-D f32");
    let mut layouts = Layouts {
        output: layouts.output && f32_2d,
        ..layouts
    };
    if xs.len() < 3 || ws.len() != xs.len() {
        return Err(OpError::invalid(format!(
            "Conv input {xs:?} and weight {ws:?}"
        )));
    }
    let (n, c) = (xs[0], xs[1]);
    let (m, cg) = (ws[0], ws[1]);
    if cg * group != c || m % group != 0 {
        return Err(OpError::invalid(format!(
            "Conv input {xs:?}, weight {ws:?} and group {group} do not fit"
        )));
    }
    let kernel = &ws[2..];
    if let Some(ks) = &attrs.kernel_shape
        && ks.as_slice() != kernel
    {
        return Err(OpError::invalid(format!(
            "kernel_shape {ks:?} but weight {ws:?}"
        )));
    }
    if let Some(b) = bias
        && b.len() != m
    {
        return Err(OpError::invalid(format!(
            "bias of {} values for {m} channels",
            b.len()
        )));
    }
    let win = attrs.resolve(&xs[2..], kernel, false)?;
    let g3 = Win3::new(&xs[2..], &win)?;
    let mut shape = vec![n, m];
    shape.extend_from_slice(&win.out);
    let tail_asked = tail.is_some();
    // The tail runs on f32 outputs only; every path below runs it once bound.
    let tail = tail
        .filter(|_| TypeId::of::<T>() == TypeId::of::<f32>())
        .and_then(|c| c.tail(&shape));
    let tail = tail.as_ref();
    let tail_ran = tail.is_some();
    // A blocked store runs a tail over runs of 16 channels: operands per channel (a
    // channel per plane) or along the last axis do not fit it. A tail that does not fit the output leaves
    // the conv's own output, which is not the slot asked to be blocked.
    if tail.is_some_and(|t| t.varies_by_position()) || tail_asked && tail.is_none() {
        layouts.output = false;
    }
    // Trimmed f32 weights are kept (with what their kernels derive from them) for
    // the taps they were trimmed to; others are a new tensor per call.
    let (kept_trim, fresh_trim);
    let (w, g3, derived) = match trim_padding_taps(&g3) {
        None => (w, g3, derived),
        Some((taps, tg)) => {
            let key: [usize; 6] = from_fn(|i| {
                if i % 2 == 0 {
                    taps[i / 2].start
                } else {
                    taps[i / 2].end
                }
            });
            let trim = || kernel_taps(w, m * cg, g3.kernel, taps.clone());
            match derived.filter(|_| TypeId::of::<T>() == TypeId::of::<f32>()) {
                Some(d) => {
                    let held = d.trimmed.get_or_init(|| {
                        let wf = f32_slice(&trim()).expect("T is f32").to_vec();
                        (key, std::sync::Arc::new((wf, Derived::default())))
                    });
                    if held.0 == key {
                        kept_trim = held.1.clone();
                        let wt = same_type::<T>(&kept_trim.0).expect("T is f32");
                        (wt, tg, Some(&kept_trim.1))
                    } else {
                        fresh_trim = trim();
                        (&fresh_trim[..], tg, None)
                    }
                }
                None => {
                    fresh_trim = trim();
                    (&fresh_trim[..], tg, None)
                }
            }
        }
    };
    let (in_vol, out_vol, k_vol) = (g3.in_vol(), g3.out_vol(), g3.k_vol());
    if n * m * out_vol == 0 {
        return Ok((Vec::new(), shape, tail_ran));
    }
    let most = match layouts.wide {
        true => super::blocked::WIDE_PLANE,
        false => BLOCKED_PLANE,
    };
    if out_vol > most {
        layouts.output = false;
    }
    let mg = m / group;
    let one_per_group = cg == 1 && mg == 1 && k_vol > 1;
    // A 1x1 conv on one position (the convs of squeeze-excitation blocks) reads each
    // weight once: its speed is the speed at which the weights stream from memory,
    // which `gemv` reads as one run of packed panels, four vectors of sums per input
    // value (the channel-lanes kernel, which ran those with 32+ outputs and 64+
    // inputs, kept two; `single_position`, the others, reads four weight rows at a
    // time). MobileNetV3's SE convs (`sh tools/ab_classes.sh`, least ms per run):
    // 0.338 -> 0.286 (3 rounds), 0.376 -> 0.341 (6 rounds, a busier hour of the
    // host); one 4-round run came out equal.
    let one_position = in_vol == 1 && out_vol == 1 && k_vol == 1;
    if one_position
        && group == 1
        && !layouts.input
        && crate::cpu::conv_isa().is_some()
        && let (Some(xf), Some(wf)) = (f32_slice(x), f32_slice(w))
    {
        let wm = MatRef {
            data: wf,
            rs: 1,
            cs: c,
        };
        let pack = || super::gemv::PackedRows::new(wm, c, m);
        let mut fresh = None;
        let packed = kept_or_fresh(derived.map(|d| &d.rows), &mut fresh, pack);
        let mut y = crate::buffers::take::<T>(n * m);
        let yf = f32_slice_mut(&mut y).expect("T is f32, as x is");
        let start = match bias.and_then(f32_slice) {
            Some(b) => {
                yf.chunks_exact_mut(m)
                    .for_each(|row| row.copy_from_slice(b));
                super::packed_gemm::Start::Output
            }
            None => super::packed_gemm::Start::Zero,
        };
        packed.matmul(MatRef::row_major(xf, c), n, start, yf);
        apply_tail(tail, yf);
        return Ok((y, shape, tail_ran));
    }
    // Other convs on one position (grouped, blocked or not f32) run on the
    // channel-lanes kernel where it fits, else as the matrix-vector product
    // `single_position`, whose sums the blocked kernels do not give.
    let single =
        one_position && !(f32_slice(x).is_some() && super::channel_lanes::fits(&g3, mg, cg));
    // From an NCHW input, a depthwise conv that `dw_rows` runs faster stays there.
    if one_per_group && !layouts.input && !super::conv_dw::fits(&g3) {
        layouts.output = false;
    }
    let mut unblocked = None;
    // A conv that runs on AMX in NCHW runs there from blocked values too (its bits
    // differ from the channel-lanes kernel's): natively where the AMX conv reads and
    // stores blocked values, else converted.
    let on_amx = !one_per_group && !single && amx_prefers(&g3, mg, cg * k_vol);
    if layouts.input || layouts.output {
        let native = match (one_per_group, on_amx) {
            (true, _) => super::conv_dw::runs_blocked(&g3, c),
            (false, true) => amx_runs_blocked(&g3, m, c, group, layouts),
            (false, false) => {
                !single && super::channel_lanes::runs_blocked(&g3, m, c, group, layouts)
            }
        };
        if native && let (Some(xf), Some(wf)) = (f32_slice(x), f32_slice(w)) {
            let mut y = crate::buffers::take::<T>(n * m * out_vol);
            let yf = f32_slice_mut(&mut y).expect("T is f32, as x is");
            let bf = bias.and_then(f32_slice);
            let mut fresh = None;
            if one_per_group {
                let pack = || super::conv_dw::pack_weights(wf, c, k_vol);
                let packed = kept_or_fresh(derived.map(|d| &d.depthwise), &mut fresh, pack);
                super::conv_dw::conv(xf, packed, bf, yf, n, c, &g3, tail, layouts);
            } else if on_amx {
                amx_conv(
                    xf,
                    wf,
                    bf,
                    yf,
                    [n, c, m, group],
                    &g3,
                    derived,
                    tail,
                    layouts,
                );
            } else {
                let pack = || super::channel_lanes::pack_weights(wf, m, group, cg);
                let packed = kept_or_fresh(derived.map(|d| &d.transposed), &mut fresh, pack);
                super::channel_lanes::conv(packed, xf, bf, yf, n, c, m, group, &g3, tail, layouts);
            }
            if layouts.output {
                shape = vec![n, m / BLOCK, win.out[0], win.out[1], BLOCK];
            }
            return Ok((y, shape, tail_ran));
        }
        // No kernel here reads or stores it blocked: the plain conv on NCHW data.
        if layouts.input {
            unblocked = Some(super::blocked::unblock_slice(x, n, c, in_vol));
        }
    }
    let x = unblocked.as_deref().unwrap_or(x);
    if let (Some(xf), Some(wf)) = (f32_slice(x), f32_slice(w))
        && cg > 1
        && let Some(isa) = crate::cpu::conv_isa()
        && !on_amx
        && let Some(rects) = padding_bands(&g3)
    {
        let mut y = crate::buffers::take::<T>(n * m * out_vol);
        let yf = f32_slice_mut(&mut y).expect("T is f32, as x is");
        let bf = bias.and_then(f32_slice);
        conv_bands(isa, xf, wf, bf, yf, [n, c, m, group], &g3, &rects, derived);
        apply_tail(tail, yf);
        return Ok((y, shape, tail_ran));
    }
    if single && g3.pad == [0; 3] {
        // A 1x1 kernel on one position (the convs of squeeze-excitation blocks): a
        // matrix-vector product per image.
        let mut y = crate::buffers::take::<T>(n * m);
        single_position(x, w, bias, &mut y, c, m, group);
        apply_tail(tail, &mut y);
        return Ok((y, shape, tail_ran));
    }
    let kdim = cg * k_vol;
    // A conv whose windows do not overlap (a 1x1 conv with a stride, a patch
    // embedding, ConvNeXt's 2x2 stride-2 downsampling) reads each input at most once:
    // its windows gathered into channels of a dense input of the output's shape
    // (`[c, taps, out]`, the weights' order) make it a pointwise conv, whose kernels
    // run at their full rate. ResNet-50's 256->512 stride-2 projection went from 48%
    // to 77% of the FMA peak, and its 1024->2048 one on 7x7 outputs (where the direct
    // kernel read every weight once per output row) from 14 to 65 GFLOP/s. Same sums
    // in the same order either way.
    let mut gathered = None;
    if let Some(xf) = f32_slice(x)
        && g3.pad == [0; 3]
        && g3.stride != [1; 3]
        && k_vol * out_vol <= in_vol
        // No end padding either: every tap reads an input.
        && (0..3).all(|a| (g3.out[a] - 1) * g3.stride[a] + (g3.kernel[a] - 1) * g3.dil[a] < g3.input[a])
        && crate::cpu::conv_isa().is_some()
    {
        let dense = Win3 {
            input: g3.out,
            kernel: [1; 3],
            stride: [1; 3],
            dil: [1; 3],
            ..g3
        };
        if super::conv_direct::fits(&dense, kdim) {
            gathered = Some((gather_windows(xf, n * c, &g3), dense));
        }
    }
    // Channels of the input the kernels read: `c · taps` when gathered.
    let (xf, g_f32, c_f32) = match &gathered {
        Some((xd, dense)) => (Some(&xd[..]), *dense, c * k_vol),
        None => (f32_slice(x), g3, c),
    };
    if let (Some(xf), Some(wf)) = (xf, f32_slice(w))
        && super::conv_direct::fits(&g_f32, c_f32 / group)
        && let Some(isa) = crate::cpu::conv_isa()
    {
        let mut y = crate::buffers::take::<T>(n * m * out_vol);
        let bf = bias.and_then(f32_slice);
        if let Some(yf) = f32_slice_mut(&mut y) {
            let dims = [n, c_f32, m, group];
            conv_f32(isa, xf, wf, bf, yf, dims, &g_f32, derived, tail);
            if let Some((xd, _)) = gathered {
                crate::buffers::give_vec(xd);
            }
            return Ok((y, shape, tail_ran));
        }
    }
    if cg == 1 && k_vol > 1 {
        // Every output is written (starting from its bias), so stale values are fine.
        let mut y = crate::buffers::take(n * m * out_vol);
        if let (Some(xf), Some(wf)) = (f32_slice(x), f32_slice(w))
            && mg == 1
            && super::conv_dw::fits(&g3)
        {
            let yf = f32_slice_mut(&mut y).expect("T is f32, as x is");
            let pack = || super::conv_dw::pack_weights(wf, c, k_vol);
            let mut fresh = None;
            let packed = kept_or_fresh(derived.map(|d| &d.depthwise), &mut fresh, pack);
            let bf = bias.and_then(f32_slice);
            super::conv_dw::conv(xf, packed, bf, yf, n, c, &g3, tail, Layouts::default());
            return Ok((y, shape, tail_ran));
        }
        depthwise(x, w, bias, &mut y, &g3, m, mg, tail);
        return Ok((y, shape, tail_ran));
    }
    let mut y = match bias {
        None => crate::buffers::take_filled(n * m * out_vol, T::zero()),
        Some(_) => crate::buffers::take(n * m * out_vol),
    };
    if y.is_empty() {
        return Ok((y, shape, tail_ran));
    }
    if let Some(b) = bias {
        for (i, plane) in y.chunks_mut(out_vol).enumerate() {
            plane.fill(b[i % m]);
        }
    }
    let accumulate = bias.is_some();
    let pointwise =
        k_vol == 1 && g3.stride == [1, 1, 1] && g3.pad == [0, 0, 0] && g3.out == g3.input;
    let (row_len, rows) = if pointwise {
        (1, out_vol)
    } else {
        (g3.out[2], g3.out[0] * g3.out[1])
    };
    // GEMMs of a few hundred columns run fastest here (B stays in cache); the im2col
    // buffer is also capped in size.
    let target_cols = if pointwise {
        POINTWISE_COLS
    } else {
        IM2COL_COLS.min((IM2COL_MAX / kdim.max(1)).max(row_len))
    };
    let rows_per_task = (target_cols / row_len).clamp(1, rows);
    let chunks = rows.div_ceil(rows_per_task);
    // Pointwise convs with many output channels also split channels (no im2col to
    // repeat), so small feature maps still give parallel work.
    let m_block = if pointwise && mg > 2 * M_BLOCK {
        M_BLOCK
    } else {
        mg
    };
    let m_chunks = mg.div_ceil(m_block);
    let yp = SendPtr(y.as_mut_ptr());
    let run_task = |buf: &mut Vec<T>, t: usize| {
        let chunk = t % chunks;
        let mc = (t / chunks) % m_chunks;
        let bg = t / chunks / m_chunks;
        let (b, g) = (bg / group, bg % group);
        let (m0, mb) = (mc * m_block, m_block.min(mg - mc * m_block));
        let r0 = chunk * rows_per_task;
        let r1 = (r0 + rows_per_task).min(rows);
        let cols = (r1 - r0) * row_len;
        let xg = &x[(b * c + g * cg) * in_vol..][..cg * in_vol];
        let wg = MatRef::row_major(&w[(g * mg + m0) * kdim..][..mb * kdim], kdim);
        let bmat = if pointwise {
            MatRef {
                data: &xg[r0..],
                rs: in_vol,
                cs: 1,
            }
        } else {
            buf.resize(kdim * cols, T::zero());
            im2col(xg, cg, &g3, r0, r1, buf);
            MatRef::row_major(&buf[..], cols)
        };
        let yp = yp;
        // SAFETY: task (b, g, mc, chunk) writes rows [g*mg + m0, g*mg + m0 + mb) ×
        // columns [r0*row_len, r1*row_len) of image b: disjoint from every other task,
        // and in bounds of `y` (n*m*out_vol elements).
        unsafe {
            let dst = yp.0.add((b * m + g * mg + m0) * out_vol + r0 * row_len);
            gu::gemm_raw(mb, cols, kdim, wg, bmat, dst, out_vol, accumulate, T::one());
        }
    };
    let tasks = n * group * m_chunks * chunks;
    let work = n * m * out_vol * kdim;
    if tasks == 1 || work < (1 << 20) || !crate::par::enabled() {
        let mut buf = Vec::new();
        (0..tasks).for_each(|t| run_task(&mut buf, t));
    } else {
        (0..tasks).into_par_iter().for_each_init(Vec::new, run_task);
    }
    apply_tail(tail, &mut y);
    Ok((y, shape, tail_ran))
}

/// `y = conv(x, w) + bias` for f32 data that [`super::conv_direct::fits`], on the
/// kernel that runs it fastest: the packed GEMM (pointwise convs, with AVX-512),
/// channel lanes, or the direct conv. `dims` is `[n, c, m, group]`; packed weights
/// are kept in `derived` when there is one.
#[allow(clippy::too_many_arguments)]
fn conv_f32(
    isa: crate::cpu::Isa,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    y: &mut [f32],
    dims: [usize; 4],
    g: &Win3,
    derived: Option<&Derived>,
    tail: Option<&Tail>,
) {
    let [n, c, m, group] = dims;
    let kdim = c / group * g.k_vol();
    let (mg, cg) = (m / group, c / group);
    if super::conv_winograd::fits(g, c, m, group) {
        let variant = super::conv_winograd::variant(g, c, m);
        let pack = || super::conv_winograd::pack_weights(w, m, c, variant);
        let mut fresh = None;
        let packed = kept_or_fresh(derived.map(|d| &d.winograd), &mut fresh, pack);
        super::conv_winograd::conv(packed, x, bias, y, n, c, m, g, tail);
    } else if amx_prefers(g, mg, kdim) {
        amx_conv(x, w, bias, y, dims, g, derived, tail, Layouts::default());
    } else if super::packed_gemm::conv_prefers(isa, g, mg, kdim)
        && !super::channel_lanes::fits(g, mg, cg)
    {
        let pack = || super::packed_gemm::pack_conv_weights(isa, w, m, group, kdim);
        let mut fresh = None;
        let packed = kept_or_fresh(derived.map(|d| &d.packed), &mut fresh, pack);
        super::packed_gemm::conv(packed, x, bias, y, n, c, m, group, g, tail);
    } else if super::channel_lanes::fits(g, mg, cg) || super::channel_lanes::fits_spatial(g, mg, cg)
    {
        let pack = || super::channel_lanes::pack_weights(w, m, group, kdim);
        let mut fresh = None;
        let packed = kept_or_fresh(derived.map(|d| &d.transposed), &mut fresh, pack);
        let layouts = Layouts::default();
        super::channel_lanes::conv(packed, x, bias, y, n, c, m, group, g, tail, layouts);
    } else {
        super::conv_direct::conv(isa, x, w, bias, y, n, c, m, group, g, tail);
    }
}

/// [`super::amx::conv`] with the weights packed for it (kept in `derived` when there
/// is one); `dims` is `[n, c, m, group]`. Only where [`amx_prefers`] the conv.
#[allow(clippy::too_many_arguments)]
fn amx_conv(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    y: &mut [f32],
    dims: [usize; 4],
    g: &Win3,
    derived: Option<&Derived>,
    tail: Option<&Tail>,
    layouts: Layouts,
) {
    #[cfg(target_arch = "x86_64")]
    {
        let [n, c, m, group] = dims;
        let pack = || super::amx::pack_conv_weights(w, m, group, g);
        let mut fresh = None;
        // Kept weights in the other depth order (the input's size changed) are packed
        // afresh.
        let slot = derived
            .map(|d| &d.amx)
            .filter(|s| s.get().is_none_or(|p| super::amx::packed_for(p, g)));
        let packed = kept_or_fresh(slot, &mut fresh, pack);
        super::amx::conv(packed, x, bias, y, n, c, m, group, g, tail, layouts);
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (x, w, bias, y, dims, g, derived, tail, layouts);
        unreachable!("AMX is x86-64 only");
    }
}

/// Whether [`super::amx`] runs this conv (never off x86-64).
fn amx_prefers(g: &Win3, mg: usize, kdim: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    return super::amx::conv_prefers(g, mg, kdim);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (g, mg, kdim);
        false
    }
}

/// Whether [`super::amx::conv`] reads and stores these layouts (never off x86-64).
fn amx_runs_blocked(g: &Win3, m: usize, c: usize, group: usize, layouts: Layouts) -> bool {
    #[cfg(target_arch = "x86_64")]
    return super::amx::runs_blocked(g, m, c, group, layouts);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (g, m, c, group, layouts);
        false
    }
}

/// Runs `tail` on all of `y` (f32) after a kernel that does not run it as it stores.
fn apply_tail<T: 'static>(tail: Option<&Tail>, y: &mut [T]) {
    if let (Some(t), Some(yf)) = (tail, f32_slice_mut(y)) {
        t.apply_all(yf);
    }
}

/// A 1x1 conv without pads on an input of one position: each output is a dot product
/// over the group's input channels, in eight running sums.
///
/// Four outputs are summed side by side: one output's eight sums form a chain of
/// dependent adds, which left the squeeze-excitation convs of MobileNetV3 (960->240
/// on one position) three times slower than onnxruntime. Compiled for AVX2 where the
/// CPU has it; products and sums are rounded separately everywhere (no FMA), so the
/// bits do not depend on the CPU.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl", "x86_64+avx2"))]
fn single_position<T: Scalar>(
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    y: &mut [T],
    c: usize,
    m: usize,
    group: usize,
) {
    const SIDE: usize = 4;
    let (cg, mg) = (c / group, m / group);
    // How far ahead of each row the weights are prefetched: 16 KiB, and at least the
    // next four rows. The weights (a megabyte for MobileNetV3's 960x240) have left
    // the caches by the time a model reaches an SE block, and rows of 240 values are
    // too short for the hardware prefetcher to get ahead of the loads. Zen 4,
    // alternating runs: `kernel_table mbv3_se --cold` 240->960 0.09-0.14 ->
    // 0.07-0.095 ms; MobileNetV3's 16 SE convs in the model 0.90 -> 0.76 ms.
    let ahead = 4096usize.max(SIDE * cg);
    let chunks = cg / 8 * 8;
    for (b, ys) in y.chunks_exact_mut(m).enumerate() {
        for (g, yg) in ys.chunks_exact_mut(mg).enumerate() {
            let xs = &x[b * c + g * cg..][..cg];
            for (i, outs) in yg.chunks_mut(SIDE).enumerate() {
                let mo0 = g * mg + i * SIDE;
                let rows: [&[T]; SIDE] = std::array::from_fn(|r| {
                    let mo = (mo0 + r).min(g * mg + mg - 1);
                    &w[mo * cg..][..cg]
                });
                let mut lanes = [[T::zero(); 8]; SIDE];
                for k0 in (0..chunks).step_by(8) {
                    let xk = &xs[k0..k0 + 8];
                    #[cfg(target_arch = "x86_64")]
                    for ws in &rows {
                        let next = ws.as_ptr().wrapping_add(ahead + k0);
                        // SAFETY: a prefetch never faults, whatever the address. (The
                        // multiversioned copies, compiled with SSE named, need no
                        // `unsafe` here; the generic one does.)
                        #[allow(unused_unsafe)]
                        unsafe {
                            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
                            _mm_prefetch::<_MM_HINT_T0>(next.cast());
                        }
                    }
                    for (l, ws) in lanes.iter_mut().zip(&rows) {
                        let wk = &ws[k0..k0 + 8];
                        for j in 0..8 {
                            l[j] += wk[j] * xk[j];
                        }
                    }
                }
                for (r, out) in outs.iter_mut().enumerate() {
                    let mut sum = lanes[r].iter().fold(T::zero(), |a, &l| a + l);
                    for k in chunks..cg {
                        sum += rows[r][k] * xs[k];
                    }
                    *out = match bias {
                        Some(bv) => bv[mo0 + r] + sum,
                        None => sum,
                    };
                }
            }
        }
    }
}

/// f32 values `s` as `T` values, when `T` is f32.
fn same_type<T: 'static>(s: &[f32]) -> Option<&[T]> {
    // SAFETY: T is f32, so the slice's memory holds exactly `len` T values.
    (TypeId::of::<T>() == TypeId::of::<f32>())
        .then(|| unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<T>(), s.len()) })
}

/// `s` as f32 values, when `T` is f32.
pub(crate) fn f32_slice<T: 'static>(s: &[T]) -> Option<&[f32]> {
    // SAFETY: T is f32, so the slice's memory holds exactly `len` f32 values.
    (TypeId::of::<T>() == TypeId::of::<f32>())
        .then(|| unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<f32>(), s.len()) })
}

/// The conv without the kernel rows, columns or slices that read only padding for
/// every output (they add `w·0`): the taps kept (a range per axis) and the geometry,
/// or `None` when every tap reads data somewhere. DeepLab's ASPP conv of dilation 36
/// on a 32x32 map is a 1x1 conv in a 3x3 kernel (nine times the work); the sums
/// differ from the full kernel's at most in the sign of a zero sum.
fn trim_padding_taps(g: &Win3) -> Option<([Range<usize>; 3], Win3)> {
    let mut first = [0; 3];
    let mut used = g.kernel;
    for a in 0..3 {
        // Tap `t` reads padded positions `t·d + o·s` for outputs `o`; data lies in
        // `[pad, pad + input)`.
        let (d, s, pad) = (g.dil[a], g.stride[a], g.pad[a]);
        let last_out = ((g.out[a] - 1) * s) as isize;
        let reads = |t: usize| {
            let lo = (t * d) as isize;
            lo + last_out >= pad && lo < pad + g.input[a] as isize
        };
        let t0 = (0..g.kernel[a]).find(|&t| reads(t))?;
        let t1 = (t0..g.kernel[a]).rfind(|&t| reads(t)).unwrap_or(t0) + 1;
        if g.pad[a] < (t0 * d) as isize {
            // Dropping them would leave a negative pad (a crop): not worth it.
            return None;
        }
        (first[a], used[a]) = (t0, t1 - t0);
    }
    if used == g.kernel {
        return None;
    }
    let pad = from_fn(|a| g.pad[a] - (first[a] * g.dil[a]) as isize);
    Some((
        from_fn(|a| first[a]..first[a] + used[a]),
        Win3 {
            kernel: used,
            pad,
            ..*g
        },
    ))
}

/// The weights of a conv that keeps only taps `taps` (a range per axis of `kernel`)
/// of each of its `filters` filters, in the same order.
fn kernel_taps<T: Copy>(
    w: &[T],
    filters: usize,
    kernel: [usize; 3],
    taps: [Range<usize>; 3],
) -> Vec<T> {
    let [kd, kh, kw] = kernel;
    let mut kept = Vec::with_capacity(filters * taps.iter().map(Range::len).product::<usize>());
    for f in 0..filters {
        for a in taps[0].clone() {
            for b in taps[1].clone() {
                kept.extend_from_slice(&w[((f * kd + a) * kh + b) * kw..][taps[2].clone()]);
            }
        }
    }
    kept
}

/// A rectangle of a 2-D conv's outputs (rows, columns) and the kernel rows and
/// columns that read data (not padding) for every output in it.
#[derive(Debug)]
struct Band {
    rows: Range<usize>,
    cols: Range<usize>,
    tap_rows: Range<usize>,
    tap_cols: Range<usize>,
}

/// Runs of outputs along one axis that read data with the same taps: `(outputs,
/// taps)`. Tap `t` of output `o` reads padded position `o·s + t·d`; data lies in
/// `[pad, pad + input)`, so the taps that read data form one range.
pub(super) fn axis_bands(g: &Win3, a: usize) -> Vec<(Range<usize>, Range<usize>)> {
    let (d, s, pad, len) = (g.dil[a], g.stride[a], g.pad[a], g.input[a] as isize);
    let reads = |o: usize, t: usize| {
        let p = (o * s + t * d) as isize - pad;
        (0..len).contains(&p)
    };
    let mut bands: Vec<(Range<usize>, Range<usize>)> = Vec::new();
    for o in 0..g.out[a] {
        let t0 = (0..g.kernel[a]).find(|&t| reads(o, t)).unwrap_or(0);
        let t1 = (t0..g.kernel[a]).take_while(|&t| reads(o, t)).count() + t0;
        match bands.last_mut() {
            Some((outs, taps)) if *taps == (t0..t1) => outs.end = o + 1,
            _ => bands.push((o..o + 1, t0..t1)),
        }
    }
    bands
}

/// The bands of a 2-D conv whose taps mostly read padding, as DeepLab's ASPP convs
/// (dilations 12 and 24 on a 33x33 map: 57% and 26% of their multiply-adds read
/// data), or `None` when the conv reads data with most of its taps: there the full
/// kernel over whole rows runs faster than rectangles of a few outputs would.
fn padding_bands(g: &Win3) -> Option<Vec<Band>> {
    if g.input[0] != 1 || g.out[0] != 1 || g.kernel[0] != 1 || g.pad.iter().any(|&p| p < 0) {
        return None;
    }
    let (rows, cols) = (axis_bands(g, 1), axis_bands(g, 2));
    let taps = |b: &[(Range<usize>, Range<usize>)]| -> usize {
        b.iter().map(|(o, t)| o.len() * t.len()).sum()
    };
    let reading = taps(&rows) * taps(&cols);
    if reading * 5 > g.out_vol() * g.k_vol() * 3 {
        return None;
    }
    let bands = rows
        .iter()
        .flat_map(|(r, tr)| {
            cols.iter().map(move |(c, tc)| Band {
                rows: r.clone(),
                cols: c.clone(),
                tap_rows: tr.clone(),
                tap_cols: tc.clone(),
            })
        })
        .collect();
    Some(bands)
}

/// Whether a 2-D conv's taps mostly read padding ([`padding_bands`]).
pub(super) fn reads_little(g: &Win3) -> bool {
    padding_bands(g).is_some()
}

/// A 2-D f32 conv as one conv per band of [`padding_bands`], each with the taps that
/// read data there: on the packed GEMM, which gathers the band's windows from the
/// input in place, where it has the output channels and positions for its tiles
/// ([`super::packed_gemm::band_prefers`]); otherwise as an unpadded conv on a copy of
/// the input rectangle the band reads. `y` is written in full. Every output is the sum of the full kernel's in the same order
/// less the `w·0` terms of padding (so the same bits but for the sign of a zero
/// sum); `dims` is `[n, c, m, group]`.
#[allow(clippy::too_many_arguments)]
fn conv_bands(
    isa: crate::cpu::Isa,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    y: &mut [f32],
    dims: [usize; 4],
    g: &Win3,
    bands: &[Band],
    derived: Option<&Derived>,
) {
    let [n, c, m, group] = dims;
    let [_, ih, iw] = g.input;
    let [_, oh, ow] = g.out;
    let filters = m * (c / group);
    // A band's outputs, `[n, m, rows, cols]`; `None` when it reads only padding.
    let run_band = |band: &Band| -> Option<Vec<f32>> {
        let (rh, rw) = (band.rows.len(), band.cols.len());
        let (th, tw) = (band.tap_rows.clone(), band.tap_cols.clone());
        if th.is_empty() || tw.is_empty() {
            return None;
        }
        // First input row and column the band reads (data, by construction).
        let r0 = (band.rows.start * g.stride[1] + th.start * g.dil[1]) as isize - g.pad[1];
        let c0 = (band.cols.start * g.stride[2] + tw.start * g.dil[2]) as isize - g.pad[2];
        // The band as a conv on the whole input, its pads negative: its windows start
        // at row `r0`, column `c0` and read only data.
        let on_input = Win3 {
            out: [1, rh, rw],
            kernel: [1, th.len(), tw.len()],
            pad: [0, -r0, -c0],
            ..*g
        };
        let key = [th.start, th.end, tw.start, tw.end];
        let copy_taps = || {
            let taps = kernel_taps(w, filters, g.kernel, [0..1, th.clone(), tw.clone()]);
            std::sync::Arc::new((taps, Derived::default()))
        };
        let weights = match derived {
            Some(derived) => {
                let mut held = derived.band_taps.lock().unwrap_or_else(|e| e.into_inner());
                match held.iter().find(|(k, _)| *k == key) {
                    Some((_, t)) => t.clone(),
                    None => {
                        let t = copy_taps();
                        held.push((key, t.clone()));
                        t
                    }
                }
            }
            None => copy_taps(),
        };
        let (taps, band_derived) = (&weights.0, derived.map(|_| &weights.1));
        let mut out = crate::buffers::take::<f32>(n * m * rh * rw);
        let kdim = c / group * on_input.k_vol();
        if super::packed_gemm::band_prefers(isa, m / group, kdim, rh * rw) {
            // The packed GEMM gathers the band's windows from the input in place.
            let pack = || super::packed_gemm::pack_conv_weights(isa, taps, m, group, kdim);
            let mut fresh = None;
            let packed = kept_or_fresh(band_derived.map(|d| &d.packed), &mut fresh, pack);
            super::packed_gemm::conv(packed, x, bias, &mut out, n, c, m, group, &on_input, None);
        } else {
            // Other kernels take an unpadded input: the rectangle the band reads.
            let sub = Win3 {
                input: [
                    1,
                    (rh - 1) * g.stride[1] + (th.len() - 1) * g.dil[1] + 1,
                    (rw - 1) * g.stride[2] + (tw.len() - 1) * g.dil[2] + 1,
                ],
                pad: [0; 3],
                ..on_input
            };
            let (r0, c0) = (r0 as usize, c0 as usize);
            let [_, ch, cw] = sub.input;
            let mut crop = crate::buffers::take::<f32>(n * c * ch * cw);
            for (plane, dst) in x.chunks_exact(ih * iw).zip(crop.chunks_exact_mut(ch * cw)) {
                for (r, dst_row) in dst.chunks_exact_mut(cw).enumerate() {
                    let src = &plane[(r0 + r) * iw + c0..][..cw];
                    if cw <= 64 {
                        copy_short(dst_row, src);
                    } else {
                        dst_row.copy_from_slice(src);
                    }
                }
            }
            conv_f32(
                isa,
                &crop,
                taps,
                bias,
                &mut out,
                dims,
                &sub,
                band_derived,
                None,
            );
            crate::buffers::give_vec(crop);
        }
        Some(out)
    };
    // Writes a band's outputs (or its bias, where it reads only padding) into `y`.
    let mut place = |band: &Band, out: Option<Vec<f32>>| {
        let (rh, rw) = (band.rows.len(), band.cols.len());
        let Some(out) = out else {
            for (i, plane) in y.chunks_exact_mut(oh * ow).enumerate() {
                let b = bias.map_or(0.0, |b| b[i % m]);
                for r in band.rows.clone() {
                    plane[r * ow..][band.cols.clone()].fill(b);
                }
            }
            return;
        };
        for (plane, src) in y.chunks_exact_mut(oh * ow).zip(out.chunks_exact(rh * rw)) {
            for (r, src_row) in src.chunks_exact(rw).enumerate() {
                let at = (band.rows.start + r) * ow + band.cols.start;
                plane[at..at + rw].copy_from_slice(src_row);
            }
        }
        crate::buffers::give_vec(out);
    };
    // With more than one thread the bands run side by side, each split further where
    // it has the work: one band at a time split its few panels of positions 3:2 or
    // 2:1 between two threads (DeepLabV3's ASPP bands of 144 and 96 positions).
    if crate::par::threads() > 1 && bands.len() > 1 {
        use rayon::prelude::*;
        let outs: Vec<_> = bands.par_iter().map(run_band).collect();
        for (band, out) in bands.iter().zip(outs) {
            place(band, out);
        }
    } else {
        for band in bands {
            place(band, run_band(band));
        }
    }
}

/// The windows of an unpadded conv as channels of a dense input of the output's
/// shape: for each of `planes` planes, one channel per tap `(kd, kh, kw)`, whose
/// output `(d, h, w)` is input `(d·sd + kd·dd, h·sh + kh·dh, w·sw + kw·dw)`.
fn gather_windows(x: &[f32], planes: usize, g: &Win3) -> Vec<f32> {
    let [od, oh, ow] = g.out;
    let [_, ih, iw] = g.input;
    let [sd, sh, sw] = g.stride;
    let [kd, kh, kw] = g.kernel;
    let [dd, dh, dw] = g.dil;
    let out_vol = g.out_vol();
    let mut dense = crate::buffers::take::<f32>(planes * g.k_vol() * out_vol);
    // A kernel row of two taps at stride 2 is one input row split into its two
    // column phases (a loop that vectorizes; `step_by` does not).
    let pairs = kw == 2 && sw == 2 && dw == 1;
    for p in 0..planes {
        let plane = &x[p * g.in_vol()..][..g.in_vol()];
        for (a, b) in (0..kd).flat_map(|a| (0..kh).map(move |b| (a, b))) {
            let tap_row = (p * kd + a) * kh + b;
            let taps = &mut dense[tap_row * kw * out_vol..][..kw * out_vol];
            for (d, h) in (0..od).flat_map(|d| (0..oh).map(move |h| (d, h))) {
                let src = &plane[((d * sd + a * dd) * ih + h * sh + b * dh) * iw..][..iw];
                let at = (d * oh + h) * ow;
                if pairs {
                    let (t0, t1) = taps.split_at_mut(out_vol);
                    split_row_stride2(&src[..2 * ow], 0, &mut t0[at..][..ow], &mut t1[at..][..ow]);
                    continue;
                }
                for c in 0..kw {
                    let dst = &mut taps[c * out_vol + at..][..ow];
                    for (v, &s) in dst.iter_mut().zip(src[c * dw..].iter().step_by(sw)) {
                        *v = s;
                    }
                }
            }
        }
    }
    dense
}

/// `s` as f32 values, when `T` is f32.
pub(crate) fn f32_slice_mut<T: 'static>(s: &mut [T]) -> Option<&mut [f32]> {
    if TypeId::of::<T>() != TypeId::of::<f32>() {
        return None;
    }
    // SAFETY: T is f32, so the slice's memory holds exactly `len` f32 values.
    Some(unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<f32>(), s.len()) })
}

/// Unfolds output rows `[r0, r1)` (a row is one (d, h) pair) of one image group into
/// `col`, a `[cg * k_vol, (r1 - r0) * out_w]` row-major matrix.
fn im2col<T: Scalar>(x: &[T], cg: usize, g: &Win3, r0: usize, r1: usize, col: &mut [T]) {
    let [_, ih, iw] = g.input;
    let [_, oh, ow] = g.out;
    let [kd, kh, kw] = g.kernel;
    let cols = (r1 - r0) * ow;
    let mut krow = 0;
    for ci in 0..cg {
        let xc = &x[ci * g.in_vol()..][..g.in_vol()];
        for a in 0..kd {
            for b in 0..kh {
                for cc in 0..kw {
                    let dst = &mut col[krow * cols..][..cols];
                    krow += 1;
                    let (lo, hi, off) = g.inner_range(cc);
                    for (ri, r) in (r0..r1).enumerate() {
                        let out = &mut dst[ri * ow..][..ow];
                        let (od, oh_) = (r / oh, r % oh);
                        let src = match (g.src(0, od, a), g.src(1, oh_, b)) {
                            (Some(id), Some(ihh)) => &xc[(id * ih + ihh) * iw..][..iw],
                            _ => {
                                out.fill(T::zero());
                                continue;
                            }
                        };
                        if lo >= hi {
                            out.fill(T::zero());
                            continue;
                        }
                        out[..lo].fill(T::zero());
                        out[hi..].fill(T::zero());
                        if g.stride[2] == 1 {
                            let s0 = (lo as isize + off) as usize;
                            out[lo..hi].copy_from_slice(&src[s0..s0 + (hi - lo)]);
                        } else {
                            let s = g.stride[2];
                            for (o, v) in (lo..hi).zip(out[lo..hi].iter_mut()) {
                                *v = src[((o * s) as isize + off) as usize];
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Direct conv for one input channel per group: each output plane (image, channel) is
/// one parallel task that adds every kernel tap's contribution row by row.
#[allow(clippy::too_many_arguments)]
pub(super) fn depthwise<T: Scalar>(
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    y: &mut [T],
    g: &Win3,
    m: usize,
    mg: usize,
    tail: Option<&Tail>,
) {
    let (in_vol, out_vol, k_vol) = (g.in_vol(), g.out_vol(), g.k_vol());
    let c = m / mg;
    let plane = |scratch: &mut DwScratch<T>, (i, out): (usize, &mut [T])| {
        let (b, mo) = (i / m, i % m);
        let xc = &x[(b * c + mo / mg) * in_vol..][..in_vol];
        let start = bias.map_or(T::zero(), |b| b[mo]);
        dw_plane(xc, &w[mo * k_vol..][..k_vol], start, out, g, scratch);
        if let (Some(t), Some(of)) = (tail, f32_slice_mut(out)) {
            t.apply(i * out_vol, of);
        }
    };
    super::broadcast::for_chunks_with_scratch(y, out_vol, y.len() * k_vol >= 1 << 18, plane);
}

/// Buffers [`dw_plane`] reuses from plane to plane: on the small planes of mobile
/// nets (two rows of 96), allocating them per plane was a visible part of the conv.
struct DwScratch<T> {
    /// The input plane with its zero padding.
    padded: Vec<T>,
    /// Each kernel tap's weight and offset from an output's first tap in `padded`.
    taps: Vec<(T, usize)>,
    /// The taps of one output row that fall inside the data (3-D kernels only; for
    /// 2-D ones they are a run of `taps`).
    row_taps: Vec<(T, usize)>,
    /// Outputs over the padded width, for the stride-1 path of [`dw_plane`].
    flat: Vec<T>,
    /// Whether `padded` holds the padding as zeros: a scratch serves the planes of
    /// one conv, and planes after the first copy only their data rows.
    zeroed: bool,
    /// A row of zeros, read for rows in the padding by [`super::dw_rows`].
    zeros: Vec<T>,
}

impl<T> Default for DwScratch<T> {
    fn default() -> Self {
        DwScratch {
            padded: Vec::new(),
            taps: Vec::new(),
            row_taps: Vec::new(),
            flat: Vec::new(),
            zeroed: false,
            zeros: Vec::new(),
        }
    }
}

/// One depthwise output plane: every output is `start` (the bias, or zero) plus its
/// taps.
///
/// f32 planes of stride 1 or 2 at least 16 outputs wide go to [`super::dw_rows`]
/// where the CPU has AVX-512 (same sums, several output rows per load, no padded
/// copy).
///
/// The input plane is first copied into a buffer with its zero padding, so every tap
/// of every output reads inside the buffer. Each block of outputs of a row then sums
/// all taps in registers and is stored once. Taps are added in (depth, row, column)
/// order; padding columns are added as `w·0`.
///
/// With stride 1 (2-D), output `(h, w)` reads the buffer at `h·width + w` plus each
/// tap's offset, so all outputs of the plane, computed over the padded width, form
/// one row: every block of 64 keeps eight sums in flight, where rows of 7, 14 or 28
/// outputs left one chain of dependent multiply-adds per block of 8 (a quarter of
/// MobileNetV2's time). Kernel rows in the height padding then add `w·0` too, and
/// the outputs in padding columns are computed and dropped. Otherwise, row by row,
/// kernel rows in the depth or height padding are skipped. The whole function is
/// compiled for AVX-512 or AVX2, with FMA, when available; there each tap is one fused
/// multiply-add (half the instructions of a multiply and an add, and one rounding),
/// elsewhere a multiply and an add.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma"))]
fn dw_plane<T: Scalar>(
    xc: &[T],
    wk: &[T],
    start: T,
    out: &mut [T],
    g: &Win3,
    scratch: &mut DwScratch<T>,
) {
    #[cfg(target_arch = "x86_64")]
    if g.out[0] == 1
        && g.kernel[0] == 1
        && g.stride[0] == 1
        && g.stride[1] == g.stride[2]
        && g.pad.iter().all(|&p| p >= 0)
        && let (Some(x), Some(w), Some(y), Some(&b)) = (
            f32_slice(xc),
            f32_slice(wk),
            f32_slice_mut(out),
            f32_slice(std::slice::from_ref(&start)).and_then(|s| s.first()),
        )
        && super::dw_rows::fits(g.out[2], w.len(), g.kernel[2], g.dil[2], g.stride[2])
    {
        if scratch.zeros.len() < g.input[2] {
            scratch.zeros.resize(g.input[2], T::zero());
        }
        let input = super::dw_rows::Input {
            x,
            zeros: f32_slice(&scratch.zeros).expect("T is f32, as x is"),
            ih: g.input[1],
            iw: g.input[2],
            top: g.pad[1] as usize,
            left: g.pad[2] as usize,
        };
        let taps = super::dw_rows::Taps {
            w,
            kh: g.kernel[1],
            kw: g.kernel[2],
            dh: g.dil[1],
            dw: g.dil[2],
        };
        super::dw_rows::plane(&input, &taps, g.stride[2], b, y, g.out[2]);
        return;
    }
    let DwScratch {
        padded: buf,
        taps,
        row_taps,
        flat,
        zeroed,
        ..
    } = scratch;
    // Padded extent each axis needs: the last output's last tap, plus one.
    let (ed, eh, ew) = (g.reach(0), g.reach(1), g.reach(2));
    // The buffer is reused plane after plane. Its padding (rows in the depth or height
    // padding, the padding columns of data rows) and, past the plane, zeros that the
    // last block of a row may read for outputs beyond the row's end (see `dw_row`),
    // are written once per geometry; each plane then copies only its data. On the
    // 7x7 planes of late MobileNet stages, filling and copying row by row with
    // library calls took longer than the arithmetic.
    if g.out[0] == 1 && g.kernel[0] == 1 && g.stride == [1, 2, 2] {
        let fma = multiversion::target::target_cfg_f!(target_feature = "fma");
        dw_plane_stride2(xc, wk, start, out, g, scratch, fma);
        return;
    }
    let slack = TAIL * g.stride[2];
    let [id_n, ih_n, iw_n] = g.input;
    let pad = g.pad.map(|p| p as usize);
    let cols = iw_n.min(ew.saturating_sub(pad[2]));
    // A stride wider than the data can leave the left padding past `ew`.
    let left = pad[2].min(ew);
    if !*zeroed {
        buf.clear();
        buf.resize(ed * eh * ew + slack, T::zero());
        *zeroed = true;
    }
    for d in 0..ed {
        let Some(dd) = d.checked_sub(pad[0]).filter(|&d| d < id_n) else {
            continue;
        };
        for hh in 0..ih_n.min(eh.saturating_sub(pad[1])) {
            let to = (d * eh + hh + pad[1]) * ew + left;
            let from = (dd * ih_n + hh) * iw_n;
            copy_short(&mut buf[to..][..cols], &xc[from..][..cols]);
        }
    }
    if taps.len() != wk.len() {
        // The offsets are the same for every plane; only the weights change.
        taps.clear();
        for a in 0..g.kernel[0] {
            for b in 0..g.kernel[1] {
                for c in 0..g.kernel[2] {
                    let off = ((a * g.dil[0]) * eh + b * g.dil[1]) * ew + c * g.dil[2];
                    taps.push((T::zero(), off));
                }
            }
        }
    }
    for (tap, &wv) in taps.iter_mut().zip(wk) {
        tap.0 = wv;
    }
    let [od_n, oh_n, ow_n] = g.out;
    let fma = multiversion::target::target_cfg_f!(target_feature = "fma");
    if od_n == 1 && g.kernel[0] == 1 && g.stride[1] == 1 && g.stride[2] == 1 {
        dw_flat(out, ow_n, ew, start, buf, taps, flat, fma);
        return;
    }
    // Whether padded position `p` on axis `a` is inside the data.
    let inside = |a: usize, p: usize| p >= pad[a] && p - pad[a] < g.input[a];
    let kw = g.kernel[2];
    for od in 0..od_n {
        for oh in 0..oh_n {
            // Kernel rows that fall wholly in the depth or height padding add nothing
            // but w·0, so they are left out (on MobileNet-style nets with 5x5 kernels
            // over planes two or three rows high, most of them).
            let row_inside = |b: usize| inside(1, oh * g.stride[1] + b * g.dil[1]);
            let these: &[(T, usize)] = if g.kernel[0] == 1 {
                // Rows inside the data are a run of kernel rows, so their taps are a
                // run of `taps`.
                let first = (0..g.kernel[1]).find(|&b| row_inside(b));
                match (inside(0, od * g.stride[0]), first) {
                    (true, Some(b0)) => {
                        let b1 = (b0..g.kernel[1]).find(|&b| !row_inside(b));
                        &taps[b0 * kw..b1.unwrap_or(g.kernel[1]) * kw]
                    }
                    _ => &[],
                }
            } else {
                row_taps.clear();
                for a in 0..g.kernel[0] {
                    for b in 0..g.kernel[1] {
                        if inside(0, od * g.stride[0] + a * g.dil[0]) && row_inside(b) {
                            let k = (a * g.kernel[1] + b) * kw;
                            row_taps.extend_from_slice(&taps[k..][..kw]);
                        }
                    }
                }
                row_taps
            };
            let orow = &mut out[(od * oh_n + oh) * ow_n..][..ow_n];
            let row = &buf[(od * g.stride[0] * eh + oh * g.stride[1]) * ew..];
            // Literal strides let the common cases compile to plain or paired loads.
            match (g.stride[2], fma) {
                (1, true) => dw_row::<T, 1, true>(orow, start, row, these, 1),
                (2, true) => dw_row::<T, 2, true>(orow, start, row, these, 2),
                (s, true) => dw_row::<T, 0, true>(orow, start, row, these, s),
                (1, false) => dw_row::<T, 1, false>(orow, start, row, these, 1),
                (2, false) => dw_row::<T, 2, false>(orow, start, row, these, 2),
                (s, false) => dw_row::<T, 0, false>(orow, start, row, these, s),
            }
        }
    }
}

/// `dst.copy_from_slice(src)` for rows of a few to a few dozen values, without a call
/// to `memcpy`: fixed-size blocks of 8 or 4, the last one overlapping the one before.
#[inline(always)]
fn copy_short<T: Copy>(dst: &mut [T], src: &[T]) {
    #[inline(always)]
    fn blocks<T: Copy, const B: usize>(dst: &mut [T], src: &[T]) {
        let n = dst.len();
        let block = |dst: &mut [T], at: usize| {
            let s: &[T; B] = src[at..at + B].try_into().unwrap();
            let d: &mut [T; B] = (&mut dst[at..at + B]).try_into().unwrap();
            *d = *s;
        };
        for at in (0..n - B + 1).step_by(B) {
            block(dst, at);
        }
        block(dst, n - B);
    }
    assert_eq!(dst.len(), src.len());
    match dst.len() {
        8.. => blocks::<T, 8>(dst, src),
        4.. => blocks::<T, 4>(dst, src),
        _ => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = *s;
            }
        }
    }
}

/// [`dw_plane`] for 2-D convs of stride 2: the padded plane is split into four phase
/// planes (padded row `r`, column `c` go to plane `(r % 2, c % 2)`, row `r / 2`,
/// column `c / 2`), where each tap reads consecutive values for consecutive outputs,
/// so the plane's outputs are one row over the phase width, computed as for stride 1
/// (row by row with strided loads, this conv ran at a third of the stride-1 rate).
/// Taps are added in the same order, so the sums are the same.
#[inline(always)]
fn dw_plane_stride2<T: Scalar>(
    xc: &[T],
    wk: &[T],
    start: T,
    out: &mut [T],
    g: &Win3,
    scratch: &mut DwScratch<T>,
    fma: bool,
) {
    let DwScratch {
        padded: buf,
        taps,
        flat,
        zeroed,
        ..
    } = scratch;
    let [_, ih, iw] = g.input;
    let [_, oh, ow] = g.out;
    let [_, kh, kw] = g.kernel;
    let [_, dh, dw] = g.dil;
    let (ph, pw) = (g.pad[1] as usize, g.pad[2] as usize);
    // Padded extent, and the rows and columns of each phase plane.
    let eh = (oh - 1) * 2 + (kh - 1) * dh + 1;
    let ew = (ow - 1) * 2 + (kw - 1) * dw + 1;
    let (rows, width) = (eh.div_ceil(2), ew.div_ceil(2));
    let plane = rows * width;
    if !*zeroed {
        buf.clear();
        buf.resize(4 * plane + TAIL, T::zero());
        *zeroed = true;
    }
    let cols = iw.min(ew.saturating_sub(pw));
    for h in 0..ih.min(eh.saturating_sub(ph)) {
        let r = h + ph;
        let at = |pc: usize| ((r % 2 * 2 + pc) * rows + r / 2) * width;
        let (head, tail) = buf.split_at_mut(at(1));
        split_row_stride2(&xc[h * iw..][..cols], pw, &mut head[at(0)..], tail);
    }
    if taps.len() != wk.len() {
        taps.clear();
        for b in 0..kh {
            for c in 0..kw {
                let (r, cc) = (b * dh, c * dw);
                let off = ((r % 2 * 2 + cc % 2) * rows + r / 2) * width + cc / 2;
                taps.push((T::zero(), off));
            }
        }
    }
    for (tap, &wv) in taps.iter_mut().zip(wk) {
        tap.0 = wv;
    }
    dw_flat(out, ow, width, start, buf, taps, flat, fma);
}

/// The outputs of a plane whose output `(h, w)` reads `buf` at `h·width + w` plus
/// each tap's offset: all of them as one row over `width` (the positions between
/// output rows are computed and dropped), copied out row by row.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn dw_flat<T: Scalar>(
    out: &mut [T],
    ow: usize,
    width: usize,
    start: T,
    buf: &[T],
    taps: &[(T, usize)],
    flat: &mut Vec<T>,
    fma: bool,
) {
    let oh = out.len() / ow;
    let flat = &mut scratch_flat(flat, (oh - 1) * width + ow);
    if fma {
        dw_row::<T, 1, true>(flat, start, buf, taps, 1);
    } else {
        dw_row::<T, 1, false>(flat, start, buf, taps, 1);
    }
    for (h, orow) in out.chunks_exact_mut(ow).enumerate() {
        copy_short(orow, &flat[h * width..][..ow]);
    }
}

/// `v` resized to `n` elements (stale contents).
fn scratch_flat<T: Scalar>(v: &mut Vec<T>, n: usize) -> &mut [T] {
    v.resize(n, T::zero());
    &mut v[..n]
}

/// One output row of a depthwise conv: output `j` is `start` plus `w · row[off + j·s]`
/// per tap. `S` is the width stride when known at compile time, 0 when only `s` gives
/// it; `FMA` makes each tap a fused multiply-add.
///
/// Outputs are summed in registers, in blocks of 64, then the rest as one block of
/// 16, 32, 48 or 64 whose extra lanes read past the row (into the next row or the
/// plane's slack) and are dropped. A block needs several independent sums to hide
/// the latency of a multiply-add; output by output, or in blocks of 8 with one sum
/// each, the last outputs of rows of 7, 14 or 28 columns took most of the conv's
/// time. Every lane adds the same taps in the same order, so the kept lanes are what
/// a one-by-one loop gives.
#[inline(always)]
fn dw_row<T: Scalar, const S: usize, const FMA: bool>(
    orow: &mut [T],
    start: T,
    row: &[T],
    taps: &[(T, usize)],
    s: usize,
) {
    let s = if S == 0 { s } else { S };
    let n = orow.len();
    let e64 = n / 64 * 64;
    dw_blocks::<T, S, 64, FMA>(&mut orow[..e64], start, 0, row, taps, s);
    if e64 < n {
        let mut block = [start; TAIL];
        let b = &mut block[..];
        match (n - e64).div_ceil(16) {
            1 => dw_blocks::<T, S, 16, FMA>(&mut b[..16], start, e64, row, taps, s),
            2 => dw_blocks::<T, S, 32, FMA>(&mut b[..32], start, e64, row, taps, s),
            3 => dw_blocks::<T, S, 48, FMA>(&mut b[..48], start, e64, row, taps, s),
            _ => dw_blocks::<T, S, 64, FMA>(b, start, e64, row, taps, s),
        }
        copy_short(&mut orow[e64..], &block[..n - e64]);
    }
}

/// Outputs of a row's last block, computed together even where fewer remain.
const TAIL: usize = 64;

/// `acc + w·x`, fused when `FMA`.
#[inline(always)]
fn tap<T: Scalar, const FMA: bool>(acc: T, w: T, x: T) -> T {
    if FMA { w.mul_add(x, acc) } else { acc + w * x }
}

/// [`dw_row`] on outputs `first..` that come in whole blocks of `B`.
#[inline(always)]
fn dw_blocks<T: Scalar, const S: usize, const B: usize, const FMA: bool>(
    outs: &mut [T],
    start: T,
    first: usize,
    row: &[T],
    taps: &[(T, usize)],
    s: usize,
) {
    let s = if S == 0 { s } else { S };
    for (bi, block) in outs.chunks_exact_mut(B).enumerate() {
        let mut acc = [start; B];
        for &(wv, off) in taps {
            let src = &row[off + (first + bi * B) * s..][..(B - 1) * s + 1];
            for (j, a) in acc.iter_mut().enumerate() {
                *a = tap::<T, FMA>(*a, wv, src[j * s]);
            }
        }
        block.copy_from_slice(&acc);
    }
}

struct ConvTransposeKernel {
    attrs: WindowAttrs,
    group: usize,
    output_padding: Option<Vec<usize>>,
    output_shape: Option<Vec<usize>>,
}

impl ConvTransposeKernel {
    fn new(spec: &NodeSpec) -> Result<Self, OpError> {
        let group = spec.attrs.int_or("group", 1)?;
        if group < 1 {
            return Err(OpError::invalid(format!("group {group}")));
        }
        let nonneg = |name: &str| -> Result<Option<Vec<usize>>, OpError> {
            match spec.attrs.ints(name)? {
                None => Ok(None),
                Some(v) if v.iter().all(|&x| x >= 0) => {
                    Ok(Some(v.into_iter().map(|x| x as usize).collect()))
                }
                Some(v) => Err(OpError::invalid(format!("{name} {v:?}"))),
            }
        };
        Ok(ConvTransposeKernel {
            attrs: WindowAttrs::parse(spec)?,
            group: group as usize,
            output_padding: nonneg("output_padding")?,
            output_shape: nonneg("output_shape")?,
        })
    }

    /// Begin/end pads and output size per spatial dim, following the ONNX reference.
    fn geometry(
        &self,
        input: &[usize],
        kernel: &[usize],
    ) -> Result<(Vec<isize>, Vec<usize>, Window), OpError> {
        let n = input.len();
        let stride = WindowAttrs::per_dim(&self.attrs.strides, n, "strides", 1)?;
        let dil = WindowAttrs::per_dim(&self.attrs.dilations, n, "dilations", 1)?;
        let opad = WindowAttrs::per_dim(&self.output_padding, n, "output_padding", 0)?;
        let oshape = self
            .output_shape
            .as_ref()
            .map(|s| s[s.len().saturating_sub(n)..].to_vec());
        if let Some(s) = &oshape
            && s.len() != n
        {
            return Err(OpError::invalid(format!(
                "output_shape {s:?} for {n} spatial dims"
            )));
        }
        let full: Vec<isize> = (0..n)
            .map(|i| {
                (stride[i] * (input[i].max(1) - 1) + opad[i] + (kernel[i] - 1) * dil[i] + 1)
                    as isize
            })
            .collect();
        let mut pb = vec![0isize; n];
        let mut out = vec![0usize; n];
        let same = matches!(self.attrs.auto_pad, AutoPad::SameUpper | AutoPad::SameLower);
        if self.attrs.pads.is_some() && !same
            || (self.attrs.auto_pad == AutoPad::NotSet && oshape.is_none())
            || self.attrs.auto_pad == AutoPad::Valid
        {
            let p = match (&self.attrs.pads, self.attrs.auto_pad) {
                (Some(p), AutoPad::NotSet) => p.clone(),
                _ => vec![0; 2 * n],
            };
            if p.len() != 2 * n {
                return Err(OpError::invalid(format!("pads {p:?} for {n} spatial dims")));
            }
            for i in 0..n {
                pb[i] = p[i] as isize;
                let o = full[i] - p[i] as isize - p[i + n] as isize;
                if o < 0 {
                    return Err(OpError::invalid("ConvTranspose pads exceed the output"));
                }
                out[i] = o as usize;
            }
            if let Some(s) = &oshape {
                // Explicit pads and output_shape: the shape wins; extra room is zero.
                out.clone_from(s);
            }
        } else {
            let target: Vec<usize> = match &oshape {
                Some(s) => s.clone(),
                None => (0..n).map(|i| input[i] * stride[i]).collect(),
            };
            for i in 0..n {
                let total = full[i] - target[i] as isize;
                let half = total.div_euclid(2);
                pb[i] = if self.attrs.auto_pad == AutoPad::SameUpper {
                    half
                } else {
                    total - half
                };
                out[i] = target[i];
            }
        }
        let win = Window {
            kernel: kernel.to_vec(),
            stride,
            dil,
            pad_begin: vec![0; n],
            pad_end: vec![0; n],
            out,
        };
        Ok((pb, win.out.clone(), win))
    }

    fn run_typed<T: Scalar>(
        &self,
        x: &[T],
        xs: &[usize],
        w: &[T],
        ws: &[usize],
        bias: Option<&[T]>,
    ) -> Result<(Vec<T>, Vec<usize>), OpError> {
        if xs.len() < 3 || ws.len() != xs.len() {
            return Err(OpError::invalid(format!(
                "ConvTranspose input {xs:?} and weight {ws:?}"
            )));
        }
        let group = self.group;
        let (n, c) = (xs[0], xs[1]);
        let (wc, mg) = (ws[0], ws[1]);
        if wc != c || c % group != 0 {
            return Err(OpError::invalid(format!(
                "ConvTranspose input {xs:?}, weight {ws:?}, group {group}"
            )));
        }
        let kernel = &ws[2..];
        if let Some(ks) = &self.attrs.kernel_shape
            && ks.as_slice() != kernel
        {
            return Err(OpError::invalid(format!(
                "kernel_shape {ks:?} but weight {ws:?}"
            )));
        }
        let m = mg * group;
        let cg = c / group;
        if let Some(b) = bias
            && b.len() != m
        {
            return Err(OpError::invalid(format!(
                "bias of {} values for {m} channels",
                b.len()
            )));
        }
        let (pb, out, win) = self.geometry(&xs[2..], kernel)?;
        // Reuse Win3 with the roles of input and output swapped: `src(a, i, k)` maps an
        // input position and tap to the output position it contributes to.
        let mut g3 = Win3::new(&out, &win)?;
        let nsp = xs.len() - 2;
        let mut pad = [0isize; 3];
        pad[3 - nsp..].copy_from_slice(&pb);
        g3.pad = pad;
        let mut xin = [1usize; 3];
        xin[3 - nsp..].copy_from_slice(&xs[2..]);
        let (in_vol, out_vol, k_vol) = (xin.iter().product::<usize>(), g3.in_vol(), g3.k_vol());
        let mut shape = vec![n, m];
        shape.extend_from_slice(&out);
        let tiled = g3.kernel == g3.stride
            && g3.dil == [1, 1, 1]
            && pad == [0, 0, 0]
            && (0..3).all(|a| g3.input[a] == xin[a] * g3.stride[a]);
        if tiled && n * m * out_vol > 0 {
            let y = transpose_tiled(x, w, bias, n, group, cg, mg, &g3, xin);
            return Ok((y, shape));
        }
        let mut y = vec![T::zero(); n * m * out_vol];
        if let Some(b) = bias {
            for (i, plane) in y.chunks_mut(out_vol.max(1)).enumerate() {
                plane.fill(b[i % m]);
            }
        }
        if y.is_empty() {
            return Ok((y, shape));
        }
        let rows = mg * k_vol;
        T::with_scratch(rows * in_vol, |cols| {
            for b in 0..n {
                for gi in 0..group {
                    let xg = &x[(b * c + gi * cg) * in_vol..][..cg * in_vol];
                    let wg = &w[gi * cg * rows..][..cg * rows];
                    gu::gemm(
                        rows,
                        in_vol,
                        cg,
                        MatRef::transposed(wg, rows),
                        MatRef::row_major(xg, in_vol),
                        cols,
                        in_vol,
                        false,
                        T::one(),
                    );
                    let cols = &*cols;
                    let yb = &mut y[(b * m + gi * mg) * out_vol..][..mg * out_vol];
                    let col2im = |(mo, plane): (usize, &mut [T])| {
                        col2im_plane(
                            &cols[mo * k_vol * in_vol..][..k_vol * in_vol],
                            plane,
                            &g3,
                            xin,
                        );
                    };
                    if yb.len() * k_vol < (1 << 18) || !crate::par::enabled() {
                        yb.chunks_mut(out_vol).enumerate().for_each(col2im);
                    } else {
                        yb.par_chunks_mut(out_vol).enumerate().for_each(col2im);
                    }
                }
            }
        });
        Ok((y, shape))
    }
}

/// Input rows (d, h pairs) per task of [`transpose_tiled`]: enough columns for an
/// efficient GEMM while the columns block stays in L2.
const TILED_COLS: usize = 1024;

/// ConvTranspose whose windows tile the output without overlap (kernel = stride, no
/// padding or dilation): every output element receives exactly one tap, so a block of
/// input rows is multiplied into a small column buffer and scattered straight to its
/// output rows, with no full-size column matrix and no accumulation pass. Tasks are
/// (image, group, row block) triples fixed by the shapes. Each output is `init + v`
/// with `init` the bias or zero, the same arithmetic as the general path's col2im.
#[allow(clippy::too_many_arguments)]
fn transpose_tiled<T: Scalar>(
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    n: usize,
    group: usize,
    cg: usize,
    mg: usize,
    g: &Win3,
    xin: [usize; 3],
) -> Vec<T> {
    let m = mg * group;
    let [id_n, ih_n, iw_n] = xin;
    let [_, oh_n, ow_n] = g.input;
    let [kd, kh, kw] = g.kernel;
    let (in_vol, out_vol, k_vol) = (id_n * ih_n * iw_n, g.in_vol(), g.k_vol());
    let rows = mg * k_vol;
    let in_rows = id_n * ih_n;
    let rows_per_task = (TILED_COLS / iw_n.max(1)).clamp(1, in_rows);
    let chunks = in_rows.div_ceil(rows_per_task);
    // Every element is written below (the windows tile the output).
    let mut y = crate::buffers::take::<T>(n * m * out_vol);
    let yp = SendPtr(y.as_mut_ptr());
    let task = |buf: &mut Vec<T>, t: usize| {
        let chunk = t % chunks;
        let (b, gi) = (t / chunks / group, t / chunks % group);
        let r0 = chunk * rows_per_task;
        let r1 = (r0 + rows_per_task).min(in_rows);
        let cols = (r1 - r0) * iw_n;
        buf.resize(rows * cols, T::zero());
        let xg = &x[(b * group * cg + gi * cg) * in_vol + r0 * iw_n..];
        let wg = &w[gi * cg * rows..][..cg * rows];
        gu::gemm_serial(
            rows,
            cols,
            cg,
            MatRef::transposed(wg, rows),
            MatRef {
                data: xg,
                rs: in_vol,
                cs: 1,
            },
            buf,
            cols,
            false,
            T::one(),
        );
        let yp = yp;
        for mo in 0..mg {
            let ch = gi * mg + mo;
            let init = bias.map_or(T::zero(), |bv| bv[ch]);
            // SAFETY: this task alone writes the output rows of input rows [r0, r1)
            // of channel `ch` of image `b` (windows do not overlap), inside `y`.
            let plane = unsafe {
                std::slice::from_raw_parts_mut(yp.0.add((b * m + ch) * out_vol), out_vol)
            };
            for r in r0..r1 {
                let (id, ih) = (r / ih_n, r % ih_n);
                for a in 0..kd {
                    for bb in 0..kh {
                        let od = id * kd + a;
                        let oh = ih * kh + bb;
                        let orow = &mut plane[(od * oh_n + oh) * ow_n..][..ow_n];
                        for cc in 0..kw {
                            let k = (a * kh + bb) * kw + cc;
                            let src = &buf[(mo * k_vol + k) * cols + (r - r0) * iw_n..][..iw_n];
                            for (o, &v) in orow[cc..].iter_mut().step_by(kw).zip(src) {
                                *o = init + v;
                            }
                        }
                    }
                }
            }
        }
    };
    let tasks = n * group * chunks;
    if tasks == 1 || n * m * out_vol * cg < (1 << 20) || !crate::par::enabled() {
        let mut buf = Vec::new();
        (0..tasks).for_each(|t| task(&mut buf, t));
    } else {
        (0..tasks).into_par_iter().for_each_init(Vec::new, task);
    }
    y
}

/// Adds the columns of one output channel (`[k_vol, in_vol]`) into its output plane.
/// `g` describes the output as its "input" (see `run_typed`), `xin` the input dims.
fn col2im_plane<T: Scalar>(cols: &[T], plane: &mut [T], g: &Win3, xin: [usize; 3]) {
    let [id_n, ih_n, iw_n] = xin;
    let [_, oh_n, ow_n] = g.input;
    let [kd, kh, kw] = g.kernel;
    let in_vol = id_n * ih_n * iw_n;
    let s = g.stride[2] as isize;
    let mut k = 0;
    for a in 0..kd {
        for bb in 0..kh {
            for cc in 0..kw {
                let src = &cols[k * in_vol..][..in_vol];
                k += 1;
                let off = (cc * g.dil[2]) as isize - g.pad[2];
                // Input columns whose target `iw * s + off` lies inside the output row.
                let lo = if off >= 0 {
                    0
                } else {
                    ((-off + s - 1) / s) as usize
                };
                let hi = (((ow_n as isize - off) + s - 1) / s).clamp(0, iw_n as isize) as usize;
                if lo >= hi {
                    continue;
                }
                for id in 0..id_n {
                    let Some(od) = g.src(0, id, a) else { continue };
                    for ih in 0..ih_n {
                        let Some(oh) = g.src(1, ih, bb) else { continue };
                        let orow = &mut plane[(od * oh_n + oh) * ow_n..][..ow_n];
                        let irow = &src[(id * ih_n + ih) * iw_n..][lo..hi];
                        let o0 = (lo as isize * s + off) as usize;
                        if s == 1 {
                            for (o, &v) in orow[o0..o0 + irow.len()].iter_mut().zip(irow) {
                                *o += v;
                            }
                        } else {
                            for (o, &v) in orow[o0..].iter_mut().step_by(s as usize).zip(irow) {
                                *o += v;
                            }
                        }
                    }
                }
            }
        }
    }
}

impl Kernel for ConvTransposeKernel {
    fn run(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        let x = input(inputs, 0)?;
        let w = input(inputs, 1)?;
        let b = opt_input(inputs, 2);
        match (x, w) {
            (Tensor::F32(xa), Tensor::F32(wa)) => {
                let bias = match b {
                    None => None,
                    Some(Tensor::F32(ba)) => Some(contiguous(ba)),
                    Some(o) => return Err(OpError::invalid(format!("bias of type {}", o.dtype()))),
                };
                let (y, s) = self.run_typed(
                    &contiguous(xa),
                    xa.shape(),
                    &contiguous(wa),
                    wa.shape(),
                    bias.as_deref(),
                )?;
                Ok(vec![Tensor::F32(array(&s, y)?)])
            }
            (Tensor::F64(xa), Tensor::F64(wa)) => {
                let bias = match b {
                    None => None,
                    Some(Tensor::F64(ba)) => Some(contiguous(ba)),
                    Some(o) => return Err(OpError::invalid(format!("bias of type {}", o.dtype()))),
                };
                let (y, s) = self.run_typed(
                    &contiguous(xa),
                    xa.shape(),
                    &contiguous(wa),
                    wa.shape(),
                    bias.as_deref(),
                )?;
                Ok(vec![Tensor::F64(array(&s, y)?)])
            }
            _ => Err(OpError::unsupported(format!(
                "ConvTranspose on {} input and {} weight",
                x.dtype(),
                w.dtype()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    /// A 1x1 conv of one group on one position (the `gemv` path) sums each output in
    /// order of the input channels from its bias, with fused multiply-adds: batches, a
    /// partial panel of 64 outputs, with and without a bias.
    #[test]
    fn one_position_sums_in_order_from_the_bias() {
        // The gemv path needs AVX2 and FMA (or AVX-512), whose products are fused.
        if crate::cpu::conv_isa().is_none() {
            return;
        }
        let values = super::super::conv_direct::tests::values;
        let attrs = super::WindowAttrs {
            auto_pad: super::AutoPad::NotSet,
            kernel_shape: None,
            strides: None,
            dilations: None,
            pads: None,
        };
        for (n, c, m) in [(1, 960, 240), (2, 24, 72), (3, 7, 130)] {
            let x = values(n * c, c as u64);
            let w = values(m * c, m as u64);
            let bias = values(m, 7);
            for b in [None, Some(&bias[..])] {
                let (got, shape, _) = super::conv_nd(
                    &x,
                    &[n, c, 1, 1],
                    &w,
                    &[m, c, 1, 1],
                    b,
                    &attrs,
                    1,
                    None,
                    None,
                    super::Layouts::default(),
                )
                .unwrap();
                assert_eq!(shape, [n, m, 1, 1]);
                for (j, a) in got.iter().enumerate() {
                    let (bi, mo) = (j / m, j % m);
                    let start = b.map_or(0.0f32, |b| b[mo]);
                    let want = (0..c).fold(start, |s, k| x[bi * c + k].mul_add(w[mo * c + k], s));
                    assert_eq!(a.to_bits(), want.to_bits(), "{n}x{c}->{m}, output {j}");
                }
            }
        }
    }

    /// Four outputs side by side give each output the sums of one at a time: eight
    /// running sums over the input channels, folded, then the channels left over,
    /// then the bias. Groups, batches, a partial group of four and leftover channels.
    #[test]
    fn single_position_sums_like_one_output_at_a_time() {
        let values = super::super::conv_direct::tests::values;
        for (n, c, m, group) in [(2, 40, 6, 2), (1, 19, 9, 1), (1, 960, 240, 1), (3, 7, 5, 1)] {
            let (cg, mg) = (c / group, m / group);
            let x = values(n * c, c as u64);
            let w = values(m * cg, m as u64);
            let bias = values(m, 7);
            for b in [None, Some(&bias[..])] {
                let mut want = vec![0.0f32; n * m];
                for (bi, ys) in want.chunks_exact_mut(m).enumerate() {
                    for (mo, out) in ys.iter_mut().enumerate() {
                        let xs = &x[bi * c + (mo / mg) * cg..][..cg];
                        let ws = &w[mo * cg..][..cg];
                        let mut lanes = [0.0f32; 8];
                        let chunks = cg / 8 * 8;
                        for k in 0..chunks {
                            lanes[k % 8] += ws[k] * xs[k];
                        }
                        let mut sum = lanes.iter().fold(0.0, |a, &l| a + l);
                        for k in chunks..cg {
                            sum += ws[k] * xs[k];
                        }
                        *out = b.map_or(sum, |b| b[mo] + sum);
                    }
                }
                let mut got = vec![f32::NAN; n * m];
                super::single_position(&x, &w, b, &mut got, c, m, group);
                for (j, (a, e)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(a.to_bits(), e.to_bits(), "{n}x{c}->{m}/{group}, output {j}");
                }
            }
        }
    }
}
