//! Chains of element-wise nodes run as one pass over memory.
//!
//! Exported CNNs follow each Conv with several element-wise nodes: BatchNormalization,
//! or the Mul/Add of a folded one, then the Add/Clip/Mul/Div of a hard-swish. Run node
//! by node, each is a pass over the whole activation, and on large activations those
//! passes cost more than the arithmetic. When a session is made, [`Chains::find`]
//! groups such nodes, read from the plan's public view, into chains with one input and one output whose intermediate values nobody
//! else reads; at run time the executor runs a chain block by block, every step on a
//! few hundred values in cache, when none of its intermediate values is wanted or
//! captured (otherwise the nodes run one by one, as always).
//!
//! A chain that alone reads a Conv's output can also run as the conv's *tail*: the
//! conv kernel runs it on each block of outputs right after storing it, while the
//! block is still in cache, instead of a later pass over the whole output
//! ([`Chains::tail_of`]; a single Relu or Clip is a chain for this purpose only).
//!
//! Calibrated models put a calibration node between a conv and what follows it (its
//! Relu's output, the inputs of a residual Add, the SiLU's input). Activation
//! calibration nodes are steps of chains too: what each does (nothing, or its fake
//! quantization) is the run's setting, bound when the chain runs ([`Chain::args`]).
//! And a chain may read one more value than its input, its *side*, at the same
//! positions: a residual Add's other operand, so that the Add, its Relu and their
//! calibration nodes run as one pass. Such a chain runs as a pass of its own, never
//! as a conv's tail (see [`Chains::find`]).
//!
//! Each step calls the per-element function of its node's own kernel (see
//! `ops::elementwise::step`), in the same order on the same values, so a fused chain
//! gives the node-by-node results bit for bit: whether a run fuses never changes what
//! it computes, only how many times memory is read.

use std::collections::HashMap;

use hmct_tensor::Tensor;
use rayon::prelude::*;

use crate::fake_quant::{FakeQuant, kernels as fq_kernels};
use crate::ops::broadcast::along_axis1_only;
use crate::ops::elementwise::step::{
    self, ArithOp, ElementStep, Gelu, HardSwish, Operand, act_block, affine_block, arith_block,
    clip_block, gelu_block, hard_swish_block, map_block, relu_block, silu_block,
};
use crate::ops::norm::batch_norm_f32_affine;
use crate::ops::num::Num;
use crate::plan::{NodeOp, Plan, Slot};

/// Most nodes in one chain (the PP-OCR chains have up to nine).
const MAX_CHAIN: usize = 16;
/// Values per block: every register of a chain holds one block, all in L1 cache.
const BLOCK: usize = 512;
/// Distance between registers: a block plus a cache line, so that registers do not
/// sit a multiple of 4 KiB apart (a load after a store at such a distance stalls).
const REG: usize = BLOCK + 16;
/// Values per parallel task, and the size below which a chain runs on one thread.
const TASK: usize = 1 << 14;
const PAR_MIN: usize = 1 << 15;
/// Per-channel operands need channel planes at least this long; on shorter ones
/// (e.g. `[N, C]`) the nodes run one by one.
const MIN_PLANE: usize = 16;

/// A constant operand: one value, one per channel of the chain's input (axis 1), or
/// one per position along its last axis (a transformer's bias or layer scale).
#[derive(Debug)]
struct Constant {
    values: Vec<f32>,
    /// Its shape, which must broadcast to the input's without growing it.
    shape: Vec<usize>,
    /// Along the last axis: `values` repeated to `values.len() + BLOCK` values, so
    /// that a block's operand is one slice wherever in a row the block starts.
    /// Empty otherwise.
    tiled: Vec<f32>,
}

impl Constant {
    /// A constant of `shape` (at most one axis longer than 1: `compile` keeps no
    /// other).
    fn new(values: Vec<f32>, shape: Vec<usize>) -> Constant {
        let along_last = values.len() > 1 && shape.last() != Some(&1);
        let tiled = if along_last {
            values
                .iter()
                .copied()
                .cycle()
                .take(values.len() + BLOCK)
                .collect()
        } else {
            Vec::new()
        };
        Constant {
            values,
            shape,
            tiled,
        }
    }

    /// The one value of a scalar constant.
    fn scalar(&self) -> Option<f32> {
        (self.values.len() == 1).then(|| self.values[0])
    }

    fn along_last(&self) -> bool {
        !self.tiled.is_empty()
    }

    fn per_channel(&self) -> bool {
        self.values.len() > 1 && !self.along_last()
    }

    /// The operand of a block of `len` values at `at`.
    fn operand(&self, at: At, len: usize) -> Operand<'_> {
        if self.along_last() {
            Operand::Block(&self.tiled[at.column..][..len])
        } else if self.per_channel() {
            Operand::Value(self.values[at.channel])
        } else {
            Operand::Value(self.values[0])
        }
    }

    /// Whether it broadcasts to `shape` without changing it: varying along axis 1
    /// only, or along the last axis only, with that axis's length.
    fn fits(&self, shape: &[usize]) -> bool {
        if self.along_last() {
            self.shape.len() <= shape.len() && self.shape.last() == shape.last()
        } else {
            along_axis1_only(&self.shape, shape)
        }
    }
}

/// Where a block of a chain's values lies: its channel (for per-channel operands),
/// its position along the last axis (for operands along it) and its flat index (for
/// the side value).
#[derive(Clone, Copy, Debug)]
struct At {
    channel: usize,
    column: usize,
    flat: usize,
}

#[derive(Clone, Copy, Debug)]
enum Arg {
    Reg(usize),
    Const(usize),
    /// The chain's side value (see [`Chain::side`]), at the block's own positions.
    Side,
}

