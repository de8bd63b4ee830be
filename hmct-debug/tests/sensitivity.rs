//! get-sensitivity-of-nodes on calibrated real models, against the straightforward
//! method (a full forward run per candidate and sample, metrics computed here), plus
//! thread count, cache budget, interested nodes, output nodes, data_num and the
//! argument errors. Needs ../shared/models; skips with a note without it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use hmct_debug::engine::{Engine, EngineError, EngineOptions};
use hmct_debug::sensitivity::{
    EntryKind, NodeType, Sensitivity, SensitivityError, SensitivityOptions,
    get_sensitivity_of_nodes, parse_metrics,
};
use hmct_ir::{Model, TensorType};
use hmct_metrics::Metric;
use hmct_quant::{Capture, Config, Override, Session, plan_model};
use hmct_tensor::{Dataset, Tensor};

fn models_dir() -> Option<PathBuf> {
    hmct_ir::testing::shared_path("models")
}

fn pnet() -> Option<(Model, PathBuf)> {
    let model = hmct_ir::testing::calibrated_pnet().unwrap()?;
    Some((model, models_dir()?.join("mtcnn_pnet/calibration_data")))
}

fn rnet() -> Option<(Model, PathBuf)> {
    let dir = models_dir()?.join("mtcnn_rnet");
    let model = hmct_ir::load_model(dir.join("rnet.onnx")).unwrap();
    let model = hmct_ir::testing::calibrate_for_tests(model, 2.0).unwrap();
    Some((model, dir.join("calibration_data")))
}

fn engine(model: &Model, data: &Path, threads: usize, cache_bytes: Option<usize>) -> Engine {
    Engine::new(
        model.clone(),
        data,
        &EngineOptions {
            threads,
            cache_bytes,
        },
    )
    .unwrap()
}

fn no_progress(_: usize, _: usize) {}

fn run(engine: &Engine, options: &SensitivityOptions) -> Sensitivity {
    get_sensitivity_of_nodes(engine, options, &no_progress).unwrap()
}

/// The straightforward method, independent of the engine: its own session, a full
/// run per (candidate, sample) from the inputs, metrics per value, then the tool's
/// aggregation.
struct Reference {
    session: Session,
    samples: Vec<Vec<(String, Tensor)>>,
}

impl Reference {
    fn new(model: &Model, data: &Path) -> Reference {
        let session = Session::new(plan_model(model).unwrap(), 1).unwrap();
        let specs = session.plan().input_specs();
        let ds = Dataset::open(data, &specs).unwrap();
        let samples = (0..ds.len()).map(|i| ds.sample(i).unwrap()).collect();
        Reference { session, samples }
    }

    /// Values of `compared` for sample `s` under `config`, by a full run.
    fn full(&self, s: usize, config: &Config, compared: &[usize]) -> Vec<Tensor> {
        let refs: Vec<(&str, Tensor)> = self.samples[s]
            .iter()
            .map(|(n, t)| (n.as_str(), t.clone()))
            .collect();
        let bound = self.session.bind_inputs(&refs).unwrap();
        let values = self
            .session
            .run_from(&bound, None, config, compared, Capture::Wanted)
            .unwrap();
        compared
            .iter()
            .map(|&c| (*self.session.value(&values, c).unwrap()).clone())
            .collect()
    }

    /// The aggregated metrics of switching `calibrations` ON in the float model.
    fn sensitivity(
        &self,
        calibrations: &[&str],
        compared: &[&str],
        metrics: &[Metric],
        samples: usize,
    ) -> Vec<f64> {
        let plan = self.session.plan();
        let config = calibrations.iter().fold(Config::float(), |cfg, name| {
            cfg.with(plan.calibration(name).unwrap(), Override::On)
        });
        let slots: Vec<usize> = compared.iter().map(|n| plan.value(n).unwrap()).collect();
        // per_metric[m][output][sample]
        let mut per_metric = vec![vec![Vec::new(); slots.len()]; metrics.len()];
        for s in 0..samples {
            let float = self.full(s, &Config::float(), &slots);
            let probe = self.full(s, &config, &slots);
            for (o, (x, y)) in float.iter().zip(&probe).enumerate() {
                let (x, y) = (x.as_f32().unwrap(), y.as_f32().unwrap());
                for (m, &metric) in metrics.iter().enumerate() {
                    let v =
                        hmct_metrics::compute(metric, x.as_slice().unwrap(), y.as_slice().unwrap())
                            .unwrap();
                    per_metric[m][o].push(v);
                }
            }
        }
        per_metric
            .iter()
            .map(|per_output| hmct_metrics::aggregate(per_output))
            .collect()
    }
}

