//! Per-sample figures, degenerate-sample warnings, `exclude_samples`, and shards
//! merged back, on small models built here: x → conv1 → conv2 (bias −16) →
//! Sigmoid, whose output saturates to about 1e-7 on a sample of near-zero inputs.

use std::path::Path;

use hmct_debug::engine::{Engine, EngineOptions};
use hmct_debug::health::{Check, DEGENERATE_SAMPLE, check_all};
use hmct_debug::sensitivity::{
    NodeType, Sensitivity, SensitivityError, SensitivityOptions, get_sensitivity_of_nodes,
    merge_sensitivity,
};
use hmct_debug::shard::{MergeError, Shard};
use hmct_ir::Model;
use hmct_ir::testing::build::{float_value, model, named_value, node};
use hmct_metrics::Metric;
use hmct_tensor::{Tensor, tensor_to_proto, write_npy};
use proptest::prelude::*;

/// x (1×2×2×2) → conv1 (2→2, 1×1) → conv2 (2→1, 1×1, bias −16) → Sigmoid → `out`,
/// calibrated (activation threshold 12): `convs` extra 1×1 convs (2→2) sit between
/// conv1 and conv2 to give more candidates.
fn sigmoid_model(convs: usize) -> Model {
    let w1 = Tensor::from_f32(&[2, 2, 1, 1], vec![0.9, 0.1, 0.2, 0.8]).unwrap();
    let w2 = Tensor::from_f32(&[1, 2, 1, 1], vec![1.0, 1.0]).unwrap();
    let b2 = Tensor::from_f32(&[1], vec![-16.0]).unwrap();
    let mut nodes = vec![node("conv1", "Conv", &["x", "w1"], &["h0"])];
    let mut inits = vec![
        tensor_to_proto(&w1, "w1"),
        tensor_to_proto(&w2, "w2"),
        tensor_to_proto(&b2, "b2"),
    ];
    for k in 0..convs {
        let w = Tensor::from_f32(
            &[2, 2, 1, 1],
            vec![1.0 - 0.05 * k as f32, 0.03, 0.02 * k as f32, 0.97],
        )
        .unwrap();
        inits.push(tensor_to_proto(&w, &format!("wm{k}")));
        nodes.push(node(
            &format!("mid{k}"),
            "Conv",
            &[&format!("h{k}"), &format!("wm{k}")],
            &[&format!("h{}", k + 1)],
        ));
    }
    let last = format!("h{convs}");
    nodes.push(node("conv2", "Conv", &[&last, "w2", "b2"], &["logit"]));
    nodes.push(node("sig", "Sigmoid", &["logit"], &["out"]));
    let proto = model(
        vec![float_value("x", &[1, 2, 2, 2])],
        nodes,
        inits,
        vec![named_value("out")],
    );
    let model = Model::from_proto(proto, None).unwrap();
    hmct_ir::testing::calibrate_for_tests(model, 12.0).unwrap()
}

/// Samples of x: around 8 (outputs mid-range to near 1), except those in `tiny`,
/// near 0, where conv2 gives about −16 and the Sigmoid about 1e-7.
fn write_data(dir: &Path, samples: usize, tiny: &[usize]) {
    let folder = dir.join("x");
    std::fs::create_dir_all(&folder).unwrap();
    for s in 0..samples {
        let v: Vec<f32> = (0..8)
            .map(|i| {
                let wiggle = ((i * 7 + s * 3) % 11) as f32 / 11.0;
                if tiny.contains(&s) {
                    0.01 * wiggle
                } else {
                    6.5 + 3.0 * wiggle
                }
            })
            .collect();
        let t = Tensor::from_f32(&[1, 2, 2, 2], v).unwrap();
        write_npy(&folder.join(format!("{s}.npy")), &t).unwrap();
    }
}

fn engine(model: &Model, dir: &Path) -> Engine {
    Engine::new(model.clone(), dir, &EngineOptions::default()).unwrap()
}

fn rank(engine: &Engine, options: &SensitivityOptions) -> Sensitivity {
    get_sensitivity_of_nodes(engine, options, &|_, _| {}).unwrap()
}

fn all_metrics(node_type: NodeType) -> SensitivityOptions {
    SensitivityOptions {
        node_type,
        metrics: Metric::ALL.to_vec(),
        ..SensitivityOptions::default()
    }
}

