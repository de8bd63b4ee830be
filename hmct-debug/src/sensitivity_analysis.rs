//! `sensitivity-analysis` (DEBUGGER.md §7): how the model outputs move when the
//! sensitive nodes are quantized one at a time, and when they are taken out of the
//! calibrated model one after another.
//!
//! The sensitive nodes are `sensitive_nodes` when given, else the quantized regular
//! nodes whose cosine sensitivity ([`get_sensitivity_of_nodes`] on the model outputs)
//! is at most `pick_threshold`, most sensitive first. The pick is always made on
//! cosine similarity, whatever `metric` the series use, because the threshold is a
//! cosine value. For x = [`none`, n1, n2, ...], measured on the model outputs
//! against the float model with `metric`:
//! - **single**: the float model with only n_k quantized (its input calibration
//!   nodes ON; a calibration node given by name toggles itself). Not defined at
//!   `none`.
//! - **cumulative**: the calibrated model with n_1..n_k de-quantized, i.e. their
//!   calibration nodes set to `qtype` (float32 = OFF, or the same thresholds at
//!   int16); at `none` it is the calibrated model itself. A calibration node that is
//!   OFF in the file stays OFF.
//! - **baseline**: the float model against itself (1.0 for cosine, 0 for the
//!   distances, +inf for sqnr).
//!
//! Every value is the tool's aggregation: per output and sample, mean over samples
//! (NaN samples skipped), then mean over outputs. [`write_partial_quantization`]
//! renders the result as `partial_quantization.png` and `partial_quantization.json`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use hmct_ir::{QType, close_matches, did_you_mean};
use hmct_metrics::Metric;
use hmct_plot::{Baseline, Figure, Format, LineChart, LineKind, LineSeries, Marker, Rgb};
use hmct_quant::{Base, Override};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::engine::{Engine, EngineError, NodeRef, Probe, Timings};
use crate::json;
use crate::sensitivity::{SensitivityError, SensitivityOptions, get_sensitivity_of_nodes};

/// What "de-quantized" means for the cumulative series (`-q`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DequantQType {
    /// The calibration nodes are switched OFF.
    #[default]
    Float32,
    /// The calibration nodes keep their thresholds at int16.
    Int16,
}

impl DequantQType {
    pub const NAMES: [&'static str; 2] = ["float32", "int16"];

    pub fn name(self) -> &'static str {
        match self {
            DequantQType::Float32 => "float32",
            DequantQType::Int16 => "int16",
        }
    }
}

impl fmt::Display for DequantQType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl Serialize for DequantQType {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for DequantQType {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

impl FromStr for DequantQType {
    type Err = AnalysisError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "float32" | "float" => Ok(DequantQType::Float32),
            "int16" => Ok(DequantQType::Int16),
            _ => Err(AnalysisError::UnknownQType {
                name: s.to_string(),
                suggestions: close_matches(s, DequantQType::NAMES),
            }),
        }
    }
}

