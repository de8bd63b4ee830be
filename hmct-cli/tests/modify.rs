//! `modify` end to end on the bundled calibrated model: each flag, then reload and
//! check that exactly the intended calibration nodes changed (every other node and
//! attribute byte-equal); bad input exits 2 with a clear line and writes nothing.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use hmct_ir::{Model, QType, load_model};

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/tiny_cnn/calibrated_model.onnx")
}

fn debugger(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hmct-debugger"))
        .args(args)
        .output()
        .unwrap()
}

/// Runs `modify` with `flags` and returns (stdout, the reloaded output model).
fn modify(flags: &[&str]) -> (String, Model) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.onnx");
    let model = example();
    let mut args = vec![
        "modify",
        model.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend(flags);
    let o = debugger(&args);
    assert!(
        o.status.success(),
        "{flags:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    (
        String::from_utf8(o.stdout).unwrap(),
        load_model(&out).unwrap(),
    )
}

/// Names of the nodes that differ between the example and `edited`; everything
/// outside the nodes must be equal.
fn changed(edited: &Model) -> BTreeSet<String> {
    let original = load_model(example()).unwrap();
    let (mut a, mut b) = (original.graph_proto().clone(), edited.graph_proto().clone());
    assert_eq!(a.node.len(), b.node.len());
    let names: BTreeSet<String> = a
        .node
        .iter()
        .zip(&b.node)
        .filter(|(x, y)| x != y)
        .map(|(x, y)| {
            assert_eq!(x.name(), y.name());
            x.name().to_string()
        })
        .collect();
    a.node.clear();
    b.node.clear();
    assert_eq!(a, b);
    names
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn nodes_thresholds_switches() {
    let (stdout, m) = modify(&[
        "--nodes",
        "['res_add','fc.weight_HzCalibration']",
        "--qtype",
        "int16",
        "--threshold",
        "stem_relu_out_HzCalibration=4.23",
        "--switch",
        "logits_HzCalibration=OFF",
    ]);
    assert_eq!(
        changed(&m),
        set(&[
            "down_relu_out_HzCalibration",
            "res_conv2_out_HzCalibration",
            "fc.weight_HzCalibration",
            "stem_relu_out_HzCalibration",
            "logits_HzCalibration"
        ])
    );
    let c = |n: &str| m.calibration_by_name(n).unwrap();
    assert_eq!(c("res_conv2_out_HzCalibration").qtype(), QType::INT16);
    assert_eq!(c("fc.weight_HzCalibration").qtype(), QType::INT16);
    assert_eq!(c("stem_relu_out_HzCalibration").thresholds(), vec![4.23]);
    assert_eq!(c("stem_relu_out_HzCalibration").qtype(), QType::INT8);
    assert!(!c("logits_HzCalibration").switch_on());
    assert!(
        stdout.contains("stem_relu_out_HzCalibration: thresholds [102.6876] -> [4.23]"),
        "{stdout}"
    );
    assert!(
        stdout.contains("logits_HzCalibration: switch ON -> OFF"),
        "{stdout}"
    );
    assert!(stdout.contains("5 calibration node(s) changed"), "{stdout}");
}

#[test]
fn all_activations_weights_and_op_types() {
    let original = load_model(example()).unwrap();
    let kind = |weight: bool| -> BTreeSet<String> {
        original
            .calibration_nodes()
            .into_iter()
            .map(|id| original.calibration(id).unwrap())
            .filter(|c| (c.tensor_type() == hmct_ir::TensorType::Weight) == weight)
            .map(|c| c.name().to_string())
            .collect()
    };
    let (_, m) = modify(&["--all-activations", "int16"]);
    assert_eq!(changed(&m), kind(false));
    let (_, m) = modify(&["--all_weights", "int16"]);
    assert_eq!(changed(&m), kind(true));
    let (_, m) = modify(&["--op-types", "[Gemm]", "--qtype", "float16"]);
    assert_eq!(changed(&m), set(&["flatten_out_HzCalibration"]));
    assert_eq!(
        m.calibration_by_name("flatten_out_HzCalibration")
            .unwrap()
            .qtype(),
        QType::Float16
    );
}

#[test]
fn subgraph_in_one_or_two_arguments() {
    let expected = set(&[
        "down_relu_out_HzCalibration",
        "res_relu1_out_HzCalibration",
        "res_conv2_out_HzCalibration",
    ]);
    let (_, m) = modify(&[
        "--subgraph",
        "inputs=[down_relu_out]",
        "outputs=[res_add]",
        "--qtype",
        "int16",
    ]);
    assert_eq!(changed(&m), expected);
    let (_, m) = modify(&[
        "--subgraph",
        "outputs=['res_add'] inputs=['down_relu_out']",
        "--qtype",
        "int16",
    ]);
    assert_eq!(changed(&m), expected);
}

#[test]
fn quant_config_json_and_its_unknown_keys() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("quant_config.json");
    std::fs::write(
        &config,
        r#"{
          "model_config": {"all_node_type": "int16", "activation": {"calibration_type": "max"}, "colour": 1},
          "node_config": {"res_add": {"qtype": "float16", "input0": "int8"}},
          "subgraph_config": {"head": {"inputs": ["gap"], "outputs": ["softmax"], "qtype": "int8"}}
        }"#,
    )
    .unwrap();
    let out = dir.path().join("out.onnx");
    let model = example();
    let o = debugger(&[
        "modify",
        model.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("unknown key(s): model_config.colour, node_config.res_add.input0"),
        "{stderr}"
    );
    assert!(stderr.contains("model_config.activation"), "{stderr}");
    let m = load_model(&out).unwrap();
    for id in m.calibration_nodes() {
        let c = m.calibration(id).unwrap();
        let want = match c.name() {
            "res_conv2_out_HzCalibration" | "down_relu_out_HzCalibration" => QType::Float16,
            // The sub-graph from gap to softmax: gap's input and the Gemm's input and
            // the logits node; the Gemm's weight stays int16.
            "pw_relu_out_HzCalibration" | "flatten_out_HzCalibration" | "logits_HzCalibration" => {
                QType::INT8
            }
            _ => QType::INT16,
        };
        assert_eq!(c.qtype(), want, "{}", c.name());
    }
}

