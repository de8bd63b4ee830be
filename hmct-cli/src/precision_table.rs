//! `hmct-debugger precision-table MODEL DATA`: per quantized regular node, cosine and
//! MSE against the float model end-to-end (the calibrated model) and per layer (the
//! node alone on float inputs), with the amplification between them (defined in
//! `hmct_debug::precision_table`). Prints the table; `--json FILE` writes the result.
//! `--shard I/N` computes one part of the rows into the part file given by `--json`;
//! `merge` puts the parts together.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use hmct_debug::precision_table::{PrecisionTable, PrecisionTableOptions, precision_table};

use crate::UsageError;
use crate::common;

/// Arguments of `precision-table`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub input: crate::common::ModelData,
    /// Use the first N samples; figures are averaged over them.
    #[arg(
        short = 'd',
        long = "data_num",
        visible_alias = "data-num",
        default_value_t = 1
    )]
    pub data_num: usize,
    /// Also write the result as JSON here.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Compute part I of N of the rows (1-based), balanced by estimated cost, into
    /// the part file given by --json; `merge` puts the parts together.
    #[arg(long, value_name = "I/N")]
    pub shard: Option<String>,
    #[command(flatten)]
    pub engine: crate::common::EngineArgs,
}

pub fn run(args: &Args, out: &mut dyn Write) -> Result<()> {
    if args.data_num == 0 {
        return Err(UsageError("data_num must be at least 1".into()).into());
    }
    let shard = common::shard_arg(args.shard.as_deref(), args.json.is_some(), false)?;
    let engine = common::open_engine(&args.input, args.engine.threads, args.engine.cache_mb)?;
    let bar = common::progress_bar("probing {bar:30} {pos}/{len} runs ({elapsed}, eta {eta})");
    let progress = |_done: usize, total: usize| {
        bar.set_length(total as u64);
        bar.inc(1);
    };
    let result = precision_table(
        &engine,
        &PrecisionTableOptions {
            data_num: Some(args.data_num),
            shard,
        },
        &progress,
    );
    bar.finish_and_clear();
    let result = result?;
    if let Some(path) = &args.json {
        crate::common::write_json(path, &result)?;
    }
    print_table(&result, out)
}

/// The table and the line explaining it.
pub fn print_table(result: &PrecisionTable, out: &mut dyn Write) -> Result<()> {
    out.write_all(result.table().render().as_bytes())
        .context("writing to stdout")?;
    writeln!(
        out,
        "amp = end-to-end error / per-layer error (on 1-cosine and on mse): about 1 where a node creates its error, well above 1 where it passes on error from upstream; inf: the node alone adds none; -: no error either way. {} sample(s).",
        result.data_num
    )
    .context("writing to stdout")?;
    Ok(())
}
