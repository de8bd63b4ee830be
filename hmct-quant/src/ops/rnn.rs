//! LSTM, GRU and RNN (forward, reverse, bidirectional; sequence_lens; initial states;
//! peepholes; clip; layout 0/1; the ONNX activation functions).
//!
//! The input projection of every time step is one GEMM up front; each step then
//! multiplies the hidden state by the recurrence weights. Rows whose sequence has
//! ended keep their state and write zeros to `Y`, as the ONNX reference does.

use hmct_tensor::Tensor;
use hmct_tensor::ndarray::{ArrayD, IxDyn};

use super::arrays::contiguous;
use super::gemm_util::{self as gu, MatRef};
use super::{Kernel, NodeSpec, OpError, input};

pub(crate) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>> {
    let kind = match spec.op_type {
        "LSTM" => Kind::Lstm,
        "GRU" => Kind::Gru,
        "RNN" => Kind::Rnn,
        _ => return None,
    };
    Some(RnnKernel::new(spec, kind).map(|k| Box::new(k) as Box<dyn Kernel>))
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Lstm,
    Gru,
    Rnn,
}

impl Kind {
    fn gates(self) -> usize {
        match self {
            Kind::Lstm => 4,
            Kind::Gru => 3,
            Kind::Rnn => 1,
        }
    }
    fn default_acts(self) -> &'static [&'static str] {
        match self {
            Kind::Lstm => &["Sigmoid", "Tanh", "Tanh"],
            Kind::Gru => &["Sigmoid", "Tanh"],
            Kind::Rnn => &["Tanh"],
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Act {
    Sigmoid,
    Tanh,
    Relu,
    HardSigmoid(f32, f32),
    LeakyRelu(f32),
    ThresholdedRelu(f32),
    ScaledTanh(f32, f32),
    Affine(f32, f32),
    Elu(f32),
    Softsign,
    Softplus,
}

impl Act {
    #[inline]
    fn apply(self, x: f32) -> f32 {
        match self {
            Act::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Act::Tanh => x.tanh(),
            Act::Relu => x.max(0.0),
            Act::HardSigmoid(a, b) => (a * x + b).clamp(0.0, 1.0),
            Act::LeakyRelu(a) => {
                if x >= 0.0 {
                    x
                } else {
                    a * x
                }
            }
            Act::ThresholdedRelu(a) => {
                if x > a {
                    x
                } else {
                    0.0
                }
            }
            Act::ScaledTanh(a, b) => a * (b * x).tanh(),
            Act::Affine(a, b) => a * x + b,
            Act::Elu(a) => {
                if x >= 0.0 {
                    x
                } else {
                    a * (x.exp() - 1.0)
                }
            }
            Act::Softsign => x / (1.0 + x.abs()),
            Act::Softplus => (1.0 + x.exp()).ln(),
        }
    }
}

/// Parses activation names, taking alpha/beta values in order for the functions that
/// have them (ONNX defaults otherwise).
fn parse_acts(names: &[String], alphas: &[f32], betas: &[f32]) -> Result<Vec<Act>, OpError> {
    let (mut ai, mut bi) = (0, 0);
    let mut alpha = |d: f32| {
        let v = alphas.get(ai).copied().unwrap_or(d);
        ai += 1;
        v
    };
    let mut beta = |d: f32| {
        let v = betas.get(bi).copied().unwrap_or(d);
        bi += 1;
        v
    };
    names
        .iter()
        .map(|n| {
            Ok(match n.to_ascii_lowercase().as_str() {
                "sigmoid" => Act::Sigmoid,
                "tanh" => Act::Tanh,
                "relu" => Act::Relu,
                "hardsigmoid" => Act::HardSigmoid(alpha(0.2), beta(0.5)),
                "leakyrelu" => Act::LeakyRelu(alpha(0.01)),
                "thresholdedrelu" => Act::ThresholdedRelu(alpha(1.0)),
                "scaledtanh" => Act::ScaledTanh(alpha(1.0), beta(1.0)),
                "affine" => Act::Affine(alpha(1.0), beta(0.0)),
                "elu" => Act::Elu(alpha(1.0)),
                "softsign" => Act::Softsign,
                "softplus" => Act::Softplus,
                other => return Err(OpError::unsupported(format!("RNN activation '{other}'"))),
            })
        })
        .collect()
}

struct RnnKernel {
    kind: Kind,
    hidden: usize,
    /// (reverse?) per direction.
    dirs: Vec<bool>,
    acts: Vec<Act>,
    clip: Option<f32>,
    batch_first: bool,
    linear_before_reset: bool,
    num_outputs: usize,
}

impl RnnKernel {
    fn new(spec: &NodeSpec, kind: Kind) -> Result<Self, OpError> {
        let a = &spec.attrs;
        let hidden = a
            .int("hidden_size")?
            .filter(|&h| h > 0)
            .ok_or_else(|| OpError::invalid("hidden_size missing or not positive"))?
            as usize;
        let dirs = match a.string_or("direction", "forward")?.as_str() {
            "forward" => vec![false],
            "reverse" => vec![true],
            "bidirectional" => vec![false, true],
            other => return Err(OpError::invalid(format!("direction '{other}'"))),
        };
        let per_dir: Vec<String> = kind.default_acts().iter().map(|s| s.to_string()).collect();
        let names = match a.strings("activations")? {
            Some(v) => v,
            None => dirs.iter().flat_map(|_| per_dir.clone()).collect(),
        };
        if names.len() != per_dir.len() * dirs.len() {
            return Err(OpError::invalid(format!(
                "{} activations for {} directions",
                names.len(),
                dirs.len()
            )));
        }
        let acts = parse_acts(
            &names,
            &a.floats("activation_alpha")?.unwrap_or_default(),
            &a.floats("activation_beta")?.unwrap_or_default(),
        )?;
        if kind == Kind::Lstm && a.int_or("input_forget", 0)? != 0 {
            return Err(OpError::unsupported("LSTM input_forget = 1"));
        }
        Ok(RnnKernel {
            kind,
            hidden,
            dirs,
            acts,
            clip: a.float("clip")?,
            batch_first: a.int_or("layout", 0)? != 0,
            linear_before_reset: a.int_or("linear_before_reset", 0)? != 0,
            num_outputs: spec.num_outputs,
        })
    }
}

fn f32_input<'t>(
    inputs: &[Option<&'t Tensor>],
    i: usize,
    what: &str,
) -> Result<Option<std::borrow::Cow<'t, [f32]>>, OpError> {
    match inputs.get(i).copied().flatten() {
        None => Ok(None),
        Some(t) if t.is_empty() => Ok(None),
        Some(Tensor::F32(a)) => Ok(Some(contiguous(a))),
        Some(t) => Err(OpError::unsupported(format!(
            "{what} of type {}",
            t.dtype()
        ))),
    }
}

fn check_len(v: &[f32], want: usize, what: &str) -> Result<(), OpError> {
    if v.len() != want {
        return Err(OpError::invalid(format!(
            "{what} has {} values, expected {want}",
            v.len()
        )));
    }
    Ok(())
}

impl Kernel for RnnKernel {
    fn run(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        let x_t = input(inputs, 0)?;
        let Tensor::F32(xa) = x_t else {
            return Err(OpError::unsupported(format!(
                "{:?} on {}",
                self.kind,
                x_t.dtype()
            )));
        };
        let xs = xa.shape();
        if xs.len() != 3 {
            return Err(OpError::invalid(format!("RNN input of shape {xs:?}")));
        }
        let (seq, batch, isz) = if self.batch_first {
            (xs[1], xs[0], xs[2])
        } else {
            (xs[0], xs[1], xs[2])
        };
        // Time-major copy of X: [seq, batch, input].
        let x: Vec<f32> = if self.batch_first {
            let v = contiguous(xa);
            let mut t = vec![0.0; v.len()];
            for b in 0..batch {
                for s in 0..seq {
                    t[(s * batch + b) * isz..][..isz]
                        .copy_from_slice(&v[(b * seq + s) * isz..][..isz]);
                }
            }
            t
        } else {
            contiguous(xa).into_owned()
        };
        let (h, g, nd) = (self.hidden, self.kind.gates(), self.dirs.len());
        let gh = g * h;
        let w = f32_input(inputs, 1, "W")?.ok_or_else(|| OpError::invalid("missing W"))?;
        let r = f32_input(inputs, 2, "R")?.ok_or_else(|| OpError::invalid("missing R"))?;
        check_len(&w, nd * gh * isz, "W")?;
        check_len(&r, nd * gh * h, "R")?;
        let bias = f32_input(inputs, 3, "B")?;
        if let Some(b) = &bias {
            check_len(b, nd * 2 * gh, "B")?;
        }
        let lens: Vec<usize> = match inputs.get(4).copied().flatten() {
            None => vec![seq; batch],
            Some(t) => {
                let v = t
                    .to_i64_vec()
                    .ok_or_else(|| OpError::invalid("sequence_lens must be integers"))?;
                if v.len() != batch || v.iter().any(|&l| l < 0 || l as usize > seq) {
                    return Err(OpError::invalid(format!("sequence_lens {v:?}")));
                }
                v.into_iter().map(|l| l as usize).collect()
            }
        };
        let init_h = f32_input(inputs, 5, "initial_h")?;
        let init_c = if self.kind == Kind::Lstm {
            f32_input(inputs, 6, "initial_c")?
        } else {
            None
        };
        let peep = if self.kind == Kind::Lstm {
            f32_input(inputs, 7, "P")?
        } else {
            None
        };
        // Initial states are [dirs, batch, H] (layout 0) or [batch, dirs, H] (layout 1).
        let state_at = |v: &[f32], d: usize, b: usize| -> Vec<f32> {
            let off = if self.batch_first {
                (b * nd + d) * h
            } else {
                (d * batch + b) * h
            };
            v[off..][..h].to_vec()
        };
        for (v, what) in [(&init_h, "initial_h"), (&init_c, "initial_c")] {
            if let Some(v) = v {
                check_len(v, nd * batch * h, what)?;
            }
        }
        if let Some(p) = &peep {
            check_len(p, nd * 3 * h, "P")?;
        }

        let mut y = vec![0.0f32; seq * nd * batch * h];
        let mut yh = vec![0.0f32; nd * batch * h];
        let mut yc = vec![0.0f32; nd * batch * h];
        let clip = |v: f32| match self.clip {
            Some(c) => v.clamp(-c, c),
            None => v,
        };
        let na = self.kind.default_acts().len();
        for (d, &reverse) in self.dirs.iter().enumerate() {
            let acts = &self.acts[d * na..][..na];
            let wd = &w[d * gh * isz..][..gh * isz];
            let rd = &r[d * gh * h..][..gh * h];
            let (wb, rb): (Vec<f32>, Vec<f32>) = match &bias {
                Some(b) => (
                    b[d * 2 * gh..][..gh].to_vec(),
                    b[d * 2 * gh + gh..][..gh].to_vec(),
                ),
                None => (vec![0.0; gh], vec![0.0; gh]),
            };
            // Input projections of all steps: [seq * batch, gh].
            let mut xw = vec![0.0f32; seq * batch * gh];
            gu::gemm(
                seq * batch,
                gh,
                isz,
                MatRef::row_major(&x, isz),
                MatRef::transposed(wd, isz),
                &mut xw,
                gh,
                false,
                1.0,
            );
            let mut hs: Vec<f32> = (0..batch)
                .flat_map(|b| init_h.as_ref().map_or(vec![0.0; h], |v| state_at(v, d, b)))
                .collect();
            let mut cs: Vec<f32> = (0..batch)
                .flat_map(|b| init_c.as_ref().map_or(vec![0.0; h], |v| state_at(v, d, b)))
                .collect();
            let pd: Option<&[f32]> = peep.as_ref().map(|p| &p[d * 3 * h..][..3 * h]);
            let mut hr = vec![0.0f32; batch * gh];
            let mut rh = vec![0.0f32; batch * h];
            for step in 0..seq {
                // Recurrent projection of all rows; ended rows are ignored below.
                let rows = if self.kind == Kind::Gru && !self.linear_before_reset {
                    2 * h
                } else {
                    gh
                };
                gu::gemm_serial(
                    batch,
                    rows,
                    h,
                    MatRef::row_major(&hs, h),
                    MatRef::transposed(&rd[..rows * h], h),
                    &mut hr,
                    gh,
                    false,
                    1.0,
                );
                if self.kind == Kind::Gru && !self.linear_before_reset {
                    // (r ⊙ h) Rhᵀ needs r first.
                    for b in 0..batch {
                        if step >= lens[b] {
                            continue;
                        }
                        let t = if reverse { lens[b] - 1 - step } else { step };
                        let xr = &xw[(t * batch + b) * gh..][..gh];
                        for j in 0..h {
                            let rg = acts[0].apply(clip(
                                xr[h + j] + hr[b * gh + h + j] + wb[h + j] + rb[h + j],
                            ));
                            rh[b * h + j] = rg * hs[b * h + j];
                        }
                    }
                    let mut tmp = vec![0.0f32; batch * h];
                    gu::gemm_serial(
                        batch,
                        h,
                        h,
                        MatRef::row_major(&rh, h),
                        MatRef::transposed(&rd[2 * h * h..][..h * h], h),
                        &mut tmp,
                        h,
                        false,
                        1.0,
                    );
                    for b in 0..batch {
                        hr[b * gh + 2 * h..][..h].copy_from_slice(&tmp[b * h..][..h]);
                    }
                }
                for b in 0..batch {
                    if step >= lens[b] {
                        continue;
                    }
                    let t = if reverse { lens[b] - 1 - step } else { step };
                    let xr = &xw[(t * batch + b) * gh..][..gh];
                    let hrb = &hr[b * gh..][..gh];
                    let pre = |k: usize| xr[k] + hrb[k] + wb[k] + rb[k];
                    let hb = &mut hs[b * h..][..h];
                    let cb = &mut cs[b * h..][..h];
                    match self.kind {
                        Kind::Lstm => {
                            // Gate order i, o, f, c; peepholes i, o, f.
                            let (f, gg, hh) = (acts[0], acts[1], acts[2]);
                            for j in 0..h {
                                let (pi, po, pf) =
                                    pd.map_or((0.0, 0.0, 0.0), |p| (p[j], p[h + j], p[2 * h + j]));
                                let c_prev = cb[j];
                                let i = f.apply(clip(pre(j) + pi * c_prev));
                                let fg = f.apply(clip(pre(2 * h + j) + pf * c_prev));
                                let c_in = gg.apply(clip(pre(3 * h + j)));
                                let c = fg * c_prev + i * c_in;
                                let o = f.apply(clip(pre(h + j) + po * c));
                                cb[j] = c;
                                hb[j] = o * hh.apply(c);
                            }
                        }
                        Kind::Gru => {
                            // Gate order z, r, h.
                            let (f, gg) = (acts[0], acts[1]);
                            for j in 0..h {
                                let z = f.apply(clip(pre(j)));
                                let hn = if self.linear_before_reset {
                                    let rg = f.apply(clip(pre(h + j)));
                                    gg.apply(clip(
                                        xr[2 * h + j]
                                            + wb[2 * h + j]
                                            + rg * (hrb[2 * h + j] + rb[2 * h + j]),
                                    ))
                                } else {
                                    gg.apply(clip(pre(2 * h + j)))
                                };
                                hb[j] = (1.0 - z) * hn + z * hb[j];
                            }
                        }
                        Kind::Rnn => {
                            for j in 0..h {
                                hb[j] = acts[0].apply(clip(pre(j)));
                            }
                        }
                    }
                    y[((t * nd + d) * batch + b) * h..][..h].copy_from_slice(hb);
                }
            }
            for b in 0..batch {
                yh[(d * batch + b) * h..][..h].copy_from_slice(&hs[b * h..][..h]);
                yc[(d * batch + b) * h..][..h].copy_from_slice(&cs[b * h..][..h]);
            }
        }
        let arr = |shape: &[usize], v: Vec<f32>| -> Result<Tensor, OpError> {
            Ok(Tensor::F32(
                ArrayD::from_shape_vec(IxDyn(shape), v)
                    .map_err(|e| OpError::invalid(e.to_string()))?,
            ))
        };
        let (y, yh, yc, ys, ss) = if self.batch_first {
            // Y [batch, seq, dirs, H]; states [batch, dirs, H].
            let mut y2 = vec![0.0f32; y.len()];
            for s in 0..seq {
                for d in 0..nd {
                    for b in 0..batch {
                        y2[((b * seq + s) * nd + d) * h..][..h]
                            .copy_from_slice(&y[((s * nd + d) * batch + b) * h..][..h]);
                    }
                }
            }
            let swap = |v: &[f32]| {
                let mut o = vec![0.0f32; v.len()];
                for d in 0..nd {
                    for b in 0..batch {
                        o[(b * nd + d) * h..][..h].copy_from_slice(&v[(d * batch + b) * h..][..h]);
                    }
                }
                o
            };
            (
                y2,
                swap(&yh),
                swap(&yc),
                vec![batch, seq, nd, h],
                vec![batch, nd, h],
            )
        } else {
            (y, yh, yc, vec![seq, nd, batch, h], vec![nd, batch, h])
        };
        let mut outs = vec![arr(&ys, y)?, arr(&ss, yh)?];
        if self.kind == Kind::Lstm {
            outs.push(arr(&ss, yc)?);
        }
        // The node may declare fewer outputs than the operator has.
        outs.truncate(self.num_outputs.max(1));
        Ok(outs)
    }
}
