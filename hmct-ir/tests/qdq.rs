//! `export_qdq` on the bundled tiny CNN: what each calibration node becomes, which
//! domain is chosen for which opset, and that tensor names downstream are kept.
//! (Numerical equality with onnxruntime: hmct-cli/tests/export_qdq.rs.)

use std::path::PathBuf;

use hmct_ir::{Edit, Model, QType, QdqDomain, QdqOptions, apply_edits, export_qdq, load_model};

fn tiny() -> Model {
    load_model(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../examples/tiny_cnn/calibrated_model.onnx"),
    )
    .unwrap()
}

fn ops(model: &Model, op: &str) -> usize {
    model.nodes().iter().filter(|n| n.op_type() == op).count()
}

#[test]
fn int8_per_channel_uses_standard_ops_at_opset_17() {
    let model = tiny();
    let n = model.calibration_nodes().len();
    let e = export_qdq(&model, &QdqOptions::default()).unwrap();
    assert_eq!(e.domain, QdqDomain::Standard);
    assert_eq!((e.quantized, e.cast, e.removed), (n, 0, 0));
    let m = &e.model;
    assert_eq!(ops(m, "HzCalibration"), 0);
    assert_eq!(
        (ops(m, "QuantizeLinear"), ops(m, "DequantizeLinear")),
        (n, n)
    );
    assert!(
        m.proto()
            .opset_import
            .iter()
            .all(|o| o.domain() != "horizon")
    );
    // The DequantizeLinear keeps the calibration node's name and output tensor, with
    // the scales the node stands for.
    let cal = model
        .calibration_by_name("fc.weight_HzCalibration")
        .unwrap();
    let dq = m.node(m.node_id("fc.weight_HzCalibration").unwrap());
    assert_eq!(dq.op_type(), "DequantizeLinear");
    assert_eq!(dq.domain(), "");
    assert_eq!(dq.output, vec![cal.output().to_string()]);
    assert_eq!(dq.attribute[0].i, Some(0));
    let scale = m.initializer(&dq.input[1]).unwrap();
    assert_eq!(scale.float_data, cal.scales());
    assert_eq!(scale.dims, vec![cal.scales().len() as i64]);
    let zp = m.initializer(&dq.input[2]).unwrap();
    assert_eq!(
        zp.raw_data.as_deref(),
        Some(&vec![0u8; cal.scales().len()][..])
    );
    // Every non-calibration node is unchanged.
    for node in model
        .nodes()
        .iter()
        .filter(|n| n.op_type() != "HzCalibration")
    {
        assert_eq!(m.node(m.node_id(node.name()).unwrap()), node);
    }
}

#[test]
fn int16_needs_opset_21_so_the_opset_is_raised_or_microsoft_ops_keep_it() {
    let mut model = tiny();
    apply_edits(
        &mut model,
        &[Edit::NodesQType {
            nodes: vec!["res_add".into()],
            qtype: QType::INT16,
        }],
    )
    .unwrap();
    let e = export_qdq(&model, &QdqOptions::default()).unwrap();
    assert_eq!(e.domain, QdqDomain::Standard);
    assert_eq!((e.opset, e.standard_needs), (17, 21));
    let raised = e.raised.as_ref().expect("the opset is raised");
    assert_eq!((raised.from, raised.to), (17, 21));
    assert_eq!(e.model.opset(""), Some(21));
    assert_eq!(e.model.opset("com.microsoft"), None);
    assert!(e.model.proto().ir_version() >= 10);
    let zp_name = &e
        .model
        .node(e.model.node_id("res_conv2_out_HzCalibration").unwrap())
        .input[2];
    let zp = e.model.initializer(zp_name).unwrap();
    assert_eq!(zp.data_type, Some(5)); // INT16
    assert_eq!(zp.raw_data.as_deref(), Some(&[0u8, 0][..]));

    let e = export_qdq(
        &model,
        &QdqOptions {
            domain: Some(QdqDomain::Microsoft),
        },
    )
    .unwrap();
    assert_eq!(e.domain, QdqDomain::Microsoft);
    assert!(e.raised.is_none());
    assert_eq!(e.model.opset(""), Some(17));
    assert_eq!(e.model.opset("com.microsoft"), Some(1));
}

#[test]
fn off_nodes_are_removed_and_float16_is_a_cast_pair() {
    let mut model = tiny();
    apply_edits(
        &mut model,
        &[
            Edit::Switch {
                node: "res_conv1".into(),
                on: false,
            },
            Edit::NodesQType {
                nodes: vec!["flatten_out_HzCalibration".into()],
                qtype: QType::Float16,
            },
        ],
    )
    .unwrap();
    let e = export_qdq(&model, &QdqOptions::default()).unwrap();
    assert_eq!((e.cast, e.removed), (1, 2));
    let m = &e.model;
    // down_relu_out_HzCalibration was OFF: its readers now read its input.
    let res_conv1 = m.node(m.node_id("res_conv1").unwrap());
    assert_eq!(res_conv1.input[0], "down_relu_out");
    assert_eq!(res_conv1.input[1], "res_conv1.weight");
    let res_add = m.node(m.node_id("res_add").unwrap());
    assert_eq!(res_add.input[1], "down_relu_out");
    let cast = m.node(m.node_id("flatten_out_HzCalibration").unwrap());
    assert_eq!(cast.op_type(), "Cast");
    assert_eq!(
        cast.output,
        vec!["flatten_out_HzCalibration_output".to_string()]
    );
    let first = m.node(m.producer(&cast.input[0]).unwrap());
    assert_eq!(
        (first.op_type(), first.input[0].as_str()),
        ("Cast", "flatten_out")
    );
    assert_eq!(first.attribute[0].i, Some(10)); // FLOAT16
}
