//! `precision-table`: per quantized regular node, in graph order, how far its
//! outputs are from the float model in two modes, and how the two relate.
//!
//! - **end-to-end**: the calibrated model run from the inputs. The error at a node is
//!   everything accumulated up to and including it.
//! - **per-layer**: the float model with only this node quantized (its input
//!   calibration nodes ON), i.e. the node fed float inputs. The error is what the
//!   node creates by itself. Runs are incremental from the engine's captured float
//!   activations, so each re-runs only the node (and its calibration nodes).
//!
//! Both give cosine similarity and MSE (the tool's definitions, hmct-metrics) per
//! output and sample, aggregated as everywhere else: mean over samples (NaN samples
//! skipped), then mean over the node's outputs.
//!
//! # Amplification
//! The end-to-end error over the per-layer error, computed from the aggregated
//! figures, once on the cosine error `1 − cosine` and once on MSE:
//!
//! `amplification = error_end_to_end / error_per_layer`
//!
//! About 1: the node is where its error comes from (it creates it). Well above 1:
//! the error mostly arrived from upstream and the node passes it on. Below 1: the
//! node attenuates the error it receives. When the per-layer error is zero (a cosine
//! error below [`COSINE_ERROR_FLOOR`], whose f64 rounding noise is far larger than
//! any real difference, counts as zero; MSE must be exactly 0) the amplification is
//! `+inf` if the end-to-end error is not zero (pure pass-on) and undefined (`None`,
//! `-` in the table) if both are zero. A NaN figure makes it undefined as well.
//!
//! `shard` computes the rows of one part of the nodes ([`crate::shard`]; every part
//! runs the calibrated model for its end-to-end figures); [`merge_precision_table`]
//! puts the parts back together.

use hmct_metrics::{Metric, Table, python_repr};
use hmct_quant::{Capture, Config, Override, Slot, Values};
use hmct_tensor::Tensor;
use serde::{Deserialize, Serialize};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use rayon::prelude::*;

use crate::engine::{Engine, EngineError, Timings, compare};
use crate::json;
use crate::shard::{
    MergeError, Part, PartInfo, Provenance, Shard, check_sweep, cone_cost, node_costs, partition,
};

/// Cosine errors `1 − cosine` at or below this count as zero for the amplification.
pub const COSINE_ERROR_FLOOR: f64 = 1e-12;

/// The arguments of [`precision_table`].
#[derive(Clone, Debug)]
pub struct PrecisionTableOptions {
    /// Use the first `data_num` samples (all when `None`). The default is one, as
    /// for the accumulated-error curves, which this table refines.
    pub data_num: Option<usize>,
    /// Only this part of the nodes (see [`crate::shard`]).
    pub shard: Option<Shard>,
}

impl Default for PrecisionTableOptions {
    fn default() -> Self {
        PrecisionTableOptions {
            data_num: Some(1),
            shard: None,
        }
    }
}

/// The options a table was computed with (`data_num` as resolved); parts merge
/// only when these are equal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrecisionOptionsRecord {
    pub data_num: usize,
}

/// Cosine and MSE of one mode.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Errors {
    #[serde(serialize_with = "json::number", deserialize_with = "json::de_number")]
    pub cosine: f64,
    #[serde(serialize_with = "json::number", deserialize_with = "json::de_number")]
    pub mse: f64,
}

/// One row: a quantized regular node.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PrecisionRow {
    /// Position among the quantized nodes (graph order): what a merge of shards
    /// puts back in order.
    pub index: usize,
    pub node: String,
    pub op_type: String,
    /// The outputs compared (non-empty ones), in output order.
    pub outputs: Vec<String>,
    /// The calibration nodes switched ON for the per-layer run.
    pub calibrations: Vec<String>,
    pub end_to_end: Errors,
    pub per_layer: Errors,
    /// `(1 − cos_e2e) / (1 − cos_layer)`, see the module docs.
    #[serde(
        serialize_with = "json::opt_number",
        deserialize_with = "json::de_opt_number"
    )]
    pub amplification_cosine: Option<f64>,
    /// `mse_e2e / mse_layer`, see the module docs.
    #[serde(
        serialize_with = "json::opt_number",
        deserialize_with = "json::de_opt_number"
    )]
    pub amplification_mse: Option<f64>,
}

/// The result.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PrecisionTable {
    /// Number of samples used (the first ones).
    pub data_num: usize,
    /// `sha256:` of the model file and of the samples used.
    pub model_digest: String,
    pub data_digest: String,
    pub options: PrecisionOptionsRecord,
    /// Set in a shard's part, absent in a whole table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<PartInfo>,
    pub rows: Vec<PrecisionRow>,
    #[serde(skip)]
    pub timings: Timings,
}

/// `error_e2e / error_layer` with the zero rule of the module docs.
pub fn amplification(end_to_end: f64, per_layer: f64, floor: f64) -> Option<f64> {
    if end_to_end.is_nan() || per_layer.is_nan() {
        return None;
    }
    let e2e = if end_to_end <= floor { 0.0 } else { end_to_end };
    let layer = if per_layer <= floor { 0.0 } else { per_layer };
    match (e2e == 0.0, layer == 0.0) {
        (true, true) => None,
        (false, true) => Some(f64::INFINITY),
        _ => Some(e2e / layer),
    }
}

