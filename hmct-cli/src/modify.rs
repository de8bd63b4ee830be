//! `hmct-debugger modify MODEL -o OUT`: the IR recipes of ../shared/seeds/001 as a
//! command (set precision, thresholds, switches; by node, op type, sub-graph or a
//! Horizon quant_config JSON), printing every attribute that changed.
//!
//! Precision flags on regular nodes, op types and sub-graphs change activation
//! (feature) input calibration nodes, as the seed's recipes do; weights change with
//! `--all-weights` or by naming their calibration node. Edits apply from broad to
//! specific (config, all-*, op types, sub-graph, nodes, thresholds, switches), so a
//! specific one wins. Argument mistakes (unknown names with suggestions, a sub-graph
//! that is not closed by its inputs, a bad qtype or threshold) exit with status 2
//! before anything is written; the output file is written atomically.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Result;
use hmct_cli::listarg::{ListArg, parse_list};
use hmct_ir::{Edit, EditReport, QType, TensorType, apply_edits, load_model, save_model};
use serde_json::Value;

use crate::common::usage;

/// Arguments of `modify`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The calibrated ONNX model.
    pub model: PathBuf,
    /// Where to write the edited model.
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    pub output: PathBuf,
    /// Precision for --nodes, --op-types and --subgraph: int8, int16, uint8, uint16,
    /// int4, float16, float32.
    #[arg(long)]
    pub qtype: Option<String>,
    /// Nodes to set to --qtype: a calibration node itself, a regular node its
    /// activation input calibration nodes. E.g. "['Conv_0','317_HzCalibration']".
    #[arg(long)]
    pub nodes: Option<String>,
    /// Set every activation calibration node to this qtype.
    #[arg(
        long = "all-activations",
        visible_alias = "all_activations",
        value_name = "QTYPE"
    )]
    pub all_activations: Option<String>,
    /// Set every weight calibration node to this qtype.
    #[arg(
        long = "all-weights",
        visible_alias = "all_weights",
        value_name = "QTYPE"
    )]
    pub all_weights: Option<String>,
    /// Set every calibration node to this qtype (quant_config's all_node_type).
    #[arg(
        long = "all-node-type",
        visible_alias = "all_node_type",
        value_name = "QTYPE"
    )]
    pub all_node_type: Option<String>,
    /// Op types whose activation input calibration nodes get --qtype. E.g. "[Conv]".
    #[arg(long = "op-types", visible_alias = "op_types")]
    pub op_types: Option<String>,
    /// NODE=VALUE or NODE=[v0,v1,...] (per channel): thresholds of a calibration node.
    /// Repeatable.
    #[arg(long, value_name = "NODE=T")]
    pub threshold: Vec<String>,
    /// NODE=ON or NODE=OFF: a calibration node, or all input calibration nodes of a
    /// regular node. Repeatable.
    #[arg(long, value_name = "NODE=ON|OFF")]
    pub switch: Vec<String>,
    /// inputs=[..] outputs=[..] (node or tensor names): every activation calibration
    /// node of the sub-graph between them gets --qtype.
    #[arg(long, num_args = 1..=2, value_name = "inputs=[..] outputs=[..]")]
    pub subgraph: Option<Vec<String>>,
    /// Horizon quant_config JSON (model_config.all_node_type, op_config.<type>.qtype,
    /// node_config.<name>.qtype, subgraph_config.<name>.{inputs,outputs,qtype}).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

fn flat(flag: &str, value: &str) -> Result<Vec<String>> {
    match parse_list(value).map_err(|e| usage(format!("{flag}: {e}")))? {
        ListArg::Flat(names) if !names.is_empty() => Ok(names),
        ListArg::Flat(_) => Err(usage(format!("{flag}: the list is empty"))),
        ListArg::Nested(_) => Err(usage(format!("{flag} takes a flat list, got `{value}`"))),
    }
}

fn qtype(flag: &str, value: &str) -> Result<QType> {
    match QType::from_name(value) {
        QType::Unknown(_) => Err(usage(format!(
            "{flag}: unknown qtype '{value}' (int8, int16, uint8, uint16, int4, float16, float32)"
        ))),
        q => Ok(q),
    }
}

/// `NODE=VALUE`, split at the last `=` (node names may contain `=`, values do not).
fn key_value<'a>(flag: &str, arg: &'a str) -> Result<(&'a str, &'a str)> {
    arg.rsplit_once('=')
        .map(|(k, v)| (k.trim(), v.trim()))
        .filter(|(k, v)| !k.is_empty() && !v.is_empty())
        .ok_or_else(|| usage(format!("{flag}: expected NODE=VALUE, got `{arg}`")))
}

