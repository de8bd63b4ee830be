//! `runall`: the debugging workflow of the seeds in one call (DEBUGGER.md §8).
//!
//! First the health checks ([`crate::health`]) into `health.json`. Then, with the
//! defaults: (1) weight and (2) activation sensitivity, written as
//! `node_sensitivity/sensitivity_of_<type>.log` (and `.json`); (3) the distributions
//! of the top 5 calibration nodes of each (`data_distribution/`); (4) their per-channel
//! box plots (`channelwise_distribution/`); (5) the weight-only and activation-only
//! accumulated-error curves (`accumulate_error/`); (6) the sensitivity analysis of the
//! sensitive regular nodes (`sensitivity_analysis/`); at the end the HTML page of
//! [`crate::report`] (`report.html`) over all of it. Every option of the sub-steps
//! can be set; with `node_type = node` the top 5 regular nodes are mapped to their
//! input calibration nodes for steps 3 and 4.
//!
//! All steps share one [`Engine`], so the float activations captured for the first
//! ranking serve every later probe. The result folder is built in a hidden staging
//! folder inside `save_dir` and moved into place at the end: a failed run leaves the
//! previous result untouched, and a re-run replaces exactly the documented entries
//! (the five sub-folders, `health.json`, `summary.json` and `report.html`), nothing
//! else in `save_dir`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use hmct_metrics::Metric;
use hmct_plot::Format;
use serde::Serialize;

use crate::acc_error::{
    ACTIVATION, AccError, AccErrorOptions, NodeList, WEIGHT, plot_acc_error, write_acc_error,
};
use crate::channelwise::{
    ChannelwiseError, ChannelwiseOptions, get_channelwise_data_distribution, write_channelwise,
};
use crate::distribution::{
    DistributionError, DistributionOptions, plot_distribution, write_distribution,
};
use crate::engine::{Engine, EngineError};
use crate::health::{HealthError, HealthReport, check_all};
use crate::layout::{
    ACC_ERROR_DIR, ANALYSIS_DIR, CHANNELWISE_DIR, DISTRIBUTION_DIR, ENTRIES, HEALTH_NAME,
    HealthCounts, REPORT_NAME, RunallSummary, SUMMARY_NAME, StepRecord, TopEntry, TopList,
    sensitivity_file,
};
use crate::report::{ReportError, render_report};
use crate::sensitivity::{
    NodeType, SensitivityError, SensitivityOptions, get_sensitivity_of_nodes,
};
use crate::sensitivity_analysis::{
    AnalysisError, DequantQType, SensitivityAnalysisOptions, sensitivity_analysis,
    write_partial_quantization,
};

/// How many of the most sensitive candidates steps 3 and 4 look at.
pub const TOP_N: usize = 5;

/// The arguments of [`runall`]; the defaults are the seeds'.
#[derive(Clone, Debug)]
pub struct RunallOptions {
    /// Sensitivity metrics (`-nm`), sorted by the first.
    pub ns_metrics: Vec<Metric>,
    /// Compare sensitivities on these regular nodes' outputs (`-o`).
    pub output_nodes: Vec<String>,
    /// `None`: weight then activation (the default flow); else that one type (`-nt`).
    pub node_type: Option<NodeType>,
    /// Samples for the rankings and the sensitivity analysis (`-dn`; all by default).
    pub data_num: Option<usize>,
    /// Only these sensitivity candidates (`-i`), overriding the node type.
    pub interested_nodes: Option<Vec<Vec<String>>>,
    /// Nodes for the distributions (`-dnl`); default: the top 5 of each ranking.
    pub dis_nodes_list: Option<Vec<String>>,
    /// Calibration nodes for the box plots (`-cn`); default: those of step 3.
    pub cw_nodes_list: Option<Vec<String>>,
    /// Channel axis of the box plots (`-a`).
    pub axis: Option<i64>,
    /// Accumulated error: nodes quantized (`-qn`); default `['weight','activation']`.
    pub quantize_node: Option<NodeList>,
    /// Accumulated error: nodes de-quantized (`-nqn`).
    pub non_quantize_node: Option<NodeList>,
    /// Accumulated-error metric (`-am`).
    pub ae_metric: Metric,
    /// Plot running means (`-avm`).
    pub average_mode: bool,
    /// Sensitivity analysis: pick nodes whose cosine sensitivity is at most this (`-pt`).
    pub pick_threshold: f64,
    /// Sensitivity analysis: these nodes instead of picking (`-sn`).
    pub sensitive_nodes: Vec<String>,
    /// Picture format.
    pub format: Format,
    /// Write `report.html` at the end.
    pub report: bool,
}