/// One node of a chain. Step `k` writes register `k + 1`; register 0 holds the input.
#[derive(Debug)]
enum Step {
    Arith {
        op: ArithOp,
        a: Arg,
        b: Arg,
    },
    Clip {
        src: usize,
        lo: f32,
        hi: f32,
    },
    Relu {
        src: usize,
    },
    Act {
        act: step::Act,
        src: usize,
    },
    Affine {
        src: usize,
        a: Vec<f32>,
        b: Vec<f32>,
    },
    /// The Add, Clip, Mul and Div of a hard-swish as one step (see
    /// [`fuse_hard_swish`]), in place of the Div; the other three become `Nop`.
    HardSwish {
        src: usize,
        h: HardSwish,
    },
    /// A Sigmoid and the Mul of its output by its input as one step (see
    /// [`fuse_silu`]), in place of the Mul; the Sigmoid becomes `Nop`.
    Silu {
        src: usize,
        /// The Mul reads `x` first (else the Sigmoid's output first).
        x_first: bool,
        /// The calibration node between the Sigmoid and the Mul (as calibrated models
        /// have; its step is now a `Nop`), whose setting applies to the sigmoid.
        quant: Option<usize>,
    },
    /// The Div (or Mul), Erf, Add, Mul and Mul of an erf GELU as one step (see
    /// [`fuse_gelu`]), in place of the last Mul; the other four become `Nop`.
    Gelu {
        src: usize,
        g: Gelu,
    },
    /// An activation calibration node: whether it fake-quantizes, and how, is the
    /// run's setting of calibration `cal` (see [`ChainArgs`]).
    Quant {
        src: usize,
        cal: usize,
    },
    /// A step whose work another step does; its register is never read.
    Nop,
}

/// A chain of element-wise nodes with one input and one output.
#[derive(Debug)]
pub(crate) struct Chain {
    /// Plan nodes, in plan order; the first reads `input`, the last writes `output`.
    pub nodes: Vec<usize>,
    pub input: Slot,
    pub output: Slot,
    /// Outputs of all nodes but the last: read only inside the chain.
    pub internal: Vec<Slot>,
    /// A second value some steps read, of the chain's shape, at the same positions
    /// (a residual Add's other operand); computed before the chain runs.
    pub side: Option<Slot>,
    /// Nodes outside the chain, placed between its first and last node, that read
    /// `input`: while they still have to run, the chain may not consume the input.
    pub input_readers_within: Vec<usize>,
    /// Whether the chain runs as a pass of its own. A single node (a Relu, a Clip
    /// after a Conv) is a chain only as a conv's tail ([`Chains::tail_of`]).
    standalone: bool,
    in_place: InPlace,
    steps: Vec<Step>,
    consts: Vec<Constant>,
}

/// How a chain walks an input of a given shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Walk {
    /// Values per piece; a piece lies in one channel plane when `channels` > 0.
    piece: usize,
    channels: usize,
    /// The last axis's length when some operand runs along it, else 0.
    columns: usize,
}

impl Walk {
    /// Where the block at flat index `flat` lies (inside one piece).
    fn at(&self, flat: usize) -> At {
        At {
            channel: match self.channels {
                0 => 0,
                c => flat / self.piece % c,
            },
            column: match self.columns {
                0 => 0,
                n => flat % n,
            },
            flat,
        }
    }
}

impl Chain {
    /// How to run the chain on an f32 input of `shape`, or `None` when its operands do
    /// not broadcast as the chain assumes (the nodes then run one by one and report
    /// any error themselves).
    fn walk(&self, shape: &[usize]) -> Option<Walk> {
        let per_channel = self.consts.iter().any(Constant::per_channel)
            || self.steps.iter().any(|s| matches!(s, Step::Affine { .. }));
        if !self.consts.iter().all(|c| c.fits(shape)) {
            return None;
        }
        for s in &self.steps {
            if let Step::Affine { a, .. } = s
                && (shape.len() < 2 || shape[1] != a.len())
            {
                return None;
            }
        }
        let columns = match self.consts.iter().any(Constant::along_last) {
            true => *shape.last()?,
            false => 0,
        };
        if !per_channel {
            return Some(Walk {
                piece: TASK,
                channels: 0,
                columns,
            });
        }
        // Operands along axis 1 and along the last axis (of a 3-D or larger input):
        // not walked.
        if columns > 0 {
            return None;
        }
        let plane: usize = shape[2..].iter().product();
        (plane >= MIN_PLANE).then_some(Walk {
            piece: plane,
            channels: shape[1],
            columns: 0,
        })
    }

    /// The chain with what one run gives it: `setting(c)`, what calibration node `c`
    /// does in the run (`None`: nothing), and the value of its side slot when it has
    /// one.
    pub fn args<'a>(
        &'a self,
        setting: impl Fn(usize) -> Option<&'a FakeQuant>,
        side: Option<&'a Tensor>,
    ) -> ChainArgs<'a> {
        let settings = self
            .steps
            .iter()
            .map(|s| match s {
                Step::Quant { cal, .. }
                | Step::Silu {
                    quant: Some(cal), ..
                } => setting(*cal),
                _ => None,
            })
            .collect();
        ChainArgs {
            chain: self,
            settings,
            side,
        }
    }
}

/// What a calibration step does in one run (see [`Step::Quant`]).
#[derive(Clone, Copy, Debug)]
enum Quant {
    Off,
    /// Integer fake quantization, alike for every element.
    Int {
        scale: f32,
        lo: f32,
        hi: f32,
    },
    Float16,
}

/// A chain with one run's calibration settings and side value (see [`Chain::args`]).
pub(crate) struct ChainArgs<'a> {
    chain: &'a Chain,
    /// Per step: the setting of a calibration step, `None` for other steps.
    settings: Vec<Option<&'a FakeQuant>>,
    side: Option<&'a Tensor>,
}

impl<'a> ChainArgs<'a> {
    pub fn chain(&self) -> &'a Chain {
        self.chain
    }

    /// The chain ready to run on an f32 value of `shape` (as a kernel's tail, or as a
    /// pass of its own), or `None` when its operands do not broadcast to that shape as
    /// the chain assumes, its side value is not an f32 value of that very shape, or a
    /// calibration step quantizes per channel: the nodes then run one by one, as
    /// always, and report any error themselves.
    pub fn tail(&self, shape: &[usize]) -> Option<Tail<'a>> {
        let walk = self.chain.walk(shape)?;
        let side = match self.side {
            None if self.chain.side.is_some() => return None,
            None => None,
            Some(Tensor::F32(a)) if a.shape() == shape => Some(a.as_slice()?),
            Some(_) => return None,
        };
        let quants = self
            .settings
            .iter()
            .map(|fq| match fq {
                None => Some(Quant::Off),
                Some(fq) => {
                    fq.check_shape(shape).ok()?;
                    match fq {
                        FakeQuant::Identity => Some(Quant::Off),
                        FakeQuant::Float16 => Some(Quant::Float16),
                        FakeQuant::Int(p) => {
                            let (scale, lo, hi) = p.uniform()?;
                            Some(Quant::Int { scale, lo, hi })
                        }
                    }
                }
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Tail {
            chain: self.chain,
            walk,
            quants,
            side,
        })
    }
}

