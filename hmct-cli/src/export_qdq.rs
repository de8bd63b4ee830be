//! `hmct-debugger export-qdq MODEL -o OUT`: the calibrated model as a standard QDQ
//! model that onnxruntime and other runtimes run (see `hmct_ir::export_qdq`): ON
//! integer calibration nodes become QuantizeLinear → DequantizeLinear (per-axis when
//! per-channel, with a zero point when asymmetric), float16 nodes a Cast pair, OFF
//! and float32 nodes are removed. Tensor names are kept.
//!
//! The standard ops are written (they exist from opset 10, per-channel from 13,
//! 16/4-bit from 21); when the model's opset is older, it is raised to the lowest
//! that has them and the nodes whose operator changed on the way are converted
//! (`hmct_ir::raise_opset`); the output says so, and a node that cannot be
//! converted stops the export with its name. `--domain microsoft` writes
//! onnxruntime's com.microsoft ops instead, which keep the opset but run on
//! onnxruntime alone.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use hmct_ir::{QdqDomain, QdqError, QdqOptions, export_qdq, load_model, save_model};

use crate::UsageError;

/// Arguments of `export-qdq`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The calibrated ONNX model.
    pub model: PathBuf,
    /// Where to write the QDQ model.
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    pub output: PathBuf,
    /// standard (the default; raises the opset when it is too old for them) or
    /// microsoft (onnxruntime's com.microsoft ops at any opset; onnxruntime only).
    #[arg(long, default_value = "standard")]
    pub domain: String,
}

pub fn run(args: &Args, out: &mut dyn Write) -> Result<()> {
    let domain = match args.domain.to_ascii_lowercase().as_str() {
        // `auto` was the name of the default before it became the standard ops always.
        "standard" | "onnx" | "auto" => None,
        "microsoft" | "com.microsoft" => Some(QdqDomain::Microsoft),
        other => {
            return Err(
                UsageError(format!("--domain: `{other}` is not standard or microsoft")).into(),
            );
        }
    };
    let model = load_model(&args.model)?;
    let export = export_qdq(&model, &QdqOptions { domain }).map_err(|e| match &e {
        QdqError::Opset { source, .. } => anyhow::anyhow!(
            "{e}: {source}; `--domain microsoft` keeps the opset (onnxruntime only)"
        ),
        _ => e.into(),
    })?;
    // The error names the file already.
    save_model(&export.model, &args.output)?;
    let ops = match (export.domain, &export.raised) {
        (QdqDomain::Standard, None) => format!(
            "standard QuantizeLinear/DequantizeLinear (opset {} suffices; needs {})",
            export.opset, export.standard_needs
        ),
        (QdqDomain::Standard, Some(r)) => format!(
            "standard QuantizeLinear/DequantizeLinear; opset raised from {} to {}, {} node(s) converted",
            r.from,
            r.to,
            r.converted.len()
        ),
        (QdqDomain::Microsoft, _) if export.opset < export.standard_needs => format!(
            "com.microsoft QuantizeLinear/DequantizeLinear (the model's opset {} is below the {} the standard ops need here; onnxruntime only)",
            export.opset, export.standard_needs
        ),
        (QdqDomain::Microsoft, _) => {
            "com.microsoft QuantizeLinear/DequantizeLinear (onnxruntime only)".to_string()
        }
    };
    writeln!(out, "ops: {ops}")?;
    for line in export.raised.iter().flat_map(|r| &r.converted) {
        writeln!(out, "  {line}")?;
    }
    writeln!(
        out,
        "{} calibration node(s) as QuantizeLinear/DequantizeLinear, {} as a float16 Cast pair, {} removed (OFF or float32); wrote {}",
        export.quantized,
        export.cast,
        export.removed,
        args.output.display()
    )?;
    Ok(())
}
