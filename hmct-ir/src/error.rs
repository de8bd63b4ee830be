//! The errors of loading, validating, editing and saving a model, and how any error
//! of the workspace reads as one line with its causes.

use std::error::Error;

use hmct_tensor::TensorError;

/// What went wrong, naming the model (`file`: its path, or `<memory>` for bytes) and
/// the node or value involved. Messages are complete on their own (underlying I/O,
/// decode and tensor errors are part of the text, not a separate `source`), so
/// printing an error chain never repeats them.
#[derive(Debug, thiserror::Error)]
pub enum IrError {
    #[error("{file}: {error}")]
    Io { file: String, error: std::io::Error },
    #[error("{file}: not an ONNX model, or a truncated one ({error})")]
    Decode {
        file: String,
        error: prost::DecodeError,
    },
    #[error("{file}: not an ONNX model: {message}")]
    NotOnnx { file: String, message: String },
    #[error("{file}: the graph has a cycle through {}", .nodes.join(", "))]
    Cycle { file: String, nodes: Vec<String> },
    #[error(
        "{file}: input '{value}' of node '{node}' is not produced by any node, initializer or graph input"
    )]
    DanglingInput {
        file: String,
        node: String,
        value: String,
    },
    #[error(
        "{file}: graph output '{value}' is not produced by any node, initializer or graph input"
    )]
    DanglingOutput { file: String, value: String },
    #[error("{file}: value '{value}' is produced more than once (by {})", .producers.join(", "))]
    DuplicateOutput {
        file: String,
        value: String,
        producers: Vec<String>,
    },
    #[error("{file}: no node named '{name}'")]
    UnknownNode { file: String, name: String },
    #[error("{file}: node '{node}' is not an HzCalibration node")]
    NotCalibration { file: String, node: String },
    #[error("calibration node '{node}': {message}")]
    InvalidCalibration { node: String, message: String },
    #[error("{file}: value '{value}': {}", error_chain(error))]
    Tensor {
        file: String,
        value: String,
        error: TensorError,
    },
    #[error("{file}: {error}")]
    QdqImport {
        file: String,
        error: Box<crate::QdqImportError>,
    },
    #[error("{file}: Constant node '{node}': {message}")]
    InvalidConstant {
        file: String,
        node: String,
        message: String,
    },
}

/// The error and its causes on one line, joined with ": " (how the CLI and the Python
/// package print an error). Errors name what failed and where, and leave their cause
/// to `source`; a cause the line already ends with (an error that still quotes its
/// own) is not repeated.
pub fn error_chain(e: &(dyn Error + 'static)) -> String {
    let mut line = String::new();
    let mut cause = Some(e);
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.ends_with(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
        cause = c.source();
    }
    line.replace('\n', " ")
}
