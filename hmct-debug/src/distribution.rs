//! `plot-distribution` (DEBUGGER.md §5): value histograms of chosen nodes, over every
//! sample that `data_num` allows (all by default; the figure titles say how many).
//! One sample of a [1, C] activation is only C values, too few for a distribution.
//!
//! - An activation calibration node: its input in the float model (the values its
//!   thresholds were calibrated on), with the largest threshold as a red dashed line
//!   and the largest |x| as a blue triangle. File `activation_<node>`.
//! - A weight calibration node: the float weight and the fake-quantized weight (the
//!   node's own parameters, whatever its switch), their cosine in the title. File
//!   `weight_<node>`.
//! - A regular node: for each output, the float model's and the calibrated model's
//!   values, and on a panel of its own (the errors are orders of magnitude smaller than
//!   the values) their difference calibrated − float; cosine in the title. File
//!   `node_output_<tensor>_of_<node>`.
//!
//! Exact zeros are left out of the value histograms (ReLU outputs and pruned weights
//! would otherwise dwarf everything else); positions where both outputs are exactly
//! zero are left out of the difference histogram for the same reason. Both are
//! counted in the result. `/` and `:` in names become `_` in file names.
//!
//! [`plot_distribution`] returns the data (statistics and the histogram counts, plus
//! the raw values in memory); [`write_distribution`] draws it.

use std::path::{Path, PathBuf};

use hmct_ir::TensorType;
use hmct_metrics::Metric;
use hmct_plot::{Figure, Format, HistSeries, Histogram, HistogramRow, Rgb, VLine};
use hmct_quant::{Base, Slot};
use hmct_tensor::Tensor;
use serde::Serialize;

use crate::engine::{Engine, EngineError, NodeRef};
use crate::json;

/// The arguments of [`plot_distribution`].
#[derive(Clone, Debug)]
pub struct DistributionOptions {
    /// Calibration nodes (weight or activation) and regular nodes, in any mix.
    pub nodes: Vec<String>,
    /// Histogram bins.
    pub bins: usize,
    /// Samples whose values are pooled: the first `data_num` (all when `None`).
    pub data_num: Option<usize>,
}

impl Default for DistributionOptions {
    fn default() -> Self {
        DistributionOptions {
            nodes: Vec::new(),
            bins: Histogram::DEFAULT_BINS,
            data_num: None,
        }
    }
}

/// Errors of the analysis and of writing its files.
#[derive(Debug, thiserror::Error)]
pub enum DistributionError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("nodes_list is empty: give calibration nodes or regular nodes to plot")]
    NoNodes,
    #[error("bins must be at least 1")]
    NoBins,
    #[error("'{value}' of '{node}' is {dtype}: only numeric values can be plotted")]
    NotNumeric {
        node: String,
        value: String,
        dtype: String,
    },
    #[error("weight calibration node '{node}': {message}")]
    FakeQuant { node: String, message: String },
    #[error("cannot create folder {}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Plot(#[from] hmct_plot::PlotError),
}

impl DistributionError {
    /// True for mistakes in the arguments.
    pub fn is_usage(&self) -> bool {
        match self {
            DistributionError::Engine(e) => e.is_usage(),
            DistributionError::NoNodes | DistributionError::NoBins => true,
            _ => false,
        }
    }
}

/// What kind of node a figure is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DistributionKind {
    Activation,
    Weight,
    Node,
}

/// Summary of a tensor (all finite elements, zeros included).
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub elements: usize,
    /// Exact zeros (left out of value histograms).
    pub zeros: usize,
    pub non_finite: usize,
    #[serde(serialize_with = "json::number")]
    pub min: f64,
    #[serde(serialize_with = "json::number")]
    pub max: f64,
    #[serde(serialize_with = "json::number")]
    pub mean: f64,
    #[serde(serialize_with = "json::number")]
    pub std: f64,
    #[serde(serialize_with = "json::number")]
    pub max_abs: f64,
}

