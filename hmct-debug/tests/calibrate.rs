//! Calibration of the real float models of ../shared/models, checked against an
//! independent computation (a plain float run capturing every value, maxima computed
//! here), plus the structure of the written model and the option errors. Needs
//! ../shared/models; skips with a note without it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use hmct_debug::calibrate::{
    CalibrateError, CalibrateOptions, Calibrated, DEFAULT_OP_TYPES, Method, calibrate,
};
use hmct_ir::{Model, QType, TensorType, load_model};
use hmct_quant::{Capture, Config, Session, plan_model};
use hmct_tensor::ndarray::Axis;
use hmct_tensor::{Dataset, InputSpec, Tensor};

fn models_dir() -> Option<PathBuf> {
    hmct_ir::testing::shared_path("models")
}

/// (name, model file, data folder) of every shared model.
fn shared_models() -> Vec<(String, PathBuf, PathBuf)> {
    let Some(root) = models_dir() else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs.into_iter()
        .map(|d| {
            let onnx = std::fs::read_dir(&d)
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .find(|p| p.extension().is_some_and(|e| e == "onnx"))
                .unwrap();
            let name = d.file_name().unwrap().to_string_lossy().into_owned();
            (name, onnx, d.join("calibration_data"))
        })
        .collect()
}

fn no_progress(_: usize, _: usize) {}

