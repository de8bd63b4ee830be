//! `hmct-debugger summary MODEL [--json FILE]`: what is in a (calibrated) model.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use hmct_ir::{Model, TensorType, ValueType};
use serde::Serialize;

/// Arguments of `summary`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The ONNX model (calibrated or not).
    pub model: PathBuf,
    /// Also write the summary as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct Summary {
    pub file: String,
    pub ir_version: Option<i64>,
    pub producer: String,
    pub inputs: Vec<ValueSummary>,
    pub outputs: Vec<ValueSummary>,
    pub opsets: Vec<Opset>,
    pub node_count: usize,
    /// op_type → number of nodes.
    pub op_counts: BTreeMap<String, usize>,
    pub calibration_nodes: Vec<CalibrationSummary>,
    /// Regular nodes with at least one input calibration node.
    pub quantized_nodes: usize,
    /// Set when the file was a QDQ model the loader turned into a calibrated one.
    pub imported_from_qdq: Option<String>,
    /// What `calibrate` did, when it wrote the model (its metadata entry).
    pub calibrated_by: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ValueSummary {
    pub name: String,
    /// ONNX element type name, `None` when not declared.
    pub dtype: Option<String>,
    /// Dimensions as written: numbers, symbolic names, `?`; `None` when the rank is
    /// not declared.
    pub shape: Option<Vec<String>>,
}

#[derive(Debug, Serialize)]
pub struct Opset {
    pub domain: String,
    pub version: i64,
}

#[derive(Debug, Serialize)]
pub struct CalibrationSummary {
    pub name: String,
    /// `weight` or `activation`.
    pub kind: &'static str,
    pub qtype: String,
    /// Largest absolute threshold; `None` when the node has no thresholds.
    pub max_threshold: Option<f32>,
    pub per_channel: bool,
    /// Number of thresholds (channels when per-channel).
    pub thresholds: usize,
    pub switch_on: bool,
    /// The regular nodes it quantizes, `;`-joined.
    pub consumers: String,
}

/// Runs the sub-command: prints the summary, writes the JSON file if asked.
pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let model = hmct_ir::load_model(&args.model)?;
    let summary = summarize(&model, &args.model.display().to_string());
    print(&summary, out).context("writing to stdout")?;
    if let Some(path) = &args.json {
        crate::common::write_json(path, &summary)?;
    }
    Ok(())
}

/// Collects the facts shown by `summary`.
pub fn summarize(model: &Model, file: &str) -> Summary {
    let p = model.proto();
    let value = |name: &String| {
        let ty = model.value_type(name);
        ValueSummary {
            name: name.clone(),
            dtype: ty
                .as_ref()
                .map(|t| hmct_tensor::DType::onnx_code_name(t.elem_type)),
            shape: ty
                .and_then(|t: ValueType| t.shape)
                .map(|dims| dims.iter().map(ToString::to_string).collect()),
        }
    };
    let calibration_nodes = model
        .calibration_nodes()
        .into_iter()
        .filter_map(|id| model.calibration(id))
        .map(|c| {
            let thresholds = c.thresholds();
            CalibrationSummary {
                name: c.name().to_string(),
                kind: match c.tensor_type() {
                    TensorType::Weight => "weight",
                    TensorType::Feature => "activation",
                },
                qtype: c.qtype().to_string(),
                max_threshold: thresholds.iter().map(|t| t.abs()).reduce(f32::max),
                per_channel: c.is_per_channel(),
                thresholds: thresholds.len(),
                switch_on: c.switch_on(),
                consumers: hmct_ir::consumer_label(model, c.id()),
            }
        })
        .collect();
    Summary {
        file: file.to_string(),
        ir_version: p.ir_version,
        producer: format!("{} {}", p.producer_name(), p.producer_version())
            .trim()
            .to_string(),
        inputs: model.inputs().iter().map(value).collect(),
        outputs: model.outputs().iter().map(value).collect(),
        opsets: p
            .opset_import
            .iter()
            .map(|o| Opset {
                domain: match o.domain() {
                    "" => "ai.onnx".to_string(),
                    d => d.to_string(),
                },
                version: o.version(),
            })
            .collect(),
        node_count: model.nodes().len(),
        op_counts: model
            .type2nodes()
            .iter()
            .map(|(op, ids)| (op.clone(), ids.len()))
            .collect(),
        calibration_nodes,
        quantized_nodes: hmct_ir::quantized_nodes(model).len(),
        imported_from_qdq: model.imported_from_qdq().map(ToString::to_string),
        calibrated_by: p
            .metadata_props
            .iter()
            .find(|e| e.key() == hmct_debug::calibrate::METADATA_KEY)
            .map(|e| e.value().to_string()),
    }
}