/// Errors of the analysis and of writing its files.
#[derive(Debug, thiserror::Error)]
pub enum AnalysisError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Ranking(#[from] SensitivityError),
    #[error("unknown qtype '{name}'{}; valid values are: float32, int16", did_you_mean(.suggestions))]
    UnknownQType {
        name: String,
        suggestions: Vec<String>,
    },
    #[error("pick_threshold must be a number, got {0}")]
    BadThreshold(f64),
    #[error("sensitive_nodes: {}", .0.iter().map(|(n, why)| format!("'{n}' {why}")).collect::<Vec<_>>().join(", "))]
    NotQuantized(Vec<(String, &'static str)>),
    #[error("cannot set '{node}' to {qtype}: {message}")]
    QType {
        node: String,
        qtype: DequantQType,
        message: String,
    },
    #[error("{}: {message}", path.display())]
    Write { path: PathBuf, message: String },
}

impl AnalysisError {
    /// True for mistakes in the arguments (as opposed to failures while running or
    /// writing).
    pub fn is_usage(&self) -> bool {
        match self {
            AnalysisError::Engine(e) => e.is_usage(),
            AnalysisError::Ranking(e) => e.is_usage(),
            AnalysisError::UnknownQType { .. }
            | AnalysisError::BadThreshold(_)
            | AnalysisError::NotQuantized(_)
            | AnalysisError::QType { .. } => true,
            AnalysisError::Write { .. } => false,
        }
    }
}

/// The arguments of [`sensitivity_analysis`]; the defaults are the seeds'.
#[derive(Clone, Debug)]
pub struct SensitivityAnalysisOptions {
    /// Nodes whose cosine sensitivity is at most this are picked (when
    /// `sensitive_nodes` is empty).
    pub pick_threshold: f64,
    /// Use the first `data_num` samples (all when `None`); the seeds use 1.
    pub data_num: Option<usize>,
    /// The nodes to analyse, in this order; empty = pick them by sensitivity.
    pub sensitive_nodes: Vec<String>,
    /// The metric of the series.
    pub metric: Metric,
    /// What de-quantizing a node sets its calibration nodes to.
    pub qtype: DequantQType,
}

impl Default for SensitivityAnalysisOptions {
    fn default() -> Self {
        SensitivityAnalysisOptions {
            pick_threshold: 0.999,
            data_num: Some(1),
            sensitive_nodes: Vec::new(),
            metric: Metric::CosineSimilarity,
            qtype: DequantQType::Float32,
        }
    }
}

/// One sensitive node and its two points.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SensitiveNode {
    pub name: String,
    /// The calibration nodes that quantizing / de-quantizing it toggles.
    pub calibrations: Vec<String>,
    /// Its cosine sensitivity from the ranking (absent when the nodes were given).
    #[serde(
        serialize_with = "json::opt_number",
        deserialize_with = "json::de_opt_number"
    )]
    pub sensitivity: Option<f64>,
    /// The float model with only this node quantized.
    #[serde(serialize_with = "json::number", deserialize_with = "json::de_number")]
    pub single: f64,
    /// The calibrated model with this node and all before it de-quantized.
    #[serde(serialize_with = "json::number", deserialize_with = "json::de_number")]
    pub cumulative: f64,
}

/// The result; [`SensitivityAnalysis::x_labels`] and the series methods give the
/// figure's data.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SensitivityAnalysis {
    pub metric: Metric,
    pub qtype: DequantQType,
    /// Number of samples used (the first ones).
    pub data_num: usize,
    /// The threshold the nodes were picked with; `None` when they were given.
    #[serde(
        serialize_with = "json::opt_number",
        deserialize_with = "json::de_opt_number"
    )]
    pub pick_threshold: Option<f64>,
    /// The model outputs compared.
    pub compared: Vec<String>,
    /// The float model against itself.
    #[serde(serialize_with = "json::number", deserialize_with = "json::de_number")]
    pub baseline: f64,
    /// The calibrated model (the cumulative series at `none`).
    #[serde(serialize_with = "json::number", deserialize_with = "json::de_number")]
    pub calibrated: f64,
    /// The sensitive nodes, in analysis order.
    pub nodes: Vec<SensitiveNode>,
    #[serde(skip)]
    pub timings: Timings,
}

impl SensitivityAnalysis {
    /// `none` followed by the node names.
    pub fn x_labels(&self) -> Vec<String> {
        std::iter::once("none".to_string())
            .chain(self.nodes.iter().map(|n| n.name.clone()))
            .collect()
    }

    /// The single-node series over [`Self::x_labels`] (NaN at `none`).
    pub fn single_series(&self) -> Vec<f64> {
        std::iter::once(f64::NAN)
            .chain(self.nodes.iter().map(|n| n.single))
            .collect()
    }

    /// The cumulative de-quantization series over [`Self::x_labels`].
    pub fn cumulative_series(&self) -> Vec<f64> {
        std::iter::once(self.calibrated)
            .chain(self.nodes.iter().map(|n| n.cumulative))
            .collect()
    }

