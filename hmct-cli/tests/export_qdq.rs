//! `export-qdq` checked outside our own code: onnxruntime's outputs of the exported
//! model equal our interpreter's outputs of the calibrated model (tools/run_ort.py,
//! which also runs onnx's checker). Cases: the bundled int8 model (standard ops at
//! opset 17), and the same model after `modify` to int16, float16 and OFF nodes
//! (com.microsoft ops, Cast pairs, removed nodes). Runs only when `HMCT_PYTHON` names
//! a Python with tools/requirements.txt installed; the command's output is checked
//! always.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn debugger(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_hmct-debugger"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "hmct-debugger {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn exported_models_match_our_interpreter_in_onnxruntime() {
    let dir = tempfile::tempdir().unwrap();
    let example = repo().join("examples/tiny_cnn");
    let data = example.join("calibration_data");
    let calibrated = example.join("calibrated_model.onnx");
    let mixed = dir.path().join("mixed.onnx");
    debugger(&[
        "modify",
        calibrated.to_str().unwrap(),
        "-o",
        mixed.to_str().unwrap(),
        "--all-activations",
        "int16",
        "--nodes",
        "[flatten_out_HzCalibration]",
        "--qtype",
        "float16",
        "--switch",
        "res_conv1=OFF",
        "--switch",
        "logits_HzCalibration=OFF",
    ]);
    let cases = [
        (
            calibrated.clone(),
            "standard QuantizeLinear/DequantizeLinear",
            "17 calibration node(s) as QuantizeLinear/DequantizeLinear, 0 as a float16 Cast pair, 0 removed",
        ),
        (
            mixed.clone(),
            "com.microsoft QuantizeLinear/DequantizeLinear",
            "13 calibration node(s) as QuantizeLinear/DequantizeLinear, 1 as a float16 Cast pair, 3 removed",
        ),
    ];
    let python = std::env::var_os("HMCT_PYTHON").map(PathBuf::from);
    if python.is_none() {
        eprintln!(
            "onnxruntime comparison skipped: set HMCT_PYTHON to a python with tools/requirements.txt"
        );
    }
    for (i, (model, ops, counts)) in cases.iter().enumerate() {
        let qdq = dir.path().join(format!("qdq{i}.onnx"));
        let stdout = debugger(&[
            "export-qdq",
            model.to_str().unwrap(),
            "-o",
            qdq.to_str().unwrap(),
        ]);
        assert!(stdout.contains(ops) && stdout.contains(counts), "{stdout}");
        let Some(python) = &python else { continue };
        let ours = dir.path().join(format!("ours{i}"));
        debugger(&[
            "run",
            model.to_str().unwrap(),
            data.to_str().unwrap(),
            "-o",
            ours.to_str().unwrap(),
        ]);
        let out = Command::new(python)
            .arg(repo().join("tools/run_ort.py"))
            .args([&qdq, &data, &ours])
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}: {report}{}",
            model.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            report.contains("logits:") && report.contains("prob:"),
            "{report}"
        );
    }
}
