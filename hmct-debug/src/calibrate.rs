//! Calibration of a float ONNX model: inserting HzCalibration nodes with thresholds
//! computed from calibration data (the format is HZCALIBRATION.md).
//!
//! - **Activation nodes** go on the float, non-constant inputs of the quantized
//!   operators ([`DEFAULT_OP_TYPES`], or `op_types`): one node per tensor, however
//!   many quantized nodes read it (graph inputs included); readers that are not
//!   quantized keep reading the float tensor. Thresholds come from the data by
//!   [`Method`]. Tensors that do not depend on the data ([`data_independent`]: the
//!   output of `ConstantOfShape`, a `Shape → Gather → ...` chain, anything computed
//!   from constants and shapes alone) are not activations: a toolchain folds them to
//!   constants before calibrating, so they are left unquantized (the model is not
//!   changed) and listed in [`CalibrationReport::constant_inputs`].
//! - **Weight nodes** go on the constant weights of Conv, ConvTranspose, Gemm and
//!   MatMul (initializers, `Constant` outputs, or anything the planner folds to a
//!   constant), one threshold per output channel: Conv axis 0, ConvTranspose axis 1,
//!   Gemm axis 1 (axis 0 with `transB`), MatMul `[..., K, N]` the last axis; the
//!   threshold is the channel's largest |w|. A ConvTranspose with `group > 1` has
//!   `group * C_out/g` output channels spread over axes 0 and 1 (§3 of the spec):
//!   element `[i, j, ..]` belongs to channel `(i / (C_in/g)) * (C_out/g) + j`.
//! - Nodes are named `<tensor>_HzCalibration` (with `_1`, `_2`, ... on a clash), their
//!   output `<name>_output`, and carry `qtype`, `thresholds`, `scales`, `axis` (per
//!   channel), `group` (weights), `constant = 1`, `switch = ON` and `tensor_type`.
//!   Nothing else in the model changes, except that unnamed nodes get names when the
//!   model is loaded.
//!
//! The data is streamed: the first pass records max|x| per tensor; the methods that
//! need a distribution make a second pass filling fixed-range histograms, so memory
//! does not grow with the number of samples.

mod ops;
mod stats;

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use hmct_ir::{
    CalibrationInsert, CalibrationSpec, IrError, Model, NodeId, QType, TensorType, close_matches,
    did_you_mean,
};
use hmct_proto::onnx::StringStringEntryProto;
use hmct_quant::{Capture, Config, PlanError, RunError, Session, Slot, plan_model};
use hmct_tensor::{Dataset, InputSpec, Tensor, TensorError};
use rayon::prelude::*;
use serde::Serialize;

pub use ops::{DEFAULT_OP_TYPES, ONNX_OP_TYPES, is_onnx_op};
pub use stats::{
    AbsHistogram, kl_bins, kl_threshold, max_abs, mse_threshold, percentile_threshold,
};

/// The threshold used for a tensor that is zero on every sample (any positive value
/// quantizes it exactly; zero itself is not a valid threshold).
pub const ZERO_TENSOR_THRESHOLD: f32 = 1e-6;

/// How activation thresholds are computed from the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// The largest |x| over all samples.
    Max,
    /// The `percentile`-quantile of |x| over all samples.
    Percentile,
    /// The entropy method (smallest KL divergence) on a histogram of |x|.
    Kl,
    /// The threshold minimizing the expected squared quantization error.
    Mse,
}

impl Method {
    pub const NAMES: [&str; 4] = ["max", "percentile", "kl", "mse"];

    fn needs_histogram(self) -> bool {
        self != Method::Max
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Method::Max => "max",
            Method::Percentile => "percentile",
            Method::Kl => "kl",
            Method::Mse => "mse",
        })
    }
}

impl FromStr for Method {
    type Err = CalibrateError;

    fn from_str(s: &str) -> Result<Method, CalibrateError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "max" => Ok(Method::Max),
            "percentile" => Ok(Method::Percentile),
            "kl" | "entropy" => Ok(Method::Kl),
            "mse" => Ok(Method::Mse),
            _ => Err(CalibrateError::InvalidOption(format!(
                "unknown calibration method '{s}' (expected one of: {})",
                Method::NAMES.join(", ")
            ))),
        }
    }
}