/// Every entry's values equal the straightforward method's, bit for bit.
fn assert_matches_reference(result: &Sensitivity, reference: &Reference) {
    let compared: Vec<&str> = result.compared.iter().map(String::as_str).collect();
    for e in &result.entries {
        let cals: Vec<&str> = e.calibrations.iter().map(String::as_str).collect();
        let want = reference.sensitivity(&cals, &compared, &result.metrics, result.data_num);
        let got: Vec<f64> = e.values.0.iter().map(|(_, v)| *v).collect();
        let want_bits: Vec<u64> = want.iter().map(|v| v.to_bits()).collect();
        let got_bits: Vec<u64> = got.iter().map(|v| v.to_bits()).collect();
        assert_eq!(
            got_bits, want_bits,
            "{}: got {got:?}, want {want:?}",
            e.name
        );
    }
}

/// Entries are worst first by the first metric.
fn assert_sorted(result: &Sensitivity) {
    let first = result.metrics[0];
    let values: Vec<f64> = result.entries.iter().map(|e| e.values.0[0].1).collect();
    for w in values.windows(2) {
        assert_ne!(
            hmct_metrics::compare_worst_first(first, w[0], w[1]),
            std::cmp::Ordering::Greater,
            "{values:?}"
        );
    }
}

fn names(result: &Sensitivity) -> Vec<String> {
    let mut n: Vec<String> = result.entries.iter().map(|e| e.name.clone()).collect();
    n.sort();
    n
}

#[test]
fn all_node_types_and_metrics_equal_full_runs() {
    for (model, data) in [pnet(), rnet()].into_iter().flatten() {
        let engine = engine(&model, &data, 2, None);
        let reference = Reference::new(&model, &data);
        for node_type in [NodeType::Node, NodeType::Weight, NodeType::Activation] {
            let options = SensitivityOptions {
                node_type,
                metrics: Metric::ALL.to_vec(),
                ..SensitivityOptions::default()
            };
            let result = run(&engine, &options);
            assert_eq!(result.data_num, 8);
            assert_eq!(result.compared, engine.plan().output_names());

            // The candidates are exactly the spec's.
            let mut want: Vec<String> = match node_type {
                NodeType::Node => hmct_ir::quantized_nodes(&model)
                    .iter()
                    .map(|&id| model.node_name(id).to_string())
                    .collect(),
                _ => model
                    .calibration_nodes()
                    .into_iter()
                    .map(|id| model.calibration(id).unwrap())
                    .filter(|c| {
                        (c.tensor_type() == TensorType::Weight) == (node_type == NodeType::Weight)
                    })
                    .map(|c| c.name().to_string())
                    .collect(),
            };
            want.sort();
            assert!(!want.is_empty());
            assert_eq!(names(&result), want, "{node_type}");
            for e in &result.entries {
                match node_type {
                    NodeType::Node => {
                        let id = model.node_id(&e.name).unwrap();
                        let cals: Vec<String> = hmct_ir::input_calibrations(&model, id)
                            .into_iter()
                            .map(|c| model.node_name(c).to_string())
                            .collect();
                        assert_eq!(e.calibrations, cals);
                        assert_eq!(e.kind, EntryKind::Node);
                        assert!(e.node.is_none() && e.threshold.is_none());
                    }
                    NodeType::Weight => {
                        assert_eq!(e.calibrations, [e.name.clone()]);
                        assert_eq!(e.kind, EntryKind::Weight);
                        assert!(e.node.as_ref().is_some_and(|n| !n.is_empty()));
                        assert!(e.threshold.is_none());
                    }
                    NodeType::Activation => {
                        assert_eq!(e.kind, EntryKind::Activation);
                        let id = model.node_id(&e.name).unwrap();
                        assert_eq!(
                            e.node.as_deref(),
                            Some(hmct_ir::consumer_label(&model, id).as_str())
                        );
                        // calibrate_for_tests: per-tensor int8 at the given threshold.
                        assert!(e.threshold.is_some_and(|t| t == 4.0 || t == 2.0));
                        assert_eq!(e.bit, Some(8));
                    }
                }
            }
            assert_sorted(&result);
            assert_matches_reference(&result, &reference);
            // Quantizing something changes the outputs for at least one candidate.
            assert!(
                result
                    .entries
                    .iter()
                    .any(|e| e.values.get(Metric::Mse).unwrap() > 0.0)
            );
        }
    }
}

