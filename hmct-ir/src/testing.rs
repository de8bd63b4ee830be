//! Helpers for tests of this and other crates (feature `testing`): where the shared
//! test material lives, how a test says it skips, and a stand-in calibration that
//! inserts HzCalibration nodes with simple thresholds until the real `calibrate` exists.
//!
//! # Skipping
//! A test that cannot run here (no `../shared`, no `HMCT_PYTHON`, no `/dev/full`, ...)
//! calls [`skip`] (or gets `None` from [`shared_dir`], [`shared_path`] or [`python`],
//! which call it) and returns. Cargo counts such a test as passed, so the skip is
//! written straight to the terminal, past cargo's output capture, as one line:
//! `test NAME SKIPPED: REASON`. Skips that CI must not have are failures when asked:
//! `HMCT_REQUIRE_SHARED=1` for `../shared`, `HMCT_REQUIRE_PYTHON=1` for `HMCT_PYTHON`.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;

use crate::{CalibrationInsert, CalibrationSpec, IrError, Model, NodeId, QType, TensorType};

/// Set to `1`, a test that needs `../shared` fails when it is absent instead of skipping.
pub const REQUIRE_SHARED: &str = "HMCT_REQUIRE_SHARED";
/// Set to `1`, a test that needs `HMCT_PYTHON` fails when it is unset instead of skipping.
pub const REQUIRE_PYTHON: &str = "HMCT_REQUIRE_PYTHON";

/// Reports that the running test skips (all of it, or the part `reason` names), on
/// the terminal whatever cargo captures.
pub fn skip(reason: &str) {
    // libtest names each test's thread after the test (the main thread runs it when
    // there is one test thread).
    let thread = std::thread::current();
    let test = thread
        .name()
        .filter(|n| *n != "main")
        .unwrap_or("(unnamed)");
    // `eprintln!` would be captured and shown only for failing tests; a direct write
    // to the stderr handle is not.
    let _ = writeln!(std::io::stderr(), "test {test} SKIPPED: {reason}");
}

/// [`skip`], or a panic (a failing test) when the environment variable `require` is `1`.
fn skip_unless_required(require: &str, reason: &str) {
    if std::env::var(require).is_ok_and(|v| v == "1") {
        panic!("{reason}, and {require}=1 says it must not be skipped");
    }
    skip(reason);
}

/// `../shared` of the repository (models, specs, conformance cases); when it is absent,
/// the test is reported skipped ([`REQUIRE_SHARED`] makes that a failure) and `None`
/// comes back.
pub fn shared_dir() -> Option<PathBuf> {
    shared_path("")
}

/// `../shared/<sub>` (e.g. `models`, `onnx-node-tests`), as [`shared_dir`].
pub fn shared_path(sub: &str) -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared");
    let dir = if sub.is_empty() { root } else { root.join(sub) };
    if dir.exists() {
        return Some(dir);
    }
    let shown = if sub.is_empty() {
        "../shared".to_string()
    } else {
        format!("../shared/{sub}")
    };
    skip_unless_required(REQUIRE_SHARED, &format!("{shown} not found"));
    None
}

/// The Python named by `HMCT_PYTHON` (one with `tools/requirements.txt` installed);
/// when it is unset, the test is reported skipped ([`REQUIRE_PYTHON`] makes that a
/// failure) and `None` comes back.
pub fn python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HMCT_PYTHON") {
        return Some(PathBuf::from(p));
    }
    skip_unless_required(
        REQUIRE_PYTHON,
        "HMCT_PYTHON is not set (a python with tools/requirements.txt installed)",
    );
    None
}

/// Inserts int8 calibration nodes on every Conv: one activation node (per-tensor,
/// threshold `activation_threshold`) on each distinct data input, and one weight
/// node on each constant weight, per output channel (axis 0) with the channel's
/// largest absolute weight as threshold, `group` copied from the Conv. Readers of a
/// value share its node. Nodes are named `<input>_HzCalibration`.
pub fn calibrate_for_tests(model: Model, activation_threshold: f32) -> Result<Model, IrError> {
    struct Found {
        weight: bool,
        group: i64,
        consumers: Vec<(NodeId, usize)>,
    }
    // Values in the order they are first met, so the result does not depend on hashing.
    let mut order: Vec<String> = Vec::new();
    let mut found: BTreeMap<String, Found> = BTreeMap::new();
    for &id in model.nodes_of_type("Conv") {
        let node = model.node(id);
        let group = node
            .attribute
            .iter()
            .find(|a| a.name() == "group")
            .and_then(|a| a.i)
            .unwrap_or(1);
        for (i, value) in node.input.iter().enumerate().take(2) {
            let weight = model.is_constant(value);
            if value.is_empty() || weight != (i == 1) {
                continue;
            }
            let entry = found.entry(value.clone()).or_insert_with(|| {
                order.push(value.clone());
                Found {
                    weight,
                    group,
                    consumers: Vec::new(),
                }
            });
            entry.consumers.push((id, i));
        }
    }
    let mut inserts = Vec::new();
    for value in order {
        let Found {
            weight,
            group,
            consumers,
        } = found.remove(&value).expect("recorded above");
        let (thresholds, axis, group, tensor_type) = if weight {
            (
                channel_max_abs(&model, &value)?,
                Some(0),
                Some(group),
                TensorType::Weight,
            )
        } else {
            (vec![activation_threshold], None, None, TensorType::Feature)
        };
        let name = free_name(&model, &format!("{value}_HzCalibration"));
        inserts.push(CalibrationInsert {
            spec: CalibrationSpec {
                output: format!("{name}_output"),
                name,
                input: value,
                tensor_type,
                qtype: QType::INT8,
                thresholds,
                axis,
                group,
                constant: 1,
                switch_on: true,
            },
            consumers,
        });
    }
    model.insert_calibrations(inserts)
}

