//! `mixed-precision`: the smallest prefix of the sensitivity ranking whose promotion
//! to a higher precision brings the output metric to a target.
//!
//! The quantized regular nodes are ranked by [`get_sensitivity_of_nodes`] (worst
//! first, on `metric`, on the model outputs or `output_nodes`). Step k is the
//! calibrated model with the first k ranked nodes promoted, each step measured on
//! the real outputs: sensitivities are not assumed to add. Steps are evaluated a
//! batch at a time from the calibrated model's cached activations; the search stops
//! at the first step that meets the target, or when the budget or the candidates
//! run out, in which case the best step found is reported and the target is said to
//! be unmet.
//!
//! Promoting a node means what Horizon's `node_config: {"<node>": {"qtype": ...}}`
//! and [`hmct_ir::Edit::NodesQType`] mean: its *activation* input calibration nodes
//! get the new qtype (same thresholds). The candidates' calibration nodes are
//! resolved with [`hmct_ir::resolve`] on exactly that edit, so the probes, the
//! written model and the written quant_config agree by construction. A calibration
//! node OFF in the file stays OFF (a qtype edit does not switch it on).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use hmct_ir::{Edit, Model, QType};
use hmct_metrics::Metric;
use hmct_plot::{Baseline, Figure, Format, LineChart, LineSeries, Marker, Rgb};
use hmct_quant::{Base, Override};
use serde::Serialize;

use crate::engine::{Engine, EngineError, NodeRef, Probe, Timings};
use crate::json;
use crate::sensitivity::{
    NodeType, Sensitivity, SensitivityError, SensitivityOptions, get_sensitivity_of_nodes,
};
use crate::sensitivity_analysis::DequantQType;

/// The precision promoted nodes get (`--qtype`): the same type as
/// sensitivity-analysis' de-quantization.
pub type PromoteQType = DequantQType;

/// Steps evaluated per engine call. Several steps share the captured calibrated
/// activations and keep both cores busy; a small batch wastes little work past the
/// step that reaches the target.
pub const DEFAULT_BATCH: usize = 8;