#[test]
fn ranking_follows_the_first_metric() {
    let Some((model, data)) = rnet() else {
        return;
    };
    let engine = engine(&model, &data, 2, None);
    for metrics in [
        vec![Metric::Mse, Metric::CosineSimilarity],
        vec![Metric::Sqnr],
        vec![Metric::Chebyshev, Metric::Mre],
    ] {
        let result = run(
            &engine,
            &SensitivityOptions {
                metrics: metrics.clone(),
                ..SensitivityOptions::default()
            },
        );
        assert_eq!(result.metrics, metrics);
        assert!(result.entries.iter().all(|e| {
            e.values
                .0
                .iter()
                .map(|(m, _)| *m)
                .eq(metrics.iter().copied())
        }));
        assert_sorted(&result);
    }
}

#[test]
fn thread_count_and_cache_budget_change_nothing() {
    let Some((model, data)) = pnet() else {
        return;
    };
    let options = SensitivityOptions {
        metrics: Metric::ALL.to_vec(),
        ..SensitivityOptions::default()
    };
    let json = |threads, cache| {
        let e = engine(&model, &data, threads, cache);
        let r = run(&e, &options);
        (
            serde_json::to_string_pretty(&r).unwrap(),
            r.timings,
            e.cached_bytes(),
        )
    };
    let (one, t1, cached) = json(1, None);
    assert!(cached > 0);
    assert_eq!(t1.captures, 8);
    let (two, _, _) = json(2, None);
    assert_eq!(one, two, "1 vs 2 threads");
    // No cache at all: every sample captured, used and dropped.
    let (none, t0, cached) = json(2, Some(0));
    assert_eq!(cached, 0);
    assert_eq!(t0.captures, 8);
    assert_eq!(one, none, "no cache");
    // Room for about three samples: those stay, the rest stream.
    let per_sample = {
        let e = engine(&model, &data, 1, None);
        e.capture(0, hmct_quant::Base::Float).unwrap();
        e.cached_bytes()
    };
    let e = engine(&model, &data, 2, Some(per_sample * 3 + per_sample / 2));
    let r = run(&e, &options);
    assert_eq!(
        serde_json::to_string_pretty(&r).unwrap(),
        one,
        "partial cache"
    );
    assert_eq!(e.cached_bytes(), per_sample * 3);
    // A second analysis on the same engine reuses the cached samples (another node
    // type: the same one again would reuse the remembered figures and run nothing).
    let again = run(
        &e,
        &SensitivityOptions {
            node_type: NodeType::Weight,
            ..options.clone()
        },
    );
    assert!(again.timings.tasks > 0);
    assert_eq!(again.timings.captures, 5);
}