impl Summary {
    pub fn of(values: &[f32]) -> Summary {
        let (mut sum, mut sq, mut n) = (0.0f64, 0.0f64, 0usize);
        let (mut min, mut max, mut max_abs) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
        let mut zeros = 0;
        for &v in values {
            if !v.is_finite() {
                continue;
            }
            let v = f64::from(v);
            n += 1;
            sum += v;
            sq += v * v;
            min = min.min(v);
            max = max.max(v);
            max_abs = max_abs.max(v.abs());
            zeros += usize::from(v == 0.0);
        }
        let (mean, std) = if n == 0 {
            (f64::NAN, f64::NAN)
        } else {
            let mean = sum / n as f64;
            (mean, (sq / n as f64 - mean * mean).max(0.0).sqrt())
        };
        Summary {
            elements: values.len(),
            zeros,
            non_finite: values.len() - n,
            min: if n == 0 { f64::NAN } else { min },
            max: if n == 0 { f64::NAN } else { max },
            mean,
            std,
            max_abs: if n == 0 { f64::NAN } else { max_abs },
        }
    }
}

/// One histogram of a panel.
#[derive(Clone, Debug, Serialize)]
pub struct DistSeries {
    pub label: String,
    /// Statistics of the whole tensor.
    pub summary: Summary,
    /// Elements left out of the histogram (exact zeros, see the module docs).
    pub left_out: usize,
    /// Counts on the panel's bins.
    pub counts: Vec<u64>,
    /// The values drawn (not serialized: the counts say what the figure shows).
    #[serde(skip)]
    pub values: Vec<f32>,
}

/// One set of axes: series on shared bins.
#[derive(Clone, Debug, Serialize)]
pub struct Panel {
    pub title: String,
    pub x_label: String,
    /// `bins + 1` edges.
    pub edges: Vec<f64>,
    pub series: Vec<DistSeries>,
    /// The largest calibration threshold (activation nodes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f64>,
    /// The largest |x| (activation nodes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_abs: Option<f64>,
}

/// One figure.
#[derive(Clone, Debug, Serialize)]
pub struct DistributionItem {
    /// The node name as given.
    pub node: String,
    pub kind: DistributionKind,
    /// The tensor plotted: the calibration node's input, or the regular node's output.
    pub tensor: String,
    /// Its shape in one sample (the first).
    pub shape: Vec<usize>,
    /// The samples pooled (1 for a weight, which every sample shares).
    pub samples: usize,
    /// File name without extension.
    pub file_stem: String,
    pub title: String,
    /// Cosine similarity float vs quantized (weights and regular nodes).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "json::opt_number"
    )]
    pub cosine: Option<f64>,
    pub panels: Vec<Panel>,
}

/// The result of [`plot_distribution`], one item per figure, in the order the nodes
/// were given (a regular node with several outputs gives one item per output).
#[derive(Clone, Debug, Serialize)]
pub struct Distributions {
    /// The samples looked at (`data_num`).
    pub samples: usize,
    pub bins: usize,
    pub items: Vec<DistributionItem>,
}

/// `/` and `:` become `_` (DEBUGGER.md §5), as do other characters file systems
/// refuse, so the name is a single file name everywhere.
pub fn file_safe(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            '/' | ':' | '\\' | '\0' | '<' | '>' | '"' | '|' | '?' | '*' => '_',
            c => c,
        })
        .collect()
}

/// The values of a tensor as f32; `None` for non-numeric tensors.
pub(crate) fn to_f32(t: &Tensor) -> Option<Vec<f32>> {
    if let Some(a) = t.as_f32() {
        return Some(a.iter().copied().collect());
    }
    t.to_f64_vec()
        .map(|v| v.into_iter().map(|x| x as f32).collect())
}

fn numeric(t: &Tensor, node: &str, value: &str) -> Result<Vec<f32>, DistributionError> {
    to_f32(t).ok_or_else(|| DistributionError::NotNumeric {
        node: node.to_string(),
        value: value.to_string(),
        dtype: t.dtype().to_string(),
    })
}

