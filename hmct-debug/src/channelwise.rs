//! `get-channelwise-data-distribution` (DEBUGGER.md §6): per-channel statistics of a
//! calibration node's input, drawn as one box per channel.
//!
//! A weight calibration node is looked at through its float weight, channel axis = the
//! node's `axis` attribute (0 when absent); an activation calibration node through its
//! input in the float model, channel axis 1, pooled over every sample that `data_num`
//! allows (all by default; one sample of a [1, C] input would give each box a single
//! value). `axis` overrides both
//! (negative values count from the end). Quartiles interpolate linearly as numpy
//! does; whiskers reach the furthest values within 1.5 IQR and the values beyond are
//! outliers, as matplotlib draws a box plot.
//!
//! [`get_channelwise_data_distribution`] returns the statistics;
//! [`write_channelwise`] draws `<node>_boxplot` and writes the statistics as
//! `<node>_channel_stats.csv` (channel, count, min, q1, median, mean, q3, max, max|x|).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use hmct_ir::{TensorType, quote_list};
use hmct_plot::{BoxPlot, BoxStats, Figure, Format};
use hmct_quant::Base;
use serde::Serialize;

use crate::distribution::{file_safe, to_f32};
use crate::engine::{Engine, EngineError, NodeRef};
use crate::json;

/// The arguments of [`get_channelwise_data_distribution`].
#[derive(Clone, Debug)]
pub struct ChannelwiseOptions {
    /// Calibration nodes (weight or activation).
    pub nodes: Vec<String>,
    /// The channel axis for every node (`None`: per node, see the module docs).
    pub axis: Option<i64>,
    /// Activations are pooled over the first `data_num` samples (all when `None`).
    pub data_num: Option<usize>,
    /// Outliers kept per channel for drawing (the extremes always are); the
    /// statistics always use every value.
    pub max_outliers: usize,
}

impl Default for ChannelwiseOptions {
    fn default() -> Self {
        ChannelwiseOptions {
            nodes: Vec::new(),
            axis: None,
            data_num: None,
            max_outliers: BoxStats::DEFAULT_MAX_OUTLIERS,
        }
    }
}

/// Errors of the analysis and of writing its files.
#[derive(Debug, thiserror::Error)]
pub enum ChannelwiseError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("nodes_list is empty: give weight or activation calibration nodes")]
    NoNodes,
    #[error("{}", describe_not_calibration(.0))]
    NotCalibration(Vec<(String, Vec<String>)>),
    #[error("axis {axis} is out of range for '{node}', whose input has shape {shape:?}")]
    AxisOutOfRange {
        node: String,
        axis: i64,
        shape: Vec<usize>,
    },
    #[error("the input of '{node}' is {dtype}: only numeric values can be plotted")]
    NotNumeric { node: String, dtype: String },
    #[error("'{node}': {message}")]
    Stats { node: String, message: String },
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

impl ChannelwiseError {
    /// True for mistakes in the arguments.
    pub fn is_usage(&self) -> bool {
        match self {
            ChannelwiseError::Engine(e) => e.is_usage(),
            ChannelwiseError::NoNodes
            | ChannelwiseError::NotCalibration(_)
            | ChannelwiseError::AxisOutOfRange { .. } => true,
            _ => false,
        }
    }
}

fn describe_not_calibration(items: &[(String, Vec<String>)]) -> String {
    let parts: Vec<String> = items
        .iter()
        .map(|(name, cals)| {
            if cals.is_empty() {
                format!("'{name}' (a regular node without calibration nodes)")
            } else {
                format!(
                    "'{name}' (a regular node; its input calibration nodes are {})",
                    quote_list(cals).replace(" or ", " and ")
                )
            }
        })
        .collect();
    let noun = if items.len() == 1 {
        "is not a calibration node"
    } else {
        "are not calibration nodes"
    };
    format!("{} {noun}", parts.join(", "))
}

/// The statistics of one channel.
#[derive(Clone, Debug, Serialize)]
pub struct ChannelStats {
    pub channel: usize,
    /// Finite values.
    pub count: usize,
    #[serde(serialize_with = "json::number")]
    pub min: f64,
    #[serde(serialize_with = "json::number")]
    pub q1: f64,
    #[serde(serialize_with = "json::number")]
    pub median: f64,
    #[serde(serialize_with = "json::number")]
    pub mean: f64,
    #[serde(serialize_with = "json::number")]
    pub q3: f64,
    #[serde(serialize_with = "json::number")]
    pub max: f64,
    #[serde(serialize_with = "json::number")]
    pub max_abs: f64,
    #[serde(serialize_with = "json::number")]
    pub whisker_low: f64,
    #[serde(serialize_with = "json::number")]
    pub whisker_high: f64,
    /// How many values lie beyond the whiskers.
    pub outliers_total: usize,
    /// A sample of them (the extremes always), ascending.
    pub outliers: Vec<f64>,
    pub non_finite: usize,
}

