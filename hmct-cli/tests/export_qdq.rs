//! `export-qdq` checked outside our own code: onnxruntime's outputs of the exported
//! model equal our interpreter's outputs of the calibrated model (tools/run_ort.py,
//! which also runs onnx's checker). Cases: the bundled int8 model (standard ops at
//! opset 17), and the same model after `modify` to int16, float16 and OFF nodes
//! (the opset raised to 21 for int16, Cast pairs, removed nodes), and models at
//! opsets 9 to 17 whose opset the export raises. Runs only when `HMCT_PYTHON` names
//! a Python with tools/requirements.txt installed; the command's output is checked
//! always.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn debugger(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_hmct-debugger"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "hmct-debugger {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs our interpreter on `calibrated` and onnxruntime on its export `qdq` over
/// `data` (tools/run_ort.py, which also runs onnx's checker) and fails unless the
/// outputs agree; returns the script's report.
fn onnxruntime_matches(python: &Path, calibrated: &Path, qdq: &Path, data: &Path) -> String {
    let ours = qdq.with_extension("ours");
    debugger(&[
        "run",
        calibrated.to_str().unwrap(),
        data.to_str().unwrap(),
        "-o",
        ours.to_str().unwrap(),
    ]);
    let out = Command::new(python)
        .arg(repo().join("tools/run_ort.py"))
        .args([qdq, data, &ours])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}: {report}{}",
        calibrated.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    report
}

#[test]
fn exported_models_match_our_interpreter_in_onnxruntime() {
    let dir = tempfile::tempdir().unwrap();
    let example = repo().join("examples/tiny_cnn");
    let data = example.join("calibration_data");
    let calibrated = example.join("calibrated_model.onnx");
    let mixed = dir.path().join("mixed.onnx");
    debugger(&[
        "modify",
        calibrated.to_str().unwrap(),
        "-o",
        mixed.to_str().unwrap(),
        "--all-activations",
        "int16",
        "--nodes",
        "[flatten_out_HzCalibration]",
        "--qtype",
        "float16",
        "--switch",
        "res_conv1=OFF",
        "--switch",
        "logits_HzCalibration=OFF",
    ]);
    let cases = [
        (
            calibrated.clone(),
            "standard QuantizeLinear/DequantizeLinear",
            "17 calibration node(s) as QuantizeLinear/DequantizeLinear, 0 as a float16 Cast pair, 0 removed",
        ),
        (
            mixed.clone(),
            "standard QuantizeLinear/DequantizeLinear; opset raised from 17 to 21",
            "13 calibration node(s) as QuantizeLinear/DequantizeLinear, 1 as a float16 Cast pair, 3 removed",
        ),
    ];
    // Without Python, the onnxruntime comparison is skipped (and says so).
    let python = hmct_ir::testing::python();
    for (i, (model, ops, counts)) in cases.iter().enumerate() {
        let qdq = dir.path().join(format!("qdq{i}.onnx"));
        let stdout = debugger(&[
            "export-qdq",
            model.to_str().unwrap(),
            "-o",
            qdq.to_str().unwrap(),
        ]);
        assert!(stdout.contains(ops) && stdout.contains(counts), "{stdout}");
        let Some(python) = &python else { continue };
        let report = onnxruntime_matches(python, model, &qdq, &data);
        assert!(
            report.contains("logits:") && report.contains("prob:"),
            "{report}"
        );
    }
}

/// A float model whose ConvTranspose has `group = 2`, so its per-channel weight
/// calibration regroups the output channels (HZCALIBRATION §3): x [1, 4, 5, 5] →
/// ConvTranspose(W [4, 3, 3, 3], group 2, stride 2) → Relu → Conv 1x1 → y.
fn grouped_deconv_model(dir: &Path) -> (PathBuf, PathBuf) {
    use hmct_proto::onnx::{
        AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
        TensorShapeProto, TypeProto, ValueInfoProto, attribute_proto::AttributeType,
        tensor_shape_proto::Dimension, type_proto,
    };
    let value = |name: &str, dims: &[i64]| ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(1),
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| Dimension {
                            value: Some(
                                hmct_proto::onnx::tensor_shape_proto::dimension::Value::DimValue(d),
                            ),
                            ..Default::default()
                        })
                        .collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    };
    // Channels differ in range by up to 8x, so one scale per tensor would not do.
    let weight = |name: &str, dims: &[i64], channel_axis: usize| {
        let n: i64 = dims.iter().product();
        let inner: i64 = dims[channel_axis + 1..].iter().product();
        TensorProto {
            name: Some(name.into()),
            dims: dims.to_vec(),
            data_type: Some(1),
            float_data: (0..n)
                .map(|k| {
                    let channel = (k / inner) % dims[channel_axis];
                    let row = k / (inner * dims[channel_axis]);
                    let wave = ((k * 37 % 101) as f32 / 50.0) - 1.0;
                    wave * (0.05 + 0.1 * (channel + 2 * row) as f32)
                })
                .collect(),
            ..Default::default()
        }
    };
    let attr = |name: &str, ints: Vec<i64>| AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Ints as i32),
        ints,
        ..Default::default()
    };
    let node = |name: &str, op: &str, inputs: &[&str], output: &str| NodeProto {
        name: Some(name.into()),
        op_type: Some(op.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        ..Default::default()
    };
    let mut deconv = node("up", "ConvTranspose", &["x", "w_up"], "u");
    deconv.attribute = vec![
        AttributeProto {
            name: Some("group".into()),
            r#type: Some(AttributeType::Int as i32),
            i: Some(2),
            ..Default::default()
        },
        attr("strides", vec![2, 2]),
    ];
    let proto = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(GraphProto {
            name: Some("grouped_deconv".into()),
            node: vec![
                deconv,
                node("relu", "Relu", &["u"], "r"),
                node("head", "Conv", &["r", "w_head"], "y"),
            ],
            initializer: vec![
                weight("w_up", &[4, 3, 3, 3], 1),
                weight("w_head", &[2, 6, 1, 1], 0),
            ],
            input: vec![value("x", &[1, 4, 5, 5])],
            output: vec![value("y", &[1, 2, 11, 11])],
            ..Default::default()
        }),
        ..Default::default()
    };
    let model = dir.join("grouped_deconv.onnx");
    let loaded = hmct_ir::Model::from_proto(proto, None).unwrap();
    hmct_ir::save_model(&loaded, &model).unwrap();
    let data = dir.join("data");
    std::fs::create_dir_all(data.join("x")).unwrap();
    for s in 0..3 {
        let values: Vec<f32> = (0..100)
            .map(|k| (((k * 13 + s * 7) % 29) as f32 / 7.0) - 2.0)
            .collect();
        let x = hmct_tensor::Tensor::from_f32(&[1, 4, 5, 5], values).unwrap();
        hmct_tensor::write_npy(&data.join(format!("x/{s}.npy")), &x).unwrap();
    }
    (model, data)
}

