//! Batch edits (`apply_edits`) on the bundled tiny CNN and on MTCNN's PNet: each edit
//! changes exactly the intended calibration nodes, in exactly the intended attributes,
//! survives save/reload, and bad edits are refused with the model untouched.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use hmct_ir::{
    Edit, EditError, Model, QType, TensorType, apply_edits, input_calibrations, load_model,
    save_model,
};
use hmct_proto::onnx::NodeProto;

fn tiny() -> Model {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/tiny_cnn/calibrated_model.onnx");
    load_model(path).unwrap()
}

fn nodes_by_name(model: &Model) -> BTreeMap<String, NodeProto> {
    model
        .nodes()
        .iter()
        .map(|n| (n.name().to_string(), n.clone()))
        .collect()
}

/// Applies `edits`, saves and reloads, and checks that exactly `expected` nodes
/// differ, only in attributes among `attributes` (plus the derived `scales` and
/// `zero_point`), and that everything else in the model is as before. Returns the
/// reloaded model.
fn check_edit(model: &Model, edits: &[Edit], expected: &[&str], attributes: &[&str]) -> Model {
    let mut edited = model.clone();
    let report = apply_edits(&mut edited, edits).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.onnx");
    save_model(&edited, &path).unwrap();
    let reloaded = load_model(&path).unwrap();

    let before = nodes_by_name(model);
    let after = nodes_by_name(&reloaded);
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>()
    );
    let changed: BTreeSet<&str> = before
        .iter()
        .filter(|(name, node)| after[*name] != **node)
        .map(|(name, _)| name.as_str())
        .collect();
    let expected_set: BTreeSet<&str> = expected.iter().copied().collect();
    assert_eq!(changed, expected_set);
    let reported: BTreeSet<&str> = report.changes.iter().map(|c| c.node.as_str()).collect();
    assert_eq!(reported, expected_set);
    for name in changed {
        let (b, a) = (&before[name], &after[name]);
        let strip = |n: &NodeProto| {
            let mut n = n.clone();
            n.attribute.retain(|x| {
                !attributes.contains(&x.name()) && !["scales", "zero_point"].contains(&x.name())
            });
            n
        };
        assert_eq!(strip(b), strip(a), "{name}: other attributes changed");
    }
    let mut graph_before = model.graph_proto().clone();
    let mut graph_after = reloaded.graph_proto().clone();
    graph_before.node.clear();
    graph_after.node.clear();
    assert_eq!(graph_before, graph_after, "the rest of the graph changed");
    reloaded
}

fn qtype_of(model: &Model, name: &str) -> QType {
    model.calibration_by_name(name).unwrap().qtype()
}

fn calibrations_where(model: &Model, f: impl Fn(TensorType) -> bool) -> Vec<String> {
    model
        .calibration_nodes()
        .into_iter()
        .map(|id| model.calibration(id).unwrap())
        .filter(|c| f(c.tensor_type()))
        .map(|c| c.name().to_string())
        .collect()
}

#[test]
fn nodes_qtype_regular_and_calibration_names() {
    let model = tiny();
    let edits = [Edit::NodesQType {
        nodes: vec!["res_add".into(), "fc.weight_HzCalibration".into()],
        qtype: QType::INT16,
    }];
    let expected = [
        "res_conv2_out_HzCalibration",
        "down_relu_out_HzCalibration",
        "fc.weight_HzCalibration",
    ];
    let out = check_edit(&model, &edits, &expected, &["qtype"]);
    for name in expected {
        assert_eq!(qtype_of(&out, name), QType::INT16);
        assert_eq!(
            out.calibration_by_name(name).unwrap().thresholds(),
            model.calibration_by_name(name).unwrap().thresholds()
        );
    }
}

#[test]
fn a_regular_node_changes_only_its_activation_inputs() {
    let model = tiny();
    // res_conv1 reads one activation and one weight calibration node.
    let id = model.node_id("res_conv1").unwrap();
    assert_eq!(input_calibrations(&model, id).len(), 2);
    let edits = [Edit::NodesQType {
        nodes: vec!["res_conv1".into()],
        qtype: QType::Float16,
    }];
    let out = check_edit(&model, &edits, &["down_relu_out_HzCalibration"], &["qtype"]);
    assert_eq!(
        qtype_of(&out, "down_relu_out_HzCalibration"),
        QType::Float16
    );
}