impl Default for RunallOptions {
    fn default() -> Self {
        RunallOptions {
            ns_metrics: vec![Metric::CosineSimilarity],
            output_nodes: Vec::new(),
            node_type: None,
            data_num: None,
            interested_nodes: None,
            dis_nodes_list: None,
            cw_nodes_list: None,
            axis: None,
            quantize_node: None,
            non_quantize_node: None,
            ae_metric: Metric::CosineSimilarity,
            average_mode: false,
            pick_threshold: 0.999,
            sensitive_nodes: Vec::new(),
            format: Format::Png,
            report: true,
        }
    }
}

/// Errors of a step, or of the result folder.
#[derive(Debug, thiserror::Error)]
pub enum RunallError {
    #[error("{step}")]
    Sensitivity {
        step: &'static str,
        source: SensitivityError,
    },
    #[error("data distribution")]
    Distribution(#[from] DistributionError),
    #[error("channel-wise distribution")]
    Channelwise(#[from] ChannelwiseError),
    #[error("accumulated error")]
    AccError(#[from] AccError),
    #[error("sensitivity analysis")]
    Analysis(#[from] AnalysisError),
    #[error("health checks")]
    Health(#[from] HealthError),
    #[error("report")]
    Report(#[from] ReportError),
    #[error(transparent)]
    Names(EngineError),
    #[error("{}: {message}", path.display())]
    Write { path: PathBuf, message: String },
}

impl RunallError {
    /// A mistake in the arguments (an unknown name, a bad list) rather than a failure.
    pub fn is_usage(&self) -> bool {
        match self {
            RunallError::Sensitivity { source, .. } => source.is_usage(),
            RunallError::Distribution(e) => e.is_usage(),
            RunallError::Channelwise(e) => e.is_usage(),
            RunallError::AccError(e) => e.is_usage(),
            RunallError::Analysis(e) => e.is_usage(),
            RunallError::Health(HealthError::Engine(e)) => {
                matches!(e, EngineError::DataNum { .. } | EngineError::ZeroDataNum)
            }
            RunallError::Report(_) => false,
            RunallError::Names(_) => true,
            RunallError::Write { .. } => false,
        }
    }
}

/// Progress: (step name, done, total) for the step now running.
pub type Progress<'a> = dyn Fn(&str, usize, usize) + Sync + 'a;

/// Runs the workflow and writes the result folder `save_dir` (created if missing).
/// `command` is recorded in `summary.json`.
pub fn runall(
    engine: &Engine,
    options: &RunallOptions,
    save_dir: &Path,
    command: Option<Vec<String>>,
    progress: &Progress,
) -> Result<RunallSummary, RunallError> {
    let start = Instant::now();
    check_names(engine, options)?;
    std::fs::create_dir_all(save_dir).map_err(|e| RunallError::Write {
        path: save_dir.to_path_buf(),
        message: format!("cannot create folder: {e}"),
    })?;
    let staging = tempfile::Builder::new()
        .prefix(".runall-")
        .tempdir_in(save_dir)
        .map_err(|e| RunallError::Write {
            path: save_dir.to_path_buf(),
            message: format!("cannot write here: {e}"),
        })?;
    let stage = staging.path();
    let mut summary = RunallSummary {
        tool: format!("hmct-debugger {}", env!("CARGO_PKG_VERSION")),
        command,
        model: engine.model().file().to_string(),
        samples: engine.available_samples(),
        steps: Vec::new(),
        top: Vec::new(),
        distribution_nodes: Vec::new(),
        channelwise_nodes: Vec::new(),
        calibrated_metric: None,
        float_metric: None,
        sensitive_nodes: Vec::new(),
        seconds: 0.0,
        health: None,
        report: None,
        health_report: HealthReport::default(),
        rankings: Vec::new(),
        analysis: None,
    };

    // Step 0: health checks. Their float run fills the activation cache the
    // rankings read next, so it costs little extra.
    {
        let step = Instant::now();
        let name = "health checks";
        let health = check_all(engine, options.data_num, &|done, total| {
            progress(name, done, total)
        })?;
        let path = stage.join(HEALTH_NAME);
        write_json(&path, &health)?;
        summary.steps.push(record(name, step, stage, &[path]));
        summary.health = Some(HealthCounts {
            file: HEALTH_NAME.to_string(),
            warnings: health.warnings,
            infos: health.infos,
        });
        summary.health_report = health;
    }

    // Steps 1 and 2: the rankings.
    let node_types: Vec<NodeType> = match (&options.interested_nodes, options.node_type) {
        (Some(_), _) => vec![options.node_type.unwrap_or(NodeType::Node)],
        (None, Some(t)) => vec![t],
        (None, None) => vec![NodeType::Weight, NodeType::Activation],
    };
    let mut focus: Vec<String> = Vec::new();
    for node_type in node_types {
        let step = Instant::now();
        let name = format!("{node_type} sensitivity");
        let ranking = get_sensitivity_of_nodes(
            engine,
            &SensitivityOptions {
                node_type,
                metrics: options.ns_metrics.clone(),
                output_nodes: options.output_nodes.clone(),
                data_num: options.data_num,
                interested_nodes: options.interested_nodes.clone(),
                ..SensitivityOptions::default()
            },
            &|done, total| progress(&name, done, total),
        )
        .map_err(|source| RunallError::Sensitivity {
            step: "node sensitivity",
            source,
        })?;
        let log = stage.join(sensitivity_file(node_type, "log"));
        let json = stage.join(sensitivity_file(node_type, "json"));
        write_file(&log, ranking.table().render().as_bytes())?;
        write_json(&json, &ranking)?;
        summary.steps.push(record(&name, step, stage, &[log, json]));
        for entry in ranking.entries.iter().take(TOP_N) {
            for c in &entry.calibrations {
                if !focus.contains(c) {
                    focus.push(c.clone());
                }
            }
        }
        summary.top.push(TopList {
            node_type,
            entries: ranking
                .entries
                .iter()
                .take(TOP_N)
                .map(|e| TopEntry {
                    name: e.name.clone(),
                    kind: e.kind,
                    values: e.values.clone(),
                })
                .collect(),
        });
        summary.rankings.push(ranking);
    }

    // Step 3: distributions.
    let dis_nodes = options
        .dis_nodes_list
        .clone()
        .unwrap_or_else(|| focus.clone());
    if !dis_nodes.is_empty() {
        let step = Instant::now();
        progress("data distribution", 0, 1);
        let result = plot_distribution(
            engine,
            &DistributionOptions {
                nodes: dis_nodes.clone(),
                data_num: options.data_num,
                ..DistributionOptions::default()
            },
        )?;
        let files = write_distribution(&result, &stage.join(DISTRIBUTION_DIR), options.format)?;
        summary
            .steps
            .push(record("data distribution", step, stage, &files));
    }
    summary.distribution_nodes = dis_nodes;

    // Step 4: box plots of calibration nodes.
    let cw_nodes = match &options.cw_nodes_list {
        Some(list) => list.clone(),
        None => summary
            .distribution_nodes
            .iter()
            .filter(|n| has_channels(engine.model(), n))
            .cloned()
            .collect(),
    };
    if !cw_nodes.is_empty() {
        let step = Instant::now();
        progress("channel-wise distribution", 0, 1);
        let result = get_channelwise_data_distribution(
            engine,
            &ChannelwiseOptions {
                nodes: cw_nodes.clone(),
                axis: options.axis,
                data_num: options.data_num,
                ..ChannelwiseOptions::default()
            },
        )?;
        let files = write_channelwise(&result, &stage.join(CHANNELWISE_DIR), options.format)?;
        summary
            .steps
            .push(record("channel-wise distribution", step, stage, &files));
    }
    summary.channelwise_nodes = cw_nodes;

    // Step 5: accumulated error.
    {
        let step = Instant::now();
        let quantize_node = match (&options.quantize_node, &options.non_quantize_node) {
            (None, None) => Some(NodeList::Flat(vec![WEIGHT.into(), ACTIVATION.into()])),
            (q, _) => q.clone(),
        };
        let curves = plot_acc_error(
            engine,
            &AccErrorOptions {
                quantize_node,
                non_quantize_node: options.non_quantize_node.clone(),
                metric: options.ae_metric,
                average_mode: options.average_mode,
                data_num: None,
            },
            &|done, total| progress("accumulated error", done, total),
        )?;
        let files = write_acc_error(&curves, &stage.join(ACC_ERROR_DIR), options.format)?;
        summary
            .steps
            .push(record("accumulated error", step, stage, &files));
    }

    // Step 6: sensitivity analysis.
    {
        let step = Instant::now();
        let analysis = sensitivity_analysis(
            engine,
            &SensitivityAnalysisOptions {
                pick_threshold: options.pick_threshold,
                data_num: options.data_num,
                sensitive_nodes: options.sensitive_nodes.clone(),
                metric: Metric::CosineSimilarity,
                qtype: DequantQType::Float32,
            },
            &|_, done, total| progress("sensitivity analysis", done, total),
        )?;
        let files = write_partial_quantization(&analysis, &stage.join(ANALYSIS_DIR))?;
        summary
            .steps
            .push(record("sensitivity analysis", step, stage, &files));
        summary.calibrated_metric = Some(analysis.calibrated);
        summary.float_metric = Some(analysis.baseline);
        summary.sensitive_nodes = analysis.nodes.iter().map(|n| n.name.clone()).collect();
        summary.analysis = Some(analysis);
    }

    if options.report {
        summary.report = Some(REPORT_NAME.to_string());
    }
    summary.seconds = start.elapsed().as_secs_f64();
    write_json(&stage.join(SUMMARY_NAME), &summary)?;
    if options.report {
        // Rendered from the staged folder, so the page shows exactly what is published.
        let html = render_report(stage)?;
        write_file(&stage.join(REPORT_NAME), html.as_bytes())?;
    }
    publish(stage, save_dir)?;
    Ok(summary)
}

/// Every node name of the options, checked before anything runs or is written, so a
/// typo in the last step's list does not cost the earlier steps' time.
fn check_names(engine: &Engine, options: &RunallOptions) -> Result<(), RunallError> {
    let mut names: Vec<&str> = Vec::new();
    names.extend(options.output_nodes.iter().map(String::as_str));
    for group in options.interested_nodes.iter().flatten() {
        names.extend(group.iter().map(String::as_str));
    }
    names.extend(options.dis_nodes_list.iter().flatten().map(String::as_str));
    names.extend(options.cw_nodes_list.iter().flatten().map(String::as_str));
    names.extend(options.sensitive_nodes.iter().map(String::as_str));
    for list in [&options.quantize_node, &options.non_quantize_node]
        .into_iter()
        .flatten()
    {
        match list {
            NodeList::Flat(flat) => names.extend(
                flat.iter()
                    .map(String::as_str)
                    .filter(|n| *n != WEIGHT && *n != ACTIVATION),
            ),
            NodeList::Nested(groups) => {
                names.extend(groups.iter().flatten().map(String::as_str));
            }
        }
    }
    names.sort_unstable();
    names.dedup();
    engine
        .lookup_all(&names)
        .map(|_| ())
        .map_err(RunallError::Names)
}

fn record(name: &str, start: Instant, stage: &Path, files: &[PathBuf]) -> StepRecord {
    StepRecord {
        name: name.to_string(),
        seconds: start.elapsed().as_secs_f64(),
        files: files
            .iter()
            .map(|f| {
                f.strip_prefix(stage)
                    .unwrap_or(f)
                    .to_string_lossy()
                    .into_owned()
            })
            .collect(),
    }
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), RunallError> {
    let err = |message: String| RunallError::Write {
        path: path.to_path_buf(),
        message,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| err(format!("cannot create folder: {e}")))?;
    }
    std::fs::write(path, bytes).map_err(|e| err(e.to_string()))
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), RunallError> {
    let json = crate::json::pretty(value).map_err(|e| RunallError::Write {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    write_file(path, &json)
}

/// Moves the staged entries into `save_dir`, replacing the previous run's.
fn publish(stage: &Path, save_dir: &Path) -> Result<(), RunallError> {
    for name in ENTRIES {
        let target = save_dir.join(name);
        let err = |message: String| RunallError::Write {
            path: target.clone(),
            message,
        };
        if target.is_dir() {
            std::fs::remove_dir_all(&target).map_err(|e| err(format!("cannot replace: {e}")))?;
        } else if target.exists() {
            std::fs::remove_file(&target).map_err(|e| err(format!("cannot replace: {e}")))?;
        }
        let staged = stage.join(name);
        if staged.exists() {
            std::fs::rename(&staged, &target).map_err(|e| err(e.to_string()))?;
        }
    }
    Ok(())
}

/// Whether `name` is a calibration node whose input has a channel axis to draw box
/// plots along: not a scalar (QDQ files quantize scalar constants such as a Mul's
/// factor) and not an activation of rank 1 or less.
fn has_channels(model: &hmct_ir::Model, name: &str) -> bool {
    let Some(cal) = model
        .node_id(name)
        .ok()
        .and_then(|id| model.calibration(id))
    else {
        return false;
    };
    if let Ok(Some(weight)) = model.constant_tensor(cal.input()) {
        return !weight.shape().is_empty();
    }
    model
        .value_type(cal.input())
        .and_then(|t| t.shape)
        .is_none_or(|dims| dims.len() > 1)
}
