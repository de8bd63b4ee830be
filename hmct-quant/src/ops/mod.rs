//! Operator kernels and the registry that picks one per node at plan time.
//!
//! Every op module exposes `pub(crate) fn build(spec: &NodeSpec) -> Option<Result<Box<dyn
//! Kernel>, OpError>>`: `None` when it does not handle `spec.op_type`, otherwise the
//! kernel or the reason it cannot run this node (an attribute value, opset or form it
//! does not support). Checking happens at build time so a model with an unsupported
//! node is rejected before anything runs.

pub mod attrs;

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
pub(crate) mod arrays;
pub(crate) mod blocked;
pub(crate) mod broadcast;
pub(crate) mod channel_lanes;
pub(crate) mod conv;
pub(crate) mod conv_direct;
pub(crate) mod conv_dw;
pub(crate) mod conv_winograd;
#[cfg(target_arch = "x86_64")]
pub(crate) mod dw_rows;
pub(crate) mod elementwise;
pub(crate) mod fastmath;
pub(crate) mod gemm_util;
pub(crate) mod gemv;
pub(crate) mod matmul;
pub(crate) mod misc;
pub(crate) mod norm;
pub(crate) mod num;
pub(crate) mod packed_gemm;
pub(crate) mod pool;
pub(crate) mod pool_rows;
pub(crate) mod quantize;
pub(crate) mod reduce;
pub(crate) mod resize;
pub(crate) mod rnn;
pub(crate) mod shape;
pub(crate) mod weight_cache;
pub(crate) mod window;

pub use attrs::Attrs;
pub use broadcast::broadcast_shapes;

use hmct_tensor::Tensor;

/// Why a kernel cannot be built or run. The executor adds node name, op type and opset.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OpError {
    /// Something valid in ONNX that this interpreter does not implement.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Inputs or attributes that break the operator's contract.
    #[error("{0}")]
    Invalid(String),
}

impl OpError {
    pub fn unsupported(msg: impl Into<String>) -> Self {
        OpError::Unsupported(msg.into())
    }
    pub fn invalid(msg: impl Into<String>) -> Self {
        OpError::Invalid(msg.into())
    }
}

/// What a kernel builder knows about a node at plan time.
#[derive(Clone, Copy)]
pub struct NodeSpec<'a> {
    pub name: &'a str,
    pub op_type: &'a str,
    /// Normalized domain: `""` for the standard domain (also written `ai.onnx`).
    pub domain: &'a str,
    /// The opset version the model imports for the node's domain.
    pub opset: i64,
    pub attrs: Attrs<'a>,
    /// Number of inputs as written in the node, including empty (omitted) ones.
    pub num_inputs: usize,
    /// Which inputs are present (non-empty names).
    pub inputs_present: &'a [bool],
    pub num_outputs: usize,
    /// Inputs whose values are constant (initializers, `Constant` outputs, folded
    /// values), known at plan time. A kernel may precompute from them (e.g. repack
    /// weights); it still receives them at run time.
    pub const_inputs: &'a [Option<&'a Tensor>],
    /// Inputs whose every distinct value is one tensor that lives as long as the
    /// kernel: constants, and outputs of weight calibration nodes (a session keeps one
    /// fake-quantized weight per setting and never frees it). A kernel may cache what
    /// it derives from such an input keyed by the address of its data; other inputs'
    /// buffers are recycled, so their addresses say nothing about their contents.
    pub stable_inputs: &'a [bool],
}

