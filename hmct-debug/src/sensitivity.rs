//! `get-sensitivity-of-nodes` (DEBUGGER.md §3): how much quantizing one node alone
//! costs on the outputs.
//!
//! Each candidate starts from the float model with only its calibration nodes ON and
//! is compared with the float model on the compared values (the model outputs, or
//! the outputs of the `output_node`s): every metric per value per sample, the mean
//! over samples (NaN samples skipped), then the mean over values
//! ([`hmct_metrics::aggregate`]). Candidates come back worst first by the first
//! metric ([`hmct_metrics::sort_worst_first`]; ties keep candidate order).
//!
//! Each entry also carries its figures per sample (`per_sample`: the mean over the
//! compared values of each sample), and the result warns about samples whose figures
//! measure rounding rather than quantization ([`crate::health::degenerate_samples`];
//! a candidate's NaN or non-perfect infinite figure on a sample is warned about
//! too). `exclude_samples` leaves samples out of the ranking: they are still run and
//! keep their per-sample figures, so a user sees what was left out.
//!
//! `shard` runs one part of the candidates ([`crate::shard`]); [`merge_sensitivity`]
//! puts the parts back together into exactly the unsharded result.
//!
//! Candidates that switch the same set of calibration nodes (two regular nodes
//! reading one calibrated tensor, say) are run once and share their values, and so
//! do probes an earlier analysis on the same [`Engine`] ran
//! ([`Engine::probe_scores`]).

use std::fmt;
use std::str::FromStr;

use std::marker::PhantomData;

use hmct_ir::{NodeId, QType, TensorType, close_matches, did_you_mean};
use hmct_metrics::{
    Metric, Table, format_value, python_repr, sensitivity_header, sensitivity_row, sort_worst_first,
};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

use crate::engine::{Engine, EngineError, NodeRef, Probe, Timings};
use crate::health::{
    DEGENERATE_SAMPLE, OutputSamples, SampleWarning, degenerate_samples, output_samples,
};
use crate::json::Number;
use crate::shard::{
    MergeError, Part, PartInfo, Provenance, Shard, check_sweep, cone_cost, node_costs,
    partition_groups,
};

/// Which candidates to rank (`-n/--node_type`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeType {
    /// The quantized regular nodes, each with its input calibration nodes ON.
    #[default]
    Node,
    /// The weight calibration nodes, one at a time.
    Weight,
    /// The activation calibration nodes, one at a time.
    Activation,
}

impl NodeType {
    pub const NAMES: [&'static str; 3] = ["node", "weight", "activation"];

    pub fn name(self) -> &'static str {
        match self {
            NodeType::Node => "node",
            NodeType::Weight => "weight",
            NodeType::Activation => "activation",
        }
    }
}

impl fmt::Display for NodeType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl FromStr for NodeType {
    type Err = SensitivityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "node" => Ok(NodeType::Node),
            "weight" => Ok(NodeType::Weight),
            "activation" => Ok(NodeType::Activation),
            _ => Err(SensitivityError::UnknownNodeType {
                name: s.to_string(),
                suggestions: close_matches(s, NodeType::NAMES),
            }),
        }
    }
}

