//! `info` when some samples give NaN outputs: the means skip them, and a warning says
//! how many, so a table over the remaining samples is not taken for the whole data.

use std::path::Path;
use std::process::Command;

use hmct_ir::testing::build::{float_value, model, node};
use hmct_proto::onnx::TensorProto;

/// y = Log(x * x - 1): NaN wherever |x| < 1.
fn write_model(path: &Path) {
    let proto = model(
        vec![float_value("x", &[1, 4])],
        vec![
            node("square", "Mul", &["x", "x"], &["square"]),
            node("shifted", "Sub", &["square", "one"], &["shifted"]),
            node("y", "Log", &["shifted"], &["y"]),
        ],
        vec![TensorProto {
            name: Some("one".into()),
            data_type: Some(1),
            float_data: vec![1.0],
            ..Default::default()
        }],
        vec![float_value("y", &[1, 4])],
    );
    let model = hmct_ir::Model::from_proto(proto, None).unwrap();
    hmct_ir::save_model(&model, path).unwrap();
}

fn debugger(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hmct-debugger"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn nan_samples_are_counted_in_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let float = dir.path().join("float.onnx");
    write_model(&float);
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("x")).unwrap();
    let samples = [
        [2.0f32, 3.0, 4.0, 5.0],
        [1.5, 2.5, 3.5, 4.5],
        [0.1, 0.2, 0.3, 0.4],
    ];
    for (i, s) in samples.iter().enumerate() {
        let x = hmct_tensor::Tensor::from_f32(&[1, 4], s.to_vec()).unwrap();
        hmct_tensor::write_npy(&data.join(format!("x/{i}.npy")), &x).unwrap();
    }
    let calibrated = dir.path().join("calibrated.onnx");
    let out = debugger(&[
        "calibrate".as_ref(),
        float.as_os_str(),
        data.as_os_str(),
        "-o".as_ref(),
        calibrated.as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = debugger(&["info".as_ref(), calibrated.as_os_str(), data.as_os_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: output 'y': 1 of 3 sample(s) give NaN"),
        "{stderr}"
    );
    // The figures are those of the two finite samples: a number, not NaN.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let row = stdout.lines().find(|l| l.starts_with("y ")).unwrap();
    assert!(!row.contains("NaN") && !row.contains("nan"), "{row}");

    // Only finite samples: no warning.
    std::fs::remove_file(data.join("x/2.npy")).unwrap();
    let out = debugger(&["info".as_ref(), calibrated.as_os_str(), data.as_os_str()]);
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("NaN"));
}