fn specs(session: &Session) -> Vec<InputSpec> {
    session.plan().input_specs()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.as_f32().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// max |x| of the finite values, written out plainly.
fn plain_max_abs(t: &Tensor) -> f32 {
    let mut m = 0f32;
    for &v in t.as_f32().unwrap().iter() {
        if v.is_finite() && v.abs() > m {
            m = v.abs();
        }
    }
    m
}

/// The structure every calibrated model must have, whatever the options.
fn check_structure(float: &Model, calibrated: &Model) {
    // The float model's nodes are all there, unchanged but for rewired inputs.
    for node in float.nodes() {
        let id = calibrated.node_id(node.name()).unwrap();
        let now = calibrated.node(id);
        assert_eq!(now.op_type(), node.op_type());
        assert_eq!(now.output, node.output, "{}", node.name());
        assert_eq!(now.attribute, node.attribute, "{}", node.name());
        for (old, new) in node.input.iter().zip(&now.input) {
            if old != new {
                let p = calibrated
                    .producer(new)
                    .expect("rewired to a calibration output");
                let c = calibrated.calibration(p).expect("a calibration node");
                assert_eq!(c.input(), old, "{}", node.name());
            }
        }
    }
    assert_eq!(calibrated.outputs(), float.outputs());
    assert_eq!(calibrated.inputs(), float.inputs());
    let mut activation_inputs = HashSet::new();
    for id in calibrated.calibration_nodes() {
        let c = calibrated.calibration(id).unwrap();
        assert_eq!(c.name(), format!("{}_HzCalibration", c.input()));
        assert_eq!(c.output(), format!("{}_output", c.name()));
        assert_eq!(c.node().domain(), "horizon");
        assert!(c.switch_on());
        assert_eq!(c.constant(), 1);
        c.validate().unwrap();
        match c.tensor_type() {
            TensorType::Feature => {
                assert!(!calibrated.is_constant(c.input()), "{}", c.name());
                assert!(
                    activation_inputs.insert(c.input().to_string()),
                    "two nodes on {}",
                    c.input()
                );
                assert_eq!(c.thresholds().len(), 1);
            }
            TensorType::Weight => assert!(c.axis().is_some() || c.thresholds().len() == 1),
        }
        // Every reader of the node is of a quantized op type.
        for &r in calibrated.consumers(c.output()) {
            assert!(DEFAULT_OP_TYPES.contains(&calibrated.node(r).op_type()));
        }
    }
}

/// On every shared model, `max` thresholds are the largest |x| of each tensor over the
/// data and weight thresholds the largest |w| per output channel; the calibrated model
/// runs, and with every calibration node OFF it reproduces the float model bit for bit.
#[test]
fn max_calibration_of_the_real_models() {
    for (name, file, data) in shared_models() {
        let float = load_model(&file).unwrap();
        let Calibrated { model, report } =
            calibrate(&float, &data, &CalibrateOptions::default(), &no_progress)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        eprintln!(
            "{name}: {} activation, {} weight nodes",
            report.activation_nodes, report.weight_nodes
        );
        assert!(
            report.activation_nodes > 0 && report.weight_nodes > 0,
            "{name}"
        );
        assert_eq!(report.samples, 8);
        check_structure(&float, &model);

        // Independent maxima: the float model alone, every value captured.
        let session = Session::new(plan_model(&float).unwrap(), 0).unwrap();
        let dataset = Dataset::open(&data, &specs(&session)).unwrap();
        let calibrations: Vec<_> = model
            .calibration_nodes()
            .into_iter()
            .map(|id| model.calibration(id).unwrap())
            .collect();
        let mut maxima = vec![0f32; calibrations.len()];
        for s in 0..dataset.len() {
            let inputs = dataset.sample(s).unwrap();
            let refs: Vec<(&str, Tensor)> = inputs
                .iter()
                .map(|(n, t)| (n.as_str(), t.clone()))
                .collect();
            let bound = session.bind_inputs(&refs).unwrap();
            let values = session
                .run_from(
                    &bound,
                    None,
                    &Config::float(),
                    session.plan().outputs(),
                    Capture::All,
                )
                .unwrap();
            for (c, m) in calibrations.iter().zip(&mut maxima) {
                if c.tensor_type() == TensorType::Feature {
                    let slot = session.plan().value(c.input()).unwrap();
                    *m = m.max(plain_max_abs(&session.value(&values, slot).unwrap()));
                }
            }
        }
        for (c, m) in calibrations.iter().zip(&maxima) {
            match c.tensor_type() {
                TensorType::Feature => assert_eq!(c.thresholds(), vec![*m], "{name}: {}", c.name()),
                TensorType::Weight => {
                    let w = match float.constant_tensor(c.input()).unwrap() {
                        Some(w) => w,
                        None => {
                            let slot = session.plan().value(c.input()).unwrap();
                            (**session.plan().constant(slot).unwrap()).clone()
                        }
                    };
                    let w = w.as_f32().unwrap();
                    let want: Vec<f32> = match c.axis() {
                        Some(axis) => w
                            .axis_iter(Axis(axis as usize))
                            .map(|ch| ch.iter().fold(0f32, |m, v| m.max(v.abs())))
                            .collect(),
                        None => vec![w.iter().fold(0f32, |m, v| m.max(v.abs()))],
                    };
                    assert_eq!(c.thresholds(), want, "{name}: {}", c.name());
                }
            }
        }

        // The calibrated model runs; OFF everywhere is the float model exactly.
        let cal_session = Session::new(plan_model(&model).unwrap(), 0).unwrap();
        for s in 0..2 {
            let inputs = dataset.sample(s).unwrap();
            let refs: Vec<(&str, Tensor)> = inputs
                .iter()
                .map(|(n, t)| (n.as_str(), t.clone()))
                .collect();
            let float_out = session.run(&refs, &Config::float()).unwrap();
            let off = cal_session.run(&refs, &Config::float()).unwrap();
            let on = cal_session.run(&refs, &Config::calibrated()).unwrap();
            for ((f, o), q) in float_out.iter().zip(&off).zip(&on) {
                assert_eq!(bits(f), bits(o), "{name}: OFF differs from float");
                assert!(q.as_f32().unwrap().iter().all(|v| v.is_finite()), "{name}");
                assert_ne!(bits(f), bits(q), "{name}: calibration changed nothing");
            }
        }
    }
}

/// The written file reads back with the same nodes and parameters, and declares the
/// `horizon` opset.
#[test]
fn calibrated_model_round_trips_through_a_file() {
    let Some(root) = models_dir() else { return };
    let float = load_model(root.join("mtcnn_rnet/rnet.onnx")).unwrap();
    let data = root.join("mtcnn_rnet/calibration_data");
    let options = CalibrateOptions {
        method: Method::Percentile,
        ..Default::default()
    };
    let out = calibrate(&float, &data, &options, &no_progress).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("calibrated_model.onnx");
    hmct_ir::save_model(&out.model, &path).unwrap();
    let back = load_model(&path).unwrap();
    assert_eq!(back.opset("horizon"), Some(1));
    assert_eq!(back.calibration_nodes().len(), out.report.nodes.len());
    for n in &out.report.nodes {
        let c = back.calibration_by_name(&n.name).unwrap();
        assert_eq!(c.thresholds(), n.thresholds);
        assert_eq!(c.qtype().to_string(), n.qtype);
        assert_eq!(c.axis(), n.axis);
        let kind = match c.tensor_type() {
            TensorType::Weight => "weight",
            TensorType::Feature => "activation",
        };
        assert_eq!(kind, n.kind);
        if kind == "weight" {
            assert_eq!(c.group(), 1);
            // Per-channel scales are threshold / 127, as the spec derives them.
            let scales: Vec<f32> = n.thresholds.iter().map(|t| t / 127.0).collect();
            assert_eq!(c.scales(), scales);
        }
        // Percentile thresholds never exceed the data's maximum.
        assert!(
            n.thresholds
                .iter()
                .all(|&t| t > 0.0 && t <= n.max_abs.max(1e-6))
        );
    }
}

fn rnet() -> Option<(Model, PathBuf)> {
    let dir = models_dir()?.join("mtcnn_rnet");
    Some((
        load_model(dir.join("rnet.onnx")).unwrap(),
        dir.join("calibration_data"),
    ))
}

fn run_with(
    model: &Model,
    data: &Path,
    options: CalibrateOptions,
) -> Result<Calibrated, CalibrateError> {
    calibrate(model, data, &options, &no_progress)
}

#[test]
fn op_types_and_skipped_nodes_decide_what_is_quantized() {
    let Some((float, data)) = rnet() else { return };
    // Only Conv: every calibration node feeds a Conv.
    let only_conv = run_with(
        &float,
        &data,
        CalibrateOptions {
            op_types: vec!["Conv".into()],
            ..Default::default()
        },
    )
    .unwrap();
    for id in only_conv.model.calibration_nodes() {
        let c = only_conv.model.calibration(id).unwrap();
        for &r in only_conv.model.consumers(c.output()) {
            assert_eq!(only_conv.model.node(r).op_type(), "Conv");
        }
    }
    assert_eq!(
        only_conv.report.weight_nodes,
        float.nodes_of_type("Conv").len()
    );

    // A skipped node keeps reading float tensors.
    let skip = float
        .node_name(float.nodes_of_type("MatMul")[0])
        .to_string();
    let skipped = run_with(
        &float,
        &data,
        CalibrateOptions {
            skip_nodes: vec![skip.clone()],
            ..Default::default()
        },
    )
    .unwrap();
    let node = skipped.model.node(skipped.model.node_id(&skip).unwrap());
    let original = float.node(float.node_id(&skip).unwrap());
    assert_eq!(node.input, original.input);
    assert!(
        skipped
            .report
            .nodes
            .iter()
            .all(|n| !n.consumers.contains(&skip))
    );
}

#[test]
fn node_qtypes_by_regular_node_and_by_calibration_node() {
    let Some((float, data)) = rnet() else { return };
    let conv = float.node_name(float.nodes_of_type("Conv")[1]).to_string();
    let weight = format!(
        "{}_HzCalibration",
        float.node(float.node_id(&conv).unwrap()).input[1]
    );
    let out = run_with(
        &float,
        &data,
        CalibrateOptions {
            node_qtypes: vec![(conv.clone(), QType::INT16), (weight.clone(), QType::INT16)],
            ..Default::default()
        },
    )
    .unwrap();
    for n in &out.report.nodes {
        let wants16 = n.name == weight || (n.kind == "activation" && n.consumers.contains(&conv));
        assert_eq!(
            n.qtype,
            if wants16 { "int16" } else { "int8" },
            "{}",
            n.name
        );
    }
    assert_eq!(
        out.report
            .nodes
            .iter()
            .filter(|n| n.qtype == "int16")
            .count(),
        2
    );

    let err = run_with(
        &float,
        &data,
        CalibrateOptions {
            node_qtypes: vec![("conv2d_99".into(), QType::INT16)],
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(err.is_usage());
    assert!(
        err.to_string().contains("no node named 'conv2d_99'"),
        "{err}"
    );
}

#[test]
fn bad_options_and_models_are_clear_errors() {
    let Some((float, data)) = rnet() else { return };
    let err = |options: CalibrateOptions| run_with(&float, &data, options).unwrap_err();

    let e = err(CalibrateOptions {
        op_types: vec!["Convv".into()],
        ..Default::default()
    });
    assert!(e.is_usage());
    let message = e.to_string();
    assert!(
        message.starts_with("unknown op type 'Convv' (did you mean 'Conv'"),
        "{message}"
    );

    let e = err(CalibrateOptions {
        skip_nodes: vec!["dense_9".into()],
        ..Default::default()
    });
    assert!(
        e.is_usage() && e.to_string().contains("no node named 'dense_9'"),
        "{e}"
    );

    let e = err(CalibrateOptions {
        op_types: vec!["LSTM".into()],
        ..Default::default()
    });
    assert!(matches!(e, CalibrateError::NothingToQuantize { .. }), "{e}");
    assert!(!e.is_usage());

    let e = err(CalibrateOptions {
        method: Method::Percentile,
        percentile: 1.5,
        ..Default::default()
    });
    assert!(
        e.is_usage() && e.to_string().contains("percentile 1.5"),
        "{e}"
    );

    let e = err(CalibrateOptions {
        qtype: QType::UINT8,
        ..Default::default()
    });
    assert!(e.is_usage() && e.to_string().contains("uint8"), "{e}");

    // A calibrated model is refused.
    let once = run_with(&float, &data, CalibrateOptions::default())
        .unwrap()
        .model;
    let e = run_with(&once, &data, CalibrateOptions::default()).unwrap_err();
    assert!(matches!(e, CalibrateError::AlreadyCalibrated { .. }), "{e}");

    // Data of another model: the folder names the missing input; given the sample
    // files directly, the shape check names the file.
    let onet_data = models_dir().unwrap().join("mtcnn_onet/calibration_data");
    let e = run_with(&float, &onet_data, CalibrateOptions::default()).unwrap_err();
    assert!(matches!(e, CalibrateError::Data(_)), "{e}");
    assert!(
        e.to_string()
            .contains("no sub-folder for model input 'input_2'"),
        "{e}"
    );
    let e = run_with(
        &float,
        &onet_data.join("input_3"),
        CalibrateOptions::default(),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("0.npy") && e.to_string().contains("shape"),
        "{e}"
    );
}

/// PP-OCR weights are `Constant` node outputs: they still get weight nodes.
#[test]
fn constant_node_weights_are_calibrated() {
    let Some(root) = models_dir() else { return };
    let dir = root.join("rapidocr_ppocr_cls");
    let float = load_model(dir.join("ch_ppocr_mobile_v2.0_cls_infer.onnx")).unwrap();
    let out = run_with(
        &float,
        &dir.join("calibration_data"),
        CalibrateOptions {
            data_num: Some(2),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(out.report.samples, 2);
    let convs = float.nodes_of_type("Conv").len() + float.nodes_of_type("MatMul").len();
    assert_eq!(out.report.weight_nodes, convs);
    let from_constant_nodes = out
        .report
        .nodes
        .iter()
        .filter(|n| n.kind == "weight")
        .filter(|n| {
            float
                .producer(&n.input)
                .is_some_and(|p| float.node(p).op_type() == "Constant")
        })
        .count();
    assert!(from_constant_nodes > 0);
}