impl PrecisionTable {
    /// The printed table: cosine with 6 decimals, MSE in scientific notation,
    /// amplification with 2 decimals (`inf`, or `-` when undefined).
    pub fn table(&self) -> Table {
        let header = [
            "node",
            "op_type",
            "cosine(e2e)",
            "mse(e2e)",
            "cosine(layer)",
            "mse(layer)",
            "amp(1-cos)",
            "amp(mse)",
        ];
        let mut table = Table::new(
            "precision table (e2e: calibrated model; layer: node alone on float inputs)",
            header.iter().map(|h| h.to_string()).collect(),
        );
        for r in &self.rows {
            table
                .push_row(vec![
                    r.node.clone(),
                    r.op_type.clone(),
                    fmt_cosine(r.end_to_end.cosine),
                    fmt_mse(r.end_to_end.mse),
                    fmt_cosine(r.per_layer.cosine),
                    fmt_mse(r.per_layer.mse),
                    fmt_amp(r.amplification_cosine),
                    fmt_amp(r.amplification_mse),
                ])
                .expect("one cell per column");
        }
        table
    }
}

fn fmt_cosine(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.6}")
    } else {
        python_repr(v)
    }
}

fn fmt_mse(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.4e}")
    } else {
        python_repr(v)
    }
}

fn fmt_amp(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{v:.2}"),
        Some(v) => python_repr(v),
        None => "-".to_string(),
    }
}

/// Computes the table. `progress` gets (tasks done, total).
pub fn precision_table(
    engine: &Engine,
    options: &PrecisionTableOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<PrecisionTable, EngineError> {
    let samples = engine.sample_count(options.data_num)?;
    let model = engine.model();
    struct Node {
        id: hmct_ir::NodeId,
        slots: Vec<Slot>,
        cals: Vec<usize>,
    }
    let nodes: Vec<Node> = hmct_ir::quantized_nodes(model)
        .into_iter()
        .map(|id| Node {
            id,
            slots: engine.output_slots(id),
            cals: engine.input_calibrations(id),
        })
        .filter(|n| !n.cals.is_empty() && !n.slots.is_empty())
        .collect();
    let all_nodes = nodes.len();
    let (indices, nodes): (Vec<usize>, Vec<Node>) = match options.shard {
        None => nodes.into_iter().enumerate().unzip(),
        Some(shard) => {
            let costs = node_costs(engine)?;
            let cones: Vec<u64> = nodes
                .iter()
                .map(|n| cone_cost(engine, &costs, &n.cals, &n.slots))
                .collect();
            let shard_of = partition(&cones, shard.count);
            nodes
                .into_iter()
                .enumerate()
                .filter(|(i, _)| shard_of[*i] + 1 == shard.index)
                .unzip()
        }
    };

    let all_slots: Vec<Slot> = nodes.iter().flat_map(|n| n.slots.iter().copied()).collect();
    let metrics = [Metric::CosineSimilarity, Metric::Mse];
    let session = engine.session();
    let float_config = Config::float();
    let configs: Vec<Config> = nodes
        .iter()
        .map(|n| {
            n.cals
                .iter()
                .fold(Config::float(), |c, &i| c.with(i, Override::On))
        })
        .collect();
    let compare_slots = |x: &Values, y: &Values, slots: &[Slot]| {
        slots
            .iter()
            .map(|&slot| {
                let a = session.value(x, slot)?;
                let b = session.value(y, slot)?;
                compare(&a, &b, &metrics, engine.value_name(slot))
            })
            .collect::<Result<Vec<Vec<f64>>, EngineError>>()
    };
    let total = samples * (1 + nodes.len());
    let done = AtomicUsize::new(0);
    let tick = || progress(done.fetch_add(1, Ordering::Relaxed) + 1, total);

    // Sample by sample, so that one sample's activations at a time are alive (they
    // are not put in the engine's cache: each is used once). The calibrated run is the
    // end-to-end one; each per-layer run
    // starts from the float capture and wants only its node's outputs, so it re-runs
    // just the node and its calibration nodes (wanting more would re-run everything
    // downstream).
    let mut timings = Timings::default();
    // e2e[sample][slot index][metric], per_layer[node][sample][slot index][metric]
    let mut e2e: Vec<Vec<Vec<f64>>> = Vec::with_capacity(samples);
    let mut per_layer: Vec<Vec<Vec<Vec<f64>>>> = vec![Vec::with_capacity(samples); nodes.len()];
    for s in 0..samples {
        let start = Instant::now();
        let (float, calibrated) = run_sample(engine, s, &all_slots)?;
        timings.capture += start.elapsed();
        let start = Instant::now();
        e2e.push(compare_slots(&float, &calibrated, &all_slots)?);
        tick();
        let layer = session.install(|| {
            nodes
                .par_iter()
                .zip(&configs)
                .map(|(n, config)| {
                    let values = session.run_from(
                        &float,
                        Some(&float_config),
                        config,
                        &n.slots,
                        Capture::Wanted,
                    )?;
                    let out = compare_slots(&float, &values, &n.slots);
                    tick();
                    out
                })
                .collect::<Result<Vec<_>, EngineError>>()
        })?;
        for (acc, v) in per_layer.iter_mut().zip(layer) {
            acc.push(v);
        }
        timings.probes += start.elapsed();
        timings.tasks += 1 + nodes.len();
    }

    // values[sample][slot index][metric] → mean over samples, then over outputs.
    let aggregate = |values: &[Vec<Vec<f64>>], offset: usize, count: usize, metric: usize| {
        let per_output: Vec<Vec<f64>> = (offset..offset + count)
            .map(|o| values.iter().map(|s| s[o][metric]).collect())
            .collect();
        hmct_metrics::aggregate(&per_output)
    };
    let plan = engine.plan();
    let mut offset = 0;
    let rows = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let count = n.slots.len();
            let end_to_end = Errors {
                cosine: aggregate(&e2e, offset, count, 0),
                mse: aggregate(&e2e, offset, count, 1),
            };
            let per_layer = Errors {
                cosine: aggregate(&per_layer[i], 0, count, 0),
                mse: aggregate(&per_layer[i], 0, count, 1),
            };
            offset += count;
            PrecisionRow {
                index: indices[i],
                node: model.node_name(n.id).to_string(),
                op_type: model.node(n.id).op_type().to_string(),
                outputs: n
                    .slots
                    .iter()
                    .map(|&s| engine.value_name(s).to_string())
                    .collect(),
                calibrations: n
                    .cals
                    .iter()
                    .map(|&c| plan.calibrations()[c].name.clone())
                    .collect(),
                amplification_cosine: amplification(
                    cosine_error(end_to_end.cosine),
                    cosine_error(per_layer.cosine),
                    COSINE_ERROR_FLOOR,
                ),
                amplification_mse: amplification(end_to_end.mse, per_layer.mse, 0.0),
                end_to_end,
                per_layer,
            }
        })
        .collect();
    let provenance = Provenance::of(engine, samples)?;
    Ok(PrecisionTable {
        data_num: samples,
        model_digest: provenance.model_digest,
        data_digest: provenance.data_digest,
        options: PrecisionOptionsRecord { data_num: samples },
        shard: options.shard.map(|shard| PartInfo {
            shard,
            candidates: all_nodes,
        }),
        rows,
        timings,
    })
}