/// What to calibrate and how.
#[derive(Clone, Debug)]
pub struct CalibrateOptions {
    pub method: Method,
    /// Quantile for [`Method::Percentile`], in (0, 1].
    pub percentile: f64,
    /// Histogram bins for the histogram methods.
    pub num_bins: usize,
    /// qtype of activation nodes.
    pub qtype: QType,
    /// qtype of weight nodes.
    pub weight_qtype: QType,
    /// Per-node qtypes: a regular node name sets the qtype of its activation inputs
    /// (a tensor read by several nodes takes the widest type asked for); a calibration
    /// node name as it will be written (`<tensor>_HzCalibration`) sets that node,
    /// weight nodes included.
    pub node_qtypes: Vec<(String, QType)>,
    /// Operators whose inputs are quantized.
    pub op_types: Vec<String>,
    /// Regular nodes left float (no calibration on any of their inputs).
    pub skip_nodes: Vec<String>,
    /// Use only the first N samples.
    pub data_num: Option<usize>,
    /// Interpreter threads (0 = all cores).
    pub threads: usize,
    /// Raised by another thread to stop the calibration runs between two nodes
    /// (Ctrl-C in the Python package); the call then fails with a cancelled run.
    pub cancel: Option<Arc<AtomicBool>>,
}

impl Default for CalibrateOptions {
    fn default() -> Self {
        CalibrateOptions {
            method: Method::Max,
            percentile: 0.99995,
            num_bins: 2048,
            qtype: QType::INT8,
            weight_qtype: QType::INT8,
            node_qtypes: Vec::new(),
            op_types: DEFAULT_OP_TYPES.iter().map(|s| s.to_string()).collect(),
            skip_nodes: Vec::new(),
            data_num: None,
            threads: 0,
            cancel: None,
        }
    }
}

/// Why calibration failed.
#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    #[error(transparent)]
    Ir(#[from] IrError),
    #[error("{file}")]
    Plan {
        file: String,
        #[source]
        source: PlanError,
    },
    #[error(transparent)]
    Run(#[from] RunError),
    #[error(transparent)]
    Data(#[from] TensorError),
    #[error(
        "{file}: the model already has {count} HzCalibration node(s); calibrate takes a float model"
    )]
    AlreadyCalibrated { file: String, count: usize },
    #[error("{file}: nothing to quantize: {reason}")]
    NothingToQuantize { file: String, reason: String },
    #[error("unknown op type '{name}'{}", did_you_mean(.suggestions))]
    UnknownOpType {
        name: String,
        suggestions: Vec<String>,
    },
    #[error("{file}: no node named '{name}'{}", did_you_mean(.suggestions))]
    UnknownNode {
        file: String,
        name: String,
        suggestions: Vec<String>,
    },
    #[error(
        "node '{node}': ConvTranspose weight of shape {shape:?} cannot be split into \
         {group} groups"
    )]
    BadGroups {
        node: String,
        group: i64,
        shape: Vec<usize>,
    },
    #[error("no calibration samples")]
    NoSamples,
    #[error("{0}")]
    InvalidOption(String),
}

impl CalibrateError {
    /// True for errors in what the user asked for (names, option values) rather than
    /// in the model or the data.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            CalibrateError::UnknownOpType { .. }
                | CalibrateError::UnknownNode { .. }
                | CalibrateError::InvalidOption(_)
        )
    }
}

/// A calibrated model and what was done.
#[derive(Debug)]
pub struct Calibrated {
    pub model: Model,
    pub report: CalibrationReport,
}

