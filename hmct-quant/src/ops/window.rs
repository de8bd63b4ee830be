//! Sliding windows of Conv, ConvTranspose and the pools: the `auto_pad`, kernel,
//! stride, dilation and pad attributes checked at build time, and the window they
//! resolve to for an input shape (output size and padding per spatial axis).

use super::{NodeSpec, OpError};

/// `auto_pad` of Conv, ConvTranspose and the pools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AutoPad {
    NotSet,
    SameUpper,
    SameLower,
    Valid,
}

/// Window attributes shared by Conv and the pools, checked at build time.
#[derive(Clone, Debug)]
pub(crate) struct WindowAttrs {
    pub auto_pad: AutoPad,
    pub kernel_shape: Option<Vec<usize>>,
    pub strides: Option<Vec<usize>>,
    pub dilations: Option<Vec<usize>>,
    /// `[begin_0, .., begin_n, end_0, .., end_n]`.
    pub pads: Option<Vec<usize>>,
}

fn positive_list(spec: &NodeSpec, name: &str) -> Result<Option<Vec<usize>>, OpError> {
    match spec.attrs.ints(name)? {
        None => Ok(None),
        Some(v) => {
            if v.iter().any(|&x| x < 1) {
                return Err(OpError::invalid(format!(
                    "{name} must be positive, got {v:?}"
                )));
            }
            Ok(Some(v.into_iter().map(|x| x as usize).collect()))
        }
    }
}

impl WindowAttrs {
    pub fn parse(spec: &NodeSpec) -> Result<Self, OpError> {
        let auto_pad = match spec.attrs.string_or("auto_pad", "NOTSET")?.as_str() {
            "NOTSET" | "" => AutoPad::NotSet,
            "SAME_UPPER" => AutoPad::SameUpper,
            "SAME_LOWER" => AutoPad::SameLower,
            "VALID" => AutoPad::Valid,
            other => return Err(OpError::invalid(format!("auto_pad '{other}'"))),
        };
        let pads = match spec.attrs.ints("pads")? {
            None => None,
            Some(p) => {
                if p.iter().any(|&x| x < 0) {
                    return Err(OpError::unsupported(format!("negative pads {p:?}")));
                }
                if p.len() % 2 != 0 {
                    return Err(OpError::invalid(format!("pads {p:?} has odd length")));
                }
                Some(p.into_iter().map(|x| x as usize).collect())
            }
        };
        Ok(WindowAttrs {
            auto_pad,
            kernel_shape: positive_list(spec, "kernel_shape")?,
            strides: positive_list(spec, "strides")?,
            dilations: positive_list(spec, "dilations")?,
            pads,
        })
    }

    pub(crate) fn per_dim(
        v: &Option<Vec<usize>>,
        n: usize,
        name: &str,
        default: usize,
    ) -> Result<Vec<usize>, OpError> {
        match v {
            None => Ok(vec![default; n]),
            Some(v) if v.len() == n => Ok(v.clone()),
            Some(v) => Err(OpError::invalid(format!(
                "{name} {v:?} does not have {n} values"
            ))),
        }
    }

    /// Resolves the window over `input` spatial dims for a kernel of `kernel` dims.
    /// `ceil_mode` rounds the output size up (pools), dropping a last window that
    /// would start inside the end padding.
    pub fn resolve(
        &self,
        input: &[usize],
        kernel: &[usize],
        ceil_mode: bool,
    ) -> Result<Window, OpError> {
        let n = input.len();
        if kernel.len() != n {
            return Err(OpError::invalid(format!(
                "kernel {kernel:?} does not match input dims {input:?}"
            )));
        }
        let stride = Self::per_dim(&self.strides, n, "strides", 1)?;
        let dil = Self::per_dim(&self.dilations, n, "dilations", 1)?;
        let mut pad_begin = vec![0; n];
        let mut pad_end = vec![0; n];
        let mut out = vec![0; n];
        for i in 0..n {
            let eff = (kernel[i] - 1) * dil[i] + 1;
            match self.auto_pad {
                AutoPad::SameUpper | AutoPad::SameLower => {
                    out[i] = input[i].div_ceil(stride[i]);
                    let total = ((out[i].max(1) - 1) * stride[i] + eff).saturating_sub(input[i]);
                    let small = total / 2;
                    if self.auto_pad == AutoPad::SameUpper {
                        (pad_begin[i], pad_end[i]) = (small, total - small);
                    } else {
                        (pad_begin[i], pad_end[i]) = (total - small, small);
                    }
                    continue;
                }
                AutoPad::Valid => {}
                AutoPad::NotSet => {
                    if let Some(p) = &self.pads {
                        if p.len() != 2 * n {
                            return Err(OpError::invalid(format!(
                                "pads {p:?} do not have {} values",
                                2 * n
                            )));
                        }
                        pad_begin[i] = p[i];
                        pad_end[i] = p[i + n];
                    }
                }
            }
            let span = input[i] + pad_begin[i] + pad_end[i];
            if span < eff {
                return Err(OpError::invalid(format!(
                    "window {eff} larger than padded input {span} on spatial axis {i}"
                )));
            }
            let o = if ceil_mode {
                let mut o = (span - eff).div_ceil(stride[i]) + 1;
                if (o - 1) * stride[i] >= input[i] + pad_begin[i] {
                    o -= 1;
                }
                o
            } else {
                (span - eff) / stride[i] + 1
            };
            out[i] = o;
        }
        Ok(Window {
            kernel: kernel.to_vec(),
            stride,
            dil,
            pad_begin,
            pad_end,
            out,
        })
    }
}

