//! Compiles the vendored `onnx/onnx.proto` with a pure-Rust protobuf compiler
//! (protox), so building needs no `protoc` binary on any machine.

fn main() {
    let proto = "onnx/onnx.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["onnx"]).expect("onnx.proto must compile");
    prost_build::Config::new()
        .compile_fds(descriptors)
        .expect("prost code generation for onnx.proto");
}
