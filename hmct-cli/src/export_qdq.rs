//! `hmct-debugger export-qdq MODEL -o OUT`: the calibrated model as a standard QDQ
//! model that onnxruntime and other runtimes run (see `hmct_ir::export_qdq`): ON
//! integer calibration nodes become QuantizeLinear → DequantizeLinear (per-axis when
//! per-channel, with a zero point when asymmetric), float16 nodes a Cast pair, OFF
//! and float32 nodes are removed. Tensor names are kept.
//!
//! The default-domain opset is never raised (that would change other ops'
//! meaning): the standard ops are used when the model's opset allows them (axis
//! from 13, 16/4-bit from 21), otherwise onnxruntime's com.microsoft ops; the
//! output says which. `--domain standard` insists on the standard ops.

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
    /// auto (standard when the opset allows, else com.microsoft), standard or
    /// microsoft.
    #[arg(long, default_value = "auto")]
    pub domain: String,
}

pub fn run(args: &Args, out: &mut dyn Write) -> Result<()> {
    let domain = match args.domain.to_ascii_lowercase().as_str() {
        "auto" => None,
        "standard" | "onnx" => Some(QdqDomain::Standard),
        "microsoft" | "com.microsoft" => Some(QdqDomain::Microsoft),
        other => {
            return Err(UsageError(format!(
                "--domain: `{other}` is not auto, standard or microsoft"
            ))
            .into());
        }
    };
    let model = load_model(&args.model)?;
    let export = match export_qdq(&model, &QdqOptions { domain }) {
        Err(e @ QdqError::OpsetTooOld { .. }) => return Err(UsageError(e.to_string()).into()),
        r => r?,
    };
    // The error names the file already.
    save_model(&export.model, &args.output)?;
    let ops = match export.domain {
        QdqDomain::Standard => format!(
            "standard QuantizeLinear/DequantizeLinear (opset {} suffices; needs {})",
            export.opset, export.standard_needs
        ),
        QdqDomain::Microsoft if export.opset < export.standard_needs => format!(
            "com.microsoft QuantizeLinear/DequantizeLinear (the model's opset {} is below the {} the standard ops need here; onnxruntime only)",
            export.opset, export.standard_needs
        ),
        QdqDomain::Microsoft => {
            "com.microsoft QuantizeLinear/DequantizeLinear (onnxruntime only)".to_string()
        }
    };
    writeln!(out, "ops: {ops}")?;
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