#[test]
fn all_activations_and_all_weights() {
    let model = tiny();
    let features = calibrations_where(&model, |t| t == TensorType::Feature);
    let weights = calibrations_where(&model, |t| t == TensorType::Weight);
    assert!(features.len() >= 5 && weights.len() >= 5);

    let f: Vec<&str> = features.iter().map(String::as_str).collect();
    let edit = Edit::AllQType {
        kind: Some(TensorType::Feature),
        qtype: QType::INT16,
    };
    let out = check_edit(&model, &[edit], &f, &["qtype"]);
    assert!(f.iter().all(|n| qtype_of(&out, n) == QType::INT16));

    let w: Vec<&str> = weights.iter().map(String::as_str).collect();
    let edit = Edit::AllQType {
        kind: Some(TensorType::Weight),
        qtype: QType::INT16,
    };
    let out = check_edit(&model, &[edit], &w, &["qtype"]);
    assert!(w.iter().all(|n| qtype_of(&out, n) == QType::INT16));

    let all: Vec<&str> = f.iter().chain(&w).copied().collect();
    let edit = Edit::AllQType {
        kind: None,
        qtype: QType::INT16,
    };
    check_edit(&model, &[edit], &all, &["qtype"]);
}

#[test]
fn op_types() {
    let model = tiny();
    let edit = Edit::OpTypesQType {
        op_types: vec!["Gemm".into()],
        qtype: QType::INT16,
    };
    check_edit(&model, &[edit], &["flatten_out_HzCalibration"], &["qtype"]);
    let edit = Edit::OpTypesQType {
        op_types: vec!["Conv".into()],
        qtype: QType::INT16,
    };
    check_edit(
        &model,
        &[edit],
        &[
            "input_HzCalibration",
            "stem_relu_out_HzCalibration",
            "down_relu_out_HzCalibration",
            "res_relu1_out_HzCalibration",
            "res_relu2_out_HzCalibration",
            "dw_relu_out_HzCalibration",
        ],
        &["qtype"],
    );
}

#[test]
fn thresholds_per_tensor_and_per_channel() {
    let model = tiny();
    let per_channel = model
        .calibration_by_name("fc.weight_HzCalibration")
        .unwrap()
        .thresholds();
    let halved: Vec<f32> = per_channel.iter().map(|t| t / 2.0).collect();
    let edits = [
        Edit::Threshold {
            node: "stem_relu_out_HzCalibration".into(),
            thresholds: vec![4.23],
        },
        Edit::Threshold {
            node: "fc.weight_HzCalibration".into(),
            thresholds: halved.clone(),
        },
    ];
    let out = check_edit(
        &model,
        &edits,
        &["stem_relu_out_HzCalibration", "fc.weight_HzCalibration"],
        &["thresholds"],
    );
    let stem = out
        .calibration_by_name("stem_relu_out_HzCalibration")
        .unwrap();
    assert_eq!(stem.thresholds(), vec![4.23]);
    assert_eq!(stem.scales(), vec![4.23 / 127.0]);
    assert_eq!(
        out.calibration_by_name("fc.weight_HzCalibration")
            .unwrap()
            .thresholds(),
        halved
    );
}

#[test]
fn switch_regular_and_calibration_nodes() {
    let model = tiny();
    let edits = [
        Edit::Switch {
            node: "res_conv1".into(),
            on: false,
        },
        Edit::Switch {
            node: "logits_HzCalibration".into(),
            on: false,
        },
    ];
    let out = check_edit(
        &model,
        &edits,
        &[
            "down_relu_out_HzCalibration",
            "res_conv1.weight_HzCalibration",
            "logits_HzCalibration",
        ],
        &["switch"],
    );
    assert!(
        !out.calibration_by_name("logits_HzCalibration")
            .unwrap()
            .switch_on()
    );
    // And back on: a later edit wins.
    let mut again = out.clone();
    let report = apply_edits(
        &mut again,
        &[Edit::Switch {
            node: "logits_HzCalibration".into(),
            on: true,
        }],
    )
    .unwrap();
    assert_eq!(report.changes.len(), 1);
    assert_eq!(
        (
            report.changes[0].before.as_str(),
            report.changes[0].after.as_str()
        ),
        ("OFF", "ON")
    );
}

#[test]
fn subgraph_between_tensors_and_nodes() {
    let model = tiny();
    // The residual block: its skip input enters through down_relu_out.
    let edit = Edit::SubgraphQType {
        inputs: vec!["down_relu_out".into()],
        outputs: vec!["res_add".into()],
        qtype: QType::INT16,
    };
    check_edit(
        &model,
        &[edit],
        &[
            "down_relu_out_HzCalibration",
            "res_relu1_out_HzCalibration",
            "res_conv2_out_HzCalibration",
        ],
        &["qtype"],
    );
    // Node names: the input node's own activation input is part of it (the seed's
    // det_head example starts at Conv nodes); weights are not.
    let edit = Edit::SubgraphQType {
        inputs: vec!["dw_conv".into()],
        outputs: vec!["pw_relu_out".into()],
        qtype: QType::INT16,
    };
    check_edit(
        &model,
        &[edit],
        &["res_relu2_out_HzCalibration", "dw_relu_out_HzCalibration"],
        &["qtype"],
    );
}