fn thresholds(arg: &str) -> Result<Edit> {
    let (node, value) = key_value("--threshold", arg)?;
    let items: Vec<&str> = value
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let parsed: Result<Vec<f32>, _> = items.iter().map(|s| s.parse::<f32>()).collect();
    match parsed {
        Ok(t) if !t.is_empty() => Ok(Edit::Threshold {
            node: node.to_string(),
            thresholds: t,
        }),
        _ => Err(usage(format!(
            "--threshold: `{value}` is not a number or a list of numbers"
        ))),
    }
}

fn switch(arg: &str) -> Result<Edit> {
    let (node, value) = key_value("--switch", arg)?;
    let on = match value.to_ascii_uppercase().as_str() {
        "ON" => true,
        "OFF" => false,
        _ => return Err(usage(format!("--switch: `{value}` is not ON or OFF"))),
    };
    Ok(Edit::Switch {
        node: node.to_string(),
        on,
    })
}

/// `inputs=[..] outputs=[..]` in either order, as one argument or two.
fn subgraph(parts: &[String], q: Option<&QType>) -> Result<Edit> {
    let text = parts.join(" ");
    let find = |key: &str| text.find(key);
    let (Some(i), Some(o)) = (find("inputs="), find("outputs=")) else {
        return Err(usage(format!(
            "--subgraph: expected inputs=[..] outputs=[..], got `{text}`"
        )));
    };
    let (inputs, outputs) = if i < o {
        (&text[i + 7..o], &text[o + 8..])
    } else {
        (&text[i + 7..], &text[o + 8..i])
    };
    let qtype = q
        .cloned()
        .ok_or_else(|| usage("--subgraph needs --qtype"))?;
    Ok(Edit::SubgraphQType {
        inputs: flat("--subgraph inputs", inputs.trim())?,
        outputs: flat("--subgraph outputs", outputs.trim())?,
        qtype,
    })
}

/// The edits of a quant_config JSON, and warnings naming every key it ignores.
fn config_edits(path: &Path) -> Result<(Vec<Edit>, Vec<String>)> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| usage(format!("--config {}: {e}", path.display())))?;
    let json: Value = serde_json::from_str(&text)
        .map_err(|e| usage(format!("--config {}: not JSON: {e}", path.display())))?;
    let bad = |what: String| usage(format!("--config {}: {what}", path.display()));
    fn object<'v>(
        v: &'v Value,
        at: &str,
        file: &Path,
    ) -> Result<&'v serde_json::Map<String, Value>> {
        v.as_object().ok_or_else(|| {
            usage(format!(
                "--config {}: {at} must be an object",
                file.display()
            ))
        })
    }
    let qtype_at = |v: &Value, at: &str| -> Result<QType> {
        let s = v
            .as_str()
            .ok_or_else(|| bad(format!("{at} must be a string")))?;
        qtype(&format!("--config {}: {at}", path.display()), s)
    };
    let names_at = |v: &Value, at: &str| -> Result<Vec<String>> {
        let list = v
            .as_array()
            .ok_or_else(|| bad(format!("{at} must be a list of names")))?;
        list.iter()
            .map(|n| {
                n.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| bad(format!("{at} must be a list of names")))
            })
            .collect()
    };
    let mut edits = Vec::new();
    let mut unknown = Vec::new();
    let mut calibration_only = Vec::new();
    let root = object(&json, "the top level", path)?;
    // Broad to specific, like the flags.
    for key in root.keys() {
        if ![
            "model_config",
            "op_config",
            "node_config",
            "subgraph_config",
        ]
        .contains(&key.as_str())
        {
            unknown.push(key.clone());
        }
    }
    if let Some(mc) = root.get("model_config") {
        for (key, value) in object(mc, "model_config", path)? {
            match key.as_str() {
                "all_node_type" => edits.push(Edit::AllQType {
                    kind: None,
                    qtype: qtype_at(value, "model_config.all_node_type")?,
                }),
                "activation" | "weight" | "model_output_type" => {
                    calibration_only.push(format!("model_config.{key}"))
                }
                _ => unknown.push(format!("model_config.{key}")),
            }
        }
    }
    if let Some(oc) = root.get("op_config") {
        for (op, value) in object(oc, "op_config", path)? {
            for (key, v) in object(value, &format!("op_config.{op}"), path)? {
                match key.as_str() {
                    "qtype" => edits.push(Edit::OpTypesQType {
                        op_types: vec![op.clone()],
                        qtype: qtype_at(v, &format!("op_config.{op}.qtype"))?,
                    }),
                    _ => unknown.push(format!("op_config.{op}.{key}")),
                }
            }
        }
    }
    if let Some(sc) = root.get("subgraph_config") {
        for (name, value) in object(sc, "subgraph_config", path)? {
            let at = format!("subgraph_config.{name}");
            let fields = object(value, &at, path)?;
            for key in fields.keys() {
                if !["inputs", "outputs", "qtype"].contains(&key.as_str()) {
                    unknown.push(format!("{at}.{key}"));
                }
            }
            let field = |k: &str| {
                fields
                    .get(k)
                    .ok_or_else(|| bad(format!("{at} has no '{k}'")))
            };
            edits.push(Edit::SubgraphQType {
                inputs: names_at(field("inputs")?, &format!("{at}.inputs"))?,
                outputs: names_at(field("outputs")?, &format!("{at}.outputs"))?,
                qtype: qtype_at(field("qtype")?, &format!("{at}.qtype"))?,
            });
        }
    }
    if let Some(nc) = root.get("node_config") {
        for (node, value) in object(nc, "node_config", path)? {
            for (key, v) in object(value, &format!("node_config.{node}"), path)? {
                match key.as_str() {
                    "qtype" => edits.push(Edit::NodesQType {
                        nodes: vec![node.clone()],
                        qtype: qtype_at(v, &format!("node_config.{node}.qtype"))?,
                    }),
                    _ => unknown.push(format!("node_config.{node}.{key}")),
                }
            }
        }
    }
    let mut warnings = Vec::new();
    if !unknown.is_empty() {
        warnings.push(format!(
            "{}: ignored unknown key(s): {}",
            path.display(),
            unknown.join(", ")
        ));
    }
    if !calibration_only.is_empty() {
        warnings.push(format!(
            "{}: ignored calibration setting(s) (they apply when calibrating, not to a calibrated model): {}",
            path.display(),
            calibration_only.join(", ")
        ));
    }
    Ok((edits, warnings))
}

