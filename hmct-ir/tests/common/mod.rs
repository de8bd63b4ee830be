//! Small hand-built models for the tests.
#![allow(dead_code)]

pub use hmct_ir::testing::build::{float_value as float_input, named_value as value, node};
use hmct_ir::{CalibrationSpec, QType, TensorType};
use hmct_proto::onnx::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    attribute_proto::AttributeType,
};

/// A per-tensor int8 activation calibration node `name` reading `input`.
pub fn calib(name: &str, input: &str, output: &str) -> NodeProto {
    CalibrationSpec {
        name: name.into(),
        input: input.into(),
        output: output.into(),
        tensor_type: TensorType::Feature,
        qtype: QType::INT8,
        thresholds: vec![1.0],
        axis: None,
        group: None,
        constant: 1,
        switch_on: true,
    }
    .to_node()
    .unwrap()
}

pub fn f32_init(name: &str, dims: &[i64], data: Vec<f32>) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(1),
        float_data: data,
        ..Default::default()
    }
}

/// A model over `nodes` with graph inputs `inputs`, initializers `inits` (any shape,
/// one float each unless given) and outputs `outputs`.
pub fn model(
    inputs: &[&str],
    inits: Vec<TensorProto>,
    nodes: Vec<NodeProto>,
    outputs: &[&str],
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
            initializer: inits,
            input: inputs.iter().map(|n| float_input(n, &[1, 4])).collect(),
            output: outputs.iter().map(|n| value(n)).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn attr_str(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::String as i32),
        s: Some(v.as_bytes().to_vec()),
        ..Default::default()
    }
}

pub fn attr_floats(name: &str, v: &[f32]) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Floats as i32),
        floats: v.to_vec(),
        ..Default::default()
    }
}

pub fn attr_ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Ints as i32),
        ints: v.to_vec(),
        ..Default::default()
    }
}

pub fn attr_int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(v),
        ..Default::default()
    }
}
