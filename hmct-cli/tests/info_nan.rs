//! `info` when some samples give NaN outputs: the means skip them, and a warning says
//! how many, so a table over the remaining samples is not taken for the whole data.

use std::path::Path;
use std::process::Command;

use hmct_proto::onnx::{
    GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto,
    TypeProto, ValueInfoProto, tensor_shape_proto::Dimension, tensor_shape_proto::dimension,
    type_proto,
};

fn value(name: &str) -> ValueInfoProto {
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(1),
                shape: Some(TensorShapeProto {
                    dim: [1, 4]
                        .iter()
                        .map(|&d| Dimension {
                            value: Some(dimension::Value::DimValue(d)),
                            ..Default::default()
                        })
                        .collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn node(op: &str, inputs: &[&str], output: &str) -> NodeProto {
    NodeProto {
        name: Some(output.into()),
        op_type: Some(op.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        ..Default::default()
    }
}

/// y = Log(x * x - 1): NaN wherever |x| < 1.
fn write_model(path: &Path) {
    let proto = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(GraphProto {
            name: Some("log".into()),
            node: vec![
                node("Mul", &["x", "x"], "square"),
                node("Sub", &["square", "one"], "shifted"),
                node("Log", &["shifted"], "y"),
            ],
            initializer: vec![TensorProto {
                name: Some("one".into()),
                data_type: Some(1),
                float_data: vec![1.0],
                ..Default::default()
            }],
            input: vec![value("x")],
            output: vec![value("y")],
            ..Default::default()
        }),
        ..Default::default()
    };
    let model = hmct_ir::Model::from_proto(proto, None).unwrap();
    hmct_ir::save_model(&model, path).unwrap();
}

fn debugger(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hmct-debugger"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn nan_samples_are_counted_in_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let float = dir.path().join("float.onnx");
    write_model(&float);
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("x")).unwrap();
    let samples = [
        [2.0f32, 3.0, 4.0, 5.0],
        [1.5, 2.5, 3.5, 4.5],
        [0.1, 0.2, 0.3, 0.4],
    ];
    for (i, s) in samples.iter().enumerate() {
        let x = hmct_tensor::Tensor::from_f32(&[1, 4], s.to_vec()).unwrap();
        hmct_tensor::write_npy(&data.join(format!("x/{i}.npy")), &x).unwrap();
    }
    let calibrated = dir.path().join("calibrated.onnx");
    let out = debugger(&[
        "calibrate".as_ref(),
        float.as_os_str(),
        data.as_os_str(),
        "-o".as_ref(),
        calibrated.as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = debugger(&["info".as_ref(), calibrated.as_os_str(), data.as_os_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: output 'y': 1 of 3 sample(s) give NaN"),
        "{stderr}"
    );
    // The figures are those of the two finite samples: a number, not NaN.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let row = stdout.lines().find(|l| l.starts_with("y ")).unwrap();
    assert!(!row.contains("NaN") && !row.contains("nan"), "{row}");

    // Only finite samples: no warning.
    std::fs::remove_file(data.join("x/2.npy")).unwrap();
    let out = debugger(&["info".as_ref(), calibrated.as_os_str(), data.as_os_str()]);
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("NaN"));
}
