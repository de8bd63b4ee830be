//! Every analysis gives the same bytes at 1 and 2 threads, and again on a rerun:
//! `runall` (both rankings, distributions, box plots and their CSV, accumulated
//! error, sensitivity analysis, health checks), `precision-table`, `outliers`, `info`
//! and `calibrate`, on the calibrated P-Net. Only what records the run itself (the
//! command line, the seconds) may differ.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{Fixture, fixture, ok};

/// Every file under `dir` by relative path, with what may differ removed from
/// summary.json and report.html left out (it shows the seconds and the command).
fn contents(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let name = path
                .strip_prefix(dir)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let bytes = std::fs::read(&path).unwrap();
            match name.as_str() {
                "report.html" => {}
                "summary.json" => {
                    let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                    strip_run_facts(&mut v);
                    files.insert(name, serde_json::to_vec_pretty(&v).unwrap());
                }
                _ => {
                    files.insert(name, bytes);
                }
            }
        }
    }
    files
}

fn strip_run_facts(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            map.remove("seconds");
            map.remove("command");
            map.values_mut().for_each(strip_run_facts);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(strip_run_facts),
        _ => {}
    }
}

fn outputs(f: &Fixture, tag: &str, threads: &str) -> BTreeMap<String, Vec<u8>> {
    let dir = f.path(tag);
    let runall = dir.join("runall");
    ok(&f.run(
        "runall",
        &[
            "-s",
            runall.to_str().unwrap(),
            "-dn",
            "3",
            "--threads",
            threads,
        ],
    ));
    let mut files = contents(&runall);
    let json = |name: &str| dir.join(name).to_str().unwrap().to_string();
    for (command, file) in [
        ("precision-table", "precision.json"),
        ("outliers", "outliers.json"),
        ("info", "info.json"),
    ] {
        ok(&f.run(command, &["--json", &json(file), "--threads", threads]));
        files.insert(file.to_string(), std::fs::read(dir.join(file)).unwrap());
    }
    // calibrate takes a float model: P-Net's own.
    let float = hmct_ir::testing::shared_dir()
        .unwrap()
        .join("models/mtcnn_pnet/pnet.onnx");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hmct-debugger"))
        .arg("calibrate")
        .arg(&float)
        .arg(&f.data)
        .args(["-o", &json("calibrated.onnx"), "--method", "kl"])
        .args(["--json", &json("calibrate.json"), "--threads", threads])
        .output()
        .unwrap();
    ok(&out);
    for file in ["calibrated.onnx", "calibrate.json"] {
        files.insert(file.to_string(), std::fs::read(dir.join(file)).unwrap());
    }
    files
}

#[test]
fn every_analysis_gives_the_same_bytes_at_any_thread_count_and_on_reruns() {
    let Some(f) = fixture() else { return };
    let one = outputs(&f, "one", "1");
    let two = outputs(&f, "two", "2");
    let again = outputs(&f, "again", "2");
    // Something of every step is there.
    for prefix in [
        "node_sensitivity/",
        "data_distribution/",
        "channelwise_distribution/",
        "accumulate_error/",
        "sensitivity_analysis/",
        "health.json",
        "summary.json",
    ] {
        assert!(
            one.keys().any(|k| k.starts_with(prefix)),
            "{prefix} missing: {:?}",
            one.keys().collect::<Vec<_>>()
        );
    }
    assert_eq!(
        one.keys().collect::<Vec<_>>(),
        two.keys().collect::<Vec<_>>()
    );
    for (name, bytes) in &one {
        assert!(
            two[name] == *bytes,
            "{name} differs between 1 and 2 threads"
        );
        assert!(again[name] == *bytes, "{name} differs on a rerun");
    }
}
