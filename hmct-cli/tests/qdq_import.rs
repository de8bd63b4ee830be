//! QDQ models loaded as calibrated models, end to end:
//! - onnxruntime's `quantize_static` fixtures (hmct-ir/tests/fixtures/qdq, made by
//!   tools/make_qdq_fixture.py) run in our interpreter give onnxruntime's outputs;
//! - the bundled calibrated model → export-qdq → load gives bit-identical outputs
//!   and the same sensitivity ranking as the calibrated model itself;
//! - `summary` and `get-sensitivity-of-nodes` work on a QDQ file; a DequantizeLinear
//!   fed by a computed tensor and a QLinearConv model fail with one line naming the
//!   node, exit status 1.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use hmct_debug::engine::{Engine, EngineOptions};
use hmct_debug::sensitivity::{
    NodeType, Sensitivity, SensitivityOptions, get_sensitivity_of_nodes,
};
use hmct_ir::testing::build::{float_value, model, node};
use hmct_ir::{
    Model, QType, QdqOptions, export_qdq, load_model, load_model_from_bytes, model_to_bytes,
};
use hmct_proto::Message;
use hmct_proto::onnx::{NodeProto, TensorProto};
use hmct_quant::{Config, FakeQuant, Session, fake_quant_for, plan_model};
use hmct_tensor::{Tensor, read_npy};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn fixtures() -> PathBuf {
    repo().join("hmct-ir/tests/fixtures/qdq")
}

fn example_data() -> PathBuf {
    repo().join("examples/tiny_cnn/calibration_data")
}

fn sample(data: &Path, i: usize) -> Tensor {
    read_npy(&data.join(format!("input/{i}.npy"))).unwrap()
}

/// Outputs on sample `i` of `data`.
fn run_outputs(model: &Model, config: &Config, data: &Path, i: usize) -> Vec<Tensor> {
    let session = Session::new(plan_model(model).unwrap(), 1).unwrap();
    session
        .run(&[("input", sample(data, i))], config)
        .unwrap()
        .into_iter()
        .map(|t| (*t).clone())
        .collect()
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.as_f32().unwrap().iter().copied().collect()
}

/// Our outputs of the imported fixtures against onnxruntime's. The two compute
/// convolutions in different orders, so values differ in the last bits; the
/// quantization steps in between can turn such a difference into one quantization
/// step only when a value sits on a rounding boundary, which the bound would show.
#[test]
fn imported_fixtures_match_onnxruntime() {
    for variant in ["u8s8_per_channel", "s8s8_per_tensor", "u8u8_per_channel"] {
        let model = load_model(fixtures().join(format!("{variant}.onnx"))).unwrap();
        assert!(model.imported_from_qdq().is_some());
        let names: Vec<String> = model.outputs().to_vec();
        let mut worst = 0f32;
        for i in 0..2 {
            let ours = run_outputs(&model, &Config::calibrated(), &fixtures().join("data"), i);
            for (name, ours) in names.iter().zip(&ours) {
                let theirs =
                    read_npy(&fixtures().join(format!("{variant}/{name}/{i}.npy"))).unwrap();
                assert_eq!(ours.shape(), theirs.shape(), "{variant} {name}");
                let diff = f32s(ours)
                    .iter()
                    .zip(f32s(&theirs))
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                worst = worst.max(diff);
            }
        }
        eprintln!("{variant}: max |ours - onnxruntime| = {worst:e}");
        assert!(worst <= 1e-4, "{variant}: max abs diff {worst}");
    }
}

/// With every calibration node OFF, an imported fixture is the float model up to its
/// quantized weights: onnxruntime folded the Relus into quantization ranges, and
/// the importer put them back (without them the logits' cosine similarity is ~0.04).
#[test]
fn float_model_of_an_imported_fixture_is_near_the_original() {
    let data = fixtures().join("data");
    for variant in ["u8s8_per_channel", "s8s8_per_tensor", "u8u8_per_channel"] {
        let model = load_model(fixtures().join(format!("{variant}.onnx"))).unwrap();
        let mut worst = 1f64;
        for i in 0..2 {
            let a = f32s(&read_npy(&fixtures().join(format!("float/logits/{i}.npy"))).unwrap());
            let b = f32s(&run_outputs(&model, &Config::float(), &data, i)[0]);
            let dot: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(x * y)).sum();
            let norm = |v: &[f32]| v.iter().map(|x| f64::from(x * x)).sum::<f64>().sqrt();
            worst = worst.min(dot / (norm(&a) * norm(&b)));
        }
        eprintln!("{variant}: float model logits, worst cosine {worst:.6}");
        assert!(worst > 0.999, "{variant}: {worst}");
    }
}