/// What calibration inserted, for summaries and `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct CalibrationReport {
    pub method: Method,
    /// The quantile, for the percentile method.
    pub percentile: Option<f64>,
    /// Samples used (the first `samples` of the data).
    pub samples: usize,
    /// Samples in the data.
    pub samples_available: usize,
    pub activation_nodes: usize,
    pub weight_nodes: usize,
    /// Every inserted node, in graph order.
    pub nodes: Vec<InsertedNode>,
    /// Inputs of quantized ops that depend on no data (constant-foldable: computed
    /// from constants and shapes alone), left unquantized, in graph order.
    pub constant_inputs: Vec<String>,
    /// Tensors left float and settings without effect, one sentence each.
    pub notes: Vec<String>,
}

/// One inserted calibration node.
#[derive(Clone, Debug, Serialize)]
pub struct InsertedNode {
    pub name: String,
    /// The tensor it quantizes.
    pub input: String,
    /// `activation` or `weight`.
    pub kind: &'static str,
    pub qtype: String,
    /// One per channel for per-channel weights.
    pub thresholds: Vec<f32>,
    pub axis: Option<i64>,
    /// Largest finite |x| seen (activations over the samples, weights over the tensor).
    pub max_abs: f32,
    /// The regular nodes reading it.
    pub consumers: Vec<String>,
}

/// The input specs of a planned model, for opening a calibration-data folder.
pub fn input_specs(session: &Session) -> Vec<InputSpec> {
    session.plan().input_specs()
}

/// Calibrates `model` (a float model) on the calibration-data folder `data`.
/// `progress(done, total)` is called after each model run.
pub fn calibrate(
    model: &Model,
    data: &Path,
    options: &CalibrateOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Calibrated, CalibrateError> {
    let prepared = prepare(model, options)?;
    let dataset = Dataset::open(data, &input_specs(&prepared.session))?;
    let n = dataset.len();
    prepared.run(n, &|i| dataset.sample(i), progress)
}

/// Calibrates `model` on samples held in memory (each a list of `(input, tensor)`).
pub fn calibrate_samples(
    model: &Model,
    samples: &[Vec<(String, Tensor)>],
    options: &CalibrateOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Calibrated, CalibrateError> {
    let prepared = prepare(model, options)?;
    prepared.run(samples.len(), &|i| Ok(samples[i].clone()), progress)
}

type SampleFn<'a> = dyn Fn(usize) -> Result<Vec<(String, Tensor)>, TensorError> + 'a;

/// A tensor that gets a calibration node.
struct Candidate {
    tensor: String,
    slot: Slot,
    /// `None` for activations.
    weight: Option<ops::WeightLayout>,
    consumers: Vec<(NodeId, usize)>,
    qtype: QType,
    name: String,
}

/// A checked model, its session, and the calibration nodes it will get.
struct Prepared<'m> {
    model: &'m Model,
    options: &'m CalibrateOptions,
    session: Session,
    candidates: Vec<Candidate>,
    constant_inputs: Vec<String>,
    notes: Vec<String>,
}

fn prepare<'m>(
    model: &'m Model,
    options: &'m CalibrateOptions,
) -> Result<Prepared<'m>, CalibrateError> {
    check_options(options)?;
    let file = model.file().to_string();
    let existing = model.calibration_nodes().len();
    if existing > 0 {
        return Err(CalibrateError::AlreadyCalibrated {
            file,
            count: existing,
        });
    }
    let unknown_node = |name: &str| CalibrateError::UnknownNode {
        file: file.clone(),
        name: name.to_string(),
        suggestions: close_matches(name, model.node_mappings().keys().map(String::as_str)),
    };
    let skip: HashSet<&str> = options.skip_nodes.iter().map(String::as_str).collect();
    if let Some(bad) = skip
        .iter()
        .find(|n| !model.node_mappings().contains_key(**n))
    {
        return Err(unknown_node(bad));
    }
    let plan = plan_model(model).map_err(|source| CalibrateError::Plan {
        file: file.clone(),
        source,
    })?;
    let mut session = Session::new(plan, options.threads)?;
    if let Some(flag) = &options.cancel {
        session.set_cancel_flag(flag.clone());
    }
    let op_types: HashSet<&str> = options.op_types.iter().map(String::as_str).collect();
    let (mut candidates, constant_inputs) =
        collect_candidates(model, &session, &op_types, &skip, options)?;
    let notes = apply_node_qtypes(model, &mut candidates, options, &unknown_node)?;
    Ok(Prepared {
        model,
        options,
        session,
        candidates,
        constant_inputs,
        notes,
    })
}

