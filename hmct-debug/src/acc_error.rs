//! `plot-acc-error` (DEBUGGER.md §4): how the error of a partially quantized model
//! builds up along the graph.
//!
//! The x axis is every output of the quantized regular nodes, in graph order (a node
//! with two outputs gives two points). Each curve is one configuration of the
//! calibration nodes; its value at a point is the metric between the float model's
//! tensor and the configuration's tensor there, averaged over the samples (the first
//! one by default; NaN samples skipped).
//!
//! Configurations:
//! - `quantize_node` flat `[a, b]`: the float model with only `a`'s (then only `b`'s)
//!   input calibration nodes ON; a calibration node given by name stands for itself.
//! - nested `[[a], [a, b]]`: one curve per group (`partial_qmodel_i`) plus the
//!   calibrated model.
//! - `['weight']`, `['activation']`, `['weight', 'activation']`: the calibrated model
//!   with the activation (resp. weight) calibration nodes OFF, plus the calibrated
//!   model.
//! - `non_quantize_node`: the calibrated model with the listed nodes' calibration nodes
//!   OFF (flat: one curve per node; nested: one per group plus the calibrated model).
//!
//! Every curve is computed by the engine's incremental probes: from the captured
//! activations of the float (or calibrated) model only what a configuration changes
//! is re-run, which is bit-identical to a full run.
//!
//! [`plot_acc_error`] returns the series; [`write_acc_error`] draws one figure per
//! configuration kind and writes its series as JSON next to it.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use hmct_metrics::Metric;
use hmct_plot::{Figure, Format, LineChart, LineSeries};
use hmct_quant::{Base, Slot};
use serde::{Deserialize, Serialize};

use crate::engine::{Engine, EngineError, Probe, compare};
use crate::json;

/// The two special names of `quantize_node`.
pub const WEIGHT: &str = "weight";
pub const ACTIVATION: &str = "activation";

/// A `quantize_node` / `non_quantize_node` argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeList {
    /// One curve per name, that node alone (un)quantized.
    Flat(Vec<String>),
    /// One curve per group, the group's nodes (un)quantized together.
    Nested(Vec<Vec<String>>),
}

/// The arguments of [`plot_acc_error`]. At least one of `quantize_node` and
/// `non_quantize_node` must be given.
#[derive(Clone, Debug)]
pub struct AccErrorOptions {
    pub quantize_node: Option<NodeList>,
    pub non_quantize_node: Option<NodeList>,
    pub metric: Metric,
    /// Plot the running mean of each curve instead of the curve.
    pub average_mode: bool,
    /// Use the first `data_num` samples (`None`: the first one only).
    pub data_num: Option<usize>,
}

impl Default for AccErrorOptions {
    fn default() -> Self {
        AccErrorOptions {
            quantize_node: None,
            non_quantize_node: None,
            metric: Metric::CosineSimilarity,
            average_mode: false,
            data_num: None,
        }
    }
}

/// Errors of the analysis and of writing its files.
#[derive(Debug, thiserror::Error)]
pub enum AccError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("give quantize_node (-q) or non_quantize_node (-nq), or both")]
    NothingToDo,
    #[error("{which} is empty")]
    EmptyList { which: &'static str },
    #[error("{which} has an empty group")]
    EmptyGroup { which: &'static str },
    #[error(
        "'weight' and 'activation' are only allowed in quantize_node, as a flat list: ['weight'], ['activation'] or ['weight','activation']"
    )]
    SpecialNotAllowed,
    #[error(
        "'weight'/'activation' cannot be mixed with node names in quantize_node; give them as ['weight','activation'] and the nodes in another call"
    )]
    SpecialMixed,
    #[error("{which}: {}", describe_not_quantized(.nodes))]
    NotQuantized {
        which: &'static str,
        nodes: Vec<String>,
    },
    #[error("the model has no {0} calibration nodes")]
    NoCalibrationsOfKind(&'static str),
    #[error("the model has no quantized regular nodes: there is nothing to plot along")]
    NoQuantizedNodes,
    #[error("cannot create folder {}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Plot(#[from] hmct_plot::PlotError),
    #[error("cannot write {}", path.display())]
    Write {
        path: PathBuf,
        // Boxed: IrError is large and this is the rare path.
        #[source]
        source: Box<hmct_ir::IrError>,
    },
}