/// Errors of the search and of writing its files.
#[derive(Debug, thiserror::Error)]
pub enum MixedPrecisionError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Ranking(#[from] SensitivityError),
    #[error("target {target} is not a reachable {metric} value ({why})")]
    BadTarget {
        target: f64,
        metric: Metric,
        why: &'static str,
    },
    #[error("budget must be at least 1 node")]
    ZeroBudget,
    #[error("the ranking given does not fit this search: {0}")]
    RankingMismatch(String),
    #[error("cannot set '{node}' to {qtype}: {message}")]
    QType {
        node: String,
        qtype: PromoteQType,
        message: String,
    },
    #[error("cannot build the promoted model")]
    Edit(#[from] hmct_ir::EditError),
    #[error("{}: {message}", path.display())]
    Write { path: PathBuf, message: String },
}

impl MixedPrecisionError {
    /// True for mistakes in the arguments (as opposed to failures while running or
    /// writing).
    pub fn is_usage(&self) -> bool {
        match self {
            MixedPrecisionError::Engine(e) => e.is_usage(),
            MixedPrecisionError::Ranking(e) => e.is_usage(),
            MixedPrecisionError::BadTarget { .. }
            | MixedPrecisionError::ZeroBudget
            | MixedPrecisionError::RankingMismatch(_) => true,
            MixedPrecisionError::QType { .. }
            | MixedPrecisionError::Edit(_)
            | MixedPrecisionError::Write { .. } => false,
        }
    }
}

/// The arguments of [`mixed_precision`].
#[derive(Clone, Debug)]
pub struct MixedPrecisionOptions {
    /// The value of `metric` to reach (at least it for cosine/sqnr, at most it for
    /// the distances).
    pub target: f64,
    pub metric: Metric,
    /// Measure on these regular nodes' outputs instead of the model outputs.
    pub output_nodes: Vec<String>,
    pub qtype: PromoteQType,
    /// At most this many promoted nodes (all candidates when `None`).
    pub budget: Option<usize>,
    /// Use the first `data_num` samples (all when `None`).
    pub data_num: Option<usize>,
    /// Steps per engine call (at least 1).
    pub batch: usize,
    /// The ranking step's result, computed beforehand (e.g. merged from shards,
    /// see [`crate::shard`]): node sensitivity of this model and data on `metric`,
    /// `output_nodes` and the same samples. `None`: ranked here.
    pub ranking: Option<Sensitivity>,
}

impl Default for MixedPrecisionOptions {
    fn default() -> Self {
        MixedPrecisionOptions {
            target: 0.999,
            metric: Metric::CosineSimilarity,
            output_nodes: Vec::new(),
            qtype: PromoteQType::Int16,
            budget: None,
            data_num: None,
            batch: DEFAULT_BATCH,
            ranking: None,
        }
    }
}

/// One point of the curve: the calibrated model with the first `promoted` ranked
/// nodes promoted.
#[derive(Clone, Debug, Serialize)]
pub struct Step {
    pub promoted: usize,
    /// The node added at this step (`None` at step 0, the calibrated model).
    pub node: Option<String>,
    /// Its sensitivity from the ranking.
    #[serde(serialize_with = "json::opt_number")]
    pub sensitivity: Option<f64>,
    /// The calibration nodes this step changed (empty when an earlier node shared
    /// them all).
    pub calibrations: Vec<String>,
    /// The metric of the outputs against the float model.
    #[serde(serialize_with = "json::number")]
    pub value: f64,
}

/// The search result.
#[derive(Clone, Debug, Serialize)]
pub struct MixedPrecision {
    pub metric: Metric,
    #[serde(serialize_with = "json::number")]
    pub target: f64,
    pub qtype: PromoteQType,
    pub budget: Option<usize>,
    /// Number of samples used (the first ones).
    pub data_num: usize,
    /// The values compared.
    pub compared: Vec<String>,
    /// Ranked nodes with something to promote.
    pub candidates: usize,
    /// Evaluated steps, from 0 (the calibrated model) on.
    pub curve: Vec<Step>,
    /// Whether `curve[chosen]` meets the target.
    pub reached: bool,
    /// The step chosen: the first meeting the target, else the best one found
    /// (fewest nodes among equals).
    pub chosen: usize,
    #[serde(skip)]
    pub timings: Timings,
}

impl MixedPrecision {
    /// The metric of the chosen step.
    pub fn final_value(&self) -> f64 {
        self.curve[self.chosen].value
    }

    /// The calibrated model's metric (step 0).
    pub fn calibrated_value(&self) -> f64 {
        self.curve[0].value
    }

    /// The promoted nodes of the chosen step, in rank order.
    pub fn promoted_nodes(&self) -> Vec<&str> {
        self.curve[1..=self.chosen]
            .iter()
            .filter_map(|s| s.node.as_deref())
            .collect()
    }

    /// The qtype the promoted nodes get.
    pub fn ir_qtype(&self) -> QType {
        ir_qtype(self.qtype)
    }

    /// The edit that turns the calibrated model into the chosen one.
    pub fn edit(&self) -> Edit {
        Edit::NodesQType {
            nodes: self
                .promoted_nodes()
                .into_iter()
                .map(str::to_string)
                .collect(),
            qtype: self.ir_qtype(),
        }
    }

    /// Horizon's quant_config for the chosen step: `node_config` entries only.
    pub fn quant_config(&self) -> serde_json::Value {
        let entries: serde_json::Map<String, serde_json::Value> = self
            .promoted_nodes()
            .into_iter()
            .map(|n| {
                (
                    n.to_string(),
                    serde_json::json!({"qtype": self.qtype.name()}),
                )
            })
            .collect();
        serde_json::json!({ "node_config": entries })
    }

    /// The curve: metric against the number of promoted nodes, the target dashed.
    pub fn chart(&self) -> LineChart {
        let title = if self.reached {
            format!(
                "Mixed precision: target reached with {} node(s) at {}",
                self.chosen, self.qtype
            )
        } else {
            format!(
                "Mixed precision: target NOT reached (best: {} node(s) at {})",
                self.chosen, self.qtype
            )
        };
        LineChart {
            figure: Figure::new(
                title,
                format!(
                    "promoted nodes, in sensitivity order (samples: {})",
                    self.data_num
                ),
                format!("{} of outputs vs float", self.metric.name()),
            ),
            x_labels: self.curve.iter().map(|s| s.promoted.to_string()).collect(),
            series: vec![
                LineSeries::new(
                    format!("calibrated, first k nodes {}", self.qtype),
                    self.curve.iter().map(|s| s.value).collect(),
                )
                .color(Rgb::RED)
                .marker(Marker::Circle),
            ],
            baseline: Some(Baseline::new(self.target, "target")),
        }
    }
}

/// Progress of [`mixed_precision`]: which stage, done, total.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Ranking the nodes (probes done, probes).
    Ranking,
    /// Steps evaluated, steps at most.
    Search,
}