    /// The figure: baseline blue dashed, cumulative red solid, single green crosses
    /// (the original tool's colours).
    pub fn chart(&self) -> LineChart {
        let metric = self.metric.name();
        let title = if self.nodes.is_empty() {
            match self.pick_threshold {
                Some(t) => format!(
                    "Partial Quantization Analysis (no node at or below pick_threshold {t})"
                ),
                None => "Partial Quantization Analysis (no node)".to_string(),
            }
        } else {
            "Partial Quantization Analysis".to_string()
        };
        let dequant = match self.qtype {
            DequantQType::Float32 => "float",
            DequantQType::Int16 => "int16",
        };
        LineChart {
            figure: Figure::new(
                title,
                format!("node (none = calibrated model; samples: {})", self.data_num),
                format!("{metric} of model outputs vs float"),
            ),
            x_labels: self.x_labels(),
            series: vec![
                LineSeries::new(
                    format!("calibrated, this and earlier nodes {dequant}"),
                    self.cumulative_series(),
                )
                .color(Rgb::RED)
                .marker(Marker::Circle),
                LineSeries::new("float, only this node quantized", self.single_series())
                    .color(Rgb::GREEN)
                    .line(LineKind::None)
                    .marker(Marker::Cross),
            ],
            baseline: Some(Baseline::new(self.baseline, "baseline (float model)")),
        }
    }
}

/// Progress of [`sensitivity_analysis`]: which stage, tasks done, tasks in the stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Ranking the regular nodes to pick the sensitive ones.
    Ranking,
    /// The two series.
    Series,
}

/// Runs the analysis. `progress` gets (stage, tasks done, tasks in that stage).
pub fn sensitivity_analysis(
    engine: &Engine,
    options: &SensitivityAnalysisOptions,
    progress: &(dyn Fn(Stage, usize, usize) + Sync),
) -> Result<SensitivityAnalysis, AnalysisError> {
    if !options.pick_threshold.is_finite() {
        return Err(AnalysisError::BadThreshold(options.pick_threshold));
    }
    let samples = engine.sample_count(options.data_num)?;
    // (name, calibration plan indices, sensitivity)
    let picked: Vec<Picked> = if options.sensitive_nodes.is_empty() {
        let ranking = get_sensitivity_of_nodes(
            engine,
            &SensitivityOptions {
                metrics: vec![Metric::CosineSimilarity],
                data_num: Some(samples),
                ..SensitivityOptions::default()
            },
            &|done, total| progress(Stage::Ranking, done, total),
        )?;
        ranking
            .entries
            .into_iter()
            .filter_map(|e| {
                let cos = e.values.0[0].1;
                (cos <= options.pick_threshold).then(|| {
                    let cals = e
                        .calibrations
                        .iter()
                        .filter_map(|c| engine.plan().calibration(c))
                        .collect();
                    (e.name, cals, Some(cos))
                })
            })
            .collect()
    } else {
        given_nodes(engine, &options.sensitive_nodes)?
    };

    let probes = series_probes(engine, &picked, options.qtype)?;
    let compared = engine.model_output_slots();
    let results = engine.probe_scores(&probes, &compared, samples, &|done, total| {
        progress(Stage::Series, done, total)
    })?;
    // values[probe][sample][output] → one figure per probe.
    let figure = |p: usize| {
        let per_output: Vec<Vec<f64>> = (0..compared.len())
            .map(|o| {
                results.values[p]
                    .iter()
                    .map(|s| s[o][options.metric.index()])
                    .collect()
            })
            .collect();
        hmct_metrics::aggregate(&per_output)
    };
    let k = picked.len();
    let plan = engine.plan();
    let nodes = picked
        .into_iter()
        .enumerate()
        .map(|(i, (name, cals, sensitivity))| SensitiveNode {
            name,
            calibrations: cals
                .iter()
                .map(|&c| plan.calibrations()[c].name.clone())
                .collect(),
            sensitivity,
            single: figure(2 + i),
            cumulative: figure(2 + k + i),
        })
        .collect();
    Ok(SensitivityAnalysis {
        metric: options.metric,
        qtype: options.qtype,
        data_num: samples,
        pick_threshold: options
            .sensitive_nodes
            .is_empty()
            .then_some(options.pick_threshold),
        compared: compared
            .iter()
            .map(|&s| engine.value_name(s).to_string())
            .collect(),
        baseline: figure(0),
        calibrated: figure(1),
        nodes,
        timings: results.timings,
    })
}

/// A sensitive node before its series: name, calibration plan indices, cosine
/// sensitivity from the ranking.
type Picked = (String, Vec<usize>, Option<f64>);

