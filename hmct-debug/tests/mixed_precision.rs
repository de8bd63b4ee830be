//! mixed-precision against independent full runs: every curve point and the final
//! value equal a fresh session's full forward runs of the model edited and *saved*
//! (loaded back from disk), measured here with PairStats and a plain mean. On
//! examples/tiny_cnn (int8 cosine ~0.996, target 0.999) and on the calibrated pnet
//! of ../shared/models (float32 promotion, mse, output nodes). Also the files
//! written, the unreachable target and the argument errors.

use std::path::{Path, PathBuf};

use hmct_debug::engine::{Engine, EngineError, EngineOptions};
use hmct_debug::mixed_precision::{
    JSON_NAME, MODEL_NAME, MixedPrecision, MixedPrecisionError, MixedPrecisionOptions, PNG_NAME,
    PromoteQType, QUANT_CONFIG_NAME, mixed_precision, promoted_model, write_mixed_precision,
};
use hmct_ir::{Edit, Model, QType};
use hmct_metrics::{Metric, PairStats};
use hmct_quant::{Capture, Config, Session, plan_model};
use hmct_tensor::Dataset;

fn tiny_cnn() -> (Model, PathBuf) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/tiny_cnn");
    (
        hmct_ir::load_model(dir.join("calibrated_model.onnx")).unwrap(),
        dir.join("calibration_data"),
    )
}

fn pnet() -> Option<(Model, PathBuf)> {
    let Some(model) = hmct_ir::testing::calibrated_pnet().unwrap() else {
        return None;
    };
    let data = hmct_ir::testing::shared_dir()?.join("models/mtcnn_pnet/calibration_data");
    Some((model, data))
}

fn engine(model: &Model, data: &Path) -> Engine {
    Engine::new(model.clone(), data, &EngineOptions::default()).unwrap()
}

fn search(engine: &Engine, options: &MixedPrecisionOptions) -> MixedPrecision {
    mixed_precision(engine, options, &|_, _, _| {}).unwrap()
}

