//! `hmct-debugger sensitivity-analysis MODEL DATA`: single-node quantization and
//! cumulative de-quantization of the sensitive nodes (DEBUGGER.md §7).
//!
//! Writes `partial_quantization.png` and `partial_quantization.json` into the save
//! folder (`-sd`/`--save_dir`, default `./debug_result/`) and prints the series.
//! The seeds' `-sn`/`-sd` reach clap as `--sn`/`--sd` (main.rs rewrites the
//! multi-letter single-dash flags), aliases of `--sensitive_nodes`/`--save_dir`. Argument mistakes (unknown or unquantized
//! nodes, a bad metric or qtype, a `data_num` beyond the data) exit with status 2;
//! an unwritable folder exits with 1; in both cases nothing is left in the folder.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use hmct_cli::listarg::{ListArg, parse_list};
use hmct_debug::sensitivity::parse_metrics;
use hmct_debug::sensitivity_analysis::{
    DequantQType, SensitivityAnalysis, SensitivityAnalysisOptions, Stage, sensitivity_analysis,
    write_partial_quantization,
};
use hmct_metrics::{Table, format_value};

use crate::common::{self, OutputFolder, usage};

/// Arguments of `sensitivity-analysis`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub input: crate::common::ModelData,
    /// Without --sn: analyse the regular nodes whose cosine sensitivity is at most this.
    #[arg(
        short = 'p',
        long = "pick_threshold",
        visible_alias = "pick-threshold",
        default_value_t = 0.999
    )]
    pub pick_threshold: f64,
    /// Use the first N samples, for the ranking and the series.
    #[arg(
        short = 'd',
        long = "data_num",
        visible_alias = "data-num",
        default_value_t = 1
    )]
    pub data_num: usize,
    /// The nodes to analyse, in order (the seeds' -sn), e.g. "['Conv_2','Conv_7']";
    /// skips the sensitivity ranking.
    #[arg(
        long = "sensitive_nodes",
        visible_aliases = ["sensitive-nodes", "sn"],
        value_name = "LIST"
    )]
    pub sensitive_nodes: Option<String>,
    /// Folder for partial_quantization.png and .json (the seeds' -sd).
    #[arg(
        long = "save_dir",
        visible_aliases = ["save-dir", "sd"],
        value_name = "DIR",
        default_value = "./debug_result/"
    )]
    pub save_dir: PathBuf,
    /// Metric of the series (cosine-similarity, mse, mre, sqnr, chebyshev).
    #[arg(short = 'm', long = "metric", default_value = "cosine-similarity")]
    pub metric: String,
    /// What de-quantizing a node means: float32 (calibration OFF) or int16.
    #[arg(short = 'q', long = "qtype", default_value = "float32")]
    pub qtype: String,
    /// Also write the result as JSON here.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    #[command(flatten)]
    pub engine: crate::common::EngineArgs,
}

fn parse(args: &Args) -> Result<SensitivityAnalysisOptions> {
    let metric = match parse_list(&args.metric).map_err(|e| usage(format!("--metric: {e}")))? {
        ListArg::Flat(names) if names.len() == 1 => parse_metrics(&names).map_err(usage)?[0],
        _ => return Err(usage("--metric takes one metric")),
    };
    let qtype: DequantQType = args.qtype.parse().map_err(usage)?;
    let sensitive_nodes = match &args.sensitive_nodes {
        None => Vec::new(),
        Some(v) => match parse_list(v).map_err(|e| usage(format!("--sensitive_nodes: {e}")))? {
            ListArg::Flat(names) if !names.is_empty() => names,
            ListArg::Flat(_) => return Err(usage("--sensitive_nodes: the list is empty")),
            ListArg::Nested(_) => {
                return Err(usage(format!(
                    "--sensitive_nodes takes a flat list, got `{v}`"
                )));
            }
        },
    };
    if args.data_num == 0 {
        return Err(usage("data_num must be at least 1"));
    }
    if !args.pick_threshold.is_finite() {
        return Err(usage("pick_threshold must be a finite number"));
    }
    Ok(SensitivityAnalysisOptions {
        pick_threshold: args.pick_threshold,
        data_num: Some(args.data_num),
        sensitive_nodes,
        metric,
        qtype,
    })
}

pub fn run(args: &Args, out: &mut dyn Write) -> Result<()> {
    let options = parse(args)?;
    let engine = common::open_engine(&args.input, args.engine.threads, args.engine.cache_mb)?;

    // Fail on an unwritable folder before the analysis, not after it.
    let folder = OutputFolder::prepare(&args.save_dir)?;
    let bar = common::progress_bar("{msg} {bar:30} {pos}/{len} runs ({elapsed}, eta {eta})");
    let progress = |stage: Stage, _done: usize, total: usize| {
        let message = match stage {
            Stage::Ranking => "ranking",
            Stage::Series => "series",
        };
        if bar.message() != message {
            bar.set_message(message);
            bar.set_position(0);
        }
        bar.set_length(total as u64);
        bar.inc(1);
    };
    let result = sensitivity_analysis(&engine, &options, &progress);
    bar.finish_and_clear();
    let result = match result {
        Ok(r) => r,
        Err(e) => {
            folder.discard();
            return Err(e.into());
        }
    };
    let written = folder.write_figures_and_json(args.json.as_deref(), &result, || {
        write_partial_quantization(&result, &args.save_dir)
    })?;
    out.write_all(series_table(&result).render().as_bytes())
        .context("writing to stdout")?;
    for path in written {
        writeln!(out, "wrote {}", path.display()).context("writing to stdout")?;
    }
    Ok(())
}

/// The series as a table: `none` (the calibrated model) and one row per node.
fn series_table(result: &SensitivityAnalysis) -> Table {
    let metric = result.metric.name();
    let header = vec![
        "node".to_string(),
        "sensitivity".to_string(),
        format!("single ({metric})"),
        format!("cumulative ({metric})"),
    ];
    let mut table = Table::new(
        format!(
            "partial quantization (baseline {}, de-quantized to {}, {} sample(s))",
            format_value(result.baseline),
            result.qtype,
            result.data_num
        ),
        header,
    );
    let rows = std::iter::once(vec![
        "none".to_string(),
        String::new(),
        String::new(),
        format_value(result.calibrated),
    ])
    .chain(result.nodes.iter().map(|n| {
        vec![
            n.name.clone(),
            n.sensitivity.map(format_value).unwrap_or_default(),
            format_value(n.single),
            format_value(n.cumulative),
        ]
    }));
    for row in rows {
        table.push_row(row).expect("one cell per column");
    }
    table
}