#[test]
fn bad_input_exits_2_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.onnx");
    let model = example();
    let bad_config = dir.path().join("bad.json");
    std::fs::write(
        &bad_config,
        r#"{"node_config": {"res_add": {"qtype": "int9x"}}}"#,
    )
    .unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--nodes", "[res_ad]", "--qtype", "int16"],
            "did you mean 'res_add'?",
        ),
        (
            vec!["--switch", "Res_Conv1=OFF"],
            "did you mean 'res_conv1'",
        ),
        (
            vec!["--op-types", "[conv]", "--qtype", "int16"],
            "did you mean 'Conv'",
        ),
        (
            vec![
                "--subgraph",
                "inputs=[res_conv1] outputs=[res_add]",
                "--qtype",
                "int16",
            ],
            "graph input 'input' reaches output 'res_add'",
        ),
        (
            vec!["--nodes", "[res_add]", "--qtype", "int9x"],
            "unknown qtype 'int9x'",
        ),
        (vec!["--nodes", "[res_add]"], "--nodes needs --qtype"),
        (
            vec!["--threshold", "stem_relu_out_HzCalibration=-1"],
            "positive",
        ),
        (vec!["--threshold", "res_conv1=1"], "regular node"),
        (vec!["--switch", "res_conv1=maybe"], "not ON or OFF"),
        (vec![], "nothing to do"),
        (
            vec!["--config", bad_config.to_str().unwrap()],
            "node_config.res_add.qtype",
        ),
    ];
    for (flags, message) in cases {
        let mut args = vec![
            "modify",
            model.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ];
        args.extend(&flags);
        let o = debugger(&args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(
            stderr.starts_with("error: ") && stderr.contains(message),
            "{flags:?}: {stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(!out.exists(), "{flags:?} wrote the output");
    }
}
