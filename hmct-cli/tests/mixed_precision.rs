//! `hmct-debugger mixed-precision` through the built binary on examples/tiny_cnn:
//! the target reached with the written model's full run (fresh session, loaded from
//! disk) equal to the reported final value, for cosine (higher is better) and mse
//! (lower is better); an unreachable target (exit 1, best named, no model); the
//! argument mistakes (exit 2, one line, nothing written).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use hmct_metrics::{Metric, PairStats};
use hmct_quant::{Capture, Config, Session, plan_model};
use hmct_tensor::Dataset;

fn example() -> (PathBuf, PathBuf) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/tiny_cnn");
    (
        dir.join("calibrated_model.onnx"),
        dir.join("calibration_data"),
    )
}

fn run(args: &[&str]) -> Output {
    let (model, data) = example();
    Command::new(env!("CARGO_BIN_EXE_hmct-debugger"))
        .arg("mixed-precision")
        .arg(model)
        .arg(data)
        .args(args)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The metric of a model file's calibrated run against its float run on the model
/// outputs, all samples: mean over samples per output, then over outputs.
fn full_run_value(model: &Path, metric: Metric) -> f64 {
    let model = hmct_ir::load_model(model).unwrap();
    let session = Session::new(plan_model(&model).unwrap(), 1).unwrap();
    let plan = session.plan();
    let specs = plan.input_specs();
    let ds = Dataset::open(&example().1, &specs).unwrap();
    let outs = plan.outputs().to_vec();
    let mut per_output = vec![Vec::new(); outs.len()];
    for s in 0..ds.len() {
        let sample = ds.sample(s).unwrap();
        let inputs: Vec<(&str, hmct_tensor::Tensor)> = sample
            .iter()
            .map(|(n, t)| (n.as_str(), t.clone()))
            .collect();
        let bound = session.bind_inputs(&inputs).unwrap();
        let get = |config: &Config| {
            let values = session
                .run_from(&bound, None, config, &outs, Capture::Wanted)
                .unwrap();
            outs.iter()
                .map(|&o| {
                    let t = session.value(&values, o).unwrap();
                    t.as_f32().unwrap().iter().copied().collect::<Vec<f32>>()
                })
                .collect::<Vec<_>>()
        };
        let (x, y) = (get(&Config::float()), get(&Config::calibrated()));
        for (o, (x, y)) in x.iter().zip(&y).enumerate() {
            let mut stats = PairStats::new();
            stats.update(x, y).unwrap();
            per_output[o].push(stats.metric(metric));
        }
    }
    let means: Vec<f64> = per_output
        .iter()
        .map(|v| v.iter().sum::<f64>() / v.len() as f64)
        .collect();
    means.iter().sum::<f64>() / means.len() as f64
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-12)
}

/// Runs a successful search into a fresh folder and checks the written model
/// against the JSON's final value; returns (json, folder guard).
fn reached(metric: &str, target: f64) -> (serde_json::Value, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let save = dir.path().join("out");
    let target_arg = target.to_string();
    let out = run(&[
        "--target",
        &target_arg,
        "-m",
        metric,
        "--save-dir",
        save.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}\n{stdout}", text(&out.stderr));
    assert!(stdout.contains("target reached"), "{stdout}");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(save.join("mixed_precision.json")).unwrap()).unwrap();
    assert_eq!(json["reached"], true);
    let curve = json["curve"].as_array().unwrap();
    let chosen = json["chosen"].as_u64().unwrap() as usize;
    assert_eq!(chosen + 1, curve.len());
    assert!(chosen >= 1, "the example needs promotions: {stdout}");
    let last = curve[chosen]["value"].as_f64().unwrap();
    let m: Metric = metric.parse().unwrap();
    let written = full_run_value(&save.join("mixed_precision_model.onnx"), m);
    assert!(close(written, last), "{written} vs {last}");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(save.join("quant_config.json")).unwrap()).unwrap();
    let entries = config["node_config"].as_object().unwrap();
    assert_eq!(entries.len(), chosen);
    for step in &curve[1..] {
        let node = step["node"].as_str().unwrap();
        assert_eq!(entries[node]["qtype"], "int16");
        assert!(stdout.contains(node), "{stdout}");
    }
    assert!(save.join("mixed_precision.png").exists());
    (json, dir)
}

#[test]
fn cosine_target_reached() {
    let (model, _) = example();
    let calibrated = full_run_value(&model, Metric::CosineSimilarity);
    assert!(calibrated < 0.999);
    let (json, _dir) = reached("cosine-similarity", 0.999);
    let curve = json["curve"].as_array().unwrap();
    assert!(close(curve[0]["value"].as_f64().unwrap(), calibrated));
    let values: Vec<f64> = curve.iter().map(|s| s["value"].as_f64().unwrap()).collect();
    assert!(
        values[..values.len() - 1].iter().all(|&v| v < 0.999),
        "{values:?}"
    );
    assert!(*values.last().unwrap() >= 0.999, "{values:?}");
}

#[test]
fn mse_target_is_an_upper_bound() {
    let (model, _) = example();
    let calibrated = full_run_value(&model, Metric::Mse);
    let target = calibrated / 4.0;
    let (json, _dir) = reached("mse", target);
    let values: Vec<f64> = json["curve"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["value"].as_f64().unwrap())
        .collect();
    assert!(
        values[..values.len() - 1].iter().all(|&v| v > target),
        "{values:?}"
    );
    assert!(*values.last().unwrap() <= target, "{values:?}");
}

#[test]
fn unreachable_target_names_the_best_and_writes_no_model() {
    let dir = tempfile::tempdir().unwrap();
    let save = dir.path().join("out");
    let out = run(&[
        "--target",
        "0.999",
        "--budget",
        "1",
        "-s",
        save.to_str().unwrap(),
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot be met")
            && stderr.contains("best found")
            && stderr.contains("budget of 1"),
        "{stderr}"
    );
    assert!(save.join("mixed_precision.json").exists());
    assert!(!save.join("mixed_precision_model.onnx").exists());
    assert!(!save.join("quant_config.json").exists());
}

#[test]
fn argument_mistakes_exit_2_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let save = dir.path().join("out");
    let s = save.to_str().unwrap();
    for (args, expect) in [
        (vec!["--target", "0.999", "-o", "fcc"], "did you mean 'fc'"),
        (vec!["--target", "1.5"], "at most 1"),
        (vec!["--target", "0.999", "--qtype", "int4"], "int16"),
        (vec!["--target", "0.999", "--budget", "0"], "budget"),
        (
            vec!["--target", "0.999", "-m", "cosine"],
            "cosine-similarity",
        ),
        (vec!["--target", "0.999", "-d", "1000"], "1000"),
    ] {
        let mut all = args.clone();
        all.extend(["-s", s]);
        let out = run(&all);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(!save.exists(), "{args:?} wrote {}", save.display());
    }
}