fn check_options(options: &CalibrateOptions) -> Result<(), CalibrateError> {
    for op in &options.op_types {
        if !is_onnx_op(op) {
            return Err(CalibrateError::UnknownOpType {
                name: op.clone(),
                suggestions: close_matches(op, ONNX_OP_TYPES.iter().copied()),
            });
        }
    }
    let p = options.percentile;
    if options.method == Method::Percentile && !(p > 0.0 && p <= 1.0) {
        return Err(CalibrateError::InvalidOption(format!(
            "percentile {p} is not in (0, 1]"
        )));
    }
    if options.num_bins < 16 {
        return Err(CalibrateError::InvalidOption(format!(
            "{} histogram bins are too few (at least 16)",
            options.num_bins
        )));
    }
    if options.data_num == Some(0) {
        return Err(CalibrateError::InvalidOption(
            "data_num must be at least 1".into(),
        ));
    }
    for q in std::iter::once(&options.qtype)
        .chain([&options.weight_qtype])
        .chain(options.node_qtypes.iter().map(|(_, q)| q))
    {
        check_qtype(q)?;
    }
    Ok(())
}

/// The qtypes calibration can write: symmetric signed integers.
pub fn check_qtype(q: &QType) -> Result<(), CalibrateError> {
    match q {
        QType::Int { signed: true, bits } if (2..=32).contains(bits) => Ok(()),
        _ => Err(CalibrateError::InvalidOption(format!(
            "qtype '{q}' cannot be calibrated (expected a signed integer type such as int8 or int16)"
        ))),
    }
}

fn int_attr(model: &Model, id: NodeId, name: &str) -> Option<i64> {
    model
        .node(id)
        .attribute
        .iter()
        .find(|a| a.name() == name)
        .and_then(|a| a.i)
}

/// The values of `model` that do not depend on the data, only on constants and on
/// tensor shapes: initializers, `Constant` outputs, the outputs of `Shape` and `Size`
/// (shapes), of `ConstantOfShape` and `EyeLike` (fixed values whatever their shape),
/// and of any other node all of whose inputs are such values. With static input
/// shapes they are constants a toolchain folds; with dynamic ones they still carry
/// no activation. Random generators and control flow count as data.
pub fn data_independent(model: &Model) -> HashSet<String> {
    let graph = model.graph_proto();
    let mut out: HashSet<String> = graph
        .initializer
        .iter()
        .map(|t| t.name().to_string())
        .collect();
    // Graph inputs shadow initializers of the same name (they may be fed).
    for input in &graph.input {
        out.remove(input.name());
    }
    for node in model.nodes() {
        let standard = matches!(node.domain(), "" | "ai.onnx");
        let independent = standard
            && match node.op_type() {
                "Shape" | "Size" | "ConstantOfShape" | "EyeLike" | "Constant" => true,
                "If" | "Loop" | "Scan" | "RandomNormal" | "RandomUniform" | "RandomNormalLike"
                | "RandomUniformLike" | "Multinomial" | "Bernoulli" => false,
                _ => {
                    node.input.iter().any(|i| !i.is_empty())
                        && node
                            .input
                            .iter()
                            .all(|i| i.is_empty() || out.contains(i.as_str()))
                }
            };
        if independent {
            out.extend(node.output.iter().filter(|o| !o.is_empty()).cloned());
        }
    }
    out
}