impl AccError {
    /// True for mistakes in the arguments (as opposed to failures while running or
    /// writing).
    pub fn is_usage(&self) -> bool {
        match self {
            AccError::Engine(e) => e.is_usage(),
            AccError::NothingToDo
            | AccError::EmptyList { .. }
            | AccError::EmptyGroup { .. }
            | AccError::SpecialNotAllowed
            | AccError::SpecialMixed
            | AccError::NotQuantized { .. } => true,
            _ => false,
        }
    }
}

fn describe_not_quantized(nodes: &[String]) -> String {
    let quoted: Vec<String> = nodes.iter().map(|n| format!("'{n}'")).collect();
    let verb = if nodes.len() == 1 { "has" } else { "have" };
    format!(
        "{} {verb} no calibration nodes, so there is nothing to switch",
        quoted.join(", ")
    )
}

/// What a figure shows; fixes its file name prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FigureKind {
    QuantizeNode,
    QuantizePartial,
    NonQuantizeNode,
    NonQuantizePartial,
    Weight,
    Activation,
    WeightActivation,
}

impl FigureKind {
    /// The file name prefix (DEBUGGER.md §4).
    pub fn prefix(self) -> &'static str {
        match self {
            FigureKind::QuantizeNode => "quantize_node_accumulate_err_of_node",
            FigureKind::QuantizePartial => "quantize_node_accumulate_err_of_partial_qmodel",
            FigureKind::NonQuantizeNode => "non_quantize_node_accumulate_err_of_node",
            FigureKind::NonQuantizePartial => "non_quantize_node_accumulate_err_of_partial_qmodel",
            FigureKind::Weight => "weight_quantized",
            FigureKind::Activation => "activation_quantized",
            FigureKind::WeightActivation => "weight_activation_quantized_separately",
        }
    }

    fn title(self) -> &'static str {
        match self {
            FigureKind::QuantizeNode => "only one node quantized",
            FigureKind::QuantizePartial => "only some nodes quantized",
            FigureKind::NonQuantizeNode => "calibrated model with one node not quantized",
            FigureKind::NonQuantizePartial => "calibrated model with some nodes not quantized",
            FigureKind::Weight => "only weights quantized",
            FigureKind::Activation => "only activations quantized",
            FigureKind::WeightActivation => "weights and activations quantized separately",
        }
    }
}

/// One point of the x axis: an output of a quantized regular node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Point {
    pub node: String,
    pub tensor: String,
    /// The axis label: the node name, with `#i` for the i-th output of a node that
    /// gives several points.
    pub label: String,
}

/// One configuration's series.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Curve {
    /// Legend label: the node name, `partial_qmodel_i`, `calibrated_model`,
    /// `weight_quantized` or `activation_quantized`.
    pub label: String,
    /// The model the configuration starts from.
    pub base: BaseModel,
    /// The names given for this curve (empty for the reference and special curves).
    pub nodes: Vec<String>,
    /// The calibration nodes switched (ON from the float model, OFF from the
    /// calibrated model).
    pub switched: Vec<String>,
    /// The metric at each point (sqnr is `inf` where the tensors are identical; JSON
    /// spells non-finite values as strings).
    #[serde(
        serialize_with = "json::numbers",
        deserialize_with = "json::de_numbers"
    )]
    pub values: Vec<f64>,
    /// The running mean of `values` (present in average mode; what is plotted then).
    #[serde(
        serialize_with = "json::opt_numbers",
        deserialize_with = "json::de_opt_numbers",
        skip_serializing_if = "Option::is_none",
        default
    )]
    pub averaged: Option<Vec<f64>>,
}