pub(crate) fn ir_qtype(q: PromoteQType) -> QType {
    match q {
        PromoteQType::Int16 => QType::INT16,
        PromoteQType::Float32 => QType::Float32,
    }
}

/// Whether `value` meets `target` on `metric`'s scale; NaN never does.
pub fn meets(metric: Metric, value: f64, target: f64) -> bool {
    if metric.worse_is_lower() {
        value >= target
    } else {
        value <= target
    }
}

/// Whether `a` is strictly better than `b`; NaN is worse than anything.
fn better(metric: Metric, a: f64, b: f64) -> bool {
    if a.is_nan() {
        return false;
    }
    if b.is_nan() {
        return true;
    }
    if metric.worse_is_lower() {
        a > b
    } else {
        a < b
    }
}

fn check_target(metric: Metric, target: f64) -> Result<(), MixedPrecisionError> {
    let bad = |why| {
        Err(MixedPrecisionError::BadTarget {
            target,
            metric,
            why,
        })
    };
    if target.is_nan() {
        return bad("not a number");
    }
    match metric {
        Metric::CosineSimilarity if target > 1.0 => bad("cosine similarity is at most 1"),
        Metric::Sqnr if target == f64::INFINITY => bad("only an exact model has infinite sqnr"),
        Metric::Mse | Metric::Mre | Metric::Chebyshev if target < 0.0 => {
            bad("a distance is never negative")
        }
        _ => Ok(()),
    }
}

/// Refuses a given ranking that is not the one this search would compute (apart
/// from excluded samples, a choice left to the user).
fn check_ranking(
    engine: &Engine,
    options: &MixedPrecisionOptions,
    samples: usize,
    ranking: &Sensitivity,
) -> Result<(), MixedPrecisionError> {
    let bad = |why: String| Err(MixedPrecisionError::RankingMismatch(why));
    let o = &ranking.options;
    if let Some(part) = &ranking.shard {
        return bad(format!(
            "it is shard {} only; merge the parts first",
            part.shard
        ));
    }
    if o.node_type != NodeType::Node || o.interested_nodes.is_some() {
        return bad(
            "it does not rank every quantized regular node (node type node, no interested nodes)"
                .into(),
        );
    }
    if o.metrics.first() != Some(&options.metric) {
        return bad(format!(
            "it is ranked on {:?}, the search on {}",
            o.metrics, options.metric
        ));
    }
    if o.output_nodes != options.output_nodes {
        return bad(format!(
            "it compares on {:?}, the search on {:?}",
            o.output_nodes, options.output_nodes
        ));
    }
    if o.data_num != samples {
        return bad(format!(
            "it uses {} sample(s), the search {samples}",
            o.data_num
        ));
    }
    let here = crate::shard::Provenance::of(engine, samples)?;
    if here.model_digest != ranking.model_digest {
        return bad("it was computed on another model".into());
    }
    if here.data_digest != ranking.data_digest {
        return bad("it was computed on other data".into());
    }
    Ok(())
}

