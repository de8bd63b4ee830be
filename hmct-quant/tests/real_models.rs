//! The interpreter on the real models of ../shared/models against onnxruntime's
//! reference outputs, and incremental re-execution / thread count against full runs.

mod common;

use common::kernel::f32_bits;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hmct_ir::load_model;
use hmct_quant::{Capture, Config, Override, Session, plan_model};
use hmct_tensor::{Dataset, Tensor, read_npy, sanitize_name};

fn models_dir() -> Option<PathBuf> {
    hmct_ir::testing::shared_path("models")
}

fn model_file(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "onnx"))
        .expect("an .onnx file")
}

/// Every model matches onnxruntime within 1e-4 of its output scale on every sample.
#[test]
fn real_models_match_onnxruntime() {
    let Some(root) = models_dir() else {
        return;
    };
    let mut names: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    names.sort();
    let mut worst_failures = Vec::new();
    for dir in names {
        let model = load_model(model_file(&dir)).unwrap();
        let plan = plan_model(&model).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let session = Session::new(plan, 0).unwrap();
        let data =
            Dataset::open(&dir.join("calibration_data"), &session.plan().input_specs()).unwrap();
        let output_names: Vec<String> = session
            .plan()
            .output_names()
            .iter()
            .map(|s| s.to_string())
            .collect();
        // How far onnxruntime's own optimised run drifts from its reference: a floor
        // for any tolerance (matters where an output is all but zero).
        let manifest: serde_json::Value =
            std::fs::read(dir.join("reference_outputs/manifest.json"))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or_default();
        for sample in 0..data.len() {
            let inputs = data.sample(sample).unwrap();
            let refs: Vec<(&str, Tensor)> = inputs
                .iter()
                .map(|(n, t)| (n.as_str(), t.clone()))
                .collect();
            let outputs = session.run(&refs, &Config::float()).unwrap();
            for (name, got) in output_names.iter().zip(&outputs) {
                let want = read_npy(
                    &dir.join("reference_outputs")
                        .join(sanitize_name(name))
                        .join(format!("{sample}.npy")),
                )
                .unwrap();
                let (g, w) = (got.as_f32().unwrap(), want.as_f32().unwrap());
                assert_eq!(g.shape(), w.shape(), "{} output {name}", dir.display());
                let scale = w.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
                let max_abs = g
                    .iter()
                    .zip(w.iter())
                    .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                if sample == 0 {
                    eprintln!(
                        "{:<24} {name:<28} max abs err {max_abs:.3e}, relative to output scale {:.3e}",
                        dir.file_name().unwrap().to_string_lossy(),
                        max_abs / scale
                    );
                }
                let floor = manifest["outputs"][name]["max_abs_diff_vs_ORT_ENABLE_ALL"]
                    .as_f64()
                    .unwrap_or(0.0) as f32;
                if max_abs > (1e-4 * scale).max(floor) {
                    worst_failures.push(format!(
                        "{} {name} sample {sample}: {max_abs:e} (scale {scale})",
                        dir.display()
                    ));
                }
            }
        }
    }
    assert!(worst_failures.is_empty(), "{worst_failures:#?}");
}

/// Kernels that write into an input's buffer (when the run does not keep it) give the
/// same bits as when every value is kept, on every model's first sample.
#[test]
fn writing_into_inputs_changes_no_bit() {
    let Some(root) = models_dir() else {
        return;
    };
    for dir in std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
    {
        if !dir.is_dir() {
            continue;
        }
        let model = load_model(model_file(&dir)).unwrap();
        let session = Session::new(plan_model(&model).unwrap(), 0).unwrap();
        let data =
            Dataset::open(&dir.join("calibration_data"), &session.plan().input_specs()).unwrap();
        let inputs = data.sample(0).unwrap();
        let refs: Vec<(&str, Tensor)> = inputs
            .iter()
            .map(|(n, t)| (n.as_str(), t.clone()))
            .collect();
        let outputs = session.plan().outputs().to_vec();
        let reused = session.run(&refs, &Config::float()).unwrap();
        let kept = session
            .run_from(
                &session.bind_inputs(&refs).unwrap(),
                None,
                &Config::float(),
                &outputs,
                Capture::All,
            )
            .unwrap();
        for (k, &s) in outputs.iter().enumerate() {
            assert_eq!(
                f32_bits(&reused[k]),
                f32_bits(&session.value(&kept, s).unwrap()),
                "{} output {k}",
                dir.display()
            );
        }
    }
}

