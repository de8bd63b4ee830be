//! The searches judged by a caller's evaluation (task_metric), the engine's cancel
//! flag and in-memory datasets, on examples/tiny_cnn.
//!
//! The evaluation used here is the mean cosine of the outputs against the float
//! model's outputs from a fresh session, so the prefix search must give the tensor
//! metric search's values step for step; the call counts show that the evaluation
//! runs once per step needed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use hmct_debug::engine::{Engine, EngineError, EngineOptions};
use hmct_debug::mixed_precision::{MixedPrecisionOptions, mixed_precision};
use hmct_debug::sensitivity::{SensitivityError, SensitivityOptions, get_sensitivity_of_nodes};
use hmct_debug::task_metric::{Goal, Outputs, Strategy, TaskMetricError, search};
use hmct_ir::Model;
use hmct_metrics::{Metric, PairStats};
use hmct_quant::{Capture, Config, Session, plan_model};
use hmct_tensor::{Dataset, Tensor};

fn tiny_cnn() -> (Model, PathBuf) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/tiny_cnn");
    (
        hmct_ir::load_model(dir.join("calibrated_model.onnx")).unwrap(),
        dir.join("calibration_data"),
    )
}

/// The float model's outputs per sample, from a fresh session.
fn float_outputs(model: &Model, data: &Path) -> Vec<Vec<Vec<f32>>> {
    let session = Session::new(plan_model(model).unwrap(), 1).unwrap();
    let plan = session.plan();
    let ds = Dataset::open(data, &plan.input_specs()).unwrap();
    let slots = plan.outputs().to_vec();
    (0..ds.len())
        .map(|s| {
            let sample = ds.sample(s).unwrap();
            let inputs: Vec<(&str, Tensor)> = sample
                .iter()
                .map(|(n, t)| (n.as_str(), t.clone()))
                .collect();
            let bound = session.bind_inputs(&inputs).unwrap();
            let values = session
                .run_from(&bound, None, &Config::float(), &slots, Capture::Wanted)
                .unwrap();
            slots
                .iter()
                .map(|&o| {
                    session
                        .value(&values, o)
                        .unwrap()
                        .as_f32()
                        .unwrap()
                        .iter()
                        .copied()
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// Per output the mean cosine over samples, then the mean over outputs (what the
/// tensor-metric search computes).
fn mean_cosine(outputs: &Outputs, reference: &[Vec<Vec<f32>>]) -> f64 {
    let n_outputs = reference[0].len();
    let per_output: Vec<f64> = (0..n_outputs)
        .map(|k| {
            let sum: f64 = outputs
                .iter()
                .zip(reference)
                .map(|(o, r)| {
                    let mut stats = PairStats::new();
                    stats
                        .update(&r[k], o[k].as_f32().unwrap().as_slice().unwrap())
                        .unwrap();
                    stats.metric(Metric::CosineSimilarity)
                })
                .sum();
            sum / outputs.len() as f64
        })
        .collect();
    per_output.iter().sum::<f64>() / n_outputs as f64
}

fn engine(model: &Model, data: &Path) -> Engine {
    Engine::new(model.clone(), data, &EngineOptions::default()).unwrap()
}

#[test]
fn prefix_search_matches_the_metric_search_and_stops_at_the_target() {
    let (model, data) = tiny_cnn();
    let reference = float_outputs(&model, &data);
    let engine = engine(&model, &data);
    let options = MixedPrecisionOptions {
        target: 1.0, // not reached at int16: the whole curve within the budget
        budget: Some(3),
        ..Default::default()
    };
    let by_metric = mixed_precision(&engine, &options, &|_, _, _| {}).unwrap();
    let mut calls = 0;
    let mut evaluate = |o: Outputs| {
        calls += 1;
        Ok(mean_cosine(&o, &reference))
    };
    let goal = Goal {
        target: 2.0,
        higher_is_better: true,
    };
    let found = search(
        &engine,
        &options,
        goal,
        Strategy::Prefix,
        &mut evaluate,
        &|_, _, _| {},
    )
    .unwrap();
    assert_eq!(calls, 4);
    assert!(!found.reached);
    let values: Vec<f64> = by_metric.curve.iter().map(|s| s.value).collect();
    let scores: Vec<f64> = found.evaluations.iter().map(|e| e.score).collect();
    assert_eq!(values.len(), scores.len());
    for (v, s) in values.iter().zip(&scores) {
        assert!((v - s).abs() < 1e-9, "{values:?} vs {scores:?}");
    }

    // A target reached at step k: k + 1 evaluations, none after.
    let k = 2;
    let mut calls = 0;
    let mut evaluate = |o: Outputs| {
        calls += 1;
        Ok(mean_cosine(&o, &reference))
    };
    let goal = Goal {
        target: scores[k],
        higher_is_better: true,
    };
    let found = search(
        &engine,
        &options,
        goal,
        Strategy::Prefix,
        &mut evaluate,
        &|_, _, _| {},
    )
    .unwrap();
    assert!(scores[0] < scores[k], "{scores:?}");
    assert!(found.reached && 0 < found.chosen && found.chosen <= k);
    assert_eq!(calls, found.chosen + 1);
    assert_eq!(found.promoted_nodes().len(), found.chosen);
}

#[test]
fn greedy_keeps_only_improvements_and_errors_stop_it() {
    let (model, data) = tiny_cnn();
    let reference = float_outputs(&model, &data);
    let engine = engine(&model, &data);
    let options = MixedPrecisionOptions::default();
    let mut calls = 0;
    let mut evaluate = |o: Outputs| {
        calls += 1;
        Ok(mean_cosine(&o, &reference))
    };
    let goal = Goal {
        target: 2.0,
        higher_is_better: true,
    };
    let found = search(
        &engine,
        &options,
        goal,
        Strategy::Greedy,
        &mut evaluate,
        &|_, _, _| {},
    )
    .unwrap();
    assert_eq!(calls, found.evaluations.len());
    assert_eq!(found.evaluations.len(), found.candidates + 1);
    let mut best = found.evaluations[0].score;
    let mut kept = Vec::new();
    for e in &found.evaluations[1..] {
        assert_eq!(e.kept, e.score > best, "{e:?}");
        if e.kept {
            best = e.score;
            kept.push(e.node.clone().unwrap());
        }
        // A trial is the kept set plus the node tried.
        assert_eq!(e.promoted.last(), e.node.as_ref());
    }
    assert_eq!(found.promoted_nodes(), kept.as_slice());

    let mut evaluate = |_: Outputs| Err("no labels".to_string());
    let err = search(
        &engine,
        &options,
        goal,
        Strategy::Greedy,
        &mut evaluate,
        &|_, _, _| {},
    )
    .unwrap_err();
    assert!(
        matches!(&err, TaskMetricError::Evaluate(m) if m == "no labels"),
        "{err}"
    );
    assert!(!err.is_usage());
}

#[test]
fn a_raised_cancel_flag_stops_the_engine() {
    let (model, data) = tiny_cnn();
    let mut engine = engine(&model, &data);
    let flag = Arc::new(AtomicBool::new(true));
    engine.set_cancel_flag(flag.clone());
    let err =
        get_sensitivity_of_nodes(&engine, &SensitivityOptions::default(), &|_, _| {}).unwrap_err();
    assert!(
        matches!(err, SensitivityError::Engine(EngineError::Cancelled)),
        "{err}"
    );
    flag.store(false, std::sync::atomic::Ordering::Relaxed);
    get_sensitivity_of_nodes(&engine, &SensitivityOptions::default(), &|_, _| {}).unwrap();
}

#[test]
fn in_memory_data_gives_the_folders_results() {
    let (model, data) = tiny_cnn();
    let from_folder = engine(&model, &data);
    let plan = plan_model(&model).unwrap();
    let specs = plan.input_specs();
    let ds = Dataset::open(&data, &specs).unwrap();
    let samples: Vec<Vec<Tensor>> = (0..specs.len())
        .map(|k| {
            (0..ds.len())
                .map(|s| ds.sample(s).unwrap()[k].1.clone())
                .collect()
        })
        .collect();
    let memory = Dataset::from_tensors(&specs, samples).unwrap();
    let from_memory = Engine::with_dataset(model, plan, memory, &EngineOptions::default()).unwrap();
    let options = SensitivityOptions {
        metrics: vec![Metric::CosineSimilarity, Metric::Mse],
        ..Default::default()
    };
    let a = get_sensitivity_of_nodes(&from_folder, &options, &|_, _| {}).unwrap();
    let b = get_sensitivity_of_nodes(&from_memory, &options, &|_, _| {}).unwrap();
    assert_eq!(
        serde_json::to_string(&a).unwrap(),
        serde_json::to_string(&b).unwrap()
    );
}