#[test]
fn per_sample_figures_average_to_the_values() {
    let dir = tempfile::tempdir().unwrap();
    write_data(dir.path(), 3, &[]);
    let e = engine(&sigmoid_model(1), dir.path());
    let r = rank(&e, &all_metrics(NodeType::Node));
    assert!(r.warnings.is_empty(), "{:#?}", r.warnings);
    assert_eq!(r.entries.len(), 3);
    for entry in &r.entries {
        for &m in &Metric::ALL {
            let per = entry.per_sample.get(m).unwrap();
            assert_eq!(per.len(), 3);
            // One compared output: the value is the mean of the per-sample figures.
            let mean = hmct_metrics::nan_mean(per);
            let v = entry.values.get(m).unwrap();
            assert!(
                v == mean || (v - mean).abs() <= 1e-12 * mean.abs(),
                "{} {m}: {v} vs {mean}",
                entry.name
            );
        }
    }
    // The JSON spells them metric → list.
    let json: serde_json::Value = serde_json::to_value(&r).unwrap();
    let per = &json["entries"][0]["per_sample"]["cosine-similarity"];
    assert_eq!(per.as_array().unwrap().len(), 3, "{json:#}");
}

#[test]
fn a_saturated_sample_is_warned_about_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    write_data(dir.path(), 3, &[1]);
    let model = sigmoid_model(1);
    let e = engine(&model, dir.path());
    let r = rank(&e, &all_metrics(NodeType::Node));
    assert_eq!(r.warnings.len(), 1, "{:#?}", r.warnings);
    let w = &r.warnings[0];
    assert_eq!(
        (w.kind.as_str(), w.sample, w.output.as_deref(), w.excluded),
        (DEGENERATE_SAMPLE, 1, Some("out"), false)
    );
    assert!(w.max_abs > 1e-8 && w.max_abs < 3e-7, "{w:?}");
    assert!(w.why.contains("rounding"), "{}", w.why);
    assert_eq!(r.compared_samples[0].max_abs[1], w.max_abs);

    // Under the table, which is otherwise the plain table.
    let footer = r.footer();
    assert!(footer.starts_with("warning: sample 1 of 'out'"), "{footer}");
    assert_eq!(r.render(), r.table().render() + &footer);

    // In the JSON in the shape.
    let json: serde_json::Value = serde_json::to_value(&r).unwrap();
    let jw = &json["warnings"][0];
    assert_eq!(jw["kind"], "degenerate-sample");
    assert_eq!(jw["sample"], 1);
    assert_eq!(jw["output"], "out");
    assert!(jw["max_abs"].is_f64() && jw["why"].is_string(), "{jw}");

    // In the health checks.
    let health = check_all(&e, None, &|_, _| {}).unwrap();
    let found: Vec<_> = health
        .findings
        .iter()
        .filter(|f| f.check == Check::DegenerateSample)
        .collect();
    assert_eq!(found.len(), 1, "{:#?}", health.findings);
    assert_eq!(found[0].node, "out");
    assert_eq!(found[0].numbers["sample"], 1.0);
}

#[test]
fn all_zero_and_nan_samples_are_warned_about() {
    use hmct_debug::health::{OutputSamples, degenerate_samples};
    let outputs = [OutputSamples {
        output: "y".into(),
        max_abs: vec![1.0, 0.0, 0.5, 1e-6, 1e-5],
        non_finite: vec![0, 0, 3, 0, 0],
    }];
    let w = degenerate_samples(&outputs, &[2]);
    let got: Vec<(usize, bool)> = w.iter().map(|w| (w.sample, w.excluded)).collect();
    // 1e-6 is 8.4 rounding steps of the scale 1.0, 1e-5 is 84.
    assert_eq!(got, vec![(1, false), (2, true), (3, false)], "{w:#?}");
    assert!(w[0].why.contains("all zero") && w[1].why.contains("NaN/inf"));
}

