//! `hmct-debugger plot-distribution MODEL DATA -n LIST`: value histograms of
//! calibration nodes' inputs, weights before and after fake quantization, and regular
//! nodes' outputs in the float and calibrated models with their difference
//! (DEBUGGER.md §5), over every sample (`-d N`: the first N).
//!
//! One figure per node (per output for regular nodes) goes to the save folder (`-s`,
//! default `./debug_result/`): `activation_<node>.png`, `weight_<node>.png`,
//! `node_output_<tensor>_of_<node>.png`; a line per figure says what it shows.
//! Unknown nodes exit with status 2 and an unwritable folder with 1, before anything
//! is written.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use hmct_cli::listarg::parse_list;
use hmct_debug::distribution::{
    DistributionItem, DistributionKind, DistributionOptions, plot_distribution, write_distribution,
};

use crate::common::{OutputFolder, open_engine, parse_format, usage};

/// Arguments of `plot-distribution`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub input: crate::common::ModelData,
    /// Nodes to plot, in any mix: activation calibration nodes, weight calibration
    /// nodes, regular nodes. E.g. "['317_HzCalibration','Conv_2']".
    #[arg(
        short = 'n',
        long = "nodes_list",
        visible_alias = "nodes-list",
        value_name = "LIST"
    )]
    pub nodes_list: String,
    /// Pool the values of the first N samples (default: all).
    #[arg(short = 'd', long = "data_num", visible_alias = "data-num")]
    pub data_num: Option<usize>,
    /// Folder for the figures.
    #[arg(
        short = 's',
        long = "save_dir",
        visible_alias = "save-dir",
        value_name = "DIR",
        default_value = "./debug_result/"
    )]
    pub save_dir: PathBuf,
    /// Histogram bins.
    #[arg(long, default_value_t = 100)]
    pub bins: usize,
    /// Figure format: png or svg.
    #[arg(long, default_value = "png")]
    pub format: String,
    /// Also write the result (statistics and histogram counts) as JSON here.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    #[command(flatten)]
    pub workers: crate::common::Threads,
}

pub fn run(args: &Args, out: &mut dyn Write) -> Result<()> {
    let nodes: Vec<String> = parse_list(&args.nodes_list)
        .map_err(|e| usage(format!("--nodes_list: {e}")))?
        .names()
        .into_iter()
        .map(str::to_string)
        .collect();
    if nodes.is_empty() {
        return Err(usage("--nodes_list is empty"));
    }
    if args.bins == 0 {
        return Err(usage("--bins must be at least 1"));
    }
    let format = parse_format(&args.format)?;
    let engine = open_engine(&args.input, args.workers.threads, Some(0))?;
    let folder = OutputFolder::prepare(&args.save_dir)?;
    let options = DistributionOptions {
        nodes,
        bins: args.bins,
        data_num: args.data_num,
    };
    let result = match plot_distribution(&engine, &options) {
        Ok(r) => r,
        Err(e) => {
            folder.discard();
            return Err(e.into());
        }
    };
    let written = folder.write_figures_and_json(args.json.as_deref(), &result, || {
        write_distribution(&result, &args.save_dir, format)
    })?;
    for (item, path) in result.items.iter().zip(&written) {
        writeln!(out, "wrote {}: {}", path.display(), describe(item))
            .context("writing to stdout")?;
    }
    Ok(())
}

/// The numbers a reader looks for in the figure.
fn describe(item: &DistributionItem) -> String {
    let first = &item.panels[0];
    let s = &first.series[0].summary;
    match item.kind {
        DistributionKind::Activation => {
            let threshold = first
                .threshold
                .map_or("none".to_string(), |t| format!("{t:.5}"));
            format!(
                "input {} {:?}, max |x| {:.5}, threshold {threshold}",
                item.tensor, item.shape, s.max_abs
            )
        }
        DistributionKind::Weight => format!(
            "weight {} {:?}, max |w| {:.5}, cosine {}",
            item.tensor,
            item.shape,
            s.max_abs,
            item.cosine.map_or("n/a".to_string(), |c| format!("{c:.6}"))
        ),
        DistributionKind::Node => {
            let err = item
                .panels
                .get(1)
                .map_or(f64::NAN, |p| p.series[0].summary.max_abs);
            format!(
                "output {} {:?}, cosine {}, max |error| {err:.5}",
                item.tensor,
                item.shape,
                item.cosine.map_or("n/a".to_string(), |c| format!("{c:.6}"))
            )
        }
    }
}
