//! Saving: atomic writes, file modes, the `horizon` opset import.

mod common;

use common::{calib, model, node};
use hmct_ir::{IrError, Model, load_model, model_to_bytes, save_model};
use hmct_proto::Message;
use hmct_proto::onnx::OperatorSetIdProto;

fn plain() -> Model {
    Model::from_proto(
        model(
            &["x"],
            vec![],
            vec![node("r", "Relu", &["x"], &["y"])],
            &["y"],
        ),
        None,
    )
    .unwrap()
}

fn calibrated() -> hmct_proto::onnx::ModelProto {
    model(
        &["x"],
        vec![],
        vec![calib("c", "x", "xc"), node("r", "Relu", &["xc"], &["y"])],
        &["y"],
    )
}

#[test]
fn horizon_opset_only_when_needed() {
    let m = plain();
    assert_eq!(
        model_to_bytes(&m),
        m.proto().encode_to_vec(),
        "nothing added without calibration nodes"
    );
    assert_eq!(m.opset("horizon"), None);

    let m = Model::from_proto(calibrated(), None).unwrap();
    let back = hmct_ir::load_model_from_bytes(&model_to_bytes(&m)).unwrap();
    let horizon: Vec<&OperatorSetIdProto> = back
        .proto()
        .opset_import
        .iter()
        .filter(|o| o.domain() == "horizon")
        .collect();
    assert_eq!(horizon.len(), 1);
    assert_eq!(horizon[0].version(), 1);
    // Already declared (with another version): left as is.
    let mut p = calibrated();
    p.opset_import.push(OperatorSetIdProto {
        domain: Some("horizon".into()),
        version: Some(2),
    });
    let m = Model::from_proto(p.clone(), None).unwrap();
    assert_eq!(model_to_bytes(&m), p.encode_to_vec());
    assert_eq!(m.opset("horizon"), Some(2));
    assert_eq!(m.opset("ai.onnx"), Some(17));
    assert_eq!(m.opset(""), Some(17));
}

#[cfg(unix)]
#[test]
fn saved_files_have_ordinary_modes() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.onnx");
    save_model(&plain(), &path).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o644
    );
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    save_model(&plain(), &path).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o640
    );
    assert_eq!(load_model(&path).unwrap().nodes().len(), 1);
}

#[test]
fn failed_save_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing/m.onnx");
    let err = save_model(&plain(), &path).unwrap_err();
    assert!(matches!(err, IrError::Io { .. }));
    assert!(err.to_string().contains("missing/m.onnx"), "{err}");
    // Saving over a folder fails and leaves the folder and no temporary file.
    let folder = dir.path().join("folder");
    std::fs::create_dir(&folder).unwrap();
    assert!(save_model(&plain(), &folder).is_err());
    assert!(folder.is_dir());
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names, ["folder"]);
}

#[test]
fn constants_and_value_types() {
    use hmct_proto::onnx::{AttributeProto, attribute_proto::AttributeType};
    let mut k = node("k", "Constant", &[], &["kv"]);
    k.attribute = vec![AttributeProto {
        name: Some("value_ints".into()),
        r#type: Some(AttributeType::Ints as i32),
        ints: vec![1, 2, 3],
        ..Default::default()
    }];
    let mut f = node("f", "Constant", &[], &["fv"]);
    f.attribute = vec![AttributeProto {
        name: Some("value".into()),
        r#type: Some(AttributeType::Tensor as i32),
        t: Some(common::f32_init("", &[2], vec![0.5, -1.0])),
        ..Default::default()
    }];
    let m = Model::from_proto(
        model(
            &["x"],
            vec![common::f32_init("w", &[1], vec![2.0])],
            vec![
                k,
                f,
                node("r", "Reshape", &["x", "kv"], &["y"]),
                node("a", "Add", &["y", "w"], &["z"]),
            ],
            &["z"],
        ),
        None,
    )
    .unwrap();
    assert!(m.is_constant("kv") && m.is_constant("w") && m.is_constant("fv"));
    assert!(!m.is_constant("x") && !m.is_constant("y"));
    let kv = m.constant_tensor("kv").unwrap().unwrap();
    assert_eq!(kv.to_i64_vec().unwrap(), [1, 2, 3]);
    assert_eq!(kv.shape(), [3]);
    let fv = m.constant_tensor("fv").unwrap().unwrap();
    assert_eq!(
        fv.as_f32().unwrap().iter().copied().collect::<Vec<_>>(),
        [0.5, -1.0]
    );
    assert_eq!(
        m.constant_tensor("w")
            .unwrap()
            .unwrap()
            .to_f64_vec()
            .unwrap(),
        [2.0]
    );
    assert!(m.constant_tensor("y").unwrap().is_none());
    assert_eq!(m.inputs(), ["x"]);
    assert_eq!(m.outputs(), ["z"]);
    assert_eq!(m.value_type("x").unwrap().to_string(), "float[1, 4]");
    assert!(m.value_type("z").is_none(), "declared without a type");
}