#[test]
fn interested_nodes_groups_and_calibration_names() {
    let Some((model, data)) = pnet() else {
        return;
    };
    let engine = engine(&model, &data, 2, None);
    let reference = Reference::new(&model, &data);
    let weight = model
        .calibration_nodes()
        .into_iter()
        .map(|id| model.calibration(id).unwrap())
        .find(|c| c.tensor_type() == TensorType::Weight)
        .unwrap()
        .name()
        .to_string();
    let activation = model
        .calibration_nodes()
        .into_iter()
        .map(|id| model.calibration(id).unwrap())
        .find(|c| c.tensor_type() == TensorType::Feature)
        .unwrap()
        .name()
        .to_string();
    let groups = vec![
        vec!["conv2d_1".to_string()],
        vec!["conv2d".to_string(), "conv2d_2".to_string()],
        vec![weight.clone()],
        vec![activation.clone(), "conv2d_3".to_string()],
    ];
    let result = run(
        &engine,
        &SensitivityOptions {
            node_type: NodeType::Weight, // overridden by interested_nodes
            metrics: vec![Metric::CosineSimilarity, Metric::Mse],
            interested_nodes: Some(groups),
            ..SensitivityOptions::default()
        },
    );
    let mut got = names(&result);
    got.sort();
    let mut want = vec![
        "conv2d_1".to_string(),
        "conv2d+conv2d_2".to_string(),
        weight.clone(),
        format!("{activation}+conv2d_3"),
    ];
    want.sort();
    assert_eq!(got, want);
    let by_name = |n: &str| result.entries.iter().find(|e| e.name == n).unwrap();
    let pair = by_name("conv2d+conv2d_2");
    let mut union: Vec<String> = ["conv2d", "conv2d_2"]
        .iter()
        .flat_map(|n| hmct_ir::input_calibrations(&model, model.node_id(n).unwrap()))
        .map(|c| model.node_name(c).to_string())
        .collect();
    union.dedup();
    assert_eq!(pair.calibrations, union);
    assert_eq!(pair.kind, EntryKind::Node);
    assert_eq!(by_name(&weight).kind, EntryKind::Weight);
    assert_eq!(by_name(&weight).calibrations, [weight.clone()]);
    // Mixed kinds: the plain node layout.
    assert_eq!(result.table_kind(), EntryKind::Node);
    assert_sorted(&result);
    assert_matches_reference(&result, &reference);
}

#[test]
fn output_node_and_data_num() {
    let Some((model, data)) = rnet() else {
        return;
    };
    let engine = engine(&model, &data, 2, None);
    let reference = Reference::new(&model, &data);
    let result = run(
        &engine,
        &SensitivityOptions {
            metrics: vec![Metric::Mse, Metric::CosineSimilarity],
            output_nodes: vec!["conv2d_6".into()],
            data_num: Some(3),
            ..SensitivityOptions::default()
        },
    );
    assert_eq!(result.data_num, 3);
    let conv = model.node(model.node_id("conv2d_6").unwrap());
    assert_eq!(result.compared, conv.output);
    // conv2d_7 comes after the compared node: quantizing it changes nothing there.
    let after = result
        .entries
        .iter()
        .find(|e| e.name == "conv2d_7")
        .unwrap();
    assert_eq!(after.values.get(Metric::Mse), Some(0.0));
    assert_eq!(after.values.get(Metric::CosineSimilarity), Some(1.0));
    let before = result
        .entries
        .iter()
        .find(|e| e.name == "conv2d_5")
        .unwrap();
    assert!(before.values.get(Metric::Mse).unwrap() > 0.0);
    assert_sorted(&result);
    assert_matches_reference(&result, &reference);

    // Two output nodes: values of both, in the order given.
    let two = run(
        &engine,
        &SensitivityOptions {
            output_nodes: vec!["conv2d_7".into(), "conv2d_5".into()],
            data_num: Some(1),
            ..SensitivityOptions::default()
        },
    );
    let out = |n: &str| model.node(model.node_id(n).unwrap()).output[0].clone();
    assert_eq!(two.compared, [out("conv2d_7"), out("conv2d_5")]);
    assert_matches_reference(&two, &reference);
}