/// The calibration nodes to insert, and the inputs of quantized ops left float
/// because they depend on no data.
fn collect_candidates(
    model: &Model,
    session: &Session,
    op_types: &HashSet<&str>,
    skip: &HashSet<&str>,
    options: &CalibrateOptions,
) -> Result<(Vec<Candidate>, Vec<String>), CalibrateError> {
    let plan = session.plan();
    let independent = data_independent(model);
    let mut constant_inputs: Vec<String> = Vec::new();
    let mut candidates: Vec<Candidate> = Vec::new();
    // Activations are keyed by tensor; weights by tensor and layout, since a weight
    // read with two layouts needs two nodes.
    let mut index: HashMap<(String, Option<ops::WeightLayout>), usize> = HashMap::new();
    for (id, node) in model.nodes().iter().enumerate() {
        let op = node.op_type();
        if !matches!(node.domain(), "" | "ai.onnx")
            || !op_types.contains(op)
            || skip.contains(node.name())
        {
            continue;
        }
        for i in ops::data_inputs(op, node.input.len()) {
            let value = &node.input[i];
            let Some(slot) = (!value.is_empty()).then(|| plan.value(value)).flatten() else {
                continue;
            };
            let weight = match plan.constant(slot) {
                None if independent.contains(value.as_str()) => {
                    if !constant_inputs.contains(value) {
                        constant_inputs.push(value.clone());
                    }
                    continue;
                }
                None => None,
                Some(c) => {
                    let group = int_attr(model, id, "group").unwrap_or(1);
                    let trans_b = int_attr(model, id, "transB").unwrap_or(0) != 0;
                    // A constant that is not a weight position stays float.
                    let Some(layout) = ops::weight_layout(op, i, c.shape().len(), trans_b, group)
                    else {
                        continue;
                    };
                    if op == "ConvTranspose"
                        && group > 1
                        && (group as usize > c.shape()[0] || c.shape()[0] % group as usize != 0)
                    {
                        return Err(CalibrateError::BadGroups {
                            node: node.name().to_string(),
                            group,
                            shape: c.shape().to_vec(),
                        });
                    }
                    Some(layout)
                }
            };
            let key = (value.clone(), weight);
            let k = *index.entry(key).or_insert_with(|| {
                candidates.push(Candidate {
                    tensor: value.clone(),
                    slot,
                    weight,
                    consumers: Vec::new(),
                    qtype: if weight.is_some() {
                        options.weight_qtype.clone()
                    } else {
                        options.qtype.clone()
                    },
                    name: String::new(),
                });
                candidates.len() - 1
            });
            candidates[k].consumers.push((id, i));
        }
    }
    let mut taken: HashSet<String> = model.node_mappings().keys().cloned().collect();
    for c in &mut candidates {
        c.name = free_name(model, &mut taken, &format!("{}_HzCalibration", c.tensor));
    }
    Ok((candidates, constant_inputs))
}

/// `base`, or `base_1`, `base_2`, ...: the first name that no node has and whose
/// `_output` value does not exist yet.
fn free_name(model: &Model, taken: &mut HashSet<String>, base: &str) -> String {
    let name = std::iter::once(base.to_string())
        .chain((1..).map(|k| format!("{base}_{k}")))
        .find(|n| {
            !taken.contains(n)
                && !taken.contains(&format!("{n}_output"))
                && model.producer(&format!("{n}_output")).is_none()
                && !model.inputs().iter().any(|i| *i == format!("{n}_output"))
                && model.initializer(&format!("{n}_output")).is_none()
        })
        .expect("an unbounded sequence has a free name");
    taken.insert(name.clone());
    taken.insert(format!("{name}_output"));
    name
}

fn bits_of(q: &QType) -> u8 {
    match q {
        QType::Int { bits, .. } => *bits,
        _ => 0,
    }
}

