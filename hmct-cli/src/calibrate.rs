//! `hmct-debugger calibrate FLOAT_MODEL DATA -o calibrated_model.onnx`: inserts
//! HzCalibration nodes with thresholds from calibration data (hmct_debug::calibrate).

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use hmct_debug::calibrate::{
    CalibrateError, CalibrateOptions, CalibrationReport, DEFAULT_OP_TYPES, Method, ONNX_OP_TYPES,
    is_onnx_op,
};
use hmct_ir::{QType, close_matches};
use indicatif::{ProgressBar, ProgressStyle};

use crate::UsageError;

/// Arguments of `calibrate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The float ONNX model (without HzCalibration nodes).
    pub model: PathBuf,
    /// Calibration-data folder: one sub-folder per input with 0.npy, 1.npy, ...
    pub data: PathBuf,
    /// Where to write the calibrated model (written atomically).
    #[arg(short = 'o', long, default_value = "calibrated_model.onnx")]
    pub output: PathBuf,
    /// How activation thresholds are computed: max, percentile, kl or mse.
    #[arg(long, default_value = "max", value_parser = parse_method)]
    pub method: Method,
    /// Quantile of |x| for --method percentile.
    #[arg(long, default_value_t = 0.99995)]
    pub percentile: f64,
    /// Histogram bins for the percentile, kl and mse methods.
    #[arg(long = "num-bins", visible_alias = "num_bins", default_value_t = 2048)]
    pub num_bins: usize,
    /// qtype of activation nodes (int8, int16, ...).
    #[arg(long, default_value = "int8", value_parser = parse_qtype)]
    pub qtype: QType,
    /// qtype of weight nodes.
    #[arg(long = "weight-qtype", visible_alias = "weight_qtype", default_value = "int8", value_parser = parse_qtype)]
    pub weight_qtype: QType,
    /// NAME=QTYPE, repeatable. NAME is a regular node (sets its activation inputs) or
    /// a calibration node as it will be named (`<tensor>_HzCalibration`).
    #[arg(
        long = "node-qtype",
        visible_alias = "node_qtype",
        value_name = "NAME=QTYPE"
    )]
    pub node_qtype: Vec<String>,
    /// JSON file of per-node qtypes: {"NAME": "int16"}, {"NAME": {"qtype": "int16"}},
    /// or a quant_config with a "node_config" object of that form.
    #[arg(
        long = "node-qtype-file",
        visible_alias = "node_qtype_file",
        value_name = "JSON"
    )]
    pub node_qtype_file: Option<PathBuf>,
    /// Operator types to quantize, replacing the default set (`[Conv,Add]` or
    /// `Conv,Add`); `+Relu,-MaxPool` adds to / removes from the default set.
    #[arg(long = "op-types", visible_alias = "op_types", value_name = "LIST")]
    pub op_types: Option<String>,
    /// Regular nodes to leave float (`[Conv_2,Add_5]` or `Conv_2,Add_5`).
    #[arg(long = "skip-nodes", visible_alias = "skip_nodes", value_name = "LIST")]
    pub skip_nodes: Option<String>,
    /// Use only the first N samples.
    #[arg(short = 'n', long = "data-num", visible_alias = "data_num")]
    pub data_num: Option<usize>,
    #[command(flatten)]
    pub workers: crate::common::Threads,
    /// Also write what was inserted as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

fn parse_method(s: &str) -> Result<Method, String> {
    s.parse().map_err(|e: CalibrateError| e.to_string())
}

fn parse_qtype(s: &str) -> Result<QType, String> {
    let q = QType::from_name(s.trim());
    hmct_debug::calibrate::check_qtype(&q).map_err(|e| e.to_string())?;
    Ok(q)
}

/// A list argument: the seeds' bracket forms, or plain comma-separated names.
pub fn parse_names(input: &str) -> Result<Vec<String>, UsageError> {
    let trimmed = input.trim();
    let names: Vec<String> = if trimmed.starts_with(['[', '\'', '"']) {
        let list = hmct_cli::listarg::parse_list(trimmed).map_err(|e| UsageError(e.to_string()))?;
        list.as_flat()
            .ok_or_else(|| UsageError(format!("'{input}': expected a flat list of names")))?
            .to_vec()
    } else {
        trimmed
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect()
    };
    Ok(names)
}

/// The op-type set from `--op-types`: a replacement list, or `+Op`/`-Op` edits of the
/// default set. Unknown op types are usage errors with suggestions.
pub fn op_types(arg: Option<&str>) -> Result<Vec<String>, UsageError> {
    let defaults = || DEFAULT_OP_TYPES.iter().map(|s| s.to_string()).collect();
    let Some(arg) = arg else {
        return Ok(defaults());
    };
    let items = parse_names(arg)?;
    let edits = items.iter().filter(|s| s.starts_with(['+', '-'])).count();
    if edits != 0 && edits != items.len() {
        return Err(UsageError(format!(
            "--op-types '{arg}': either list the op types, or edit the default set with +Op/-Op, not both"
        )));
    }
    for item in &items {
        let name = item.trim_start_matches(['+', '-']);
        if !is_onnx_op(name) {
            let suggestions = close_matches(name, ONNX_OP_TYPES.iter().copied());
            return Err(UsageError(
                CalibrateError::UnknownOpType {
                    name: name.to_string(),
                    suggestions,
                }
                .to_string(),
            ));
        }
    }
    if edits == 0 {
        return Ok(items);
    }
    let mut set: Vec<String> = defaults();
    for item in items {
        let (sign, name) = item.split_at(1);
        set.retain(|s| s != name);
        if sign == "+" {
            set.push(name.to_string());
        }
    }
    Ok(set)
}