impl Curve {
    /// The series the figure draws.
    pub fn plotted(&self) -> &[f64] {
        self.averaged.as_deref().unwrap_or(&self.values)
    }
}

/// [`Base`], serializable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BaseModel {
    Float,
    Calibrated,
}

/// The curves of one figure.
#[derive(Clone, Debug, Serialize)]
pub struct AccErrorFigure {
    pub kind: FigureKind,
    pub curves: Vec<Curve>,
}

/// The result of [`plot_acc_error`].
#[derive(Clone, Debug, Serialize)]
pub struct AccErrorCurves {
    pub metric: Metric,
    pub average_mode: bool,
    /// Number of samples averaged (the first ones).
    pub data_num: usize,
    pub points: Vec<Point>,
    /// The `quantize_node` figure first, then the `non_quantize_node` one.
    pub figures: Vec<AccErrorFigure>,
}

impl AccErrorCurves {
    /// The file name of a figure without extension: `<prefix>_<metric>`, with
    /// `average_` in front in average mode.
    pub fn file_stem(&self, figure: &AccErrorFigure) -> String {
        let average = if self.average_mode { "average_" } else { "" };
        format!("{average}{}_{}", figure.kind.prefix(), self.metric)
    }
}

/// A curve before it is run.
struct Planned {
    label: String,
    probe: Probe,
    nodes: Vec<String>,
}

