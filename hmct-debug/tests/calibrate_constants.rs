//! Tensors that depend on no data (constant-foldable: `ConstantOfShape`, a
//! `Shape → Gather → Cast` chain, arithmetic on those) get no activation calibration
//! node: they are left float, listed in the report, and recorded in the model's
//! metadata, while every real activation is still calibrated.

use hmct_debug::calibrate::{CalibrateOptions, METADATA_KEY, calibrate_samples, data_independent};
use hmct_ir::Model;
use hmct_ir::testing::build::{self, float_value, int_attr, named_value, node};
use hmct_proto::onnx::{AttributeProto, TensorProto, attribute_proto::AttributeType};
use hmct_tensor::Tensor;

/// x [1, 2, 4, 4] → Conv(w) → y;
/// Shape(y) → ConstantOfShape(1.5) → c; Add(y, c) → a;
/// Shape(x) → Gather(1) → Cast(float) → n; Mul(n, 0.5) → h; Mul(a, h) → out.
fn model() -> Model {
    let fill = AttributeProto {
        name: Some("value".into()),
        r#type: Some(AttributeType::Tensor as i32),
        t: Some(TensorProto {
            dims: vec![1],
            data_type: Some(1),
            float_data: vec![1.5],
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut fill_node = node("fill", "ConstantOfShape", &["y_shape"], &["c"]);
    fill_node.attribute = vec![fill];
    let mut cast = node("cast", "Cast", &["channels_i"], &["n"]);
    cast.attribute = vec![int_attr("to", 1)];
    let mut gather = node("gather", "Gather", &["x_shape", "one"], &["channels_i"]);
    gather.attribute = vec![int_attr("axis", 0)];
    let nodes = vec![
        node("conv", "Conv", &["x", "w"], &["y"]),
        node("shape_y", "Shape", &["y"], &["y_shape"]),
        fill_node,
        node("add", "Add", &["y", "c"], &["a"]),
        node("shape_x", "Shape", &["x"], &["x_shape"]),
        gather,
        cast,
        node("half", "Mul", &["n", "k"], &["h"]),
        node("scale", "Mul", &["a", "h"], &["out"]),
    ];
    let inits = vec![
        TensorProto {
            name: Some("w".into()),
            dims: vec![3, 2, 1, 1],
            data_type: Some(1),
            float_data: vec![0.5, -1.0, 0.25, 2.0, -0.75, 1.0],
            ..Default::default()
        },
        TensorProto {
            name: Some("one".into()),
            data_type: Some(7),
            int64_data: vec![1],
            ..Default::default()
        },
        TensorProto {
            name: Some("k".into()),
            data_type: Some(1),
            float_data: vec![0.5],
            ..Default::default()
        },
    ];
    let proto = build::model(
        vec![float_value("x", &[1, 2, 4, 4])],
        nodes,
        inits,
        vec![named_value("out")],
    );
    Model::from_proto(proto, None).unwrap()
}

#[test]
fn constant_foldable_inputs_are_left_float_and_reported() {
    let m = model();
    let independent = data_independent(&m);
    for v in ["w", "y_shape", "c", "x_shape", "channels_i", "n", "h"] {
        assert!(independent.contains(v), "{v}");
    }
    for v in ["x", "y", "a", "out"] {
        assert!(!independent.contains(v), "{v}");
    }

    let x = Tensor::from_f32(
        &[1, 2, 4, 4],
        (0..32).map(|k| k as f32 / 8.0 - 2.0).collect(),
    )
    .unwrap();
    let samples = vec![vec![("x".to_string(), x.clone())]];
    let out = calibrate_samples(&m, &samples, &CalibrateOptions::default(), &|_, _| {}).unwrap();
    let mut calibrated: Vec<&str> = out.report.nodes.iter().map(|n| n.input.as_str()).collect();
    calibrated.sort_unstable();
    assert_eq!(calibrated, ["a", "w", "x", "y"]);
    assert_eq!(out.report.constant_inputs, ["c", "n", "h"]);
    let line = out.report.one_line();
    assert!(
        line.contains("3 constant-foldable input(s) left unquantized") && line.contains("c, n, h"),
        "{line}"
    );
    let meta = out
        .model
        .proto()
        .metadata_props
        .iter()
        .find(|e| e.key() == METADATA_KEY)
        .expect("calibrate records what it did");
    assert_eq!(meta.value(), line);

    // The calibrated model runs; the float inputs stay float.
    let plan = hmct_quant::plan_model(&out.model).unwrap();
    let session = hmct_quant::Session::new(plan, 1).unwrap();
    let outputs = session
        .run(&[("x", x)], &hmct_quant::Config::calibrated())
        .unwrap();
    assert_eq!(outputs[0].shape(), &[1, 3, 4, 4]);
    for id in out.model.calibration_nodes() {
        let input = out.model.calibration(id).unwrap().input().to_string();
        assert!(!independent.contains(&input) || input == "w", "{input}");
    }
}