/// What one figure is drawn from, and the values gathered for it so far.
struct Target<'a> {
    name: &'a str,
    kind: DistributionKind,
    /// The plan's index of a calibration node.
    calibration: Option<usize>,
    slot: Slot,
    tensor: String,
    shape: Vec<usize>,
    threshold: Option<f64>,
    /// Per sample, appended: the float values (the weight for weight nodes) and, for
    /// regular nodes, the calibrated model's.
    float: Vec<f32>,
    calibrated: Vec<f32>,
}

/// Computes the histograms of every node in `options.nodes`, pooling the values of
/// the samples `options.data_num` asks for.
pub fn plot_distribution(
    engine: &Engine,
    options: &DistributionOptions,
) -> Result<Distributions, DistributionError> {
    if options.nodes.is_empty() {
        return Err(DistributionError::NoNodes);
    }
    if options.bins == 0 {
        return Err(DistributionError::NoBins);
    }
    let samples = engine.sample_count(options.data_num)?;
    let refs = engine.lookup_all(&options.nodes)?;
    let model = engine.model();
    let mut targets = Vec::new();
    for (name, r) in options.nodes.iter().zip(refs) {
        match r {
            NodeRef::Calibration { id, index } => {
                let cal = &engine.plan().calibrations()[index];
                let calibration = model.calibration(id);
                let weight = calibration
                    .as_ref()
                    .is_some_and(|c| c.tensor_type() == TensorType::Weight);
                targets.push(Target {
                    name,
                    kind: if weight {
                        DistributionKind::Weight
                    } else {
                        DistributionKind::Activation
                    },
                    calibration: Some(index),
                    slot: cal.input,
                    tensor: engine.value_name(cal.input).to_string(),
                    shape: Vec::new(),
                    threshold: calibration.and_then(|c| max_threshold(&c)),
                    float: Vec::new(),
                    calibrated: Vec::new(),
                });
            }
            NodeRef::Regular(id) => {
                for slot in engine.output_slots(id) {
                    targets.push(Target {
                        name,
                        kind: DistributionKind::Node,
                        calibration: None,
                        slot,
                        tensor: engine.value_name(slot).to_string(),
                        shape: Vec::new(),
                        threshold: None,
                        float: Vec::new(),
                        calibrated: Vec::new(),
                    });
                }
            }
        }
    }
    let needs_calibrated = targets.iter().any(|t| t.kind == DistributionKind::Node);
    for sample in 0..samples {
        let float = engine.capture(sample, Base::Float)?;
        let calibrated = if needs_calibrated {
            Some(engine.capture(sample, Base::Calibrated)?)
        } else {
            None
        };
        for t in &mut targets {
            // A weight is the same in every sample.
            if t.kind == DistributionKind::Weight && sample > 0 {
                continue;
            }
            let x = engine.captured_value(&float, Base::Float, t.slot)?;
            if sample == 0 {
                t.shape = x.shape().to_vec();
            }
            t.float.extend(numeric(&x, t.name, &t.tensor)?);
            if let (DistributionKind::Node, Some(calibrated)) = (t.kind, &calibrated) {
                let y = engine.captured_value(calibrated, Base::Calibrated, t.slot)?;
                t.calibrated.extend(numeric(&y, t.name, &t.tensor)?);
            }
        }
    }
    let plan = engine.plan();
    let mut items = Vec::new();
    for t in targets {
        items.push(match t.kind {
            DistributionKind::Weight => {
                let index = t.calibration.expect("weights are calibration nodes");
                let quantized = plan.calibrations()[index]
                    .file
                    .fake_quant
                    .apply(&t.float, &t.shape)
                    .map_err(|e| DistributionError::FakeQuant {
                        node: t.name.to_string(),
                        message: e.to_string(),
                    })?;
                weight_item(t.name, t.tensor, t.shape, t.float, quantized, options.bins)
            }
            DistributionKind::Activation => activation_item(
                t.name,
                t.tensor,
                t.shape,
                t.float,
                t.threshold,
                options.bins,
                samples,
            ),
            DistributionKind::Node => node_item(
                t.name,
                t.tensor,
                t.shape,
                t.float,
                t.calibrated,
                options.bins,
                samples,
            ),
        });
    }
    Ok(Distributions {
        samples,
        bins: options.bins,
        items,
    })
}

