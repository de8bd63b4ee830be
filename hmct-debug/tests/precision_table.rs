//! precision-table on a calibrated real model (pnet) against a direct computation:
//! a fresh session, full forward runs of the calibrated model and of the float
//! model with one node quantized, metrics at the node's outputs computed here, the
//! tool's aggregation; the amplification from those figures. Needs
//! ../shared/models; skips with a note without it.

use hmct_debug::engine::{Engine, EngineError, EngineOptions};
use hmct_debug::precision_table::{PrecisionTableOptions, amplification, precision_table};
use hmct_metrics::{Metric, PairStats};
use hmct_quant::{Capture, Config, Override, Session, plan_model};
use hmct_tensor::Dataset;

#[test]
fn rows_match_full_runs() {
    let Some(model) = hmct_ir::testing::calibrated_pnet().unwrap() else {
        return;
    };
    let data = hmct_ir::testing::shared_dir()
        .unwrap()
        .join("models/mtcnn_pnet/calibration_data");
    let engine = Engine::new(model.clone(), &data, &EngineOptions::default()).unwrap();
    let samples = 3;
    let result = precision_table(
        &engine,
        &PrecisionTableOptions {
            data_num: Some(samples),
            shard: None,
        },
        &|_, _| {},
    )
    .unwrap();
    assert_eq!(result.data_num, samples);

    // Every quantized regular node, graph order.
    let names: Vec<&str> = result.rows.iter().map(|r| r.node.as_str()).collect();
    let expected: Vec<&str> = hmct_ir::quantized_nodes(&model)
        .into_iter()
        .map(|id| model.node_name(id))
        .collect();
    assert_eq!(names, expected);

    let session = Session::new(plan_model(&model).unwrap(), 1).unwrap();
    let plan = session.plan();
    let specs = plan.input_specs();
    let ds = Dataset::open(&data, &specs).unwrap();
    // metric of `config` vs float at `outputs`: mean over samples, then outputs.
    let figure = |config: &Config, outputs: &[String], metric: Metric| {
        let slots: Vec<usize> = outputs.iter().map(|o| plan.value(o).unwrap()).collect();
        let mut sums = vec![0.0; slots.len()];
        for s in 0..samples {
            let inputs = ds.sample(s).unwrap();
            let refs: Vec<(&str, _)> = inputs
                .iter()
                .map(|(n, t)| (n.as_str(), t.clone()))
                .collect();
            let bound = session.bind_inputs(&refs).unwrap();
            let run = |c: &Config| {
                session
                    .run_from(&bound, None, c, &slots, Capture::Wanted)
                    .unwrap()
            };
            let (x, y) = (run(&Config::float()), run(config));
            for (i, &slot) in slots.iter().enumerate() {
                let a: Vec<f32> = session
                    .value(&x, slot)
                    .unwrap()
                    .as_f32()
                    .unwrap()
                    .iter()
                    .copied()
                    .collect();
                let b: Vec<f32> = session
                    .value(&y, slot)
                    .unwrap()
                    .as_f32()
                    .unwrap()
                    .iter()
                    .copied()
                    .collect();
                let mut stats = PairStats::new();
                stats.update(&a, &b).unwrap();
                sums[i] += stats.metric(metric);
            }
        }
        sums.iter().map(|v| v / samples as f64).sum::<f64>() / slots.len() as f64
    };
    let close = |a: f64, b: f64, what: &str| {
        assert!(
            a == b || (a - b).abs() <= 1e-9 * b.abs().max(1e-12),
            "{what}: table {a} vs direct {b}"
        );
    };
    let mut passes_on = 0;
    for row in &result.rows {
        let id = model.node_id(&row.node).unwrap();
        let outputs: Vec<String> = model
            .node(id)
            .output
            .iter()
            .filter(|o| !o.is_empty())
            .cloned()
            .collect();
        assert_eq!(row.outputs, outputs);
        let single = hmct_ir::input_calibrations(&model, id)
            .into_iter()
            .map(|c| plan.calibration(model.node_name(c)).unwrap())
            .fold(Config::float(), |c, i| c.with(i, Override::On));
        let cal = Config::calibrated();
        close(
            row.end_to_end.cosine,
            figure(&cal, &outputs, Metric::CosineSimilarity),
            &row.node,
        );
        close(
            row.end_to_end.mse,
            figure(&cal, &outputs, Metric::Mse),
            &row.node,
        );
        close(
            row.per_layer.cosine,
            figure(&single, &outputs, Metric::CosineSimilarity),
            &row.node,
        );
        close(
            row.per_layer.mse,
            figure(&single, &outputs, Metric::Mse),
            &row.node,
        );
        assert_eq!(
            row.amplification_mse,
            amplification(row.end_to_end.mse, row.per_layer.mse, 0.0)
        );
        let amp = row.amplification_cosine.unwrap();
        close(
            amp,
            (1.0 - row.end_to_end.cosine) / (1.0 - row.per_layer.cosine),
            &row.node,
        );
        if amp > 1.5 {
            passes_on += 1;
        }
    }
    // The first quantized node sees float inputs in both modes: nothing to amplify.
    let first = &result.rows[0];
    assert_eq!(first.end_to_end.cosine, first.per_layer.cosine);
    assert_eq!(first.amplification_mse, Some(1.0));
    // Deeper nodes inherit error.
    assert!(passes_on > 0, "no node passes error on");

    // The table has one line per row plus title, header and rule.
    let text = result.table().render();
    assert_eq!(text.lines().count(), 3 + result.rows.len());
    assert!(text.lines().nth(1).unwrap().contains("amp(1-cos)"));

    let err = precision_table(
        &engine,
        &PrecisionTableOptions {
            data_num: Some(100),
            shard: None,
        },
        &|_, _| {},
    )
    .unwrap_err();
    assert!(matches!(err, EngineError::DataNum { .. }), "{err}");
}