/// A chain bound to a run and to the shape of its values: run by a kernel on its
/// output as it stores it (its *tail*: each block goes through the chain while it is
/// still in cache; see [`Kernel::accepts_tail`](crate::ops::Kernel::accepts_tail)),
/// or by the executor as a pass of its own ([`Tail::run`]).
pub(crate) struct Tail<'a> {
    chain: &'a Chain,
    walk: Walk,
    /// Per step: what a calibration step does ([`Quant::Off`] for other steps).
    quants: Vec<Quant>,
    side: Option<&'a [f32]>,
}

impl Tail<'_> {
    /// Runs the chain over `dst`, reading from `src` when given, else from `dst`
    /// itself.
    pub fn run(&self, src: Option<&[f32]>, dst: &mut [f32]) {
        let walk = self.walk;
        // Registers 1.. (all but the last step's, which writes `dst`), and one more
        // for a copy of the input when the chain runs in place.
        let regs = self.chain.steps.len() * REG;
        // Whole pieces per call of `run_pieces`: a call per piece cost as much as the
        // arithmetic on the classifier's planes of 192 values.
        let per_task = TASK.div_ceil(walk.piece);
        let task_len = walk.piece * per_task;
        let task = |buf: &mut Vec<f32>, (t, out): (usize, &mut [f32])| {
            buf.resize(regs, 0.0);
            let from = src.map(|s| &s[t * task_len..][..out.len()]);
            run_pieces(self, t * per_task, from, out, buf);
        };
        if dst.len() < PAR_MIN || !crate::par::enabled() {
            task(&mut Vec::new(), (0, dst));
        } else {
            dst.par_chunks_mut(task_len)
                .enumerate()
                .for_each_init(Vec::new, task);
        }
    }

    /// Runs step `k` on one block: register 0 is `input`, register `r` ≥ 1 is at
    /// `(r - 1) * REG` in `done`.
    #[inline(always)]
    fn eval_step(&self, k: usize, at: At, input: &[f32], done: &[f32], out: &mut [f32]) {
        let n = out.len();
        let reg = |r: usize| match r {
            0 => &input[..n],
            r => &done[(r - 1) * REG..][..n],
        };
        let chain = self.chain;
        let arg = |a: Arg| match a {
            Arg::Reg(r) => Operand::Block(reg(r)),
            Arg::Const(c) => chain.consts[c].operand(at, n),
            Arg::Side => Operand::Block(
                &self.side.expect("a chain with a side runs with it")[at.flat..][..n],
            ),
        };
        match &chain.steps[k] {
            Step::Arith { op, a, b } => arith_block(*op, arg(*a), arg(*b), out),
            Step::Clip { src, lo, hi } => clip_block(reg(*src), *lo, *hi, out),
            Step::Relu { src } => relu_block(reg(*src), out),
            Step::Act { act, src } => act_block(*act, reg(*src), out),
            Step::Affine { src, a, b } => {
                affine_block(reg(*src), a[at.channel], b[at.channel], out)
            }
            Step::HardSwish { src, h } => hard_swish_block(*h, reg(*src), out),
            Step::Silu { src, x_first, .. } => match self.quants[k] {
                Quant::Off => silu_block(*x_first, reg(*src), out),
                q => silu_quantized(*x_first, q, reg(*src), out),
            },
            Step::Gelu { src, g } => gelu_block(*g, reg(*src), out),
            Step::Quant { src, .. } => match self.quants[k] {
                Quant::Off => out.copy_from_slice(reg(*src)),
                Quant::Int { scale, lo, hi } => {
                    for (o, &x) in out.iter_mut().zip(reg(*src)) {
                        *o = fq_kernels::int_scalar(x, scale, lo, hi);
                    }
                }
                Quant::Float16 => {
                    out.copy_from_slice(reg(*src));
                    fq_kernels::f16_round_trip(out);
                }
            },
            Step::Nop => {}
        }
    }

    /// Runs every step but the last on one block of `input`, into `regs`.
    #[inline(always)]
    fn eval_inner(&self, at: At, input: &[f32], regs: &mut [f32]) {
        let n = input.len();
        for k in 0..self.chain.steps.len() - 1 {
            let (done, rest) = regs.split_at_mut(k * REG);
            self.eval_step(k, at, input, done, &mut rest[..n]);
        }
    }

    /// The chain's working steps, one after the other, each on `block` in place:
    /// for chains of [`InPlace::Direct`].
    #[inline(always)]
    fn steps_in_place(&self, channel: usize, block: &mut [f32]) {
        for (k, step) in self.chain.steps.iter().enumerate() {
            match step {
                Step::Nop => {}
                Step::Clip { lo, hi, .. } => map_block(block, |v| step::clip_one(v, *lo, *hi)),
                Step::Affine { a, b, .. } => {
                    let (a, b) = (a[channel], b[channel]);
                    map_block(block, |v| v * a + b);
                }
                Step::HardSwish { h, .. } => map_block(block, |x| step::hard_swish_one(*h, x)),
                Step::Silu { x_first, .. } => match self.quants[k] {
                    Quant::Off => map_block(block, |x| step::silu_one(*x_first, x)),
                    q => {
                        let mut x = [0.0f32; BLOCK];
                        let x = &mut x[..block.len()];
                        x.copy_from_slice(block);
                        silu_quantized(*x_first, q, x, block);
                    }
                },
                Step::Gelu { g, .. } => map_block(block, |x| step::gelu_one(*g, x)),
                // What `act_block` runs on its copy of the input.
                Step::Act { act, .. } => step::map_in_place(*act, block),
                Step::Relu { .. } => map_block(block, step::relu),
                Step::Quant { .. } => quantize(self.quants[k], block),
                _ => unreachable!("InPlace::Direct is set for these steps only"),
            }
        }
    }
}

