//! Reading and editing HzCalibration nodes, and the editing workflow of the seed
//! walk-through (../shared/seeds/001, last section).

mod common;

use common::{attr_floats, attr_int, attr_ints, attr_str, f32_init, model, node};
use hmct_ir::{
    CALIBRATION_OP, IrError, Model, QType, TensorType, find_input_calibration,
    find_output_calibration, input_calibrations, load_model, load_model_from_bytes, model_to_bytes,
    quantized_nodes, save_model, testing,
};
use hmct_proto::Message;
use hmct_proto::onnx::{AttributeProto, NodeProto};
use proptest::prelude::*;

/// A weight calibration node as Horizon writes it: legacy and opaque attributes
/// next to the ones this crate interprets, and an extra statistics output.
fn horizon_weight_calib(channels: usize, extra: Vec<AttributeProto>) -> NodeProto {
    let mut n = node(
        "w_HzCalibration",
        CALIBRATION_OP,
        &["w"],
        &["wq", "w_stats"],
    );
    n.domain = Some("horizon".into());
    n.attribute = vec![
        attr_ints("quant_attrs", &[0x5a5a, 7]),
        attr_floats("thresholds", &vec![0.5; channels]),
        attr_int("axis", 0),
        attr_int("num_bins", 2048),
        attr_str("cali_attrs", "max-percentile"),
    ];
    n.attribute.extend(extra);
    n
}

fn one_calib_model(calib: NodeProto, channels: usize) -> Model {
    let m = model(
        &["x"],
        vec![f32_init(
            "w",
            &[channels as i64, 4, 1, 1],
            vec![0.25; channels * 4],
        )],
        vec![
            node("x_HzCalibration", CALIBRATION_OP, &["x"], &["xq"]),
            calib,
            node("Conv_0", "Conv", &["xq", "wq"], &["y"]),
        ],
        &["y"],
    );
    Model::from_proto(m, None).unwrap()
}

#[test]
fn defaults_and_derivations() {
    let m = one_calib_model(horizon_weight_calib(3, vec![]), 3);
    let x = m.calibration(0).unwrap();
    assert_eq!(x.qtype(), QType::INT8);
    assert!(x.thresholds().is_empty());
    assert!(x.switch_on());
    assert_eq!((x.constant(), x.group(), x.axis()), (0, 1, None));
    assert_eq!(x.tensor_type(), TensorType::Feature, "graph input: feature");
    assert!(!x.is_per_channel());
    assert!(x.validate().is_err(), "no thresholds, no scales");

    let w = m.calibration(1).unwrap();
    assert_eq!(
        w.tensor_type(),
        TensorType::Weight,
        "initializer input: weight"
    );
    assert!(w.is_per_channel());
    assert_eq!(w.scales(), vec![0.5 / 127.0; 3]);
    assert_eq!(w.zero_point(), vec![0; 3]);
    assert_eq!(w.output(), "wq");
    assert!(m.calibration(2).is_none(), "Conv is no calibration node");

    // One threshold with an axis is per-tensor.
    let m = one_calib_model(horizon_weight_calib(1, vec![]), 1);
    assert!(!m.calibration(1).unwrap().is_per_channel());
    // Legacy bits, explicit tensor_type and info_strings.
    let m = one_calib_model(
        horizon_weight_calib(
            2,
            vec![attr_int("bits", 16), attr_str("tensor_type", "feature")],
        ),
        2,
    );
    let w = m.calibration(1).unwrap();
    assert_eq!(w.qtype(), QType::INT16);
    assert_eq!(w.tensor_type(), TensorType::Feature);
    assert_eq!(w.scales(), vec![0.5 / 32767.0; 2]);
    let mut info = attr_str("info_strings", "");
    info.s = None;
    info.strings = vec![b"calibrated".to_vec(), b"type=feature;per_channel".to_vec()];
    let m = one_calib_model(horizon_weight_calib(2, vec![info]), 2);
    assert_eq!(m.calibration(1).unwrap().tensor_type(), TensorType::Feature);
    // Authoritative scales (constant == 2) and unknown qtypes.
    let m = one_calib_model(
        horizon_weight_calib(
            2,
            vec![
                attr_int("constant", 2),
                attr_floats("scales", &[0.1, 0.2]),
                attr_str("qtype", "fp8x"),
            ],
        ),
        2,
    );
    let w = m.calibration(1).unwrap();
    assert_eq!(w.scales(), vec![0.1, 0.2]);
    assert_eq!(w.qtype(), QType::Unknown("fp8x".into()));
    let err = w.validate().unwrap_err();
    assert!(
        err.to_string().contains("w_HzCalibration") && err.to_string().contains("fp8x"),
        "{err}"
    );
}