#[test]
fn an_engine_reuses_the_probes_of_earlier_analyses() {
    let Some((model, data)) = pnet() else {
        return;
    };
    let activation = SensitivityOptions {
        node_type: NodeType::Activation,
        metrics: vec![Metric::Mse, Metric::CosineSimilarity],
        data_num: Some(3),
        ..SensitivityOptions::default()
    };
    // The regular nodes and, as one-name groups, the activation calibration nodes:
    // the latter are the activation ranking's probes again.
    let activations: Vec<String> = run(&engine(&model, &data, 1, None), &activation)
        .entries
        .iter()
        .map(|e| e.name.clone())
        .collect();
    let regular: Vec<String> = hmct_ir::quantized_nodes(&model)
        .iter()
        .map(|&id| model.node_name(id).to_string())
        .collect();
    let mixed = SensitivityOptions {
        interested_nodes: Some(
            activations
                .iter()
                .chain(&regular)
                .map(|n| vec![n.clone()])
                .collect(),
        ),
        ..activation.clone()
    };

    let fresh_engine = engine(&model, &data, 2, None);
    let fresh = run(&fresh_engine, &mixed);
    assert_eq!(fresh.timings.tasks, (activations.len() + regular.len()) * 3);

    let warm_engine = engine(&model, &data, 2, None);
    run(&warm_engine, &activation);
    let warm = run(&warm_engine, &mixed);
    assert_eq!(warm.timings.tasks, regular.len() * 3);
    // The same figures, bit for bit.
    assert_eq!(
        serde_json::to_string(&warm).unwrap(),
        serde_json::to_string(&fresh).unwrap()
    );
    // More samples than were measured: every probe runs again.
    let more = run(
        &warm_engine,
        &SensitivityOptions {
            data_num: Some(4),
            ..mixed.clone()
        },
    );
    assert_eq!(more.data_num, 4);
    assert_eq!(more.timings.tasks, (activations.len() + regular.len()) * 4);
}

#[test]
fn progress_reports_every_task() {
    let Some((model, data)) = pnet() else {
        return;
    };
    let engine = engine(&model, &data, 2, None);
    let calls = AtomicUsize::new(0);
    let last_total = AtomicUsize::new(0);
    let max_done = AtomicUsize::new(0);
    let progress = |done: usize, total: usize| {
        calls.fetch_add(1, Ordering::Relaxed);
        last_total.store(total, Ordering::Relaxed);
        max_done.fetch_max(done, Ordering::Relaxed);
    };
    let options = SensitivityOptions {
        node_type: NodeType::Activation,
        data_num: Some(5),
        ..SensitivityOptions::default()
    };
    let result = get_sensitivity_of_nodes(&engine, &options, &progress).unwrap();
    let tasks = result.entries.len() * 5;
    assert_eq!(calls.load(Ordering::Relaxed), tasks);
    assert_eq!(last_total.load(Ordering::Relaxed), tasks);
    assert_eq!(max_done.load(Ordering::Relaxed), tasks);
    assert_eq!(result.timings.tasks, tasks);
}

