//! Broken files and graphs: the right error, never a panic.

mod common;

use common::{calib, f32_init, model, node};
use hmct_ir::{IrError, Model, load_model, load_model_from_bytes, model_to_bytes};
use hmct_proto::Message;
use proptest::prelude::*;

fn small_model_bytes() -> Vec<u8> {
    let mut wc = calib("wc", "w", "wq");
    wc.attribute.push(common::attr_int("axis", 0));
    if let Some(t) = wc.attribute.iter_mut().find(|a| a.name() == "thresholds") {
        t.floats = vec![1.0, 2.0, 3.0, 4.0];
    }
    let m = model(
        &["x"],
        vec![f32_init("w", &[4, 4, 1, 1], vec![0.25; 16])],
        vec![
            calib("xc", "x", "xq"),
            wc,
            node("conv", "Conv", &["xq", "wq"], &["c"]),
            node("relu", "Relu", &["c"], &["y"]),
        ],
        &["y"],
    );
    m.encode_to_vec()
}

/// Calls every read of the API on a model that loaded.
fn exercise(m: &Model) {
    for t in &m.graph_proto().initializer {
        let _ = m.constant_tensor(t.name());
    }
    for id in 0..m.nodes().len() {
        for v in &m.node(id).output {
            let _ = m.constant_tensor(v);
        }
        if let Some(c) = m.calibration(id) {
            let _ = (
                c.qtype(),
                c.scales(),
                c.zero_point(),
                c.tensor_type(),
                c.validate(),
            );
            let _ = (
                c.is_per_channel(),
                c.is_asymmetric(),
                c.switch_on(),
                c.group(),
            );
            let _ = hmct_ir::consumer_label(m, id);
        }
        let _ = hmct_ir::find_output_calibration(m, id, None);
        let _ = hmct_ir::input_calibrations(m, id);
    }
    let _ = hmct_ir::quantized_nodes(m);
}

