//! Pure-Rust ONNX interpreter tuned for fake quantization: plan, kernels, activation
//! cache and incremental re-execution.
//!
//! [`plan::Plan`] compiles a graph once (kernels chosen and attributes checked per
//! node, constants folded); [`exec::Session`] runs it under a [`exec::Config`] of
//! calibration-node overrides, captures activations, and re-runs only what a change
//! affects (see the `exec` module docs).

pub mod alloc;
mod buffers;
mod cpu;
pub mod exec;
pub mod fake_quant;
mod fusion;
mod layout;
pub mod model;
pub mod ops;
mod par;
pub mod plan;

pub use alloc::CacheLineAlloc;
pub use exec::{Base, Capture, Config, NodeTimes, Override, RunError, Session, Values};
pub use fake_quant::FakeQuant;
pub use model::{fake_quant_for, plan_model};
pub use plan::{CalibrationSetting, Plan, PlanError, PlanOptions, Slot};