/// Every edit the arguments ask for, broad to specific, and the config's warnings.
fn edits(args: &Args) -> Result<(Vec<Edit>, Vec<String>)> {
    let q = args
        .qtype
        .as_deref()
        .map(|v| qtype("--qtype", v))
        .transpose()?;
    if q.is_some() && args.nodes.is_none() && args.op_types.is_none() && args.subgraph.is_none() {
        return Err(usage(
            "--qtype applies to --nodes, --op-types or --subgraph; give one of them",
        ));
    }
    let needs_q = |flag: &str| {
        q.clone()
            .ok_or_else(|| usage(format!("{flag} needs --qtype")))
    };
    let (mut edits, warnings) = match &args.config {
        Some(path) => config_edits(path)?,
        None => (Vec::new(), Vec::new()),
    };
    if let Some(v) = &args.all_node_type {
        edits.push(Edit::AllQType {
            kind: None,
            qtype: qtype("--all-node-type", v)?,
        });
    }
    if let Some(v) = &args.all_activations {
        edits.push(Edit::AllQType {
            kind: Some(TensorType::Feature),
            qtype: qtype("--all-activations", v)?,
        });
    }
    if let Some(v) = &args.all_weights {
        edits.push(Edit::AllQType {
            kind: Some(TensorType::Weight),
            qtype: qtype("--all-weights", v)?,
        });
    }
    if let Some(v) = &args.op_types {
        edits.push(Edit::OpTypesQType {
            op_types: flat("--op-types", v)?,
            qtype: needs_q("--op-types")?,
        });
    }
    if let Some(parts) = &args.subgraph {
        edits.push(subgraph(parts, q.as_ref())?);
    }
    if let Some(v) = &args.nodes {
        edits.push(Edit::NodesQType {
            nodes: flat("--nodes", v)?,
            qtype: needs_q("--nodes")?,
        });
    }
    for t in &args.threshold {
        edits.push(thresholds(t)?);
    }
    for s in &args.switch {
        edits.push(switch(s)?);
    }
    if edits.is_empty() {
        return Err(usage(
            "nothing to do: give --nodes/--op-types/--subgraph with --qtype, --all-activations, --all-weights, --all-node-type, --threshold, --switch or --config",
        ));
    }
    Ok((edits, warnings))
}

pub fn run(args: &Args, out: &mut dyn Write) -> Result<()> {
    let (edits, warnings) = edits(args)?;
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    let mut model = load_model(&args.model)?;
    let report = apply_edits(&mut model, &edits).map_err(usage)?;
    // The error names the file already.
    save_model(&model, &args.output)?;
    print_report(&report, args, out)?;
    Ok(())
}

fn print_report(report: &EditReport, args: &Args, out: &mut dyn Write) -> Result<()> {
    for c in &report.changes {
        writeln!(
            out,
            "{}: {} {} -> {}",
            c.node, c.attribute, c.before, c.after
        )?;
    }
    let mut nodes: Vec<&str> = report.changes.iter().map(|c| c.node.as_str()).collect();
    nodes.dedup();
    let already = match report.unchanged.len() {
        0 => String::new(),
        n if n <= 5 => format!(
            " ({n} already as requested: {})",
            report.unchanged.join(", ")
        ),
        n => format!(" ({n} already as requested)"),
    };
    writeln!(
        out,
        "{} calibration node(s) changed{already}; wrote {}",
        nodes.len(),
        args.output.display()
    )?;
    Ok(())
}