/// The metric of `model` (as a file would run: calibrated config) against its float
/// run, on the outputs of `output_nodes` (or the model outputs), from a fresh
/// session: per output the mean over samples, then the mean over outputs.
fn full_run_value(
    model: &Model,
    data: &Path,
    output_nodes: &[&str],
    metric: Metric,
    samples: usize,
) -> f64 {
    let session = Session::new(plan_model(model).unwrap(), 1).unwrap();
    let plan = session.plan();
    let specs = plan.input_specs();
    let ds = Dataset::open(data, &specs).unwrap();
    let slots: Vec<usize> = if output_nodes.is_empty() {
        plan.outputs().to_vec()
    } else {
        output_nodes
            .iter()
            .flat_map(|n| model.node(model.node_id(n).unwrap()).output.clone())
            .map(|v| plan.value(&v).unwrap())
            .collect()
    };
    let mut per_output = vec![Vec::new(); slots.len()];
    for s in 0..samples {
        let sample = ds.sample(s).unwrap();
        let inputs: Vec<(&str, hmct_tensor::Tensor)> = sample
            .iter()
            .map(|(n, t)| (n.as_str(), t.clone()))
            .collect();
        let bound = session.bind_inputs(&inputs).unwrap();
        let run = |config: &Config| {
            let values = session
                .run_from(&bound, None, config, &slots, Capture::Wanted)
                .unwrap();
            slots
                .iter()
                .map(|&o| {
                    let t = session.value(&values, o).unwrap();
                    t.as_f32().unwrap().iter().copied().collect::<Vec<f32>>()
                })
                .collect::<Vec<_>>()
        };
        let float = run(&Config::float());
        let quant = run(&Config::calibrated());
        for (o, (x, y)) in float.iter().zip(&quant).enumerate() {
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

/// The calibrated model with the first `k` curve nodes promoted by the IR edit.
fn edited(model: &Model, result: &MixedPrecision, k: usize) -> Model {
    let mut m = model.clone();
    let nodes: Vec<String> = result.curve[1..=k]
        .iter()
        .map(|s| s.node.clone().unwrap())
        .collect();
    if !nodes.is_empty() {
        hmct_ir::apply_edits(
            &mut m,
            &[Edit::NodesQType {
                nodes,
                qtype: result.ir_qtype(),
            }],
        )
        .unwrap();
    }
    m
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-12)
}

#[test]
fn tiny_cnn_reaches_0_999_and_the_written_model_agrees() {
    let (model, data) = tiny_cnn();
    let engine = engine(&model, &data);
    let samples = engine.available_samples();
    let result = search(
        &engine,
        &MixedPrecisionOptions {
            target: 0.999,
            ..Default::default()
        },
    );
    assert!(
        result.calibrated_value() < 0.999,
        "{}",
        result.calibrated_value()
    );
    assert!(result.reached);
    assert!(result.chosen >= 1);
    assert_eq!(result.curve.len(), result.chosen + 1);
    assert!(result.final_value() >= 0.999);
    // The first step reaching the target is the one chosen.
    assert!(
        result.curve[..result.chosen]
            .iter()
            .all(|s| s.value < 0.999)
    );
    assert_eq!(result.data_num, samples);

    // Every point of the curve is a full run of the model edited that far.
    for k in 0..=result.chosen {
        let v = full_run_value(
            &edited(&model, &result, k),
            &data,
            &[],
            Metric::CosineSimilarity,
            samples,
        );
        assert!(
            close(v, result.curve[k].value),
            "step {k}: {v} vs {:?}",
            result.curve[k]
        );
    }

    // The files, and the written model reloaded from disk.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("mp");
    let written = write_mixed_precision(&model, &result, &out).unwrap();
    let names: Vec<&str> = written
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap())
        .collect();
    assert_eq!(names, [PNG_NAME, JSON_NAME, MODEL_NAME, QUANT_CONFIG_NAME]);
    let saved = hmct_ir::load_model(out.join(MODEL_NAME)).unwrap();
    let v = full_run_value(&saved, &data, &[], Metric::CosineSimilarity, samples);
    assert!(
        close(v, result.final_value()),
        "{v} vs {}",
        result.final_value()
    );

    // The written model differs from the calibrated one exactly in the promoted
    // activation calibration nodes' qtype.
    let promoted: Vec<&str> = result
        .curve
        .iter()
        .flat_map(|s| s.calibrations.iter().map(String::as_str))
        .collect();
    assert!(!promoted.is_empty());
    for id in model.calibration_nodes() {
        let name = model.node_name(id);
        let before = model.calibration(id).unwrap();
        let after = saved.calibration(saved.node_id(name).unwrap()).unwrap();
        if promoted.contains(&name) {
            assert_eq!(after.qtype(), QType::INT16, "{name}");
            assert_ne!(before.qtype(), QType::INT16, "{name}");
        } else {
            assert_eq!(after.qtype(), before.qtype(), "{name}");
        }
        assert_eq!(after.thresholds(), before.thresholds(), "{name}");
    }

    // quant_config: node_config entries for the promoted nodes, which applied to
    // the calibrated model give the written model.
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join(QUANT_CONFIG_NAME)).unwrap()).unwrap();
    let entries = config["node_config"].as_object().unwrap();
    assert_eq!(entries.len(), result.chosen);
    for node in result.promoted_nodes() {
        assert_eq!(entries[node]["qtype"], "int16");
    }
    let mut from_config = model.clone();
    for (node, v) in entries {
        hmct_ir::apply_edits(
            &mut from_config,
            &[Edit::NodesQType {
                nodes: vec![node.clone()],
                qtype: v["qtype"].as_str().unwrap().parse().unwrap(),
            }],
        )
        .unwrap();
    }
    assert_eq!(
        hmct_ir::model_to_bytes(&from_config),
        hmct_ir::model_to_bytes(&saved)
    );

    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join(JSON_NAME)).unwrap()).unwrap();
    assert_eq!(json["reached"], true);
    assert_eq!(json["curve"].as_array().unwrap().len(), result.curve.len());
    let png = image::open(out.join(PNG_NAME)).unwrap();
    assert!(png.width() > 100 && png.height() > 100);

    // Batches of one step give the same search.
    let one = search(
        &engine,
        &MixedPrecisionOptions {
            target: 0.999,
            batch: 1,
            ..Default::default()
        },
    );
    let values = |r: &MixedPrecision| r.curve.iter().map(|s| s.value).collect::<Vec<_>>();
    assert_eq!(values(&one), values(&result));
}

#[test]
fn unreachable_target_reports_the_best_and_writes_no_model() {
    let (model, data) = tiny_cnn();
    let engine = engine(&model, &data);
    let result = search(
        &engine,
        &MixedPrecisionOptions {
            target: 0.9999999,
            budget: Some(2),
            data_num: Some(2),
            ..Default::default()
        },
    );
    assert!(!result.reached);
    assert_eq!(result.curve.len(), 3, "budget 2: steps 0, 1, 2");
    let best = result
        .curve
        .iter()
        .map(|s| s.value)
        .fold(f64::NEG_INFINITY, f64::max);
    assert_eq!(result.final_value(), best);
    assert!(result.curve[..result.chosen].iter().all(|s| s.value < best));

    let dir = tempfile::tempdir().unwrap();
    let written = write_mixed_precision(&model, &result, dir.path()).unwrap();
    assert_eq!(written.len(), 2);
    assert!(!dir.path().join(MODEL_NAME).exists());
    assert!(!dir.path().join(QUANT_CONFIG_NAME).exists());
    assert!(result.chart().figure.title.contains("NOT reached"));
    // The best model is still available to the caller.
    let best_model = promoted_model(&model, &result).unwrap();
    let v = full_run_value(&best_model, &data, &[], Metric::CosineSimilarity, 2);
    assert!(close(v, best), "{v} vs {best}");
}

#[test]
fn already_met_target_promotes_nothing() {
    let (model, data) = tiny_cnn();
    let engine = engine(&model, &data);
    let result = search(
        &engine,
        &MixedPrecisionOptions {
            target: 0.9,
            ..Default::default()
        },
    );
    assert!(result.reached);
    assert_eq!(result.chosen, 0);
    assert_eq!(result.curve.len(), 1);
    assert_eq!(
        result.quant_config(),
        serde_json::json!({"node_config": {}})
    );
}

