//! Loading QDQ models: onnxruntime's `quantize_static` output (fixtures/qdq, made by
//! tools/make_qdq_fixture.py) becomes a calibrated model whose calibration nodes carry
//! exactly the file's scales and zero points and whose weights are what
//! DequantizeLinear computes; hand-built models for the other types and the refusals.
//! (Running the imported models against onnxruntime's outputs, and the round trip
//! through export-qdq: hmct-cli/tests/qdq_import.rs.)

mod common;

use std::collections::HashMap;
use std::path::PathBuf;

use common::{attr_int, model, node};
use hmct_ir::{
    IrError, Model, QType, QdqImport, QdqImportError, TensorType, import_qdq, load_model,
    load_model_from_bytes, model_to_bytes,
};
use hmct_proto::Message;
use hmct_proto::onnx::{ModelProto, NodeProto, TensorProto};
use hmct_tensor::Tensor;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/qdq/{name}.onnx"))
}

/// The initializers of the file as written, decoded independently of the importer.
fn raw_initializers(path: &PathBuf) -> HashMap<String, Tensor> {
    let proto = ModelProto::decode(&*std::fs::read(path).unwrap()).unwrap();
    proto
        .graph
        .unwrap()
        .initializer
        .iter()
        .map(|t| {
            (
                t.name().to_string(),
                hmct_tensor::tensor_from_proto(t, None).unwrap(),
            )
        })
        .collect()
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.as_f32().unwrap().iter().copied().collect()
}

fn ops(model: &Model, op: &str) -> usize {
    model.nodes_of_type(op).len()
}