/// `x · q(σ(x))` (operands in the Mul's order) of a SiLU whose sigmoid goes through
/// calibration setting `q` before the Mul: the Sigmoid, the calibration node and the
/// Mul one after the other, on `out.len() <= BLOCK` values.
#[inline(always)]
fn silu_quantized(x_first: bool, q: Quant, x: &[f32], out: &mut [f32]) {
    act_block(step::Act::Sigmoid, x, out);
    quantize(q, out);
    for (o, &x) in out.iter_mut().zip(x) {
        *o = if x_first {
            Num::mul(x, *o)
        } else {
            Num::mul(*o, x)
        };
    }
}

/// A calibration step on `block` in place. Integer fake quantization runs the
/// calibration node's per-element function, which its vector kernels match bit for
/// bit, inline, where the caller's instruction set widens it: a call of the node's
/// AVX2 kernel on each run of a conv's tail (often 16-64 values) made ResNet-50's
/// calibrated run 1.7 ms slower than the separate passes it replaced.
#[inline(always)]
fn quantize(q: Quant, block: &mut [f32]) {
    match q {
        Quant::Off => {}
        Quant::Int { scale, lo, hi } => {
            map_block(block, |x| fq_kernels::int_scalar(x, scale, lo, hi))
        }
        Quant::Float16 => fq_kernels::f16_round_trip(block),
    }
}

/// How a chain runs over a block in place (its output overwriting its input).
#[derive(Clone, Copy, Debug, PartialEq)]
enum InPlace {
    /// Each working step maps the value the one before gave, one for one (a Conv's
    /// Clip, SiLU, hard-swish, or an activation its kernel maps in place, such as
    /// ONNX's HardSwish, each perhaps followed by a calibration step): straight over
    /// the block, one step after the other ([`Tail::steps_in_place`]), no registers.
    /// From two copies per block, a 14x14x672 depthwise conv of MobileNetV3 with its
    /// HardSwish tail took 0.19-0.20 ms; straight over it, 0.14-0.15.
    /// A Relu only where the CPU has AVX-512: LLVM turns `v = if v < 0 { 0 } else { v }`
    /// in place into masked stores of the zeros, which with AVX2 (`vmaskmovps`) on
    /// AMD's Zen 3 made a Relu tail four times the cost of the standalone Relu
    /// (RegNet-Y: 5.7% of the run against 1.6%), so there it runs from a copy of the
    /// block, which compiles to plain stores. AVX-512's masked stores are not slow, and
    /// the copy (a `memcpy` call per block) was most of the tail: MobileNetV3's 16->64
    /// conv at 112x112 with its Relu took 0.34-0.36 ms from the copy, 0.28-0.30
    /// straight over it, and 0.25-0.28 without the Relu (`run --profile` of the two
    /// nodes alone, three alternating rounds).
    Direct,
    /// The last step reads the input, which it overwrites: from a copy of each block.
    FromCopy,
    /// Only steps before the last read the input: over the block, with registers.
    Plain,
}

impl InPlace {
    fn of(steps: &[Step]) -> InPlace {
        let last = steps.last().expect("chains have steps");
        // The register holding the value so far: each working step must read it
        // alone (a Nop's register is never read).
        let mut value = 0;
        let mut direct = steps.last().is_some_and(|s| !matches!(s, Step::Nop));
        for (k, s) in steps.iter().enumerate() {
            let maps_value = match s {
                Step::Nop => continue,
                Step::Clip { src, .. }
                | Step::Affine { src, .. }
                | Step::HardSwish { src, .. }
                | Step::Silu { src, .. }
                | Step::Gelu { src, .. }
                | Step::Quant { src, .. } => *src == value,
                Step::Act { src, act } => *src == value && step::f32_slice_kernel(*act).is_none(),
                Step::Relu { src } => *src == value && crate::cpu::features().avx512f,
                _ => false,
            };
            direct &= maps_value;
            value = k + 1;
        }
        if direct {
            InPlace::Direct
        } else if reads(last).contains(&0) {
            InPlace::FromCopy
        } else {
            InPlace::Plain
        }
    }
}

/// Pieces `first..` of a chain's values (`out`, and `src` when given, hold whole
/// pieces), each block by block; AVX-512 or AVX2 widen every step's loop where the
/// CPU has them (IEEE operations, so the same results). Both with FMA: the sigmoid of
/// a SiLU step computes `mul_add`, which without the target feature is a call to a
/// software `fmaf` per value (same bits, but EfficientNet-B0's float model ran 10x
/// slower on an AVX2-only Zen 3, 234 ms against onnxruntime's 23). The first steps read the
/// input where it lies and the last step writes the output where it goes: copying
/// blocks in and out cost a fifth of a five-node chain.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma"))]
fn run_pieces(tail: &Tail, first: usize, src: Option<&[f32]>, out: &mut [f32], regs: &mut [f32]) {
    let walk = tail.walk;
    let last = tail.chain.steps.len() - 1;
    let (work, saved) = regs.split_at_mut(last * REG);
    for (i, piece) in out.chunks_mut(walk.piece).enumerate() {
        let piece_src = src.map(|s| &s[i * walk.piece..][..piece.len()]);
        let piece_start = (first + i) * walk.piece;
        for (b, block) in piece.chunks_mut(BLOCK).enumerate() {
            let n = block.len();
            let at = walk.at(piece_start + b * BLOCK);
            match piece_src {
                Some(s) => {
                    let input = &s[b * BLOCK..][..n];
                    tail.eval_inner(at, input, work);
                    tail.eval_step(last, at, input, work, block);
                }
                None => in_place(tail, at, block, work, saved),
            }
        }
    }
}

/// One block of at most `BLOCK` values through the chain, in place.
#[inline(always)]
fn in_place(tail: &Tail, at: At, block: &mut [f32], work: &mut [f32], saved: &mut [f32]) {
    let last = tail.chain.steps.len() - 1;
    match tail.chain.in_place {
        InPlace::Direct => tail.steps_in_place(at.channel, block),
        InPlace::FromCopy => {
            let input = &mut saved[..block.len()];
            input.copy_from_slice(block);
            tail.eval_inner(at, input, work);
            tail.eval_step(last, at, input, work, block);
        }
        InPlace::Plain => {
            tail.eval_inner(at, block, work);
            tail.eval_step(last, at, &[], work, block);
        }
    }
}

