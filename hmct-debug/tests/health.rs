//! Health checks on a tiny synthetic model (x → Conv → Relu, calibrated by the
//! stand-in calibration), with each problem planted in turn: every check fires on
//! its own problem with the right numbers, and the clean model gives nothing.

use std::path::Path;

use hmct_debug::engine::{Engine, EngineOptions};
use hmct_debug::health::{
    Check, Finding, HealthReport, Severity, check_all, check_data, check_model,
};
use hmct_ir::testing::build::{float_value, model, named_value, node};
use hmct_ir::{CalibrationInsert, CalibrationSpec, Model, QType, TensorType};
use hmct_proto::onnx::{AttributeProto, NodeProto, TensorProto};
use hmct_tensor::{Tensor, tensor_to_proto, write_npy};

fn build(nodes: Vec<NodeProto>, inits: Vec<TensorProto>, output: &str) -> Model {
    let proto = model(
        vec![float_value("x", &[1, 2, 3, 3])],
        nodes,
        inits,
        vec![named_value(output)],
    );
    Model::from_proto(proto, None).unwrap()
}

/// Channel maxima 0.5 and 1.0.
const WEIGHT: [f32; 4] = [0.5, -0.25, 1.0, 0.75];

/// x → Conv(w) → Relu, calibrated: `x_HzCalibration` (per tensor, `threshold`) and
/// `w_HzCalibration` (per channel, the channel maxima).
fn conv_model(weight: [f32; 4], threshold: f32) -> Model {
    let w = Tensor::from_f32(&[2, 2, 1, 1], weight.to_vec()).unwrap();
    let model = build(
        vec![
            node("conv", "Conv", &["x", "w"], &["y"]),
            node("relu", "Relu", &["y"], &["z"]),
        ],
        vec![tensor_to_proto(&w, "w")],
        "z",
    );
    hmct_ir::testing::calibrate_for_tests(model, threshold).unwrap()
}

/// Two samples of x with max |x| exactly 1.0; `nan` puts a NaN in the second.
fn data(dir: &Path, nan: bool) {
    let folder = dir.join("x");
    std::fs::create_dir_all(&folder).unwrap();
    for s in 0..2 {
        let mut v: Vec<f32> = (0..18).map(|i| (i as f32 - 9.0) / 9.0 * 0.5).collect();
        v[s] = if s == 0 { -1.0 } else { 1.0 };
        if nan && s == 1 {
            v[5] = f32::NAN;
        }
        let t = Tensor::from_f32(&[1, 2, 3, 3], v).unwrap();
        write_npy(&folder.join(format!("{s}.npy")), &t).unwrap();
    }
}

fn run(model: Model, nan: bool) -> HealthReport {
    let dir = tempfile::tempdir().unwrap();
    data(dir.path(), nan);
    let engine = Engine::new(model, dir.path(), &EngineOptions::default()).unwrap();
    check_all(&engine, None, &|_, _| {}).unwrap()
}

fn only(findings: &[Finding]) -> &Finding {
    assert_eq!(findings.len(), 1, "{findings:#?}");
    &findings[0]
}

fn number(f: &Finding, key: &str) -> f64 {
    *f.numbers
        .get(key)
        .unwrap_or_else(|| panic!("no '{key}' in {f:#?}"))
}

/// Sets a calibration node's thresholds (and scales, as the file would carry them)
/// without the checks of the editing API, which refuses bad values.
fn set_thresholds(model: Model, name: &str, thresholds: &[f32]) -> Model {
    let mut proto = model.into_proto();
    let graph = proto.graph.as_mut().unwrap();
    let n = graph.node.iter_mut().find(|n| n.name() == name).unwrap();
    n.attribute
        .retain(|a| a.name() != "thresholds" && a.name() != "scales");
    for (attr, values) in [
        ("thresholds", thresholds.to_vec()),
        ("scales", thresholds.iter().map(|t| t / 127.0).collect()),
    ] {
        n.attribute.push(AttributeProto {
            name: Some(attr.into()),
            r#type: Some(6),
            floats: values,
            ..Default::default()
        });
    }
    Model::from_proto(proto, None).unwrap()
}