#[test]
fn uint8_activations_and_per_channel_weights() {
    let path = fixture("u8s8_per_channel");
    let raw = raw_initializers(&path);
    let m = load_model(&path).unwrap();
    assert_eq!(
        m.imported_from_qdq(),
        Some(&QdqImport {
            pairs: 12,
            weights: 7,
            biases: 7,
            clips: 9
        })
    );
    assert_eq!(
        (ops(&m, "QuantizeLinear"), ops(&m, "DequantizeLinear")),
        (0, 0)
    );
    assert_eq!(m.calibration_nodes().len(), 19);
    assert_eq!(m.opset("horizon"), Some(1));
    // Scales, zero points and integer weights are gone with their nodes.
    let left: Vec<&str> = m
        .graph_proto()
        .initializer
        .iter()
        .map(|t| t.name())
        .filter(|n| n.contains("_scale") || n.contains("_zero_point") || n.ends_with("_quantized"))
        .collect();
    assert!(left.is_empty(), "{left:?}");

    // An asymmetric uint8 activation: the pair's own scale and zero point.
    let cal = m.calibration_by_name("input_HzCalibration").unwrap();
    let scale = f32s(&raw["input_scale"])[0];
    let zp = raw["input_zero_point"].to_i64_vec().unwrap()[0];
    assert_eq!(zp, 101);
    assert_eq!(
        (cal.input(), cal.output()),
        ("input", "input_DequantizeLinear_Output")
    );
    assert_eq!(cal.qtype(), QType::UINT8);
    assert_eq!(cal.tensor_type(), TensorType::Feature);
    assert!(cal.is_asymmetric() && !cal.is_per_channel() && cal.switch_on());
    assert_eq!(cal.scales(), vec![scale]);
    assert_eq!(cal.zero_point(), vec![zp]);
    assert_eq!(
        cal.thresholds(),
        vec![-101.0 * scale, 154.0 * scale],
        "the float range [qmin, qmax] stands for"
    );
    cal.validate().unwrap();
    // The Conv now reads the calibration node's output, as it read the pair's.
    let stem = m.node(m.node_id("stem_conv").unwrap());
    assert_eq!(stem.input[0], cal.output());

    // onnxruntime dropped the Relu after stem_conv (the pair's range starts at 0):
    // a Clip from 0 to the top of the pair's range is back, between the Conv and the
    // calibration node.
    let cal = m
        .calibration_by_name("stem_relu_out_HzCalibration")
        .unwrap();
    assert_eq!(cal.zero_point(), vec![0]);
    assert_eq!(cal.input(), "stem_relu_out_clip");
    let clip = m.node(m.producer(cal.input()).unwrap());
    assert_eq!(
        (clip.op_type(), &clip.input[..1]),
        ("Clip", &["stem_relu_out".to_string()][..])
    );
    let bound = |k: usize| {
        m.constant_tensor(&clip.input[k])
            .unwrap()
            .unwrap()
            .to_f64_vec()
            .unwrap()
    };
    assert_eq!(bound(1), [0.0]);
    assert_eq!(bound(2), [f64::from(255.0 * cal.scales()[0])]);
    assert_eq!(stem.output, vec!["stem_relu_out".to_string()]);
    // Not where the range does not start at 0 (zero point 175 of 0..255).
    let cal = m
        .calibration_by_name("res_conv2_out_HzCalibration")
        .unwrap();
    assert_eq!(cal.input(), "res_conv2_out");

    // A per-channel int8 weight: a float initializer with (q - 0) * scale_c, and a
    // weight node with the file's scales.
    let cal = m
        .calibration_by_name("stem_conv.weight_HzCalibration")
        .unwrap();
    assert_eq!(cal.input(), "stem_conv.weight");
    assert_eq!(cal.tensor_type(), TensorType::Weight);
    assert!(cal.is_per_channel());
    assert_eq!(cal.axis(), Some(0));
    let scales = f32s(&raw["stem_conv.weight_scale"]);
    assert_eq!(cal.scales(), scales);
    assert_eq!(cal.zero_point(), vec![0; 16]);
    let q = raw["stem_conv.weight_quantized"].to_i64_vec().unwrap();
    let per_channel = q.len() / 16;
    let expected: Vec<f32> = q
        .iter()
        .enumerate()
        .map(|(i, &v)| v as f32 * scales[i / per_channel])
        .collect();
    let weight = m.constant_tensor("stem_conv.weight").unwrap().unwrap();
    assert_eq!(weight.shape(), &[16, 3, 3, 3]);
    assert_eq!(
        f32s(&weight)
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>(),
        expected.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );

    // An int32 bias: only a float initializer, under the name the Conv reads.
    assert!(m.producer("stem_conv.bias").is_none());
    let bias = f32s(&m.constant_tensor("stem_conv.bias").unwrap().unwrap());
    let qb = raw["stem_conv.bias_quantized"].to_i64_vec().unwrap();
    let sb = f32s(&raw["stem_conv.bias_quantized_scale"]);
    let expected: Vec<f32> = qb.iter().zip(&sb).map(|(&q, &s)| q as f32 * s).collect();
    assert_eq!(bias, expected);

    // Every regular node keeps its name, op and attributes.
    let original = ModelProto::decode(&*std::fs::read(&path).unwrap()).unwrap();
    for n in original
        .graph
        .unwrap()
        .node
        .iter()
        .filter(|n| !matches!(n.op_type(), "QuantizeLinear" | "DequantizeLinear"))
    {
        let now = m.node(m.node_id(n.name()).unwrap());
        assert_eq!((now.op_type(), &now.attribute), (n.op_type(), &n.attribute));
        assert_eq!(now.output, n.output);
    }
}

#[test]
fn int8_activations_with_zero_points_and_per_tensor_weights() {
    let path = fixture("s8s8_per_tensor");
    let raw = raw_initializers(&path);
    let m = load_model(&path).unwrap();
    let cal = m.calibration_by_name("input_HzCalibration").unwrap();
    let zp = raw["input_zero_point"].to_i64_vec().unwrap()[0];
    assert_ne!(zp, 0, "the fixture's int8 activations are asymmetric");
    assert_eq!(cal.qtype(), QType::INT8);
    assert_eq!(cal.zero_point(), vec![zp]);
    assert_eq!(cal.scales(), f32s(&raw["input_scale"]));
    // A symmetric threshold cannot express a signed range off zero.
    assert!(cal.thresholds().is_empty());
    assert!(cal.is_asymmetric());
    cal.validate().unwrap();

    let cal = m.calibration_by_name("fc.weight_HzCalibration").unwrap();
    let scale = f32s(&raw["fc.weight_scale"]);
    assert_eq!(scale.len(), 1);
    assert!(!cal.is_per_channel() && !cal.is_asymmetric());
    assert_eq!(cal.scales(), scale);
    assert_eq!(cal.thresholds(), vec![scale[0] * 127.0]);
}