#[test]
fn excluding_the_sample_changes_only_the_ranking_figures() {
    let dir = tempfile::tempdir().unwrap();
    write_data(dir.path(), 3, &[1]);
    let model = sigmoid_model(2);
    let e = engine(&model, dir.path());
    for node_type in [NodeType::Node, NodeType::Weight, NodeType::Activation] {
        let all = rank(&e, &all_metrics(node_type));
        let without = rank(
            &e,
            &SensitivityOptions {
                exclude_samples: vec![1],
                ..all_metrics(node_type)
            },
        );
        assert_eq!(without.excluded_samples, vec![1]);
        assert_eq!(without.data_num, 3);
        // The same warning, marked as left out.
        assert_eq!(without.warnings.len(), 1);
        assert!(without.warnings[0].excluded);
        assert_eq!(without.warnings[0].why, all.warnings[0].why);
        assert!(without.footer().contains("ranked without sample(s) 1 of 3"));

        // What ranks: exactly a run on the data without that sample.
        let kept = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(kept.path().join("x")).unwrap();
        for (to, from) in [(0, 0), (1, 2)] {
            std::fs::copy(
                dir.path().join(format!("x/{from}.npy")),
                kept.path().join(format!("x/{to}.npy")),
            )
            .unwrap();
        }
        let reduced = rank(&engine(&model, kept.path()), &all_metrics(node_type));
        let names = |r: &Sensitivity| r.entries.iter().map(|e| e.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&without), names(&reduced));
        for (a, b) in without.entries.iter().zip(&reduced.entries) {
            assert_eq!(a.values, b.values, "{}", a.name);
        }
        // Per-sample figures are those of the full run, sample 1 included.
        for a in &without.entries {
            let b = all.entries.iter().find(|b| b.index == a.index).unwrap();
            assert_eq!(a.per_sample, b.per_sample, "{}", a.name);
        }
    }
}

#[test]
fn excluded_samples_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    write_data(dir.path(), 2, &[]);
    let e = engine(&sigmoid_model(0), dir.path());
    let err = |exclude: Vec<usize>, data_num| {
        get_sensitivity_of_nodes(
            &e,
            &SensitivityOptions {
                exclude_samples: exclude,
                data_num,
                ..SensitivityOptions::default()
            },
            &|_, _| {},
        )
        .unwrap_err()
    };
    let e1 = err(vec![1], Some(1));
    assert!(matches!(
        e1,
        SensitivityError::ExcludedOutOfRange {
            sample: 1,
            samples: 1
        }
    ));
    assert!(e1.is_usage());
    assert!(matches!(
        err(vec![0, 1, 1], None),
        SensitivityError::AllExcluded
    ));
}

fn to_json(r: &Sensitivity) -> String {
    serde_json::to_string_pretty(r).unwrap()
}

/// Each shard run on its own engine (as separate processes would), written to JSON
/// and read back.
fn shards(
    model: &Model,
    dir: &Path,
    options: &SensitivityOptions,
    count: usize,
) -> Vec<(String, Sensitivity)> {
    (1..=count)
        .map(|i| {
            let e = engine(model, dir);
            let part = rank(
                &e,
                &SensitivityOptions {
                    shard: Some(Shard::new(i, count).unwrap()),
                    ..options.clone()
                },
            );
            let text = to_json(&part);
            (
                format!("part{i}.json"),
                serde_json::from_str(&text).unwrap(),
            )
        })
        .collect()
}