impl ChannelStats {
    fn from_box(channel: usize, b: BoxStats) -> ChannelStats {
        ChannelStats {
            channel,
            count: b.count,
            min: b.min,
            q1: b.q1,
            median: b.median,
            mean: b.mean,
            q3: b.q3,
            max: b.max,
            max_abs: b.min.abs().max(b.max.abs()),
            whisker_low: b.whisker_low,
            whisker_high: b.whisker_high,
            outliers_total: b.outliers_total,
            outliers: b.outliers,
            non_finite: b.non_finite,
        }
    }

    fn to_box(&self) -> BoxStats {
        BoxStats {
            count: self.count,
            min: self.min,
            max: self.max,
            whisker_low: self.whisker_low,
            q1: self.q1,
            median: self.median,
            mean: self.mean,
            q3: self.q3,
            whisker_high: self.whisker_high,
            outliers: self.outliers.clone(),
            outliers_total: self.outliers_total,
            non_finite: self.non_finite,
        }
    }
}

/// Weight or activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChannelwiseKind {
    Weight,
    Activation,
}

/// One calibration node's channels.
#[derive(Clone, Debug, Serialize)]
pub struct ChannelwiseItem {
    pub node: String,
    pub kind: ChannelwiseKind,
    /// The tensor summarised (the node's input).
    pub tensor: String,
    /// Its shape in one sample (the first).
    pub shape: Vec<usize>,
    /// The samples pooled (1 for a weight).
    pub samples: usize,
    /// The channel axis used (non-negative).
    pub axis: usize,
    /// File name without extension (`<node>_boxplot`).
    pub file_stem: String,
    pub channels: Vec<ChannelStats>,
}

/// The result of [`get_channelwise_data_distribution`], in the order of the nodes.
#[derive(Clone, Debug, Serialize)]
pub struct ChannelwiseDistributions {
    /// The samples looked at for activations (`data_num`).
    pub samples: usize,
    pub items: Vec<ChannelwiseItem>,
}

