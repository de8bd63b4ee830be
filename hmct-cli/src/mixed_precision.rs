//! `hmct-debugger mixed-precision MODEL DATA --target T`: promote the most
//! sensitive nodes, one more at a time in rank order, until the output metric
//! reaches the target (issue #7).
//!
//! Prints the curve (metric against the number of promoted nodes) and writes into
//! the save folder `mixed_precision.png`, `mixed_precision.json` and, when the
//! target is reached, `mixed_precision_model.onnx` and `quant_config.json`
//! (`node_config` entries). When it is not reached (budget or candidates
//! exhausted), the curve and the JSON are written, the best step found is named,
//! no model is written and the exit status is 1. Argument mistakes (unknown or
//! unquantized `-o` nodes, a bad metric, qtype or target) exit with status 2
//! before anything is written.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use hmct_cli::listarg::{ListArg, parse_list};
use hmct_debug::mixed_precision::{
    DEFAULT_BATCH, MixedPrecision, MixedPrecisionOptions, PromoteQType, Stage, mixed_precision,
    write_mixed_precision,
};
use hmct_debug::sensitivity::parse_metrics;
use hmct_metrics::format_value;

use crate::common::{self, usage};

/// Arguments of `mixed-precision`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub input: crate::common::ModelData,
    /// The metric value to reach (at least it for cosine-similarity and sqnr, at
    /// most it for mse, mre and chebyshev).
    #[arg(short = 't', long = "target")]
    pub target: f64,
    /// Metric of the ranking and the target (cosine-similarity, mse, mre, sqnr,
    /// chebyshev).
    #[arg(short = 'm', long = "metric", default_value = "cosine-similarity")]
    pub metric: String,
    /// Measure on this regular node's outputs (or a list of nodes) instead of the
    /// model outputs; each must be quantized.
    #[arg(short = 'o', long = "output_node", visible_alias = "output-node")]
    pub output_node: Option<String>,
    /// Precision of the promoted nodes: int16 (same thresholds) or float32.
    #[arg(short = 'q', long = "qtype", default_value = "int16")]
    pub qtype: String,
    /// Promote at most N nodes (default: every quantized node if needed).
    #[arg(short = 'b', long = "budget", value_name = "N")]
    pub budget: Option<usize>,
    /// Use the first N samples (default: all).
    #[arg(short = 'd', long = "data_num", visible_alias = "data-num")]
    pub data_num: Option<usize>,
    /// Folder for the model, quant_config.json, the curve's PNG and JSON.
    #[arg(
        short = 's',
        long = "save_dir",
        visible_alias = "save-dir",
        value_name = "DIR",
        default_value = "./mixed_precision/"
    )]
    pub save_dir: PathBuf,
    /// Steps evaluated together (more keeps the cores busy, fewer wastes less work
    /// past the target). Results do not depend on it.
    #[arg(long, default_value_t = DEFAULT_BATCH)]
    pub batch: usize,
    #[command(flatten)]
    pub engine: crate::common::EngineArgs,
    /// Use this ranking (the --json of get-sensitivity-of-nodes on the same model,
    /// data, metric and output nodes, e.g. merged from --shard parts) instead of
    /// ranking here.
    #[arg(long, value_name = "FILE")]
    pub ranking: Option<PathBuf>,
}

fn parse(args: &Args) -> Result<MixedPrecisionOptions> {
    let metric = match parse_list(&args.metric).map_err(|e| usage(format!("--metric: {e}")))? {
        ListArg::Flat(names) if names.len() == 1 => parse_metrics(&names).map_err(usage)?[0],
        _ => return Err(usage("--metric takes one metric")),
    };
    let qtype: PromoteQType = args.qtype.parse().map_err(usage)?;
    let output_nodes = match &args.output_node {
        None => Vec::new(),
        Some(v) => match parse_list(v).map_err(|e| usage(format!("--output_node: {e}")))? {
            ListArg::Flat(names) if !names.is_empty() => names,
            ListArg::Flat(_) => return Err(usage("--output_node: the list is empty")),
            ListArg::Nested(_) => {
                return Err(usage(format!("--output_node takes a flat list, got `{v}`")));
            }
        },
    };
    if args.data_num == Some(0) {
        return Err(usage("data_num must be at least 1"));
    }
    if args.budget == Some(0) {
        return Err(usage("budget must be at least 1 node"));
    }
    if args.batch == 0 {
        return Err(usage("batch must be at least 1"));
    }
    Ok(MixedPrecisionOptions {
        target: args.target,
        metric,
        output_nodes,
        qtype,
        budget: args.budget,
        data_num: args.data_num,
        batch: args.batch,
        ranking: match &args.ranking {
            Some(path) => Some(read_ranking(path)?),
            None => None,
        },
    })
}