#[test]
fn merged_shards_equal_the_whole_and_bad_sets_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_data(dir.path(), 3, &[1]);
    let model = sigmoid_model(4);
    let options = SensitivityOptions {
        exclude_samples: vec![2],
        ..all_metrics(NodeType::Activation)
    };
    let whole = rank(&engine(&model, dir.path()), &options);
    assert!(whole.shard.is_none());
    let parts = shards(&model, dir.path(), &options, 3);
    assert_eq!(
        to_json(&merge_sensitivity(parts.clone()).unwrap()),
        to_json(&whole)
    );
    assert_eq!(
        merge_sensitivity(parts.clone()).unwrap().render(),
        whole.render()
    );

    // A missing shard, a duplicated one, different options, a different model.
    let missing = merge_sensitivity(vec![parts[0].clone(), parts[2].clone()]).unwrap_err();
    assert_eq!(missing.to_string(), "missing shard(s) 2 of 3");
    let twice = vec![parts[0].clone(), parts[1].clone(), parts[1].clone()];
    assert!(matches!(
        merge_sensitivity(twice).unwrap_err(),
        MergeError::Duplicate {
            shard: Shard { index: 2, count: 3 },
            ..
        }
    ));
    let other = shards(&model, dir.path(), &all_metrics(NodeType::Activation), 3);
    let mixed = vec![parts[0].clone(), other[1].clone(), parts[2].clone()];
    let e = merge_sensitivity(mixed).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("part1.json and part2.json come from different options"),
        "{e}"
    );
    let mut changed = parts.clone();
    changed[2].1.model_digest = "sha256:0".into();
    let e = merge_sensitivity(changed).unwrap_err();
    assert!(
        matches!(e, MergeError::Mismatch { what: "models", .. }),
        "{e}"
    );
    // A whole result is not a part.
    let e = merge_sensitivity(vec![("whole.json".into(), whole)]).unwrap_err();
    assert!(matches!(e, MergeError::NotAPart { .. }), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    /// Any shard count: every candidate in exactly one shard, and the merge is the
    /// unsharded result.
    #[test]
    fn any_shard_count_covers_every_candidate_once(count in 1usize..12, node_type in 0usize..3) {
        let dir = tempfile::tempdir().unwrap();
        write_data(dir.path(), 2, &[]);
        let model = sigmoid_model(3);
        let node_type = [NodeType::Node, NodeType::Weight, NodeType::Activation][node_type];
        let options = all_metrics(node_type);
        let whole = rank(&engine(&model, dir.path()), &options);
        let parts = shards(&model, dir.path(), &options, count);
        let mut seen: Vec<usize> = parts.iter().flat_map(|(_, p)| p.entries.iter().map(|e| e.index)).collect();
        seen.sort_unstable();
        prop_assert_eq!(seen, (0..whole.entries.len()).collect::<Vec<_>>());
        prop_assert_eq!(to_json(&merge_sensitivity(parts).unwrap()), to_json(&whole));
    }
}

#[test]
fn mixed_precision_takes_a_merged_ranking() {
    use hmct_debug::mixed_precision::{
        MixedPrecisionError, MixedPrecisionOptions, mixed_precision,
    };
    let dir = tempfile::tempdir().unwrap();
    write_data(dir.path(), 2, &[]);
    let model = sigmoid_model(3);
    let e = engine(&model, dir.path());
    let search = |ranking: Option<Sensitivity>| {
        mixed_precision(
            &e,
            &MixedPrecisionOptions {
                target: 0.9999999,
                ranking,
                ..MixedPrecisionOptions::default()
            },
            &|_, _, _| {},
        )
    };
    let own = search(None).unwrap();
    let ranking_options = SensitivityOptions::default();
    let merged = merge_sensitivity(shards(&model, dir.path(), &ranking_options, 2)).unwrap();
    let given = search(Some(merged)).unwrap();
    let curve = |r: &hmct_debug::mixed_precision::MixedPrecision| {
        r.curve
            .iter()
            .map(|s| (s.node.clone(), s.value))
            .collect::<Vec<_>>()
    };
    assert_eq!(curve(&given), curve(&own));

    // A part, or a ranking on another metric, is refused.
    let part = shards(&model, dir.path(), &ranking_options, 2).remove(0).1;
    let err = search(Some(part)).unwrap_err();
    assert!(
        matches!(err, MixedPrecisionError::RankingMismatch(_)) && err.is_usage(),
        "{err}"
    );
    let mse = rank(
        &e,
        &SensitivityOptions {
            metrics: vec![Metric::Mse],
            ..SensitivityOptions::default()
        },
    );
    let err = search(Some(mse)).unwrap_err();
    assert!(err.to_string().contains("ranked on"), "{err}");
}

/// Equal values keep candidate order across parts, as they do unsharded (the
/// figures are made equal by hand: real ties across shards are rare).
#[test]
fn ties_across_parts_keep_candidate_order() {
    let dir = tempfile::tempdir().unwrap();
    write_data(dir.path(), 2, &[]);
    let model = sigmoid_model(4);
    let options = all_metrics(NodeType::Activation);
    let mut parts = shards(&model, dir.path(), &options, 3);
    for (_, p) in &mut parts {
        for e in &mut p.entries {
            e.values.0[0].1 = 0.5;
        }
    }
    let whole = merge_sensitivity(parts.clone()).unwrap();
    let order: Vec<usize> = whole.entries.iter().map(|e| e.index).collect();
    assert_eq!(order, (0..order.len()).collect::<Vec<_>>());
    // Whatever order the parts come in.
    parts.reverse();
    let again = merge_sensitivity(parts).unwrap();
    assert_eq!(to_json(&again), to_json(&whole));
}