#[test]
fn subgraph_whose_inputs_do_not_enclose_it() {
    let mut model = tiny();
    let original = model.proto().clone();
    // The skip connection bypasses res_conv1.
    let err = apply_edits(
        &mut model,
        &[Edit::SubgraphQType {
            inputs: vec!["res_conv1".into()],
            outputs: vec!["res_add".into()],
            qtype: QType::INT16,
        }],
    )
    .unwrap_err();
    assert!(
        matches!(&err, EditError::NotDominated { graph_input, output } if graph_input == "input" && output == "res_add"),
        "{err}"
    );
    assert!(err.to_string().contains("'input'"), "{err}");
    let err = apply_edits(
        &mut model,
        &[Edit::SubgraphQType {
            inputs: vec!["down_relu_out".into(), "fc".into()],
            outputs: vec!["res_add".into()],
            qtype: QType::INT16,
        }],
    )
    .unwrap_err();
    assert!(
        matches!(&err, EditError::InputNotUpstream { input } if input == "fc"),
        "{err}"
    );
    assert_eq!(model.proto(), &original);
}

#[test]
fn unknown_names_suggest_close_ones_and_change_nothing() {
    let mut model = tiny();
    let original = model.proto().clone();
    // The first edit is valid: all or nothing.
    let edits = [
        Edit::AllQType {
            kind: None,
            qtype: QType::INT16,
        },
        Edit::NodesQType {
            nodes: vec!["res_ad".into()],
            qtype: QType::INT16,
        },
    ];
    let err = apply_edits(&mut model, &edits).unwrap_err();
    match &err {
        EditError::UnknownNode { name, suggestions } => {
            assert_eq!(name, "res_ad");
            assert_eq!(suggestions.first().map(String::as_str), Some("res_add"));
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("did you mean 'res_add'"), "{err}");
    assert_eq!(model.proto(), &original);

    let err = apply_edits(
        &mut model,
        &[Edit::OpTypesQType {
            op_types: vec!["conv".into()],
            qtype: QType::INT16,
        }],
    )
    .unwrap_err();
    assert!(err.to_string().contains("did you mean 'Conv'"), "{err}");

    let err = apply_edits(
        &mut model,
        &[Edit::SubgraphQType {
            inputs: vec!["down_relu_ot".into()],
            outputs: vec!["res_add".into()],
            qtype: QType::INT16,
        }],
    )
    .unwrap_err();
    assert!(err.to_string().contains("'down_relu_out'"), "{err}");
    assert_eq!(model.proto(), &original);
}

#[test]
fn bad_values_are_refused_and_change_nothing() {
    let mut model = tiny();
    let original = model.proto().clone();
    let cases = [
        // A threshold belongs to a calibration node.
        Edit::Threshold {
            node: "res_conv1".into(),
            thresholds: vec![1.0],
        },
        Edit::Threshold {
            node: "stem_relu_out_HzCalibration".into(),
            thresholds: vec![-1.0],
        },
        // Flatten reads GlobalAveragePool's output: no calibration node.
        Edit::NodesQType {
            nodes: vec!["flatten".into()],
            qtype: QType::INT16,
        },
    ];
    for edit in cases {
        let edits = [
            Edit::Switch {
                node: "input_HzCalibration".into(),
                on: false,
            },
            edit.clone(),
        ];
        let err = apply_edits(&mut model, &edits).unwrap_err();
        assert!(!err.to_string().is_empty());
        assert_eq!(model.proto(), &original, "{edit:?}");
    }
    let err = apply_edits(
        &mut model,
        &[Edit::Threshold {
            node: "res_conv1".into(),
            thresholds: vec![1.0],
        }],
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("down_relu_out_HzCalibration")
            && err.to_string().contains("res_conv1.weight_HzCalibration"),
        "{err}"
    );
}

#[test]
fn unchanged_nodes_are_reported_apart() {
    let mut model = tiny();
    let report = apply_edits(
        &mut model,
        &[Edit::NodesQType {
            nodes: vec!["res_add".into()],
            qtype: QType::INT8,
        }],
    )
    .unwrap();
    assert!(report.changes.is_empty());
    assert_eq!(
        report.unchanged,
        vec![
            "down_relu_out_HzCalibration".to_string(),
            "res_conv2_out_HzCalibration".to_string()
        ]
    );
}

#[test]
fn pnet_all_activations_int16() {
    let Some(model) = hmct_ir::testing::calibrated_pnet().unwrap() else {
        return;
    };
    let features = calibrations_where(&model, |t| t == TensorType::Feature);
    let f: Vec<&str> = features.iter().map(String::as_str).collect();
    let out = check_edit(
        &model,
        &[Edit::AllQType {
            kind: Some(TensorType::Feature),
            qtype: QType::INT16,
        }],
        &f,
        &["qtype"],
    );
    for name in &f {
        let (a, b) = (
            model.calibration_by_name(name).unwrap(),
            out.calibration_by_name(name).unwrap(),
        );
        assert_eq!(a.thresholds(), b.thresholds());
        assert_eq!(b.qtype(), QType::INT16);
    }
}