/// Two floats `w`, stored in `weights.bin` beside the model.
fn external_w() -> hmct_proto::onnx::TensorProto {
    use hmct_proto::onnx::{StringStringEntryProto, TensorProto};
    TensorProto {
        name: Some("w".into()),
        dims: vec![2],
        data_type: Some(1),
        data_location: Some(1),
        external_data: vec![StringStringEntryProto {
            key: Some("location".into()),
            value: Some("weights.bin".into()),
        }],
        ..Default::default()
    }
}

#[test]
fn external_data_is_read_from_the_model_folder() {
    let w = external_w();
    let p = model(
        &["x"],
        vec![w],
        vec![node("a", "Add", &["x", "w"], &["y"])],
        &["y"],
    );
    let dir = tempfile::tempdir().unwrap();
    let bytes: Vec<u8> = [1.5f32, -2.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    std::fs::write(dir.path().join("weights.bin"), bytes).unwrap();
    let path = dir.path().join("m.onnx");
    std::fs::write(&path, p.encode_to_vec()).unwrap();

    let m = load_model(&path).unwrap();
    assert_eq!(m.base_dir(), Some(dir.path()));
    let t = m.constant_tensor("w").unwrap().unwrap();
    assert_eq!(t.to_f64_vec().unwrap(), [1.5, -2.0]);
    // From bytes there is no folder to read it from: an error naming the value.
    let m = hmct_ir::load_model_from_bytes(&p.encode_to_vec()).unwrap();
    let err = m.constant_tensor("w").unwrap_err();
    assert!(
        matches!(&err, IrError::Tensor { value, .. } if value == "w"),
        "{err}"
    );
}

#[test]
fn absurd_shapes_are_errors() {
    for dims in [
        vec![0, 1 << 62, 1 << 62],
        vec![1 << 40, 1 << 40],
        vec![-1, 4],
    ] {
        let t = common::f32_init("w", &dims, vec![]);
        let p = model(
            &["x"],
            vec![t],
            vec![node("a", "Add", &["x", "w"], &["y"])],
            &["y"],
        );
        let m = Model::from_proto(p, None).unwrap();
        assert!(m.constant_tensor("w").is_err(), "{dims:?}");
    }
}

/// A model with an external tensor saved into another folder takes its data along
/// (`<file>.data` beside it), and one saved with every large initializer external
/// reads back the same values, with the data in the side file and not the message.
#[test]
fn external_data_follows_the_model_and_large_initializers_can_go_external() {
    let w = external_w();
    let big: Vec<f32> = (0..1000).map(|k| k as f32 * 0.25 - 7.0).collect();
    let b = common::f32_init("b", &[1000], big.clone());
    let p = model(
        &["x"],
        vec![w, b],
        vec![
            node("a", "Add", &["x", "w"], &["y"]),
            node("c", "Add", &["y", "b"], &["z"]),
        ],
        &["z"],
    );
    let source = tempfile::tempdir().unwrap();
    let bytes: Vec<u8> = [1.5f32, -2.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    std::fs::write(source.path().join("weights.bin"), bytes).unwrap();
    let path = source.path().join("m.onnx");
    std::fs::write(&path, p.encode_to_vec()).unwrap();
    let m = load_model(&path).unwrap();

    // Same folder: nothing moves, no data file appears.
    save_model(&m, source.path().join("again.onnx")).unwrap();
    assert!(!source.path().join("again.onnx.data").exists());

    // Another folder: the external tensor comes along into the side file.
    let target = tempfile::tempdir().unwrap();
    let moved = target.path().join("moved.onnx");
    save_model(&m, &moved).unwrap();
    assert!(target.path().join("moved.onnx.data").exists());
    drop(m);
    std::fs::remove_file(source.path().join("weights.bin")).unwrap();
    let back = load_model(&moved).unwrap();
    assert_eq!(
        back.constant_tensor("w")
            .unwrap()
            .unwrap()
            .to_f64_vec()
            .unwrap(),
        [1.5, -2.0]
    );

    // Every initializer of at least 1 KiB external: `b` (4000 bytes) goes out, `w`
    // (already external) too; the values read back bit for bit.
    let all = target.path().join("all.onnx");
    let data = hmct_ir::save_model_with_external_data(&back, &all, 1024).unwrap();
    assert_eq!(data, target.path().join("all.onnx.data"));
    assert_eq!(std::fs::metadata(&data).unwrap().len(), 8 + 4000);
    assert!(
        std::fs::metadata(&all).unwrap().len() < 4000,
        "the message holds no weights"
    );
    let again = load_model(&all).unwrap();
    let got = again
        .constant_tensor("b")
        .unwrap()
        .unwrap()
        .to_f64_vec()
        .unwrap();
    assert_eq!(got, big.iter().map(|&v| f64::from(v)).collect::<Vec<_>>());
    assert_eq!(
        again
            .constant_tensor("w")
            .unwrap()
            .unwrap()
            .to_f64_vec()
            .unwrap(),
        [1.5, -2.0]
    );
    // Re-saving over itself reads the old side file before replacing it.
    hmct_ir::save_model_with_external_data(&again, &all, 1024).unwrap();
    let once_more = load_model(&all).unwrap();
    assert_eq!(
        once_more
            .constant_tensor("b")
            .unwrap()
            .unwrap()
            .to_f64_vec()
            .unwrap(),
        got
    );
}