/// A run of values from flat index `first` through the chain, in place (a kernel's
/// tail; a run with per-channel operands lies in one channel plane); `regs` is empty
/// for [`InPlace::Direct`] chains, which use none.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma"))]
fn run_span(tail: &Tail, first: usize, out: &mut [f32], regs: &mut [f32]) {
    let (work, saved) = regs.split_at_mut(((tail.chain.steps.len() - 1) * REG).min(regs.len()));
    for (b, block) in out.chunks_mut(BLOCK).enumerate() {
        in_place(tail, tail.walk.at(first + b * BLOCK), block, work, saved);
    }
}

/// Compiles node `i` as a step whose register inputs are in `regs`, or `None` when it
/// cannot be part of a chain. A binary node may read `side` (or, when `side` is
/// `None`, make its one input that is neither a register nor a constant the side).
fn compile(
    plan: &Plan,
    i: usize,
    regs: &HashMap<Slot, usize>,
    consts: &mut Vec<Constant>,
    side: &mut Option<Slot>,
) -> Option<Step> {
    let node = &plan.nodes()[i];
    if node.outputs.len() != 1 {
        return None;
    }
    if let NodeOp::Calibration(cal) = node.op
        && !plan.calibrations()[cal].is_weight
    {
        let src = regs.get(&node.inputs.first().copied()??).copied()?;
        return Some(Step::Quant { src, cal });
    }
    let element = node.kernel()?.element_step()?;
    let constant = |j: usize| -> Option<&Tensor> {
        let s = node.inputs.get(j).copied().flatten()?;
        plan.constant(s).map(|t| &**t)
    };
    let reg = |j: usize| -> Option<usize> { regs.get(&node.inputs.get(j).copied()??).copied() };
    let only = |n: usize| node.inputs.len() <= n;
    let arg = |j: usize, consts: &mut Vec<Constant>, side: &mut Option<Slot>| -> Option<Arg> {
        if let Some(r) = reg(j) {
            return Some(Arg::Reg(r));
        }
        let s = node.inputs.get(j).copied().flatten()?;
        if plan.constant(s).is_none() {
            if side.is_some_and(|t| t != s) {
                return None;
            }
            *side = Some(s);
            return Some(Arg::Side);
        }
        let Tensor::F32(a) = constant(j)? else {
            return None;
        };
        let shape = a.shape().to_vec();
        // A scalar, or values along one axis, which must turn out to be axis 1 or the
        // last axis (a transformer's bias) of the input (see `Chain::walk`).
        if a.len() != 1 && shape.iter().filter(|&&n| n != 1).count() != 1 {
            return None;
        }
        consts.push(Constant::new(a.iter().copied().collect(), shape));
        Some(Arg::Const(consts.len() - 1))
    };
    Some(match element {
        ElementStep::Arith(op) => {
            if !only(2) {
                return None;
            }
            let (mark, side_before) = (consts.len(), *side);
            // A side only in an Add (a residual connection): a Mul's other value is
            // often a smaller one that broadcasts (squeeze-excitation's scales), which
            // would leave the chain unable to run.
            let side_fits = |x: &Arg| !matches!(x, Arg::Side) || op == ArithOp::Add;
            let (a, b) = match (arg(0, consts, side), arg(1, consts, side)) {
                (Some(a), Some(b))
                    if (matches!(a, Arg::Reg(_)) || matches!(b, Arg::Reg(_)))
                        && side_fits(&a)
                        && side_fits(&b) =>
                {
                    (a, b)
                }
                _ => {
                    consts.truncate(mark);
                    *side = side_before;
                    return None;
                }
            };
            Step::Arith { op, a, b }
        }
        ElementStep::Clip { attr_bounds } => {
            let src = reg(0)?;
            let bound = |j: usize| match node.inputs.get(j).copied().flatten() {
                None => Some(None),
                Some(_) => constant(j).map(Some),
            };
            let (lo, hi) = step::clip_f32_bounds(attr_bounds, bound(1)?, bound(2)?).ok()?;
            Step::Clip { src, lo, hi }
        }
        ElementStep::Relu => {
            if !only(1) {
                return None;
            }
            Step::Relu { src: reg(0)? }
        }
        ElementStep::Act(act) => {
            if !only(1) {
                return None;
            }
            Step::Act { act, src: reg(0)? }
        }
        ElementStep::BatchNorm { epsilon } => {
            if !only(5) {
                return None;
            }
            let src = reg(0)?;
            let params = [constant(1)?, constant(2)?, constant(3)?, constant(4)?];
            let (a, b) = batch_norm_f32_affine(params, epsilon).ok()?;
            Step::Affine { src, a, b }
        }
    })
}

/// Registers a step reads.
fn reads(step: &Step) -> Vec<usize> {
    let reg = |a: &Arg| match a {
        Arg::Reg(r) => Some(*r),
        Arg::Const(_) | Arg::Side => None,
    };
    match step {
        Step::Arith { a, b, .. } => [reg(a), reg(b)].into_iter().flatten().collect(),
        Step::Clip { src, .. }
        | Step::Relu { src }
        | Step::Act { src, .. }
        | Step::Affine { src, .. }
        | Step::HardSwish { src, .. }
        | Step::Silu { src, .. }
        | Step::Gelu { src, .. }
        | Step::Quant { src, .. } => vec![*src],
        Step::Nop => Vec::new(),
    }
}

/// How many steps read each register (step `k` writes register `k + 1`).
fn readers_of(steps: &[Step]) -> Vec<usize> {
    let mut readers = vec![0usize; steps.len() + 1];
    for s in steps {
        for r in reads(s) {
            readers[r] += 1;
        }
    }
    readers
}

/// Whether `step` is the Mul of registers `x` and `r` in either order: `Some(true)`
/// when it reads `x` first.
fn mul_of(step: &Step, x: usize, r: usize) -> Option<bool> {
    match step {
        Step::Arith {
            op: ArithOp::Mul,
            a: Arg::Reg(a),
            b: Arg::Reg(b),
        } if (*a, *b) == (x, r) || (*a, *b) == (r, x) => Some(*a == x),
        _ => None,
    }
}

