//! `hmct-debugger runall MODEL DATA`: the whole debugging workflow into one result
//! folder (DEBUGGER.md §8; the steps and their files are in
//! `hmct_debug::runall`). The seeds' flags are accepted as written there (`-nm`,
//! `-dnl`, ...; main.rs turns them into the long forms).

use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

use anyhow::Result;
use hmct_cli::listarg::{ListArg, parse_bool};
use hmct_debug::health::Severity;
use hmct_debug::layout::HEALTH_NAME;
use hmct_debug::runall::{RunallOptions, runall};
use hmct_debug::sensitivity::{NodeType, parse_metrics};
use hmct_metrics::Metric;
use hmct_plot::Format;

use crate::common::{self, flat, list, node_list, usage};

/// Arguments of `runall`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub input: crate::common::ModelData,
    /// Result folder (created if missing; a re-run replaces runall's entries in it).
    #[arg(
        short = 's',
        long = "save_dir",
        visible_alias = "save-dir",
        default_value = "./debug_result",
        value_name = "DIR"
    )]
    pub save_dir: PathBuf,
    /// Sensitivity metric(s), sorted by the first, e.g. "['cosine-similarity','mse']".
    #[arg(long = "ns_metrics", visible_aliases = ["ns-metrics", "nm"], default_value = "cosine-similarity")]
    pub ns_metrics: String,
    /// Compare sensitivities on this regular node's outputs (or a list of nodes).
    #[arg(short = 'o', long = "output_node", visible_alias = "output-node")]
    pub output_node: Option<String>,
    /// node, weight or activation; default: weight, then activation.
    #[arg(long = "node_type", visible_aliases = ["node-type", "nt"])]
    pub node_type: Option<String>,
    /// Samples for the rankings and the sensitivity analysis (default: all).
    #[arg(long = "data_num", visible_aliases = ["data-num", "dn"])]
    pub data_num: Option<usize>,
    /// Print the sensitivity tables (True/False; a bare -v means True).
    #[arg(short = 'v', long = "verbose", num_args = 0..=1, default_missing_value = "True", value_name = "BOOL")]
    pub verbose: Option<String>,
    /// Only these sensitivity candidates (overrides the node type); nested lists are
    /// quantized together.
    #[arg(
        short = 'i',
        long = "interested_nodes",
        visible_alias = "interested-nodes"
    )]
    pub interested_nodes: Option<String>,
    /// Nodes whose distributions to plot (default: the top 5 of each ranking).
    #[arg(long = "dis_nodes_list", visible_aliases = ["dis-nodes-list", "dnl"])]
    pub dis_nodes_list: Option<String>,
    /// Calibration nodes whose per-channel box plots to draw (default: those of the
    /// distributions).
    #[arg(long = "cw_nodes_list", visible_aliases = ["cw-nodes-list", "cn"])]
    pub cw_nodes_list: Option<String>,
    /// Channel axis of the box plots (default: 1 for activations, the node's axis for
    /// weights).
    #[arg(short = 'a', long = "axis", allow_negative_numbers = true)]
    pub axis: Option<i64>,
    /// Accumulated error: nodes to quantize alone (flat) or together (nested), or
    /// weight / activation; default "['weight','activation']".
    #[arg(long = "quantize_node", visible_aliases = ["quantize-node", "qn"])]
    pub quantize_node: Option<String>,
    /// Accumulated error: nodes to de-quantize from the calibrated model.
    #[arg(long = "non_quantize_node", visible_aliases = ["non-quantize-node", "nqn"])]
    pub non_quantize_node: Option<String>,
    /// Accumulated-error metric.
    #[arg(long = "ae_metric", visible_aliases = ["ae-metric", "am"], default_value = "cosine-similarity")]
    pub ae_metric: String,
    /// Plot running means of the accumulated error (True/False).
    #[arg(long = "average_mode", visible_aliases = ["average-mode", "avm"], default_value = "False")]
    pub average_mode: String,
    /// Sensitivity analysis: regular nodes whose cosine sensitivity is at most this.
    #[arg(long = "pick_threshold", visible_aliases = ["pick-threshold", "pt"], default_value_t = 0.999)]
    pub pick_threshold: f64,
    /// Sensitivity analysis: these nodes instead of picking them.
    #[arg(long = "sensitive_nodes", visible_aliases = ["sensitive-nodes", "sn"])]
    pub sensitive_nodes: Option<String>,
    /// Picture format: png or svg.
    #[arg(long, default_value = "png", value_parser = ["png", "svg"])]
    pub format: String,
    /// Write report.html, one self-contained page over the results (True/False).
    #[arg(long, default_value = "True", value_name = "BOOL")]
    pub report: String,
    /// Also write summary.json's content here.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    #[command(flatten)]
    pub engine: crate::common::EngineArgs,
}

fn boolean(flag: &str, value: &str) -> Result<bool> {
    parse_bool(value).map_err(|e| usage(format!("{flag}: {e}")))
}