/// A resolved sliding window over `n` spatial dims.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Window {
    pub kernel: Vec<usize>,
    pub stride: Vec<usize>,
    pub dil: Vec<usize>,
    pub pad_begin: Vec<usize>,
    pub pad_end: Vec<usize>,
    pub out: Vec<usize>,
}

/// A window over exactly three spatial dims (1-D and 2-D padded with leading 1s), which
/// lets one loop nest serve every rank.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Win3 {
    pub input: [usize; 3],
    pub out: [usize; 3],
    pub kernel: [usize; 3],
    pub stride: [usize; 3],
    pub dil: [usize; 3],
    pub pad: [isize; 3],
}

impl Win3 {
    pub fn new(input: &[usize], w: &Window) -> Result<Win3, OpError> {
        let n = input.len();
        if n == 0 || n > 3 {
            return Err(OpError::unsupported(format!(
                "{n} spatial dimensions (1 to 3 are implemented)"
            )));
        }
        let lift = |v: &[usize], fill: usize| {
            let mut a = [fill; 3];
            a[3 - n..].copy_from_slice(v);
            a
        };
        let pb = lift(&w.pad_begin, 0);
        Ok(Win3 {
            input: lift(input, 1),
            out: lift(&w.out, 1),
            kernel: lift(&w.kernel, 1),
            stride: lift(&w.stride, 1),
            dil: lift(&w.dil, 1),
            pad: [pb[0] as isize, pb[1] as isize, pb[2] as isize],
        })
    }
    pub fn in_vol(&self) -> usize {
        self.input.iter().product()
    }
    pub fn out_vol(&self) -> usize {
        self.out.iter().product()
    }
    pub fn k_vol(&self) -> usize {
        self.kernel.iter().product()
    }
    /// How far the windows reach on axis `a` of the padded input: the last output's
    /// last tap, plus one.
    pub fn reach(&self, a: usize) -> usize {
        (self.out[a] - 1) * self.stride[a] + (self.kernel[a] - 1) * self.dil[a] + 1
    }
    /// A pointwise conv's window: one tap, stride 1, no padding, output = input.
    pub fn pointwise(&self) -> bool {
        self.k_vol() == 1 && self.stride == [1; 3] && self.pad == [0; 3] && self.out == self.input
    }
    /// Input coordinate on axis `a` for output `o` and kernel tap `k`, if inside.
    #[inline]
    pub fn src(&self, a: usize, o: usize, k: usize) -> Option<usize> {
        let i = (o * self.stride[a] + k * self.dil[a]) as isize - self.pad[a];
        (i >= 0 && (i as usize) < self.input[a]).then_some(i as usize)
    }
    /// The output range `[lo, hi)` along the last axis whose source for tap `k` lies
    /// inside the input, and the source offset `ow * stride + off`.
    #[inline]
    pub fn inner_range(&self, k: usize) -> (usize, usize, isize) {
        let s = self.stride[2] as isize;
        let off = (k * self.dil[2]) as isize - self.pad[2];
        let lo = if off >= 0 { 0 } else { ((-off) + s - 1) / s };
        let w = self.input[2] as isize;
        let hi = if w - off > 0 {
            (w - off + s - 1) / s
        } else {
            0
        };
        let hi = hi.min(self.out[2] as isize).max(0);
        let lo = lo.min(hi);
        (lo as usize, hi as usize, off)
    }
}

/// One input row split into the two column phases of a stride-2 window: input element
/// `i` is padded column `c = pw + i`, written to `phases[c % 2][c / 2]` (`phase0` and
/// `phase1` are the phase rows from their first slot; the padding slots are left as
/// they are). The direct conv's copies and depthwise planes both use it. A loop over
/// pairs, so that it vectorizes, where `step_by` loops per phase did not (40% of a
/// stride-2 conv's time).
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl", "x86_64+avx2"))]
pub(crate) fn split_row_stride2<T: Copy>(row: &[T], pw: usize, phase0: &mut [T], phase1: &mut [T]) {
    let (even, odd) = if pw % 2 == 0 {
        (phase0, phase1)
    } else {
        (phase1, phase0)
    };
    let (even, odd) = (&mut even[pw / 2..], &mut odd[pw.div_ceil(2)..]);
    let pairs = row.chunks_exact(2);
    if let [last] = pairs.remainder() {
        even[row.len() / 2] = *last;
    }
    for ((e, o), pair) in even.iter_mut().zip(odd.iter_mut()).zip(pairs) {
        *e = pair[0];
        *o = pair[1];
    }
}