/// Turns each run of steps `Add(x, c)`, `Clip(·, lo, hi)`, `Mul(x, ·)`, `Div(·, d)`
/// (operands of Add and Mul in either order, scalar constants, intermediate values
/// read by the next of the four only) into one hard-swish step. The classifier's
/// chains are mostly this; one loop instead of four keeps the values in registers.
fn fuse_hard_swish(steps: &mut [Step], consts: &[Constant]) {
    let scalar = |a: &Arg| match a {
        Arg::Const(c) => consts[*c].scalar(),
        _ => None,
    };
    let readers = readers_of(steps);
    for k in 0..steps.len().saturating_sub(3) {
        // Registers of the Add's, the Clip's and the Mul's outputs.
        let (add, clip, mul) = (k + 1, k + 2, k + 3);
        if readers[add] != 1 || readers[clip] != 1 || readers[mul] != 1 {
            continue;
        }
        let (x, add_arg, x_first_in_add) = match &steps[k] {
            Step::Arith {
                op: ArithOp::Add,
                a: Arg::Reg(x),
                b,
            } => (*x, b, true),
            Step::Arith {
                op: ArithOp::Add,
                a,
                b: Arg::Reg(x),
            } => (*x, a, false),
            _ => continue,
        };
        let Some(add_value) = scalar(add_arg) else {
            continue;
        };
        let (lo, hi) = match &steps[k + 1] {
            Step::Clip { src, lo, hi } if *src == add => (*lo, *hi),
            _ => continue,
        };
        let Some(x_first_in_mul) = mul_of(&steps[k + 2], x, clip) else {
            continue;
        };
        let div_value = match &steps[k + 3] {
            Step::Arith {
                op: ArithOp::Div,
                a: Arg::Reg(a),
                b,
            } if *a == mul => scalar(b),
            _ => None,
        };
        let Some(div_value) = div_value else { continue };
        steps[k + 3] = Step::HardSwish {
            src: x,
            h: HardSwish {
                add: add_value,
                x_first_in_add,
                lo,
                hi,
                x_first_in_mul,
                div: div_value,
            },
        };
        for s in &mut steps[k..k + 3] {
            *s = Step::Nop;
        }
    }
}

/// Turns each `Sigmoid(x)` followed by `Mul(x, ·)` or `Mul(·, x)`, where the Mul is
/// the only reader of the Sigmoid's output, into one SiLU step; and so with a
/// calibration step between the Sigmoid and the Mul, the only reader of each.
/// Calibrated EfficientNet-B0's convs end in such chains: as four steps (a copy for
/// each calibration step that is off) they cost ~9% of a probe's base run more than
/// the float model's SiLU tails.
fn fuse_silu(steps: &mut [Step]) {
    let readers = readers_of(steps);
    for k in 0..steps.len().saturating_sub(1) {
        // Register of the Sigmoid's output.
        let sig = k + 1;
        let x = match &steps[k] {
            Step::Act {
                act: step::Act::Sigmoid,
                src,
            } if readers[sig] == 1 => *src,
            _ => continue,
        };
        if let Some(x_first) = mul_of(&steps[k + 1], x, sig) {
            steps[k + 1] = Step::Silu {
                src: x,
                x_first,
                quant: None,
            };
            steps[k] = Step::Nop;
            continue;
        }
        // Register of the calibration step's output.
        let quantized = k + 2;
        let cal = match steps[k + 1] {
            Step::Quant { src, cal } if src == sig && readers[quantized] == 1 => cal,
            _ => continue,
        };
        if let Some(x_first) = steps.get(k + 2).and_then(|mul| mul_of(mul, x, quantized)) {
            steps[k + 2] = Step::Silu {
                src: x,
                x_first,
                quant: Some(cal),
            };
            steps[k] = Step::Nop;
            steps[k + 1] = Step::Nop;
        }
    }
}

/// Turns each run of steps `Div(x, d)` (or `Mul` of `x` and `d`), `Erf(·)`, `Add` of
/// that and a constant, `Mul` of `x` and that, `Mul` of that and a constant (operands
/// of Add and Muls in either order, scalar constants, intermediate values read by the
/// next of the five only) into one GELU step: how exporters write the erf GELU
/// (ViT, BERT, Swin, ConvNeXt), which ran as five loops over each block.
fn fuse_gelu(steps: &mut [Step], consts: &[Constant]) {
    let scalar = |a: &Arg| match a {
        Arg::Const(c) => consts[*c].scalar(),
        _ => None,
    };
    // A binary step of `op` on register `r` and a scalar constant: the constant, and
    // whether the register comes first.
    let with_constant = |step: &Step, op: ArithOp, r: usize| match step {
        Step::Arith {
            op: o,
            a: Arg::Reg(a),
            b,
        } if *o == op && *a == r => scalar(b).map(|v| (v, true)),
        Step::Arith {
            op: o,
            a,
            b: Arg::Reg(b),
        } if *o == op && *b == r => scalar(a).map(|v| (v, false)),
        _ => None,
    };
    let readers = readers_of(steps);
    for k in 0..steps.len().saturating_sub(4) {
        // Registers of the outputs of the scaling, the Erf, the Add and the first Mul.
        let (scaled, erf, add, mul) = (k + 1, k + 2, k + 3, k + 4);
        if [scaled, erf, add, mul].iter().any(|&r| readers[r] != 1) {
            continue;
        }
        let (x, divide) = match &steps[k] {
            Step::Arith {
                op: ArithOp::Div,
                a: Arg::Reg(x),
                ..
            } => (*x, true),
            Step::Arith {
                op: ArithOp::Mul,
                a: Arg::Reg(x),
                b: Arg::Const(_),
            }
            | Step::Arith {
                op: ArithOp::Mul,
                a: Arg::Const(_),
                b: Arg::Reg(x),
            } => (*x, false),
            _ => continue,
        };
        let op = if divide { ArithOp::Div } else { ArithOp::Mul };
        // (A Div reads `x` first, by the match above.)
        let Some((scale, x_first_in_scale)) = with_constant(&steps[k], op, x) else {
            continue;
        };
        if !matches!(
            &steps[k + 1],
            Step::Act { act: step::Act::Erf, src } if *src == scaled
        ) {
            continue;
        }
        let Some((one, erf_first_in_add)) = with_constant(&steps[k + 2], ArithOp::Add, erf) else {
            continue;
        };
        let Some(x_first_in_mul) = mul_of(&steps[k + 3], x, add) else {
            continue;
        };
        let Some((half, product_first)) = with_constant(&steps[k + 4], ArithOp::Mul, mul) else {
            continue;
        };
        steps[k + 4] = Step::Gelu {
            src: x,
            g: Gelu {
                divide,
                scale,
                x_first_in_scale,
                one,
                erf_first_in_add,
                x_first_in_mul,
                half,
                product_first,
            },
        };
        for s in &mut steps[k..k + 4] {
            *s = Step::Nop;
        }
    }
}