/// Errors of the analysis. Everything but `Engine(Run/Plan/Data)` is a problem with
/// the arguments.
#[derive(Debug, thiserror::Error)]
pub enum SensitivityError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("unknown node type '{name}'{}; valid node types are: node, weight, activation", did_you_mean(.suggestions))]
    UnknownNodeType {
        name: String,
        suggestions: Vec<String>,
    },
    #[error("unknown metric '{name}'{}; valid metrics are: {}", did_you_mean(.suggestions), Metric::NAMES.join(", "))]
    UnknownMetric {
        name: String,
        suggestions: Vec<String>,
    },
    #[error("no metric given; valid metrics are: {}", Metric::NAMES.join(", "))]
    NoMetrics,
    #[error("the model has no calibration (HzCalibration) nodes")]
    NoCalibrationNodes,
    #[error("output_node must be a quantized regular node (one with input calibration nodes): {}", describe_not_quantized(.0))]
    OutputNotQuantized(Vec<(String, &'static str)>),
    #[error("interested_nodes: {} (nothing to switch on)", describe_not_quantized(.0))]
    InterestedNotQuantized(Vec<(String, &'static str)>),
    #[error("interested_nodes has an empty group")]
    EmptyGroup,
    #[error(
        "exclude_samples: sample {sample} is not among the {samples} sample(s) used (they are numbered from 0)"
    )]
    ExcludedOutOfRange { sample: usize, samples: usize },
    #[error("exclude_samples leaves no sample to rank on")]
    AllExcluded,
}

impl SensitivityError {
    /// True for mistakes in the arguments (as opposed to failures while running).
    pub fn is_usage(&self) -> bool {
        match self {
            SensitivityError::Engine(e) => e.is_usage(),
            _ => true,
        }
    }
}

fn describe_not_quantized(items: &[(String, &'static str)]) -> String {
    items
        .iter()
        .map(|(n, why)| format!("'{n}' {why}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Parses metric names (`cosine-similarity`, `mse`, `mre`, `sqnr`, `chebyshev`); the
/// error names the first unknown one with close matches.
pub fn parse_metrics<S: AsRef<str>>(names: &[S]) -> Result<Vec<Metric>, SensitivityError> {
    if names.is_empty() {
        return Err(SensitivityError::NoMetrics);
    }
    names
        .iter()
        .map(|n| {
            let n = n.as_ref();
            n.parse::<Metric>()
                .map_err(|_| SensitivityError::UnknownMetric {
                    name: n.to_string(),
                    suggestions: close_matches(n, Metric::NAMES),
                })
        })
        .collect()
}

/// The arguments of [`get_sensitivity_of_nodes`].
#[derive(Clone, Debug)]
pub struct SensitivityOptions {
    pub node_type: NodeType,
    /// One or several; the result is sorted by the first.
    pub metrics: Vec<Metric>,
    /// Compare on these regular nodes' outputs instead of the model outputs.
    pub output_nodes: Vec<String>,
    /// Use the first `data_num` samples (all when `None`).
    pub data_num: Option<usize>,
    /// Only these candidates (overrides `node_type`); a group of several names is
    /// quantized together and reported as `a+b`.
    pub interested_nodes: Option<Vec<Vec<String>>>,
    /// Samples (numbered from 0) the ranking leaves out. They are still run: their
    /// per-sample figures and warnings stay in the result.
    pub exclude_samples: Vec<usize>,
    /// Only this part of the candidates (see [`crate::shard`]).
    pub shard: Option<Shard>,
}

impl Default for SensitivityOptions {
    fn default() -> Self {
        SensitivityOptions {
            node_type: NodeType::Node,
            metrics: vec![Metric::CosineSimilarity],
            output_nodes: Vec::new(),
            data_num: None,
            interested_nodes: None,
            exclude_samples: Vec::new(),
            shard: None,
        }
    }
}

/// The options a result was computed with, as recorded in it (everything but the
/// shard; `data_num` as resolved against the data). Parts merge only when these
/// are equal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OptionsRecord {
    pub node_type: NodeType,
    pub metrics: Vec<Metric>,
    pub output_nodes: Vec<String>,
    pub data_num: usize,
    pub interested_nodes: Option<Vec<Vec<String>>>,
    pub exclude_samples: Vec<usize>,
}

/// What a result entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    /// A regular node, or a group of names.
    Node,
    /// One weight calibration node.
    Weight,
    /// One activation calibration node.
    Activation,
}

/// Metric values in the order of the analysis' metrics. Serialized as a map
/// `metric → value`; non-finite values (sqnr of identical tensors is `inf`) become
/// the strings `"inf"`, `"-inf"`, `"nan"`, since JSON has no such numbers.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricValues(pub Vec<(Metric, f64)>);

impl MetricValues {
    pub fn get(&self, metric: Metric) -> Option<f64> {
        self.0.iter().find(|(m, _)| *m == metric).map(|(_, v)| *v)
    }
}

impl Serialize for MetricValues {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (m, v) in &self.0 {
            map.serialize_entry(m, &Number(*v))?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for MetricValues {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let pairs = d.deserialize_map(MetricMap::<Number>(PhantomData))?;
        Ok(MetricValues(
            pairs.into_iter().map(|(m, v)| (m, v.0)).collect(),
        ))
    }
}

/// Per-sample values in the order of the analysis' metrics: `metric → [value of
/// sample 0, 1, ...]`, serialized like [`MetricValues`].
#[derive(Clone, Debug, PartialEq)]
pub struct PerSample(pub Vec<(Metric, Vec<f64>)>);

impl PerSample {
    pub fn get(&self, metric: Metric) -> Option<&[f64]> {
        self.0
            .iter()
            .find(|(m, _)| *m == metric)
            .map(|(_, v)| v.as_slice())
    }
}

impl Serialize for PerSample {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (m, v) in &self.0 {
            let numbers: Vec<Number> = v.iter().map(|&x| Number(x)).collect();
            map.serialize_entry(m, &numbers)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for PerSample {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let pairs = d.deserialize_map(MetricMap::<Vec<Number>>(PhantomData))?;
        Ok(PerSample(
            pairs
                .into_iter()
                .map(|(m, v)| (m, v.into_iter().map(|n| n.0).collect()))
                .collect(),
        ))
    }
}

/// Reads a map keyed by metric names in the file's order (the order of the metrics).
struct MetricMap<V>(PhantomData<V>);

impl<'de, V: Deserialize<'de>> Visitor<'de> for MetricMap<V> {
    type Value = Vec<(Metric, V)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map from metric names")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut pairs = Vec::new();
        while let Some(pair) = map.next_entry::<Metric, V>()? {
            pairs.push(pair);
        }
        Ok(pairs)
    }
}

/// One ranked candidate.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Entry {
    /// Position of the candidate before ranking (graph order, or the order of
    /// `interested_nodes`); what a merge of shards puts back in order.
    pub index: usize,
    /// The node name, the calibration node name, or `a+b` for a group.
    pub name: String,
    pub kind: EntryKind,
    /// The calibration nodes switched ON for this candidate.
    pub calibrations: Vec<String>,
    /// For weight and activation entries: the regular nodes consuming the
    /// calibration node, `;`-joined (the tables' `node` column).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// For activation entries: the largest threshold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f32>,
    /// For activation entries: the quantization bits (16 for float16).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bit: Option<u32>,
    /// Mean over samples (without the excluded ones), then over compared values.
    pub values: MetricValues,
    /// Per sample (every sample used, excluded ones too): the mean over compared
    /// values.
    pub per_sample: PerSample,
}

/// The result: entries worst first by the first metric.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Sensitivity {
    pub node_type: NodeType,
    pub metrics: Vec<Metric>,
    /// Number of samples used (the first ones).
    pub data_num: usize,
    /// Samples the ranking leaves out.
    pub excluded_samples: Vec<usize>,
    /// The values compared with the float model.
    pub compared: Vec<String>,
    /// `sha256:` of the model file and of the samples used.
    pub model_digest: String,
    pub data_digest: String,
    pub options: OptionsRecord,
    /// Set in a shard's part, absent in a whole result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<PartInfo>,
    /// Samples whose figures measure rounding rather than quantization.
    pub warnings: Vec<SampleWarning>,
    /// The float model's compared values on each sample (largest |value|, NaN/inf
    /// count), which the warnings are judged on.
    pub compared_samples: Vec<OutputSamples>,
    pub entries: Vec<Entry>,
    /// Where the time went (not part of the serialized result, which must not
    /// depend on the machine).
    #[serde(skip)]
    pub timings: Timings,
}

impl Sensitivity {
    /// The table layout: weight or activation when every entry is a single calibration
    /// node of that kind, else the plain node layout.
    pub fn table_kind(&self) -> EntryKind {
        match self.entries.first().map(|e| e.kind) {
            Some(k) if self.entries.iter().all(|e| e.kind == k) => k,
            _ => EntryKind::Node,
        }
    }

    /// The verbose / log table in the seeds' layout (title `node sensitivity`).
    pub fn table(&self) -> Table {
        let kind = self.table_kind();
        let keys: &[&str] = match kind {
            EntryKind::Node => &["node"],
            EntryKind::Weight => &["weight", "node"],
            EntryKind::Activation => &["activation", "node", "threshold", "bit"],
        };
        let mut table = Table::new("node sensitivity", sensitivity_header(keys, &self.metrics));
        for e in &self.entries {
            let values: Vec<f64> = e.values.0.iter().map(|(_, v)| *v).collect();
            let label = e.node.clone().unwrap_or_default();
            let threshold = e
                .threshold
                .map(|t| format_value(f64::from(t)))
                .unwrap_or_default();
            let bit = e.bit.map(|b| b.to_string()).unwrap_or_default();
            let cells: Vec<&str> = match kind {
                EntryKind::Node => vec![&e.name],
                EntryKind::Weight => vec![&e.name, &label],
                EntryKind::Activation => vec![&e.name, &label, &threshold, &bit],
            };
            table
                .push_row(sensitivity_row(&cells, &values))
                .expect("rows are built with one cell per column");
        }
        table
    }

    /// The lines under the table: one per warning, and the samples left out.
    pub fn footer(&self) -> String {
        let mut text = String::new();
        for w in &self.warnings {
            let output = w
                .output
                .as_ref()
                .map_or(String::new(), |o| format!(" of '{o}'"));
            let excluded = if w.excluded { " [excluded]" } else { "" };
            text.push_str(&format!(
                "warning: sample {}{output}: {}{excluded}\n",
                w.sample, w.why
            ));
        }
        if !self.excluded_samples.is_empty() {
            let list: Vec<String> = self
                .excluded_samples
                .iter()
                .map(ToString::to_string)
                .collect();
            text.push_str(&format!(
                "ranked without sample(s) {} of {}\n",
                list.join(", "),
                self.data_num
            ));
        }
        text
    }

    /// The table as printed and logged: [`Sensitivity::table`] and the footer.
    pub fn render(&self) -> String {
        self.table().render() + &self.footer()
    }
}

/// A candidate before it is run.
struct Candidate {
    name: String,
    kind: EntryKind,
    /// Plan indices, no duplicates, in first-seen order.
    calibrations: Vec<usize>,
    /// The single calibration node this candidate is, if it is one.
    calibration_node: Option<NodeId>,
}

/// Ranks the candidates of `options` by how much quantizing each alone degrades the
/// compared values. `progress` gets (tasks done, total) as probes finish.
pub fn get_sensitivity_of_nodes(
    engine: &Engine,
    options: &SensitivityOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Sensitivity, SensitivityError> {
    if options.metrics.is_empty() {
        return Err(SensitivityError::NoMetrics);
    }
    if engine.plan().calibrations().is_empty() {
        return Err(SensitivityError::NoCalibrationNodes);
    }
    let samples = engine.sample_count(options.data_num)?;
    let excluded = excluded_samples(&options.exclude_samples, samples)?;
    let compared = compared_slots(engine, &options.output_nodes)?;
    let candidates = match &options.interested_nodes {
        Some(groups) => interested_candidates(engine, groups)?,
        None => type_candidates(engine, options.node_type),
    };
    let total = candidates.len();
    let candidates: Vec<(usize, Candidate)> = match options.shard {
        None => candidates.into_iter().enumerate().collect(),
        Some(shard) => {
            let costs = node_costs(engine)?;
            let cones: Vec<u64> = candidates
                .iter()
                .map(|c| cone_cost(engine, &costs, &c.calibrations, &compared))
                .collect();
            let keys: Vec<Vec<usize>> = candidates
                .iter()
                .map(|c| {
                    let mut k = c.calibrations.clone();
                    k.sort_unstable();
                    k
                })
                .collect();
            let shard_of = partition_groups(&keys, &cones, shard.count);
            candidates
                .into_iter()
                .enumerate()
                .filter(|(i, _)| shard_of[*i] + 1 == shard.index)
                .collect()
        }
    };

    let probes: Vec<Probe> = candidates
        .iter()
        .map(|(_, c)| Probe::float_with_on(&c.calibrations))
        .collect();
    let metrics = &options.metrics;
    let results = engine.probe_scores(&probes, &compared, samples, progress)?;
    let compared_samples = output_samples(engine, &compared, samples)?;

    let model = engine.model();
    let mut entries: Vec<Entry> = candidates
        .into_iter()
        .zip(&results.values)
        .map(|((index, c), per_sample)| {
            // per_sample[s][value][metric in Metric::ALL order]
            let figure = |s: usize, o: usize, m: Metric| per_sample[s][o][m.index()];
            let values = metrics
                .iter()
                .map(|&m| {
                    let per_output: Vec<Vec<f64>> = (0..compared.len())
                        .map(|o| {
                            (0..samples)
                                .filter(|s| !excluded.contains(s))
                                .map(|s| figure(s, o, m))
                                .collect()
                        })
                        .collect();
                    (m, hmct_metrics::aggregate(&per_output))
                })
                .collect();
            let per_sample = metrics
                .iter()
                .map(|&m| {
                    let by_sample = (0..samples)
                        .map(|s| {
                            let sum: f64 = (0..compared.len()).map(|o| figure(s, o, m)).sum();
                            sum / compared.len() as f64
                        })
                        .collect();
                    (m, by_sample)
                })
                .collect();
            let cal = c.calibration_node.and_then(|id| model.calibration(id));
            let node = cal
                .as_ref()
                .filter(|_| c.kind != EntryKind::Node)
                .map(|cal| hmct_ir::consumer_label(model, cal.id()));
            let activation = cal.as_ref().filter(|_| c.kind == EntryKind::Activation);
            Entry {
                index,
                name: c.name,
                kind: c.kind,
                calibrations: c
                    .calibrations
                    .iter()
                    .map(|&i| engine.plan().calibrations()[i].name.clone())
                    .collect(),
                node,
                threshold: activation.and_then(|cal| max_threshold(cal)),
                bit: activation.and_then(|cal| bits(&cal.qtype())),
                values: MetricValues(values),
                per_sample: PerSample(per_sample),
            }
        })
        .collect();
    let first = metrics[0];
    sort_worst_first(&mut entries, first, |e| e.values.0[0].1);

    let provenance = Provenance::of(engine, samples)?;
    let warnings = sample_warnings(&compared_samples, &entries, metrics, &excluded);
    Ok(Sensitivity {
        node_type: options.node_type,
        metrics: metrics.clone(),
        data_num: samples,
        excluded_samples: excluded.clone(),
        compared: compared
            .iter()
            .map(|&s| engine.value_name(s).to_string())
            .collect(),
        model_digest: provenance.model_digest,
        data_digest: provenance.data_digest,
        options: OptionsRecord {
            node_type: options.node_type,
            metrics: metrics.clone(),
            output_nodes: options.output_nodes.clone(),
            data_num: samples,
            interested_nodes: options.interested_nodes.clone(),
            exclude_samples: excluded,
        },
        shard: options.shard.map(|shard| PartInfo {
            shard,
            candidates: total,
        }),
        warnings,
        compared_samples,
        entries,
        timings: results.timings,
    })
}

/// `exclude_samples` checked against the samples used, sorted, each once.
fn excluded_samples(exclude: &[usize], samples: usize) -> Result<Vec<usize>, SensitivityError> {
    if let Some(&sample) = exclude.iter().find(|&&s| s >= samples) {
        return Err(SensitivityError::ExcludedOutOfRange { sample, samples });
    }
    let mut excluded = exclude.to_vec();
    excluded.sort_unstable();
    excluded.dedup();
    if excluded.len() == samples {
        return Err(SensitivityError::AllExcluded);
    }
    Ok(excluded)
}

/// The degenerate samples of the compared values, then samples on which a metric
/// is NaN, or infinite other than its perfect value (sqnr of an unchanged output),
/// for some entry; by sample.
fn sample_warnings(
    outputs: &[OutputSamples],
    entries: &[Entry],
    metrics: &[Metric],
    excluded: &[usize],
) -> Vec<SampleWarning> {
    let mut warnings = degenerate_samples(outputs, excluded);
    let samples = outputs.first().map_or(0, |o| o.max_abs.len());
    for s in 0..samples {
        if warnings.iter().any(|w| w.sample == s) {
            // Its outputs already explain its figures.
            continue;
        }
        for &m in metrics {
            let value = |e: &Entry| e.per_sample.get(m).and_then(|v| v.get(s)).copied();
            let bad = |v: f64| !v.is_finite() && v != m.perfect_value();
            let flagged: Vec<&Entry> = entries
                .iter()
                .filter(|e| value(e).is_some_and(bad))
                .collect();
            let Some(first) = flagged.first() else {
                continue;
            };
            warnings.push(SampleWarning {
                kind: DEGENERATE_SAMPLE.to_string(),
                sample: s,
                output: match outputs {
                    [one] => Some(one.output.clone()),
                    _ => None,
                },
                max_abs: outputs
                    .iter()
                    .filter_map(|o| o.max_abs.get(s))
                    .fold(0.0, |a, b| a.max(*b)),
                why: format!(
                    "{m} is {} for {} of {} candidate(s) (first: {})",
                    python_repr(value(first).unwrap_or(f64::NAN)),
                    flagged.len(),
                    entries.len(),
                    first.name
                ),
                excluded: excluded.contains(&s),
            });
        }
    }
    warnings.sort_by_key(|w| w.sample);
    warnings
}

impl Part for Sensitivity {
    const COMMAND: &'static str = "get-sensitivity-of-nodes";

    fn digests(&self) -> (&str, &str) {
        (&self.model_digest, &self.data_digest)
    }

    fn options_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.options).unwrap_or_default()
    }

    fn part(&self) -> Option<&PartInfo> {
        self.shard.as_ref()
    }

    fn indices(&self) -> Vec<usize> {
        self.entries.iter().map(|e| e.index).collect()
    }
}

/// The whole result from the parts of a sharded run (`(label, part)`, labels are
/// file names for messages): entries back in candidate order, then ranked as the
/// unsharded run ranks them, warnings judged on every entry. Refuses parts of
/// different models, data or options, and a missing or duplicated shard.
pub fn merge_sensitivity(parts: Vec<(String, Sensitivity)>) -> Result<Sensitivity, MergeError> {
    check_sweep(&parts)?;
    for (label, p) in &parts {
        let consistent = !p.metrics.is_empty()
            && p.entries
                .iter()
                .all(|e| e.values.0.iter().map(|(m, _)| m).eq(&p.metrics));
        if !consistent {
            return Err(MergeError::Corrupt {
                label: label.clone(),
                message: "an entry's values do not match the metrics".to_string(),
            });
        }
    }

    let mut parts = parts.into_iter();
    let (_, mut whole) = parts.next().expect("check_parts refuses no parts");
    for (_, p) in parts {
        whole.entries.extend(p.entries);
        whole.timings.add(&p.timings);
    }
    whole.entries.sort_by_key(|e| e.index);
    let first = whole.metrics[0];
    sort_worst_first(&mut whole.entries, first, |e| e.values.0[0].1);
    whole.shard = None;
    whole.warnings = sample_warnings(
        &whole.compared_samples,
        &whole.entries,
        &whole.metrics,
        &whole.excluded_samples,
    );
    Ok(whole)
}

/// The slots compared with the float model: the model outputs, or the outputs of
/// the given quantized regular nodes (each once, in the order given).
fn compared_slots(
    engine: &Engine,
    output_nodes: &[String],
) -> Result<Vec<usize>, SensitivityError> {
    if output_nodes.is_empty() {
        return Ok(engine.model_output_slots());
    }
    let refs = engine.lookup_all(output_nodes)?;
    let mut bad = Vec::new();
    let mut slots = Vec::new();
    for (name, r) in output_nodes.iter().zip(refs) {
        match r {
            NodeRef::Calibration { .. } => bad.push((name.clone(), "is a calibration node")),
            NodeRef::Regular(id) if engine.input_calibrations(id).is_empty() => {
                bad.push((name.clone(), "has no input calibration nodes"))
            }
            NodeRef::Regular(id) => {
                for s in engine.output_slots(id) {
                    if !slots.contains(&s) {
                        slots.push(s);
                    }
                }
            }
        }
    }
    if !bad.is_empty() {
        return Err(SensitivityError::OutputNotQuantized(bad));
    }
    Ok(slots)
}

fn type_candidates(engine: &Engine, node_type: NodeType) -> Vec<Candidate> {
    let model = engine.model();
    match node_type {
        NodeType::Node => hmct_ir::quantized_nodes(model)
            .into_iter()
            .map(|id| Candidate {
                name: model.node_name(id).to_string(),
                kind: EntryKind::Node,
                calibrations: engine.input_calibrations(id),
                calibration_node: None,
            })
            .filter(|c| !c.calibrations.is_empty())
            .collect(),
        NodeType::Weight | NodeType::Activation => {
            let want = if node_type == NodeType::Weight {
                TensorType::Weight
            } else {
                TensorType::Feature
            };
            (0..engine.plan().calibrations().len())
                .filter_map(|index| {
                    let id = engine.calibration_id(index);
                    let cal = model.calibration(id)?;
                    (cal.tensor_type() == want).then(|| Candidate {
                        name: cal.name().to_string(),
                        kind: kind_of(want),
                        calibrations: vec![index],
                        calibration_node: Some(id),
                    })
                })
                .collect()
        }
    }
}

fn kind_of(t: TensorType) -> EntryKind {
    match t {
        TensorType::Weight => EntryKind::Weight,
        TensorType::Feature => EntryKind::Activation,
    }
}

fn interested_candidates(
    engine: &Engine,
    groups: &[Vec<String>],
) -> Result<Vec<Candidate>, SensitivityError> {
    if groups.iter().any(Vec::is_empty) {
        return Err(SensitivityError::EmptyGroup);
    }
    // All unknown names at once, in the order given.
    let all: Vec<&str> = groups.iter().flatten().map(String::as_str).collect();
    engine.lookup_all(&all)?;
    let model = engine.model();
    let mut bad = Vec::new();
    let mut candidates = Vec::new();
    for group in groups {
        let mut calibrations: Vec<usize> = Vec::new();
        for name in group {
            let r = engine.lookup(name).expect("checked above");
            let cals = engine.calibrations_of(r);
            if cals.is_empty() {
                bad.push((name.clone(), "is not quantized"));
            }
            for c in cals {
                if !calibrations.contains(&c) {
                    calibrations.push(c);
                }
            }
        }
        let single = match group.as_slice() {
            [one] => match engine.lookup(one) {
                Some(NodeRef::Calibration { id, .. }) => Some(id),
                _ => None,
            },
            _ => None,
        };
        let kind = single
            .and_then(|id| model.calibration(id))
            .map_or(EntryKind::Node, |cal| kind_of(cal.tensor_type()));
        candidates.push(Candidate {
            name: group.join("+"),
            kind,
            calibrations,
            calibration_node: single,
        });
    }
    if !bad.is_empty() {
        return Err(SensitivityError::InterestedNotQuantized(bad));
    }
    Ok(candidates)
}

/// The largest threshold; derived from the scales when the node has none.
fn max_threshold(cal: &hmct_ir::CalibrationNode<'_>) -> Option<f32> {
    let thresholds = cal.thresholds();
    let values = if thresholds.is_empty() {
        let qmax = cal.qtype().qrange()?.1 as f32;
        cal.scales().iter().map(|s| s * qmax).collect()
    } else {
        thresholds
    };
    values.into_iter().reduce(f32::max)
}

fn bits(q: &QType) -> Option<u32> {
    match q {
        QType::Int { bits, .. } => Some(u32::from(*bits)),
        QType::Float16 => Some(16),
        QType::Float32 => Some(32),
        QType::Unknown(_) => None,
    }
}
