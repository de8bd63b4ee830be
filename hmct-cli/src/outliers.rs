//! `hmct-debugger outliers MODEL DATA`: per activation calibration node, the share of
//! sparse channels and of channels whose max sits 3..6 binary orders below the
//! tensor's max, flagging tensors where per-tensor int8 wastes most of its range
//! (definitions in `hmct_debug::outliers`). Prints the table; `--json FILE` writes
//! the result.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use hmct_debug::outliers::{OutliersOptions, outliers};

use crate::UsageError;
use crate::common;

/// Arguments of `outliers`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub input: crate::common::ModelData,
    /// Use the first N samples; ratios are averaged over them.
    #[arg(
        short = 'd',
        long = "data_num",
        visible_alias = "data-num",
        default_value_t = 1
    )]
    pub data_num: usize,
    /// Channel axis of the activations (negative counts from the end).
    #[arg(
        short = 'a',
        long = "axis",
        default_value_t = 1,
        allow_negative_numbers = true
    )]
    pub axis: i64,
    /// Flag a tensor when at least this share of its channels is at level >= 3.
    #[arg(
        long = "flag_ratio",
        visible_alias = "flag-ratio",
        default_value_t = 0.5
    )]
    pub flag_ratio: f64,
    /// Also write the result as JSON here.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    #[command(flatten)]
    pub engine: crate::common::EngineArgs,
}

pub fn run(args: &Args, out: &mut dyn Write) -> Result<()> {
    if args.data_num == 0 {
        return Err(UsageError("data_num must be at least 1".into()).into());
    }
    if !(0.0..=1.0).contains(&args.flag_ratio) {
        return Err(UsageError(format!(
            "flag_ratio must be between 0 and 1, got {}",
            args.flag_ratio
        ))
        .into());
    }
    let engine = common::open_engine(&args.input, args.engine.threads, args.engine.cache_mb)?;
    let bar = common::progress_bar("samples {bar:30} {pos}/{len} ({elapsed}, eta {eta})");
    let progress = |_done: usize, total: usize| {
        bar.set_length(total as u64);
        bar.inc(1);
    };
    let result = outliers(
        &engine,
        &OutliersOptions {
            data_num: Some(args.data_num),
            axis: args.axis,
            flag_ratio: args.flag_ratio,
        },
        &progress,
    );
    bar.finish_and_clear();
    let result = result?;
    if let Some(path) = &args.json {
        crate::common::write_json(path, &result)?;
    }
    out.write_all(result.table().render().as_bytes())
        .context("writing to stdout")?;
    let flagged = result.rows.iter().filter(|r| r.flagged).count();
    writeln!(
        out,
        "level >= k: the channel's max is at most 1/2^k of the tensor's, so per-tensor quantization leaves it k bits fewer. * = at least {} of the channels at level >= 3 ({flagged} of {} tensors). {} sample(s), channel axis {}.",
        args.flag_ratio,
        result.rows.len(),
        result.data_num,
        result.axis
    )
    .context("writing to stdout")?;
    for s in &result.skipped {
        writeln!(out, "skipped {}: {}", s.name, s.reason).context("writing to stdout")?;
    }
    Ok(())
}