#[test]
fn uint8_per_channel_weights_keep_their_zero_points() {
    let path = fixture("u8u8_per_channel");
    let raw = raw_initializers(&path);
    let m = load_model(&path).unwrap();
    let cal = m.calibration_by_name("fc.weight_HzCalibration").unwrap();
    let zero_points = raw["fc.weight_zero_point"].to_i64_vec().unwrap();
    assert_eq!(zero_points, vec![128; 10]);
    assert_eq!(cal.qtype(), QType::UINT8);
    assert!(cal.is_per_channel());
    assert_eq!(cal.zero_point(), zero_points);
    let scales = f32s(&raw["fc.weight_scale"]);
    let q = raw["fc.weight_quantized"].to_i64_vec().unwrap();
    let expected: Vec<f32> = q
        .iter()
        .enumerate()
        .map(|(i, &v)| (v - 128) as f32 * scales[i / 64])
        .collect();
    assert_eq!(
        f32s(&m.constant_tensor("fc.weight").unwrap().unwrap()),
        expected
    );
}

#[test]
fn an_imported_model_saves_as_a_calibrated_model() {
    let m = load_model(fixture("u8s8_per_channel")).unwrap();
    let bytes = model_to_bytes(&m);
    let again = load_model_from_bytes(&bytes).unwrap();
    assert_eq!(again.imported_from_qdq(), None);
    assert_eq!(again.nodes(), m.nodes());
    assert_eq!(model_to_bytes(&again), bytes);
}

// ---- hand-built models ----

fn scalar(name: &str, data_type: i32, value: f32) -> TensorProto {
    let mut t = TensorProto {
        name: Some(name.into()),
        data_type: Some(data_type),
        ..Default::default()
    };
    if data_type == 1 {
        t.float_data = vec![value];
    } else {
        t.int32_data = vec![value as i32];
    }
    t
}

fn int_tensor(name: &str, data_type: i32, dims: &[i64], values: &[i32]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        data_type: Some(data_type),
        dims: dims.to_vec(),
        int32_data: values.to_vec(),
        ..Default::default()
    }
}

fn f32_tensor(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        data_type: Some(1),
        dims: dims.to_vec(),
        float_data: values.to_vec(),
        ..Default::default()
    }
}

fn with_attr(mut n: NodeProto, a: hmct_proto::onnx::AttributeProto) -> NodeProto {
    n.attribute.push(a);
    n
}

fn import(proto: ModelProto) -> Result<(Model, QdqImport), QdqImportError> {
    import_qdq(Model::from_proto(proto, None)?)
}

#[test]
fn models_with_calibration_nodes_load_as_they_are() {
    let proto = model(
        &["x"],
        params(),
        vec![
            node("q", "QuantizeLinear", &["x", "s", "z"], &["xq"]),
            node("dq", "DequantizeLinear", &["xq", "s", "z"], &["xd"]),
            common::calib("xd_HzCalibration", "xd", "y"),
        ],
        &["y"],
    );
    let m = load_model_from_bytes(&proto.encode_to_vec()).unwrap();
    assert_eq!(m.imported_from_qdq(), None);
    assert_eq!(
        (ops(&m, "QuantizeLinear"), ops(&m, "DequantizeLinear")),
        (1, 1)
    );
    assert_eq!(m.calibration_nodes().len(), 1);
}