/// Re-quantizing an imported node at another precision keeps the float range its
/// integers reach: int8 with a zero point off 0 reaches further on one side than 127
/// steps, and int16 must not clip there.
#[test]
fn another_precision_keeps_the_range_of_an_asymmetric_signed_node() {
    let model = load_model(fixtures().join("s8s8_per_tensor.onnx")).unwrap();
    let mut checked = 0;
    for id in model.calibration_nodes() {
        let cal = model.calibration(id).unwrap();
        let (s, z) = (cal.scales()[0], cal.zero_point()[0]);
        if cal.is_per_channel() || z == 0 {
            continue;
        }
        let reach = (-128 - z).abs().max((127 - z).abs());
        let fq = fake_quant_for(&model, &cal, Some(&QType::INT16)).unwrap();
        let FakeQuant::Int(q) = fq else {
            panic!("{fq:?}")
        };
        assert_eq!(q.scales(), [s * reach as f32 / 32767.0], "{}", cal.name());
        assert_eq!(q.zero_points(), [0]);
        checked += 1;
    }
    assert!(checked > 0, "the fixture has int8 nodes with zero points");
}

fn sensitivity(model: &Model, node_type: NodeType) -> Sensitivity {
    let engine = Engine::new(
        model.clone(),
        &example_data(),
        &EngineOptions {
            threads: 1,
            cache_bytes: None,
        },
    )
    .unwrap();
    let options = SensitivityOptions {
        node_type,
        ..Default::default()
    };
    get_sensitivity_of_nodes(&engine, &options, &|_, _| {}).unwrap()
}