/// An int8 activation calibration node `<value>_HzCalibration` (output
/// `<value>_HzCalibration_output`) with one threshold, between `value` and input
/// `input` of node `reader` only: where [`calibrate_for_tests`] puts none, such as
/// between a SiLU's Sigmoid and Mul, as calibrated models have.
pub fn feature_calibration(
    model: &Model,
    value: &str,
    reader: &str,
    input: usize,
    threshold: f32,
) -> Result<CalibrationInsert, IrError> {
    Ok(CalibrationInsert {
        spec: CalibrationSpec {
            name: format!("{value}_HzCalibration"),
            input: value.into(),
            output: format!("{value}_HzCalibration_output"),
            tensor_type: TensorType::Feature,
            qtype: QType::INT8,
            thresholds: vec![threshold],
            axis: None,
            group: None,
            constant: 1,
            switch_on: true,
        },
        consumers: vec![(model.node_id(reader)?, input)],
    })
}

/// `../shared/models/mtcnn_pnet/pnet.onnx` passed through [`calibrate_for_tests`]
/// (activation threshold 4.0); None (the test reported skipped, see [`shared_path`])
/// when the shared models are absent.
pub fn calibrated_pnet() -> Result<Option<Model>, IrError> {
    let Some(models) = shared_path("models") else {
        return Ok(None);
    };
    let model = crate::load_model(models.join("mtcnn_pnet/pnet.onnx"))?;
    calibrate_for_tests(model, 4.0).map(Some)
}

/// Largest |w| per slice along axis 0 (a tiny positive value for all-zero slices,
/// since a zero threshold is invalid).
fn channel_max_abs(model: &Model, value: &str) -> Result<Vec<f32>, IrError> {
    let invalid = |message: String| IrError::InvalidCalibration {
        node: format!("{value}_HzCalibration"),
        message,
    };
    let tensor = model
        .constant_tensor(value)?
        .ok_or_else(|| invalid("weight is not a constant".into()))?;
    let data = tensor
        .to_f64_vec()
        .ok_or_else(|| invalid(format!("weight of type {} is not numeric", tensor.dtype())))?;
    let channels = tensor.shape().first().copied().unwrap_or(1).max(1);
    let per = data.len() / channels;
    Ok((0..channels)
        .map(|c| {
            let m = data[c * per..(c + 1) * per]
                .iter()
                .fold(0f64, |m, v| m.max(v.abs()));
            (m as f32).max(1e-6)
        })
        .collect())
}

fn free_name(model: &Model, base: &str) -> String {
    std::iter::once(base.to_string())
        .chain((1..).map(|k| format!("{base}_{k}")))
        .find(|n| {
            !model.node_mappings().contains_key(n)
                && model.producer(&format!("{n}_output")).is_none()
        })
        .expect("an unbounded sequence has a free name")
}

/// Small models written out in tests without the protobuf boilerplate: float values,
/// nodes, attributes, and a model at opset 17 around them.
pub mod build {
    pub use crate::attr::{
        float as float_attr, floats as floats_attr, int as int_attr, ints as ints_attr,
        string as string_attr,
    };
    use hmct_proto::onnx::{
        GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto,
        TypeProto, ValueInfoProto, tensor_shape_proto, type_proto,
    };

    /// A node of the default domain; an empty `name` leaves it unnamed.
    pub fn node(name: &str, op: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
        NodeProto {
            name: (!name.is_empty()).then(|| name.to_string()),
            op_type: Some(op.into()),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    /// A float tensor value of fixed shape.
    pub fn float_value(name: &str, dims: &[i64]) -> ValueInfoProto {
        let dim = dims
            .iter()
            .map(|&d| tensor_shape_proto::Dimension {
                value: Some(tensor_shape_proto::dimension::Value::DimValue(d)),
                ..Default::default()
            })
            .collect();
        ValueInfoProto {
            name: Some(name.into()),
            r#type: Some(TypeProto {
                value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                    elem_type: Some(1),
                    shape: Some(TensorShapeProto { dim }),
                })),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A value known by name only (a graph output whose type the planner works out).
    pub fn named_value(name: &str) -> ValueInfoProto {
        ValueInfoProto {
            name: Some(name.into()),
            ..Default::default()
        }
    }

    /// A model (IR version 8, default domain at opset 17) with one graph.
    pub fn model(
        inputs: Vec<ValueInfoProto>,
        nodes: Vec<NodeProto>,
        initializers: Vec<TensorProto>,
        outputs: Vec<ValueInfoProto>,
    ) -> ModelProto {
        ModelProto {
            ir_version: Some(8),
            opset_import: vec![OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(17),
            }],
            graph: Some(GraphProto {
                name: Some("g".into()),
                node: nodes,
                initializer: initializers,
                input: inputs,
                output: outputs,
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}