/// The chains of a plan, for each node the chain it starts, and for each conv the
/// chain that can run as its tail.
pub(crate) struct Chains {
    chains: Vec<Chain>,
    at: Vec<Option<usize>>,
    tail_at: Vec<Option<usize>>,
}

impl Chains {
    /// Values only a chain's own nodes read (every chain's outputs but its last).
    pub(crate) fn internal_slots(&self) -> impl Iterator<Item = Slot> + '_ {
        self.chains.iter().flat_map(|c| c.internal.iter().copied())
    }

    /// Finds the chains of `plan` (see [`find_chains`]).
    pub fn find(plan: &Plan) -> Chains {
        let readers = value_readers(plan);
        let chains = find_chains(plan, &readers);
        let mut at = vec![None; plan.nodes().len()];
        let mut tail_at = vec![None; plan.nodes().len()];
        for (c, chain) in chains.iter().enumerate() {
            if chain.standalone {
                at[chain.nodes[0]] = Some(c);
            }
            // A tail: the chain alone reads the output of a node whose kernel can run
            // it on its output as it stores it. Not with a side: a conv's task stores
            // short runs of many channel planes, and reading the side at those runs
            // from memory cost more than the passes the tail saves (ResNet-50's
            // residual Add and Relu at 56x56 in its first stage's conv: 0.94 ms as
            // three nodes, 1.49 as the conv's tail).
            if chain.side.is_none()
                && let Some(p) = plan.producer(chain.input)
                && plan.nodes()[p].outputs.len() == 1
                && plan.nodes()[p].kernel().is_some_and(|k| k.accepts_tail())
                && !plan.outputs().contains(&chain.input)
                && readers[chain.input].iter().all(|r| chain.nodes.contains(r))
            {
                tail_at[p] = Some(c);
            }
        }
        Chains {
            chains,
            at,
            tail_at,
        }
    }

    /// The chain node `node` starts, when it starts one.
    pub fn starting_at(&self, node: usize) -> Option<&Chain> {
        Some(&self.chains[(*self.at.get(node)?)?])
    }

    /// The chain that may run as the tail of node `node`'s kernel.
    pub fn tail_of(&self, node: usize) -> Option<&Chain> {
        Some(&self.chains[(*self.tail_at.get(node)?)?])
    }
}

impl Tail<'_> {
    /// Runs the chain in place on `span`, the outputs from flat index `first` on, all
    /// in one channel plane (with per-channel operands; any run of outputs otherwise).
    pub fn apply(&self, first: usize, span: &mut [f32]) {
        debug_assert!(
            self.walk.channels == 0 || first % self.walk.piece + span.len() <= self.walk.piece
        );
        self.with_regs(|regs| run_span(self, first, span, regs));
    }

    /// Calls `f` with the chain's registers (none for [`InPlace::Direct`] chains).
    fn with_regs(&self, f: impl FnOnce(&mut [f32])) {
        if self.chain.in_place == InPlace::Direct {
            return f(&mut []);
        }
        let regs = self.chain.steps.len() * REG;
        <f32 as crate::ops::gemm_util::Scalar>::with_scratch(regs, f)
    }

    /// Whether the chain has operands that depend on where a value lies (per channel,
    /// along the last axis, or the side value), which need the output's own layout,
    /// not a blocked one.
    pub fn varies_by_position(&self) -> bool {
        self.walk.channels > 0 || self.walk.columns > 0 || self.side.is_some()
    }

    /// Runs the chain in place on `runs` runs of `len` outputs `stride` apart, the
    /// first from flat index `first`, of the output at `y` (a kernel task's outputs:
    /// a stretch of each of its channel planes, or of each of its rows). Runs that
    /// touch and a chain without per-channel operands make one call: on 7x7 and 14x14
    /// planes a call per plane cost more than its work (MobileNetV3's 5x5 depthwise
    /// convs at 7x7, 0.68-0.81 of the time with one call per task). Otherwise the
    /// runs share one fetch of the registers.
    ///
    /// # Safety
    /// `y + first + i·stride .. + len`, for `i < runs`, are the caller's outputs, which
    /// nothing else accesses during the call.
    pub unsafe fn apply_runs(
        &self,
        y: *mut f32,
        first: usize,
        runs: usize,
        len: usize,
        stride: usize,
    ) {
        // SAFETY (both branches): the caller's outputs, as it vouched.
        if len == stride && self.walk.channels == 0 {
            let span = unsafe { std::slice::from_raw_parts_mut(y.add(first), runs * len) };
            self.apply(first, span);
        } else {
            self.with_regs(|regs| {
                for at in (0..runs).map(|i| first + i * stride) {
                    let span = unsafe { std::slice::from_raw_parts_mut(y.add(at), len) };
                    run_span(self, at, span, regs);
                }
            });
        }
    }

    /// Runs the chain in place on all of `y`, the whole output.
    pub fn apply_all(&self, y: &mut [f32]) {
        let piece = match self.walk.channels {
            0 => y.len().max(1),
            _ => self.walk.piece,
        };
        for (i, span) in y.chunks_mut(piece).enumerate() {
            self.apply(i * piece, span);
        }
    }
}

/// The nodes that read each value of `plan`, in plan order, each once.
fn value_readers(plan: &Plan) -> Vec<Vec<usize>> {
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); plan.num_values()];
    for (i, node) in plan.nodes().iter().enumerate() {
        for &s in node.inputs.iter().flatten() {
            if readers[s].last() != Some(&i) {
                readers[s].push(i);
            }
        }
    }
    readers
}

