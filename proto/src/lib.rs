//! The ONNX protobuf messages (`ModelProto`, `GraphProto`, `NodeProto`, ...), generated
//! by prost from the unmodified `onnx.proto` of ONNX **1.23.2** vendored in `onnx/`
//! (Apache-2.0, license beside it). Everything above this crate works on these types;
//! this crate has no logic of its own.

#![allow(clippy::all, missing_docs)]

/// The `onnx` protobuf package.
pub mod onnx {
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}

pub use prost::Message;

/// The ONNX release whose `onnx.proto` is compiled here.
pub const ONNX_VERSION: &str = "1.23.2";