fn print(s: &Summary, out: &mut dyn Write) -> std::io::Result<()> {
    let values = |vs: &[ValueSummary]| -> Vec<String> {
        vs.iter()
            .map(|v| {
                let shape = v
                    .shape
                    .as_ref()
                    .map_or("[?]".to_string(), |d| format!("[{}]", d.join(", ")));
                format!("{} {}{}", v.name, v.dtype.as_deref().unwrap_or("?"), shape)
            })
            .collect()
    };
    let mut facts: Vec<(&str, Vec<String>)> = vec![
        ("model", vec![s.file.clone()]),
        (
            "ir_version",
            vec![s.ir_version.map_or("-".into(), |v| v.to_string())],
        ),
        (
            "producer",
            vec![if s.producer.is_empty() {
                "-".into()
            } else {
                s.producer.clone()
            }],
        ),
        (
            "opsets",
            vec![
                s.opsets
                    .iter()
                    .map(|o| format!("{} {}", o.domain, o.version))
                    .collect::<Vec<_>>()
                    .join(", "),
            ],
        ),
        ("inputs", values(&s.inputs)),
        ("outputs", values(&s.outputs)),
    ];
    let mut ops: Vec<(&String, &usize)> = s.op_counts.iter().collect();
    ops.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    facts.push((
        "nodes",
        vec![format!(
            "{} ({})",
            s.node_count,
            ops.iter()
                .map(|(op, n)| format!("{op} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        )],
    ));
    for (key, lines) in &facts {
        for (i, line) in lines.iter().enumerate() {
            writeln!(out, "{:<12}{line}", if i == 0 { *key } else { "" })?;
        }
        if lines.is_empty() {
            writeln!(out, "{key:<12}-")?;
        }
    }

    if let Some(import) = &s.imported_from_qdq {
        writeln!(out, "\nimported from a QDQ model: {import}")?;
    }
    if let Some(by) = &s.calibrated_by {
        writeln!(out, "\ncalibrated by hmct-debugger calibrate: {by}")?;
    }
    let weights = s
        .calibration_nodes
        .iter()
        .filter(|c| c.kind == "weight")
        .count();
    writeln!(
        out,
        "\ncalibration nodes: {} ({} weight, {} activation); quantized regular nodes: {}",
        s.calibration_nodes.len(),
        weights,
        s.calibration_nodes.len() - weights,
        s.quantized_nodes
    )?;
    if s.calibration_nodes.is_empty() {
        return Ok(());
    }
    let header = [
        "name",
        "type",
        "qtype",
        "max threshold",
        "per-channel",
        "switch",
        "consumers",
    ];
    let rows: Vec<[String; 7]> = s
        .calibration_nodes
        .iter()
        .map(|c| {
            [
                c.name.clone(),
                c.kind.to_string(),
                c.qtype.clone(),
                c.max_threshold.map_or("-".into(), |t| format!("{t:.6}")),
                if c.per_channel {
                    format!("yes ({})", c.thresholds)
                } else {
                    "no".into()
                },
                if c.switch_on { "ON" } else { "OFF" }.to_string(),
                c.consumers.clone(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        padded.join("  ").trim_end().to_string()
    };
    writeln!(out, "{}", line(header.to_vec()))?;
    let rules: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
    writeln!(out, "{}", line(rules.iter().map(String::as_str).collect()))?;
    for row in &rows {
        writeln!(out, "{}", line(row.iter().map(String::as_str).collect()))?;
    }
    Ok(())
}