#[test]
fn argument_errors_are_typed_and_name_the_problem() {
    let Some((model, data)) = pnet() else {
        return;
    };
    let engine = engine(&model, &data, 1, None);
    let err = |options: SensitivityOptions| {
        get_sensitivity_of_nodes(&engine, &options, &no_progress).unwrap_err()
    };

    let e = err(SensitivityOptions {
        output_nodes: vec!["conv2d_22".into(), "softmaxx".into()],
        ..SensitivityOptions::default()
    });
    assert!(e.is_usage());
    let msg = e.to_string();
    assert!(
        matches!(e, SensitivityError::Engine(EngineError::UnknownNodes(ref u)) if u.len() == 2),
        "{msg}"
    );
    assert!(
        msg.contains("'conv2d_22' (did you mean 'conv2d_2'"),
        "{msg}"
    );
    assert!(msg.contains("'softmaxx' (did you mean 'softmax'"), "{msg}");

    let e = err(SensitivityOptions {
        interested_nodes: Some(vec![vec!["conv2d".into(), "nothing_like_it_at_all".into()]]),
        ..SensitivityOptions::default()
    });
    assert!(
        e.to_string()
            .contains("unknown node 'nothing_like_it_at_all'"),
        "{e}"
    );

    // softmax has no input calibration nodes; a calibration node is not a regular node.
    let cal = model.node_name(model.calibration_nodes()[0]).to_string();
    let e = err(SensitivityOptions {
        output_nodes: vec!["softmax".into(), cal.clone()],
        ..SensitivityOptions::default()
    });
    assert!(
        matches!(e, SensitivityError::OutputNotQuantized(ref v) if v.len() == 2),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("'softmax' has no input calibration nodes"),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains(&format!("'{cal}' is a calibration node")),
        "{e}"
    );

    let e = err(SensitivityOptions {
        interested_nodes: Some(vec![vec!["softmax".into()]]),
        ..SensitivityOptions::default()
    });
    assert_eq!(
        e.to_string(),
        "interested_nodes: 'softmax' is not quantized (nothing to switch on)"
    );

    let e = err(SensitivityOptions {
        data_num: Some(9),
        ..SensitivityOptions::default()
    });
    assert_eq!(e.to_string(), "data_num is 9 but the data has 8 sample(s)");
    assert!(e.is_usage());
    let e = err(SensitivityOptions {
        data_num: Some(0),
        ..SensitivityOptions::default()
    });
    assert!(matches!(
        e,
        SensitivityError::Engine(EngineError::ZeroDataNum)
    ));

    let e = err(SensitivityOptions {
        metrics: vec![],
        ..SensitivityOptions::default()
    });
    assert!(matches!(e, SensitivityError::NoMetrics));

    let e = parse_metrics(&["mse", "cosine"]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "unknown metric 'cosine' (did you mean 'cosine-similarity'?); valid metrics are: cosine-similarity, mse, mre, sqnr, chebyshev"
    );
    assert_eq!(
        parse_metrics(&["cosine-similarity", "SQNR"]).unwrap(),
        [Metric::CosineSimilarity, Metric::Sqnr]
    );
    let e = "nodes".parse::<NodeType>().unwrap_err();
    assert_eq!(
        e.to_string(),
        "unknown node type 'nodes' (did you mean 'node'?); valid node types are: node, weight, activation"
    );

    // An uncalibrated model.
    let raw = hmct_ir::load_model(models_dir().unwrap().join("mtcnn_pnet/pnet.onnx")).unwrap();
    let raw_engine = Engine::new(raw, &data, &EngineOptions::default()).unwrap();
    let e = get_sensitivity_of_nodes(&raw_engine, &SensitivityOptions::default(), &no_progress)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "the model has no calibration (HzCalibration) nodes"
    );
}

#[test]
fn tables_follow_the_seed_layouts() {
    let Some((model, data)) = pnet() else {
        return;
    };
    let engine = engine(&model, &data, 2, None);
    let metrics = vec![Metric::CosineSimilarity, Metric::Mse];
    for (node_type, header) in [
        (NodeType::Node, "node cosine-similarity mse"),
        (NodeType::Weight, "weight node cosine-similarity mse"),
        (
            NodeType::Activation,
            "activation node threshold bit cosine-similarity mse",
        ),
    ] {
        let result = run(
            &engine,
            &SensitivityOptions {
                node_type,
                metrics: metrics.clone(),
                data_num: Some(2),
                ..SensitivityOptions::default()
            },
        );
        let text = result.table().render();
        let lines: Vec<&str> = text.lines().collect();
        let width = lines[2].len();
        assert!(
            lines[0].starts_with('=')
                && lines[0].contains("node sensitivity")
                && lines[0].len() == width
        );
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>().join(" "),
            header
        );
        assert_eq!(lines[2], "-".repeat(width));
        assert_eq!(lines.len(), 3 + result.entries.len());
        for (line, e) in lines[3..].iter().zip(&result.entries) {
            let cells: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(cells[0], e.name);
            assert_eq!(
                cells[cells.len() - 2],
                hmct_metrics::format_value(e.values.0[0].1)
            );
            if node_type == NodeType::Activation {
                assert_eq!(cells[1], e.node.as_deref().unwrap());
                assert_eq!(cells[2], "4.0");
                assert_eq!(cells[3], "8");
            }
        }
    }
}