/// A kernel bound to one node. Runs on inputs in node order (`None` for omitted
/// optional inputs) and returns the node's outputs in order (trailing optional
/// outputs may be left out).
///
/// Kernels must be deterministic: the same inputs give bit-identical outputs whatever
/// the rayon thread count (split work by output element, never reduce across threads
/// in a schedule-dependent order).
pub trait Kernel: Send + Sync {
    fn run(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError>;

    /// Inputs whose buffer the kernel can write its output into, in order of
    /// preference: element-wise ops whose output may have that input's shape and type.
    /// Writing in place saves a large allocation and a pass of memory traffic when the
    /// executor owns an input that nothing reads afterwards.
    fn reusable_inputs(&self) -> &[usize] {
        &[]
    }

    /// Same outputs as [`Kernel::run`], with input `i` (one of
    /// [`Kernel::reusable_inputs`]) handed over as `owned` and `None` in `inputs`.
    /// The kernel writes into `owned` when shapes and types allow it, and otherwise
    /// runs as usual.
    fn run_reusing(
        &self,
        inputs: &[Option<&Tensor>],
        i: usize,
        owned: Tensor,
    ) -> Result<Vec<Tensor>, OpError> {
        run_not_reusing(self, inputs, i, owned)
    }

    /// This kernel as a step over f32 values that a fused chain of element-wise nodes
    /// can run, or `None` when it cannot be fused. Only this crate's kernels fuse, so
    /// the type stays crate-private.
    #[allow(private_interfaces)]
    fn element_step(&self) -> Option<elementwise::step::ElementStep> {
        None
    }

    /// Whether [`Kernel::run_with_tail`] can run a chain of element-wise nodes on this
    /// kernel's single output as it stores it (a Conv's Relu, Clip or SiLU): the
    /// chain's pass over memory then reads outputs still in cache.
    fn accepts_tail(&self) -> bool {
        false
    }

    /// [`Kernel::run`], then `tail` on the output in place. Returns whether the tail
    /// ran: when its operands do not fit the output, the output is the plain one and
    /// the chain's nodes run after as usual. Outputs are those of the kernel followed
    /// by the chain's nodes, bit for bit.
    #[allow(private_interfaces)]
    fn run_with_tail(
        &self,
        inputs: &[Option<&Tensor>],
        tail: &crate::fusion::ChainArgs,
    ) -> Result<(Vec<Tensor>, bool), OpError> {
        let _ = tail;
        self.run(inputs).map(|out| (out, false))
    }

    /// Whether [`Kernel::run_rows`] may run this node for several samples at once: a
    /// product by a constant matrix, which for one row is bound by streaming the matrix
    /// from memory, a stream the samples' rows can share.
    fn batches_rows(&self) -> bool {
        false
    }

    /// [`Kernel::run`] on each sample's inputs (`samples[s]` as `inputs`), computed
    /// together and bit for bit the same per sample, or `None` when these inputs do
    /// not allow it (the caller then runs each sample alone).
    fn run_rows(
        &self,
        samples: &[Vec<Option<&Tensor>>],
    ) -> Option<Result<Vec<Vec<Tensor>>, OpError>> {
        let _ = samples;
        None
    }

    /// What kind of conv this node's kernel is for a weight (input 1) of shape
    /// `weight`, as far as channel-blocked values go (see [`blocked`]): one that reads
    /// a blocked input 0 and can store a blocked output, or `None` for every other
    /// kernel. The executor keeps a value blocked only between such convs.
    fn blocked_conv(&self, weight: &[usize]) -> Option<blocked::BlockedConv> {
        let _ = weight;
        None
    }

    /// [`Kernel::run_with_tail`] (or [`Kernel::run`] without a tail) on an input 0
    /// that may be blocked, storing a blocked output when `layouts.output` asks and
    /// the kernel can. Only called on kernels whose [`Kernel::blocked_conv`] is
    /// `Some`; the outputs are those of the plain run, bit for bit, in either layout.
    #[allow(private_interfaces)]
    fn run_blocked(
        &self,
        inputs: &[Option<&Tensor>],
        tail: Option<&crate::fusion::ChainArgs>,
        layouts: blocked::Layouts,
    ) -> Result<(Vec<Tensor>, bool), OpError> {
        let _ = layouts;
        match tail {
            Some(tail) => self.run_with_tail(inputs, tail),
            None => self.run(inputs).map(|out| (out, false)),
        }
    }
}

/// [`Kernel::run`] with `owned` put back as input `i`; its buffer is recycled after.
pub(crate) fn run_not_reusing<K: Kernel + ?Sized>(
    kernel: &K,
    inputs: &[Option<&Tensor>],
    i: usize,
    owned: Tensor,
) -> Result<Vec<Tensor>, OpError> {
    let mut all = inputs.to_vec();
    if let Some(slot) = all.get_mut(i) {
        *slot = Some(&owned);
    }
    let out = kernel.run(&all);
    crate::buffers::give(owned);
    out
}

impl<F> Kernel for F
where
    F: Fn(&[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> + Send + Sync,
{
    fn run(&self, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        self(inputs)
    }
}

type Builder = fn(&NodeSpec) -> Option<Result<Box<dyn Kernel>, OpError>>;

const BUILDERS: &[Builder] = &[
    elementwise::build,
    reduce::build,
    shape::build,
    conv::build,
    matmul::build,
    pool::build,
    norm::build,
    resize::build,
    quantize::build,
    rnn::build,
    misc::build,
];

/// Builds the kernel for a standard-domain node.
pub fn build_kernel(spec: &NodeSpec) -> Result<Box<dyn Kernel>, OpError> {
    if !spec.domain.is_empty() {
        return Err(OpError::unsupported(format!(
            "operator domain '{}'",
            spec.domain
        )));
    }
    for b in BUILDERS {
        if let Some(k) = b(spec) {
            return k;
        }
    }
    Err(OpError::unsupported("operator not implemented"))
}

/// Runs `f` with every kernel it calls kept on the calling thread, as a one-thread
/// [`crate::Session`] runs them; for timing a kernel alone at one thread.
pub fn on_calling_thread<R>(f: impl FnOnce() -> R) -> R {
    crate::par::sequential(f)
}

/// Fetches required input `i` of a kernel's inputs.
pub fn input<'t>(inputs: &[Option<&'t Tensor>], i: usize) -> Result<&'t Tensor, OpError> {
    inputs
        .get(i)
        .copied()
        .flatten()
        .ok_or_else(|| OpError::invalid(format!("missing required input {i}")))
}

/// Fetches optional input `i`: `None` when it is omitted.
pub(crate) fn opt_input<'t>(inputs: &[Option<&'t Tensor>], i: usize) -> Option<&'t Tensor> {
    inputs.get(i).copied().flatten()
}

/// Reads an integer vector input (shapes, axes, pads, ...).
pub fn input_i64s(inputs: &[Option<&Tensor>], i: usize) -> Result<Vec<i64>, OpError> {
    let t = input(inputs, i)?;
    t.to_i64_vec().ok_or_else(|| {
        OpError::invalid(format!(
            "input {i} must be an integer tensor, got {}",
            t.dtype()
        ))
    })
}

/// Resolves a possibly negative axis against `rank`.
pub fn normalize_axis(axis: i64, rank: usize) -> Result<usize, OpError> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r.max(1) {
        return Err(OpError::invalid(format!(
            "axis {axis} out of range for rank {rank}"
        )));
    }
    Ok(a as usize)
}