/// Computes the accumulated-error curves. `progress` gets (runs done, total).
pub fn plot_acc_error(
    engine: &Engine,
    options: &AccErrorOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<AccErrorCurves, AccError> {
    if options.quantize_node.is_none() && options.non_quantize_node.is_none() {
        return Err(AccError::NothingToDo);
    }
    let samples = engine.sample_count(Some(options.data_num.unwrap_or(1)))?;
    let mut figures: Vec<(FigureKind, Vec<Planned>)> = Vec::new();
    if let Some(list) = &options.quantize_node {
        figures.push(plan_figure(engine, list, true)?);
    }
    if let Some(list) = &options.non_quantize_node {
        figures.push(plan_figure(engine, list, false)?);
    }
    let points = points(engine);
    if points.is_empty() {
        return Err(AccError::NoQuantizedNodes);
    }
    let slots: Vec<Slot> = points.iter().map(|(_, s)| *s).collect();

    let probes: Vec<Probe> = figures
        .iter()
        .flat_map(|(_, curves)| curves.iter().map(|c| c.probe.clone()))
        .collect();
    let metric = options.metric;
    let results = engine.run_probes(
        &probes,
        &slots,
        samples,
        |view| {
            slots
                .iter()
                .map(|&slot| {
                    let x = view.float_value(slot)?;
                    let y = view.value(slot)?;
                    Ok(point_metric(&x, &y, metric, engine.value_name(slot)))
                })
                .collect::<Result<Vec<f64>, EngineError>>()
        },
        progress,
    )?;

    let mut per_probe = results.values.into_iter();
    let plan = engine.plan();
    let figures = figures
        .into_iter()
        .map(|(kind, planned)| AccErrorFigure {
            kind,
            curves: planned
                .into_iter()
                .map(|p| {
                    let per_sample = per_probe.next().expect("one result per probe");
                    let values: Vec<f64> = (0..slots.len())
                        .map(|i| {
                            let v: Vec<f64> = per_sample.iter().map(|s| s[i]).collect();
                            hmct_metrics::nan_mean(&v)
                        })
                        .collect();
                    Curve {
                        label: p.label,
                        base: match p.probe.base {
                            Base::Float => BaseModel::Float,
                            Base::Calibrated => BaseModel::Calibrated,
                        },
                        nodes: p.nodes,
                        switched: p
                            .probe
                            .overrides
                            .iter()
                            .map(|(c, _)| plan.calibrations()[*c].name.clone())
                            .collect(),
                        averaged: options.average_mode.then(|| running_mean(&values)),
                        values,
                    }
                })
                .collect(),
        })
        .collect();

    Ok(AccErrorCurves {
        metric,
        average_mode: options.average_mode,
        data_num: samples,
        points: point_labels(engine, &points),
        figures,
    })
}

/// The metric at one point; NaN when the tensors cannot be compared (a non-numeric
/// output, or a data-dependent shape that differs), so one odd output does not sink
/// the whole figure.
fn point_metric(
    x: &hmct_tensor::Tensor,
    y: &hmct_tensor::Tensor,
    metric: Metric,
    what: &str,
) -> f64 {
    match compare(x, y, &[metric], what) {
        Ok(v) => v[0],
        Err(_) => f64::NAN,
    }
}

/// The running mean: `[1.0, 0.9, 0.9, 0.8]` → `[1.0, 0.95, 0.933.., 0.9]`. NaN values
/// are skipped (a leading NaN stays NaN).
pub fn running_mean(values: &[f64]) -> Vec<f64> {
    let (mut sum, mut count) = (0.0, 0usize);
    values
        .iter()
        .map(|&v| {
            if !v.is_nan() {
                sum += v;
                count += 1;
            }
            if count == 0 {
                f64::NAN
            } else {
                sum / count as f64
            }
        })
        .collect()
}

/// The outputs of the quantized regular nodes in graph order, with their node.
fn points(engine: &Engine) -> Vec<(hmct_ir::NodeId, Slot)> {
    let mut seen = std::collections::HashSet::new();
    hmct_ir::quantized_nodes(engine.model())
        .into_iter()
        .flat_map(|id| engine.output_slots(id).into_iter().map(move |s| (id, s)))
        .filter(|(_, s)| seen.insert(*s))
        .collect()
}

fn point_labels(engine: &Engine, points: &[(hmct_ir::NodeId, Slot)]) -> Vec<Point> {
    let model = engine.model();
    points
        .iter()
        .map(|&(id, slot)| {
            let node = model.node_name(id).to_string();
            let siblings: Vec<Slot> = points
                .iter()
                .filter(|(n, _)| *n == id)
                .map(|(_, s)| *s)
                .collect();
            let label = if siblings.len() > 1 {
                let i = siblings.iter().position(|s| *s == slot).unwrap_or(0);
                format!("{node}#{i}")
            } else {
                node.clone()
            };
            Point {
                node,
                tensor: engine.value_name(slot).to_string(),
                label,
            }
        })
        .collect()
}

fn plan_figure(
    engine: &Engine,
    list: &NodeList,
    quantize: bool,
) -> Result<(FigureKind, Vec<Planned>), AccError> {
    let which = if quantize {
        "quantize_node"
    } else {
        "non_quantize_node"
    };
    let is_special = |n: &String| n == WEIGHT || n == ACTIVATION;
    let names: Vec<&String> = match list {
        NodeList::Flat(names) => names.iter().collect(),
        NodeList::Nested(groups) => groups.iter().flatten().collect(),
    };
    if names.iter().any(|n| is_special(n)) {
        match list {
            NodeList::Flat(names) if quantize => {
                if !names.iter().all(is_special) {
                    return Err(AccError::SpecialMixed);
                }
                return special_figure(engine, names);
            }
            _ => return Err(AccError::SpecialNotAllowed),
        }
    }
    let groups: Vec<Vec<String>> = match list {
        NodeList::Flat(names) if names.is_empty() => return Err(AccError::EmptyList { which }),
        NodeList::Nested(groups) if groups.is_empty() => {
            return Err(AccError::EmptyList { which });
        }
        NodeList::Nested(groups) if groups.iter().any(Vec::is_empty) => {
            return Err(AccError::EmptyGroup { which });
        }
        NodeList::Flat(names) => names.iter().map(|n| vec![n.clone()]).collect(),
        NodeList::Nested(groups) => groups.clone(),
    };
    let all: Vec<&str> = groups.iter().flatten().map(String::as_str).collect();
    engine.lookup_all(&all)?;
    let mut not_quantized: Vec<String> = Vec::new();
    let mut planned = Vec::new();
    for (i, group) in groups.iter().enumerate() {
        let mut calibrations: Vec<usize> = Vec::new();
        for name in group {
            let cals = engine.calibrations_of(engine.lookup(name).expect("checked above"));
            if cals.is_empty() && !not_quantized.contains(name) {
                not_quantized.push(name.clone());
            }
            for c in cals {
                if !calibrations.contains(&c) {
                    calibrations.push(c);
                }
            }
        }
        let probe = if quantize {
            Probe::float_with_on(&calibrations)
        } else {
            Probe::calibrated_with_off(&calibrations)
        };
        let label = match list {
            NodeList::Flat(_) => group[0].clone(),
            NodeList::Nested(_) => format!("partial_qmodel_{i}"),
        };
        planned.push(Planned {
            label,
            probe,
            nodes: group.clone(),
        });
    }
    if !not_quantized.is_empty() {
        return Err(AccError::NotQuantized {
            which,
            nodes: not_quantized,
        });
    }
    let kind = match (list, quantize) {
        (NodeList::Flat(_), true) => FigureKind::QuantizeNode,
        (NodeList::Nested(_), true) => FigureKind::QuantizePartial,
        (NodeList::Flat(_), false) => FigureKind::NonQuantizeNode,
        (NodeList::Nested(_), false) => FigureKind::NonQuantizePartial,
    };
    if matches!(list, NodeList::Nested(_)) {
        planned.push(calibrated_reference());
    }
    Ok((kind, planned))
}

fn calibrated_reference() -> Planned {
    Planned {
        label: "calibrated_model".into(),
        probe: Probe::calibrated_with_off(&[]),
        nodes: Vec::new(),
    }
}

/// `['weight']`, `['activation']` or both: the calibrated model with the other kind
/// OFF (so nodes switched OFF in the file stay OFF), plus the calibrated model.
fn special_figure(
    engine: &Engine,
    names: &[String],
) -> Result<(FigureKind, Vec<Planned>), AccError> {
    let weight = names.iter().any(|n| n == WEIGHT);
    let activation = names.iter().any(|n| n == ACTIVATION);
    let of_kind = |want: hmct_ir::TensorType| -> Vec<usize> {
        (0..engine.plan().calibrations().len())
            .filter(|&i| {
                engine
                    .model()
                    .calibration(engine.calibration_id(i))
                    .is_some_and(|c| c.tensor_type() == want)
            })
            .collect()
    };
    let weights = of_kind(hmct_ir::TensorType::Weight);
    let activations = of_kind(hmct_ir::TensorType::Feature);
    let mut planned = Vec::new();
    if weight {
        if weights.is_empty() {
            return Err(AccError::NoCalibrationsOfKind(WEIGHT));
        }
        planned.push(Planned {
            label: "weight_quantized".into(),
            probe: Probe::calibrated_with_off(&activations),
            nodes: Vec::new(),
        });
    }
    if activation {
        if activations.is_empty() {
            return Err(AccError::NoCalibrationsOfKind(ACTIVATION));
        }
        planned.push(Planned {
            label: "activation_quantized".into(),
            probe: Probe::calibrated_with_off(&weights),
            nodes: Vec::new(),
        });
    }
    planned.push(calibrated_reference());
    let kind = match (weight, activation) {
        (true, true) => FigureKind::WeightActivation,
        (true, false) => FigureKind::Weight,
        _ => FigureKind::Activation,
    };
    Ok((kind, planned))
}

/// The figure of one configuration kind, as drawn by [`write_acc_error`].
pub fn figure_spec(curves: &AccErrorCurves, figure: &AccErrorFigure) -> LineChart {
    let mode = if curves.average_mode {
        " (running mean)"
    } else {
        ""
    };
    let samples = if curves.data_num == 1 {
        "1 sample".to_string()
    } else {
        format!("mean of {} samples", curves.data_num)
    };
    let title = format!(
        "Accumulated {}{mode}: {} ({samples})",
        curves.metric,
        figure.kind.title()
    );
    // The calibrated model is the reference the other curves are read against: black,
    // dashed, and drawn first so it never hides them (it often runs along one).
    let is_reference = |c: &&Curve| c.label == "calibrated_model";
    let reference = figure.curves.iter().filter(is_reference).map(|c| {
        LineSeries::new(legend_label(c), c.plotted().to_vec())
            .color(hmct_plot::Rgb::BLACK)
            .line(hmct_plot::LineKind::Dashed)
    });
    let others = figure
        .curves
        .iter()
        .filter(|c| !is_reference(c))
        .enumerate()
        .map(|(i, c)| {
            LineSeries::new(legend_label(c), c.plotted().to_vec()).color(hmct_plot::Rgb::cycle(i))
        });
    let series = reference.chain(others).collect();
    LineChart {
        figure: Figure::new(
            title,
            "output of quantized node (graph order)",
            curves.metric.name(),
        ),
        x_labels: curves.points.iter().map(|p| p.label.clone()).collect(),
        series,
        baseline: None,
    }
}

/// `partial_qmodel_0 (Conv_2, Conv_9)`: what a group is, as far as fits a legend.
fn legend_label(c: &Curve) -> String {
    if !c.label.starts_with("partial_qmodel_") {
        return c.label.clone();
    }
    let joined = c.nodes.join(", ");
    // hmct-plot shortens legend labels past 48 characters from the front, which would
    // cut off the curve's name.
    if c.label.len() + joined.chars().count() + 3 <= 48 {
        format!("{} ({joined})", c.label)
    } else {
        format!("{} ({} nodes)", c.label, c.nodes.len())
    }
}

/// One figure's file, `<stem>.json`: its curves with the x axis. Written borrowing
/// the result's points and curves; read back (by the report) owning them.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FigureFile<'a> {
    pub kind: FigureKind,
    pub metric: Metric,
    pub average_mode: bool,
    pub data_num: usize,
    pub points: Cow<'a, [Point]>,
    pub curves: Cow<'a, [Curve]>,
}

