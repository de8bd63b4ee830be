//! ONNX conformance cases for the compute kernels (conv, matmul, pools, norms,
//! resize, quantize, RNNs), through the shared node-case runner
//! (tests/common/node_cases.rs). `HMCT_CASES=substring` restricts the run;
//! `HMCT_KERNELS_VERBOSE=1` lists unsupported cases with their reasons.

mod common;

const OPS: &str = "Conv ConvTranspose ConvInteger MatMul Gemm MatMulInteger Einsum \
    BatchNormalization InstanceNormalization LayerNormalization GroupNormalization MaxPool \
    AveragePool GlobalAveragePool GlobalMaxPool Resize Upsample QuantizeLinear \
    DequantizeLinear DynamicQuantizeLinear LSTM GRU";

#[test]
fn node_cases_of_compute_kernels() {
    common::node_cases::check(OPS, "HMCT_KERNELS_VERBOSE");
}