/// The given nodes, each once in the order given, with their calibration nodes.
fn given_nodes(engine: &Engine, names: &[String]) -> Result<Vec<Picked>, AnalysisError> {
    let refs = engine.lookup_all(names)?;
    let mut bad = Vec::new();
    let mut nodes: Vec<Picked> = Vec::new();
    for (name, r) in names.iter().zip(refs) {
        if nodes.iter().any(|(n, _, _)| n == name) {
            continue;
        }
        let cals = engine.calibrations_of(r);
        if cals.is_empty() {
            let why = match r {
                NodeRef::Regular(_) => "is not quantized (it has no input calibration nodes)",
                NodeRef::Calibration { .. } => "is not quantized",
            };
            bad.push((name.clone(), why));
        }
        nodes.push((name.clone(), cals, None));
    }
    if !bad.is_empty() {
        return Err(AnalysisError::NotQuantized(bad));
    }
    Ok(nodes)
}

/// Probes in this order: float (baseline), calibrated (`none`), one single-node
/// probe per node, one cumulative probe per node.
fn series_probes(
    engine: &Engine,
    nodes: &[Picked],
    qtype: DequantQType,
) -> Result<Vec<Probe>, AnalysisError> {
    let mut probes = vec![
        Probe {
            base: Base::Float,
            overrides: Vec::new(),
        },
        Probe {
            base: Base::Calibrated,
            overrides: Vec::new(),
        },
    ];
    probes.extend(nodes.iter().map(|(_, cals, _)| Probe::float_with_on(cals)));
    let mut overrides: Vec<(usize, Override)> = Vec::new();
    for (name, cals, _) in nodes {
        for &c in cals {
            if overrides.iter().any(|(o, _)| *o == c) {
                continue;
            }
            let setting =
                dequantized(engine, c, qtype).map_err(|message| AnalysisError::QType {
                    node: name.clone(),
                    qtype,
                    message,
                })?;
            overrides.push((c, setting));
        }
        probes.push(Probe {
            base: Base::Calibrated,
            overrides: overrides.clone(),
        });
    }
    Ok(probes)
}

/// The override that de-quantizes plan calibration `c`. A node OFF in the file stays
/// OFF: de-quantizing must never quantize more than the calibrated model does.
fn dequantized(engine: &Engine, c: usize, qtype: DequantQType) -> Result<Override, String> {
    let plan_cal = &engine.plan().calibrations()[c];
    if qtype == DequantQType::Float32 || !plan_cal.file.switch_on {
        return Ok(Override::Off);
    }
    let model = engine.model();
    let cal = model
        .calibration(plan_cal.graph_index)
        .ok_or_else(|| format!("'{}' is not a calibration node", plan_cal.name))?;
    hmct_quant::fake_quant_for(model, &cal, Some(&QType::INT16)).map(Override::Set)
}

/// The file names [`write_partial_quantization`] writes.
pub const PNG_NAME: &str = "partial_quantization.png";
pub const JSON_NAME: &str = "partial_quantization.json";

/// Writes `partial_quantization.png` (the [`SensitivityAnalysis::chart`]) and
/// `partial_quantization.json` (the serialized result) into `dir`, creating it if
/// missing, and returns the paths written (PNG first). Each file is written to a
/// temporary name and renamed into place; if the second fails the first is removed,
/// so the folder never holds half a result.
pub fn write_partial_quantization(
    result: &SensitivityAnalysis,
    dir: &Path,
) -> Result<Vec<PathBuf>, AnalysisError> {
    let write_err = |path: &Path, message: String| AnalysisError::Write {
        path: path.to_path_buf(),
        message,
    };
    std::fs::create_dir_all(dir)
        .map_err(|e| write_err(dir, format!("cannot create folder: {e}")))?;
    let json =
        crate::json::pretty(result).map_err(|e| write_err(&dir.join(JSON_NAME), e.to_string()))?;
    let png = dir.join(PNG_NAME);
    hmct_plot::line_chart(&result.chart(), &png, Format::Png)
        .map_err(|e| write_err(&png, hmct_ir::error_chain(&e)))?;
    let json_path = dir.join(JSON_NAME);
    if let Err(e) = hmct_ir::write_atomic(&json_path, &json) {
        let _ = std::fs::remove_file(&png);
        return Err(write_err(&json_path, e.to_string()));
    }
    Ok(vec![png, json_path])
}