#[test]
fn a_clean_model_has_no_finding() {
    let report = run(conv_model(WEIGHT, 1.0), false);
    assert_eq!(report.samples, 2);
    assert!(report.findings.is_empty(), "{:#?}", report.findings);
    assert_eq!((report.warnings, report.infos), (0, 0));

    // What was seen of each calibration node, in graph order.
    let seen: Vec<_> = report
        .calibrations
        .iter()
        .map(|c| {
            (
                c.node.as_str(),
                c.tensor_type.as_str(),
                c.qtype.as_str(),
                c.per_channel,
                c.thresholds,
                c.threshold_min,
                c.threshold_max,
                c.consumers.as_str(),
                c.max_abs,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (
                "x_HzCalibration",
                "feature",
                "int8",
                false,
                1,
                Some(1.0),
                Some(1.0),
                "conv",
                Some(1.0)
            ),
            (
                "w_HzCalibration",
                "weight",
                "int8",
                true,
                2,
                Some(0.5),
                Some(1.0),
                "conv",
                Some(1.0)
            ),
        ]
    );
}

#[test]
fn a_threshold_far_below_the_data_is_heavy_clipping() {
    let report = run(conv_model(WEIGHT, 0.2), false);
    let f = only(&report.findings);
    assert_eq!(
        (f.check, f.severity),
        (Check::HeavyClipping, Severity::Warning)
    );
    assert_eq!(f.node, "x_HzCalibration");
    assert_eq!(number(f, "max_abs"), 1.0);
    assert_eq!(number(f, "threshold"), f64::from(0.2f32));
    assert!((number(f, "ratio") - 5.0).abs() < 1e-6, "{f:?}");
    assert!(f.message.contains("5.0x"), "{}", f.message);
    assert_eq!(report.warnings, 1);
}

#[test]
fn a_ratio_at_the_limit_is_not_reported() {
    // max|x| / threshold = 3.9: tolerated.
    let report = run(conv_model(WEIGHT, 1.0 / 3.9), false);
    assert!(report.findings.is_empty(), "{:#?}", report.findings);
}

#[test]
fn a_threshold_far_above_the_data_is_wasted_range() {
    let report = run(conv_model(WEIGHT, 5.0), false);
    let f = only(&report.findings);
    assert_eq!((f.check, f.severity), (Check::WastedRange, Severity::Info));
    assert_eq!(f.node, "x_HzCalibration");
    assert!((number(f, "ratio") - 5.0).abs() < 1e-6, "{f:?}");
    assert_eq!((report.warnings, report.infos), (0, 1));
}

#[test]
fn weight_thresholds_are_compared_with_the_weights_per_channel() {
    // Channel 1's threshold 1.0 against max|w| 0.2: wasted; channel 0 fine.
    let model = conv_model([0.5, -0.25, 0.2, 0.1], 1.0);
    let model = set_thresholds(model, "w_HzCalibration", &[0.5, 1.0]);
    let f = only(&check_model(&model)).clone();
    assert_eq!(
        (f.check, f.node.as_str()),
        (Check::WastedRange, "w_HzCalibration")
    );
    assert_eq!(number(&f, "channel"), 1.0);
    assert!((number(&f, "ratio") - 5.0).abs() < 1e-5, "{f:?}");
    assert!(f.message.contains("channel 1"), "{}", f.message);

    let model = set_thresholds(model, "w_HzCalibration", &[0.1, 0.2]);
    let f = only(&check_model(&model)).clone();
    assert_eq!(f.check, Check::HeavyClipping);
    assert_eq!(number(&f, "channel"), 0.0);
    assert_eq!(number(&f, "channels_over_limit"), 1.0);
}

#[test]
fn an_all_zero_weight_channel_is_reported() {
    let report = run(conv_model([0.5, -0.25, 0.0, 0.0], 1.0), false);
    // The pruned channel also makes the Relu's output all zero on sample 0.
    let (degenerate, rest): (Vec<Finding>, Vec<Finding>) = report
        .findings
        .iter()
        .cloned()
        .partition(|f| f.check == Check::DegenerateSample);
    let d = only(&degenerate);
    assert_eq!(
        (d.node.as_str(), number(d, "sample"), number(d, "max_abs")),
        ("z", 0.0, 0.0)
    );
    assert!(d.message.contains("all zero"), "{}", d.message);
    let f = only(&rest);
    assert_eq!((f.check, f.severity), (Check::ZeroChannel, Severity::Info));
    assert_eq!(f.node, "w_HzCalibration");
    assert_eq!(number(f, "first_channel"), 1.0);
    assert_eq!(number(f, "channels"), 2.0);
}

#[test]
fn non_finite_weights_are_reported_at_their_calibration_node() {
    let model = conv_model([0.5, f32::NAN, f32::NAN, 0.75], 1.0);
    let findings = check_model(&model);
    let f = only(&findings);
    assert_eq!(
        (f.check, f.node.as_str()),
        (Check::NonFiniteWeight, "w_HzCalibration")
    );
    assert_eq!(number(f, "count"), 2.0);
    assert_eq!(number(f, "elements"), 4.0);
}

#[test]
fn zero_negative_and_denormal_thresholds_are_reported() {
    for (bad, check) in [
        (0.0f32, Check::InvalidThreshold),
        (-1.0, Check::InvalidThreshold),
        (f32::NAN, Check::InvalidThreshold),
        (1e-40, Check::DenormalThreshold),
    ] {
        let model = set_thresholds(conv_model(WEIGHT, 1.0), "x_HzCalibration", &[bad]);
        let findings = check_model(&model);
        let f = only(&findings);
        assert_eq!((f.check, f.severity), (check, Severity::Warning), "{bad}");
        assert_eq!(f.node, "x_HzCalibration");
    }
    // On a per-channel node the count says how many.
    let model = set_thresholds(conv_model(WEIGHT, 1.0), "w_HzCalibration", &[0.0, -2.0]);
    let findings = check_model(&model);
    let f = only(&findings);
    assert_eq!(f.check, Check::InvalidThreshold);
    assert_eq!(number(f, "count"), 2.0);
}

#[test]
fn nan_in_the_data_is_reported_with_where_it_shows() {
    let report = run(conv_model(WEIGHT, 1.0), true);
    assert_eq!(report.findings.len(), 3, "{:#?}", report.findings);
    // The NaN reaches the output on that sample.
    let output = report
        .findings
        .iter()
        .find(|f| f.check == Check::DegenerateSample)
        .unwrap();
    assert_eq!((output.node.as_str(), number(output, "sample")), ("z", 1.0));
    assert!(output.message.contains("NaN/inf"), "{}", output.message);
    let input = report
        .findings
        .iter()
        .find(|f| f.check == Check::NonFiniteData)
        .unwrap();
    assert_eq!(input.node, "x");
    assert_eq!(
        (number(input, "count"), number(input, "samples")),
        (1.0, 1.0)
    );
    let act = report
        .findings
        .iter()
        .find(|f| f.check == Check::NonFiniteActivation)
        .unwrap();
    assert_eq!(act.node, "x_HzCalibration");
    assert_eq!(number(act, "count"), 1.0);

    // The first sample alone is clean.
    let dir = tempfile::tempdir().unwrap();
    data(dir.path(), true);
    let engine = Engine::new(
        conv_model(WEIGHT, 1.0),
        dir.path(),
        &EngineOptions::default(),
    )
    .unwrap();
    let (samples, findings) = check_data(&engine, Some(1), &|_, _| {}).unwrap();
    assert_eq!(samples, 1);
    assert!(findings.is_empty(), "{findings:#?}");
}

#[test]
fn an_activation_no_input_reaches_is_reported() {
    // z + Neg(k): the calibration node on Neg's output sees constants only.
    let w = Tensor::from_f32(&[2, 2, 1, 1], WEIGHT.to_vec()).unwrap();
    let k = Tensor::from_f32(&[1], vec![0.5]).unwrap();
    let model = build(
        vec![
            node("conv", "Conv", &["x", "w"], &["y"]),
            node("relu", "Relu", &["y"], &["z"]),
            node("neg", "Neg", &["k"], &["c"]),
            node("add", "Add", &["z", "c"], &["out"]),
        ],
        vec![tensor_to_proto(&w, "w"), tensor_to_proto(&k, "k")],
        "out",
    );
    let model = hmct_ir::testing::calibrate_for_tests(model, 1.0).unwrap();
    let add = model.node_id("add").unwrap();
    let model = model
        .insert_calibrations(vec![CalibrationInsert {
            spec: CalibrationSpec {
                name: "c_HzCalibration".into(),
                input: "c".into(),
                output: "c_q".into(),
                tensor_type: TensorType::Feature,
                qtype: QType::INT8,
                thresholds: vec![0.5],
                axis: None,
                group: None,
                constant: 1,
                switch_on: true,
            },
            consumers: vec![(add, 1)],
        }])
        .unwrap();
    let findings = check_model(&model);
    let f = only(&findings);
    assert_eq!((f.check, f.severity), (Check::Unreached, Severity::Warning));
    assert_eq!(f.node, "c_HzCalibration");
    assert!(f.message.contains("'c'"), "{}", f.message);

    // The data checks leave it alone (it has no data to judge).
    let report = run(model, false);
    assert_eq!(report.findings.len(), 1, "{:#?}", report.findings);
}

#[test]
fn findings_serialize_with_stable_names() {
    let report = run(conv_model(WEIGHT, 0.2), false);
    let json = serde_json::to_value(&report).unwrap();
    let f = &json["findings"][0];
    assert_eq!(f["check"], "heavy-clipping");
    assert_eq!(f["severity"], "warning");
    assert_eq!(f["node"], "x_HzCalibration");
    assert_eq!(json["warnings"], 1);
}

/// runall's default box plots skip a calibration node without a channel axis: a
/// scalar weight (QDQ files quantize a Mul's scalar factor) is among the top nodes of
/// the weight ranking here, and runall completes instead of stopping at
/// "axis 0 is out of range".
#[test]
fn runall_skips_box_plots_of_scalar_calibration_nodes() {
    let w = Tensor::from_f32(&[2, 2, 1, 1], WEIGHT.to_vec()).unwrap();
    let k = Tensor::from_f32(&[], vec![0.3]).unwrap();
    let model = build(
        vec![
            node("conv", "Conv", &["x", "w"], &["y"]),
            node("scale", "Mul", &["y", "k"], &["z"]),
        ],
        vec![tensor_to_proto(&w, "w"), tensor_to_proto(&k, "k")],
        "z",
    );
    let model = hmct_ir::testing::calibrate_for_tests(model, 1.0).unwrap();
    let mul = model.node_id("scale").unwrap();
    let model = model
        .insert_calibrations(vec![CalibrationInsert {
            spec: CalibrationSpec {
                name: "k_HzCalibration".into(),
                input: "k".into(),
                output: "k_q".into(),
                tensor_type: TensorType::Weight,
                qtype: QType::INT8,
                thresholds: vec![0.3],
                axis: None,
                group: None,
                constant: 1,
                switch_on: true,
            },
            consumers: vec![(mul, 1)],
        }])
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    data(dir.path(), false);
    let engine = Engine::new(model, dir.path(), &EngineOptions::default()).unwrap();
    let out = dir.path().join("result");
    let summary = hmct_debug::runall::runall(
        &engine,
        &hmct_debug::runall::RunallOptions::default(),
        &out,
        None,
        &|_, _, _| {},
    )
    .unwrap();
    assert!(
        summary
            .distribution_nodes
            .iter()
            .any(|n| n == "k_HzCalibration")
    );
    assert!(
        !summary
            .channelwise_nodes
            .iter()
            .any(|n| n == "k_HzCalibration")
    );
    assert!(
        summary
            .channelwise_nodes
            .iter()
            .any(|n| n == "w_HzCalibration")
    );
}