#[test]
fn asymmetric_nodes() {
    let mut n = node("a_HzCalibration", CALIBRATION_OP, &["x"], &["xq"]);
    n.attribute = vec![
        attr_str("qtype", "uint8"),
        attr_floats("thresholds", &[-1.0, 3.0]),
    ];
    let m = Model::from_proto(model(&["x"], vec![], vec![n], &["xq"]), None).unwrap();
    let mut m = m;
    let c = m.calibration(0).unwrap();
    assert!(c.is_asymmetric() && !c.is_per_channel());
    let s = 4.0f32 / 255.0;
    assert_eq!(c.scales(), vec![s]);
    assert_eq!(
        c.zero_point(),
        vec![255 - (3.0f32 / s).round_ties_even() as i64]
    );
    // [min, max] may be negative and zero, but must be ordered.
    let mut e = m.calibration_mut(0).unwrap();
    e.set_thresholds(vec![0.0, 2.0]).unwrap();
    assert!(e.set_thresholds(vec![2.0, 1.0]).is_err());
    assert_eq!(e.thresholds(), vec![0.0, 2.0]);
}

#[test]
fn setters_keep_scales_consistent_and_validate() {
    let m = one_calib_model(
        horizon_weight_calib(
            2,
            vec![
                attr_floats("scales", &[0.5 / 127.0; 2]),
                attr_str("switch", "ON"),
            ],
        ),
        2,
    );
    let mut m = m;
    let before = m.proto().clone();
    let mut w = m.calibration_mut(1).unwrap();
    w.set_qtype(QType::INT16).unwrap();
    assert_eq!(w.scales(), vec![0.5 / 32767.0; 2]);
    w.set_thresholds(vec![1.0, 2.0]).unwrap();
    assert_eq!(w.scales(), vec![1.0 / 32767.0, 2.0 / 32767.0]);
    for bad in [
        vec![],
        vec![0.0, 1.0],
        vec![1.0, -2.0],
        vec![f32::NAN],
        vec![f32::INFINITY],
    ] {
        let err = w.set_thresholds(bad.clone()).unwrap_err();
        assert!(
            matches!(&err, IrError::InvalidCalibration { node, .. } if node == "w_HzCalibration"),
            "{bad:?}: {err}"
        );
    }
    assert!(w.set_qtype(QType::Unknown("int3x".into())).is_err());
    assert_eq!(
        w.thresholds(),
        vec![1.0, 2.0],
        "failed edits change nothing"
    );
    w.set_switch(false);
    assert!(!w.switch_on());

    // The stored scales attribute was rewritten in place, everything else untouched.
    let after = m.proto();
    let (old, new) = (
        &before.graph.as_ref().unwrap().node,
        &after.graph.as_ref().unwrap().node,
    );
    assert_eq!(old[0], new[0]);
    assert_eq!(old[2], new[2]);
    let names: Vec<&str> = new[1].attribute.iter().map(|a| a.name()).collect();
    assert_eq!(
        names,
        [
            "quant_attrs",
            "thresholds",
            "axis",
            "num_bins",
            "cali_attrs",
            "scales",
            "switch",
            "qtype"
        ]
    );
    for keep in ["quant_attrs", "axis", "num_bins", "cali_attrs"] {
        let find = |n: &NodeProto| n.attribute.iter().find(|a| a.name() == keep).cloned();
        assert_eq!(find(&old[1]), find(&new[1]), "{keep}");
    }
    assert_eq!(new[1].output, ["wq", "w_stats"]);

    // Authoritative scales keep their clipping range when the qtype changes.
    let mut m = one_calib_model(
        horizon_weight_calib(
            1,
            vec![attr_int("constant", 2), attr_floats("scales", &[0.01])],
        ),
        1,
    );
    let mut w = m.calibration_mut(1).unwrap();
    w.set_qtype(QType::INT16).unwrap();
    let s = w.scales()[0];
    assert!((s * 32767.0 - 0.01 * 127.0).abs() < 1e-6, "{s}");
}

