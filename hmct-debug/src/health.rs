//! Health checks: problems of a calibrated model that make every later analysis
//! harder to read, found before any of them runs.
//!
//! [`check_model`] looks at the file alone: non-finite weights, thresholds that are
//! zero, negative, non-finite or denormal, weight thresholds far from the weights they
//! quantize, all-zero channels of per-channel weights, and activation calibration
//! nodes that no graph input reaches. [`check_data`] runs the float model on the
//! calibration data and looks at what it computes: non-finite inputs or activations,
//! activation thresholds far below (heavy clipping) or far above (wasted range)
//! the largest |x| the data produces, and samples on which a model output is
//! degenerate ([`degenerate_samples`]). [`check_all`] does both.

use std::collections::{BTreeMap, HashSet};

use hmct_ir::{CalibrationNode, Model, NodeId, TensorType};
use hmct_quant::{Base, Slot};
use hmct_tensor::Tensor;
use serde::Serialize;

use crate::engine::{Engine, EngineError, Probe, ProbeView};

/// A threshold this many times smaller than max|x| clips heavily; this many times
/// larger wastes most of the integer range.
pub const RATIO_LIMIT: f64 = 4.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Warning,
    Info,
}

/// What a finding is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Check {
    /// NaN or ±inf in a weight.
    NonFiniteWeight,
    /// NaN or ±inf in a calibration-data input.
    NonFiniteData,
    /// NaN or ±inf computed by the float model at a calibration node's input.
    NonFiniteActivation,
    /// A threshold that is zero, negative or not finite.
    InvalidThreshold,
    /// A threshold below the smallest normal f32.
    DenormalThreshold,
    /// max|x| / threshold above [`RATIO_LIMIT`].
    HeavyClipping,
    /// threshold / max|x| above [`RATIO_LIMIT`].
    WastedRange,
    /// A channel of a per-channel weight that is zero everywhere.
    ZeroChannel,
    /// An activation that is zero on every sample.
    ZeroActivation,
    /// An activation calibration node whose input no graph input reaches.
    Unreached,
    /// A sample on which a model output is all zero, non-finite, or too small for
    /// f32 to resolve against the output's scale ([`degenerate_samples`]).
    DegenerateSample,
}

/// One problem found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finding {
    pub severity: Severity,
    pub check: Check,
    /// The node concerned (a calibration node, or the graph input for data findings).
    pub node: String,
    /// One line for a human.
    pub message: String,
    /// The numbers behind the message (counts, thresholds, max|x|, ratios).
    pub numbers: BTreeMap<String, f64>,
}

impl Finding {
    fn new(severity: Severity, check: Check, node: &str, message: String) -> Finding {
        Finding {
            severity,
            check,
            node: node.to_string(),
            message,
            numbers: BTreeMap::new(),
        }
    }

    fn with(mut self, key: &str, value: f64) -> Finding {
        self.numbers.insert(key.to_string(), value);
        self
    }
}

/// What the checks saw of one calibration node (for the report's per-node detail).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CalibrationSummary {
    pub node: String,
    /// `weight` or `feature`.
    pub tensor_type: String,
    pub qtype: String,
    pub per_channel: bool,
    /// Number of thresholds, and their smallest and largest finite value.
    pub thresholds: usize,
    pub threshold_min: Option<f64>,
    pub threshold_max: Option<f64>,
    /// The quantized nodes it feeds, `;`-separated.
    pub consumers: String,
    /// Largest finite |x| of the weight, or of the activation over the data (none
    /// when no data reaches it).
    pub max_abs: Option<f64>,
}

impl CalibrationSummary {
    fn new(model: &Model, cal: &CalibrationNode<'_>, max_abs: Option<f64>) -> CalibrationSummary {
        let t = cal.thresholds();
        let finite = || t.iter().filter(|v| v.is_finite()).map(|v| f64::from(*v));
        CalibrationSummary {
            node: cal.name().to_string(),
            tensor_type: cal.tensor_type().to_string(),
            qtype: cal.qtype().to_string(),
            per_channel: cal.is_per_channel(),
            thresholds: t.len(),
            threshold_min: finite().reduce(f64::min),
            threshold_max: finite().reduce(f64::max),
            consumers: hmct_ir::consumer_label(model, cal.id()),
            max_abs,
        }
    }
}