/// `1 sample`, `8 samples`.
pub(crate) fn samples_text(samples: usize) -> String {
    if samples == 1 {
        "1 sample".to_string()
    } else {
        format!("{samples} samples")
    }
}

/// The largest threshold; derived from the scales when the node has none.
pub(crate) fn max_threshold(cal: &hmct_ir::CalibrationNode<'_>) -> Option<f64> {
    let thresholds = cal.thresholds();
    let values = if thresholds.is_empty() {
        let qmax = cal.qtype().qrange()?.1 as f32;
        cal.scales().iter().map(|s| s * qmax).collect()
    } else {
        thresholds
    };
    values.into_iter().reduce(f32::max).map(f64::from)
}

fn non_zero(values: &[f32]) -> Vec<f32> {
    values.iter().copied().filter(|v| *v != 0.0).collect()
}

/// Bins `series` (label, all values, values drawn) together into a panel.
fn panel(
    title: String,
    x_label: &str,
    series: Vec<(String, &[f32], Vec<f32>)>,
    bins: usize,
) -> Panel {
    let drawn: Vec<&[f32]> = series.iter().map(|(_, _, d)| d.as_slice()).collect();
    let (edges, counts) = hmct_plot::histogram_bins(&drawn, bins)
        .unwrap_or_else(|| (Vec::new(), vec![Vec::new(); series.len()]));
    Panel {
        title,
        x_label: x_label.to_string(),
        edges,
        series: series
            .into_iter()
            .zip(counts)
            .map(|((label, all, drawn), counts)| DistSeries {
                label,
                summary: Summary::of(all),
                left_out: all.len() - drawn.len(),
                counts,
                values: drawn,
            })
            .collect(),
        threshold: None,
        max_abs: None,
    }
}

fn activation_item(
    name: &str,
    tensor: String,
    shape: Vec<usize>,
    values: Vec<f32>,
    threshold: Option<f64>,
    bins: usize,
    samples: usize,
) -> DistributionItem {
    let drawn = non_zero(&values);
    let mut p = panel(
        tensor_title(&tensor, &shape),
        "value",
        vec![("float input".into(), &values, drawn)],
        bins,
    );
    let max_abs = p.series[0].summary.max_abs;
    p.threshold = threshold;
    p.max_abs = max_abs.is_finite().then_some(max_abs);
    DistributionItem {
        node: name.to_string(),
        kind: DistributionKind::Activation,
        title: format!(
            "Input of activation calibration node {name} (float model, {})",
            samples_text(samples)
        ),
        file_stem: format!("activation_{}", file_safe(name)),
        tensor,
        shape,
        samples,
        cosine: None,
        panels: vec![p],
    }
}

fn weight_item(
    name: &str,
    tensor: String,
    shape: Vec<usize>,
    values: Vec<f32>,
    quantized: Vec<f32>,
    bins: usize,
) -> DistributionItem {
    let cosine = hmct_metrics::compute(Metric::CosineSimilarity, &values, &quantized).ok();
    let (a, b) = (non_zero(&values), non_zero(&quantized));
    let p = panel(
        tensor_title(&tensor, &shape),
        "weight value",
        vec![
            ("float weight".into(), &values, a),
            ("fake-quantized weight".into(), &quantized, b),
        ],
        bins,
    );
    DistributionItem {
        node: name.to_string(),
        kind: DistributionKind::Weight,
        title: format!(
            "Weight of {name}: float vs fake-quantized{}",
            cosine_text(cosine)
        ),
        file_stem: format!("weight_{}", file_safe(name)),
        tensor,
        shape,
        samples: 1,
        cosine,
        panels: vec![p],
    }
}