/// One ranked candidate and the calibration nodes (plan indices) it promotes.
pub(crate) struct Candidate {
    pub name: String,
    pub sensitivity: f64,
    pub calibrations: Vec<usize>,
}

/// The ranked candidates and the cumulative settings of every step of a search.
pub(crate) struct Steps {
    pub samples: usize,
    pub compared: Vec<hmct_quant::Slot>,
    pub candidates: Vec<Candidate>,
    /// Steps after step 0 the budget allows.
    pub max_steps: usize,
    /// `step_overrides[k]`: the settings of step k (the first k candidates promoted).
    pub step_overrides: Vec<Vec<(usize, Override)>>,
    /// `step_changed[k]`: the calibration nodes step k adds.
    pub step_changed: Vec<Vec<usize>>,
    /// `own_overrides[k]`: the settings of candidate k alone (all its calibration
    /// nodes, shared ones included).
    pub own_overrides: Vec<Vec<(usize, Override)>>,
    pub timings: Timings,
}

/// Ranks the quantized regular nodes and builds the steps of a search (the budget,
/// output nodes, qtype and data_num of `options`; not the target).
pub(crate) fn prepare_steps(
    engine: &Engine,
    options: &MixedPrecisionOptions,
    progress: &(dyn Fn(Stage, usize, usize) + Sync),
) -> Result<Steps, MixedPrecisionError> {
    if options.budget == Some(0) {
        return Err(MixedPrecisionError::ZeroBudget);
    }
    let samples = engine.sample_count(options.data_num)?;
    let ranking = match &options.ranking {
        Some(given) => {
            check_ranking(engine, options, samples, given)?;
            given.clone()
        }
        None => get_sensitivity_of_nodes(
            engine,
            &SensitivityOptions {
                metrics: vec![options.metric],
                output_nodes: options.output_nodes.clone(),
                data_num: Some(samples),
                ..SensitivityOptions::default()
            },
            &|done, total| progress(Stage::Ranking, done, total),
        )?,
    };
    // The ranking has checked the output nodes: each is a quantized regular node.
    let compared = if options.output_nodes.is_empty() {
        engine.model_output_slots()
    } else {
        let mut slots = Vec::new();
        for r in engine.lookup_all(&options.output_nodes)? {
            if let NodeRef::Regular(id) = r {
                for s in engine.output_slots(id) {
                    if !slots.contains(&s) {
                        slots.push(s);
                    }
                }
            }
        }
        slots
    };

    let target_qtype = ir_qtype(options.qtype);
    let model = engine.model();
    let mut candidates = Vec::new();
    for entry in ranking.entries {
        let edit = Edit::NodesQType {
            nodes: vec![entry.name.clone()],
            qtype: target_qtype.clone(),
        };
        // A node without activation inputs has nothing a node_config qtype changes.
        let Ok(ids) = hmct_ir::resolve(model, &edit) else {
            continue;
        };
        let calibrations: Vec<usize> = ids
            .into_iter()
            .filter_map(|id| engine.calibration_index(id))
            .filter(|&c| {
                let pc = &engine.plan().calibrations()[c];
                let cal = model.calibration(pc.graph_index);
                pc.file.switch_on && cal.is_some_and(|cal| cal.qtype() != target_qtype)
            })
            .collect();
        if calibrations.is_empty() {
            continue;
        }
        candidates.push(Candidate {
            name: entry.name,
            sensitivity: entry.values.0[0].1,
            calibrations,
        });
    }

    let max_steps = options
        .budget
        .map_or(candidates.len(), |b| b.min(candidates.len()));
    // overrides[k] = the setting list of step k (cumulative).
    let mut step_overrides: Vec<Vec<(usize, Override)>> = vec![Vec::new()];
    let mut step_changed: Vec<Vec<usize>> = vec![Vec::new()];
    let mut seen: HashSet<usize> = HashSet::new();
    let mut own_overrides: Vec<Vec<(usize, Override)>> = Vec::new();
    for cand in &candidates[..max_steps] {
        let mut overrides = step_overrides.last().cloned().unwrap_or_default();
        let mut changed = Vec::new();
        let mut own = Vec::new();
        for &c in &cand.calibrations {
            let pc = &engine.plan().calibrations()[c];
            let setting = model
                .calibration(pc.graph_index)
                .ok_or_else(|| format!("'{}' is not a calibration node", pc.name))
                .and_then(|cal| hmct_quant::fake_quant_for(model, &cal, Some(&target_qtype)))
                .map_err(|message| MixedPrecisionError::QType {
                    node: cand.name.clone(),
                    qtype: options.qtype,
                    message,
                })?;
            own.push((c, Override::Set(setting.clone())));
            if seen.insert(c) {
                overrides.push((c, Override::Set(setting)));
                changed.push(c);
            }
        }
        step_overrides.push(overrides);
        step_changed.push(changed);
        own_overrides.push(own);
    }

    Ok(Steps {
        samples,
        compared,
        candidates,
        max_steps,
        step_overrides,
        step_changed,
        own_overrides,
        timings: ranking.timings,
    })
}