#[test]
fn pnet_float32_mse_on_an_output_node() {
    let Some((model, data)) = pnet() else { return };
    let engine = engine(&model, &data);
    let quantized = hmct_ir::quantized_nodes(&model);
    let out_node = model.node_name(*quantized.last().unwrap()).to_string();
    let samples = 2;
    let base = MixedPrecisionOptions {
        metric: Metric::Mse,
        output_nodes: vec![out_node.clone()],
        qtype: PromoteQType::Float32,
        data_num: Some(samples),
        ..Default::default()
    };
    // Target: halfway between the calibrated mse and 0 (lower is better for mse).
    let calibrated = full_run_value(&model, &data, &[&out_node], Metric::Mse, samples);
    assert!(calibrated > 0.0);
    let target = calibrated / 2.0;
    let result = search(
        &engine,
        &MixedPrecisionOptions {
            target,
            ..base.clone()
        },
    );
    assert!(close(result.calibrated_value(), calibrated));
    assert!(result.reached, "{:?}", result.curve);
    assert!(result.chosen >= 1);
    assert!(result.final_value() <= target);
    assert!(
        result.curve[..result.chosen]
            .iter()
            .all(|s| s.value > target)
    );

    let dir = tempfile::tempdir().unwrap();
    write_mixed_precision(&model, &result, dir.path()).unwrap();
    let saved = hmct_ir::load_model(dir.path().join(MODEL_NAME)).unwrap();
    let v = full_run_value(&saved, &data, &[&out_node], Metric::Mse, samples);
    assert!(
        close(v, result.final_value()),
        "{v} vs {}",
        result.final_value()
    );
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join(QUANT_CONFIG_NAME)).unwrap())
            .unwrap();
    for node in result.promoted_nodes() {
        assert_eq!(config["node_config"][node]["qtype"], "float32");
    }
}

#[test]
fn argument_errors() {
    let (model, data) = tiny_cnn();
    let engine = engine(&model, &data);
    let run = |options: MixedPrecisionOptions| {
        mixed_precision(&engine, &options, &|_, _, _| {}).unwrap_err()
    };
    let conv = model
        .node_name(hmct_ir::quantized_nodes(&model)[0])
        .to_string();
    let typo = format!("{conv}x");
    let err = run(MixedPrecisionOptions {
        output_nodes: vec![typo.clone()],
        ..Default::default()
    });
    assert!(err.is_usage());
    let msg = err.to_string();
    assert!(
        matches!(
            &err,
            MixedPrecisionError::Ranking(hmct_debug::sensitivity::SensitivityError::Engine(
                EngineError::UnknownNodes(_)
            ))
        ),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("'{typo}'")) && msg.contains(&format!("'{conv}'")),
        "{msg}"
    );

    for (metric, target) in [
        (Metric::CosineSimilarity, 1.5),
        (Metric::CosineSimilarity, f64::NAN),
        (Metric::Mse, -1.0),
    ] {
        let err = run(MixedPrecisionOptions {
            metric,
            target,
            ..Default::default()
        });
        assert!(
            matches!(err, MixedPrecisionError::BadTarget { .. }),
            "{err}"
        );
        assert!(err.is_usage());
    }
    let err = run(MixedPrecisionOptions {
        budget: Some(0),
        ..Default::default()
    });
    assert!(err.is_usage(), "{err}");
    let err = run(MixedPrecisionOptions {
        data_num: Some(1000),
        ..Default::default()
    });
    assert!(err.is_usage(), "{err}");
}

#[test]
fn pnet_int8_cosine_reaches_a_target_above_the_calibrated_value() {
    let Some((model, data)) = pnet() else { return };
    let engine = engine(&model, &data);
    let samples = 2;
    // The whole curve first (cosine 1 is not reached by int16), then a target the
    // curve shows to be reachable but above the int8 calibrated model.
    let whole = search(
        &engine,
        &MixedPrecisionOptions {
            target: 1.0,
            data_num: Some(samples),
            ..Default::default()
        },
    );
    assert!(!whole.reached);
    assert_eq!(whole.curve.len(), whole.candidates + 1);
    let target = whole.final_value();
    let calibrated = whole.calibrated_value();
    assert!(calibrated < target, "{calibrated} vs {target}");
    let first = whole.curve.iter().position(|s| s.value >= target).unwrap();

    let result = search(
        &engine,
        &MixedPrecisionOptions {
            target,
            data_num: Some(samples),
            ..Default::default()
        },
    );
    assert!(result.reached);
    assert_eq!(result.chosen, first);
    assert_eq!(result.final_value(), target);
    let dir = tempfile::tempdir().unwrap();
    write_mixed_precision(&model, &result, dir.path()).unwrap();
    let saved = hmct_ir::load_model(dir.path().join(MODEL_NAME)).unwrap();
    let v = full_run_value(&saved, &data, &[], Metric::CosineSimilarity, samples);
    assert!(close(v, target), "{v} vs {target}");
}