fn node_item(
    name: &str,
    tensor: String,
    shape: Vec<usize>,
    float: Vec<f32>,
    calibrated: Vec<f32>,
    bins: usize,
    samples: usize,
) -> DistributionItem {
    let cosine = hmct_metrics::compute(Metric::CosineSimilarity, &float, &calibrated).ok();
    let diff: Vec<f32> = float.iter().zip(&calibrated).map(|(x, y)| y - x).collect();
    let diff_drawn: Vec<f32> = float
        .iter()
        .zip(&calibrated)
        .filter(|(x, y)| !(**x == 0.0 && **y == 0.0))
        .map(|(x, y)| y - x)
        .collect();
    let (a, b) = (non_zero(&float), non_zero(&calibrated));
    let values = panel(
        tensor_title(&tensor, &shape),
        "output value",
        vec![
            ("float model".into(), &float, a),
            ("calibrated model".into(), &calibrated, b),
        ],
        bins,
    );
    let errors = panel(
        "error".into(),
        "calibrated − float",
        vec![("error".into(), &diff, diff_drawn)],
        bins,
    );
    DistributionItem {
        node: name.to_string(),
        kind: DistributionKind::Node,
        title: format!(
            "Output '{tensor}' of {name}: float vs calibrated, {}{}",
            samples_text(samples),
            cosine_text(cosine)
        ),
        file_stem: format!("node_output_{}_of_{}", file_safe(&tensor), file_safe(name)),
        tensor,
        shape,
        samples,
        cosine,
        panels: vec![values, errors],
    }
}

fn tensor_title(tensor: &str, shape: &[usize]) -> String {
    format!("'{tensor}' {shape:?}")
}

fn cosine_text(cosine: Option<f64>) -> String {
    cosine.map_or(String::new(), |c| format!(" (cosine {c:.6})"))
}

/// The figure of an item, as drawn by [`write_distribution`].
pub fn item_spec(item: &DistributionItem, bins: usize) -> HistogramRow {
    let panels = item
        .panels
        .iter()
        .map(|p| {
            // A panel with nothing left to bin (an all-zero tensor, identical
            // outputs) still gets its axes, with a label saying why they are empty.
            let nothing = p.series.iter().all(|s| s.values.is_empty());
            let series = p
                .series
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let mut label = s.label.clone();
                    if nothing {
                        label = format!("{label}: nothing but zeros");
                    } else if s.left_out > 0 {
                        let zeros = if s.left_out == 1 { "zero" } else { "zeros" };
                        label = format!("{label} ({} {zeros} left out)", s.left_out);
                    }
                    let values = if nothing { vec![0.0] } else { s.values.clone() };
                    let mut h = HistSeries::new(label, values);
                    // The error panel gets a colour of its own.
                    h.color = Some(if p.title == "error" {
                        Rgb::cycle(2)
                    } else {
                        Rgb::cycle(i)
                    });
                    h
                })
                .collect();
            let mut h = Histogram::new(
                Figure::new(p.title.clone(), p.x_label.clone(), "count"),
                series,
            );
            h.bins = bins;
            h.threshold = p
                .threshold
                .map(|t| VLine::new(t, format!("threshold {}", short(t))));
            h.max_marker = p
                .max_abs
                .map(|m| VLine::new(m, format!("max |x| {}", short(m))));
            h
        })
        .collect();
    HistogramRow {
        title: item.title.clone(),
        panels,
    }
}

fn short(v: f64) -> String {
    if v != 0.0 && (v.abs() >= 1e5 || v.abs() < 1e-3) {
        format!("{v:.4e}")
    } else {
        format!("{v:.5}")
    }
}

/// Writes one figure per item into `dir` (created if missing) and returns the paths,
/// in order. Each file is written to a temporary name and renamed.
pub fn write_distribution(
    result: &Distributions,
    dir: &Path,
    format: Format,
) -> Result<Vec<PathBuf>, DistributionError> {
    std::fs::create_dir_all(dir).map_err(|source| DistributionError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut written = Vec::new();
    for item in &result.items {
        let path = dir.join(format!("{}.{}", item.file_stem, format.extension()));
        hmct_plot::histogram_row(&item_spec(item, result.bins), &path, format)?;
        written.push(path);
    }
    Ok(written)
}
