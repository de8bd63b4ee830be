//! `hmct-debugger precision-table MODEL DATA`: per quantized regular node, cosine and
//! MSE against the float model end-to-end (the calibrated model) and per layer (the
//! node alone on float inputs), with the amplification between them (defined in
//! `hmct_debug::precision_table`). Prints the table; `--json FILE` writes the result.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};
use hmct_debug::engine::{Engine, EngineError, EngineOptions};
use hmct_debug::precision_table::{PrecisionTableOptions, precision_table};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::UsageError;

/// Arguments of `precision-table`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The calibrated ONNX model.
    pub model: PathBuf,
    /// Calibration-data folder: one sub-folder per model input with 0.npy, 1.npy, ...
    pub data: PathBuf,
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
    /// Worker threads (0 = all cores). Results do not depend on it.
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Memory for cached activations in MB (default: half the available memory).
    #[arg(long = "cache-mb", visible_alias = "cache_mb", value_name = "MB")]
    pub cache_mb: Option<usize>,
}

pub fn run(args: &Args, out: &mut dyn Write) -> Result<()> {
    if args.data_num == 0 {
        return Err(UsageError("data_num must be at least 1".into()).into());
    }
    let model = hmct_ir::load_model(&args.model)?;
    let cache_bytes = args
        .cache_mb
        .unwrap_or_else(default_cache_mb)
        .saturating_mul(1 << 20);
    let engine = Engine::new(
        model,
        &args.data,
        &EngineOptions {
            threads: args.threads,
            cache_bytes: Some(cache_bytes),
        },
    )
    .with_context(|| format!("{}", args.model.display()))?;
    let bar = progress_bar();
    let progress = |_done: usize, total: usize| {
        bar.set_length(total as u64);
        bar.inc(1);
    };
    let result = precision_table(
        &engine,
        &PrecisionTableOptions {
            data_num: Some(args.data_num),
        },
        &progress,
    );
    bar.finish_and_clear();
    let result = result.map_err(|e| match e {
        EngineError::DataNum { .. } | EngineError::ZeroDataNum => UsageError(e.to_string()).into(),
        e => anyhow::Error::from(e),
    })?;
    if let Some(path) = &args.json {
        let mut json = serde_json::to_vec_pretty(&result)?;
        json.push(b'\n');
        hmct_ir::write_atomic(path, &json)?;
    }
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

fn progress_bar() -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr()).with_style(
        ProgressStyle::with_template("probing {bar:30} {pos}/{len} runs ({elapsed}, eta {eta})")
            .expect("a valid template"),
    )
}

/// Half the available memory, from /proc/meminfo; 2 GB when unknown.
fn default_cache_mb() -> usize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<usize>().ok())
        })
        .map_or(2048, |kb| kb / 1024 / 2)
}