/// `NAME=QTYPE` arguments and the JSON file, in that order (the file first, so the
/// command line overrides it).
fn node_qtypes(args: &Args) -> Result<Vec<(String, QType)>> {
    let mut out = Vec::new();
    if let Some(path) = &args.node_qtype_file {
        out.extend(read_node_qtype_file(path)?);
    }
    for item in &args.node_qtype {
        let (name, q) = item
            .rsplit_once('=')
            .ok_or_else(|| UsageError(format!("--node-qtype '{item}': expected NAME=QTYPE")))?;
        let q = parse_qtype(q).map_err(|e| UsageError(format!("--node-qtype '{item}': {e}")))?;
        out.push((name.trim().to_string(), q));
    }
    Ok(out)
}

fn read_node_qtype_file(path: &Path) -> Result<Vec<(String, QType)>> {
    let bad = |m: String| UsageError(format!("{}: {m}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let map = json
        .get("node_config")
        .unwrap_or(&json)
        .as_object()
        .ok_or_else(|| bad("expected a JSON object of node name -> qtype".into()))?;
    map.iter()
        .map(|(name, v)| {
            let q = match v {
                serde_json::Value::String(s) => s.as_str(),
                serde_json::Value::Object(o) => {
                    o.get("qtype").and_then(|q| q.as_str()).ok_or_else(|| {
                        bad(format!("node '{name}': expected {{\"qtype\": \"int16\"}}"))
                    })?
                }
                _ => return Err(bad(format!("node '{name}': expected a qtype string"))),
            };
            let q = parse_qtype(q).map_err(|e| bad(format!("node '{name}': {e}")))?;
            Ok((name.clone(), q))
        })
        .collect::<Result<_, UsageError>>()
        .map_err(Into::into)
}

pub fn run(args: &Args, out: &mut dyn Write) -> Result<()> {
    let start = Instant::now();
    // Check what can be checked before the (long) calibration run.
    let folder = match args.output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !folder.is_dir() {
        return Err(UsageError(format!(
            "-o {}: folder '{}' does not exist",
            args.output.display(),
            folder.display()
        ))
        .into());
    }
    let options = CalibrateOptions {
        method: args.method,
        percentile: args.percentile,
        num_bins: args.num_bins,
        qtype: args.qtype.clone(),
        weight_qtype: args.weight_qtype.clone(),
        node_qtypes: node_qtypes(args)?,
        op_types: op_types(args.op_types.as_deref())?,
        skip_nodes: match &args.skip_nodes {
            Some(s) => parse_names(s)?,
            None => Vec::new(),
        },
        data_num: args.data_num,
        threads: args.workers.threads,
        cancel: None,
    };
    let model = hmct_ir::load_model(&args.model)?;
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("calibrating {bar:30} {pos}/{len} runs ({elapsed})")
            .expect("a valid template"),
    );
    let progress = |done: usize, total: usize| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    };
    let result = hmct_debug::calibrate::calibrate(&model, &args.data, &options, &progress);
    bar.finish_and_clear();
    let calibrated = result?;
    hmct_ir::save_model(&calibrated.model, &args.output)?;
    if let Some(path) = &args.json {
        crate::common::write_json(path, &calibrated.report)?;
    }
    print_summary(&calibrated.report, args, start.elapsed().as_secs_f64(), out)
        .context("writing to stdout")
}

fn print_summary(
    r: &CalibrationReport,
    args: &Args,
    seconds: f64,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    for note in &r.notes {
        eprintln!("note: {note}");
    }
    let qtypes: BTreeSet<&str> = r.nodes.iter().map(|n| n.qtype.as_str()).collect();
    let count = |kind: &str, q: &str| {
        r.nodes
            .iter()
            .filter(|n| n.kind == kind && n.qtype == q)
            .count()
    };
    let mut per_kind = Vec::new();
    for q in &qtypes {
        let (a, w) = (count("activation", q), count("weight", q));
        if a + w > 0 {
            per_kind.push(format!("{q}: {a} activation, {w} weight"));
        }
    }
    let method = match r.percentile {
        Some(p) => format!("{} {p}", r.method),
        None => r.method.to_string(),
    };
    let samples = if r.samples < r.samples_available {
        format!(
            "{} samples (the first {} of {})",
            r.samples, r.samples, r.samples_available
        )
    } else {
        format!("{} samples", r.samples)
    };
    writeln!(
        out,
        "wrote {}: {} calibration nodes ({} activation, {} weight; {})",
        args.output.display(),
        r.activation_nodes + r.weight_nodes,
        r.activation_nodes,
        r.weight_nodes,
        per_kind.join("; ")
    )?;
    writeln!(out, "method {method}, {samples}, {seconds:.1} s")?;
    if !r.constant_inputs.is_empty() {
        writeln!(out, "{}", r.constant_inputs_sentence())?;
    }
    Ok(())
}
