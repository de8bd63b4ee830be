//! `hmct-debugger summary` through the built binary.

use std::path::Path;
use std::process::{Command, Output};

fn run(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hmct-debugger"))
        .args(args)
        .output()
        .unwrap()
}

fn calibrated_pnet(dir: &Path) -> Option<std::path::PathBuf> {
    let Some(model) = hmct_ir::testing::calibrated_pnet().unwrap() else {
        return None;
    };
    let path = dir.join("calibrated_model.onnx");
    hmct_ir::save_model(&model, &path).unwrap();
    Some(path)
}

#[test]
fn summary_of_calibrated_model() {
    let dir = tempfile::tempdir().unwrap();
    let Some(model) = calibrated_pnet(dir.path()) else {
        return;
    };
    let json = dir.path().join("summary.json");
    let out = run(&[
        "summary".as_ref(),
        model.as_os_str(),
        "--json".as_ref(),
        json.as_os_str(),
    ]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("ir_version  7"), "{stdout}");
    assert!(stdout.contains("input_1 float[N, M1, M2, 3]"), "{stdout}");
    assert!(stdout.contains("ai.onnx 12, horizon 1"), "{stdout}");
    assert!(
        stdout
            .contains("calibration nodes: 9 (5 weight, 4 activation); quantized regular nodes: 5"),
        "{stdout}"
    );
    let row = stdout
        .lines()
        .find(|l| l.starts_with("p_re_lu_2/add:0_HzCalibration"))
        .unwrap_or_else(|| panic!("{stdout}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells,
        [
            "p_re_lu_2/add:0_HzCalibration",
            "activation",
            "int8",
            "4.000000",
            "no",
            "ON",
            "conv2d_4;conv2d_3"
        ]
    );
    let weight = stdout
        .lines()
        .find(|l| l.starts_with("conv2d/kernel:0_HzCalibration"))
        .unwrap();
    assert!(
        weight.contains("weight") && weight.contains("yes (10)"),
        "{weight}"
    );

    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["ir_version"], 7);
    assert_eq!(v["node_count"], 22);
    assert_eq!(v["op_counts"]["HzCalibration"], 9);
    assert_eq!(v["op_counts"]["Conv"], 5);
    assert_eq!(v["quantized_nodes"], 5);
    assert_eq!(
        v["inputs"][0]["shape"],
        serde_json::json!(["N", "M1", "M2", "3"])
    );
    let calibs = v["calibration_nodes"].as_array().unwrap();
    assert_eq!(calibs.len(), 9);
    let w = calibs
        .iter()
        .find(|c| c["name"] == "conv2d/kernel:0_HzCalibration")
        .unwrap();
    assert_eq!(w["kind"], "weight");
    assert_eq!(w["per_channel"], true);
    assert_eq!(w["thresholds"], 10);
    assert_eq!(w["consumers"], "conv2d");
}

#[test]
fn summary_of_uncalibrated_model() {
    let Some(shared) = hmct_ir::testing::shared_dir() else {
        return;
    };
    let model = shared.join("models/rapidocr_ppocr_cls/ch_ppocr_mobile_v2.0_cls_infer.onnx");
    let out = run(&["summary".as_ref(), model.as_os_str()]);
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout
            .contains("calibration nodes: 0 (0 weight, 0 activation); quantized regular nodes: 0"),
        "{stdout}"
    );
    assert!(stdout.contains("nodes       566 ("), "{stdout}");
}

#[test]
fn errors_are_one_line_with_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.onnx");
    let out = run(&["summary".as_ref(), missing.as_os_str()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.starts_with("error: ") && err.contains("missing.onnx"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");

    let junk = dir.path().join("junk.onnx");
    std::fs::write(&junk, b"not a model").unwrap();
    let json = dir.path().join("out.json");
    let out = run(&[
        "summary".as_ref(),
        junk.as_os_str(),
        "--json".as_ref(),
        json.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.starts_with("error: ") && err.contains("not an ONNX model"),
        "{err}"
    );
    assert!(!json.exists(), "no JSON for a failed run");

    let out = run(&["summary".as_ref()]);
    assert_eq!(out.status.code(), Some(2), "usage error");
    let out = run(&["no-such-command".as_ref()]);
    assert_eq!(out.status.code(), Some(2), "usage error");
}
