//! `hmct-debugger plot-acc-error MODEL DATA`: accumulated-error curves along the graph
//! for partially quantized models (DEBUGGER.md §4).
//!
//! `-q LIST` quantizes only the listed nodes (a flat list: one curve per node; a
//! nested list: one curve per group plus the calibrated model; `['weight']`,
//! `['activation']` or `['weight','activation']`: only weights / activations);
//! `-nq LIST` (also `--nq`, `--non_quantize_node`) un-quantizes them in the
//! calibrated model instead. Both may be given: one figure each. Each figure goes to
//! the save folder (`-s`, default `./debug_result/`) as `<prefix>_<metric>.png` with
//! its series in `<prefix>_<metric>.json`; the last value of every curve is printed.
//! Argument mistakes (neither `-q` nor `-nq`, unknown nodes or metric, `weight` in
//! `-nq`) exit with status 2 and an unwritable folder with 1, before anything is
//! written.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use hmct_cli::listarg::{ListArg, parse_bool, parse_list};
use hmct_debug::acc_error::{AccErrorCurves, AccErrorOptions, plot_acc_error, write_acc_error};
use hmct_debug::sensitivity::parse_metrics;
use hmct_metrics::{Metric, Table, format_value};

use crate::common::{self, OutputFolder, node_list, open_engine, parse_format, usage};

/// Arguments of `plot-acc-error`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub input: crate::common::ModelData,
    /// Quantize only these nodes, the rest float: "['Conv_2','Conv_9']" (one curve
    /// each), "[['Conv_2'],['Conv_2','Conv_9']]" (one curve per group), or
    /// "['weight','activation']".
    #[arg(
        short = 'q',
        long = "quantize_node",
        visible_alias = "quantize-node",
        value_name = "LIST"
    )]
    pub quantize_node: Option<String>,
    /// Un-quantize these nodes, the rest quantized (the seeds' -nq); flat or nested
    /// as for -q.
    #[arg(
        long = "non_quantize_node",
        visible_aliases = ["non-quantize-node", "nq"],
        value_name = "LIST"
    )]
    pub non_quantize_node: Option<String>,
    /// Metric of the curves (cosine-similarity, mse, mre, sqnr, chebyshev).
    #[arg(
        short = 'm',
        long = "metric",
        visible_alias = "metrics",
        default_value = "cosine-similarity"
    )]
    pub metric: String,
    /// Plot the running mean of each curve (True/False; a bare -a means True).
    #[arg(
        short = 'a',
        long = "average_mode",
        visible_alias = "average-mode",
        num_args = 0..=1,
        default_missing_value = "True",
        value_name = "BOOL"
    )]
    pub average_mode: Option<String>,
    /// Average the curves over the first N samples (default: the first sample only).
    #[arg(short = 'd', long = "data_num", visible_alias = "data-num")]
    pub data_num: Option<usize>,
    /// Folder for the figures and their series.
    #[arg(
        short = 's',
        long = "save_dir",
        visible_alias = "save-dir",
        value_name = "DIR",
        default_value = "./debug_result/"
    )]
    pub save_dir: PathBuf,
    /// Figure format: png or svg.
    #[arg(long, default_value = "png")]
    pub format: String,
    /// Also write the whole result as JSON here.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    #[command(flatten)]
    pub engine: crate::common::EngineArgs,
}

fn parse(args: &Args) -> Result<AccErrorOptions> {
    if args.quantize_node.is_none() && args.non_quantize_node.is_none() {
        return Err(usage(
            "give -q/--quantize_node or -nq/--non_quantize_node (or both)",
        ));
    }
    let metric = parse_metric(&args.metric)?;
    let average_mode = match &args.average_mode {
        Some(v) => parse_bool(v).map_err(|e| usage(format!("--average_mode: {e}")))?,
        None => false,
    };
    if args.data_num == Some(0) {
        return Err(usage("data_num must be at least 1"));
    }
    parse_format(&args.format)?;
    Ok(AccErrorOptions {
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
        metric,
        average_mode,
        data_num: args.data_num,
    })
}

/// One metric name (a one-element list is accepted too).
fn parse_metric(value: &str) -> Result<Metric> {
    let names = match parse_list(value).map_err(|e| usage(format!("--metric: {e}")))? {
        ListArg::Flat(names) => names,
        ListArg::Nested(_) => {
            return Err(usage(format!("--metric takes one metric, got `{value}`")));
        }
    };
    if names.len() > 1 {
        return Err(usage(format!(
            "--metric takes one metric, got {}",
            names.len()
        )));
    }
    Ok(parse_metrics(&names).map_err(usage)?[0])
}

pub fn run(args: &Args, out: &mut dyn Write) -> Result<()> {
    let options = parse(args)?;
    let format = parse_format(&args.format)?;
    let engine = open_engine(&args.input, args.engine.threads, args.engine.cache_mb)?;
    // Fail on an unwritable folder before the analysis, not after it.
    let folder = OutputFolder::prepare(&args.save_dir)?;
    let bar = common::progress_bar("probing {bar:30} {pos}/{len} runs ({elapsed}, eta {eta})");
    let progress = |_done: usize, total: usize| {
        bar.set_length(total as u64);
        bar.inc(1);
    };
    let result = plot_acc_error(&engine, &options, &progress);
    bar.finish_and_clear();
    let result = match result {
        Ok(r) => r,
        Err(e) => {
            folder.discard();
            return Err(e.into());
        }
    };
    let written = folder.write_figures_and_json(args.json.as_deref(), &result, || {
        write_acc_error(&result, &args.save_dir, format)
    })?;
    out.write_all(summary_table(&result).render().as_bytes())
        .context("writing to stdout")?;
    for path in written {
        writeln!(out, "wrote {}", path.display()).context("writing to stdout")?;
    }
    Ok(())
}

/// Per curve: the value at the last point (the end of the graph) and the worst one.
fn summary_table(result: &AccErrorCurves) -> Table {
    let metric = result.metric;
    let what = if result.average_mode {
        format!("{metric}, running mean")
    } else {
        metric.to_string()
    };
    let mut table = Table::new(
        format!(
            "accumulated error ({what}, {} sample(s), {} points)",
            result.data_num,
            result.points.len()
        ),
        vec![
            "figure".into(),
            "curve".into(),
            "last point".into(),
            "worst".into(),
            "worst at".into(),
        ],
    );
    for figure in &result.figures {
        for curve in &figure.curves {
            let values = curve.plotted();
            let worst = hmct_metrics::rank_worst_first(metric, values)
                .first()
                .copied();
            table
                .push_row(vec![
                    figure.kind.prefix().to_string(),
                    curve.label.clone(),
                    values.last().map(|v| format_value(*v)).unwrap_or_default(),
                    worst.map(|i| format_value(values[i])).unwrap_or_default(),
                    worst
                        .map(|i| result.points[i].label.clone())
                        .unwrap_or_default(),
                ])
                .expect("one cell per column");
        }
    }
    table
}
