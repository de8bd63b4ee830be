//! `calibrate` leaves tensors that depend on no data unquantized (here the zeros of
//! a `ConstantOfShape` added to the input, as in YOLOv8's head) and says so, in its
//! output and, through the model's metadata, in `summary` and its JSON.

use std::path::Path;
use std::process::Command;

use hmct_ir::testing::build::{self, float_value, named_value, node};
use hmct_tensor::Tensor;

fn debugger(args: &[&Path]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_hmct-debugger"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn constant_of_shape_is_left_float_and_summary_says_so() {
    let dir = tempfile::tempdir().unwrap();
    // x → Shape → ConstantOfShape (zeros) → zeros; Add(x, zeros) → Relu → y
    let proto = build::model(
        vec![float_value("x", &[1, 2, 4, 4])],
        vec![
            node("shape", "Shape", &["x"], &["x_shape"]),
            node("zeros", "ConstantOfShape", &["x_shape"], &["zeros"]),
            node("add", "Add", &["x", "zeros"], &["sum"]),
            node("relu", "Relu", &["sum"], &["y"]),
        ],
        vec![],
        vec![named_value("y")],
    );
    let model = dir.path().join("float.onnx");
    let m = hmct_ir::Model::from_proto(proto, None).unwrap();
    hmct_ir::save_model(&m, &model).unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    for i in 0..2 {
        let x = Tensor::from_f32(
            &[1, 2, 4, 4],
            (0..32).map(|k| (k + i) as f32 / 7.0 - 2.0).collect(),
        )
        .unwrap();
        hmct_tensor::write_npy(&data.join(format!("{i}.npy")), &x).unwrap();
    }
    let calibrated = dir.path().join("calibrated.onnx");
    let stdout = debugger(&[
        Path::new("calibrate"),
        &model,
        &data,
        Path::new("-o"),
        &calibrated,
    ]);
    let sentence = "1 constant-foldable input(s) left unquantized";
    assert!(
        stdout.contains(sentence) && stdout.contains(": zeros"),
        "{stdout}"
    );
    assert!(
        stdout.contains("1 calibration nodes (1 activation"),
        "{stdout}"
    );

    let summary = debugger(&[Path::new("summary"), &calibrated]);
    assert!(
        summary.contains("calibrated by hmct-debugger calibrate: method max on 2 sample(s)")
            && summary.contains(sentence),
        "{summary}"
    );
    let json = dir.path().join("summary.json");
    debugger(&[
        Path::new("summary"),
        &calibrated,
        Path::new("--json"),
        &json,
    ]);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    assert!(
        v["calibrated_by"].as_str().unwrap().contains(sentence),
        "{v}"
    );
    let nodes = v["calibration_nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0]["name"], "x_HzCalibration");
}
