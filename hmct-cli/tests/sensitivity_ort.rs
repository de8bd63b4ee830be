//! `get-sensitivity-of-nodes` against tools/ort_sensitivity.py, the same analysis
//! done the way Horizon's tool does it (QDQ / Identity per calibration node, one
//! onnxruntime session per candidate): identical rankings and cosine within 1e-5.
//!
//! Two implementations agree only to float rounding (a few 1e-10 on the cosine of
//! these models), so candidates whose cosines are closer than that are ties that
//! either may order differently. The PP-OCR classifier has many: its two-class
//! softmax output is saturated, and two dozen of its nodes move the cosine by less
//! than 1e-12. The rankings must be identical up to such ties (pairs closer than
//! 1e-9 on both sides); pnet and rnet must match exactly.
//!
//! Runs only when `HMCT_PYTHON` names a Python with onnx 1.23.2, onnxruntime 1.32.0
//! and numpy (e.g. `HMCT_PYTHON=/tmp/pyenv/bin/python`); otherwise it says so and
//! passes. Needs ../shared/models. Prints the measured differences with
//! `-- --nocapture`.

use std::path::{Path, PathBuf};
use std::process::Command;

use hmct_ir::Model;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/ort_sensitivity.py")
}

/// The models compared, through the stand-in calibration (int8, per-channel
/// weights, per-tensor activations), and whether near-ties may swap.
fn models() -> Vec<(&'static str, Model, PathBuf, bool)> {
    let Some(shared) = hmct_ir::testing::shared_dir() else {
        return Vec::new();
    };
    let models = shared.join("models");
    let pnet = hmct_ir::testing::calibrated_pnet().unwrap().unwrap();
    let cls =
        hmct_ir::load_model(models.join("rapidocr_ppocr_cls/ch_ppocr_mobile_v2.0_cls_infer.onnx"))
            .unwrap();
    let cls = hmct_ir::testing::calibrate_for_tests(cls, 4.0).unwrap();
    let rnet = hmct_ir::load_model(models.join("mtcnn_rnet/rnet.onnx")).unwrap();
    let rnet = hmct_ir::testing::calibrate_for_tests(rnet, 2.0).unwrap();
    vec![
        (
            "pnet",
            pnet,
            models.join("mtcnn_pnet/calibration_data"),
            false,
        ),
        (
            "rnet",
            rnet,
            models.join("mtcnn_rnet/calibration_data"),
            false,
        ),
        (
            "cls",
            cls,
            models.join("rapidocr_ppocr_cls/calibration_data"),
            true,
        ),
    ]
}

struct Entry {
    name: String,
    values: Vec<(String, f64)>,
}

fn entries(path: &Path) -> Vec<Entry> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| Entry {
            name: e["name"].as_str().unwrap().to_string(),
            values: e["values"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| {
                    let x = match v {
                        serde_json::Value::String(s) => s.parse::<f64>().unwrap(),
                        other => other.as_f64().unwrap(),
                    };
                    (k.clone(), x)
                })
                .collect(),
        })
        .collect()
}

#[test]
fn rankings_and_values_match_onnxruntime() {
    let Some(python) = hmct_ir::testing::python() else {
        return;
    };
    let models = models();
    if models.is_empty() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut report = Vec::new();
    for (label, model, data, near_ties) in &models {
        let model_path = dir.path().join(format!("{label}.onnx"));
        hmct_ir::save_model(model, &model_path).unwrap();
        for node_type in ["node", "weight", "activation"] {
            let ours = dir.path().join(format!("{label}_{node_type}_ours.json"));
            let theirs = dir.path().join(format!("{label}_{node_type}_ort.json"));
            let out = Command::new(env!("CARGO_BIN_EXE_hmct-debugger"))
                .args([
                    "get-sensitivity-of-nodes".as_ref(),
                    model_path.as_os_str(),
                    data.as_os_str(),
                ])
                .args([
                    "-n",
                    node_type,
                    "-m",
                    "[cosine-similarity,mse,sqnr]",
                    "--json",
                ])
                .arg(&ours)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let out = Command::new(&python)
                .arg(script())
                .args([model_path.as_os_str(), data.as_os_str()])
                .args([
                    "-n",
                    node_type,
                    "-m",
                    "cosine-similarity",
                    "mse",
                    "sqnr",
                    "--json",
                ])
                .arg(&theirs)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "ort_sensitivity.py: {}",
                String::from_utf8_lossy(&out.stderr)
            );

            let (a, b) = (entries(&ours), entries(&theirs));
            let mut names_a: Vec<&str> = a.iter().map(|e| e.name.as_str()).collect();
            let mut names_b: Vec<&str> = b.iter().map(|e| e.name.as_str()).collect();
            let cos = |e: &Entry| {
                e.values
                    .iter()
                    .find(|(k, _)| k == "cosine-similarity")
                    .unwrap()
                    .1
            };
            let mse = |e: &Entry| e.values.iter().find(|(k, _)| k == "mse").unwrap().1;
            let swaps = swapped_pairs(&a, &b, cos);
            let ties = swaps.iter().filter(|s| s.2 <= 1e-9 && s.3 <= 1e-9).count();
            if *near_ties {
                assert_eq!(
                    ties,
                    swaps.len(),
                    "{label} {node_type}: order differs beyond ties: {swaps:?}"
                );
            } else {
                assert_eq!(names_a, names_b, "{label} {node_type}: rankings differ");
            }
            names_a.sort_unstable();
            names_b.sort_unstable();
            assert_eq!(names_a, names_b, "{label} {node_type}: candidates differ");
            let mut max_cos = 0f64;
            let mut max_rel_mse = 0f64;
            for x in &a {
                let y = b.iter().find(|e| e.name == x.name).unwrap();
                max_cos = max_cos.max((cos(x) - cos(y)).abs());
                let scale = mse(x).abs().max(mse(y).abs()).max(1e-30);
                max_rel_mse = max_rel_mse.max((mse(x) - mse(y)).abs() / scale);
            }
            assert!(
                max_cos <= 1e-5,
                "{label} {node_type}: cosine differs by {max_cos:e}"
            );
            report.push(format!(
                "{label:<5} {node_type:<10} {:>3} candidates, {} pair(s) ordered differently (all ties below 1e-9), max |Δcos| {max_cos:.1e}, max relative Δmse {max_rel_mse:.1e}",
                a.len(),
                swaps.len()
            ));
        }
    }
    for line in report {
        eprintln!("{line}");
    }
}

/// Pairs ranked one way by `a` and the other way by `b`: (first, second, |Δ| of
/// the ranking metric in `a`, the same in `b`).
fn swapped_pairs(
    a: &[Entry],
    b: &[Entry],
    metric: impl Fn(&Entry) -> f64,
) -> Vec<(String, String, f64, f64)> {
    let pos_b = |name: &str| b.iter().position(|e| e.name == name).unwrap();
    let mut swaps = Vec::new();
    for i in 0..a.len() {
        for j in i + 1..a.len() {
            let (bi, bj) = (pos_b(&a[i].name), pos_b(&a[j].name));
            if bi > bj {
                swaps.push((
                    a[i].name.clone(),
                    a[j].name.clone(),
                    (metric(&a[i]) - metric(&a[j])).abs(),
                    (metric(&b[bi]) - metric(&b[bj])).abs(),
                ));
            }
        }
    }
    swaps
}
