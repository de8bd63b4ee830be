//! `hmct-debugger info MODEL [DATA | -c sample.npy ...]`: the calibrated model
//! against the float model, in the layout of the tool's `hmct-info` table.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use hmct_debug::info::{InfoOptions, InfoReport, InfoRunner, TensorInfo, report};
use hmct_metrics::{Table, info_table};
use indicatif::{ProgressBar, ProgressStyle};

use crate::UsageError;

/// Arguments of `info`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The calibrated ONNX model.
    pub model: PathBuf,
    /// Calibration-data folder: every sample is compared and the table shows the
    /// mean over samples.
    #[arg(conflicts_with = "sample")]
    pub data: Option<PathBuf>,
    /// One sample as .npy, one per model input in input order, or INPUT=FILE.npy.
    #[arg(short = 'c', long = "sample", value_name = "NPY")]
    pub sample: Vec<String>,
    /// Also compare the outputs of every quantized regular node.
    #[arg(long = "per-node", visible_alias = "per_node")]
    pub per_node: bool,
    /// With DATA, also print the table of each sample.
    #[arg(long = "per-sample", visible_alias = "per_sample")]
    pub per_sample: bool,
    /// Use only the first N samples of DATA.
    #[arg(short = 'n', long = "data-num", visible_alias = "data_num")]
    pub data_num: Option<usize>,
    #[command(flatten)]
    pub workers: crate::common::Threads,
    /// Also write the figures as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

pub fn run(args: &Args, out: &mut dyn Write) -> Result<()> {
    if args.data.is_none() && args.sample.is_empty() {
        return Err(UsageError("give a data folder or one sample with -c FILE.npy".into()).into());
    }
    if args.data_num == Some(0) {
        return Err(UsageError("--data-num must be at least 1".into()).into());
    }
    let model = hmct_ir::load_model(&args.model)?;
    let options = InfoOptions {
        per_node: args.per_node,
        data_num: args.data_num,
        threads: args.workers.threads,
    };
    let runner = InfoRunner::new(&model, &options)?;
    let report = match &args.data {
        Some(dir) => {
            let bar = ProgressBar::new(0).with_style(
                ProgressStyle::with_template("comparing {bar:30} {pos}/{len} samples ({elapsed})")
                    .expect("a valid template"),
            );
            let progress = |done: usize, total: usize| {
                bar.set_length(total as u64);
                bar.set_position(done as u64);
            };
            let r = runner.compare_dir(dir, &progress);
            bar.finish_and_clear();
            r?
        }
        None => {
            let (label, inputs) = sample_inputs(&runner, &args.sample)?;
            report(vec![runner.compare(&label, inputs)?])
        }
    };
    print(&report, args, out).context("writing to stdout")?;
    warn_about_nan(&report);
    if let Some(path) = &args.json {
        crate::common::write_json(path, &report)?;
    }
    Ok(())
}

/// The means skip samples whose figures are NaN (NaN or Inf in an output): say how
/// many, so that a table over the remaining samples is not taken for the whole data.
fn warn_about_nan(report: &InfoReport) {
    let n = report.samples.len();
    for (k, mean) in report.mean_outputs.iter().enumerate() {
        let bad = report
            .samples
            .iter()
            .filter(|s| s.outputs[k].figures.cosine.is_nan())
            .count();
        if bad > 0 {
            eprintln!(
                "warning: output '{}': {bad} of {n} sample(s) give NaN (NaN or Inf in the float \
                 or the quantized output); the figures above skip them",
                mean.tensor
            );
        }
    }
}

/// The tensors of `-c` arguments, matched to the model inputs.
fn sample_inputs(
    runner: &InfoRunner,
    items: &[String],
) -> Result<(String, Vec<(String, hmct_tensor::Tensor)>)> {
    let inputs: Vec<String> = runner
        .session()
        .plan()
        .inputs()
        .iter()
        .map(|i| i.name.clone())
        .collect();
    if items.len() != inputs.len() {
        return Err(UsageError(format!(
            "the model has {} input(s) ({}); give one -c per input",
            inputs.len(),
            inputs.join(", ")
        ))
        .into());
    }
    let mut out = Vec::new();
    for (k, item) in items.iter().enumerate() {
        // INPUT=FILE when INPUT names a model input; otherwise the whole item is a path.
        let (name, path) = match item.split_once('=') {
            Some((n, p)) if inputs.iter().any(|i| i == n) => (n.to_string(), p),
            _ => (inputs[k].clone(), item.as_str()),
        };
        let t = hmct_tensor::read_npy(path.as_ref())?;
        out.push((name, t));
    }
    Ok((items.join(", "), out))
}

fn output_rows(rows: &[TensorInfo]) -> Table {
    info_table(rows.iter().map(|r| (r.tensor.as_str(), r.figures.into())))
}

fn node_rows(rows: &[TensorInfo]) -> Table {
    let header = [
        "Node",
        "Output",
        "Cosine Similarity",
        "L1 Distance",
        "L2 Distance",
        "Chebyshev Distance",
    ];
    let mut table = Table::new("", header.iter().map(|h| h.to_string()).collect());
    for r in rows {
        let f = r.figures;
        table
            .push_row(vec![
                r.node.clone(),
                r.tensor.clone(),
                format!("{:.6}", f.cosine),
                format!("{:.6}", f.l1),
                format!("{:.6}", f.l2),
                format!("{:.6}", f.chebyshev),
            ])
            .expect("one cell per column");
    }
    table
}

fn print(report: &InfoReport, args: &Args, out: &mut dyn Write) -> std::io::Result<()> {
    let n = report.samples.len();
    if n > 1 && args.per_sample {
        for s in &report.samples {
            writeln!(out, "The quantized model output on {}:", s.sample)?;
            write!(out, "{}", output_rows(&s.outputs))?;
            if args.per_node {
                writeln!(out, "The quantized node outputs on {}:", s.sample)?;
                write!(out, "{}", node_rows(&s.nodes))?;
            }
            writeln!(out)?;
        }
    }
    let over = if n > 1 {
        format!(" (mean over {n} samples)")
    } else {
        String::new()
    };
    writeln!(out, "The quantized model output{over}:")?;
    write!(out, "{}", output_rows(&report.mean_outputs))?;
    if args.per_node {
        writeln!(out, "The quantized node outputs{over}:")?;
        write!(out, "{}", node_rows(&report.mean_nodes))?;
    }
    Ok(())
}