/// Runs the search. `progress` gets (stage, done, total).
pub fn mixed_precision(
    engine: &Engine,
    options: &MixedPrecisionOptions,
    progress: &(dyn Fn(Stage, usize, usize) + Sync),
) -> Result<MixedPrecision, MixedPrecisionError> {
    check_target(options.metric, options.target)?;
    let Steps {
        samples,
        compared,
        candidates,
        max_steps,
        step_overrides,
        step_changed,
        timings: ranking_timings,
        ..
    } = prepare_steps(engine, options, progress)?;

    let batch = options.batch.max(1);
    let total_steps = max_steps + 1;
    let mut values: Vec<f64> = Vec::new();
    let mut timings = ranking_timings;
    let mut reached_at = None;
    while values.len() < total_steps && reached_at.is_none() {
        let start = values.len();
        let end = (start + batch).min(total_steps);
        let probes: Vec<Probe> = step_overrides[start..end]
            .iter()
            .map(|o| Probe {
                base: Base::Calibrated,
                overrides: o.clone(),
            })
            .collect();
        let results = engine.probe_scores(&probes, &compared, samples, &|_, _| {})?;
        timings.add(&results.timings);
        for per_sample in &results.values {
            let per_output: Vec<Vec<f64>> = (0..compared.len())
                .map(|o| {
                    per_sample
                        .iter()
                        .map(|s| s[o][options.metric.index()])
                        .collect()
                })
                .collect();
            let v = hmct_metrics::aggregate(&per_output);
            if reached_at.is_none() && meets(options.metric, v, options.target) {
                reached_at = Some(values.len());
            }
            values.push(v);
        }
        progress(Stage::Search, values.len(), total_steps);
    }
    // Steps past the first one reaching the target were computed with it in the
    // same batch; they are not part of the answer.
    if let Some(k) = reached_at {
        values.truncate(k + 1);
    }
    let chosen = match reached_at {
        Some(k) => k,
        None => (1..values.len()).fold(0, |best, k| {
            if better(options.metric, values[k], values[best]) {
                k
            } else {
                best
            }
        }),
    };
    let plan = engine.plan();
    let curve = values
        .iter()
        .enumerate()
        .map(|(k, &value)| Step {
            promoted: k,
            node: (k > 0).then(|| candidates[k - 1].name.clone()),
            sensitivity: (k > 0).then(|| candidates[k - 1].sensitivity),
            calibrations: step_changed[k]
                .iter()
                .map(|&c| plan.calibrations()[c].name.clone())
                .collect(),
            value,
        })
        .collect();
    Ok(MixedPrecision {
        metric: options.metric,
        target: options.target,
        qtype: options.qtype,
        budget: options.budget,
        data_num: samples,
        compared: compared
            .iter()
            .map(|&s| engine.value_name(s).to_string())
            .collect(),
        candidates: candidates.len(),
        curve,
        reached: reached_at.is_some(),
        chosen,
        timings,
    })
}

