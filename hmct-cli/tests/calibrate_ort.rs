//! `calibrate` checked outside our own code: for each model, calibrate it with the
//! CLI, run the calibrated model with our interpreter (`run --calibrated`), then let
//! tools/check_calibrated.py confirm that onnx's checker accepts the file and that the
//! model with every HzCalibration node replaced by QuantizeLinear/DequantizeLinear
//! gives the same outputs in onnxruntime.
//!
//! Runs only when `HMCT_PYTHON` names a Python with tools/requirements.txt installed
//! (.ci/run sets it up); otherwise it says so and passes. The bundled example always
//! takes part; the models of ../shared/models when present.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn debugger(args: &[&str]) {
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
}

/// (label, float model, data, calibrate flags): every method and both integer widths.
fn cases() -> Vec<(String, PathBuf, PathBuf, Vec<&'static str>)> {
    let example = repo().join("examples/tiny_cnn");
    let mut cases = vec![(
        "tiny_cnn max int8".to_string(),
        example.join("float_model.onnx"),
        example.join("calibration_data"),
        vec!["--method", "max"],
    )];
    // Without the shared models, only the bundled example is checked.
    let Some(models) = hmct_ir::testing::shared_path("models") else {
        return cases;
    };
    for (dir, file, flags) in [
        ("mtcnn_pnet", "pnet.onnx", vec!["--method", "kl"]),
        ("mtcnn_rnet", "rnet.onnx", vec!["--method", "mse"]),
        ("mtcnn_onet", "onet.onnx", vec!["--method", "percentile"]),
        (
            "rapidocr_ppocr_cls",
            "ch_ppocr_mobile_v2.0_cls_infer.onnx",
            vec!["--method", "max", "--qtype", "int16"],
        ),
    ] {
        cases.push((
            format!("{dir} {}", flags.join(" ")),
            models.join(dir).join(file),
            models.join(dir).join("calibration_data"),
            flags,
        ));
    }
    cases
}

#[test]
fn calibrated_models_pass_onnx_checker_and_match_onnxruntime_qdq() {
    let Some(python) = hmct_ir::testing::python() else {
        return;
    };
    let script = repo().join("tools/check_calibrated.py");
    for (label, model, data, flags) in cases() {
        let tmp = tempfile::tempdir().unwrap();
        let calibrated = tmp.path().join("calibrated.onnx");
        let ours = tmp.path().join("ours");
        let (model_s, data_s) = (model.to_str().unwrap(), data.to_str().unwrap());
        let mut args = vec![
            "calibrate",
            model_s,
            data_s,
            "-o",
            calibrated.to_str().unwrap(),
        ];
        args.extend(flags.iter().copied());
        debugger(&args);
        debugger(&[
            "run",
            calibrated.to_str().unwrap(),
            data_s,
            "--calibrated",
            "-o",
            ours.to_str().unwrap(),
        ]);
        // Two engines round float ops differently, and a value that lands on the other
        // side of a quantization boundary moves by a whole step, and with it what
        // depends on it downstream: allow one element in 10,000 to differ, or the
        // elements of one sample of the eight (a wrong scale, rounding rule or axis
        // moves every sample).
        let out = Command::new(&python)
            .arg(&script)
            .args([calibrated.as_os_str(), data.as_os_str(), ours.as_os_str()])
            .args(["--max-mismatch", "1e-4", "--flip-samples", "1"])
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&out.stdout);
        println!("{label}:\n{report}");
        assert!(
            out.status.success(),
            "{label}: {report}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(report.contains("onnx checker: ok"), "{label}: {report}");
    }
}