fn options(args: &Args) -> Result<(RunallOptions, bool)> {
    let ns_metrics = parse_metrics(&flat("--ns_metrics", &args.ns_metrics)?).map_err(usage)?;
    let ae_metric: Metric = args
        .ae_metric
        .parse()
        .map_err(|e| usage(format!("--ae_metric: {e}")))?;
    let node_type = match &args.node_type {
        Some(t) => Some(t.parse::<NodeType>().map_err(usage)?),
        None => None,
    };
    if args.data_num == Some(0) {
        return Err(usage("data_num must be at least 1"));
    }
    let opt_flat = |flag: &str, v: &Option<String>| -> Result<Option<Vec<String>>> {
        v.as_deref().map(|v| flat(flag, v)).transpose()
    };
    let verbose = match &args.verbose {
        Some(v) => boolean("--verbose", v)?,
        None => false,
    };
    let options = RunallOptions {
        ns_metrics,
        output_nodes: opt_flat("--output_node", &args.output_node)?.unwrap_or_default(),
        node_type,
        data_num: args.data_num,
        interested_nodes: args
            .interested_nodes
            .as_deref()
            .map(|v| list("--interested_nodes", v).map(ListArg::into_groups))
            .transpose()?,
        dis_nodes_list: opt_flat("--dis_nodes_list", &args.dis_nodes_list)?,
        cw_nodes_list: opt_flat("--cw_nodes_list", &args.cw_nodes_list)?,
        axis: args.axis,
        quantize_node: args
            .quantize_node
            .as_deref()
            .map(|v| node_list("--quantize_node", v))
            .transpose()?,
        non_quantize_node: args
            .non_quantize_node
            .as_deref()
            .map(|v| node_list("--non_quantize_node", v))
            .transpose()?,
        ae_metric,
        average_mode: boolean("--average_mode", &args.average_mode)?,
        pick_threshold: args.pick_threshold,
        sensitive_nodes: opt_flat("--sensitive_nodes", &args.sensitive_nodes)?.unwrap_or_default(),
        format: if args.format == "svg" {
            Format::Svg
        } else {
            Format::Png
        },
        report: boolean("--report", &args.report)?,
    };
    Ok((options, verbose))
}

pub fn run(args: &Args, out: &mut dyn Write) -> Result<()> {
    let (options, verbose) = options(args)?;
    let engine = common::open_engine(&args.input, args.engine.threads, args.engine.cache_mb)?;

    let bar = common::progress_bar("{msg:26} {bar:30} {pos}/{len} ({elapsed})");
    let current = Mutex::new(String::new());
    let progress = |step: &str, _done: usize, total: usize| {
        let mut current = current.lock().unwrap_or_else(|e| e.into_inner());
        if *current != step {
            *current = step.to_string();
            bar.set_message(step.to_string());
            bar.set_position(0);
            bar.set_length(total as u64);
            if total <= 1 {
                return;
            }
        }
        bar.set_length(total as u64);
        bar.inc(1);
    };
    let command: Vec<String> = std::env::args().collect();
    // runall cleans its own staging folder; the save folder itself is ours to remove
    // when this run created it and failed.
    let folder = common::OutputFolder::prepare(&args.save_dir)?;
    let result = runall(&engine, &options, &args.save_dir, Some(command), &progress);
    bar.finish_and_clear();
    if result.is_err() {
        folder.discard();
    }
    let summary = result?;

    // Findings go to stderr with the progress, so stdout stays the run's summary.
    let health = &summary.health_report;
    for f in health
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Warning)
    {
        eprintln!("warning: {}: {}", f.node, f.message);
    }
    if health.infos > 0 {
        let besides = if health.warnings > 0 {
            " besides the warnings"
        } else {
            ""
        };
        eprintln!(
            "health: {} note(s){besides}, in {}",
            health.infos, HEALTH_NAME
        );
    }

    if verbose {
        for ranking in &summary.rankings {
            out.write_all(ranking.table().render().as_bytes())?;
            writeln!(out)?;
        }
    }
    for step in &summary.steps {
        writeln!(
            out,
            "{:<26} {:>7.1} s  {} file(s)",
            step.name,
            step.seconds,
            step.files.len()
        )?;
    }
    if let (Some(calibrated), Some(float)) = (summary.calibrated_metric, summary.float_metric) {
        writeln!(
            out,
            "calibrated model: cosine-similarity {calibrated:.6} on the outputs (float model {float:.6})"
        )?;
    }
    if !summary.sensitive_nodes.is_empty() {
        writeln!(
            out,
            "sensitive nodes (cosine sensitivity <= {}): {}",
            options.pick_threshold,
            summary.sensitive_nodes.join(", ")
        )?;
    }
    if let Some(report) = &summary.report {
        writeln!(out, "report: {}", args.save_dir.join(report).display())?;
    }
    writeln!(
        out,
        "results in {} (index: summary.json), {:.1} s in all",
        args.save_dir.display(),
        summary.seconds
    )?;
    if let Some(path) = &args.json {
        crate::common::write_json(path, &summary)?;
    }
    Ok(())
}