/// Per-channel statistics of each node's input.
pub fn get_channelwise_data_distribution(
    engine: &Engine,
    options: &ChannelwiseOptions,
) -> Result<ChannelwiseDistributions, ChannelwiseError> {
    if options.nodes.is_empty() {
        return Err(ChannelwiseError::NoNodes);
    }
    let refs = engine.lookup_all(&options.nodes)?;
    let mut not_calibration = Vec::new();
    let mut targets = Vec::new();
    for (name, r) in options.nodes.iter().zip(refs) {
        match r {
            NodeRef::Calibration { id, index } => targets.push((name, id, index)),
            NodeRef::Regular(id) => not_calibration.push((
                name.clone(),
                engine
                    .input_calibrations(id)
                    .into_iter()
                    .map(|c| engine.plan().calibrations()[c].name.clone())
                    .collect(),
            )),
        }
    }
    if !not_calibration.is_empty() {
        return Err(ChannelwiseError::NotCalibration(not_calibration));
    }
    let model = engine.model();
    let is_weight = |id| {
        model
            .calibration(id)
            .is_some_and(|c| c.tensor_type() == TensorType::Weight)
    };
    // Constant inputs (weights) need no data: the data is only read when some input
    // is computed.
    let plan = engine.plan();
    let needs_run = targets
        .iter()
        .any(|(_, _, index)| plan.constant(plan.calibrations()[*index].input).is_none());
    let samples = if needs_run {
        engine.sample_count(options.data_num)?
    } else {
        1
    };
    // Per target: the first sample's shape, the channel axis, and each channel's values
    // over the samples.
    let mut gathered: Vec<(Vec<usize>, usize, Vec<Vec<f32>>)> = Vec::new();
    for sample in 0..samples {
        let float = if needs_run {
            engine.capture(sample, Base::Float)?
        } else {
            Default::default()
        };
        for (k, (name, id, index)) in targets.iter().enumerate() {
            let cal = &plan.calibrations()[*index];
            if sample > 0 && plan.constant(cal.input).is_some() {
                continue;
            }
            let input = engine.captured_value(&float, Base::Float, cal.input)?;
            let shape = input.shape().to_vec();
            let values = to_f32(&input).ok_or_else(|| ChannelwiseError::NotNumeric {
                node: (*name).clone(),
                dtype: input.dtype().to_string(),
            })?;
            if sample == 0 {
                let default_axis = if is_weight(*id) {
                    model.calibration(*id).and_then(|c| c.axis()).unwrap_or(0)
                } else {
                    1
                };
                let requested = options.axis.unwrap_or(default_axis);
                let rank = shape.len() as i64;
                let axis = if requested < 0 {
                    requested + rank
                } else {
                    requested
                };
                if axis < 0 || axis >= rank {
                    return Err(ChannelwiseError::AxisOutOfRange {
                        node: (*name).clone(),
                        axis: requested,
                        shape,
                    });
                }
                let channels = shape[axis as usize];
                gathered.push((shape.clone(), axis as usize, vec![Vec::new(); channels]));
            }
            let (first, axis, per_channel) = &mut gathered[k];
            if shape.len() != first.len() || shape[*axis] != first[*axis] {
                return Err(ChannelwiseError::Stats {
                    node: (*name).clone(),
                    message: format!(
                        "sample {sample} gives shape {shape:?}, whose channels on axis {axis} differ from the first sample's {first:?}"
                    ),
                });
            }
            // The tensor as [outer, channels, inner]: channel c's values are the
            // inner-sized runs at c of every outer block.
            let channels = shape[*axis];
            let inner: usize = shape[*axis + 1..].iter().product();
            for (i, run) in values.chunks(inner.max(1)).enumerate() {
                if inner > 0 {
                    per_channel[i % channels].extend_from_slice(run);
                }
            }
        }
    }
    let mut items = Vec::new();
    for ((name, id, index), (shape, axis, per_channel)) in targets.into_iter().zip(gathered) {
        let cal = &plan.calibrations()[index];
        let weight = is_weight(id);
        let channels = per_channel
            .iter()
            .enumerate()
            .map(|(c, values)| {
                BoxStats::from_values(values, options.max_outliers)
                    .map(|b| ChannelStats::from_box(c, b))
                    .map_err(|e| ChannelwiseError::Stats {
                        node: name.clone(),
                        message: e.to_string(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        items.push(ChannelwiseItem {
            node: name.clone(),
            kind: if weight {
                ChannelwiseKind::Weight
            } else {
                ChannelwiseKind::Activation
            },
            tensor: engine.value_name(cal.input).to_string(),
            file_stem: format!("{}_boxplot", file_safe(name)),
            samples: if plan.constant(cal.input).is_some() {
                1
            } else {
                samples
            },
            shape,
            axis,
            channels,
        });
    }
    Ok(ChannelwiseDistributions { samples, items })
}

/// The box plot of an item, as drawn by [`write_channelwise`].
pub fn item_spec(item: &ChannelwiseItem) -> BoxPlot {
    let what = match item.kind {
        ChannelwiseKind::Weight => "float weight".to_string(),
        ChannelwiseKind::Activation => format!(
            "float input over {}",
            crate::distribution::samples_text(item.samples)
        ),
    };
    let title = format!(
        "Per-channel distribution of the {what} of {} (shape {:?}, axis {}, {} channels)",
        item.node,
        item.shape,
        item.axis,
        item.channels.len()
    );
    BoxPlot {
        figure: Figure::new(title, "channel", "value"),
        boxes: item.channels.iter().map(ChannelStats::to_box).collect(),
        labels: None,
    }
}

/// The CSV of an item: a header and one row per channel.
pub fn item_csv(item: &ChannelwiseItem) -> String {
    let mut csv = String::from("channel,count,min,q1,median,mean,q3,max,max_abs\n");
    for c in &item.channels {
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{}",
            c.channel, c.count, c.min, c.q1, c.median, c.mean, c.q3, c.max, c.max_abs
        );
    }
    csv
}

/// Writes `<node>_boxplot.<ext>` and `<node>_channel_stats.csv` per item into `dir`
/// (created if missing) and returns the paths, in order. Each file is written to a
/// temporary name and renamed.
pub fn write_channelwise(
    result: &ChannelwiseDistributions,
    dir: &Path,
    format: Format,
) -> Result<Vec<PathBuf>, ChannelwiseError> {
    std::fs::create_dir_all(dir).map_err(|source| ChannelwiseError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut written = Vec::new();
    for item in &result.items {
        let image = dir.join(format!("{}.{}", item.file_stem, format.extension()));
        hmct_plot::box_plot(&item_spec(item), &image, format)?;
        written.push(image);
        let csv = dir.join(format!("{}_channel_stats.csv", file_safe(&item.node)));
        hmct_ir::write_atomic(&csv, item_csv(item).as_bytes()).map_err(|source| {
            ChannelwiseError::Write {
                path: csv.clone(),
                source: Box::new(source),
            }
        })?;
        written.push(csv);
    }
    Ok(written)
}
