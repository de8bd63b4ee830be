//! `hmct-debugger`: the command-line front end. One module per sub-command; this
//! file only parses arguments, dispatches, and turns errors into one line and an
//! exit status (1 for failures; clap exits with 2 for usage errors).

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod acc_error;
mod calibrate;
mod channelwise;
mod common;
mod distribution;
mod export_qdq;
mod info;
mod make_data;
mod merge;
mod mixed_precision;
mod modify;
mod outliers;
mod precision_table;
mod report;
mod run;
mod runall;
mod sensitivity;
mod sensitivity_analysis;
mod summary;

/// Large buffers on cache lines: the kernels' 64-byte vectors then touch one line each.
#[global_allocator]
static ALLOC: hmct_quant::CacheLineAlloc = hmct_quant::CacheLineAlloc;

#[derive(Debug, Parser)]
#[command(
    name = "hmct-debugger",
    version,
    about = "Accuracy debugging for quantized ONNX models with HzCalibration nodes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Model facts and a table of the calibration nodes.
    Summary(summary::Args),
    /// Run a model on every sample of a calibration-data folder.
    Run(run::RunArgs),
    /// Calibrate a float model: insert HzCalibration nodes with thresholds from data.
    Calibrate(calibrate::Args),
    /// Compare the calibrated model with the float model on one sample or a data folder.
    Info(info::Args),
    /// Turn a folder of PNG/JPEG images into a calibration-data folder.
    MakeData(make_data::Args),
    /// Rank nodes by how much quantizing each alone degrades the outputs.
    GetSensitivityOfNodes(sensitivity::Args),
    /// Accumulated-error curves along the graph for partially quantized models.
    PlotAccError(acc_error::Args),
    /// Histograms of calibration nodes' inputs and regular nodes' outputs.
    PlotDistribution(distribution::Args),
    /// Per-channel box plots of calibration nodes' inputs.
    GetChannelwiseDataDistribution(channelwise::Args),
    /// Single-node quantization and cumulative de-quantization of the sensitive nodes.
    SensitivityAnalysis(sensitivity_analysis::Args),
    /// Per-node end-to-end and per-layer error, with the amplification between them.
    PrecisionTable(precision_table::Args),
    /// Per-activation outlier-channel statistics: how much range per-tensor int8 wastes.
    Outliers(outliers::Args),
    /// The whole debugging workflow in one command, into one result folder.
    Runall(runall::Args),
    /// Edit calibration nodes: precision, thresholds, switches, sub-graphs, quant_config.
    Modify(modify::Args),
    /// Search a small set of nodes to promote to higher precision to reach a target.
    MixedPrecision(mixed_precision::Args),
    /// Export standard QuantizeLinear/DequantizeLinear ONNX.
    ExportQdq(export_qdq::Args),
    /// One self-contained HTML page over a runall result folder.
    Report(report::Args),
    /// Put the parts of `--shard I/N` runs back together into the whole result.
    Merge(merge::Args),
}

/// A mistake in the command line found after parsing (an unknown name, a bad
/// value): reported like clap's own usage errors, with exit status 2.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn main() -> ExitCode {
    let cli = Cli::parse_from(seed_flags(std::env::args_os()));
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let result = match &cli.command {
        Command::Summary(args) => summary::run(args, &mut out),
        Command::Run(args) => run::run(args),
        Command::Calibrate(args) => calibrate::run(args, &mut out),
        Command::Info(args) => info::run(args, &mut out),
        Command::MakeData(args) => make_data::run(args, &mut out),
        Command::GetSensitivityOfNodes(args) => sensitivity::run(args, &mut out),
        Command::PlotAccError(args) => acc_error::run(args, &mut out),
        Command::PlotDistribution(args) => distribution::run(args, &mut out),
        Command::GetChannelwiseDataDistribution(args) => channelwise::run(args, &mut out),
        Command::SensitivityAnalysis(args) => sensitivity_analysis::run(args, &mut out),
        Command::PrecisionTable(args) => precision_table::run(args, &mut out),
        Command::Outliers(args) => outliers::run(args, &mut out),
        Command::Runall(args) => runall::run(args, &mut out),
        Command::Modify(args) => modify::run(args, &mut out),
        Command::MixedPrecision(args) => mixed_precision::run(args, &mut out),
        Command::ExportQdq(args) => export_qdq::run(args, &mut out),
        Command::Report(args) => report::run(args, &mut out),
        Command::Merge(args) => merge::run(args, &mut out),
    };
    let result = result.and_then(|()| out.flush().map_err(anyhow::Error::from));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A reader that went away (`| head`) is not a failure of ours.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) if is_usage(&e) => {
            eprintln!("error: {}", hmct_ir::error_chain(e.as_ref()));
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {}", hmct_ir::error_chain(e.as_ref()));
            ExitCode::from(1)
        }
    }
}

/// The seeds spell some flags as multi-letter single-dash options (`-nm`, `-dnl`),
/// which clap cannot parse as short flags; they become the long forms (`--nm`,
/// `--dnl`), which the sub-commands having them declare as aliases.
const SEED_FLAGS: &[&str] = &[
    "nm", "nt", "dn", "dnl", "cn", "qn", "nqn", "am", "avm", "pt", "sn", "sd", "nq",
];

fn seed_flags(args: impl Iterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    args.map(|arg| {
        let Some(text) = arg.to_str() else { return arg };
        let Some(flag) = text.strip_prefix('-').filter(|f| !f.starts_with('-')) else {
            return arg;
        };
        let name = flag.split('=').next().unwrap_or(flag);
        if SEED_FLAGS.contains(&name) {
            format!("-{text}").into()
        } else {
            arg
        }
    })
    .collect()
}

/// A mistake in the command line: a [`UsageError`], or a library error that says so
/// of itself; decided here once, whatever context the sub-command added.
fn is_usage(e: &anyhow::Error) -> bool {
    e.downcast_ref::<UsageError>().is_some() || hmct_debug::usage::is_usage(e.as_ref())
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
