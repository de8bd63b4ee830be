//! outliers on a calibrated real model (pnet) against a direct computation: a
//! fresh session's float run, per-channel maxima taken with ndarray lanes, levels
//! from log2, mean over samples. Needs ../shared/models; skips without it.

use hmct_debug::engine::{Engine, EngineOptions};
use hmct_debug::outliers::{LEVELS, OutliersOptions, outliers};
use hmct_ir::TensorType;
use hmct_quant::{Capture, Config, Session, plan_model};
use hmct_tensor::Dataset;
use hmct_tensor::ndarray::Axis;

#[test]
fn ratios_match_a_direct_computation() {
    let Some(model) = hmct_ir::testing::calibrated_pnet().unwrap() else {
        return;
    };
    let data = hmct_ir::testing::shared_dir()
        .unwrap()
        .join("models/mtcnn_pnet/calibration_data");
    let engine = Engine::new(model.clone(), &data, &EngineOptions::default()).unwrap();
    let samples = 3;
    // The default axis and a negative one (pnet's Conv inputs are NCHW, so the last
    // axis is W: a different set of lanes).
    let mut some_level = false;
    for axis in [1i64, -1] {
        let result = outliers(
            &engine,
            &OutliersOptions {
                data_num: Some(samples),
                axis,
                flag_ratio: 0.3,
            },
            &|_, _| {},
        )
        .unwrap();
        let activations: Vec<String> = model
            .calibration_nodes()
            .into_iter()
            .filter_map(|id| model.calibration(id))
            .filter(|c| c.tensor_type() == TensorType::Feature)
            .map(|c| c.name().to_string())
            .collect();
        let names: Vec<&str> = result.rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, activations);
        assert!(result.skipped.is_empty());

        let session = Session::new(plan_model(&model).unwrap(), 1).unwrap();
        let plan = session.plan();
        let specs = plan.input_specs();
        let ds = Dataset::open(&data, &specs).unwrap();
        for row in &result.rows {
            let slot = plan.value(&row.tensor).unwrap();
            let mut sparse = 0.0;
            let mut levels = [0.0; 4];
            let mut max_abs = 0f64;
            for s in 0..samples {
                let inputs = ds.sample(s).unwrap();
                let refs: Vec<(&str, _)> = inputs
                    .iter()
                    .map(|(n, t)| (n.as_str(), t.clone()))
                    .collect();
                let bound = session.bind_inputs(&refs).unwrap();
                let values = session
                    .run_from(&bound, None, &Config::float(), &[slot], Capture::Wanted)
                    .unwrap();
                let t = session.value(&values, slot).unwrap();
                let a = t.as_f32().unwrap();
                let ax = if axis < 0 {
                    a.ndim() - 1
                } else {
                    axis as usize
                };
                let maxima: Vec<f64> = a
                    .axis_iter(Axis(ax))
                    .map(|c| c.iter().fold(0f64, |m, v| m.max(f64::from(v.abs()))))
                    .collect();
                assert_eq!(maxima.len(), row.channels);
                let top = maxima.iter().copied().fold(0.0, f64::max);
                max_abs = max_abs.max(top);
                let n = maxima.len() as f64;
                sparse += maxima.iter().filter(|&&m| m == 0.0).count() as f64 / n;
                for (l, level) in levels.iter_mut().zip(LEVELS) {
                    let count = maxima
                        .iter()
                        .filter(|&&m| m > 0.0 && (top / m).log2() >= f64::from(level))
                        .count();
                    *l += count as f64 / n;
                }
            }
            let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
            assert!(
                close(row.sparse_ratio, sparse / samples as f64),
                "{}",
                row.name
            );
            assert_eq!(row.max_abs, max_abs);
            for (got, want) in row.level_ratios.iter().zip(levels) {
                assert!(
                    close(got.ratio, want / samples as f64),
                    "{} {got:?} vs {want}",
                    row.name
                );
                some_level |= got.ratio > 0.0;
            }
            assert_eq!(row.flagged, row.level_ratios[0].ratio >= 0.3);
        }
    }
    assert!(some_level, "every ratio is zero, the test shows nothing");
    // An axis beyond every tensor's rank: each is skipped with the reason.
    let result = outliers(
        &engine,
        &OutliersOptions {
            axis: 7,
            ..Default::default()
        },
        &|_, _| {},
    )
    .unwrap();
    assert!(result.rows.is_empty());
    assert!(result.skipped.iter().all(|s| s.reason.contains("axis 7")));
}