fn qtype_strategy() -> impl Strategy<Value = QType> {
    prop_oneof![
        Just(QType::INT8),
        Just(QType::INT16),
        Just(QType::UINT8),
        Just(QType::UINT16),
        Just(QType::INT4),
        Just(QType::Float16),
        Just(QType::Float32),
        (2u8..=32, any::<bool>()).prop_map(|(bits, signed)| QType::Int { bits, signed }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Edits survive save/load, leave other attributes and nodes alone, and keep the
    /// stored scales equal to the derived ones.
    #[test]
    fn edits_round_trip(
        channels in 1usize..40,
        new_len in 1usize..40,
        qtype in qtype_strategy(),
        seed in proptest::collection::vec(1e-6f32..1e4, 40),
        switch in any::<bool>(),
        with_scales in any::<bool>(),
    ) {
        let extra = if with_scales { vec![attr_floats("scales", &vec![0.5 / 127.0; channels])] } else { vec![] };
        let mut m = one_calib_model(horizon_weight_calib(channels, extra), channels);
        let before = m.proto().clone();
        let thresholds = seed[..new_len].to_vec();
        {
            let mut w = m.calibration_mut(1).unwrap();
            w.set_qtype(qtype.clone()).unwrap();
            w.set_thresholds(thresholds.clone()).unwrap();
            w.set_switch(switch);
        }
        let back = load_model_from_bytes(&model_to_bytes(&m)).unwrap();
        let w = back.calibration(1).unwrap();
        prop_assert_eq!(w.qtype(), qtype.clone());
        prop_assert_eq!(w.thresholds(), thresholds.clone());
        prop_assert_eq!(w.switch_on(), switch);
        prop_assert_eq!(w.is_per_channel(), new_len > 1);
        prop_assert_eq!(w.tensor_type(), TensorType::Weight);
        prop_assert_eq!(w.node().output.clone(), vec!["wq".to_string(), "w_stats".to_string()]);
        if let Some((_, qmax)) = qtype.qrange() {
            // The node has an axis, so two thresholds are two channels, not [min, max].
            let want: Vec<f32> = thresholds.iter().map(|t| t / qmax as f32).collect();
            prop_assert_eq!(w.scales(), want.clone());
            if with_scales {
                let stored = w.node().attribute.iter().find(|a| a.name() == "scales").unwrap();
                prop_assert_eq!(&stored.floats, &want);
            }
        }
        // Only the edited node changed, and only in the edited attributes.
        let (old, new) = (&before.graph.as_ref().unwrap().node, &back.proto().graph.as_ref().unwrap().node);
        prop_assert_eq!(&old[0], &new[0]);
        prop_assert_eq!(&old[2], &new[2]);
        for a in &old[1].attribute {
            if !["thresholds", "scales"].contains(&a.name()) {
                prop_assert_eq!(Some(a), new[1].attribute.iter().find(|b| b.name() == a.name()));
            }
        }
        prop_assert_eq!(&before.graph.as_ref().unwrap().initializer, &back.proto().graph.as_ref().unwrap().initializer);
        // The horizon opset is declared on save, once.
        prop_assert_eq!(back.opset("horizon"), Some(1));
        prop_assert_eq!(model_to_bytes(&back), back.proto().encode_to_vec());
    }
}

#[test]
fn test_calibration_of_pnet() {
    let Some(m) = testing::calibrated_pnet().unwrap() else {
        return;
    };
    let calibs = m.calibration_nodes();
    // 5 Convs: 4 distinct data inputs (two heads share one) and 5 weights.
    assert_eq!(calibs.len(), 9);
    let kinds: Vec<TensorType> = calibs
        .iter()
        .map(|&c| m.calibration(c).unwrap().tensor_type())
        .collect();
    assert_eq!(
        kinds.iter().filter(|&&k| k == TensorType::Weight).count(),
        5
    );
    let shared = m
        .calibration_by_name("p_re_lu_2/add:0_HzCalibration")
        .unwrap();
    assert_eq!(
        hmct_ir::consumer_label(&m, shared.id()),
        "conv2d_4;conv2d_3"
    );
    let w = m
        .calibration_by_name("conv2d/kernel:0_HzCalibration")
        .unwrap();
    assert!(w.is_per_channel());
    assert_eq!(w.thresholds().len(), 10);
    assert_eq!(w.axis(), Some(0));
    assert_eq!(quantized_nodes(&m), m.nodes_of_type("Conv").to_vec());
    for &c in &calibs {
        // Inserted before its readers, so no re-sorting was needed.
        let out = m.calibration(c).unwrap().output().to_string();
        assert!(m.consumers(&out).iter().all(|&r| r > c));
    }
    // The PRelu's output is calibrated behind the MaxPool.
    let prelu = m.node_id("p_re_lu").unwrap();
    let found = find_output_calibration(&m, prelu, None).unwrap();
    assert_eq!(m.node_name(found), "p_re_lu/add:0_pooling0_HzCalibration");
}

/// The seed's workflow: int16 for all feature nodes, for one node's inputs, new
/// thresholds for one node; save; reload; the changes are there.
#[test]
fn seed_editing_workflow() {
    let Some(mut m) = testing::calibrated_pnet().unwrap() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let calibrated = dir.path().join("calibrated_model.onnx");
    save_model(&m, &calibrated).unwrap();
    m = load_model(&calibrated).unwrap();

    let node = m.node_mappings()["p_re_lu_1/add:0_HzCalibration"];
    assert_eq!(m.calibration(node).unwrap().qtype(), QType::INT8);
    m.calibration_mut(node)
        .unwrap()
        .set_qtype(QType::Float32)
        .unwrap();

    for &c in &m.type2nodes()["HzCalibration"].clone() {
        if m.calibration(c).unwrap().tensor_type() == TensorType::Feature {
            m.calibration_mut(c)
                .unwrap()
                .set_qtype(QType::INT16)
                .unwrap();
        }
    }
    let conv = m.node_mappings()["conv2d_3"];
    for i in 0..m.node(conv).input.len() {
        if let Some(c) = find_input_calibration(&m, conv, Some(i)) {
            m.calibration_mut(c)
                .unwrap()
                .set_qtype(QType::INT16)
                .unwrap();
        }
    }
    let thresholds_node = m.node_mappings()["adjusted_input4_HzCalibration"];
    m.calibration_mut(thresholds_node)
        .unwrap()
        .set_thresholds(vec![4.23])
        .unwrap();

    let modified = dir.path().join("calibrated_model_modified.onnx");
    save_model(&m, &modified).unwrap();
    let back = load_model(&modified).unwrap();

    let conv3_inputs = input_calibrations(&back, back.node_id("conv2d_3").unwrap());
    assert_eq!(conv3_inputs.len(), 2);
    for &c in &back.calibration_nodes() {
        let n = back.calibration(c).unwrap();
        let want = if n.tensor_type() == TensorType::Feature || conv3_inputs.contains(&c) {
            QType::INT16
        } else {
            QType::INT8
        };
        assert_eq!(n.qtype(), want, "{}", n.name());
    }
    let t = back
        .calibration(back.node_id("adjusted_input4_HzCalibration").unwrap())
        .unwrap();
    assert_eq!(t.thresholds(), vec![4.23]);
    assert_eq!(t.scales(), vec![4.23 / 32767.0]);
    assert_eq!(back.opset("horizon"), Some(1));
    assert_eq!(back.opset("ai.onnx"), back.opset(""));
    // The untouched file is still as saved.
    assert_eq!(
        model_to_bytes(&load_model(&calibrated).unwrap()),
        std::fs::read(&calibrated).unwrap()
    );
}