impl Part for PrecisionTable {
    const COMMAND: &'static str = "precision-table";

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
        self.rows.iter().map(|r| r.index).collect()
    }
}

/// The whole table from the parts of a sharded run (`(label, part)`, labels are
/// file names for messages): rows back in graph order. Refuses parts of different
/// models, data or options, and a missing or duplicated shard.
pub fn merge_precision_table(
    parts: Vec<(String, PrecisionTable)>,
) -> Result<PrecisionTable, MergeError> {
    check_sweep(&parts)?;
    let mut parts = parts.into_iter();
    let (_, mut whole) = parts.next().expect("check_parts refuses no parts");
    for (_, p) in parts {
        whole.rows.extend(p.rows);
        whole.timings.add(&p.timings);
    }
    whole.rows.sort_by_key(|r| r.index);
    whole.shard = None;
    Ok(whole)
}

/// Full runs of sample `s`: the float model keeping every value (the base of the
/// incremental per-layer runs) and the calibrated model keeping `slots`.
fn run_sample(engine: &Engine, s: usize, slots: &[Slot]) -> Result<(Values, Values), EngineError> {
    let session = engine.session();
    let inputs = engine.sample_inputs(s)?;
    let refs: Vec<(&str, Tensor)> = inputs
        .iter()
        .map(|(n, t)| (n.as_str(), t.clone()))
        .collect();
    let bound = session.bind_inputs(&refs)?;
    let every: Vec<Slot> = engine
        .plan()
        .nodes()
        .iter()
        .flat_map(|n| n.outputs.iter().copied())
        .collect();
    let float = session.run_from(&bound, None, &Config::float(), &every, Capture::All)?;
    let calibrated =
        session.run_from(&bound, None, &Config::calibrated(), slots, Capture::Wanted)?;
    Ok((float, calibrated))
}

/// `1 − cosine`, never below 0 (a cosine a rounding step above 1 is no error).
fn cosine_error(cosine: f64) -> f64 {
    (1.0 - cosine).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amplification_rules() {
        assert_eq!(amplification(0.2, 0.1, 0.0), Some(2.0));
        assert_eq!(amplification(0.05, 0.1, 0.0), Some(0.5));
        assert_eq!(amplification(0.1, 0.0, 0.0), Some(f64::INFINITY));
        assert_eq!(amplification(0.0, 0.0, 0.0), None);
        assert_eq!(amplification(f64::NAN, 0.1, 0.0), None);
        // Noise under the floor is zero on both sides.
        assert_eq!(amplification(1e-3, 1e-15, 1e-12), Some(f64::INFINITY));
        assert_eq!(amplification(1e-15, 1e-14, 1e-12), None);
        assert_eq!(cosine_error(1.0 + 1e-16), 0.0);
    }
}