fn apply_node_qtypes(
    model: &Model,
    candidates: &mut [Candidate],
    options: &CalibrateOptions,
    unknown_node: &dyn Fn(&str) -> CalibrateError,
) -> Result<Vec<String>, CalibrateError> {
    let mut notes = Vec::new();
    // Regular-node settings first (widest wins), then calibration-node names, which
    // are exact.
    let mut explicit = Vec::new();
    for (name, qtype) in &options.node_qtypes {
        if let Some(k) = candidates.iter().position(|c| c.name == *name) {
            explicit.push((k, qtype));
            continue;
        }
        let Some(&id) = model.node_mappings().get(name) else {
            let mut err = unknown_node(name);
            if let CalibrateError::UnknownNode { suggestions, .. } = &mut err {
                suggestions.extend(close_matches(
                    name,
                    candidates.iter().map(|c| c.name.as_str()),
                ));
                suggestions.truncate(3);
            }
            return Err(err);
        };
        let mut hit = false;
        for c in candidates.iter_mut().filter(|c| c.weight.is_none()) {
            if c.consumers.iter().any(|&(n, _)| n == id) {
                hit = true;
                c.qtype = widest(&c.qtype, qtype, &options.qtype);
            }
        }
        if !hit {
            notes.push(format!(
                "node '{name}' has no activation calibration node, so its qtype {qtype} has no effect"
            ));
        }
    }
    for (k, qtype) in explicit {
        candidates[k].qtype = qtype.clone();
    }
    Ok(notes)
}

/// The type a shared tensor gets when one of its readers asks for `asked`: the wider
/// of the two, where the default type counts as "nothing asked yet".
fn widest(current: &QType, asked: &QType, default: &QType) -> QType {
    if current == default || bits_of(asked) > bits_of(current) {
        asked.clone()
    } else {
        current.clone()
    }
}

/// The values of a float tensor, whatever its memory layout.
fn f32_values(t: &Tensor) -> Option<Cow<'_, [f32]>> {
    let a = t.as_f32()?;
    Some(match a.as_slice_memory_order() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(a.iter().copied().collect()),
    })
}

/// Largest |w| per slice along `axis` (the whole tensor when `None`).
/// Largest |w| per channel along `axis`; with `groups > 1` (a grouped ConvTranspose
/// weight `[C_in, C_out/g, ..]`, axis 1) per output channel of every group.
fn channel_max_abs(data: &[f32], shape: &[usize], axis: Option<usize>, groups: usize) -> Vec<f32> {
    let Some(axis) = axis else {
        return vec![max_abs(data)];
    };
    let channels = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let outers: usize = shape[..axis].iter().product();
    let groups = groups.max(1);
    let outers_per_group = (outers / groups).max(1);
    let mut out = vec![0f32; groups * channels];
    for (k, chunk) in data.chunks(inner.max(1)).enumerate() {
        let outer = k / channels.max(1);
        let c = (outer / outers_per_group).min(groups - 1) * channels + k % channels.max(1);
        out[c] = out[c].max(max_abs(chunk));
    }
    out
}

/// Quantization levels on the positive side, zero included (qmax + 1: 128 for int8).
fn levels(q: &QType) -> usize {
    q.qrange().map_or(128, |(_, hi)| hi as usize + 1)
}

/// A threshold that can be written: positive, with a nonzero scale.
fn usable(t: f32, max: f32, qtype: &QType) -> f32 {
    let qmax = qtype.qrange().map_or(1.0, |(_, hi)| hi as f32);
    let ok = |v: f32| v.is_finite() && v > 0.0 && v / qmax > 0.0;
    if ok(t) {
        t
    } else if ok(max) {
        max
    } else {
        ZERO_TENSOR_THRESHOLD
    }
}