/// Calibrated → export-qdq → bytes → load: the same model. Names of calibration
/// nodes are derived from their input tensor on both sides, so they compare directly.
#[test]
fn calibrated_model_round_trips_through_qdq() {
    let calibrated = load_model(repo().join("examples/tiny_cnn/calibrated_model.onnx")).unwrap();
    let exported = export_qdq(&calibrated, &QdqOptions::default()).unwrap();
    let imported = load_model_from_bytes(&model_to_bytes(&exported.model)).unwrap();
    let report = imported.imported_from_qdq().unwrap();
    assert_eq!(
        (report.pairs, report.weights, report.biases, report.clips),
        (calibrated.calibration_nodes().len(), 0, 0, 0)
    );
    let inputs = |m: &Model| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = m
            .calibration_nodes()
            .into_iter()
            .map(|id| {
                let c = m.calibration(id).unwrap();
                (c.input().to_string(), c.name().to_string())
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(inputs(&imported), inputs(&calibrated));

    for config in [Config::calibrated(), Config::float()] {
        for i in 0..8 {
            let a = run_outputs(&calibrated, &config, &example_data(), i);
            let b = run_outputs(&imported, &config, &example_data(), i);
            let bits = |ts: &[Tensor]| -> Vec<u32> {
                ts.iter().flat_map(f32s).map(f32::to_bits).collect()
            };
            assert_eq!(bits(&a), bits(&b), "sample {i}");
        }
    }

    for node_type in [NodeType::Node, NodeType::Weight, NodeType::Activation] {
        let (a, b) = (
            sensitivity(&calibrated, node_type),
            sensitivity(&imported, node_type),
        );
        let ranking = |s: &Sensitivity| -> Vec<(String, Vec<String>, Vec<u64>)> {
            s.entries
                .iter()
                .map(|e| {
                    (
                        e.name.clone(),
                        e.calibrations.clone(),
                        e.values.0.iter().map(|(_, v)| v.to_bits()).collect(),
                    )
                })
                .collect()
        };
        assert!(!a.entries.is_empty());
        assert_eq!(ranking(&a), ranking(&b), "{node_type:?}");
    }
}

fn debugger(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hmct-debugger"))
        .args(args)
        .output()
        .unwrap()
}

fn stdout_of(args: &[&std::ffi::OsStr]) -> String {
    let out = debugger(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn summary_and_sensitivity_run_on_a_qdq_file() {
    let model = fixtures().join("u8s8_per_channel.onnx");
    let summary = stdout_of(&["summary".as_ref(), model.as_os_str()]);
    assert!(
        summary.contains(
            "imported from a QDQ model: 12 QuantizeLinear/DequantizeLinear pair(s) and 7 integer weight(s) as HzCalibration nodes, 7 int32 bias(es) as float, 9 dropped Relu/Clip(s) restored"
        ),
        "{summary}"
    );
    assert!(
        summary.contains("calibration nodes: 19 (7 weight, 12 activation)"),
        "{summary}"
    );
    let row = summary
        .lines()
        .find(|l| l.starts_with("input_HzCalibration "))
        .unwrap_or_else(|| panic!("{summary}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[1..3], ["activation", "uint8"], "{row}");
    assert_eq!(cells.last(), Some(&"stem_conv"), "{row}");

    let data = example_data();
    let out = stdout_of(&[
        "get-sensitivity-of-nodes".as_ref(),
        model.as_os_str(),
        data.as_os_str(),
        "-v".as_ref(),
        "True".as_ref(),
    ]);
    for node in ["stem_conv", "down_conv", "res_add", "fc", "softmax"] {
        assert!(
            out.lines()
                .any(|l| l.split_whitespace().next() == Some(node)),
            "{node} missing: {out}"
        );
    }
}

/// A model `x → nodes → y` with a scale `s` and an int8 zero point `z`.
fn bad_model(dir: &Path, file: &str, nodes: Vec<NodeProto>) -> PathBuf {
    let initializers = vec![
        TensorProto {
            name: Some("s".into()),
            data_type: Some(1),
            float_data: vec![0.1],
            ..Default::default()
        },
        TensorProto {
            name: Some("z".into()),
            data_type: Some(3),
            int32_data: vec![0],
            ..Default::default()
        },
    ];
    let proto = model(
        vec![float_value("x", &[1, 4])],
        nodes,
        initializers,
        vec![float_value("y", &[1, 4])],
    );
    let path = dir.join(file);
    std::fs::write(&path, proto.encode_to_vec()).unwrap();
    path
}

#[test]
fn bad_qdq_models_fail_with_one_line_naming_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let computed = bad_model(
        dir.path(),
        "computed.onnx",
        vec![
            node("q", "QuantizeLinear", &["x", "s", "z"], &["xq"]),
            node("dq", "DequantizeLinear", &["xq", "s", "z"], &["xd"]),
            node("relu", "Relu", &["xd"], &["r"]),
            node("dq_relu", "DequantizeLinear", &["r", "s", "z"], &["y"]),
        ],
    );
    let qlinear = bad_model(
        dir.path(),
        "qlinear.onnx",
        vec![
            node("q", "QuantizeLinear", &["x", "s", "z"], &["xq"]),
            node(
                "qconv",
                "QLinearConv",
                &["xq", "s", "z", "xq", "s", "z", "s", "z"],
                &["yq"],
            ),
            node("dq", "DequantizeLinear", &["yq", "s", "z"], &["y"]),
        ],
    );
    for (model, needle) in [
        (
            &computed,
            "DequantizeLinear 'dq_relu': its input 'r' is neither the output of a QuantizeLinear nor a constant",
        ),
        (&qlinear, "node 'qconv' is a QLinearConv"),
    ] {
        let data = example_data();
        for args in [
            vec!["summary".as_ref(), model.as_os_str()],
            vec![
                "get-sensitivity-of-nodes".as_ref(),
                model.as_os_str(),
                data.as_os_str(),
            ],
        ] {
            let out = debugger(&args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{stderr}");
            assert_eq!(stderr.lines().count(), 1, "{stderr}");
            assert!(stderr.contains(needle), "{stderr}");
        }
    }
}