/// Writes `<stem>.png` (or `.svg`) and `<stem>.json` per figure into `dir` (created
/// if missing) and returns the paths written, in order. Each file is written to a
/// temporary name and renamed, so no half-written file is left.
pub fn write_acc_error(
    curves: &AccErrorCurves,
    dir: &Path,
    format: Format,
) -> Result<Vec<PathBuf>, AccError> {
    std::fs::create_dir_all(dir).map_err(|source| AccError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut written = Vec::new();
    for figure in &curves.figures {
        let stem = curves.file_stem(figure);
        let image = dir.join(format!("{stem}.{}", format.extension()));
        hmct_plot::line_chart(&figure_spec(curves, figure), &image, format)?;
        written.push(image);
        let json_path = dir.join(format!("{stem}.json"));
        let json = FigureFile {
            kind: figure.kind,
            metric: curves.metric,
            average_mode: curves.average_mode,
            data_num: curves.data_num,
            points: Cow::Borrowed(&curves.points),
            curves: Cow::Borrowed(&figure.curves),
        };
        write_json(&json_path, &json).map_err(|source| AccError::Write {
            path: json_path.clone(),
            source: Box::new(source),
        })?;
        written.push(json_path);
    }
    Ok(written)
}

/// Pretty JSON with a final newline, written atomically.
pub(crate) fn write_json(path: &Path, value: &impl Serialize) -> Result<(), hmct_ir::IrError> {
    hmct_ir::write_atomic(path, &json::pretty(value).expect("plain data serializes"))
}