impl Prepared<'_> {
    fn run(
        self,
        available: usize,
        sample: &SampleFn,
        progress: &(dyn Fn(usize, usize) + Sync),
    ) -> Result<Calibrated, CalibrateError> {
        let Prepared {
            model,
            options,
            session,
            mut candidates,
            constant_inputs,
            mut notes,
        } = self;
        let file = model.file().to_string();
        if available == 0 {
            return Err(CalibrateError::NoSamples);
        }
        let used = options.data_num.map_or(available, |n| n.min(available));
        let plan = session.plan();

        // Weights: thresholds straight from the constant.
        let mut thresholds: Vec<Option<(Vec<f32>, f32)>> = vec![None; candidates.len()];
        for (k, c) in candidates.iter().enumerate() {
            let Some(layout) = c.weight else { continue };
            let w = plan.constant(c.slot).expect("weights are constants");
            let Some(data) = f32_values(w) else {
                notes.push(format!(
                    "weight '{}' is {}, not float32; left float",
                    c.tensor,
                    w.dtype()
                ));
                continue;
            };
            let per = channel_max_abs(&data, w.shape(), layout.axis, layout.regrouped());
            let max = per.iter().fold(0f32, |m, &v| m.max(v));
            let t = per.iter().map(|&v| usable(v, v, &c.qtype)).collect();
            thresholds[k] = Some((t, max));
        }

        // Activations: one or two passes over the data.
        let acts: Vec<usize> = (0..candidates.len())
            .filter(|&k| candidates[k].weight.is_none())
            .collect();
        let wanted: Vec<Slot> = acts.iter().map(|&k| candidates[k].slot).collect();
        let passes = if options.method.needs_histogram() {
            2
        } else {
            1
        };
        let total = passes * used;
        let mut done = 0;
        let mut float_ok = vec![true; acts.len()];
        let mut maxima = vec![0f32; acts.len()];
        // Finite values seen per tensor: the entropy method sizes its histogram by it.
        let mut counts = vec![0u64; acts.len()];
        let run_sample = |s: usize| -> Result<Vec<Arc<Tensor>>, CalibrateError> {
            let (names, tensors): (Vec<String>, Vec<Tensor>) = sample(s)?.into_iter().unzip();
            let refs: Vec<(&str, Tensor)> = names.iter().map(String::as_str).zip(tensors).collect();
            let bound = session.bind_inputs(&refs)?;
            let values =
                session.run_from(&bound, None, &Config::float(), &wanted, Capture::Wanted)?;
            Ok(wanted
                .iter()
                .map(|&w| session.value(&values, w))
                .collect::<Result<_, _>>()?)
        };
        if !acts.is_empty() {
            for s in 0..used {
                let tensors = run_sample(s)?;
                if s == 0 {
                    for (j, t) in tensors.iter().enumerate() {
                        float_ok[j] = t.as_f32().is_some();
                    }
                }
                session.install(|| {
                    maxima
                        .par_iter_mut()
                        .zip(counts.par_iter_mut())
                        .zip(tensors.par_iter())
                        .for_each(|((m, n), t)| {
                            if let Some(v) = f32_values(t) {
                                *m = m.max(max_abs(&v));
                                *n += v.iter().filter(|x| x.is_finite()).count() as u64;
                            }
                        })
                });
                done += 1;
                progress(done, total);
            }
        }
        let mut histograms: Vec<AbsHistogram> = acts
            .iter()
            .enumerate()
            .map(|(j, &k)| {
                let bins = match options.method {
                    Method::Kl => {
                        kl_bins(counts[j], levels(&candidates[k].qtype), options.num_bins)
                    }
                    _ => options.num_bins,
                };
                AbsHistogram::new(maxima[j], bins)
            })
            .collect();
        if options.method.needs_histogram() && !acts.is_empty() {
            for s in 0..used {
                let tensors = run_sample(s)?;
                session.install(|| {
                    histograms
                        .par_iter_mut()
                        .zip(tensors.par_iter())
                        .for_each(|(h, t)| {
                            if let Some(v) = f32_values(t) {
                                h.add(&v);
                            }
                        })
                });
                done += 1;
                progress(done, total);
            }
        }
        let computed: Vec<f32> = session.install(|| {
            acts.par_iter()
                .zip(histograms.par_iter())
                .map(|(&k, h)| {
                    let q = &candidates[k].qtype;
                    match options.method {
                        Method::Max => h.range(),
                        Method::Percentile => percentile_threshold(h, options.percentile),
                        Method::Kl => kl_threshold(h, levels(q)),
                        Method::Mse => mse_threshold(h, levels(q) as i64 - 1),
                    }
                })
                .collect()
        });
        for (j, &k) in acts.iter().enumerate() {
            let c = &candidates[k];
            if !float_ok[j] {
                notes.push(format!(
                    "tensor '{}' is not float32; left unquantized",
                    c.tensor
                ));
                continue;
            }
            thresholds[k] = Some((vec![usable(computed[j], maxima[j], &c.qtype)], maxima[j]));
        }

        // Build the nodes.
        let mut inserts = Vec::new();
        let mut nodes = Vec::new();
        for (c, t) in candidates.iter_mut().zip(thresholds) {
            let Some((thresholds, max)) = t else { continue };
            let axis = c.weight.and_then(|l| l.axis).map(|a| a as i64);
            let spec = CalibrationSpec {
                name: c.name.clone(),
                input: c.tensor.clone(),
                output: format!("{}_output", c.name),
                tensor_type: if c.weight.is_some() {
                    TensorType::Weight
                } else {
                    TensorType::Feature
                },
                qtype: c.qtype.clone(),
                thresholds: thresholds.clone(),
                axis,
                group: c.weight.map(|l| l.group),
                constant: 1,
                switch_on: true,
            };
            let mut consumer_names: Vec<String> = c
                .consumers
                .iter()
                .map(|&(id, _)| model.node_name(id).to_string())
                .collect();
            consumer_names.dedup();
            nodes.push(InsertedNode {
                name: c.name.clone(),
                input: c.tensor.clone(),
                kind: if c.weight.is_some() {
                    "weight"
                } else {
                    "activation"
                },
                qtype: c.qtype.to_string(),
                thresholds,
                axis,
                max_abs: max,
                consumers: consumer_names,
            });
            inserts.push(CalibrationInsert {
                spec,
                consumers: std::mem::take(&mut c.consumers),
            });
        }
        if inserts.is_empty() {
            return Err(CalibrateError::NothingToQuantize {
                file,
                reason: format!(
                    "no float inputs of the quantized op types ({}) outside the skipped nodes",
                    options.op_types.join(", ")
                ),
            });
        }
        let activation_nodes = nodes.iter().filter(|n| n.kind == "activation").count();
        let weight_nodes = nodes.len() - activation_nodes;
        let report = CalibrationReport {
            method: options.method,
            percentile: (options.method == Method::Percentile).then_some(options.percentile),
            samples: used,
            samples_available: available,
            activation_nodes,
            weight_nodes,
            nodes,
            constant_inputs,
            notes,
        };
        let mut proto = model.clone().insert_calibrations(inserts)?.into_proto();
        proto.metadata_props.retain(|p| p.key() != METADATA_KEY);
        proto.metadata_props.push(StringStringEntryProto {
            key: Some(METADATA_KEY.into()),
            value: Some(report.one_line()),
        });
        let model = Model::from_proto(proto, model.base_dir().map(Into::into))?;
        Ok(Calibrated { model, report })
    }
}