#[test]
fn missing_file() {
    let err = load_model("/nonexistent/dir/model.onnx").unwrap_err();
    match &err {
        IrError::Io { file, error } => {
            assert_eq!(file, "/nonexistent/dir/model.onnx");
            assert_eq!(error.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("/nonexistent/dir/model.onnx"));
}

#[test]
fn garbage_and_empty_bytes() {
    let err = load_model_from_bytes(b"this is not an onnx model at all").unwrap_err();
    assert!(matches!(err, IrError::Decode { .. }), "{err:?}");
    assert!(err.to_string().contains("not an ONNX model"), "{err}");
    // An empty file decodes as an empty message: still not a model.
    let err = load_model_from_bytes(b"").unwrap_err();
    assert!(matches!(err, IrError::NotOnnx { .. }), "{err:?}");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("junk.onnx");
    std::fs::write(&path, [0xffu8; 64]).unwrap();
    let err = load_model(&path).unwrap_err();
    assert!(err.to_string().contains("junk.onnx"), "{err}");
}

#[test]
fn truncated_files() {
    let bytes = small_model_bytes();
    assert!(load_model_from_bytes(&bytes).is_ok());
    // Cut in the middle of the graph: a decode error naming the file.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.onnx");
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = load_model(&path).unwrap_err();
    assert!(matches!(err, IrError::Decode { .. }), "{err:?}");
    assert!(err.to_string().contains("cut.onnx"), "{err}");
    // Every prefix is rejected (the opset import is the last field, so even cuts at
    // field boundaries lose something required).
    for len in 0..bytes.len() {
        assert!(
            load_model_from_bytes(&bytes[..len]).is_err(),
            "prefix {len} accepted"
        );
    }
}

#[test]
fn truncated_real_model() {
    let Some(shared) = hmct_ir::testing::shared_dir() else {
        return;
    };
    let bytes = std::fs::read(shared.join("models/mtcnn_onet/onet.onnx")).unwrap();
    for frac in [1, 10, 100, 500, 900, 999] {
        let len = bytes.len() * frac / 1000;
        assert!(
            load_model_from_bytes(&bytes[..len]).is_err(),
            "{len} bytes accepted"
        );
    }
}

#[test]
fn cycle() {
    let m = model(
        &["x"],
        vec![],
        vec![
            node("a", "Add", &["x", "c"], &["b"]),
            node("r", "Relu", &["b"], &["c"]),
            node("out", "Relu", &["c"], &["y"]),
        ],
        &["y"],
    );
    let err = Model::from_proto(m.clone(), None).unwrap_err();
    match &err {
        IrError::Cycle { nodes, .. } => {
            let mut n = nodes.clone();
            n.sort();
            assert_eq!(n, ["a", "r"]);
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("cycle"), "{err}");
    // Through the byte loader as well.
    let err = load_model_from_bytes(&m.encode_to_vec()).unwrap_err();
    assert!(matches!(err, IrError::Cycle { .. }));
    // A node reading its own output.
    let m = model(
        &["x"],
        vec![],
        vec![node("self", "Add", &["x", "s"], &["s"])],
        &["s"],
    );
    assert!(
        matches!(Model::from_proto(m, None), Err(IrError::Cycle { nodes, .. }) if nodes == ["self"])
    );
}

#[test]
fn dangling_input_and_output() {
    let m = model(
        &["x"],
        vec![],
        vec![node("a", "Add", &["x", "nowhere"], &["y"])],
        &["y"],
    );
    let err = load_model_from_bytes(&m.encode_to_vec()).unwrap_err();
    match &err {
        IrError::DanglingInput { node, value, .. } => {
            assert_eq!((node.as_str(), value.as_str()), ("a", "nowhere"));
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("'nowhere'"), "{err}");

    let m = model(
        &["x"],
        vec![],
        vec![node("a", "Relu", &["x"], &["y"])],
        &["z"],
    );
    assert!(matches!(
        Model::from_proto(m, None),
        Err(IrError::DanglingOutput { value, .. }) if value == "z"
    ));
    // Empty names are omitted optional inputs, not dangling ones.
    let m = model(
        &["x"],
        vec![],
        vec![node("c", "Clip", &["x", "", ""], &["y"])],
        &["y"],
    );
    assert!(Model::from_proto(m, None).is_ok());
}

#[test]
fn duplicate_outputs() {
    let m = model(
        &["x"],
        vec![],
        vec![
            node("a", "Relu", &["x"], &["y"]),
            node("b", "Sigmoid", &["x"], &["y"]),
        ],
        &["y"],
    );
    let err = Model::from_proto(m, None).unwrap_err();
    assert!(
        matches!(&err, IrError::DuplicateOutput { value, .. } if value == "y"),
        "{err:?}"
    );
    assert!(err.to_string().contains("'b'"), "{err}");
    // Overwriting a graph input is a duplicate too.
    let m = model(
        &["x"],
        vec![],
        vec![node("a", "Relu", &["x"], &["x"])],
        &["x"],
    );
    assert!(matches!(
        Model::from_proto(m, None),
        Err(IrError::DuplicateOutput { .. })
    ));
    // Several omitted optional outputs are fine.
    let m = model(
        &["x"],
        vec![],
        vec![
            node("d", "Dropout", &["x"], &["y", ""]),
            node("e", "Dropout", &["y"], &["z", ""]),
        ],
        &["z"],
    );
    assert!(Model::from_proto(m, None).is_ok());
}

#[test]
fn unknown_node_name() {
    let m = load_model_from_bytes(&small_model_bytes()).unwrap();
    exercise(&m);
    assert_eq!(hmct_ir::quantized_nodes(&m), [m.node_id("conv").unwrap()]);
    let err = m.node_id("Conv_99").unwrap_err();
    assert!(matches!(&err, IrError::UnknownNode { name, .. } if name == "Conv_99"));
    assert!(err.to_string().contains("Conv_99"));
    assert!(matches!(
        m.calibration_by_name("conv"),
        Err(IrError::NotCalibration { .. })
    ));
}

#[test]
fn unsorted_graph_is_sorted_and_unnamed_nodes_named() {
    let m = model(
        &["x"],
        vec![],
        vec![
            node("", "Relu", &["b"], &["y"]),
            node("", "Sigmoid", &["a"], &["b"]),
            node("Relu_0", "Relu", &["x"], &["a"]),
            node("dup", "Neg", &["x"], &["n1"]),
            node("dup", "Neg", &["n1"], &["n2"]),
        ],
        &["y", "n2"],
    );
    let model = Model::from_proto(m, None).unwrap();
    let names: Vec<&str> = model.nodes().iter().map(|n| n.name()).collect();
    // "Relu_0" is taken by a named node, so the unnamed Relu at position 0 moves on.
    assert_eq!(names, ["Relu_0", "Sigmoid_1", "Relu_1", "dup", "dup_1"]);
    assert_eq!(model.producer("b"), Some(1));
    assert_eq!(model.consumers("x"), [0, 3]);
    assert_eq!(model.type2nodes()["Relu"], [0, 2]);
    assert_eq!(model.node_mappings()["dup_1"], 4);
    // Stable: loading the saved model changes nothing more.
    let bytes = model_to_bytes(&model);
    assert_eq!(
        model_to_bytes(&load_model_from_bytes(&bytes).unwrap()),
        bytes
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = load_model_from_bytes(&bytes);
    }

    #[test]
    fn mutated_model_never_panics(flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6)) {
        let mut bytes = small_model_bytes();
        for (i, b) in flips {
            let at = i.index(bytes.len());
            bytes[at] = b;
        }
        if let Ok(m) = load_model_from_bytes(&bytes) {
            // Whatever loads must save and load again, and every read must work.
            let saved = model_to_bytes(&m);
            prop_assert!(load_model_from_bytes(&saved).is_ok());
            exercise(&m);
        }
    }
}