#[test]
fn int16_per_channel_activations_and_uint8_weights_with_a_zero_point() {
    const UINT8: i32 = 2;
    const INT16: i32 = 5;
    let proto = model(
        &["x"],
        vec![
            f32_tensor("s", &[4], &[0.5, 0.25, 0.125, 1.0]),
            int_tensor("z", INT16, &[4], &[0, 0, 0, 0]),
            int_tensor("w_q", UINT8, &[1, 4], &[0, 10, 128, 255]),
            scalar("ws", 1, 0.01),
            scalar("wz", UINT8, 128.0),
        ],
        vec![
            with_attr(
                node("q", "QuantizeLinear", &["x", "s", "z"], &["xq"]),
                attr_int("axis", -1),
            ),
            with_attr(
                node("dq", "DequantizeLinear", &["xq", "s", "z"], &["xd"]),
                attr_int("axis", 1),
            ),
            node("wdq", "DequantizeLinear", &["w_q", "ws", "wz"], &["w"]),
            node("mul", "Mul", &["xd", "w"], &["y"]),
        ],
        &["y"],
    );
    let (m, report) = import(proto).unwrap();
    assert_eq!(
        report,
        QdqImport {
            pairs: 1,
            weights: 1,
            biases: 0,
            clips: 0
        }
    );
    let cal = m.calibration_by_name("x_HzCalibration").unwrap();
    assert_eq!(cal.qtype(), QType::INT16);
    assert!(cal.is_per_channel());
    assert_eq!(
        cal.axis(),
        Some(1),
        "the negative axis resolved on the [1, 4] input"
    );
    assert_eq!(cal.scales(), vec![0.5, 0.25, 0.125, 1.0]);
    assert_eq!(
        cal.thresholds(),
        vec![0.5 * 32767.0, 0.25 * 32767.0, 0.125 * 32767.0, 32767.0]
    );
    // The weight name drops onnxruntime's `_quantized` only when it ends so.
    let cal = m.calibration_by_name("w_q_float_HzCalibration").unwrap();
    assert_eq!(cal.qtype(), QType::UINT8);
    assert_eq!((cal.input(), cal.output()), ("w_q_float", "w"));
    assert_eq!(cal.zero_point(), vec![128]);
    assert_eq!(cal.thresholds(), vec![-128.0 * 0.01, 127.0 * 0.01]);
    let w = f32s(&m.constant_tensor("w_q_float").unwrap().unwrap());
    assert_eq!(
        w,
        vec![-128.0 * 0.01, -118.0 * 0.01, 0.0, 127.0 * 0.01],
        "(q - zero_point) * scale"
    );
    assert!(m.initializer("w_q").is_none() && m.initializer("s").is_none());
}

fn message(proto: ModelProto) -> String {
    // Through the loader, as the command-line tool sees it.
    let err = load_model_from_bytes(&proto.encode_to_vec()).unwrap_err();
    assert!(matches!(err, IrError::QdqImport { .. }), "{err:?}");
    let text = err.to_string();
    assert!(!text.contains('\n'), "one line: {text}");
    text
}

fn params() -> Vec<TensorProto> {
    vec![
        scalar("s", 1, 0.1),
        scalar("z", 3, 0.0),
        scalar("s2", 1, 0.2),
    ]
}

#[test]
fn a_dequantize_of_a_computed_tensor_is_refused() {
    let proto = model(
        &["x"],
        params(),
        vec![
            node("relu", "Relu", &["x"], &["r"]),
            node("dq", "DequantizeLinear", &["r", "s", "z"], &["y"]),
        ],
        &["y"],
    );
    assert_eq!(
        message(proto),
        "<memory>: DequantizeLinear 'dq': its input 'r' is neither the output of a QuantizeLinear nor a constant"
    );
}

#[test]
fn a_quantize_without_dequantize_is_refused() {
    let proto = model(
        &["x"],
        params(),
        vec![
            node("q", "QuantizeLinear", &["x", "s", "z"], &["xq"]),
            node("cast", "Cast", &["xq"], &["y"]),
        ],
        &["y"],
    );
    let text = message(proto);
    assert!(
        text.contains("QuantizeLinear 'q': its output 'xq' is read by 'cast' (Cast)"),
        "{text}"
    );
    let proto = model(
        &["x"],
        params(),
        vec![node("q", "QuantizeLinear", &["x", "s", "z"], &["xq"])],
        &["xq"],
    );
    assert!(message(proto).contains("QuantizeLinear 'q': its output 'xq' is a graph output"));
}

#[test]
fn integer_operators_are_refused() {
    let proto = model(
        &["x"],
        params(),
        vec![
            node("q", "QuantizeLinear", &["x", "s", "z"], &["xq"]),
            node(
                "conv",
                "QLinearConv",
                &["xq", "s", "z", "xq", "s", "z", "s", "z"],
                &["yq"],
            ),
            node("dq", "DequantizeLinear", &["yq", "s", "z"], &["y"]),
        ],
        &["y"],
    );
    let text = message(proto);
    assert!(
        text.starts_with(
            "<memory>: node 'conv' is a QLinearConv: integer operators cannot be imported"
        ),
        "{text}"
    );
}

#[test]
fn a_requantizing_pair_is_refused() {
    let proto = model(
        &["x"],
        params(),
        vec![
            node("q", "QuantizeLinear", &["x", "s", "z"], &["xq"]),
            node("dq", "DequantizeLinear", &["xq", "s2", "z"], &["y"]),
        ],
        &["y"],
    );
    let text = message(proto);
    assert!(
        text.contains("DequantizeLinear 'dq': its scale/zero point/axis differ from those of QuantizeLinear 'q'"),
        "{text}"
    );
}