/// The `metadata_props` key under which a calibrated model records what `calibrate`
/// did ([`CalibrationReport::one_line`]); `summary` shows it.
pub const METADATA_KEY: &str = "hmct.calibrate";

impl CalibrationReport {
    /// What was done, in one line: method, samples, nodes, and the inputs left
    /// unquantized because they depend on no data.
    pub fn one_line(&self) -> String {
        let method = match self.percentile {
            Some(p) => format!("{} {p}", self.method),
            None => self.method.to_string(),
        };
        let mut line = format!(
            "method {method} on {} sample(s); {} activation and {} weight calibration node(s)",
            self.samples, self.activation_nodes, self.weight_nodes
        );
        if !self.constant_inputs.is_empty() {
            line.push_str(&format!("; {}", self.constant_inputs_sentence()));
        }
        line
    }

    /// The inputs left unquantized because they depend on no data, as a sentence
    /// naming the first few (empty when there are none).
    pub fn constant_inputs_sentence(&self) -> String {
        const SHOWN: usize = 5;
        let n = self.constant_inputs.len();
        if n == 0 {
            return String::new();
        }
        let mut names = self.constant_inputs[..n.min(SHOWN)].join(", ");
        if n > SHOWN {
            names.push_str(&format!(", ... ({} more)", n - SHOWN));
        }
        format!(
            "{n} constant-foldable input(s) left unquantized (computed from constants and shapes only, as a toolchain folds them): {names}"
        )
    }
}
