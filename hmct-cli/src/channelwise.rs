//! `hmct-debugger get-channelwise-data-distribution MODEL DATA -n LIST`: one box per
//! channel of calibration nodes' inputs (DEBUGGER.md §6).
//!
//! Per node, `<node>_boxplot.png` and `<node>_channel_stats.csv` (channel, count, min,
//! q1, median, mean, q3, max, max|x|) go to the save folder (`-s`, default
//! `./debug_result/`); a line per node names the channels with the largest range.
//! The channel axis is the node's `axis` for weights (0 when absent) and 1 for
//! activations; `-a` overrides it. Activations pool every sample (`-d N`: the first N).
//! A regular node, an unknown node or an axis out of range exits with status 2 and an
//! unwritable folder with 1, before anything is written.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use hmct_cli::listarg::parse_list;
use hmct_debug::channelwise::{
    ChannelwiseItem, ChannelwiseOptions, get_channelwise_data_distribution, write_channelwise,
};

use crate::common::{OutputFolder, open_engine, parse_format, usage};

/// Arguments of `get-channelwise-data-distribution`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub input: crate::common::ModelData,
    /// Calibration nodes (weight or activation), e.g. "['471_HzCalibration']".
    #[arg(
        short = 'n',
        long = "nodes_list",
        visible_alias = "nodes-list",
        value_name = "LIST"
    )]
    pub nodes_list: String,
    /// The channel axis for every node (negative counts from the end). Default: the
    /// node's axis for weights (0 when absent), 1 for activations.
    #[arg(short = 'a', long = "axis", allow_negative_numbers = true)]
    pub axis: Option<i64>,
    /// Pool the values of the first N samples (default: all).
    #[arg(short = 'd', long = "data_num", visible_alias = "data-num")]
    pub data_num: Option<usize>,
    /// Folder for the box plots and CSV files.
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
    /// Also write the statistics as JSON here.
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
    let format = parse_format(&args.format)?;
    let engine = open_engine(&args.input, args.workers.threads, Some(0))?;
    let folder = OutputFolder::prepare(&args.save_dir)?;
    let options = ChannelwiseOptions {
        nodes,
        axis: args.axis,
        data_num: args.data_num,
        ..ChannelwiseOptions::default()
    };
    let result = match get_channelwise_data_distribution(&engine, &options) {
        Ok(r) => r,
        Err(e) => {
            folder.discard();
            return Err(e.into());
        }
    };
    let written = folder.write_figures_and_json(args.json.as_deref(), &result, || {
        write_channelwise(&result, &args.save_dir, format)
    })?;
    for item in &result.items {
        writeln!(out, "{}", describe(item)).context("writing to stdout")?;
    }
    for path in written {
        writeln!(out, "wrote {}", path.display()).context("writing to stdout")?;
    }
    Ok(())
}

/// `node: 96 channels on axis 0 of [96, 3, 3, 3]; max |x| 3.2 (channel 12), median
/// channel max |x| 0.41`: how uneven the channels are, which is what decides
/// whether per-tensor quantization wastes range.
fn describe(item: &ChannelwiseItem) -> String {
    let mut maxes: Vec<(f64, usize)> = item
        .channels
        .iter()
        .map(|c| (c.max_abs, c.channel))
        .filter(|(m, _)| m.is_finite())
        .collect();
    maxes.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut text = format!(
        "{}: {} channels on axis {} of {:?}",
        item.node,
        item.channels.len(),
        item.axis,
        item.shape
    );
    if let Some(&(top, channel)) = maxes.first() {
        let median = maxes[maxes.len() / 2].0;
        text.push_str(&format!(
            "; max |x| {top:.5} (channel {channel}), median channel max |x| {median:.5}"
        ));
    }
    text
}