/// `model` (the calibrated model searched) with the chosen step's nodes promoted.
pub fn promoted_model(
    model: &Model,
    result: &MixedPrecision,
) -> Result<Model, MixedPrecisionError> {
    let mut out = model.clone();
    if result.chosen > 0 {
        hmct_ir::apply_edits(&mut out, &[result.edit()])?;
    }
    Ok(out)
}

/// The file names [`write_mixed_precision`] writes.
pub const MODEL_NAME: &str = "mixed_precision_model.onnx";
pub const QUANT_CONFIG_NAME: &str = "quant_config.json";
pub const PNG_NAME: &str = "mixed_precision.png";
pub const JSON_NAME: &str = "mixed_precision.json";

/// Writes into `dir` (created if missing) the curve (`mixed_precision.png`), the
/// result (`mixed_precision.json`) and, only when the target was reached, the
/// promoted model and its `quant_config.json`: a model that misses the target is
/// not offered as an answer. Returns the paths written. Each file goes to a
/// temporary name and is renamed into place; on a failure the files already placed
/// are removed, so the folder never holds part of a result.
pub fn write_mixed_precision(
    model: &Model,
    result: &MixedPrecision,
    dir: &Path,
) -> Result<Vec<PathBuf>, MixedPrecisionError> {
    let write_err = |path: &Path, message: String| MixedPrecisionError::Write {
        path: path.to_path_buf(),
        message,
    };
    // Everything that can fail without touching the disk comes first.
    let promoted = if result.reached {
        Some(promoted_model(model, result)?)
    } else {
        None
    };
    let json_path = dir.join(JSON_NAME);
    let json = json::pretty(result).map_err(|e| write_err(&json_path, e.to_string()))?;
    let config_path = dir.join(QUANT_CONFIG_NAME);
    let config =
        json::pretty(&result.quant_config()).map_err(|e| write_err(&config_path, e.to_string()))?;
    std::fs::create_dir_all(dir)
        .map_err(|e| write_err(dir, format!("cannot create folder: {e}")))?;

    let mut placed: Vec<PathBuf> = Vec::new();
    let undo = |placed: &[PathBuf]| {
        for p in placed {
            let _ = std::fs::remove_file(p);
        }
    };
    let png = dir.join(PNG_NAME);
    let png_tmp = dir.join(format!(".{PNG_NAME}.tmp"));
    let drawn = hmct_plot::line_chart(&result.chart(), &png_tmp, Format::Png)
        .map_err(|e| hmct_ir::error_chain(&e))
        .and_then(|_| std::fs::rename(&png_tmp, &png).map_err(|e| e.to_string()));
    if let Err(message) = drawn {
        let _ = std::fs::remove_file(&png_tmp);
        return Err(write_err(&png, message));
    }
    placed.push(png);
    if let Err(e) = hmct_ir::write_atomic(&json_path, &json) {
        undo(&placed);
        return Err(write_err(&json_path, e.to_string()));
    }
    placed.push(json_path);
    if let Some(promoted) = promoted {
        let model_path = dir.join(MODEL_NAME);
        if let Err(e) = hmct_ir::save_model(&promoted, &model_path) {
            undo(&placed);
            return Err(write_err(&model_path, e.to_string()));
        }
        placed.push(model_path);
        if let Err(e) = hmct_ir::write_atomic(&config_path, &config) {
            undo(&placed);
            return Err(write_err(&config_path, e.to_string()));
        }
        placed.push(config_path);
    }
    Ok(placed)
}