fn read_ranking(path: &std::path::Path) -> Result<hmct_debug::sensitivity::Sensitivity> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| usage(format!("--ranking {}: cannot read: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| {
        usage(format!(
            "--ranking {}: not a get-sensitivity-of-nodes result: {e}",
            path.display()
        ))
    })
}

pub fn run(args: &Args, out: &mut dyn Write) -> Result<()> {
    let options = parse(args)?;
    let engine = common::open_engine(&args.input, args.engine.threads, args.engine.cache_mb)?;

    let bar = common::progress_bar("{msg} {bar:30} {pos}/{len} ({elapsed})");
    let progress = |stage: Stage, done: usize, total: usize| {
        bar.set_message(match stage {
            Stage::Ranking => "ranking",
            Stage::Search => "promoting",
        });
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    };
    let result = mixed_precision(&engine, &options, &progress);
    bar.finish_and_clear();
    let result = result?;

    print_curve(&result, out).context("writing to stdout")?;
    let written = write_mixed_precision(engine.model(), &result, &args.save_dir)?;
    for path in &written {
        writeln!(out, "wrote {}", path.display()).context("writing to stdout")?;
    }
    if !result.reached {
        anyhow::bail!(
            "target {} {} cannot be met with {}: best found is {} with {} node(s) promoted to {} ({}); no model written",
            comparison(&result),
            format_value(result.target),
            limit(&result),
            format_value(result.final_value()),
            result.chosen,
            result.qtype,
            if result.chosen == 0 {
                "none".to_string()
            } else {
                result.promoted_nodes().join(", ")
            },
        );
    }
    Ok(())
}

fn comparison(result: &MixedPrecision) -> &'static str {
    if result.metric.worse_is_lower() {
        ">="
    } else {
        "<="
    }
}

/// What stopped an unsuccessful search.
fn limit(result: &MixedPrecision) -> String {
    match result.budget {
        Some(b) if b < result.candidates => format!("the budget of {b} node(s)"),
        _ => format!(
            "all {} quantized node(s) with something to promote",
            result.candidates
        ),
    }
}

fn print_curve(result: &MixedPrecision, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{} on {} ({} sample(s)); target {} {}; promoting to {}; {} candidate node(s)",
        result.metric,
        result.compared.join(", "),
        result.data_num,
        comparison(result),
        format_value(result.target),
        result.qtype,
        result.candidates,
    )?;
    let width = result
        .curve
        .iter()
        .filter_map(|s| s.node.as_ref().map(|n| n.chars().count()))
        .max()
        .unwrap_or(0)
        .max("(calibrated)".len());
    writeln!(
        out,
        "{:>4}  {:<width$}  {:>11}  {}",
        "k", "node", "sensitivity", result.metric
    )?;
    for step in &result.curve {
        let mark = if step.promoted == result.chosen {
            if result.reached {
                "  <- target"
            } else {
                "  <- best"
            }
        } else {
            ""
        };
        writeln!(
            out,
            "{:>4}  {:<width$}  {:>11}  {}{mark}",
            step.promoted,
            step.node.as_deref().unwrap_or("(calibrated)"),
            step.sensitivity.map(format_value).unwrap_or_default(),
            format_value(step.value),
        )?;
    }
    if result.reached {
        writeln!(
            out,
            "target reached: {} {} with {} node(s) promoted to {} (calibrated: {})",
            result.metric,
            format_value(result.final_value()),
            result.chosen,
            result.qtype,
            format_value(result.calibrated_value()),
        )?;
    }
    Ok(())
}
