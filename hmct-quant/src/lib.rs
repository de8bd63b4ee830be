//! Pure-Rust ONNX interpreter tuned for fake quantization: plan, kernels, activation
//! cache and incremental re-execution.

pub mod fake_quant;
pub mod ops;