/// Everything found, and on how many samples (0: the model alone).
#[derive(Clone, Debug, Default, Serialize)]
pub struct HealthReport {
    pub samples: usize,
    pub warnings: usize,
    pub infos: usize,
    pub findings: Vec<Finding>,
    /// Every calibration node, in graph order.
    pub calibrations: Vec<CalibrationSummary>,
}

impl HealthReport {
    fn new(samples: usize, mut findings: Vec<Finding>) -> HealthReport {
        // Warnings first; the sort is stable so graph order is kept inside a check.
        findings.sort_by_key(|f| (f.severity, f.check));
        let warnings = findings
            .iter()
            .filter(|f| f.severity == Severity::Warning)
            .count();
        HealthReport {
            samples,
            warnings,
            infos: findings.len() - warnings,
            findings,
            calibrations: Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// The checks that need no data, in graph order within each check.
pub fn check_model(model: &Model) -> Vec<Finding> {
    let mut findings = Vec::new();
    non_finite_weights(model, &mut findings);
    let reached = reached_values(model);
    for id in model.calibration_nodes() {
        let Some(cal) = model.calibration(id) else {
            continue;
        };
        let thresholds = cal.thresholds();
        let valid = check_thresholds(&cal, &thresholds, &mut findings);
        if cal.tensor_type() == TensorType::Weight {
            if valid {
                check_weight_range(model, &cal, &thresholds, &mut findings);
            }
        } else if !reached.contains(cal.input()) {
            findings.push(Finding::new(
                Severity::Warning,
                Check::Unreached,
                cal.name(),
                format!(
                    "no graph input reaches '{}': the activation it quantizes is computed from constants only",
                    cal.input()
                ),
            ));
        }
    }
    findings
}

/// The checks on the float model's run over the first `data_num` samples (all when
/// `None`): the number of samples used and the findings. `progress` gets (samples
/// done, samples).
pub fn check_data(
    engine: &Engine,
    data_num: Option<usize>,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<(usize, Vec<Finding>), HealthError> {
    let observed = observe(engine, data_num, progress)?;
    Ok((observed.samples, data_findings(engine.model(), &observed)))
}

/// [`check_model`] and [`check_data`] together, warnings first, with what was seen
/// of every calibration node.
pub fn check_all(
    engine: &Engine,
    data_num: Option<usize>,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<HealthReport, HealthError> {
    let model = engine.model();
    let mut findings = check_model(model);
    let observed = observe(engine, data_num, progress)?;
    findings.extend(data_findings(model, &observed));
    let mut report = HealthReport::new(observed.samples, findings);
    report.calibrations = model
        .calibration_nodes()
        .into_iter()
        .filter_map(|id| model.calibration(id))
        .map(|cal| {
            let max_abs = if cal.tensor_type() == TensorType::Weight {
                match model.constant_tensor(cal.input()) {
                    Ok(Some(w)) => Some(Stats::of(&w, None).overall()),
                    _ => None,
                }
            } else {
                observed
                    .activations
                    .iter()
                    .find(|(a, s)| *a == cal.id() && s.elements > 0)
                    .map(|(_, s)| s.overall())
            };
            CalibrationSummary::new(model, &cal, max_abs)
        })
        .collect();
    Ok(report)
}

/// What the float model computes over the data.
struct Observed {
    samples: usize,
    /// Per graph input: name, NaN/inf count, samples holding any.
    inputs: Vec<(String, usize, usize)>,
    /// Per activation calibration node with a computed input.
    activations: Vec<(NodeId, Stats)>,
    /// The model outputs, per sample.
    outputs: Vec<OutputSamples>,
}

fn observe(
    engine: &Engine,
    data_num: Option<usize>,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Observed, HealthError> {
    let samples = engine.sample_count(data_num)?;
    let model = engine.model();
    let plan = engine.plan();
    let inputs: Vec<(String, Slot)> = plan
        .inputs()
        .iter()
        .map(|i| (i.name.clone(), i.slot))
        .collect();
    // Activation calibration nodes the float run computes an input for.
    let activations: Vec<(NodeId, Slot)> = plan
        .calibrations()
        .iter()
        .filter(|c| !c.is_weight && plan.constant(c.input).is_none())
        .map(|c| (c.graph_index, c.input))
        .collect();
    let axes: Vec<Option<i64>> = activations
        .iter()
        .map(|(id, _)| model.calibration(*id).and_then(|c| channel_axis(&c)))
        .collect();

    // A float probe without overrides re-runs nothing: it reads the captures, which
    // the engine keeps for the analyses that follow.
    let probe = Probe {
        base: Base::Float,
        overrides: Vec::new(),
    };
    let outputs = engine.model_output_slots();
    // Per sample: NaN/inf count per input, stats per activation, stats per output.
    type SampleStats = (Vec<usize>, Vec<Stats>, Vec<Stats>);
    let reduce = |view: &ProbeView<'_>| -> Result<SampleStats, EngineError> {
        let mut bad_inputs = Vec::with_capacity(inputs.len());
        for (_, slot) in &inputs {
            bad_inputs.push(Stats::of(&*view.float_value(*slot)?, None).non_finite);
        }
        let mut stats = Vec::with_capacity(activations.len());
        for ((_, slot), axis) in activations.iter().zip(&axes) {
            let x = view.float_value(*slot)?;
            let axis = resolve_axis(*axis, x.shape().len());
            stats.push(Stats::of(&x, axis));
        }
        let mut output_stats = Vec::with_capacity(outputs.len());
        for slot in &outputs {
            output_stats.push(Stats::of(&*view.float_value(*slot)?, None));
        }
        Ok((bad_inputs, stats, output_stats))
    };
    let results = engine.run_probes(&[probe], &[], samples, reduce, progress)?;

    let mut input_bad = vec![(0usize, 0usize); inputs.len()];
    let mut merged: Vec<Stats> = vec![Stats::default(); activations.len()];
    let mut per_sample_outputs = Vec::with_capacity(samples);
    for (bad, stats, output_stats) in results.values.into_iter().flatten() {
        per_sample_outputs.push(output_stats);
        for (acc, n) in input_bad.iter_mut().zip(bad) {
            acc.0 += n;
            acc.1 += usize::from(n > 0);
        }
        for (acc, s) in merged.iter_mut().zip(stats) {
            acc.merge(s);
        }
    }
    Ok(Observed {
        samples,
        inputs: inputs
            .into_iter()
            .zip(input_bad)
            .map(|((name, _), (count, in_samples))| (name, count, in_samples))
            .collect(),
        activations: activations
            .into_iter()
            .zip(merged)
            .map(|((id, _), s)| (id, s))
            .collect(),
        outputs: outputs_by_sample(engine, &outputs, per_sample_outputs),
    })
}

fn data_findings(model: &Model, observed: &Observed) -> Vec<Finding> {
    let samples = observed.samples;
    let mut findings = Vec::new();
    for (name, count, in_samples) in &observed.inputs {
        if *count > 0 {
            findings.push(
                Finding::new(
                    Severity::Warning,
                    Check::NonFiniteData,
                    name,
                    format!(
                        "input '{name}' holds {count} NaN/inf value(s) in {in_samples} of {samples} sample(s)"
                    ),
                )
                .with("count", *count as f64)
                .with("samples", *in_samples as f64),
            );
        }
    }
    for (id, stats) in &observed.activations {
        if let Some(cal) = model.calibration(*id) {
            check_activation(&cal, stats, &mut findings);
        }
    }
    findings.extend(degenerate_findings(&observed.outputs));
    findings
}

/// Largest |x| (per channel when an axis is given) and NaN/inf count of a value.
#[derive(Clone, Debug, Default)]
struct Stats {
    max_abs: Vec<f64>,
    non_finite: usize,
    elements: usize,
}

impl Stats {
    fn of(tensor: &Tensor, axis: Option<usize>) -> Stats {
        let shape = tensor.shape();
        let (channels, inner) = match axis {
            Some(a) if a < shape.len() => (shape[a], shape[a + 1..].iter().product::<usize>()),
            _ => (1, 1),
        };
        let mut stats = Stats {
            max_abs: vec![0.0; channels.max(1)],
            non_finite: 0,
            elements: tensor.len(),
        };
        let mut add = |i: usize, v: f64| {
            if v.is_finite() {
                let c = if channels > 1 {
                    (i / inner) % channels
                } else {
                    0
                };
                stats.max_abs[c] = stats.max_abs[c].max(v.abs());
            } else {
                stats.non_finite += 1;
            }
        };
        // f32 is the common case: read it in place rather than copying to f64.
        if let Some(a) = tensor.as_f32() {
            for (i, v) in a.iter().enumerate() {
                add(i, f64::from(*v));
            }
        } else if let Some(values) = tensor.to_f64_vec() {
            for (i, v) in values.into_iter().enumerate() {
                add(i, v);
            }
        }
        stats
    }

    fn overall(&self) -> f64 {
        self.max_abs.iter().fold(0.0f64, |m, v| m.max(*v))
    }

    fn merge(&mut self, other: Stats) {
        if self.max_abs.len() != other.max_abs.len() {
            // First sample, or a shape that changed between samples: keep the widest.
            if self.elements == 0 || other.max_abs.len() > self.max_abs.len() {
                let old = std::mem::replace(&mut self.max_abs, other.max_abs);
                let m = old.iter().fold(0.0f64, |m, v| m.max(*v));
                if let Some(first) = self.max_abs.first_mut() {
                    *first = first.max(m);
                }
            }
        } else {
            for (a, b) in self.max_abs.iter_mut().zip(other.max_abs) {
                *a = a.max(b);
            }
        }
        self.non_finite += other.non_finite;
        self.elements += other.elements;
    }
}

/// The channel axis of a per-channel node (possibly negative: the rank is only
/// known from the data, see [`resolve_axis`]).
fn channel_axis(cal: &CalibrationNode<'_>) -> Option<i64> {
    if cal.is_per_channel() {
        cal.axis()
    } else {
        None
    }
}

fn resolve_axis(axis: Option<i64>, rank: usize) -> Option<usize> {
    let a = axis?;
    let r = i64::try_from(rank).ok()?;
    let a = if a < 0 { a + r } else { a };
    (0..r).contains(&a).then_some(a as usize)
}

/// Range of an integer node's quantization: the largest |threshold| per channel
/// (asymmetric nodes carry [min, max]: the larger magnitude bounds what is kept).
fn ranges(cal: &CalibrationNode<'_>, thresholds: &[f32]) -> Vec<f64> {
    if cal.is_asymmetric() && !cal.is_per_channel() {
        let m = thresholds
            .iter()
            .fold(0.0f64, |m, t| m.max(f64::from(t.abs())));
        vec![m]
    } else {
        thresholds.iter().map(|t| f64::from(*t)).collect()
    }
}

/// Reports invalid and denormal thresholds; true when every threshold is usable.
fn check_thresholds(cal: &CalibrationNode<'_>, thresholds: &[f32], out: &mut Vec<Finding>) -> bool {
    if !cal.qtype().is_int() {
        return false;
    }
    if cal.is_asymmetric() && !cal.is_per_channel() {
        let finite = thresholds.iter().all(|t| t.is_finite());
        if !finite || thresholds.len() != 2 || thresholds[0] >= thresholds[1] {
            out.push(Finding::new(
                Severity::Warning,
                Check::InvalidThreshold,
                cal.name(),
                format!("asymmetric thresholds {thresholds:?} are not a finite [min, max] with min < max"),
            ));
            return false;
        }
        return true;
    }
    let bad: Vec<usize> = (0..thresholds.len())
        .filter(|&i| !(thresholds[i].is_finite() && thresholds[i] > 0.0))
        .collect();
    if thresholds.is_empty() || !bad.is_empty() {
        let first = bad.first().map_or(f32::NAN, |&i| thresholds[i]);
        let message = if thresholds.is_empty() {
            "has no threshold".to_string()
        } else {
            format!(
                "{} of {} threshold(s) zero, negative or not finite (threshold {} is {first})",
                bad.len(),
                thresholds.len(),
                bad[0]
            )
        };
        out.push(
            Finding::new(
                Severity::Warning,
                Check::InvalidThreshold,
                cal.name(),
                message,
            )
            .with("count", bad.len() as f64)
            .with("thresholds", thresholds.len() as f64),
        );
        return false;
    }
    let denormal: Vec<usize> = (0..thresholds.len())
        .filter(|&i| thresholds[i] < f32::MIN_POSITIVE)
        .collect();
    if let Some(&i) = denormal.first() {
        out.push(
            Finding::new(
                Severity::Warning,
                Check::DenormalThreshold,
                cal.name(),
                format!(
                    "{} threshold(s) below the smallest normal float (threshold {i} is {:e}): the scale loses precision",
                    denormal.len(),
                    thresholds[i]
                ),
            )
            .with("count", denormal.len() as f64)
            .with("threshold", f64::from(thresholds[i])),
        );
    }
    true
}

/// Weight thresholds against the weights, channel by channel, and all-zero channels.
fn check_weight_range(
    model: &Model,
    cal: &CalibrationNode<'_>,
    thresholds: &[f32],
    out: &mut Vec<Finding>,
) {
    let Ok(Some(weight)) = model.constant_tensor(cal.input()) else {
        return;
    };
    let per_channel = cal.is_per_channel() && thresholds.len() > 1;
    let axis = if per_channel {
        resolve_axis(cal.axis(), weight.shape().len())
    } else {
        None
    };
    if per_channel && axis.is_none_or(|a| weight.shape()[a] != thresholds.len()) {
        // The planner rejects such a node; nothing here would be meaningful.
        return;
    }
    let stats = Stats::of(&weight, axis);
    let zero: Vec<usize> = if per_channel {
        (0..stats.max_abs.len())
            .filter(|&c| stats.max_abs[c] == 0.0)
            .collect()
    } else {
        Vec::new()
    };
    if let Some(&first) = zero.first() {
        out.push(
            Finding::new(
                Severity::Info,
                Check::ZeroChannel,
                cal.name(),
                format!(
                    "{} of {} weight channel(s) are all zero (first: channel {first}); pruned channels quantize to zero whatever the threshold",
                    zero.len(),
                    stats.max_abs.len()
                ),
            )
            .with("count", zero.len() as f64)
            .with("channels", stats.max_abs.len() as f64)
            .with("first_channel", first as f64),
        );
    }
    compare_range(cal, &ranges(cal, thresholds), &stats.max_abs, "weight", out);
}

/// A calibration input as the float model computes it over the data.
fn check_activation(cal: &CalibrationNode<'_>, stats: &Stats, out: &mut Vec<Finding>) {
    if stats.non_finite > 0 {
        out.push(
            Finding::new(
                Severity::Warning,
                Check::NonFiniteActivation,
                cal.name(),
                format!(
                    "the float model computes {} NaN/inf value(s) at its input '{}'",
                    stats.non_finite,
                    cal.input()
                ),
            )
            .with("count", stats.non_finite as f64),
        );
    }
    let thresholds = cal.thresholds();
    let usable = cal.qtype().is_int()
        && !thresholds.is_empty()
        && if cal.is_asymmetric() && !cal.is_per_channel() {
            thresholds.iter().all(|t| t.is_finite())
        } else {
            thresholds.iter().all(|t| t.is_finite() && *t > 0.0)
        };
    if !usable || stats.elements == 0 {
        return;
    }
    let max = stats.max_abs.iter().fold(0.0f64, |m, v| m.max(*v));
    if max == 0.0 {
        out.push(
            Finding::new(
                Severity::Info,
                Check::ZeroActivation,
                cal.name(),
                format!("its input '{}' is zero on every sample", cal.input()),
            )
            .with("elements", stats.elements as f64),
        );
        return;
    }
    let range = ranges(cal, &thresholds);
    let observed = if range.len() == stats.max_abs.len() {
        stats.max_abs.clone()
    } else {
        // Per-tensor node, or a per-channel node whose channels were not resolved:
        // compare the largest threshold with the largest value.
        let r = range.iter().fold(0.0f64, |m, v| m.max(*v));
        return compare_range(cal, &[r], &[max], "activation", out);
    };
    compare_range(cal, &range, &observed, "activation", out);
}

/// Heavy clipping and wasted range, judged on the worst channel; channels whose
/// values are all zero are left to [`Check::ZeroChannel`].
fn compare_range(
    cal: &CalibrationNode<'_>,
    range: &[f64],
    max_abs: &[f64],
    what: &str,
    out: &mut Vec<Finding>,
) {
    if range.len() != max_abs.len() {
        return;
    }
    let worst = |ratio: &dyn Fn(f64, f64) -> f64| {
        range
            .iter()
            .zip(max_abs)
            .enumerate()
            .filter(|(_, (t, m))| **m > 0.0 && **t > 0.0)
            .map(|(c, (t, m))| (c, ratio(*t, *m), *t, *m))
            .max_by(|a, b| a.1.total_cmp(&b.1))
    };
    let channel = |c: usize| {
        if range.len() > 1 {
            format!(" (channel {c})")
        } else {
            String::new()
        }
    };
    if let Some((c, ratio, t, m)) = worst(&|t, m| m / t).filter(|w| w.1 > RATIO_LIMIT) {
        let clipped = range
            .iter()
            .zip(max_abs)
            .filter(|(t, m)| **m > **t * RATIO_LIMIT)
            .count();
        out.push(
            Finding::new(
                Severity::Warning,
                Check::HeavyClipping,
                cal.name(),
                format!(
                    "max|{what}| {m:.6} is {ratio:.1}x its threshold {t:.6}{}: values beyond the threshold are clipped",
                    channel(c)
                ),
            )
            .with("max_abs", m)
            .with("threshold", t)
            .with("ratio", ratio)
            .with("channel", c as f64)
            .with("channels_over_limit", clipped as f64),
        );
    }
    if let Some((c, ratio, t, m)) = worst(&|t, m| t / m).filter(|w| w.1 > RATIO_LIMIT) {
        let wasted = range
            .iter()
            .zip(max_abs)
            .filter(|(t, m)| **m > 0.0 && **t > **m * RATIO_LIMIT)
            .count();
        out.push(
            Finding::new(
                Severity::Info,
                Check::WastedRange,
                cal.name(),
                format!(
                    "threshold {t:.6} is {ratio:.1}x max|{what}| {m:.6}{}: most of the {} range is never used",
                    channel(c),
                    cal.qtype()
                ),
            )
            .with("max_abs", m)
            .with("threshold", t)
            .with("ratio", ratio)
            .with("channel", c as f64)
            .with("channels_over_limit", wasted as f64),
        );
    }
}

/// NaN/inf in initializers, reported at the node that reads the weight (its
/// calibration node when it has one).
fn non_finite_weights(model: &Model, out: &mut Vec<Finding>) {
    for init in &model.graph_proto().initializer {
        let name = init.name();
        let Ok(Some(tensor)) = model.constant_tensor(name) else {
            continue;
        };
        let stats = Stats::of(&tensor, None);
        if stats.non_finite == 0 {
            continue;
        }
        let consumers = model.consumers(name);
        let node = consumers
            .iter()
            .find(|&&id| model.is_calibration(id))
            .or(consumers.first())
            .map_or(name, |&id| model.node_name(id));
        out.push(
            Finding::new(
                Severity::Warning,
                Check::NonFiniteWeight,
                node,
                format!(
                    "weight '{name}' holds {} NaN/inf value(s) of {}",
                    stats.non_finite, stats.elements
                ),
            )
            .with("count", stats.non_finite as f64)
            .with("elements", stats.elements as f64),
        );
    }
}

/// Values computed (transitively) from a graph input.
fn reached_values(model: &Model) -> HashSet<&str> {
    let mut reached: HashSet<&str> = model.inputs().iter().map(String::as_str).collect();
    // Nodes are stored in topological order, so one pass suffices.
    for node in model.nodes() {
        if node.input.iter().any(|i| reached.contains(i.as_str())) {
            reached.extend(node.output.iter().map(String::as_str));
        }
    }
    reached
}

/// A sample whose largest |value| on an output is within this many f32 rounding
/// steps (ulps) of the output's own scale is degenerate: see [`degenerate_samples`].
pub const DEGENERATE_STEPS: f64 = 16.0;

/// The `kind` of the warnings of [`degenerate_samples`].
pub const DEGENERATE_SAMPLE: &str = "degenerate-sample";

/// A sample whose figures measure rounding rather than quantization.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct SampleWarning {
    /// Always [`DEGENERATE_SAMPLE`].
    pub kind: String,
    pub sample: usize,
    /// The compared output concerned (`None`: several, for a metric's warning).
    pub output: Option<String>,
    /// The largest finite |value| of that output (of the compared outputs) on this
    /// sample, in the float model.
    pub max_abs: f64,
    pub why: String,
    /// True when the ranking leaves this sample out (`exclude_samples`).
    #[serde(default)]
    pub excluded: bool,
}

/// What the float model computes on one output, per sample.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct OutputSamples {
    pub output: String,
    /// Largest finite |value|, per sample.
    pub max_abs: Vec<f64>,
    /// NaN/inf values, per sample.
    pub non_finite: Vec<usize>,
}

/// The float model's `slots` on samples `0..samples`, from the engine's captures
/// (a float probe without overrides re-runs nothing).
pub fn output_samples(
    engine: &Engine,
    slots: &[Slot],
    samples: usize,
) -> Result<Vec<OutputSamples>, EngineError> {
    let probe = Probe {
        base: Base::Float,
        overrides: Vec::new(),
    };
    let reduce = |view: &ProbeView<'_>| -> Result<Vec<Stats>, EngineError> {
        slots
            .iter()
            .map(|&slot| Ok(Stats::of(&*view.float_value(slot)?, None)))
            .collect()
    };
    let results = engine.run_probes(&[probe], &[], samples, reduce, &|_, _| {})?;
    Ok(outputs_by_sample(
        engine,
        slots,
        results.values.into_iter().flatten(),
    ))
}

/// Per-sample stats of `slots` (`[sample][slot]`) turned into one list per slot.
fn outputs_by_sample(
    engine: &Engine,
    slots: &[Slot],
    per_sample: impl IntoIterator<Item = Vec<Stats>>,
) -> Vec<OutputSamples> {
    let mut outputs: Vec<OutputSamples> = slots
        .iter()
        .map(|&slot| OutputSamples {
            output: engine.value_name(slot).to_string(),
            ..OutputSamples::default()
        })
        .collect();
    for per_slot in per_sample {
        for (acc, stats) in outputs.iter_mut().zip(per_slot) {
            acc.max_abs.push(stats.overall());
            acc.non_finite.push(stats.non_finite);
        }
    }
    outputs
}

/// Samples whose comparison on an output cannot measure quantization: the float
/// model's output holds NaN/inf (every metric is NaN), is all zero (cosine is
/// undefined, relative figures divide by zero), or its largest |value| is within
/// [`DEGENERATE_STEPS`] f32 rounding steps of the output's scale (its largest |value|
/// over the samples).
///
/// Why the last one: f32 resolves about 2^-24 of a value's magnitude, so a
/// computation that works at the output's scale (adding 1 inside a Sigmoid, say)
/// leaves rounding noise of that size on every element. On a sample whose values are
/// only a few such steps tall, that noise is as large as the signal, and its cosine
/// measures how a kernel rounds, not what quantization did: onnxruntime's Sigmoid
/// resolves 2^-25 absolute near 0, so on the PP-OCRv4 detector's sample 7 (no text,
/// every output at most 1.2e-7) its output takes 5 distinct values where ours takes
/// about 400,000, and its cosine for a candidate is 0.39 where ours is 0.99.
/// Ordered by sample, then output.
pub fn degenerate_samples(outputs: &[OutputSamples], excluded: &[usize]) -> Vec<SampleWarning> {
    let samples = outputs.iter().map(|o| o.max_abs.len()).max().unwrap_or(0);
    let mut warnings = Vec::new();
    for s in 0..samples {
        for o in outputs {
            let (Some(&m), Some(&bad)) = (o.max_abs.get(s), o.non_finite.get(s)) else {
                continue;
            };
            let scale = o.max_abs.iter().fold(0.0f64, |a, b| a.max(*b));
            let resolution = f64::from(f32::EPSILON) * scale;
            let why = if bad > 0 {
                format!(
                    "the float model's output holds {bad} NaN/inf value(s): every metric is nan"
                )
            } else if m == 0.0 {
                "the float model's output is all zero: cosine is undefined and relative metrics divide by zero".to_string()
            } else if m <= DEGENERATE_STEPS * resolution {
                format!(
                    "its largest |value| {m:.3e} is only {:.1} f32 rounding steps at the output's scale {scale:.3e} (largest over the samples): its figures measure rounding, not quantization",
                    m / resolution
                )
            } else {
                continue;
            };
            warnings.push(SampleWarning {
                kind: DEGENERATE_SAMPLE.to_string(),
                sample: s,
                output: Some(o.output.clone()),
                max_abs: m,
                why,
                excluded: excluded.contains(&s),
            });
        }
    }
    warnings
}

/// [`degenerate_samples`] as health findings.
fn degenerate_findings(outputs: &[OutputSamples]) -> Vec<Finding> {
    degenerate_samples(outputs, &[])
        .into_iter()
        .map(|w| {
            let output = w.output.unwrap_or_default();
            Finding::new(
                Severity::Warning,
                Check::DegenerateSample,
                &output,
                format!("sample {} of output '{output}': {}", w.sample, w.why),
            )
            .with("sample", w.sample as f64)
            .with("max_abs", w.max_abs)
        })
        .collect()
}