/// Finds the chains of `plan` (`readers`: [`value_readers`]): each starts at an
/// element-wise or activation calibration node reading one non-constant value (or a
/// binary node reading two: the chain's input is the one computed later, the other
/// its side), and grows along such nodes that read only values of the chain,
/// constants and the side, as long as it keeps a single output. A side must be
/// computed before the chain's first node.
fn find_chains(plan: &Plan, readers: &[Vec<usize>]) -> Vec<Chain> {
    let n_values = plan.num_values();
    let nodes = plan.nodes();
    let mut is_output = vec![false; n_values];
    for &s in plan.outputs() {
        is_output[s] = true;
    }
    let is_const = |s: Slot| plan.constant(s).is_some();

    let mut claimed = vec![false; nodes.len()];
    let mut chains = Vec::new();
    for head in 0..nodes.len() {
        if claimed[head] {
            continue;
        }
        let node = &nodes[head];
        let live: Vec<Slot> = node
            .inputs
            .iter()
            .flatten()
            .copied()
            .filter(|&s| !is_const(s))
            .collect();
        let mut distinct = live.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let input = match distinct[..] {
            [] => continue,
            [x] => x,
            // The later of two: the other may then be read as it is computed.
            [a, b] => match (plan.producer(a), plan.producer(b)) {
                (pa, pb) if pa >= pb => a,
                _ => b,
            },
            _ => continue,
        };
        let mut regs = HashMap::from([(input, 0)]);
        let mut consts = Vec::new();
        let mut side = None;
        let Some(first) = compile(plan, head, &regs, &mut consts, &mut side) else {
            continue;
        };
        // A side computed before the chain's first node (a graph input has no
        // producer and comes first).
        let side_ready = |s: Slot| plan.producer(s).is_none_or(|p| p < head);
        regs.insert(node.outputs[0], 1);
        let mut members = vec![head];
        let mut steps = vec![first];
        // The longest prefix that can end the chain: its length, the constants it
        // uses and its side. The head alone serves as a conv's tail only.
        let mut end = (1, consts.len(), side);
        while members.len() < MAX_CHAIN {
            // The first unclaimed node reading a value of the chain (not just its input)
            // and nothing but chain values, constants and one side value.
            let next = members
                .iter()
                .flat_map(|&m| readers[nodes[m].outputs[0]].iter().copied())
                .filter(|&j| !claimed[j] && !members.contains(&j))
                .filter(|&j| {
                    let mut other = nodes[j]
                        .inputs
                        .iter()
                        .flatten()
                        .filter(|&&s| !is_const(s) && !regs.contains_key(&s));
                    other.all(|&s| side.is_none_or(|t| t == s) && side_ready(s))
                })
                .min();
            let Some(j) = next else { break };
            let Some(step) = compile(plan, j, &regs, &mut consts, &mut side) else {
                break;
            };
            regs.insert(nodes[j].outputs[0], regs.len());
            members.push(j);
            steps.push(step);
            // Every output but the last is read only inside the chain.
            let closed = members[..members.len() - 1].iter().all(|&m| {
                let s = nodes[m].outputs[0];
                !is_output[s] && readers[s].iter().all(|r| members.contains(r))
            });
            if closed {
                end = (members.len(), consts.len(), side);
            }
        }
        let (len, n_consts, side) = end;
        if side.is_some_and(|s| !side_ready(s)) {
            continue;
        }
        members.truncate(len);
        steps.truncate(len);
        consts.truncate(n_consts);
        fuse_hard_swish(&mut steps, &consts);
        fuse_silu(&mut steps);
        fuse_gelu(&mut steps, &consts);
        let last = members[len - 1];
        let input_readers_within = readers[input]
            .iter()
            .copied()
            .filter(|&r| r > head && r < last && !members.contains(&r))
            .collect();
        for &m in &members {
            claimed[m] = true;
        }
        chains.push(Chain {
            internal: members[..len - 1]
                .iter()
                .map(|&m| nodes[m].outputs[0])
                .collect(),
            output: nodes[last].outputs[0],
            nodes: members,
            input,
            side,
            input_readers_within,
            standalone: len > 1,
            in_place: InPlace::of(&steps),
            steps,
            consts,
        });
    }
    chains
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar(v: f32) -> Constant {
        Constant::new(vec![v], Vec::new())
    }

    /// The five steps of an exported GELU on register 0 (constants 0: the scale, 1:
    /// one, 2: a half), the scaling a Div, or a Mul with the constant first.
    fn gelu_steps(divide: bool) -> Vec<Step> {
        let arith = |op, a, b| Step::Arith { op, a, b };
        let first = match divide {
            true => arith(ArithOp::Div, Arg::Reg(0), Arg::Const(0)),
            false => arith(ArithOp::Mul, Arg::Const(0), Arg::Reg(0)),
        };
        vec![
            first,
            Step::Act {
                act: step::Act::Erf,
                src: 1,
            },
            arith(ArithOp::Add, Arg::Const(1), Arg::Reg(2)),
            arith(ArithOp::Mul, Arg::Reg(3), Arg::Reg(0)),
            arith(ArithOp::Mul, Arg::Reg(4), Arg::Const(2)),
        ]
    }

    /// The integration test's outputs are the same bits fused or not; this says the
    /// five steps do become one.
    #[test]
    fn the_five_steps_of_a_gelu_become_one() {
        let consts = [scalar(std::f32::consts::SQRT_2), scalar(1.0), scalar(0.5)];
        for divide in [true, false] {
            let mut steps = gelu_steps(divide);
            fuse_gelu(&mut steps, &consts);
            assert!(
                steps[..4].iter().all(|s| matches!(s, Step::Nop)),
                "{steps:?}"
            );
            let Step::Gelu { src: 0, g } = steps[4] else {
                panic!("not fused: {steps:?}");
            };
            assert_eq!(
                (
                    g.divide,
                    g.x_first_in_scale,
                    g.erf_first_in_add,
                    g.x_first_in_mul
                ),
                (divide, divide, false, false)
            );
            assert_eq!((g.one, g.half, g.product_first), (1.0, 0.5, true));
            assert_eq!(InPlace::of(&steps), InPlace::Direct);
        }
        // The Erf's output read twice (by the Add and by an extra step): left alone.
        let mut steps = gelu_steps(true);
        steps.push(Step::Relu { src: 2 });
        fuse_gelu(&mut steps, &consts);
        assert!(
            steps
                .iter()
                .all(|s| !matches!(s, Step::Nop | Step::Gelu { .. }))
        );
    }
}
