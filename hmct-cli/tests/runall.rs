//! `runall` on the bundled example: the documented tree, an index that lists exactly
//! the files written, real pictures, clean re-runs, and argument mistakes that leave
//! the result folder as it was.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/tiny_cnn")
}

fn runall(save_dir: &Path, extra: &[&str]) -> Output {
    let ex = example();
    Command::new(env!("CARGO_BIN_EXE_hmct-debugger"))
        .arg("runall")
        .arg(ex.join("calibrated_model.onnx"))
        .arg(ex.join("calibration_data"))
        .arg("-s")
        .arg(save_dir)
        .args(extra)
        .output()
        .unwrap()
}

/// Every file under `dir`, relative to it.
fn tree(dir: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.insert(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, dir, &mut out);
    out
}

fn summary(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap()
}

#[test]
fn default_flow_writes_the_documented_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("result");
    let out = runall(&dir, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("summary.json"), "{stdout}");

    let files = tree(&dir);
    let top: BTreeSet<&str> = files.iter().map(|f| f.split('/').next().unwrap()).collect();
    assert_eq!(
        top,
        BTreeSet::from([
            "accumulate_error",
            "channelwise_distribution",
            "data_distribution",
            "health.json",
            "node_sensitivity",
            "report.html",
            "sensitivity_analysis",
            "summary.json",
        ]),
        "{files:?}"
    );
    for expected in [
        "node_sensitivity/sensitivity_of_weight.log",
        "node_sensitivity/sensitivity_of_activation.log",
        "accumulate_error/weight_activation_quantized_separately_cosine-similarity.png",
        "sensitivity_analysis/partial_quantization.png",
        "sensitivity_analysis/partial_quantization.json",
    ] {
        assert!(
            files.contains(expected),
            "{expected} missing from {files:?}"
        );
    }
    // Top 5 weights and top 5 activations: a distribution and a box plot each.
    let count = |prefix: &str, suffix: &str| {
        files
            .iter()
            .filter(|f| f.starts_with(prefix) && f.ends_with(suffix))
            .count()
    };
    assert_eq!(count("data_distribution/weight_", ".png"), 5);
    assert_eq!(count("data_distribution/activation_", ".png"), 5);
    assert_eq!(count("channelwise_distribution/", "_boxplot.png"), 10);

    // The index lists exactly the files written (besides itself and the report,
    // which it names on its own).
    let s = summary(&dir);
    let indexed: BTreeSet<String> = s["steps"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|step| step["files"].as_array().unwrap().iter())
        .map(|f| f.as_str().unwrap().to_string())
        .collect();
    let mut written = files.clone();
    written.remove("summary.json");
    written.remove("report.html");
    assert_eq!(indexed, written);
    assert_eq!(s["report"], "report.html");
    assert_eq!(s["steps"].as_array().unwrap().len(), 7);
    assert_eq!(s["top"][0]["node_type"], "weight");
    assert_eq!(s["top"][1]["node_type"], "activation");
    assert!(s["calibrated_metric"].as_f64().unwrap() < 1.0);

    // Pictures are real images with content.
    for f in files.iter().filter(|f| f.ends_with(".png")) {
        let img = image::open(dir.join(f)).unwrap().to_rgb8();
        assert!(img.width() >= 300 && img.height() >= 200, "{f}");
        let first = *img.get_pixel(0, 0);
        assert!(img.pixels().any(|p| *p != first), "{f} is blank");
    }
}

#[test]
fn rerun_replaces_its_entries_and_keeps_the_rest() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("result");
    assert!(runall(&dir, &[]).status.success());
    std::fs::write(dir.join("data_distribution/stale.png"), b"old").unwrap();
    std::fs::write(dir.join("notes.txt"), b"mine").unwrap();
    // Another flow: node ranking, named nodes for the plots, SVG.
    let out = runall(
        &dir,
        &[
            "-nt",
            "node",
            "-dnl",
            "['fc','pw_relu_out_HzCalibration']",
            "-qn",
            "[['fc'],['fc','gap']]",
            "--format",
            "svg",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let files = tree(&dir);
    assert!(!files.contains("data_distribution/stale.png"));
    assert!(!files.contains("node_sensitivity/sensitivity_of_weight.log"));
    assert!(files.contains("node_sensitivity/sensitivity_of_node.log"));
    assert!(
        files.contains("notes.txt"),
        "runall removed a file it did not write"
    );
    // Every figure follows --format but the partial-quantization chart, whose name
    // the spec fixes.
    assert!(
        files
            .iter()
            .all(|f| !f.ends_with(".png") || f == "sensitivity_analysis/partial_quantization.png"),
        "{files:?}"
    );
    assert_eq!(
        files
            .iter()
            .filter(|f| f.starts_with("data_distribution/"))
            .count(),
        2,
        "{files:?}"
    );
    assert!(
        files.contains(
            "accumulate_error/quantize_node_accumulate_err_of_partial_qmodel_cosine-similarity.svg"
        ),
        "{files:?}"
    );
    // No staging folder is left behind.
    assert!(
        std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().starts_with(".runall"))
    );
}

#[test]
fn argument_mistakes_exit_2_and_change_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("result");
    for args in [
        &["-dnl", "['fc','no_such_node']"][..],
        &["-sn", "[fcc]"],
        &["-nqn", "['weight']"],
        &["-nm", "cosine"],
        &["-nt", "nodes"],
        &["-qn", "[fc"],
    ] {
        let out = runall(&dir, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            !dir.exists() || tree(&dir).is_empty(),
            "{args:?} wrote {:?}",
            tree(&dir)
        );
    }
    let out = runall(&dir, &["-dnl", "['fc','no_such_node']"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no_such_node"));
}
