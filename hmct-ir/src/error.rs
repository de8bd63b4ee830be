//! The errors of loading, validating, editing and saving a model.

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
    #[error("{file}: value '{value}': {error}")]
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