/// Grouped ConvTranspose: calibrate gives its weight one threshold per output channel
/// of every group; export-qdq quantizes it per-axis in a regrouped layout; onnxruntime
/// on the export equals our interpreter on the calibrated model.
#[test]
fn grouped_conv_transpose_weights_export_and_match_onnxruntime() {
    let dir = tempfile::tempdir().unwrap();
    let (float, data) = grouped_deconv_model(dir.path());
    let calibrated = dir.path().join("calibrated.onnx");
    let qdq = dir.path().join("qdq.onnx");
    debugger(&[
        "calibrate",
        float.to_str().unwrap(),
        data.to_str().unwrap(),
        "-o",
        calibrated.to_str().unwrap(),
    ]);
    let model = hmct_ir::load_model(&calibrated).unwrap();
    let weight = model
        .calibration_nodes()
        .into_iter()
        .filter_map(|id| model.calibration(id))
        .find(|c| c.input() == "w_up")
        .expect("the deconvolution weight is calibrated");
    assert_eq!(weight.thresholds().len(), 6, "2 groups x 3 output channels");
    let stdout = debugger(&[
        "export-qdq",
        calibrated.to_str().unwrap(),
        "-o",
        qdq.to_str().unwrap(),
    ]);
    assert!(
        stdout.contains("standard QuantizeLinear/DequantizeLinear"),
        "{stdout}"
    );
    let exported = hmct_ir::load_model(&qdq).unwrap();
    assert!(
        exported.initializer("w_up").is_none(),
        "the old layout is dropped"
    );
    let Some(python) = hmct_ir::testing::python() else {
        return;
    };
    let report = onnxruntime_matches(Path::new(&python), &calibrated, &qdq, &data);
    assert!(report.contains("y:"), "{report}");
}

/// Float models at opsets 9 (NHWC, ResNet-style), 11, 12, 13 and 17 using the ops
/// whose signature changed between opsets (tools/make_opset_models.py), calibrated
/// by us: per-channel weights need the standard QuantizeLinear of opset 13, int16
/// activations that of 21, so the export raises the opset and converts those nodes,
/// and onnxruntime runs the result to our interpreter's outputs. Needs `HMCT_PYTHON`
/// (the models are written by onnx).
#[test]
fn exports_of_every_opset_run_in_onnxruntime() {
    let Some(python) = std::env::var_os("HMCT_PYTHON").map(PathBuf::from) else {
        eprintln!("skipped: set HMCT_PYTHON to a python with tools/requirements.txt");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(&python)
        .arg(repo().join("tools/make_opset_models.py"))
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // (model, activation qtype, expected ops line)
    let cases = [
        ("opset9_nhwc", "int8", "opset raised from 9 to 13"),
        ("opset11", "int8", "opset raised from 11 to 13"),
        ("opset12", "int8", "opset raised from 12 to 13"),
        ("opset13", "int8", "opset 13 suffices"),
        ("opset13", "int16", "opset raised from 13 to 21"),
        ("opset17", "int8", "opset 17 suffices"),
        ("opset17", "int16", "opset raised from 17 to 21"),
    ];
    for (name, qtype, ops) in cases {
        let folder = dir.path().join(name);
        let data = folder.join("data");
        let calibrated = folder.join(format!("calibrated_{qtype}.onnx"));
        let qdq = folder.join(format!("qdq_{qtype}.onnx"));
        debugger(&[
            "calibrate",
            folder.join("model.onnx").to_str().unwrap(),
            data.to_str().unwrap(),
            "-o",
            calibrated.to_str().unwrap(),
            "--qtype",
            qtype,
        ]);
        let stdout = debugger(&[
            "export-qdq",
            calibrated.to_str().unwrap(),
            "-o",
            qdq.to_str().unwrap(),
        ]);
        assert!(
            stdout.contains("standard QuantizeLinear/DequantizeLinear") && stdout.contains(ops),
            "{name} {qtype}: {stdout}"
        );
        let report = onnxruntime_matches(&python, &calibrated, &qdq, &data);
        eprintln!("{name} {qtype}:\n{stdout}{report}");
    }
}