/// Incremental runs from captured activations equal full runs bit for bit, for many
/// configurations, and so do runs on 1 and 2 threads.
#[test]
fn incremental_equals_full_and_threads_do_not_matter() {
    let Some(model) = hmct_ir::testing::calibrated_pnet().unwrap() else {
        return;
    };
    let root = models_dir().unwrap();
    let plan = plan_model(&model).unwrap();
    let one = Session::new(plan_model(&model).unwrap(), 1).unwrap();
    let session = Session::new(plan, 2).unwrap();
    let data = Dataset::open(
        &root.join("mtcnn_pnet/calibration_data"),
        &session.plan().input_specs(),
    )
    .unwrap();
    let inputs = data.sample(0).unwrap();
    let refs: Vec<(&str, Tensor)> = inputs
        .iter()
        .map(|(n, t)| (n.as_str(), t.clone()))
        .collect();
    let bound = session.bind_inputs(&refs).unwrap();
    let outputs = session.plan().outputs().to_vec();
    let n_cal = session.plan().calibrations().len();
    assert!(n_cal >= 4, "the test model has calibration nodes");

    let float = session
        .run_from(&bound, None, &Config::float(), &outputs, Capture::All)
        .unwrap();
    let calibrated = session
        .run_from(&bound, None, &Config::calibrated(), &outputs, Capture::All)
        .unwrap();

    let mut configs = Vec::new();
    for c in 0..n_cal {
        configs.push((Config::float(), Config::float().with(c, Override::On)));
        configs.push((
            Config::calibrated(),
            Config::calibrated().with(c, Override::Off),
        ));
    }
    configs.push((
        Config::float(),
        Config::float()
            .with(0, Override::On)
            .with(n_cal - 1, Override::On),
    ));
    configs.push((Config::float(), Config::calibrated()));

    let full_out = |s: &Session, cfg: &Config| -> Vec<Arc<Tensor>> { s.run(&refs, cfg).unwrap() };
    let mut differs_from_float = 0;
    for (base_cfg, cfg) in &configs {
        let base = if base_cfg.base == hmct_quant::Base::Float {
            &float
        } else {
            &calibrated
        };
        let inc = session
            .run_from(base, Some(base_cfg), cfg, &outputs, Capture::Wanted)
            .unwrap();
        let full = full_out(&session, cfg);
        let serial = full_out(&one, cfg);
        for (k, &s) in outputs.iter().enumerate() {
            let a = session.value(&inc, s).unwrap();
            assert_eq!(
                f32_bits(&a),
                f32_bits(&full[k]),
                "incremental vs full, output {k}"
            );
            assert_eq!(
                f32_bits(&serial[k]),
                f32_bits(&full[k]),
                "1 vs 2 threads, output {k}"
            );
            if f32_bits(&a) != f32_bits(&session.value(&float, s).unwrap()) {
                differs_from_float += 1;
            }
        }
    }
    assert!(
        differs_from_float > configs.len() / 2,
        "quantization must change outputs"
    );
}

/// Several samples run together (`run_many_from`: the classifier's products of one row
/// share a pass over their weight) give each sample's incremental run bit for bit, on
/// 1 and 2 threads, and the products did run together.
#[test]
fn samples_run_together_equal_samples_run_alone() {
    let Some(root) = models_dir() else {
        return;
    };
    let model = load_model(root.join("mtcnn_onet/onet.onnx")).unwrap();
    let model = hmct_ir::testing::calibrate_for_tests(model, 4.0).unwrap();
    for threads in [1, 2] {
        let session = Session::new(plan_model(&model).unwrap(), threads)
            .unwrap()
            .with_profiling();
        let plan = session.plan();
        let data = Dataset::open(
            &root.join("mtcnn_onet/calibration_data"),
            &plan.input_specs(),
        )
        .unwrap();
        let outputs = plan.outputs().to_vec();
        let captures: Vec<_> = (0..4)
            .map(|s| {
                let inputs = data.sample(s).unwrap();
                let refs: Vec<(&str, Tensor)> = inputs
                    .iter()
                    .map(|(n, t)| (n.as_str(), t.clone()))
                    .collect();
                let bound = session.bind_inputs(&refs).unwrap();
                session
                    .run_from(&bound, None, &Config::float(), &outputs, Capture::All)
                    .unwrap()
            })
            .collect();
        let knowns: Vec<_> = captures.iter().collect();
        let n_cal = plan.calibrations().len();
        let float = Config::float();
        let mut configs: Vec<Config> = (0..n_cal)
            .map(|c| Config::float().with(c, Override::On))
            .collect();
        configs.push(Config::calibrated());
        for cfg in &configs {
            let together = session
                .run_many_from(&knowns, Some(&float), cfg, &outputs, Capture::Wanted)
                .unwrap();
            assert_eq!(together.len(), knowns.len());
            for (known, many) in knowns.iter().zip(&together) {
                let alone = session
                    .run_from(known, Some(&float), cfg, &outputs, Capture::Wanted)
                    .unwrap();
                for (k, &s) in outputs.iter().enumerate() {
                    assert_eq!(
                        f32_bits(&session.value(many, s).unwrap()),
                        f32_bits(&session.value(&alone, s).unwrap()),
                        "together vs alone, output {k}, {threads} thread(s)"
                    );
                }
            }
        }
        let times = session.node_times().unwrap();
        let matmul = plan
            .nodes()
            .iter()
            .position(|n| n.name == "dense_3")
            .expect("O-Net's first dense layer");
        assert!(
            times.rows_calls[matmul] > 0,
            "the 1152 -> 256 product ran for the samples together"
        );
    }
}
